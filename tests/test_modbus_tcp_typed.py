"""Typed values over Modbus TCP: the third-party boiler (``support.boiler``: signed temperatures,
an f32 in little-word order, u32s, a string, a packed word of bit fields written by FC22, a purge
command register, coils, a discrete input; no generation register) served by pymodbus's own TCP
server, driven through ``--modbus-tcp`` on the command line and through ``TcpDevice`` and
``AsyncTcpDevice``. Ground truth: the boiler's own write and purge logs, its words read back
with pymodbus's converters."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.boiler import FC05, FC06, FC15, FC16, FC22, MAP, PURGE, READOUT, Boiler, from_regs, to_regs
from support.timing import scaled

from idemlink.cli import main
from idemlink.host.aio import AsyncTcpDevice
from idemlink.host.tcp_device import TcpDevice
from idemlink.protocol.outcome import LocalProtocolError, Outcome
from idemlink.protocol.registers import TriggerStatus

pytest.importorskip("pymodbus")

ALL = READOUT


@pytest.fixture
def map_file(tmp_path: Path) -> Path:
    path = tmp_path / "acme-boiler.toml"
    path.write_text(MAP, encoding="utf-8")
    return path


@pytest.fixture
def boiler() -> Iterator[Boiler]:
    b = Boiler(None)
    yield b
    b.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def tcp(boiler: Boiler, regmap: Path) -> tuple[str, ...]:
    return ("--modbus-tcp", boiler.address, "--regmap", str(regmap), "--timeout",
            f"{scaled(0.5):.3f}")


def test_the_cli_reads_every_type_over_tcp(boiler: Boiler, map_file: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, "read", "--all", *tcp(boiler, map_file))
    assert rc == 0, err
    assert [" ".join(x.split()) for x in out.splitlines()] == ALL
    rc, out, _ = cli(capsys, "read", "outdoor_temperature", "energy", "run_hours",
                     "serial_number", "stage", "flame", *tcp(boiler, map_file), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["outcome"] == "OK"
    assert {r["name"]: r["value"] for r in doc["registers"]} == {
        "outdoor_temperature": -12.3, "energy": 1234.5, "run_hours": 70000,
        "serial_number": "AB-1234567", "stage": 1, "flame": 1}
    assert boiler.writes == []


def test_the_cli_writes_each_type_over_tcp_with_the_right_function(
        boiler: Boiler, map_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = tcp(boiler, map_file)
    rc, out, err = cli(capsys, "write", "setpoint=-7.5", *r)
    assert rc == 0 and out == "setpoint=0xFFB5 (-7.5 °C): OK\n", err
    assert boiler.writes[-1] == (FC06, 0x100, to_regs(-75, "INT16"))
    assert cli(capsys, "write", "energy_limit=123456", *r)[0] == 0
    fc, address, words = boiler.writes[-1]
    assert (fc, address) == (FC16, 0x102) and from_regs(words, "UINT32", "little") == 123456
    rc, out, _ = cli(capsys, "write", "hot_water=1", "stage=high", *r)
    assert rc == 0 and out == "hot_water=1 stage=2 (high): OK\n"
    assert boiler.writes[-1][0] == FC22
    rc, out, _ = cli(capsys, "read", "control", *r)
    assert " ".join(out.split()) == "control = 0x0023 heating=1 hot_water=1 stage=high"
    assert cli(capsys, "write", "pump=off", *r)[0] == 0
    assert boiler.writes[-1] == (FC05, 0, [False])
    assert cli(capsys, "write", "pump=1", "alarm_relay=1", *r)[0] == 0
    assert boiler.writes[-1] == (FC15, 0, [True, True])
    before = len(boiler.writes)
    rc, _, err = cli(capsys, "write", "serial_number=X", *r)
    assert rc == 1 and "read-only string" in err and err.count("\n") == 1
    rc, _, err = cli(capsys, "write", "--if-generation", "3", "setpoint=1", *r)
    assert rc == 1 and "no generation register" in err and err.count("\n") == 1
    assert len(boiler.writes) == before


def test_the_cli_triggers_the_purge_once_over_tcp(boiler: Boiler, map_file: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    r = tcp(boiler, map_file)
    rc, out, _ = cli(capsys, "trigger", *r, "purge")
    assert rc == 0 and "purge: ACCEPTED (0x0000): started" in out
    rc, out, _ = cli(capsys, "trigger", *r, "purge")
    assert rc == 0 and "purge: RUNNING (0x0101): already running: nothing started" in out
    assert boiler.log == [("start", 1)]


def test_the_tcp_drivers_read_write_and_reconcile_typed_values(map_file: Path) -> None:
    """``TcpDevice`` and ``AsyncTcpDevice``: typed reads decoded, typed writes in one request,
    and writes whose answers are lost after the boiler executed them (FC22, FC05, the purge):
    UNKNOWN, then a read-back of the touched register that says the intended state holds."""
    lose = {FC22, FC05}

    def drop(frame: bytes) -> bool:  # a write's answer, while the test says so
        return frame[1] in lose or (frame[1] == FC06 and int.from_bytes(frame[2:4], "big")
                                    == PURGE and FC06 in lose)

    boiler = Boiler(None, drop=drop)
    try:
        with TcpDevice.open(boiler.address, regmap=str(map_file), timeout=scaled(0.3),
                            attempts=2) as dev:
            assert dev.decode(dev.read("energy")) == {"energy": 1234.5}
            r = dev.execute(dev.read_covering([dev.spec("flow_temperature"),
                                               dev.spec("serial_number")]))
            assert dev.decode(r) == {"flow_temperature": -5.0, "outdoor_temperature": -12.3,
                                     "energy": 1234.5, "run_hours": 70000,
                                     "serial_number": "AB-1234567"}
            assert dev.write({"energy_limit": "4000000000"}).outcome is Outcome.OK
            assert from_regs(boiler.writes[-1][2], "UINT32", "little") == 4_000_000_000
            for values, fc in (({"stage": "high"}, FC22), ({"pump": "off"}, FC05)):
                result = dev.write(values)
                assert result.outcome is Outcome.UNKNOWN and boiler.writes[-1][0] == fc
                rec = dev.reconcile(result)
                assert rec is not None and rec.intended_state_holds is True, rec
                dev.acknowledge_unknown()
            assert dev.decode(dev.read("control")) == {"control": 0x21, "heating": 1,
                                                       "hot_water": 0, "stage": 2}
            with pytest.raises(LocalProtocolError, match="no generation register"):
                dev.write_if_generation(0, {"setpoint": 1})
        lose.clear()

        async def session() -> None:
            async with AsyncTcpDevice.open(boiler.address, regmap=str(map_file),
                                           timeout=scaled(0.3), attempts=2) as adev:
                assert (await adev.write({"setpoint": "-7.5"})).outcome is Outcome.OK
                assert adev.decode(await adev.read("setpoint")) == {"setpoint": -7.5}
                first, second = await adev.trigger("purge"), await adev.trigger("purge")
                assert (first.code, second.code) == (TriggerStatus.ACCEPTED,
                                                     TriggerStatus.RUNNING)
                boiler.finish()
                lose.add(FC06)
                result = await adev.trigger("purge")
                assert result.outcome is Outcome.UNKNOWN
                rec = await adev.reconcile(result)
                assert rec is not None and rec.intended_state_holds is True, rec

        asyncio.run(session())
        assert boiler.log == [("start", 1), ("done", 1), ("start", 1)]
    finally:
        boiler.close()
