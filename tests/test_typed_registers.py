"""The typed map format, rule by rule: the codec of data types against ``struct``, what a map
file may say and what it refuses (one line naming the file, register and field), values typed
and shown by type, the simulator's core serving typed registers, coils, discrete inputs and mask
writes, the retry rules of the new functions, the bare-number rule of plans, and the C header of
a typed map. Every map written before types keeps its hash."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idemlink.host.command import Command, CommandBuilder, CommandKind, judge_read_back
from idemlink.host.plan import PlanError, parse_plan
from idemlink.protocol.datatypes import (
    DataType,
    WordOrder,
    combine,
    native,
    number_text,
    raw_of,
    split,
)
from idemlink.protocol.device_core import ConfigSnapshot, DeviceCore
from idemlink.protocol.modbus import (
    MaskWriteRegister,
    ReadBits,
    StandardFunction,
    WriteMultipleCoils,
    WriteSingleCoil,
    decode_response,
    encode_request,
)
from idemlink.protocol.outcome import LocalProtocolError, ModbusException
from idemlink.protocol.registers import RegisterKind, Space
from idemlink.protocol.regmap_file import (
    DEFAULT_MAP,
    RegmapFileError,
    builtin_map,
    map_document,
    parse_regmap,
)
from idemlink.protocol.rtu_master import retry_allowed

MAP = """name = "typed"
mask_write = true
[[registers]]
address = 0
name = "temp"
kind = "input"
type = "i16"
scale = 0.1
unit = "°C"
[[registers]]
address = 1
name = "energy"
kind = "input"
type = "f32"
word_order = "little"
[[registers]]
address = 3
name = "serial"
kind = "input"
type = "string"
length = 2
default = "AB12"
[[registers]]
address = 10
name = "setpoint"
kind = "holding"
type = "i16"
min = -100
max = 100
default = -5
[[registers]]
address = 11
name = "control"
kind = "holding"
fields = [{ name = "on", bit = 0 }, { name = "stage", bit = 4, width = 2 }]
[[registers]]
address = 12
name = "limit"
kind = "holding"
type = "u32"
word_order = "big"
max = 100000
default = 70000
[[registers]]
address = 14
name = "offset_temp"
kind = "holding"
offset = -40
min = 0
max = 200
default = 65
unit = "°C"
[[registers]]
address = 0
name = "relay"
kind = "coil"
[[registers]]
address = 1
name = "pump"
kind = "coil"
default = 1
[[registers]]
address = 0
name = "door"
kind = "discrete_input"
"""
TYPED = parse_regmap(MAP, source="typed.toml")


# ------------------------------------------------------------------------------ the codec


@given(st.integers(-(1 << 31), (1 << 31) - 1), st.sampled_from(list(WordOrder)))
def test_i32_round_trips_like_struct(value: int, order: WordOrder) -> None:
    raw = raw_of(DataType.I32, value)
    assert raw == int.from_bytes(struct.pack(">i", value), "big")
    words = split(raw, 2, order)
    big = struct.unpack(">2H", struct.pack(">i", value))
    assert words == (big if order is WordOrder.BIG else big[::-1])
    assert native(DataType.I32, combine(words, order)) == value


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_f32_round_trips_and_prints_shortest(value: float) -> None:
    raw = raw_of(DataType.F32, value)
    assert raw == int.from_bytes(struct.pack(">f", value), "big")
    back = native(DataType.F32, raw)
    assert struct.pack(">f", float(number_text(DataType.F32, back))) == struct.pack(">f", value)


def test_number_text_is_plain_and_short() -> None:
    assert number_text(DataType.F32, native(DataType.F32, raw_of(DataType.F32, 0.1))) == "0.1"
    assert number_text(DataType.F64, 5.0) == "5.0"
    assert number_text(DataType.I16, -5) == "-5"
    with pytest.raises(ValueError, match=r"outside what an i16 holds \(-32768..32767\)"):
        raw_of(DataType.I16, 40000)
    with pytest.raises(ValueError, match="beyond what an f32 holds"):
        raw_of(DataType.F32, 1e39)


def test_maps_from_before_types_hash_as_they_did() -> None:
    assert DEFAULT_MAP.hash.hex() == "1ba98b7efeb645ae"
    assert builtin_map("pump-controller").hash.hex() == "1969eb4a6f974ebf"


# ------------------------------------------------------------------------------ the format


def test_a_nonzero_float_too_small_for_its_type_is_refused_not_written_as_zero() -> None:
    """Issue 21 (review): ``flow_rate=1e-50`` was written as 0.0. A nonzero value that rounds
    to zero in its type is refused; a denormal that survives and 0 itself are kept."""
    for value in (1e-50, -1e-46):
        with pytest.raises(ValueError, match="too small for an f32: it would be written as 0"):
            raw_of(DataType.F32, value)
    assert raw_of(DataType.F32, 1e-44) != 0 and raw_of(DataType.F32, 0.0) == 0
    assert raw_of(DataType.F32, -0.0) == 0x80000000
    rm = parse_regmap('name = "f"\n[[registers]]\naddress = 3\nname = "flow_rate"\n'
                      'kind = "holding"\ntype = "f32"\nword_order = "little"\n'
                      '[[registers]]\naddress = 5\nname = "big"\nkind = "holding"\n'
                      'type = "f64"\nword_order = "big"\n')
    b = CommandBuilder(rm)
    for name, text in (("flow_rate", "1e-50"), ("big", "1e-400"), ("flow_rate", "-1e-46")):
        with pytest.raises(LocalProtocolError, match=f"{name}=.*too small for an f"):
            b.write_command({name: text})
    assert b.write_command({"flow_rate": "0"}).values == (0, 0)
    assert b.write_command({"flow_rate": "2.5"}).values == (0, 0x4020)


def test_a_typed_map_loads_exports_and_loads_back_alike() -> None:
    import json

    assert TYPED.generation is None and TYPED.mask_write
    back = parse_regmap(json.dumps(map_document(TYPED)), fmt="json")
    assert back == TYPED and back.hash == TYPED.hash
    assert parse_regmap(MAP.replace("mask_write = true", "")).hash != TYPED.hash
    assert TYPED.at(2) is TYPED.named("energy")  # the second register of the f32
    assert TYPED.spec_at(0, Space.COILS) is TYPED.named("relay")
    assert TYPED.spec_at(0, Space.DISCRETE_INPUTS) is TYPED.named("door")
    assert TYPED.named("stage").parent == "control"


BASE = 'name = "t"\n[[registers]]\naddress = 0\nname = "w"\nkind = "input"\ntype = "u32"\n' \
       'word_order = "big"\n'


@pytest.mark.parametrize(("body", "expected"), [
    ('address = 5\nname = "x"\nkind = "input"\ntype = "u32"\n',
     "register 'x' (#2): field 'word_order' is missing: a u32 takes 2 registers"),
    ('address = 5\nname = "x"\nkind = "input"\nword_order = "big"\n',
     "field 'word_order' applies to a type of several registers"),
    ('address = 5\nname = "x"\nkind = "input"\ntype = "u24"\n', "field 'type': unknown type"),
    ('address = 5\nname = "x"\nkind = "input"\ntype = "u32"\nword_order = "middle"\n',
     "neither \"big\""),
    ('address = 5\nname = "x"\nkind = "input"\ntype = "string"\n', "field 'length' is missing"),
    ('address = 1\nname = "x"\nkind = "input"\n', "field 'address': 0x0001 is already 'w' (its "
     "register 2)"),
    ('address = 5\nname = "x"\nkind = "fault"\ntype = "i16"\nbits = [{ bit = 0, name = "b" }]\n',
     "field(s) ['type'] do not apply to a fault register"),
    ('address = 5\nname = "x"\nkind = "holding"\ntype = "i16"\nmin = -40000\n',
     "field 'min': -40000 outside what an i16 holds"),
    ('address = 5\nname = "x"\nkind = "holding"\ntype = "i16"\nmin = 5\nmax = -5\n',
     "field 'max': -5 is below min 5"),
    ('address = 5\nname = "x"\nkind = "holding"\ntype = "i16"\ndefault = 1.5\n',
     "field 'default': 1.5 is not an integer"),
    ('address = 5\nname = "x"\nkind = "input"\ntype = "f32"\nword_order = "big"\nscale = 0.1\n',
     "a f32 register has no scale"),
    ('address = 5\nname = "x"\nkind = "holding"\ntype = "i16"\nlabels = { low = -40000 }\n',
     "labels.low"),
    ('address = 5\nname = "x"\nkind = "holding"\nfields = [{ name = "a", bit = 0, width = 2 },'
     ' { name = "b", bit = 1 }]\n', "field 'b' overlaps another field"),
    ('address = 5\nname = "x"\nkind = "holding"\nfields = [{ name = "w", bit = 0 }]\n',
     "name 'w' declared twice"),
    ('address = 5\nname = "x"\nkind = "holding"\nscale = 0.1\nfields = [{ name = "a", bit = 0 }]\n',
     "a register with bit fields has no scale"),
    ('address = 5\nname = "x"\nkind = "holding"\nfields = [{ name = "a", bit = 15, width = 2 }]\n',
     "bits 15..16 outside 0..15"),
    ('address = 5\nname = "x"\nkind = "coil"\ndefault = 2\n', "a coil is 0 or 1"),
    ('address = 5\nname = "x"\nkind = "coil"\nmin = 0\n', "do not apply to a coil register"),
    ('address = 5\nname = "x"\nkind = "input"\ntype = "string"\nlength = 1\ndefault = "abc"\n',
     "3 characters; the string holds 2"),
])
def test_typed_refusals_name_the_file_the_register_and_the_field(body: str, expected: str) -> None:
    with pytest.raises(RegmapFileError) as exc:
        parse_regmap(BASE + "[[registers]]\n" + body, source="dev.toml")
    assert str(exc.value).startswith("dev.toml: ") and "\n" not in str(exc.value)
    assert expected in str(exc.value), str(exc.value)


def test_mask_write_must_be_a_boolean_and_coils_have_their_own_addresses() -> None:
    with pytest.raises(RegmapFileError, match="field 'mask_write': need true or false"):
        parse_regmap('mask_write = "yes"\n' + BASE)
    both = parse_regmap(BASE + '[[registers]]\naddress = 0\nname = "c"\nkind = "coil"\n'
                        '[[registers]]\naddress = 0\nname = "d"\nkind = "discrete_input"\n')
    assert [s.space for s in both] == [Space.REGISTERS, Space.COILS, Space.DISCRETE_INPUTS]
    with pytest.raises(RegmapFileError, match="field 'address': coil 0x0000 is already 'c'"):
        parse_regmap(BASE + '[[registers]]\naddress = 0\nname = "c"\nkind = "coil"\n'
                     '[[registers]]\naddress = 0\nname = "e"\nkind = "coil"\n')


# ------------------------------------------------------------------------------ values


def test_values_are_typed_and_shown_by_type() -> None:
    temp, energy, setpoint = TYPED.named("temp"), TYPED.named("energy"), TYPED.named("setpoint")
    assert temp.raw_from_text("-5.0") == 0xFFCE and temp.show(0xFFCE) == "-5.0 °C"
    assert temp.typed(0xFFCE) == "0xFFCE (-5.0 °C)" and temp.value(0xFFCE) == -5.0
    with pytest.raises(ValueError, match=r"temp=4000 °C: outside what an i16 holds"):
        temp.raw_from_text("4000")
    # an explicit raw value is the words as sent, never the type's (negative) number
    with pytest.raises(ValueError, match=r"temp=raw:-5: a raw value is the register's words as "
                                         r"sent, 0..0xFFFF; type the i16 itself as a number"):
        temp.raw_from_text("raw:-5")
    assert temp.raw_from_text("raw:0xFFFB") == temp.raw_from_text("-0.5") == 0xFFFB
    assert energy.raw_from_text("12.5") == 0x41480000 and energy.value(0x41480000) == 12.5
    assert energy.words_of(0x41480000) == (0x0000, 0x4148)  # little word first
    assert setpoint.in_range(setpoint.raw_from_text("-100"))
    assert not setpoint.in_range(setpoint.raw_from_text("-101"))
    offset = TYPED.named("offset_temp")
    assert offset.show(65) == "25 °C" and offset.raw_from_text("25") == 65
    serial = TYPED.named("serial")
    assert serial.show(serial.default) == "AB12"
    with pytest.raises(ValueError, match="read-only string"):
        serial.raw_from_text("x")
    stage = TYPED.named("stage")
    assert stage.raw_from_text("3") == 3 and stage.raw_from_words((0x0031,)) == 3
    with pytest.raises(ValueError, match=r"outside what the field holds \(0..3\)"):
        stage.raw_from_text("4")


def test_the_builder_writes_typed_values_fields_and_coils_in_one_request_each() -> None:
    b = CommandBuilder(TYPED)
    c = b.write_command({"limit": "70000"})
    assert (c.address, c.values, c.function) == (12, (1, 4464), 0x10)
    c = b.write_command({"on": 1, "stage": "2"})
    assert c.kind is CommandKind.MASK_WRITE and c.function == StandardFunction.MASK_WRITE_REGISTER
    assert (c.and_mask, c.values) == (0xFFCE, (0x0021,))
    c = b.write_command({"relay": 1, "pump": 0})
    assert c.bits and c.function == StandardFunction.WRITE_MULTIPLE_COILS
    for bad, why in [({"on": 1, "setpoint": 1}, "bit fields are written by a mask write"),
                     ({"relay": 1, "setpoint": 1}, "coils are written apart"),
                     ({"door": 1}, "door is a read-only discrete input"),  # issue 21 review
                     ({"relay": 1, "door": 1}, "door is a read-only discrete input"),
                     ({"serial": "x"}, "read-only string"),
                     ({"setpoint": 70000}, "a raw i16 is 0..65535")]:
        with pytest.raises(LocalProtocolError, match=why):
            b.write_command(bad)
    with pytest.raises(LocalProtocolError, match="no generation register"):
        b.write_if_generation_command(0, {"setpoint": 1})
    plain = CommandBuilder(parse_regmap(MAP.replace("mask_write = true", "")))
    with pytest.raises(LocalProtocolError, match=r"needs a mask write \(FC22\)"):
        plain.write_command({"on": 1})


def test_an_address_inside_a_value_of_several_registers_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 (review): ``write 0x202=5`` where an i32 starts at 0x201 rewrote the whole i32
    with 5. An address is a value's first register; a later word is refused in one line naming
    the value and its first address — by the CLI (before any port is opened) and the API."""
    from idemlink.cli import main

    b = CommandBuilder(TYPED)
    with pytest.raises(LocalProtocolError, match=r"0x000D is word 2 of 2 of limit .*0x000C"):
        b.write_command({13: 5})
    with pytest.raises(LocalProtocolError, match="word 2 of 2 of energy"):
        b.read_command(2)
    assert b.write_command({12: 5}).address == 12
    path = tmp_path / "typed.toml"
    path.write_text(MAP)
    for argv in (["write", "13=5"], ["read", "13"], ["write", "0xD=5"]):
        code = main([*argv, "--regmap", str(path), "--modbus-tcp", "127.0.0.1:1"])
        err = capsys.readouterr().err
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "word 2 of 2 of limit" in err and "first register, 0x000C" in err


