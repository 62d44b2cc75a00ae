"""A third-party Modbus RTU device described by a map file, driven by ``read``, ``write``,
``watch`` and ``apply --modbus-rtu``: a pymodbus RTU server with a layout of its own — signed
temperatures, a float32 energy counter in little-word order, a u32 run-hours counter, a
serial-number string, a plain fault word, a holding set-point, a packed control word with bit
fields (written by FC22), a u32 limit, a purge command register that returns to 0, coils and a
discrete input — and no generation register.

Ground truth is pymodbus: the server's registers are laid out, and what the host wrote is read
back, with pymodbus's own converters (``convert_to_registers``/``convert_from_registers``), never
with idemlink's codec; the server's action log says which function wrote what.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.boiler import FC05, FC06, FC15, FC16, FC22, MAP, PURGE, READOUT, Boiler, from_regs, to_regs
from support.timing import scaled

from idemlink.cli import main
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.link_proxy import LinkProxy
from idemlink.host.errors import NoDevice, UnknownOutstanding
from idemlink.host.rtu_device import RtuDevice
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.registers import TriggerStatus
from idemlink.protocol.regmap_file import load_regmap

pytest.importorskip("pymodbus")

@pytest.fixture
def map_file(tmp_path: Path) -> Path:
    path = tmp_path / "acme-boiler.toml"
    path.write_text(MAP, encoding="utf-8")
    return path


@pytest.fixture(params=["toml", "json"])
def any_map(request: pytest.FixtureRequest, map_file: Path, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> Path:
    """The map as TOML, or as the JSON map file ``idemlink regmap --json`` exports."""
    if request.param == "toml":
        return map_file
    assert main(["regmap", str(map_file), "--json"]) == 0
    path = tmp_path / "acme-boiler.json"
    path.write_text(capsys.readouterr().out, encoding="utf-8")
    assert load_regmap(path).hash == load_regmap(map_file).hash
    return path


@pytest.fixture
def line() -> Iterator[LinkProxy]:
    with LinkProxy(None, None, LinkConfig()).start() as proxy:
        yield proxy


def ready(line: LinkProxy, regmap: Path, drop: Callable[[bytes], bool] = lambda f: False,
          ) -> Boiler:
    boiler = Boiler(line.a_path, drop)
    for _ in range(20):  # pymodbus opens its port asynchronously
        try:
            RtuDevice.open(line.b_path, regmap=str(regmap), timeout=scaled(0.1),
                           attempts=2).close()
            return boiler
        except NoDevice:
            continue
    boiler.close()
    raise AssertionError("the pymodbus server never answered")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def rtu(line: LinkProxy, regmap: Path) -> tuple[str, ...]:
    return ("--port", line.b_path, "--modbus-rtu", "--regmap", str(regmap))


def test_read_every_type_as_the_map_says(line: LinkProxy, any_map: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    boiler = ready(line, any_map)
    try:
        rc, out, err = cli(capsys, "read", "--all", *rtu(line, any_map))
        assert rc == 0, err
        lines = [" ".join(x.split()) for x in out.splitlines()]
        assert lines == READOUT
        # by name: a bit field reads its register; JSON values are numbers or a string
        rc, out, _ = cli(capsys, "read", "flow_temperature", "energy", "serial_number", "stage",
                         "pump", *rtu(line, any_map), "--json")
        doc = json.loads(out)
        assert rc == 0 and doc["outcome"] == "OK"
        got = {r["name"]: (r["raw"], r["value"], r["label"]) for r in doc["registers"]}
        assert got == {"flow_temperature": (0xFFCE, -5.0, None),
                       "energy": (0x449A5000, 1234.5, None),
                       "serial_number": (int.from_bytes(b"AB-1234567", "big"), "AB-1234567",
                                         None),
                       "stage": (1, 1, "low"), "pump": (1, 1, "on")}
        assert boiler.writes == []  # reading never writes
    finally:
        boiler.close()


def test_write_each_type_in_one_request_of_the_right_function(
        line: LinkProxy, map_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    boiler = ready(line, map_file)
    try:
        r = rtu(line, map_file)
        rc, out, _ = cli(capsys, "write", "setpoint=-7.5", *r)
        assert rc == 0 and out == "setpoint=0xFFB5 (-7.5 °C): OK\n"
        rc, out, _ = cli(capsys, "write", "energy_limit=123456", *r)
        assert rc == 0
        fc, address, words = boiler.writes[-1]
        assert (fc, address) == (FC16, 0x102)  # both words, one atomic FC16
        assert from_regs(words, "UINT32", "little") == 123456
        assert from_regs([boiler.writes[0][2][0]], "INT16") == -75
        # one bit field: a mask write (FC22), the neighbours untouched on the device
        rc, out, _ = cli(capsys, "write", "hot_water=1", "stage=high", *r)
        assert rc == 0 and out == "hot_water=1 stage=2 (high): OK\n"
        assert boiler.writes[-1][0] == FC22
        rc, out, _ = cli(capsys, "read", "control", *r)
        assert " ".join(out.split()) == "control = 0x0023 heating=1 hot_water=1 stage=high"
        # coils: FC05 for one, FC15 for a run; set-only values
        assert cli(capsys, "write", "pump=off", *r)[0] == 0
        assert boiler.writes[-1] == (FC05, 0, [False])
        assert cli(capsys, "write", "pump=1", "alarm_relay=1", *r)[0] == 0
        assert boiler.writes[-1] == (FC15, 0, [True, True])
        # what the map shows invalid is refused before anything is sent
        before = len(boiler.writes)
        rc, out, _ = cli(capsys, "write", "setpoint=90", *r)
        assert rc == 4 and "outside -200..800 (-20.0..80.0 °C)" in out
        rc, _, err = cli(capsys, "write", "serial_number=X", *r)
        assert rc == 1 and "read-only string" in err
        rc, _, err = cli(capsys, "write", "--if-generation", "3", "setpoint=1", *r)
        assert rc == 1 and err.count("\n") == 1 and "no generation register" in err
        assert len(boiler.writes) == before
    finally:
        boiler.close()


def test_a_field_without_mask_write_is_refused_not_clobbered(
        line: LinkProxy, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "no-fc22.toml"
    plain.write_text(MAP.replace("mask_write = true", "mask_write = false"), encoding="utf-8")
    boiler = ready(line, plain)
    try:
        rc, _, err = cli(capsys, "write", "heating=0", *rtu(line, plain))
        assert rc == 1 and err.count("\n") == 1
        assert "needs a mask write (FC22)" in err and "write all of control instead" in err
        assert boiler.writes == []
        assert cli(capsys, "write", "control=0x0010", *rtu(line, plain))[0] == 0  # the whole word
        assert boiler.writes == [(FC06, 0x101, [0x0010])]
    finally:
        boiler.close()


def test_watch_prints_typed_values_in_every_format(line: LinkProxy, map_file: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    boiler = ready(line, map_file)
    try:
        watch = ("watch", *rtu(line, map_file), "--count", "1", "--interval", "0.05")
        rc, out, _ = cli(capsys, *watch, "flow_temperature", "energy", "stage", "serial_number")
        assert rc == 0
        assert [" ".join(x.split()[1:]) for x in out.splitlines()] == [
            "flow_temperature = -5.0 °C (raw 0xFFCE)", "energy = 1234.5 kWh (raw 0x449A5000)",
            "serial_number = AB-1234567", "stage = low (1)"]  # in address order
        rc, out, _ = cli(capsys, *watch, "--csv", "flow_temperature", "serial_number", "pump")
        rows = [x.split(",") for x in out.splitlines()]
        assert rows[0][:9] == ["time", "poll", "name", "address", "raw", "value", "label",
                               "unit", "outcome"]
        assert rows[1][2:9] == ["flow_temperature", "0", "65486", "-5.0", "", "°C", "OK"]
        assert rows[2][2:9] == ["serial_number", "6", str(int.from_bytes(b"AB-1234567", "big")),
                                "AB-1234567", "", "", "OK"]
        assert rows[3][2:9] == ["pump", "0", "1", "1", "on", "", "OK"]
        rc, out, _ = cli(capsys, *watch, "--json", "run_hours")
        doc = json.loads(out)
        assert (doc["name"], doc["raw"], doc["value"], doc["unit"]) == ("run_hours", 70000,
                                                                         70000, "h")
    finally:
        boiler.close()


def test_apply_converges_typed_values_fields_and_coils(
        line: LinkProxy, any_map: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    boiler = ready(line, any_map)
    plan = tmp_path / "winter.json"
    plan.write_text(json.dumps({"name": "winter", "steps": [
        {"write": {"setpoint": "52.5"}},
        {"write": {"heating": 1, "stage": "high"}},
        {"write": {"pump": "on", "alarm_relay": 0}},
        {"write": {"energy_limit": 250000}},  # no scale: a bare number is unambiguous
    ]}))
    try:
        r = rtu(line, any_map)
        rc, out, err = cli(capsys, "apply", *r, str(plan))
        assert rc == 0, err
        assert out.splitlines() == [
            "step 1/4 setpoint=0x020D (52.5 °C): written: OK",
            "step 2/4 heating=1 stage=2 (high): written (stage=2 (high)): OK",
            "step 3/4 pump=1 (on) alarm_relay=0: already in place",
            "step 4/4 energy_limit=250000 (250000 Wh): written: OK"]
        assert [w[0] for w in boiler.writes] == [FC06, FC22, FC16]
        assert from_regs(boiler.writes[-1][2], "UINT32", "little") == 250000
        rc, out, _ = cli(capsys, "apply", *r, str(plan), "--json")
        assert rc == 0 and [s["state"] for s in json.loads(out)["steps"]] == ["in_place"] * 4
        assert len(boiler.writes) == 3  # converged: nothing written again
        # refused before anything is sent, one line each
        for steps, why in [
            ([{"write": {"setpoint": 525}}], 'use "52.5" for 52.5 °C or "raw:525"'),
            ([{"write_if_generation": {"setpoint": "50.0"}}], "no generation register"),
            ([{"write": {"setpoint": "50.0", "energy_limit": 1}}], "one atomic write"),
        ]:
            bad = tmp_path / "bad.json"
            bad.write_text(json.dumps({"steps": steps}))
            rc, _, err = cli(capsys, "apply", *r, "--device-id", "acme-1", str(bad))
            assert rc == 1 and why in err and err.count("\n") == 1, err
        assert len(boiler.writes) == 3
    finally:
        boiler.close()


def test_an_unanswered_write_reads_back_exactly_what_it_touched(
        line: LinkProxy, map_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No generation register: the read-back after an UNKNOWN reads the registers the write
    touched and nothing else, and says what holds."""
    boiler = ready(line, map_file, drop=lambda frame: frame[1] == FC16)
    try:
        rc, out, _ = cli(capsys, "write", "energy_limit=777", *rtu(line, map_file), "--timeout",
                         f"{scaled(0.1):.3f}", "--attempts", "2", "--json")
        doc = json.loads(out)
        assert rc == 5 and doc["outcome"] == "UNKNOWN"
        assert [w[0] for w in boiler.writes] == [FC16, FC16]  # set-only: retried, harmless
        assert doc["reconcile"]["observed"] == {"energy_limit": 777}  # no generation to read
        assert doc["reconcile"]["intended_state_holds"] is True
    finally:
        boiler.close()


