"""Differential fuzzing of the C core's typed HOLDING check against the Python DeviceCore.

Random user maps (u16, i16, u32, i32, f32, u64, i64, f64 and strings, both word orders, limits
drawn from the type's ends, zero, negative ranges and float specials, registers side by side with
some gaps) are rendered by ``render_map_header`` and built into the ctypes core; Hypothesis then
drives both cores with the same FC06/FC16 writes and conditional writes (0x41, the guard
right or wrong): windows that cover values whole, in part or
across several, with words taken from each value's interesting raw values (limits and their
neighbours, NaN, +-inf, +-0.0, random). Every answer must be byte-identical and the registers the
same after, and a saved configuration of such words is taken at boot (``idl_regs_restore``)
exactly when the simulator's ``restore`` takes it. The default run: two maps and 40 sequences
each, the same every run (derandomized; about a second after the builds); ``--run-slow``: 8 more
maps and 400 random sequences each.
"""

from __future__ import annotations

import ctypes
import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import firmware

from idemlink.protocol.contract import render_map_header
from idemlink.protocol.datatypes import DataType, full_range
from idemlink.protocol.device_core import ConfigSnapshot, DeviceCore, SnapshotError
from idemlink.protocol.registers import RegisterKind, RegisterMap, RegisterSpec
from idemlink.protocol.regmap_file import parse_regmap

INT_TYPES = ("u16", "i16", "u32", "i32", "u64", "i64")
FLOAT_TYPES = ("f32", "f64")
TOML_INT = (-(1 << 63), (1 << 63) - 1)  # what a TOML integer can say


def _int_limits(rng: random.Random, dtype: DataType) -> tuple[int | None, int | None]:
    bits = 16 * dtype.words
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.signed else (0, (1 << bits) - 1)
    pool = [lo, hi, 0, 1, -1, lo + 1, hi - 1, rng.randint(lo, hi), rng.randint(lo, hi),
            rng.randint(-1000, 1000)]
    pool = [v for v in pool if lo <= v <= hi]
    a, b = sorted((rng.choice(pool), rng.choice(pool)))
    # a limit at the type's end may be left out (u64's top is beyond a TOML integer)
    return (None if a == lo and rng.random() < 0.5 else a,
            None if b == hi and (rng.random() < 0.5 or b > TOML_INT[1]) else b)


def _f32(x: float) -> float:
    return float(struct.unpack(">f", struct.pack(">f", x))[0])


def _float_limits(rng: random.Random, dtype: DataType) -> tuple[float | None, float | None]:
    top = 3.4028234663852886e38 if dtype is DataType.F32 else 1.7976931348623157e308
    tiny = 1e-45 if dtype is DataType.F32 else 5e-324
    pool = [0.0, -0.0, top, -top, tiny, -tiny, 1.5, -1.5, rng.uniform(-1e6, 1e6),
            rng.uniform(-1, 1)]
    if dtype is DataType.F32:
        pool = [_f32(x) for x in pool]
    a, b = sorted((rng.choice(pool), rng.choice(pool)))
    return (None if rng.random() < 0.15 else a, None if rng.random() < 0.15 else b)


def random_map(seed: int) -> RegisterMap:
    """A user map of 6..14 registers from ``seed``: mostly typed HOLDINGs side by side."""
    rng = random.Random(seed)
    lines = [f'name = "fuzz-{seed}"']
    address = 0
    for i in range(rng.randint(6, 14)):
        kind = "input" if rng.random() < 0.1 else "holding"
        tname = rng.choice(INT_TYPES + FLOAT_TYPES + ("u16", "string"))
        dtype = DataType(tname)
        entry = [f"address = {address}", f'name = "r{i}"', f'kind = "{kind}"',
                 f'type = "{tname}"']
        words = dtype.words
        if dtype is DataType.STRING:
            words = rng.choice((1, 2, 3, 4, 5))
            entry.append(f"length = {words}")
        if words > 1 and dtype is not DataType.STRING:
            entry.append(f'word_order = "{rng.choice(("big", "little"))}"')
        if kind == "holding" and dtype is not DataType.STRING:
            if dtype.is_float:
                lo_f, hi_f = _float_limits(rng, dtype)
                limits: dict[str, int | float | None] = {"min": lo_f, "max": hi_f}
            else:
                lo_i, hi_i = _int_limits(rng, dtype)
                limits = {"min": lo_i, "max": hi_i}
            for key, v in limits.items():
                if v is not None:
                    entry.append(f"{key} = {v!r}")
            default = limits["min"] if limits["min"] is not None else limits["max"]
            if default is not None:
                entry.append(f"default = {default!r}")
            entry.append(f"persist = {'true' if rng.random() < 0.7 else 'false'}")
        lines += ["", "[[registers]]", *entry]
        address += words + (1 if rng.random() < 0.15 else 0)
    return parse_regmap("\n".join(lines), source=f"fuzz-{seed}")


