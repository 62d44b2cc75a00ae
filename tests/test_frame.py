"""The frame layer: round trips, golden vectors, resynchronisation bounds, hostile input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemlink.protocol import cobs
from idemlink.protocol.frame import (
    FRAME,
    MAX_ENCODED,
    MAX_PAYLOAD,
    DecodeError,
    DecodeErrorKind,
    Flags,
    Frame,
    FrameDecoder,
    FrameType,
    build_raw,
    crc32c,
    decode_frames,
    encode_frame,
    parse_raw,
)


def take(dec: FrameDecoder, data: bytes) -> list[Frame | DecodeError]:
    """Hand ``data`` to ``dec`` and take every event it completes."""
    dec.receive_data(data)
    return list(iter(dec.next_event, None))


#: The first contract's golden frames (the addressed and authenticated ones: test_frame_auth.py).
VECTORS = [v for v in json.loads((Path(__file__).parent / "vectors" / "frames.json").read_text())
           ["frames"] if "address" not in v]

frame_types = st.sampled_from(list(FrameType))
known_flags = st.sampled_from([0, int(Flags.RETRANSMIT), int(Flags.REPLAY), 3])
u32 = st.integers(0, 2**32 - 1)
payloads = st.binary(max_size=MAX_PAYLOAD)


def frames_only(events: list[Frame | DecodeError]) -> list[Frame]:
    return [e for e in events if isinstance(e, Frame)]


def test_crc_is_crc32c_check_value() -> None:
    # The published check value of CRC-32C (iSCSI), not something our code computed.
    assert crc32c(b"123456789") == 0xE3069283


@given(st.binary(max_size=2000))
def test_cobs_round_trip_and_no_zero(data: bytes) -> None:
    enc = cobs.encode(data)
    assert 0 not in enc
    assert len(enc) <= cobs.max_encoded_len(len(data))
    assert cobs.decode(enc) == data


def test_cobs_known_vectors() -> None:
    # Vectors from the COBS paper / Wikipedia table.
    assert cobs.encode(b"\x00") == b"\x01\x01"
    assert cobs.encode(b"\x00\x00") == b"\x01\x01\x01"
    assert cobs.encode(b"\x11\x22\x00\x33") == b"\x03\x11\x22\x02\x33"
    assert cobs.encode(b"\x11\x00\x00\x00") == b"\x02\x11\x01\x01\x01"
    assert cobs.encode(bytes(range(1, 255))) == b"\xff" + bytes(range(1, 255)) + b"\x01"


@given(st.binary(max_size=600))
def test_cobs_decode_never_raises(data: bytes) -> None:
    cobs.decode(data)


@given(frame_types, known_flags, u32, u32, payloads)
def test_round_trip_every_type(ft: FrameType, flags: int, epoch: int, seq: int, p: bytes) -> None:
    wire = encode_frame(ft, seq, epoch, p, flags)
    assert wire[0] == 0 and wire[-1] == 0 and 0 not in wire[1:-1]
    assert len(wire) <= MAX_ENCODED + 2
    events = decode_frames(wire)
    assert events == [Frame(ft, Flags(flags), epoch, seq, p)]


@given(frame_types, known_flags, u32, u32, payloads)
def test_fast_path_agrees_with_construct_declaration(
    ft: FrameType, flags: int, epoch: int, seq: int, p: bytes
) -> None:
    raw = build_raw(ft, seq, epoch, p, flags)
    assert b"\x00" + cobs.encode(raw) + b"\x00" == encode_frame(ft, seq, epoch, p, flags)
    parsed = FRAME.parse(raw)
    fast = parse_raw(raw)
    assert isinstance(fast, Frame)
    h = parsed.body.value.header
    assert (h.type, h.flags, h.epoch, h.seq, bytes(parsed.body.value.payload)) == (
        fast.type, fast.flags, fast.epoch, fast.seq, fast.payload)


def _vector_frame(v: dict[str, object]) -> Frame:
    return Frame(FrameType[str(v["type"])], Flags(int(str(v["flags"]))), int(str(v["epoch"])),
                 int(str(v["seq"])), bytes.fromhex(str(v["payload"])))


@pytest.mark.parametrize("vec", VECTORS, ids=[v["name"] for v in VECTORS])
@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
def test_golden_vectors(vec: dict[str, object], mode: str) -> None:
    wire = bytes.fromhex(str(vec["wire"]))
    dec = FrameDecoder()
    if mode == "whole":
        events = take(dec, wire)
    elif mode == "bytewise":
        events = [e for i in range(len(wire)) for e in take(dec, wire[i : i + 1])]
    else:
        events = take(dec, wire + b"\x07\x01garbage-without-delimiter")
    assert events == [_vector_frame(vec)]
    # The bytes are also what the construct declaration builds (the source of truth).
    f = _vector_frame(vec)
    assert cobs.decode(wire[1:-1]) == build_raw(f.type, f.seq, f.epoch, f.payload, f.flags)


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8), st.data())
def test_any_chunking_gives_same_frames(payloads_: list[bytes], data: st.DataObject) -> None:
    wire = b"".join(encode_frame(FrameType.REQUEST, i, 9, p) for i, p in enumerate(payloads_))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    dec = FrameDecoder()
    events: list[Frame | DecodeError] = []
    prev = 0
    for c in [*cuts, len(wire)]:
        events += take(dec, wire[prev:c])
        prev = c
    assert [f.payload for f in frames_only(events)] == payloads_


@given(st.binary(max_size=3000), st.data())
@settings(max_examples=300)
def test_random_bytes_never_raise_and_stay_bounded(junk: bytes, data: st.DataObject) -> None:
    dec = FrameDecoder()
    step = data.draw(st.integers(1, 700))
    for i in range(0, len(junk), step):
        take(dec, junk[i : i + step])
        assert dec.buffered <= MAX_ENCODED


@given(st.binary(max_size=600), st.binary(min_size=1, max_size=64))
def test_garbage_before_a_frame_costs_only_itself(junk: bytes, p: bytes) -> None:
    good = encode_frame(FrameType.REQUEST, 1, 2, p)
    events = decode_frames(junk + good + good)
    assert len(frames_only(events)) == 2  # garbage (with or without zeros) never eats a good frame


@given(st.lists(st.binary(min_size=1, max_size=80), min_size=3, max_size=6), st.data())
@settings(max_examples=300)
def test_bit_flips_lose_at_most_the_damaged_frame(ps: list[bytes], data: st.DataObject) -> None:
    wires = [encode_frame(FrameType.RESPONSE, i, 5, p) for i, p in enumerate(ps)]
    victim = data.draw(st.integers(0, len(wires) - 1))
    w = bytearray(wires[victim])
    nflips = data.draw(st.integers(1, 5))
    for _ in range(nflips):
        pos = data.draw(st.integers(0, len(w) - 1))
        w[pos] ^= 1 << data.draw(st.integers(0, 7))
    wires[victim] = bytes(w)
    got = frames_only(decode_frames(b"".join(wires)))
    expected_others = [i for i in range(len(ps)) if i != victim]
    # Every undamaged frame survives; the damaged one never comes out altered
    # (CRC-32C has Hamming distance 6 at this size, so <= 5 flips are always detected).
    assert [f.seq for f in got if f.seq != victim] == expected_others
    for f in got:
        assert f.payload == ps[f.seq]


def _raw_with(version: int = 1, ftype: int = 3, flags: int = 0, payload: bytes = b"x") -> bytes:
    import struct

    raw = struct.pack("<BBBIIH", version, ftype, flags, 1, 1, len(payload)) + payload
    return raw + struct.pack("<I", crc32c(raw))


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (_raw_with(version=2), DecodeErrorKind.UNKNOWN_VERSION),
        (_raw_with(ftype=99), DecodeErrorKind.UNKNOWN_TYPE),
        (_raw_with(flags=0x10), DecodeErrorKind.UNKNOWN_FLAGS),
        (_raw_with(flags=0x08), DecodeErrorKind.UNKNOWN_FLAGS),
        (b"\x01\x03", DecodeErrorKind.MALFORMED),
    ],
    ids=["newer-version", "unknown-type", "unknown-flag", "unknown-flag-0x08", "short"],
)
def test_compatibility_rule_refuses_with_typed_error(raw: bytes, kind: DecodeErrorKind) -> None:
    dec = FrameDecoder()
    good = encode_frame(FrameType.REQUEST, 3, 3, b"ok")
    events = take(dec, b"\x00" + cobs.encode(raw) + b"\x00" + good)
    assert isinstance(events[0], DecodeError) and events[0].kind is kind
    assert dec.counters[kind.name] == 1
    assert frames_only(events) == [Frame(FrameType.REQUEST, Flags(0), 3, 3, b"ok")]


def test_lying_length_field_is_refused_after_crc() -> None:
    import struct

    raw = bytearray(_raw_with(payload=b"abcd"))
    struct.pack_into("<H", raw, 11, 400)  # lie about the length...
    raw[-4:] = struct.pack("<I", crc32c(bytes(raw[:-4])))  # ...with a valid CRC
    events = decode_frames(b"\x00" + cobs.encode(bytes(raw)) + b"\x00")
    assert isinstance(events[0], DecodeError) and events[0].kind is DecodeErrorKind.MALFORMED


def test_oversize_is_refused_then_resyncs() -> None:
    dec = FrameDecoder()
    events = take(dec, b"\x05" * (MAX_ENCODED * 3))
    assert [e.kind for e in events if isinstance(e, DecodeError)] == [DecodeErrorKind.OVERSIZE]
    assert dec.buffered <= MAX_ENCODED
    good = encode_frame(FrameType.REQUEST, 1, 1, b"after")
    assert frames_only(take(dec, good)) == [Frame(FrameType.REQUEST, Flags(0), 1, 1, b"after")]


def test_payload_over_limit_is_a_local_error() -> None:
    with pytest.raises(ValueError, match="MAX_PAYLOAD"):
        encode_frame(FrameType.REQUEST, 1, 1, bytes(MAX_PAYLOAD + 1))


@given(st.binary(max_size=1200).map(lambda b: b.replace(b"\x00", b"")))
def test_decode_segment_agrees_with_decode_on_zero_free_input(seg: bytes) -> None:
    assert cobs.decode_segment(seg) == cobs.decode(seg)


@given(st.binary(max_size=600))
def test_residue_check_equals_trailer_comparison(body: bytes) -> None:
    import struct

    from idemlink.protocol.frame import CRC_RESIDUE

    good = body + struct.pack("<I", crc32c(body))
    assert crc32c(good) == CRC_RESIDUE
    bad = body + struct.pack("<I", crc32c(body) ^ 1)
    assert crc32c(bad) != CRC_RESIDUE
