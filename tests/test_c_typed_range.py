"""The C core refuses a typed HOLDING's out-of-range write as the simulator does (issue 24).

A map of the user's own (tests/maps/typed-holdings.toml: i16, i32, u32 little, f32 with a zero
limit, i64 little, f64, a read-only string of three registers) is rendered by ``idemlink contract``
and built into the ctypes core (``make lib REGMAP_H=...``). The same FC06/FC16 requests go to the C
core and to the Python ``DeviceCore``: limits, one past them, NaN, +-0, +-inf, random words, and
writes that cover part of a multi-register value; the answers are byte-identical and so are the
registers after. The generated rows hold the limits' comparable keys (protocol/contract.py
``_typed_key``), so the check is table-driven, compiled only for a map with a typed HOLDING
(IDL_REGMAP_TYPED).
"""

from __future__ import annotations

import ctypes
import json
import random
import struct
import subprocess
from pathlib import Path

import pytest
from support import firmware
from support.timing import scaled

from idemlink.protocol.contract import render_map_header
from idemlink.protocol.datatypes import DataType, full_range
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.registers import RegisterKind
from idemlink.protocol.regmap_file import load_regmap

MAP_FILE = Path(__file__).resolve().parent / "maps" / "typed-holdings.toml"
TYPED = load_regmap(MAP_FILE)


@pytest.fixture(scope="session")
def typed_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    firmware.need()
    d = tmp_path_factory.mktemp("typed")
    header = d / "idemlink_regmap.h"
    header.write_text(render_map_header(TYPED), encoding="utf-8")
    firmware.make("lib", f"BUILD={d / 'build'}", f"REGMAP_H={header}")
    return firmware.shim_library(d / "build" / "libidl_core.so")


def _candidates(rng: random.Random) -> list[tuple[int, tuple[int, ...]]]:
    """(address, words) per HOLDING: its limits and one past them (as raw keys move), the
    type's ends, float specials, random raw values."""
    out = []
    for spec in TYPED.of_kind(RegisterKind.HOLDING):
        bits = 16 * spec.words
        raws = {spec.minimum, spec.maximum, spec.default, 0, (1 << bits) - 1, 1 << (bits - 1),
                (1 << (bits - 1)) - 1, *full_range(spec.dtype, spec.words)}
        if spec.dtype.is_integer:
            for v in (spec.native(spec.minimum), spec.native(spec.maximum)):
                for dv in (-1, 1):
                    n = int(v) + dv
                    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if spec.dtype.signed \
                        else (0, (1 << bits) - 1)
                    if lo <= n <= hi:
                        raws.add(n & ((1 << bits) - 1))
        if spec.dtype.is_float:
            fmt = ">f" if spec.dtype is DataType.F32 else ">d"
            for x in (float("nan"), -float("nan"), 0.0, -0.0, float("inf"), -float("inf"),
                      -1.5, -1.5000001, 1e300, 1.0000001e300, -1e-300, 1e-300):
                try:
                    raws.add(int.from_bytes(struct.pack(fmt, x), "big"))
                except OverflowError:  # 1e300 as an f32
                    continue
            raws.add(int.from_bytes(struct.pack(fmt, float("nan")), "big") | 1)
        raws |= {rng.getrandbits(bits) for _ in range(20)}
        out += [(spec.address, spec.words_of(r)) for r in sorted(raws)]
    return out


def _pdu(address: int, words: tuple[int, ...]) -> bytes:
    if len(words) == 1 and address % 2:
        return bytes([6]) + struct.pack(">HH", address, words[0])
    return bytes([16]) + struct.pack(">HHB", address, len(words), 2 * len(words)) + b"".join(
        struct.pack(">H", w) for w in words)


