"""Modbus PDU codec and RTU framing: golden bytes from the Modbus spec, round trips, typed errors,
and a streaming decoder that resynchronises after garbage (cross-checked against pymodbus)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemlink.protocol.modbus import (
    MAX_CONDITIONAL_WRITE_COUNT,
    MAX_WRITE_COUNT,
    AddressOverflow,
    BadResponse,
    ByteCountMismatch,
    ExceptionResponse,
    FunctionCode,
    IllegalFunction,
    ModbusPduError,
    QuantityOutOfRange,
    ReadRegisters,
    ReadRegistersResponse,
    Request,
    Response,
    ShortPdu,
    TrailingBytes,
    TriggerRequest,
    TriggerResponse,
    WriteIfGeneration,
    WriteIfGenerationResponse,
    WriteMultipleRegisters,
    WriteMultipleRegistersResponse,
    WriteSingleRegister,
    WriteSingleRegisterResponse,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from idemlink.protocol.modbus_rtu import (
    RtuDecoder,
    RtuFrame,
    RtuFrameError,
    crc16,
    decode_rtu,
    encode_rtu,
    response_frame_length,
)
from idemlink.protocol.outcome import ModbusException, Status

# One table, both directions (request object <-> PDU bytes). Hex written by hand from the
# Modbus Application Protocol v1.1b3 examples and our 0x41/0x42 layout in the module docstring.
REQUESTS: list[tuple[str, Request, str]] = [
    ("fc03 spec example", ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, 0x006B, 3),
     "03006b0003"),
    ("fc04 spec example", ReadRegisters(FunctionCode.READ_INPUT_REGISTERS, 0x0008, 1),
     "0400080001"),
    ("fc06 spec example", WriteSingleRegister(0x0001, 0x0003), "0600010003"),
    ("fc16 spec example", WriteMultipleRegisters(0x0001, (0x000A, 0x0102)),
     "100001000204000a0102"),
    ("0x41 conditional", WriteIfGeneration(7, 0x0004, (300, 2)), "4100070004000204012c0002"),
    ("0x42 trigger", TriggerRequest(8, 1), "4200080001"),
]

RESPONSES: list[tuple[str, Response, str]] = [
    ("fc03 spec example", ReadRegistersResponse(FunctionCode.READ_HOLDING_REGISTERS,
                                                (0x022B, 0x0000, 0x0064)), "0306022b00000064"),
    ("fc06 echo", WriteSingleRegisterResponse(1, 3), "0600010003"),
    ("fc16 spec example", WriteMultipleRegistersResponse(1, 2), "1000010002"),
    ("0x41 ok", WriteIfGenerationResponse(Status.OK, 8), "41000008"),
    ("0x41 guard failed", WriteIfGenerationResponse(Status.GUARD_FAILED, 9), "41120009"),
    ("0x42 running", TriggerResponse(8, 0x0101), "4200080101"),
    ("exception 02", ExceptionResponse(3, ModbusException.ILLEGAL_DATA_ADDRESS), "8302"),
]


@pytest.mark.parametrize(("name", "req", "hexpdu"), REQUESTS, ids=[r[0] for r in REQUESTS])
def test_request_table_both_directions(name: str, req: Request, hexpdu: str) -> None:
    assert encode_request(req) == bytes.fromhex(hexpdu)
    assert decode_request(bytes.fromhex(hexpdu)) == req


@pytest.mark.parametrize(("name", "resp", "hexpdu"), RESPONSES, ids=[r[0] for r in RESPONSES])
def test_response_table_both_directions(name: str, resp: Response, hexpdu: str) -> None:
    assert encode_response(resp) == bytes.fromhex(hexpdu)
    assert decode_response(bytes.fromhex(hexpdu)) == resp


u16 = st.integers(0, 0xFFFF)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["read", "w6", "w16", "w41", "trig"]))
    if kind == "read":
        count = draw(st.integers(1, 125))
        return ReadRegisters(draw(st.sampled_from(list(FunctionCode)[:2])),
                             draw(st.integers(0, 0x10000 - count)), count)
    if kind == "w6":
        return WriteSingleRegister(draw(u16), draw(u16))
    if kind == "trig":
        return TriggerRequest(draw(u16), draw(u16))
    limit = MAX_WRITE_COUNT if kind == "w16" else MAX_CONDITIONAL_WRITE_COUNT
    values = tuple(draw(st.lists(u16, min_size=1, max_size=limit)))
    address = draw(st.integers(0, 0x10000 - len(values)))
    if kind == "w16":
        return WriteMultipleRegisters(address, values)
    return WriteIfGeneration(draw(u16), address, values)


@settings(deadline=None)  # a loaded CI box must not turn into a flake
@given(requests())
def test_request_round_trip_and_pdu_limit(req: Request) -> None:
    pdu = encode_request(req)
    assert len(pdu) <= 253
    assert decode_request(pdu) == req


@settings(deadline=None)
@given(requests(), st.binary(min_size=1, max_size=4))
def test_trailing_bytes_are_refused(req: Request, extra: bytes) -> None:
    with pytest.raises(ModbusPduError) as info:
        decode_request(encode_request(req) + extra)
    assert info.value.exception is ModbusException.ILLEGAL_DATA_VALUE


@settings(deadline=None)
@given(requests(), st.data())
def test_every_truncation_is_a_short_pdu_or_count_error(req: Request, data: st.DataObject) -> None:
    pdu = encode_request(req)
    cut = data.draw(st.integers(0, len(pdu) - 1))
    with pytest.raises((ShortPdu, ByteCountMismatch)):
        decode_request(pdu[:cut])


BAD_REQUESTS: list[tuple[str, str, type[ModbusPduError], ModbusException]] = [
    ("empty", "", ShortPdu, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc03 short", "030000", ShortPdu, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc03 count 0", "0300000000", QuantityOutOfRange, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc03 count 126", "030000007e", QuantityOutOfRange, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc04 count 0xFFFF", "040000ffff", QuantityOutOfRange, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc03 past 0xFFFF", "03fffe0003", AddressOverflow, ModbusException.ILLEGAL_DATA_ADDRESS),
    ("fc03 two from 0xFFFF", "03ffff0002", AddressOverflow,
     ModbusException.ILLEGAL_DATA_ADDRESS),
    ("fc16 count 0", "10000000000000", QuantityOutOfRange, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc16 count 124", "100000007cf8" + "00" * 248, QuantityOutOfRange,
     ModbusException.ILLEGAL_DATA_VALUE),
    ("fc16 byte count 3 for 1", "1000000001030001", ByteCountMismatch,
     ModbusException.ILLEGAL_DATA_VALUE),
    ("fc16 byte count says 4, 2 sent", "1000000002040001", ShortPdu,
     ModbusException.ILLEGAL_DATA_VALUE),
    ("fc16 past 0xFFFF", "10ffff00020400010002", AddressOverflow,
     ModbusException.ILLEGAL_DATA_ADDRESS),
    ("fc06 short", "06000100", ShortPdu, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc06 long", "060001000300", TrailingBytes, ModbusException.ILLEGAL_DATA_VALUE),
    ("0x41 count 123", "410000" + "0000007bf6" + "00" * 246, QuantityOutOfRange,
     ModbusException.ILLEGAL_DATA_VALUE),
    ("fc07 unsupported", "07", IllegalFunction, ModbusException.ILLEGAL_FUNCTION),
    ("fc01 count 2001", "01000007d1", QuantityOutOfRange, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc05 value 0x1234", "0500001234", QuantityOutOfRange, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc0F byte count 2 for 8", "0f00000008020100", ByteCountMismatch,
     ModbusException.ILLEGAL_DATA_VALUE),
    ("fc16 short", "16000000ff", ShortPdu, ModbusException.ILLEGAL_DATA_VALUE),
    ("fc2B unsupported", "2b0e0100", IllegalFunction, ModbusException.ILLEGAL_FUNCTION),
]


@pytest.mark.parametrize(("name", "hexpdu", "error", "code"), BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_raise_typed_errors(name: str, hexpdu: str, error: type[ModbusPduError],
                                         code: ModbusException) -> None:
    with pytest.raises(error) as info:
        decode_request(bytes.fromhex(hexpdu))
    assert info.value.exception is code


def test_last_register_alone_is_addressable() -> None:
    assert decode_request(bytes.fromhex("03ffff0001")) == ReadRegisters(
        FunctionCode.READ_HOLDING_REGISTERS, 0xFFFF, 1)


@pytest.mark.parametrize("hexpdu", ["", "03", "0303000100", "8307", "06000100", "4101"])
def test_bad_responses_raise(hexpdu: str) -> None:
    with pytest.raises(BadResponse):
        decode_response(bytes.fromhex(hexpdu))


# ------------------------------------------------------------------------------------------ RTU

def test_crc_matches_known_frames_and_pymodbus() -> None:
    # A classic frame from the Modbus over serial line guide: read 10 holding regs of unit 1.
    assert encode_rtu(1, bytes.fromhex("030000000a")) == bytes.fromhex("01030000000ac5cd")
    from pymodbus.framer import FramerRTU

    for body in (b"\x01\x03\x00\x00\x00\x0a", b"\x11\x06\x00\x01\x00\x03", bytes(range(200))):
        theirs = FramerRTU.compute_CRC(body)
        assert crc16(body).to_bytes(2, "little") == theirs.to_bytes(2, "big")


def test_decode_rtu_checks_crc() -> None:
    frame = encode_rtu(17, bytes.fromhex("0600010003"))
    assert decode_rtu(frame) == RtuFrame(17, bytes.fromhex("0600010003"))
    with pytest.raises(RtuFrameError):
        decode_rtu(frame[:-1] + bytes([frame[-1] ^ 1]))
    with pytest.raises(RtuFrameError):
        decode_rtu(frame[:3])


def _drain(dec: RtuDecoder) -> list[RtuFrame]:
    out = []
    while (f := dec.next_event()) is not None:
        out.append(f)
    return out


@settings(deadline=None)
@given(st.lists(requests(), min_size=1, max_size=5), st.integers(1, 247), st.data())
def test_decoder_whole_bytewise_and_split(reqs: list[Request], unit: int,
                                          data: st.DataObject) -> None:
    frames = [RtuFrame(unit, encode_request(r)) for r in reqs]
    wire = b"".join(encode_rtu(f.unit, f.pdu) for f in frames)
    whole = RtuDecoder()
    whole.receive_data(wire)
    assert _drain(whole) == frames
    bytewise = RtuDecoder()
    got: list[RtuFrame] = []
    for b in wire:
        bytewise.receive_data(bytes([b]))
        got += _drain(bytewise)
    assert got == frames and bytewise.discarded == 0
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=4)))
    split = RtuDecoder()
    got = []
    prev = 0
    for c in [*cuts, len(wire)]:
        split.receive_data(wire[prev:c])
        got += _drain(split)
        prev = c
    assert got == frames


@settings(deadline=None)
@given(st.binary(max_size=40), requests(), st.integers(1, 247))
def test_decoder_resyncs_after_garbage(garbage: bytes, req: Request, unit: int) -> None:
    """Garbage, then silence, then a good frame: the good frame always comes out, intact."""
    good = RtuFrame(unit, encode_request(req))
    dec = RtuDecoder()
    dec.receive_data(garbage)
    junk = _drain(dec)
    dec.gap()
    junk += _drain(dec)
    assert dec.pending == 0
    dec.receive_data(encode_rtu(good.unit, good.pdu))
    assert _drain(dec) == [good]
    # Any frame the garbage produced must itself be CRC-valid bytes of the garbage.
    for f in junk:
        assert encode_rtu(f.unit, f.pdu) in garbage


def test_decoder_resyncs_at_the_next_pause_after_a_bad_crc() -> None:
    """Modbus over serial line V1.02 2.5.1.1: a frame with a bad CRC is dropped up to the next
    t3.5 silence, so a good frame in the same burst is dropped too; after a pause it is taken."""
    good = encode_rtu(1, bytes.fromhex("0300000004"))
    bad = bytearray(good)
    bad[4] ^= 0xFF
    dec = RtuDecoder()
    dec.receive_data(bytes(bad) + good, 1.0)
    assert _drain(dec) == []
    assert dec.discarded == len(bad) + len(good)
    dec.receive_data(bytes(bad), 2.0)
    dec.receive_data(good, 2.01)
    assert _drain(dec) == [RtuFrame(1, bytes.fromhex("0300000004"))]


def test_decoder_garbage_announcing_a_long_frame() -> None:
    """``01 10 .. bc=0xF6`` promises 255 bytes. A real frame after a pause ends the promise at
    once; in the same burst both are one damaged frame, dropped at silence."""
    good = encode_rtu(1, bytes.fromhex("0600040064"))
    dec = RtuDecoder()
    dec.receive_data(bytes.fromhex("011000000001f6"), 1.0)
    assert _drain(dec) == []  # still waiting for the promised 255 bytes
    dec.receive_data(good, 1.01)
    assert _drain(dec) == [RtuFrame(1, bytes.fromhex("0600040064"))]
    dec.receive_data(bytes.fromhex("011000000001f6") + good, 2.0)
    assert _drain(dec) == []
    dec.gap()
    assert _drain(dec) == [] and dec.pending == 0


def test_unknown_function_is_framed_only_at_silence() -> None:
    frame = encode_rtu(1, bytes.fromhex("2b0e0100"))
    dec = RtuDecoder()
    dec.receive_data(frame)
    assert _drain(dec) == []
    dec.gap()
    assert _drain(dec) == [RtuFrame(1, bytes.fromhex("2b0e0100"))]


def test_response_lengths() -> None:
    assert response_frame_length(encode_rtu(1, bytes.fromhex("8302"))) == 5
    assert response_frame_length(encode_rtu(1, bytes.fromhex("0304000a000b"))) == 9
    assert response_frame_length(encode_rtu(1, bytes.fromhex("41000008"))) == 7


def test_host_side_decoder_frames_answers_read_in_chunks() -> None:
    """With ``length_of=response_frame_length`` (a master reading answers) the head checks are
    the answer's. Chunks read as they arrive (stamped at their last byte: no line pause) are
    one frame; a real pause (t3.5 = 1.75 ms at 115200 Bd) ends an answer still incomplete."""
    fc16 = encode_rtu(1, bytes.fromhex("1000000005"))
    fc03 = encode_rtu(1, bytes([3, 250]) + bytes(range(250)))
    char = 11 / 115200
    dec = RtuDecoder(length_of=response_frame_length, baudrate=115200)
    t, got = 0.0, []
    for frame in (fc16, fc03):
        t += 0.01  # a pause between the answers
        for i in range(0, len(frame), 3):
            chunk = frame[i:i + 3]
            t += len(chunk) * char
            dec.receive_data(chunk, t + 0.0002)  # read latency below t3.5
            got += _drain(dec)
    assert got == [RtuFrame(1, fc16[1:-2]), RtuFrame(1, fc03[1:-2])]
    dec.receive_data(fc16[:4], t + 0.01)  # an answer that stops half way
    assert _drain(dec) == []
    dec.receive_data(fc16, t + 0.012 + 8 * char)  # 2 ms of silence, then a whole answer
    assert _drain(dec) == [RtuFrame(1, fc16[1:-2])] and dec.discarded == 4


# ------------------------------------------------------------------ 0x45 FILE_INFO (framed only)


def test_file_info_never_reaches_the_register_core() -> None:
    """decode_request answers 01 for 0x45 (as for 0x44): only the framed device handles it, so
    the register core and the RTU face never see a request they cannot dispatch."""
    with pytest.raises(IllegalFunction):
        decode_request(b"\x45\x01a")


@pytest.mark.parametrize("pdu", [b"\x45\x00", b"\x45" + bytes(8), b"\x45" + bytes(10),
                                 b"\x45\x02" + bytes(8)])
def test_file_info_answer_of_a_wrong_length_or_status_is_refused(pdu: bytes) -> None:
    with pytest.raises(BadResponse):
        decode_response(pdu)


@given(st.binary(min_size=0, max_size=12))
def test_answer_fits_a_file_info_only_with_its_exact_shape(pdu: bytes) -> None:
    from idemlink.protocol.modbus import answer_fits

    fits = answer_fits(b"\x45\x01a", pdu)
    shaped = len(pdu) == 10 and pdu[0] == 0x45 and pdu[1] in (0, 1)
    assert fits == (shaped or (len(pdu) == 2 and pdu[0] == 0xC5))


def test_frame_view_describes_file_info() -> None:
    from idemlink.host.frame_view import FrameDescriber

    d = FrameDescriber()
    assert "file info 'fw.bin'" in d._request(1, 1, b"\x45\x06fw.bin")
    answer = bytes.fromhex("00 45 00 00000009 e3069283")  # status OK + the PDU
    assert "9 bytes crc32c=e3069283" in d._response(1, 1, answer)


def test_read_values_decode_as_decode_response_does() -> None:
    """``decode_read_values`` (the host's per-result path) reads exactly what ``decode_response``
    reads, and refuses exactly what it refuses."""
    from idemlink.protocol.modbus import decode_read_values

    good = [bytes([3, 4, 0, 1, 0, 2]), bytes([4, 0]), bytes([4, 2, 0xFF, 0xFE])]
    for pdu in good:
        resp = decode_response(pdu)
        assert isinstance(resp, ReadRegistersResponse)
        assert decode_read_values(pdu) == resp.values
    for bad in (b"", b"\x03", bytes([3, 3, 0, 1, 0]), bytes([3, 4, 0, 1]), bytes([6, 0, 1, 0, 2]),
                bytes([0x83, 2])):
        with pytest.raises(BadResponse):
            decode_read_values(bad)