def interesting(spec: RegisterSpec, rng: random.Random) -> list[int]:
    """Raw values worth writing to ``spec``: its limits and their neighbours, the type's ends,
    float specials (NaN both signs and payloads, +-inf, +-0.0), random bits."""
    bits = 16 * spec.words
    mask = (1 << bits) - 1
    raws = {spec.minimum, spec.maximum, spec.default, 0, mask, 1 << (bits - 1),
            (1 << (bits - 1)) - 1, *full_range(spec.dtype, spec.words)}
    for r in (spec.minimum, spec.maximum):
        raws |= {(r + 1) & mask, (r - 1) & mask}  # one ulp / one unit either way (as raw bits)
    if spec.dtype.is_float:
        quiet = 0x7FC00000 if bits == 32 else 0x7FF8000000000000
        raws |= {quiet, quiet | 1 << (bits - 1), quiet | 1, (quiet | 1 << (bits - 1)) + 5}
        inf = 0x7F800000 if bits == 32 else 0x7FF0000000000000
        raws |= {0, 1 << (bits - 1), inf, inf | 1 << (bits - 1)}  # +-0.0, +-inf
    raws |= {rng.getrandbits(bits) for _ in range(4)}
    return sorted(raws)


class Lib:
    """One map's C core through ctypes."""

    def __init__(self, path: Path) -> None:
        self.lib = firmware.shim_library(path)


SEEDS = [3, 11]
SLOW_SEEDS = [101, 102, 103, 104, 105, 106, 107, 108]