def test_typed_holdings_are_range_checked_like_the_simulator(typed_lib: ctypes.CDLL) -> None:
    lib = typed_lib
    buf = ctypes.create_string_buffer(lib.idl_shim_sizeof())
    lib.idl_shim_init(buf, 1, 2000, b"typed", 0)
    out = ctypes.create_string_buffer(300)
    py = DeviceCore(TYPED, trigger_duration=2.0)
    rng = random.Random(24)
    cases = _candidates(rng)
    # parts of a value: from inside it, or stopping inside it (02); and whole runs across values
    cases += [(3, (0,)), (3, (0, 1)), (2, (0,)), (4, (1,)), (5, (1, 0)), (9, (0, 0, 0)),
              (8, (1, 0, 0)), (7, (0, 0, 0, 0, 0)), (14, (0, 0)), (1, (5, 0, 0)),
              (0, (15, 2, 0, 1, 0xA0, 1)), (0, (15, 0xFFFF, 0xFFFE, 0x7960, 0, 0)),
              (0, (9, 2, 0, 1, 0xA0, 1)),
              # a string HOLDING is read-only: any write touching it is 02
              (17, (0x4142,)), (18, (0x4142,)), (17, (0x4142, 0x2D31, 0)), (16, (0, 0x4142)),
              (15, (0, 0, 0, 0, 0))]
    seen = {"ok": 0, "02": 0, "03": 0}
    for now, (address, words) in enumerate(cases):
        pdu = _pdu(address, words)
        n = lib.idl_shim_execute(buf, pdu, len(pdu), now, out)
        expected = py.execute(pdu, now / 1000)
        assert out.raw[:n] == expected, (address, [hex(w) for w in words])
        seen["ok" if expected[0] < 0x80 else f"{expected[1]:02d}"] += 1
    assert all(seen.values()), seen  # every outcome happened: the test can tell them apart
    # the map has no generation register: the conditional write (0x41) is not served, 01 as on
    # the simulator (DeviceCore.serves), whatever it carries
    for pdu in (bytes.fromhex("410000000000010200") + bytes([15]), bytes.fromhex("4100")):
        n = lib.idl_shim_execute(buf, pdu, len(pdu), 999, out)
        assert out.raw[:n] == py.execute(pdu, 0.999) == bytes([0xC1, 1]), pdu.hex()
    for spec in TYPED.of_kind(RegisterKind.HOLDING):
        for a, word in zip(spec.span, spec.words_of(py.value(spec.name)), strict=True):
            assert lib.idl_shim_get(buf, a) == word, spec.name


def test_the_checked_in_typed_header_is_the_generators() -> None:
    """``make check`` compiles the core with firmware_ref/tests/typed_regmap.h (this map, typed
    range check in) under every compiler variant: it must be what the generator renders now."""
    header = firmware.FW / "tests" / "typed_regmap.h"
    assert header.read_text(encoding="utf-8") == render_map_header(TYPED), (
        "regenerate firmware_ref/tests/typed_regmap.h from tests/maps/typed-holdings.toml")
    assert "#define IDL_REGMAP_TYPED 1 " in header.read_text(encoding="utf-8")


def test_a_saved_typed_value_outside_its_limits_is_refused_at_boot(typed_lib: ctypes.CDLL) -> None:
    """``idl_regs_restore`` (what the device boots from flash) takes a snapshot only when every
    HOLDING is within its limits as the register model says (``in_range``): the same check."""
    lib = typed_lib
    buf = ctypes.create_string_buffer(lib.idl_shim_sizeof())
    rows = [a for spec in TYPED for a in spec.span]  # the table's rows, in address order
    defaults = {a: w for spec in TYPED for a, w in zip(spec.span, spec.words_of(spec.default),
                                                       strict=True)}
    verdicts = set()
    for address, words in _candidates(random.Random(5)):
        spec = TYPED.at(address)
        assert spec is not None
        snap = dict(defaults)
        snap.update(zip(spec.span, words, strict=True))
        lib.idl_shim_init(buf, 1, 2000, b"typed", 0)
        values = (ctypes.c_uint16 * len(rows))(*(snap[a] for a in rows))
        took = bool(lib.idl_shim_restore(buf, values, 7, 0))
        assert took == spec.in_range(spec.raw_from_words(words)), (spec.name, words)
        verdicts.add(took)
    assert verdicts == {True, False}


def test_the_posix_device_refuses_a_saved_typed_value_outside_its_limits(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """config.json edited by hand with a typed value outside its limits: the C device says so in
    one line and exits 1, as the simulator does (``SnapshotError``), instead of booting with the
    defaults without a word; flash is untouched. The same file with the value in range boots."""
    d = tmp_path_factory.mktemp("typed-device")
    header = d / "idemlink_regmap.h"
    header.write_text(render_map_header(TYPED), encoding="utf-8")
    firmware.make("device", f"BUILD={d / 'build'}", f"REGMAP_H={header}")
    device = d / "build" / "posix" / "idemlink-device"
    position = TYPED.named("position")
    holdings = {a: w for spec in TYPED.of_kind(RegisterKind.HOLDING)
                for a, w in zip(spec.span, spec.words_of(spec.default), strict=True)}
    for raw, ok in ((position.maximum, True), (position.maximum + 1, False)):
        holdings.update(zip(position.span, position.words_of(raw), strict=True))
        flash = d / f"flash-{ok}"
        flash.mkdir()
        text = json.dumps({"generation": 3, "holdings": sorted(holdings.items())})
        (flash / "config.json").write_text(text, encoding="utf-8")
        proc = subprocess.Popen([str(device), "--flash-dir", str(flash)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # serving: its pty's path; refused: nothing
            assert line.startswith("/dev/") == ok, (raw, line, "booted with the defaults")
            if ok:
                continue
            _, err = proc.communicate(timeout=scaled(30))
        finally:
            proc.kill()
            proc.wait()
        words = ", ".join(str(w) for w in position.words_of(raw))
        assert proc.returncode == 1 and err == (
            "idemlink-device: flash directory: config.json: address 2: "
            f"[{words}] outside its min..max (a typed value, judged whole)\n"), err
        assert (flash / "config.json").read_text(encoding="utf-8") == text