def test_the_python_api_reads_words_and_decodes_them(line: LinkProxy, map_file: Path) -> None:
    boiler = ready(line, map_file)
    try:
        with RtuDevice.open(line.b_path, regmap=str(map_file), timeout=scaled(0.1),
                            attempts=3) as dev:
            r = dev.read("energy")
            assert r.values == tuple(to_regs(1234.5, "FLOAT32", "little"))  # raw words
            assert dev.decode(r) == {"energy": 1234.5}
            r = dev.execute(dev.read_covering([dev.spec("flow_temperature"),
                                               dev.spec("run_hours")]))
            assert dev.decode(r) == {"flow_temperature": -5.0, "outdoor_temperature": -12.3,
                                     "energy": 1234.5, "run_hours": 70000}
            assert dev.decode(dev.read("control")) == {"control": 0x11, "heating": 1,
                                                       "hot_water": 0, "stage": 1}
            # a typed value by name: both words in one atomic FC16
            assert dev.write({"energy_limit": "4000000000"}).outcome is Outcome.OK
            assert from_regs(boiler.writes[-1][2], "UINT32", "little") == 4_000_000_000
            # a map without a generation register refuses it in every driver, nothing sent
            with pytest.raises(LocalProtocolError, match="no generation register"):
                dev.write_if_generation(0, {"setpoint": 1})
    finally:
        boiler.close()


