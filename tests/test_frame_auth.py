"""Addressed and authenticated frames (one contract revision for issues 22 and 23): golden
vectors shared with C, round trips, the first contract's frames unchanged, and the attacks the
layout alone must already stop (reflection, truncated tags, flipped bits under a fresh CRC)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idemlink.oracle_wire import FIRST_CONTRACT_FLAGS, read_frame
from idemlink.protocol import cobs
from idemlink.protocol.contract import TEST_MAC_KEY, contract_hash
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import (
    AUTH_TAG_LEN,
    AUTH_TAG_LONG_LEN,
    BROADCAST_ADDRESS,
    FRAME,
    KEY_LEN,
    MAX_ADDRESS,
    MAX_ENCODED,
    MAX_PAYLOAD,
    NONCE_LEN,
    DecodeError,
    DecodeErrorKind,
    Direction,
    Flags,
    Frame,
    FrameDecoder,
    FrameEncodeError,
    FrameType,
    MacCheck,
    MacKey,
    build_raw,
    crc32c,
    decode_frames,
    derive_session_key,
    encode_frame,
    frame_mac,
    parse_raw,
    raw_frame,
)
from idemlink.protocol.outcome import IdemlinkError, Outcome, Status, status_info

ALL = json.loads((Path(__file__).parent / "vectors" / "frames.json").read_text())
EXTENDED = [v for v in ALL["frames"] if "address" in v]
FIRST = [v for v in ALL["frames"] if "address" not in v]
H2D, D2H = Direction.HOST_TO_DEVICE, Direction.DEVICE_TO_HOST

frame_types = st.sampled_from(list(FrameType))
plain_flags = st.sampled_from([0, int(Flags.RETRANSMIT), int(Flags.REPLAY), 3])
u32 = st.integers(0, 2**32 - 1)
addresses = st.one_of(st.none(), st.just(BROADCAST_ADDRESS), st.integers(1, MAX_ADDRESS))
keys = st.one_of(st.none(), st.builds(MacKey, st.binary(min_size=KEY_LEN, max_size=KEY_LEN),
                                      st.sampled_from([AUTH_TAG_LEN, AUTH_TAG_LONG_LEN])))
directions = st.sampled_from(list(Direction))


def wire_of(raw: bytes) -> bytes:
    return b"\x00" + cobs.encode(raw) + b"\x00"


def resealed(raw: bytes | bytearray) -> bytes:
    """``raw`` (its CRC trailer included) with the CRC recomputed: what an attacker sends."""
    body = bytes(raw[:-4])
    return body + struct.pack("<I", crc32c(body))


def vec_check(v: dict[str, object]) -> MacCheck | None:
    if "key" not in v:
        return None
    return MacCheck(MacKey(bytes.fromhex(str(v["key"])), int(str(v["tag_len"]))),
                    Direction[str(v["direction"])])


def test_there_are_addressed_broadcast_and_authenticated_vectors() -> None:
    names = {v["name"] for v in EXTENDED}
    assert {"addressed_request", "broadcast_write", "mac8_request", "mac16_request_retransmit",
            "addressed_mac8_request", "broadcast_mac8_write"} <= names
    assert len(FIRST) == 7  # the first contract's frames, kept byte for byte


@pytest.mark.parametrize("vec", EXTENDED, ids=[v["name"] for v in EXTENDED])
@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_extended_golden_vectors(vec: dict[str, object], mode: str) -> None:
    wire = bytes.fromhex(str(vec["wire"]))
    check = vec_check(vec)
    dec = FrameDecoder(check)
    if mode == "whole":
        dec.receive_data(wire)
        events = list(iter(dec.next_event, None))
    else:
        events = []
        for i in range(len(wire)):
            dec.receive_data(wire[i : i + 1])
            events += list(iter(dec.next_event, None))
    assert len(events) == 1
    f = events[0]
    assert isinstance(f, Frame)
    assert (f.type.name, f.epoch, f.seq, f.payload.hex(), f.address) == (
        vec["type"], vec["epoch"], vec["seq"], vec["payload"], vec["address"])
    assert int(f.flags) & 0x03 == vec["flags"]
    assert f.verified is (check is not None)
    assert (f.tag is None) is (check is None)
    if check is not None:
        assert f.tag is not None and len(f.tag) == vec["tag_len"] and f.tag.hex() == vec["tag"]
    # the construct declaration (the source of truth) builds the same bytes
    assert cobs.decode(wire[1:-1]) == build_raw(f.type, f.seq, f.epoch, f.payload, int(f.flags),
                                                auth_tag=f.tag, address=f.address)
    # and re-encoding re-signs to the same tag
    assert f.encode(check.key if check else None, check.direction if check else None) == wire


@pytest.mark.parametrize("vec", FIRST, ids=[v["name"] for v in FIRST])
def test_first_contract_frames_decode_as_before_even_in_a_verifying_decoder(
        vec: dict[str, object]) -> None:
    wire = bytes.fromhex(str(vec["wire"]))
    plain = decode_frames(wire)
    keyed = decode_frames(wire, MacCheck(MacKey(TEST_MAC_KEY), H2D))
    assert plain == keyed
    f = plain[0]
    assert isinstance(f, Frame) and f.address is None and f.tag is None and not f.verified
    assert len(wire) <= MAX_ENCODED + 2


@given(frame_types, plain_flags, u32, u32, st.binary(max_size=MAX_PAYLOAD))
def test_first_contract_frames_are_unchanged(ft: FrameType, flags: int, epoch: int, seq: int,
                                             p: bytes) -> None:
    """Without address and key the codec writes exactly the first contract's 13-byte header
    frame (the independent first-contract reader of the oracle accepts it) and reads it back."""
    wire = encode_frame(ft, seq, epoch, p, flags)
    raw = cobs.decode(wire[1:-1])
    assert raw[:13] == struct.pack("<BBBIIH", 1, int(ft), flags, epoch, seq, len(p))
    assert len(raw) == 13 + len(p) + 4
    old = read_frame(wire[1:-1])
    assert old is not None and (old.type, old.flags, old.payload) == (int(ft), flags, p)
    assert decode_frames(wire) == [Frame(ft, Flags(flags), epoch, seq, p)]


@given(frame_types, plain_flags, u32, u32, st.binary(max_size=MAX_PAYLOAD), addresses, keys,
       directions)
def test_round_trip_and_declaration_agree(ft: FrameType, flags: int, epoch: int, seq: int,
                                          p: bytes, address: int | None, key: MacKey | None,
                                          direction: Direction) -> None:
    raw = raw_frame(ft, seq, epoch, p, flags, address=address, key=key, direction=direction)
    wire = encode_frame(ft, seq, epoch, p, flags, address=address, key=key, direction=direction)
    assert wire == wire_of(raw) and len(wire) <= MAX_ENCODED + 2
    check = MacCheck(key, direction) if key is not None else None
    (f,) = decode_frames(wire, check)
    assert isinstance(f, Frame)
    assert (f.type, f.epoch, f.seq, f.payload, f.address) == (ft, epoch, seq, p, address)
    assert int(f.flags) & 0x03 == flags
    assert f.verified is (key is not None)
    parsed = FRAME.parse(raw).body.value
    assert parsed.address == address and bytes(parsed.payload) == p
    assert (parsed.auth_tag is None) is (key is None)
    if key is not None:
        assert bytes(parsed.auth_tag) == f.tag
        assert f.tag == frame_mac(key.key, direction, raw[: len(raw) - 4 - key.tag_len],
                                  key.tag_len)
    assert build_raw(ft, seq, epoch, p, int(f.flags), auth_tag=f.tag, address=address) == raw


@given(st.binary(min_size=KEY_LEN, max_size=KEY_LEN), st.binary(max_size=64), addresses,
       st.sampled_from([AUTH_TAG_LEN, AUTH_TAG_LONG_LEN]), st.data())
def test_a_changed_byte_under_a_fresh_crc_fails_the_mac(k: bytes, p: bytes, address: int | None,
                                                        tag_len: int, data: st.DataObject) -> None:
    """The CRC catches noise; an attacker recomputes it. Any change of any byte the MAC covers,
    or of the tag, with the CRC made valid again, is BAD_MAC (or a layout refusal), never a
    frame."""
    key = MacKey(k, tag_len)
    raw = bytearray(raw_frame(FrameType.REQUEST, 5, 9, p, address=address, key=key,
                              direction=H2D))
    pos = data.draw(st.integers(0, len(raw) - 5))
    raw[pos] ^= data.draw(st.integers(1, 255))
    (ev,) = decode_frames(wire_of(resealed(raw)), MacCheck(key, H2D))
    assert isinstance(ev, DecodeError)


def test_a_reflected_frame_fails_by_direction() -> None:
    key = MacKey(TEST_MAC_KEY)
    answer = encode_frame(FrameType.RESPONSE, 1, 2, b"\x00", key=key, direction=D2H)
    assert isinstance(decode_frames(answer, MacCheck(key, D2H))[0], Frame)
    # the same bytes sent back to the device: its decoder checks HOST_TO_DEVICE
    (ev,) = decode_frames(answer, MacCheck(key, H2D))
    assert isinstance(ev, DecodeError) and ev.kind is DecodeErrorKind.BAD_MAC
    # and so does a REQUEST signed for the other direction
    req = encode_frame(FrameType.REQUEST, 1, 2, b"\x03", key=key, direction=D2H)
    (ev,) = decode_frames(req, MacCheck(key, H2D))
    assert isinstance(ev, DecodeError) and ev.kind is DecodeErrorKind.BAD_MAC


def test_a_truncated_tag_never_verifies() -> None:
    """16-byte tag cut to 8, AUTH_LONG cleared, CRC recomputed: the session uses 16 bytes, so the
    shorter tag is refused by length before any comparison; the cut tag is no valid 8-byte tag
    for a session that uses 8 either."""
    long_key = MacKey(TEST_MAC_KEY, AUTH_TAG_LONG_LEN)
    raw = bytearray(raw_frame(FrameType.REQUEST, 3, 4, b"\x06\x00\x01\x00\x2a", key=long_key,
                              direction=H2D))
    raw[2] &= ~int(Flags.AUTH_LONG) & 0xFF
    cut = bytes(raw[:-12]) + bytes(4)
    (ev,) = decode_frames(wire_of(resealed(cut)), MacCheck(long_key, H2D))
    assert isinstance(ev, DecodeError) and ev.kind is DecodeErrorKind.BAD_MAC
    assert "session uses 16" in ev.detail
    (ev,) = decode_frames(wire_of(resealed(cut)), MacCheck(MacKey(TEST_MAC_KEY), H2D))
    assert isinstance(ev, DecodeError) and ev.kind is DecodeErrorKind.BAD_MAC


def test_a_stripped_tag_gives_an_unverified_frame_for_the_session_to_refuse() -> None:
    """Removing AUTH and the tag (CRC recomputed) leaves a frame without a tag: the decoder cannot
    know it was ever signed, so it says ``verified=False`` and the keyed session answers
    AUTHENTICATION_REQUIRED (the next step) instead of executing."""
    key = MacKey(TEST_MAC_KEY)
    raw = bytearray(raw_frame(FrameType.REQUEST, 3, 4, b"\x03", key=key, direction=H2D))
    raw[2] &= ~int(Flags.AUTH) & 0xFF
    stripped = bytes(raw[:-12]) + bytes(4)
    (f,) = decode_frames(wire_of(resealed(stripped)), MacCheck(key, H2D))
    assert isinstance(f, Frame) and f.tag is None and not f.verified
    info = status_info(Status.AUTHENTICATION_REQUIRED)
    assert info.outcome is Outcome.NOT_EXECUTED


@pytest.mark.parametrize("address", [248, 250, 255])
def test_reserved_addresses_are_refused_typed(address: int) -> None:
    raw = bytearray(raw_frame(FrameType.REQUEST, 1, 1, b"x", address=7))
    raw[13] = address
    dec = FrameDecoder()
    dec.receive_data(wire_of(resealed(raw)) + encode_frame(FrameType.REQUEST, 2, 1, b"ok"))
    events = list(iter(dec.next_event, None))
    assert isinstance(events[0], DecodeError) and events[0].kind is DecodeErrorKind.BAD_ADDRESS
    assert dec.counters["BAD_ADDRESS"] == 1
    assert events[1] == Frame(FrameType.REQUEST, Flags(0), 1, 2, b"ok")
    with pytest.raises(FrameEncodeError, match="address"):
        encode_frame(FrameType.REQUEST, 1, 1, b"x", address=address)


@pytest.mark.parametrize(("flags", "cut", "kind"), [
    (int(Flags.AUTH_LONG), 0, DecodeErrorKind.MALFORMED),  # AUTH_LONG without AUTH
    (int(Flags.AUTH), 0, DecodeErrorKind.MALFORMED),  # AUTH but no room for a tag
    (int(Flags.ADDRESSED), 0, DecodeErrorKind.MALFORMED),  # ADDRESSED but the length is payload's
    (0x08, 0, DecodeErrorKind.UNKNOWN_FLAGS),
    (0x30, 0, DecodeErrorKind.UNKNOWN_FLAGS),
], ids=["auth-long-alone", "auth-no-room", "addressed-no-room", "unknown-0x08", "unknown-0x30"])
def test_layout_flags_that_lie_are_refused(flags: int, cut: int, kind: DecodeErrorKind) -> None:
    raw = struct.pack("<BBBIIH", 1, 3, flags, 1, 1, 1) + b"x"
    raw += struct.pack("<I", crc32c(raw))
    (ev,) = decode_frames(wire_of(raw))
    assert isinstance(ev, DecodeError) and ev.kind is kind


def test_an_old_peer_refuses_addressed_and_authenticated_frames() -> None:
    """A receiver of the first contract (the oracle's independent reader, knowing the first
    contract's flags only) drops them: unknown flags. It answers nothing, which on a bus is the
    only safe refusal."""
    for kw in ({"address": 7}, {"address": BROADCAST_ADDRESS},
               {"key": MacKey(TEST_MAC_KEY), "direction": H2D}):
        wire = encode_frame(FrameType.HELLO, 1, 0, b"", **kw)  # type: ignore[arg-type]
        assert read_frame(wire[1:-1], FIRST_CONTRACT_FLAGS) is None


def test_this_revisions_device_ignores_addressed_and_signed_frames_silently() -> None:
    def executor(pdu: bytes, now: float, seq: int) -> bytes:
        raise AssertionError("nothing may execute")

    dev = DeviceSession(executor, 0x1234, contract_hash=contract_hash())
    hello = bytes([1]) + contract_hash()
    for wire in (encode_frame(FrameType.HELLO, 1, 0, hello, address=3),
                 encode_frame(FrameType.REQUEST, 2, 0x1234, b"\x06\x00\x01\x00\x2a", address=0),
                 encode_frame(FrameType.REQUEST, 3, 0x1234, b"\x06\x00\x01\x00\x2a",
                              key=MacKey(TEST_MAC_KEY), direction=H2D)):
        dev.receive_data(wire, 0.0)
        assert dev.data_to_send() == b""
    assert dev.counters["unexpected_frames"] == 3
    dev.receive_data(encode_frame(FrameType.HELLO, 4, 0, hello), 0.0)
    assert dev.data_to_send() != b""  # the point-to-point HELLO still works


def test_blake2s_known_answers() -> None:
    """The primitive, against published answers (RFC 7693 appendix B; the BLAKE2 reference
    blake2s-kat.txt keyed entry for the empty message): the C port checks the same."""
    assert hashlib.blake2s(b"abc").hexdigest() == (
        "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982")
    assert hashlib.blake2s(b"", key=bytes(range(32))).hexdigest() == (
        "48a8997da407876b3d79c0d92325ad3b89cbb754d86ab71aee047ad345fd2c49")


@pytest.mark.parametrize("vec", ALL["session_keys"], ids=[v["name"] for v in ALL["session_keys"]])
def test_session_key_vectors(vec: dict[str, object]) -> None:
    got = derive_session_key(bytes.fromhex(str(vec["long_term_key"])),
                             bytes.fromhex(str(vec["host_nonce"])),
                             bytes.fromhex(str(vec["device_nonce"])),
                             bytes.fromhex(str(vec["device_id"])),
                             None if vec["address"] is None else int(str(vec["address"])))
    assert got.hex() == vec["session_key"]


def test_every_kdf_input_changes_the_session_key() -> None:
    base = (TEST_MAC_KEY, bytes(NONCE_LEN), bytes(NONCE_LEN), b"dev", None)
    ref = derive_session_key(*base)
    variants = [(bytes(31) + b"\x01", *base[1:]), (base[0], b"\x01" * NONCE_LEN, *base[2:]),
                (*base[:2], b"\x01" * NONCE_LEN, *base[3:]), (*base[:3], b"dew", None),
                (*base[:4], 1), (*base[:4], BROADCAST_ADDRESS)]
    keys_ = {derive_session_key(*v) for v in variants}  # type: ignore[arg-type]
    assert ref not in keys_ and len(keys_) == len(variants)


def test_local_refusals_are_typed_and_keys_stay_out_of_reprs() -> None:
    with pytest.raises(FrameEncodeError):
        MacKey(bytes(16))
    with pytest.raises(FrameEncodeError):
        MacKey(TEST_MAC_KEY, 4)  # below 64 bits
    with pytest.raises(FrameEncodeError):
        encode_frame(FrameType.REQUEST, 1, 1, b"", int(Flags.AUTH))  # layout flags by hand
    with pytest.raises(FrameEncodeError):
        encode_frame(FrameType.REQUEST, 1, 1, b"", key=MacKey(TEST_MAC_KEY))  # no direction
    with pytest.raises(FrameEncodeError):
        derive_session_key(TEST_MAC_KEY, bytes(8), bytes(NONCE_LEN), b"", None)
    with pytest.raises(FrameEncodeError):
        Frame(FrameType.REQUEST, Flags.AUTH, 1, 1, b"", tag=bytes(8)).encode()
    assert issubclass(FrameEncodeError, IdemlinkError) and issubclass(FrameEncodeError, ValueError)
    assert TEST_MAC_KEY.hex() not in repr(MacKey(TEST_MAC_KEY))
    assert TEST_MAC_KEY.hex() not in repr(MacCheck(MacKey(TEST_MAC_KEY), H2D))


def test_a_key_can_be_given_to_a_running_decoder() -> None:
    key = MacKey(TEST_MAC_KEY)
    dec = FrameDecoder()
    wire = encode_frame(FrameType.RESPONSE, 1, 2, b"\x00", key=key, direction=D2H)
    dec.receive_data(wire)
    first = dec.next_event()
    assert isinstance(first, Frame) and not first.verified
    dec.mac = MacCheck(key, D2H)
    dec.receive_data(wire)
    second = dec.next_event()
    assert isinstance(second, Frame) and second.verified
    assert parse_raw(cobs.decode(wire[1:-1]), MacCheck(MacKey(bytes(32)), D2H)) == DecodeError(
        DecodeErrorKind.BAD_MAC, "MAC mismatch")