@pytest.fixture(scope="session")
def build_map(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    made: dict[int, tuple[RegisterMap, Lib]] = {}

    def build(seed: int) -> tuple[RegisterMap, Lib]:
        if seed not in made:
            firmware.need()
            regmap = random_map(seed)
            d = tmp_path_factory.mktemp(f"fuzz{seed}")
            header = d / "idemlink_regmap.h"
            header.write_text(render_map_header(regmap), encoding="utf-8")
            firmware.make("lib", f"BUILD={d / 'build'}", f"REGMAP_H={header}")
            made[seed] = (regmap, Lib(d / "build" / "libidl_core.so"))
        return made[seed]
    return build


def _pdu(fc: int, address: int, words: list[int]) -> bytes:
    """FC06 (one word), FC16, or 0x41 (the conditional write) guarded by generation ``fc >> 8``."""
    values = b"".join(struct.pack(">H", w) for w in words)
    if fc == 6 and len(words) == 1:
        return bytes([6]) + struct.pack(">HH", address, words[0])
    if fc & 0xFF == 0x41:
        return bytes([0x41]) + struct.pack(">HHHB", fc >> 8, address, len(words),
                                           2 * len(words)) + values
    return bytes([16]) + struct.pack(">HHB", address, len(words), 2 * len(words)) + values


def _image(regmap: RegisterMap) -> st.SearchStrategy[list[int]]:
    """Words for every address of the map (two more past its end): its default, or for up to
    three values one of their interesting raws (one in range, or any) or any bits."""
    rng = random.Random(regmap.name)
    pools = {spec.address: interesting(spec, rng) for spec in regmap}
    end = max(a for spec in regmap for a in spec.span) + 1

    @st.composite
    def image(draw: st.DrawFn) -> list[int]:
        words = [0] * (end + 2)
        changed = draw(st.sets(st.sampled_from([spec.address for spec in regmap]), max_size=3))
        for spec in regmap:
            pool = pools[spec.address]
            raw = spec.default if spec.address not in changed else draw(
                st.sampled_from(pool) | st.sampled_from([r for r in pool if spec.in_range(r)]
                                                        or pool)
                | st.integers(0, (1 << (16 * spec.words)) - 1))
            for a, w in zip(spec.span, spec.words_of(raw), strict=True):
                words[a] = w
        return words
    return image()


def _writes(regmap: RegisterMap) -> st.SearchStrategy[list[tuple[int, int, list[int]]]]:
    rng = random.Random(regmap.name)
    pools = {spec.address: interesting(spec, rng) for spec in regmap}
    end = max(a for spec in regmap for a in spec.span) + 1

    @st.composite
    def one(draw: st.DrawFn) -> tuple[int, int, list[int]]:
        image = draw(_image(regmap))
        if draw(st.booleans()):  # one value whole, one of its interesting raws or any bits
            spec = draw(st.sampled_from(list(regmap)))
            raw = draw(st.sampled_from(pools[spec.address])
                       | st.integers(0, (1 << (16 * spec.words)) - 1))
            image[spec.address:spec.address + spec.words] = spec.words_of(raw)
            start, count = spec.address, spec.words
        else:  # any window: parts of values, several of them, past the map's end
            start = draw(st.integers(0, end))
            count = draw(st.integers(1, min(12, end + 2 - start)))
        fc = draw(st.sampled_from([6, 16]) | st.integers(0, 7).map(lambda g: g << 8 | 0x41))
        return fc, start, image[start:start + count]
    return st.lists(one(), min_size=1, max_size=6)


def _drive(regmap: RegisterMap, lib: Lib, writes: list[tuple[int, int, list[int]]],
           seen: set[str]) -> None:
    c = lib.lib
    buf = ctypes.create_string_buffer(c.idl_shim_sizeof())
    c.idl_shim_init(buf, 1, 2000, b"fuzz", 0)
    out = ctypes.create_string_buffer(300)
    py = DeviceCore(regmap, trigger_duration=2.0)
    for now, (fc, address, words) in enumerate(writes, start=1):
        pdu = _pdu(fc, address, words)
        n = c.idl_shim_execute(buf, pdu, len(pdu), now, out)
        expected = py.execute(pdu, now / 1000)
        assert out.raw[:n].hex() == expected.hex(), (pdu.hex(), regmap.name)
        seen.add("ok" if expected[0] < 0x80 else f"{expected[1]:02d}")
    for spec in regmap.of_kind(RegisterKind.HOLDING):
        for a, word in zip(spec.span, spec.words_of(py.value(spec.name)), strict=True):
            assert c.idl_shim_get(buf, a) == word, (spec.name, a)


def _restore(regmap: RegisterMap, lib: Lib, image: list[int], seen: set[str]) -> None:
    """A saved configuration of these words (the HOLDINGs' rows): the C core's boot restore
    takes it exactly when the simulator's does."""
    c = lib.lib
    buf = ctypes.create_string_buffer(c.idl_shim_sizeof())
    c.idl_shim_init(buf, 1, 2000, b"fuzz", 0)
    rows = [a for spec in regmap for a in spec.span]  # the C table's rows, in address order
    values = (ctypes.c_uint16 * len(rows))(*(image[a] for a in rows))
    took = bool(c.idl_shim_restore(buf, values, 7, 0))
    py = DeviceCore(regmap, trigger_duration=2.0)
    snap = ConfigSnapshot(tuple((a, image[a]) for spec in regmap.of_kind(RegisterKind.HOLDING)
                                for a in spec.span), 7)
    try:
        py.restore(snap, 0.0)
    except SnapshotError:
        assert not took, regmap.name
        seen.add("refused")
    else:
        assert took, regmap.name
        seen.add("restored")


def _run(seed: int, build_map, examples: int, fixed: bool) -> None:  # type: ignore[no-untyped-def]
    regmap, lib = build_map(seed)
    seen: set[str] = set()

    @settings(max_examples=examples, database=None, derandomize=fixed)
    @given(_writes(regmap), _image(regmap))
    def check(writes: list[tuple[int, int, list[int]]], image: list[int]) -> None:
        _drive(regmap, lib, writes, seen)
        _restore(regmap, lib, image, seen)
    check()
    # every outcome happened: the comparison could tell them apart
    assert seen >= {"ok", "02", "03", "restored", "refused"}, seen


@pytest.mark.parametrize("seed", SEEDS)
def test_c_typed_holdings_answer_like_the_simulator(seed: int, build_map) -> None:  # type: ignore[no-untyped-def]
    _run(seed, build_map, 40, True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_c_typed_holdings_answer_like_the_simulator_long(seed: int, build_map) -> None:  # type: ignore[no-untyped-def]
    _run(seed, build_map, 400, False)