def test_the_asyncio_driver_reads_writes_and_reconciles_alike(line: LinkProxy,
                                                               map_file: Path) -> None:
    """``AsyncRtuDevice``, the other RTU driver, on the same controller: typed reads and
    writes, a field by FC22, a coil by FC05, the conditional write refused; a mask write and a
    coil write whose answers are lost end UNKNOWN and their read-back (the touched register or
    coil only: no generation) says the intended state holds."""
    from idemlink.host.aio import AsyncRtuDevice

    boiler = ready(line, map_file, drop=lambda frame: frame[1] in (FC22, FC05))

    async def session() -> None:
        async with AsyncRtuDevice.open(line.b_path, regmap=str(map_file),
                                       timeout=scaled(0.1), attempts=2) as dev:
            r = await dev.execute(dev.read_covering([dev.spec("flow_temperature"),
                                                     dev.spec("serial_number")]))
            assert dev.decode(r) == {"flow_temperature": -5.0, "outdoor_temperature": -12.3,
                                     "energy": 1234.5, "run_hours": 70000,
                                     "serial_number": "AB-1234567"}
            assert (await dev.write({"setpoint": "-7.5"})).outcome is Outcome.OK
            assert boiler.writes[-1] == (FC06, 0x100, to_regs(-75, "INT16"))
            assert (await dev.write({"energy_limit": "4000000000"})).outcome is Outcome.OK
            assert from_regs(boiler.writes[-1][2], "UINT32", "little") == 4_000_000_000
            # answers lost after the device executed: UNKNOWN, then a read-back that holds
            for values, fc in (({"stage": "high"}, FC22), ({"pump": "off"}, FC05)):
                result = await dev.write(values)
                assert result.outcome is Outcome.UNKNOWN and boiler.writes[-1][0] == fc
                rec = await dev.reconcile(result)
                assert rec is not None and rec.intended_state_holds is True, rec
                assert set(rec.observed) <= {"control", "stage", "pump"}, rec.observed
                dev.acknowledge_unknown()
            assert dev.decode(await dev.read("control")) == {
                "control": 0x21, "heating": 1, "hot_water": 0, "stage": 2}  # neighbours kept
            assert dev.decode(await dev.read("pump")) == {"pump": 0}
            with pytest.raises(LocalProtocolError, match="no generation register"):
                await dev.write_if_generation(0, {"setpoint": 1})

    try:
        asyncio.run(session())
    finally:
        boiler.close()


