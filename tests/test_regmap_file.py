"""Register-map files: the format, its refusals, the map hash, and the map flowing everywhere.

A second device (the shipped pump controller: registers from 0x0100 with gaps, two fault words,
two triggers, a volatile holding) drives the simulator, the API, the CLI, the pytest fixture and
the generated C header; the device's own execution log and flash are the ground truth.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice
from idemlink.protocol.device_core import GENERATION_RESERVE
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.payloads import DeviceInfo
from idemlink.protocol.registers import RegisterKind, TriggerState
from idemlink.protocol.regmap_file import (
    DEFAULT_MAP,
    RegmapFileError,
    builtin_map,
    load_regmap,
    parse_regmap,
)
from idemlink.pytest_plugin import InProcessSim, start_pty_sim

PUMP = builtin_map("pump-controller")
MAPS = Path(__file__).resolve().parent.parent / "protocol" / "maps"

BASE = """name = "t"
[[registers]]
address = 0
name = "generation"
kind = "generation"
"""


def with_register(body: str) -> str:
    return BASE + "[[registers]]\n" + body


# ------------------------------------------------------------------------------ the format


def test_builtin_thermal_controller_is_the_map_the_demo_always_had() -> None:
    assert DEFAULT_MAP.name == "thermal-controller"
    assert [(r.address, r.name, r.kind) for r in DEFAULT_MAP][:5] == [
        (0, "temperature", RegisterKind.INPUT), (1, "humidity", RegisterKind.INPUT),
        (2, "fan_speed", RegisterKind.INPUT), (3, "generation", RegisterKind.GENERATION),
        (4, "threshold", RegisterKind.HOLDING)]
    t = DEFAULT_MAP.named("threshold")
    assert (t.minimum, t.maximum, t.default, t.scale, t.unit) == (0, 1000, 350, "0.1", "°C")
    assert [b.name for b in DEFAULT_MAP.named("faults").bits] == [
        "over_temperature", "sensor_fault", "fan_stall"]


def test_pump_map_has_its_own_layout() -> None:
    assert PUMP.generation is not None and PUMP.generation.address == 0x0200
    assert len(PUMP.of_kind(RegisterKind.FAULT)) == 2
    assert len(PUMP.of_kind(RegisterKind.TRIGGER)) == 2
    assert PUMP.named("test_speed").persist is False
    assert PUMP.hash != DEFAULT_MAP.hash


def test_regmap_json_is_a_map_file_that_loads_back(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("thermal-controller", "pump-controller"):
        assert main(["regmap", name, "--json"]) == 0
        exported = tmp_path / f"{name}.json"
        exported.write_text(capsys.readouterr().out)
        assert load_regmap(exported) == builtin_map(name)
        assert load_regmap(exported).hash == builtin_map(name).hash
    edited = json.loads(exported.read_text())
    edited["registers"][4]["max"] = 3000
    exported.write_text(json.dumps(edited))
    with pytest.raises(RegmapFileError, match="field 'hash'"):
        load_regmap(exported)
    del edited["hash"]
    exported.write_text(json.dumps(edited))
    assert load_regmap(exported).named("speed_setpoint").maximum == 3000


def test_json_and_toml_describe_the_same_map(tmp_path: Path) -> None:
    doc = {"name": "pump-controller", "description": PUMP.description, "registers": []}
    for r in PUMP:
        d: dict[str, object] = {"address": r.address, "name": r.name, "kind": r.kind.name.lower()}
        if r.unit:
            d["unit"] = r.unit
        if r.scale:
            d["scale"] = r.scale
        if r.kind in (RegisterKind.INPUT, RegisterKind.HOLDING):
            d["default"] = r.default
        if r.kind is RegisterKind.HOLDING:
            d.update(min=r.minimum, max=r.maximum, persist=r.persist)
        if r.labels:
            d["labels"] = {s: v for v, s in r.labels}
        if r.bits:
            d["bits"] = [{"bit": b.bit, "name": b.name} for b in r.bits]
        doc["registers"].append(d)  # type: ignore[attr-defined]
    path = tmp_path / "pump.json"
    path.write_text(json.dumps(doc))
    assert load_regmap(path).hash == PUMP.hash


@pytest.mark.parametrize(("body", "expected"), [
    ('address = 1\nname = "speed"\nkind = "holding"\nmin = 10\nmax = 5\n',
     "register 'speed' (#2): field 'max': 5 is below min 10"),
    ('address = 1\nname = "speed"\nkind = "holding"\nmax = 70000\n',
     "register 'speed' (#2): field 'max': 70000 outside 0..65535"),
    ('address = 1\nname = "speed"\nkind = "holding"\nmax = 5\ndefault = 6\n',
     "register 'speed' (#2): field 'default': 6 outside min..max (0..5)"),
    ('address = 1\nname = "count"\nkind = "increment"\n',
     "register 'count' (#2): field 'kind': register kind 'increment' is not allowed"),
    ('address = 1\nname = "flip"\nkind = "toggle"\n', "a retried toggle flips back"),
    ('address = 1\nname = "alarm"\nkind = "fault"\nclear_on_read = true\n',
     "field 'clear_on_read' is not allowed"),
    ('address = 0\nname = "other"\nkind = "trigger"\n',
     "register 'other': field 'address': 0x0000 is already 'generation'"),
    ('address = 1\nname = "speed"\nkind = "holding"\nmaximum = 3\n',
     "unknown field(s) ['maximum']"),
    ('address = 1\nname = "go"\nkind = "trigger"\nmin = 0\n',
     "field(s) ['min'] do not apply to a trigger register"),
    ('address = 1\nname = "mode"\nkind = "holding"\nmax = 2\nlabels = { off = 0, on = 3 }\n',
     "label 'on' = 3 outside 0..2"),
    ('address = 1\nname = "mode"\nkind = "holding"\nlabels = { "12" = 1 }\n',
     "cannot be read as a number"),
    ('address = 1\nname = "t"\nkind = "input"\nscale = -1\n', "field 'scale'"),
    ('address = 1\nname = "count"\nkind = "input"\n', "would define IDL_REG_COUNT twice"),
    ('address = 1\nname = "Speed"\nkind = "input"\n', "lower-case ASCII identifier"),
    ('address = 1\nname = "a"\nkind = "input"\npersist = false\n',
     "field(s) ['persist'] do not apply to a input register"),
    ('address = 1\nname = "f"\nkind = "fault"\nbits = [{ bit = 16, name = "x" }]\n',
     "fault bits must be unique, in 0..15"),
])
def test_refusals_name_the_file_the_register_and_the_field(body: str, expected: str) -> None:
    with pytest.raises(RegmapFileError) as exc:
        parse_regmap(with_register(body), source="dev.toml")
    message = str(exc.value)
    assert message.startswith("dev.toml: "), message
    assert expected in message, message
    assert "\n" not in message


def test_document_level_refusals() -> None:
    for text, expected in [
        ("registers = []\n", "field 'name' is missing"),
        ('name = "x"\n', "field 'registers'"),
        ('name = "x"\nregister = 1\n', "unknown top-level field(s) ['register']"),
        ('name = "x"\n[[registers]]\naddress = 1\nname = "a"\nkind = "generation"\n'
         '[[registers]]\naddress = 2\nname = "b"\nkind = "generation"\n',
         "at most one GENERATION"),
        ("name = [", "not valid TOML"),
    ]:
        with pytest.raises(RegmapFileError, match=None) as exc:
            parse_regmap(text, source="m.toml")
        assert expected in str(exc.value), str(exc.value)


def test_unreadable_files_are_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    import os

    os.mkfifo(fifo)
    with pytest.raises(RegmapFileError, match="not a regular file"):
        load_regmap(fifo)
    big = tmp_path / "big.toml"
    with big.open("wb") as f:
        f.truncate(3 << 30)  # sparse: must not be read
    with pytest.raises(RegmapFileError, match="at most"):
        load_regmap(big)
    with pytest.raises(RegmapFileError, match="cannot open"):
        load_regmap(tmp_path / "missing.toml")


def test_values_as_people_read_them() -> None:
    t = DEFAULT_MAP.named("threshold")
    assert t.show(420) == "42.0 °C"
    assert t.raw_from_text("42.5") == 425
    with pytest.raises(ValueError, match="multiple of the scale"):
        t.raw_from_text("42.55")
    mode = DEFAULT_MAP.named("mode")
    assert mode.show(1) == "auto"
    assert mode.raw_from_text("manual") == 2
    with pytest.raises(ValueError, match="off, auto, manual"):
        mode.raw_from_text("fast")


def test_map_hash_follows_meaning_not_prose() -> None:
    text = (MAPS / "pump-controller.toml").read_text()
    assert parse_regmap(text).hash == PUMP.hash
    reworded = text.replace('description = "motor speed set-point"', 'description = "speed"')
    assert parse_regmap(reworded).hash == PUMP.hash
    assert parse_regmap(text.replace("max = 3600\ndefault = 1450",
                                     "max = 3000\ndefault = 1450")).hash != PUMP.hash


# ------------------------------------------------------------------------------ HELLO


def test_hello_reply_carries_map_hash_and_device_id_and_old_replies_still_parse() -> None:
    dev = SimulatedDevice(seed=1, regmap=PUMP, device_id="pump-07")
    info = dev.session.device_info()
    back = DeviceInfo.decode(info.encode())
    assert (back.map_hash, back.device_id, back.map_name) == (PUMP.hash, "pump-07",
                                                              "pump-controller")
    old = DeviceInfo(*[getattr(info, f) for f in (
        "version", "window", "max_payload", "replay_slots", "max_inflight", "contract_hash",
        "next_seq", "name")])
    assert DeviceInfo.decode(old.encode()).map_hash is None


def test_a_host_with_another_map_is_refused_naming_both_hashes() -> None:
    sim = SimTransport(SimulatedDevice(seed=2, regmap=PUMP))
    dev = Device(sim)  # the built-in thermal map
    with pytest.raises(IncompatibleDevice) as exc:
        dev.connect()
    assert PUMP.hash.hex() in str(exc.value) and DEFAULT_MAP.hash.hex() in str(exc.value)
    assert not sim.device.executions
    ok = Device(sim, regmap=PUMP)
    ok.connect()
    assert ok.read("speed_setpoint").values == (1450,)


def test_a_device_built_from_another_version_of_the_map_is_told_to_rebuild() -> None:
    """Same map name, another hash: the firmware was built before the map file changed (or the
    other way round). The refusal says to rebuild and flash, not only to find another file."""
    from dataclasses import replace

    older = replace(PUMP, registers=PUMP.registers[:-1])
    sim = SimTransport(SimulatedDevice(seed=2, regmap=older))
    with pytest.raises(IncompatibleDevice, match="another version of this map: rebuild") as exc:
        Device(sim, regmap=PUMP).connect()
    assert older.hash.hex() in str(exc.value) and "REGMAP_H=" in str(exc.value)
    with pytest.raises(IncompatibleDevice) as other:
        Device(sim).connect()  # another map altogether: no rebuild advice
    assert "rebuild" not in str(other.value)
    assert not sim.device.executions


def test_device_id_is_kept_in_the_flash_dir(tmp_path: Path) -> None:
    first = SimulatedDevice(flash_dir=tmp_path).device_id
    assert SimulatedDevice(flash_dir=tmp_path).device_id == first
    assert SimulatedDevice(flash_dir=tmp_path / "other").device_id != first
    assert SimulatedDevice(seed=5).device_id == SimulatedDevice(seed=5).device_id


# ------------------------------------------------------------------------------ the pump, end to end


def test_pump_through_the_api_every_kind() -> None:
    sim = SimulatedDevice(seed=3, regmap=PUMP, trigger_duration=1.0)
    t = SimTransport(sim)
    dev = Device(t, regmap=PUMP)
    dev.connect()
    assert dev.write({"speed_setpoint": 1800, "max_pressure": 80, "control": 1}).ok
    assert sim.core.value("speed_setpoint") == 1800
    assert dev.write({"max_pressure": 200}).outcome is Outcome.REJECTED  # above max 160
    with pytest.raises(ValueError, match="prime, flush"):
        dev.trigger()
    r = dev.trigger("flush")
    assert r.outcome is Outcome.OK and r.code == 0
    assert sim.core.value("flush") == TriggerState.RUNNING
    assert sim.core.value("prime") == TriggerState.IDLE
    sim.core.set_condition("dry_run", True, t.now())
    assert sim.core.value("hydraulic_faults") == 1
    sim.core.set_condition("dry_run", False, t.now())
    with pytest.raises(ValueError, match="2 fault registers"):
        dev.clear_faults(1)
    assert dev.clear_faults(1, "hydraulic_faults").outcome is Outcome.OK
    assert sim.core.value("hydraulic_faults") == 0
    started = [e for e in sim.core.log if e.kind.name == "TRIGGER_STARTED"]
    assert [e.register for e in started] == ["flush"]


def test_volatile_holding_returns_to_default_at_reboot_and_moves_the_generation() -> None:
    sim = SimulatedDevice(seed=4, regmap=PUMP)
    t = SimTransport(sim)
    dev = Device(t, regmap=PUMP)
    dev.connect()
    assert dev.write({"test_speed": 900}).ok and dev.write({"speed_setpoint": 1000}).ok
    gen = sim.core.generation
    t.reboot()
    assert sim.core.value("test_speed") == 0
    assert sim.core.value("speed_setpoint") == 1000
    # the boot starts at the saved ceiling (the first write's 1 + 64): above every generation
    # shown before, so a write planned against the old configuration is stale
    assert sim.core.generation == 1 + GENERATION_RESERVE > gen


@pytest.mark.idemlink_regmap("pump-controller")
def test_fixture_takes_the_map_from_a_marker(idemlink_sim: InProcessSim) -> None:
    assert idemlink_sim.regmap.name == "pump-controller"
    dev = idemlink_sim.connect()
    assert dev.write({"speed_setpoint": 2000}).ok
    assert idemlink_sim.device.core.value("speed_setpoint") == 2000


def test_fixture_factory_takes_a_map_file(idemlink_sim_factory: object) -> None:
    sim = idemlink_sim_factory(regmap=str(MAPS / "pump-controller.toml"))  # type: ignore[operator]
    assert sim.connect().read("flow").values == (1250,)


def test_cli_drives_the_pump_over_a_pty(capsys: pytest.CaptureFixture[str]) -> None:
    pty = start_pty_sim(SimulatedDevice(seed=6, regmap=PUMP, device_id="pump-cli"))
    try:
        port = pty.path
        assert main(["write", "--port", port, "--regmap", "pump-controller",
                     "speed_setpoint=1700"]) == 0
        assert pty.device.core.value("speed_setpoint") == 1700
        capsys.readouterr()
        assert main(["read", "--port", port, "--regmap", str(MAPS / "pump-controller.toml"),
                     "--json", "speed_setpoint"]) == 0
        assert "1700" in capsys.readouterr().out
        assert main(["trigger", "--port", port, "--regmap", "pump-controller", "prime"]) == 0
        assert pty.device.core.value("prime") == TriggerState.RUNNING
        # The built-in map against the pump: refused, one line, nothing ran.
        before = len(pty.device.executions)
        assert main(["read", "--port", port, "threshold"]) == 1
        err = capsys.readouterr().err
        assert PUMP.hash.hex() in err and err.count("\n") == 1
        assert len(pty.device.executions) == before
        assert main(["info", "--port", port, "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["device_id"] == "pump-cli"
        assert info["map"] == {"name": "pump-controller", "hash": PUMP.hash.hex(),
                               "matches": False, "expected": {"name": "thermal-controller",
                                                              "hash": DEFAULT_MAP.hash.hex()}}
        assert main(["info", "--port", port, "--regmap", "pump-controller"]) == 0
        assert "matches --regmap" in capsys.readouterr().out
        # a fault bit names its word (bit names are unique in a map)
        with pty._shared.lock:
            pty.device.core.set_condition("overpressure", True, pty.device.core.now)
            pty.device.core.set_condition("overpressure", False, pty.device.core.now)
        assert pty.device.core.value("hydraulic_faults") == 8
        assert main(["clear", "--port", port, "--regmap", "pump-controller", "overpressure"]) == 0
        assert pty.device.core.value("hydraulic_faults") == 0
        capsys.readouterr()
        assert main(["clear", "--port", port, "--regmap", "pump-controller", "overpressure",
                     "overheat"]) == 1
        assert "different fault words" in capsys.readouterr().err
        assert main(["read", "--port", port, "v_set"]) == 1
        assert "give its map with --regmap FILE" in capsys.readouterr().err
    finally:
        pty.close()


def test_regmap_command_shows_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regmap", "pump-controller", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "idemlink.regmap/1" and doc["hash"] == PUMP.hash.hex()
    bad = tmp_path / "bad.toml"
    bad.write_text(with_register('address = 1\nname = "x"\nkind = "toggle"\n'))
    assert main(["regmap", "--check", str(bad)]) == 6
    assert "toggle" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_contract_renders_a_compiling_c_header_for_any_map(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    assert main(["contract", "--regmap", "pump-controller", "--out", str(out)]) == 0
    header = (out / "idemlink_regmap.h").read_text()
    assert f'#define IDL_MAP_HASH "{PUMP.hash.hex()}"' in header
    assert "#define IDL_REG_SPEED_SETPOINT 0x0201u" in header
    assert "#define IDL_REG_CONTROL_PRESSURE 2u" in header
    assert "#define IDL_FAULT_OVERPRESSURE (1u << 3)" in header
    assert (out / "pump-controller.md").read_text().count("| 0x0") == len(PUMP)
    src = tmp_path / "use.c"
    src.write_text('#include "idemlink_regmap.h"\n'
                   "unsigned first(void) { return IDL_REGMAP[0].address; }\n"
                   "unsigned count(void) { return (unsigned)(sizeof IDL_REGMAP / sizeof "
                   "IDL_REGMAP[0]); }\n")
    # everything a firmware build needs is in DIR: no idemlink checkout on the include path
    assert (out / "idemlink_proto.h").is_file()
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion",
                        "-Werror", "-c", "-o", str(tmp_path / "use.o"), f"-I{out}", str(src)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert main(["contract", "--regmap", "pump-controller", "--out", str(out), "--check"]) == 0


def test_python_api_takes_text_values_and_refuses_bad_ones_by_name() -> None:
    from idemlink.protocol.outcome import LocalProtocolError

    sim = SimulatedDevice(seed=8)
    dev = Device(SimTransport(sim))
    dev.connect()
    assert dev.write({"threshold": "42.5", "mode": "manual"}).ok
    assert (sim.core.value("threshold"), sim.core.value("mode")) == (425, 2)
    for bad, why in [({"threshold": 12.5}, "threshold=12.5: give a raw integer"),
                     ({"mode": "fast"}, "off, auto, manual"),
                     ({"threshold": 99999}, "threshold=99999: a register holds 0..65535"),
                     ({"threshold": 1, "fan_setpoint": 2}, "threshold@0x0004, fan_setpoint@0x0006")]:
        with pytest.raises(LocalProtocolError, match=None) as exc:
            dev.write(bad)
        assert why in str(exc.value), str(exc.value)
    assert str(Outcome.OK) == "OK" and f"{Outcome.UNKNOWN}" == "UNKNOWN"


@pytest.mark.parametrize("mode", [[], ["--modbus-rtu"]])
def test_a_flash_dir_saved_with_another_map_is_refused(tmp_path: Path, mode: list[str]) -> None:
    import sys

    flash = tmp_path / "flash"
    SimulatedDevice(flash_dir=flash, regmap=PUMP)  # claims the directory for the pump's map
    before = {p.name: p.read_bytes() for p in flash.iterdir()}
    # the same name, one limit changed: another hash
    text = (MAPS / "pump-controller.toml").read_text().replace("max = 3600\ndefault = 1450",
                                                                "max = 3000\ndefault = 1450")
    other = tmp_path / "pump2.toml"
    other.write_text(text)
    r = subprocess.run([sys.executable, "-m", "idemlink", "sim", *mode, "--regmap", str(other),
                        "--flash-dir", str(flash)], capture_output=True, text=True, check=False,
                       timeout=30)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"register map pump-controller {PUMP.hash.hex()}" in r.stderr
    assert {p.name: p.read_bytes() for p in flash.iterdir()} == before
