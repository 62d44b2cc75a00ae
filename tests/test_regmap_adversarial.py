"""Hostile map files, typed values and HELLO replies: one clear refusal, never a traceback or a hang.

- A map file nested too deeply, a scale whose arithmetic would explode, a JSON object giving a key
  twice: each is one ``RegmapFileError`` naming the file (and the field); a byte-order mark is
  ignored (same hash as without).
- The generated C header compiles whatever text a unit or description holds, and a register whose
  name renders to a name the header already defines is refused.
- A typed value is converted exactly: one that falls between two steps of the scale is refused
  however many digits it has; an absurd exponent is refused, not computed.
- A malformed HELLO_REPLY identity extension is a one-line refusal of an incompatible device; a
  device id or name holding control characters is shown escaped, never sent to the terminal.
- A --flash-dir written for another register map is refused (one line, file untouched), even when
  the other map has its holdings at the same addresses. The Modbus RTU simulator's start from its
  flash is a boot: volatile holdings revert there too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import pytest

from idemlink.cli import UserError, main
from idemlink.commands.write_cmd import parse_assignments
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.flash import ConfigFlash
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice
from idemlink.protocol.device_core import GENERATION_RESERVE, DeviceCore
from idemlink.protocol.payloads import DeviceInfo
from idemlink.protocol.registers import RegisterSchemaError, map_markdown, register
from idemlink.protocol.regmap_file import (
    DEFAULT_MAP,
    RegmapFileError,
    builtin_map,
    load_regmap,
    parse_regmap,
)
from idemlink.pytest_plugin import start_pty_sim

BASE = """name = "t"
[[registers]]
address = 0
name = "generation"
kind = "generation"
"""
BASE_JSON = '{"name": "t", "registers": [{"address": 0, "name": "generation", "kind": "generation"}'


def with_register(body: str) -> str:
    return BASE + "[[registers]]\naddress = 1\n" + body


# ------------------------------------------------------------------------------ map files


@pytest.mark.parametrize("fmt, text", [
    ("toml", "x = " + "[" * 50_000 + "]" * 50_000 + "\n"),
    ("toml", "x = " + "{a=" * 20_000 + "1" + "}" * 20_000 + "\n"),
    ("json", "[" * 50_000 + "]" * 50_000),
], ids=["toml-arrays", "toml-tables", "json-arrays"])
def test_a_file_nested_too_deeply_is_one_refusal(fmt: str, text: str) -> None:
    with pytest.raises(RegmapFileError, match=r"^deep\.\w+: not valid .*nested too deeply$"):
        parse_regmap(text, source=f"deep.{fmt}", fmt=fmt)


@pytest.mark.parametrize("scale", ['"1e5000"', '"1e999999999"', '"1e-5000"', "1e-300", "1e300",
                                   '"1.0000000000000001"'])
def test_a_scale_beyond_exact_arithmetic_is_refused_at_once(scale: str) -> None:
    start = time.process_time()  # this process's CPU: the cost, not the neighbours' load
    with pytest.raises(RegmapFileError, match=r"register 'x' \(#2\): field 'scale': .*1e-12"):
        parse_regmap(with_register(f'name = "x"\nkind = "holding"\nscale = {scale}\n'))
    assert time.process_time() - start < 1.0


def test_a_scale_is_checked_when_a_register_is_declared_in_python() -> None:
    with pytest.raises(RegisterSchemaError, match="x: scale must lie between"):
        register(1, "x", "holding", scale="1e40")


@pytest.mark.parametrize("doc, field", [
    (BASE_JSON + ', {"address": 1, "name": "x", "kind": "holding", "max": 10, "max": 7}]}', "max"),
    ('{"name": "t", "name": "u", "registers": []}', "name"),
])
def test_json_giving_a_key_twice_is_refused(doc: str, field: str) -> None:
    with pytest.raises(RegmapFileError, match=rf"^m\.json: field '{field}' is given twice"):
        parse_regmap(doc, source="m.json", fmt="json")


def test_a_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    plain = parse_regmap(BASE)
    toml_file = tmp_path / "bom.toml"
    toml_file.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
    json_file = tmp_path / "bom.json"
    json_file.write_bytes(b"\xef\xbb\xbf" + (BASE_JSON + "]}").encode())
    assert load_regmap(toml_file).hash == load_regmap(json_file).hash == plain.hash


def test_a_register_rendering_to_a_reserved_header_name_is_refused() -> None:
    with pytest.raises(RegmapFileError, match="IDL_REG_FLAG_PERSIST twice"):
        parse_regmap(with_register('name = "flag_persist"\nkind = "input"\n'))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_comment_text_from_the_map_cannot_break_the_c_header(tmp_path: Path) -> None:
    mapfile = tmp_path / "m.toml"
    mapfile.write_text(with_register(
        'name = "x"\nkind = "holding"\nunit = "*/ x /*"\n'
        '[[registers]]\naddress = 2\nname = "f"\nkind = "fault"\n'
        'bits = [{ bit = 0, name = "b", description = "*/ int oops; /*" }]\n'))
    out = tmp_path / "gen"
    assert main(["contract", "--regmap", str(mapfile), "--out", str(out)]) == 0
    src = tmp_path / "use.c"
    src.write_text('#include "idemlink_regmap.h"\n'
                   "unsigned x(void) { return IDL_REG_X + IDL_FAULT_B; }\n")
    include = Path(__file__).resolve().parent.parent / "firmware_ref" / "include"
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-c",
                        "-o", str(tmp_path / "use.o"), f"-I{out}", f"-I{include}", str(src)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("left, right", [
    ('kind = "fault"\nbits = [{ bit = 0, name = "a" }, { bit = 1, name = "b" }]\n',
     'kind = "fault"\nbits = [{ bit = 1, name = "b" }, { bit = 0, name = "a" }]\n'),
    ('kind = "holding"\nscale = 1\n', 'kind = "holding"\n'),
    ('kind = "holding"\nscale = "0.10"\n', 'kind = "holding"\nscale = 0.1\n'),
    ('kind = "holding"\nlabels = { a = 0, b = 1 }\n', 'kind = "holding"\nlabels = { b = 1, a = 0 }\n'),
], ids=["bit-order", "scale-1", "scale-0.10", "label-order"])
def test_equivalent_files_have_the_same_hash(left: str, right: str) -> None:
    assert (parse_regmap(with_register(f'name = "x"\n{left}')).hash
            == parse_regmap(with_register(f'name = "x"\n{right}')).hash)


def test_a_python_declared_scale_hashes_like_the_file() -> None:
    assert register(1, "x", "holding", scale="0.10").identity() == register(
        1, "x", "holding", scale="0.1").identity()


def test_the_hash_is_the_same_in_another_process(tmp_path: Path) -> None:
    mapfile = tmp_path / "m.toml"
    mapfile.write_text(with_register('name = "x"\nkind = "holding"\nscale = 0.25\n'
                                     'labels = { a = 0, b = 1 }\n'))
    code = ("import sys; from idemlink.protocol.regmap_file import load_regmap; "
            "print(load_regmap(sys.argv[1]).hash.hex())")
    out = subprocess.run([sys.executable, "-c", code, str(mapfile)], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == load_regmap(mapfile).hash.hex()


# ------------------------------------------------------------------------------ typed values


@pytest.mark.parametrize("text, message", [
    ("threshold=42.5000000000000000000000000001", "not a multiple of the scale 0.1"),
    ("threshold=1.0e999999999", "outside what a register holds"),
    ("threshold=1.0e-999999999", "not a multiple of the scale 0.1"),
    ("fan_setpoint=50.0000000000000000000000000001", "not an integer"),
])
def test_a_typed_value_is_converted_exactly_or_refused(text: str, message: str) -> None:
    start = time.process_time()  # this process's CPU: the cost, not the neighbours' load
    with pytest.raises(UserError, match=message):
        parse_assignments(DEFAULT_MAP, [text])
    assert time.process_time() - start < 1.0


def test_exact_values_still_convert() -> None:
    got = parse_assignments(DEFAULT_MAP, ["threshold=42.50", "fan_setpoint=50.0", "mode=auto"])
    assert [a.value for a in got] == [425, 50, 1]


# ------------------------------------------------------------------------------ HELLO


def _reply(identity: bytes) -> bytes:
    base = DeviceInfo(1, 64, 256, 64, 8, b"\0" * 8, 1, "dev")
    return base.encode() + identity


@pytest.mark.parametrize("identity", [b"\x01\x02\x03", b"\x01" * 8, b"\x01" * 8 + b"\x05ab",
                                      b"\x01" * 8 + b"\x02\xff\xfe\x00"])
def test_a_malformed_identity_extension_is_one_line(identity: bytes) -> None:
    with pytest.raises(ValueError) as exc:
        DeviceInfo.decode(_reply(identity))
    assert "\n" not in str(exc.value) and "HELLO_REPLY" in str(exc.value)


class _Truncated(DeviceInfo):
    """The identity extension cut short (the capabilities extension left out: the cut falls in
    the identity)."""

    def encode(self) -> bytes:
        return DeviceInfo.encode(replace(self, capabilities=None))[:-3]


class _TruncatedCapabilities(DeviceInfo):
    def encode(self) -> bytes:
        return DeviceInfo.encode(self)[:-1]  # the capabilities extension cut short


@pytest.mark.parametrize(("kind", "extension"), [(_Truncated, "identity"),
                                                 (_TruncatedCapabilities, "capabilities")])
def test_a_device_with_a_truncated_identity_is_refused_in_one_line(
        kind: type[DeviceInfo], extension: str) -> None:
    sim = SimulatedDevice(seed=7)
    real = sim.session.device_info
    sim.session.device_info = lambda: kind(  # type: ignore[method-assign]
        *[getattr(real(), f.name) for f in fields(DeviceInfo)])
    dev = Device(SimTransport(sim))
    with pytest.raises(IncompatibleDevice) as exc:
        dev.connect()
    assert str(exc.value).startswith(f"malformed HELLO_REPLY {extension} extension: field ")
    assert "\n" not in str(exc.value)
    assert not sim.executions


def test_a_device_id_with_control_characters_is_shown_escaped_on_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    sim = SimulatedDevice(seed=8, regmap=builtin_map("pump-controller"))
    sim.session.device_id = "evil\n\x1b[2Jid"
    sim.session.name = "name\rover"
    pty = start_pty_sim(sim)
    try:
        assert main(["info", "--port", pty.path]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\r" not in out
        assert "evil\\n\\x1b[2Jid" in out and "name\\rover" in out and out.count("\n") == 8
        assert main(["read", "--port", pty.path, "threshold"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "evil\\n\\x1b[2Jid" in err
        assert main(["info", "--port", pty.path, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["device_id"] == "evil\n\x1b[2Jid"
    finally:
        pty.close()


# ------------------------------------------------------------------------------ flash


def test_a_flash_dir_of_another_map_is_refused_even_at_the_same_addresses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flash = tmp_path / "flash"
    thermal = SimulatedDevice(seed=9, flash_dir=flash)
    t = SimTransport(thermal)
    dev = Device(t)
    dev.connect()
    assert dev.write({"threshold": 425}).ok  # 42.5 °C
    other_text = (Path(__file__).resolve().parent.parent / "protocol" / "maps"
                  / "thermal-controller.toml").read_text().replace(
        'name = "threshold"\nkind = "holding"\nunit = "°C"\nscale = 0.1',
        'name = "pressure_limit"\nkind = "holding"\nunit = "bar"')
    other_file = tmp_path / "other.toml"
    other_file.write_text(other_text)
    other = load_regmap(other_file)
    assert other.named("pressure_limit").address == DEFAULT_MAP.named("threshold").address
    saved = (flash / "config.json").read_bytes()
    with pytest.raises(OSError, match=f"register map thermal-controller {DEFAULT_MAP.hash.hex()}, not"):
        SimulatedDevice(seed=9, flash_dir=flash, regmap=other)
    for argv in (["sim", "--flash-dir", str(flash), "--regmap", str(other_file)],
                 ["sim", "--modbus-rtu", "--flash-dir", str(flash), "--regmap", str(other_file)]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(flash) in err and DEFAULT_MAP.hash.hex() in err
    assert (flash / "config.json").read_bytes() == saved
    again = SimulatedDevice(seed=9, flash_dir=flash)
    assert again.core.value("threshold") == 425


def test_a_flash_written_before_maps_were_recorded_still_loads(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"generation": 3, "holdings": [[4, 400], [5, 1], '
                                          '[6, 50]]}')
    sim = SimulatedDevice(seed=10, flash_dir=tmp_path)
    assert sim.core.value("threshold") == 400 and sim.core.generation == 3


def test_the_modbus_rtu_simulator_boots_volatile_holdings_back_to_default(tmp_path: Path) -> None:
    pump = builtin_map("pump-controller")

    def start() -> DeviceCore:
        core = DeviceCore(pump)
        server = RtuServer(core, flash=ConfigFlash(tmp_path))
        for name, value in (("test_speed", 900), ("speed_setpoint", 1000)):
            if core.value(name) != value:
                core.write(pump.named(name).address, (value,), 0.0, persist=server._persist)
        return core

    first = start()  # writes both
    gen = first.generation
    core = DeviceCore(pump)
    RtuServer(core, flash=ConfigFlash(tmp_path))
    assert core.value("test_speed") == 0 and core.value("speed_setpoint") == 1000
    # the boot starts at the saved ceiling, above every generation shown before: a planned
    # write is stale
    assert core.generation == 1 + GENERATION_RESERVE > gen


def test_text_from_the_map_cannot_split_a_row_of_the_register_document() -> None:
    regmap = parse_regmap(with_register(
        'name = "x"\nkind = "holding"\nunit = "a|b"\ndescription = "left | right \\\\"\n'))
    row = next(line for line in map_markdown(regmap).splitlines() if line.startswith("| 0x0001"))
    cells = [c for c in re.split(r"(?<!\\)\|", row)][1:-1]
    assert len(cells) == 9 and cells[7].strip() == "a\\|b"


# ------------------------------------------------------------------------------ pytest plugin

BAD_MARKERS = '''
import pytest

@pytest.mark.idemlink_regmap("nope.toml")
def test_missing_file(idemlink_sim):
    pass

@pytest.mark.idemlink_regmap()
def test_no_map_named(idemlink_sim):
    pass
'''


def test_a_marker_without_a_loadable_map_fails_the_test_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "test_bad_markers.py").write_text(BAD_MARKERS)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "idemlink_regmap('nope.toml'): nope.toml: cannot open the map file" in r.stdout
    assert "idemlink_regmap marker without a map: name one" in r.stdout
    assert "KeyError" not in r.stdout and "regmap_file.py" not in r.stdout, r.stdout