@pytest.mark.parametrize("argv", [("faults",), ("clear",), ("clear", "overheat")])
def test_no_w1c_fault_word_is_said_in_one_line_nothing_sent(
        argv: tuple[str, ...], map_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The boiler's fault word is a plain input: the commands that need a W1C word say so, with
    the way to read the device's own word, before opening the port."""
    rc, out, err = cli(capsys, *argv, "--port", str(tmp_path / "no-such-port"), "--modbus-rtu",
                       "--regmap", str(map_file))
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert "the map acme-boiler has no fault register (W1C)" in err
    assert "nothing was sent" in err and "idemlink read NAME" in err


@pytest.mark.parametrize("argv", [("trigger",), ("trigger", "--status")])
def test_without_a_trigger_or_command_register_trigger_is_refused_in_one_line(
        argv: tuple[str, ...], map_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    no_purge = tmp_path / "no-purge.toml"
    no_purge.write_text(MAP.replace('kind = "command"', 'kind = "holding"'), encoding="utf-8")
    rc, out, err = cli(capsys, *argv, "--port", str(tmp_path / "no-such-port"), "--modbus-rtu",
                       "--regmap", str(no_purge))
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert "the map acme-boiler has no trigger register" in err and "nothing was sent" in err


# ------------------------------------------------------------------ the purge command register

def purge_answer(frame: bytes) -> bool:
    """The boiler's answer to a write of the purge register (FC06 or FC16 at PURGE)."""
    return frame[1] in (FC06, FC16) and int.from_bytes(frame[2:4], "big") == PURGE


def test_a_purge_triggered_twice_from_python_starts_once(line: LinkProxy,
                                                         map_file: Path) -> None:
    """``RtuDevice.trigger`` reads the purge register first: started (ACCEPTED), then running
    (RUNNING, nothing written); once the boiler says it is done, the next trigger starts another.
    The boiler's own log is the judge."""

    boiler = ready(line, map_file)
    try:
        with RtuDevice.open(line.b_path, regmap=str(map_file), timeout=scaled(0.1),
                            attempts=3) as dev:
            first, second = dev.trigger("purge"), dev.trigger("purge")
            assert (first.outcome, first.code) == (Outcome.OK, TriggerStatus.ACCEPTED)
            assert (second.outcome, second.code) == (Outcome.OK, TriggerStatus.RUNNING)
            assert boiler.log == [("start", 1)]
            assert [w for w in boiler.writes if w[1] == PURGE] == [(FC06, PURGE, [1])]
            assert dev.decode(dev.read("purge")) == {"purge": 1}
            boiler.finish()
            assert dev.decode(dev.read("purge")) == {"purge": 0}
            assert dev.trigger("purge").code == TriggerStatus.ACCEPTED  # done: a new purge
            assert boiler.log == [("start", 1), ("done", 1), ("start", 1)]
    finally:
        boiler.close()


def test_the_asyncio_driver_triggers_a_purge_once_too(line: LinkProxy, map_file: Path) -> None:
    from idemlink.host.aio import AsyncRtuDevice

    boiler = ready(line, map_file)

    async def twice() -> tuple[int | None, int | None]:
        async with AsyncRtuDevice.open(line.b_path, regmap=str(map_file), timeout=scaled(0.1),
                                       attempts=3) as dev:
            first, second = await dev.trigger("purge"), await dev.trigger("purge")
            return first.code, second.code

    try:
        assert asyncio.run(twice()) == (TriggerStatus.ACCEPTED, TriggerStatus.RUNNING)
        assert boiler.log == [("start", 1)]
    finally:
        boiler.close()


def test_a_purge_whose_answer_is_lost_is_unknown_then_read_back(line: LinkProxy,
                                                                map_file: Path) -> None:
    """The boiler starts the purge and its answer is lost: UNKNOWN, sent once (a command is
    never retried: a retry after the purge ended would start another), and the read-back says
    it holds — the register reads 1, the purge runs. Both RTU drivers; the log shows one start
    each."""
    from idemlink.host.aio import AsyncRtuDevice

    boiler = ready(line, map_file, drop=purge_answer)
    try:
        with RtuDevice.open(line.b_path, regmap=str(map_file), timeout=scaled(0.1),
                            attempts=3) as dev:
            result = dev.trigger("purge")
            assert (result.outcome, result.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
            assert boiler.log == [("start", 1)]
            assert [w for w in boiler.writes if w[1] == PURGE] == [(FC06, PURGE, [1])]
            with pytest.raises(UnknownOutstanding):  # a possible effect blocks the handle
                dev.trigger("purge")
            rec = dev.reconcile()
            assert rec is not None and rec.intended_state_holds is True, rec
            assert rec.observed == {"purge": 1}
            dev.acknowledge_unknown()
            assert dev.trigger("purge").code == TriggerStatus.RUNNING  # nothing started
        boiler.finish()

        async def lost() -> None:
            async with AsyncRtuDevice.open(line.b_path, regmap=str(map_file),
                                           timeout=scaled(0.1), attempts=3) as dev:
                result = await dev.trigger("purge")
                assert result.outcome is Outcome.UNKNOWN
                rec = await dev.reconcile(result)
                assert rec is not None and rec.intended_state_holds is True, rec
                dev.acknowledge_unknown()
                assert (await dev.trigger("purge")).code == TriggerStatus.RUNNING

        asyncio.run(lost())
        assert boiler.log == [("start", 1), ("done", 1), ("start", 1)]
    finally:
        boiler.close()


def test_the_cli_triggers_a_purge_once_and_says_unknown_when_its_answer_is_lost(
        line: LinkProxy, map_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lose = [False]
    boiler = ready(line, map_file, drop=lambda frame: lose[0] and purge_answer(frame))
    try:
        r = rtu(line, map_file)
        assert cli(capsys, "trigger", *r, "purge")[0] == 0
        rc, out, _ = cli(capsys, "trigger", *r)  # the map's only command register
        assert rc == 0 and "purge: RUNNING (0x0101): already running: nothing started" in out
        rc, out, _ = cli(capsys, "trigger", *r, "--status")
        assert rc == 0 and "purge: running command 1" in out
        assert boiler.log == [("start", 1)]
        boiler.finish()
        rc, out, _ = cli(capsys, "trigger", *r, "--status")
        assert rc == 0 and "purge: idle" in out
        lose[0] = True
        rc, out, err = cli(capsys, "trigger", *r, "purge", "--timeout", f"{scaled(0.1):.3f}",
                           "--json")
        doc = json.loads(out)
        assert rc == 5 and doc["outcome"] == "UNKNOWN", err
        assert doc["reconcile"]["intended_state_holds"] is True, doc["reconcile"]
        assert boiler.log == [("start", 1), ("done", 1), ("start", 1)]
        # a plain write while it runs is sent once and starts nothing (the boiler keeps 1)
        lose[0] = False
        before = len(boiler.writes)
        rc, out, err = cli(capsys, "write", *r, "purge=1")
        assert rc == 0, err
        assert len(boiler.writes) == before + 1 and boiler.starts == 2
    finally:
        boiler.close()