def test_a_field_and_its_own_register_in_one_write_are_assigned_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 (review): ``write fan=quiet 0x207=0`` sent two writes, both OK, the field's
    value lost. A register given whole and by its field in one write is refused like a name
    given twice: the CLI (one line, before any port), the API and a plan step."""
    from idemlink.cli import main

    b = CommandBuilder(TYPED)
    with pytest.raises(LocalProtocolError, match="control assigned twice: whole and by its "
                                                 "field on"):
        b.write_command({"on": 1, "control": 0})
    with pytest.raises(PlanError, match="control assigned twice"):
        parse_plan({"steps": [{"write": {"stage": "1", "control": 0}}]}, TYPED)
    path = tmp_path / "typed.toml"
    path.write_text(MAP)
    for argv in (["write", "on=1", "11=0"], ["write", "control=0", "stage=2"]):
        code = main([*argv, "--regmap", str(path), "--modbus-tcp", "127.0.0.1:1"])
        err = capsys.readouterr().err
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "control assigned twice" in err and "nothing was sent" in err


def test_reconcile_without_generation_reads_only_what_was_touched() -> None:
    from idemlink.host.command import read_back_of

    c = CommandBuilder(TYPED).write_command({"limit": 5})
    reads = read_back_of(c, None)
    assert isinstance(reads, list) and [(r.address, r.count) for r in reads] == [(12, 2)]
    rec = judge_read_back(c, (0, 5), None, lambda a: TYPED.at(a))  # type: ignore[arg-type,return-value]
    assert rec.observed == {"limit": 5} and rec.intended_state_holds
    mask = CommandBuilder(TYPED).write_command({"on": 1})
    assert [(r.address, r.count) for r in read_back_of(mask, None)] == [(11, 1)]  # type: ignore[union-attr]
    rec = judge_read_back(mask, (0x0031,), None, lambda a: TYPED.at(a))  # type: ignore[arg-type,return-value]
    assert rec.intended_state_holds and rec.summary == "the bits hold the intended values"


# ------------------------------------------------------------------------------ the core


def test_the_core_serves_typed_registers_coils_and_mask_writes() -> None:
    core = DeviceCore(TYPED)
    assert core.read(12, 2) == (1, 4464)  # u32 70000, big word first
    assert core.value("setpoint") == 0xFFFB
    assert core.value("stage") == 0 and core.value("pump") == 1
    bits = decode_response(core.execute(encode_request(ReadBits(StandardFunction.READ_COILS,
                                                                0, 2)), 1.0))
    assert bits.values[:2] == (0, 1)  # type: ignore[union-attr]
    core.execute(encode_request(WriteSingleCoil(0, 1)), 1.0)
    core.execute(encode_request(WriteMultipleCoils(0, (0, 0))), 1.0)
    assert (core.value("relay"), core.value("pump")) == (0, 0)
    answer = core.execute(encode_request(MaskWriteRegister(11, 0xFFCE, 0x0021)), 1.0)
    assert answer == encode_request(MaskWriteRegister(11, 0xFFCE, 0x0021))
    assert core.value("control") == 0x21 and core.value("stage") == 2
    # validated whole: half of a u32 (02), out of range as the type (03)
    assert core.execute(bytes.fromhex("06000d0001"), 1.0)[1] == ModbusException.ILLEGAL_DATA_ADDRESS
    over = encode_request(MaskWriteRegister(14, 0x0000, 201))
    assert core.execute(over, 1.0)[1] == ModbusException.ILLEGAL_DATA_VALUE
    assert core.execute(bytes.fromhex("06000aff9b"), 1.0)[1] == ModbusException.ILLEGAL_DATA_VALUE
    # no generation register: no conditional write (01), and the counter stays internal
    assert core.execute(bytes.fromhex("4100000000000102ffff"), 1.0)[1] == (
        ModbusException.ILLEGAL_FUNCTION)
    snap = core.snapshot()
    assert ConfigSnapshot.from_json(snap.to_json()) == snap and snap.coils == ((0, 0), (1, 0))


def test_a_map_without_coils_or_mask_write_answers_those_functions_01_as_before() -> None:
    core = DeviceCore(DEFAULT_MAP)
    for pdu in ("0100000001", "0200000001", "050000ff00", "0500001234",
                "0f0000000101" + "01", "160004ffff0000"):
        assert core.execute(bytes.fromhex(pdu), 1.0) == bytes([int(pdu[:2], 16) | 0x80, 1])
    assert ConfigSnapshot.from_json(core.snapshot().to_json()).coils == ()
    assert "coils" not in core.snapshot().to_json()


def test_the_map_decides_what_the_new_functions_may_retry() -> None:
    def pdu(req: object) -> bytes:
        return encode_request(req)  # type: ignore[arg-type]

    assert retry_allowed(pdu(ReadBits(StandardFunction.READ_DISCRETE_INPUTS, 0, 1)), TYPED)
    assert retry_allowed(pdu(WriteSingleCoil(1, 1)), TYPED)
    assert retry_allowed(pdu(WriteMultipleCoils(0, (1, 1))), TYPED)
    assert not retry_allowed(pdu(WriteMultipleCoils(0, (1, 1, 1))), TYPED)  # no coil 2
    assert retry_allowed(pdu(MaskWriteRegister(11, 0xFFFE, 1)), TYPED)
    assert not retry_allowed(pdu(MaskWriteRegister(0, 0xFFFE, 1)), TYPED)  # an input
    assert Command(CommandKind.MASK_WRITE, 11, 1, (1,), and_mask=0xFFFE).set_only


# ------------------------------------------------------------------------------ plans


def test_a_bare_number_means_the_unit_and_is_refused_where_it_meant_raw() -> None:
    plan = parse_plan({"steps": [{"write": {"setpoint": -5}}, {"write": {"limit": 90000}},
                                 {"write": {"on": 1, "stage": 2}}, {"write": {"pump": 1}}]},
                      TYPED)
    assert [dict(s.values) for s in plan.steps] == [
        {"setpoint": 0xFFFB}, {"limit": 90000}, {"on": 1, "stage": 2}, {"pump": 1}]
    with pytest.raises(PlanError, match=r'use "25" for 25 °C or "raw:65" for the raw value'):
        parse_plan({"steps": [{"write": {"offset_temp": 65}}]}, TYPED)
    # a number that was never a raw value (negative, a fraction): the hint gives the unit alone
    with pytest.raises(PlanError, match=r'offset_temp=-5: .* use the string "-5" for -5 °C$'):
        parse_plan({"steps": [{"write": {"offset_temp": -5}}]}, TYPED)
    with pytest.raises(PlanError, match=r'offset_temp=52.5: .* use the string "52.5" for 52.5 °C$'):
        parse_plan({"steps": [{"write": {"offset_temp": 52.5}}]}, TYPED)
    with pytest.raises(PlanError, match=r'threshold=400: a bare number is ambiguous .* use '
                                        r'"40.0" for 40.0 °C or "raw:400"'):
        parse_plan({"steps": [{"write": {"threshold": 400}}]}, DEFAULT_MAP)
    assert parse_plan({"steps": [{"write": {"threshold": "raw:400", "mode": 2}}]},
                      DEFAULT_MAP).steps[0].values == {"threshold": 400, "mode": 2}
    with pytest.raises(PlanError, match="no generation register"):
        parse_plan({"steps": [{"write_if_generation": {"setpoint": "1"}}]}, TYPED)


# ------------------------------------------------------------------------------ the C header


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_a_typed_map_renders_a_compiling_c_header(tmp_path: Path) -> None:
    from idemlink.protocol.contract import render_map

    out = tmp_path / "gen"
    out.mkdir()
    for name, text in render_map(TYPED).items():
        (out / name).write_text(text)
    header = (out / "idemlink_regmap.h").read_text()
    assert "#define IDL_REG_LIMIT_WORDS 2u" in header
    assert "#define IDL_REG_SETPOINT_MIN (-100)" in header
    assert "#define IDL_FIELD_STAGE_MASK 0x0030u" in header
    assert "#define IDL_COIL_PUMP 0x0001u" in header and "#define IDL_DISCRETE_DOOR" in header
    src = tmp_path / "use.c"
    src.write_text('#include "idemlink_regmap.h"\n'
                   "long low(void) { return IDL_REG_SETPOINT_MIN; }\n"
                   "unsigned rows(void) { return (unsigned)(sizeof IDL_REGMAP / sizeof "
                   "IDL_REGMAP[0]); }\n")
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion",
                        "-Werror", "-c", "-o", str(tmp_path / "use.o"), f"-I{out}", str(src)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert header.count("/* limit word") == 2 and "IDL_REG_COUNT 10u" in header
    assert RegisterKind.COIL.name not in header.split("IDL_REGMAP[IDL_REG_COUNT]")[1]


# ------------------------------------------------------------------------------ who serves it


def test_a_map_without_generation_is_served_only_as_a_plain_modbus_slave(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.cli import main

    path = tmp_path / "typed.toml"
    path.write_text(MAP, encoding="utf-8")
    assert main(["sim", "--regmap", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no generation register" in err and "--modbus-rtu" in err
    assert main(["soak", "--regmap", str(path), "--commands", "5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no generation register" in err
    with_gen = tmp_path / "typed-gen.toml"
    with_gen.write_text(MAP + '[[registers]]\naddress = 20\nname = "gen"\nkind = "generation"\n',
                        encoding="utf-8")
    assert main(["soak", "--regmap", str(with_gen), "--commands", "5"]) == 1
    assert "the soak's oracle models 16-bit registers only" in capsys.readouterr().err
