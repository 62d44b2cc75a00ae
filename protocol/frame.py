"""The idemlink frame: its one declaration, a fast codec that agrees with it, and the streaming decoder.

Layout (little-endian, declared once below with ``construct`` as ``FRAME``)::

    version u8 | type u8 | flags u8 | epoch u32 | seq u32 | length u16
    | [address u8, only when flags & ADDRESSED] | payload[length]
    | [tag 8 or 16 bytes, only when flags & AUTH; 16 when flags & AUTH_LONG]
    | crc u32 (CRC-32C over everything before it, the tag included)

A frame without ADDRESSED and AUTH is byte for byte the frame of the first contract: it means "the
device on this line". The address (1..247, 0 = broadcast) and the MAC trailer (keyed BLAKE2s over
direction, header, address and payload; ``frame_mac``) are one revision, designed together
(docs/PROTOCOL.md "Addressed and authenticated frames", docs/DESIGN.md).

Width choices (written down in docs/PROTOCOL.md as well):

- ``version`` u8: one byte is plenty for additive evolution; it is checked *after* the CRC.
- ``type`` u8 and ``flags`` u8: a handful of each exist; unknown values are refused, never guessed.
- ``epoch`` u32: a random boot epoch; 2^32 values make an accidental repeat across reboots negligible.
- ``seq`` u32: at 115200 baud a link carries at most ~4,600 minimal frames/s; a 16-bit counter would
  wrap in ~14 s, letting a delayed duplicate alias a fresh number. 32 bits wrap after ~10 days of
  saturation, and the window uses RFC 1982 arithmetic anyway, so wrap is correct, just rare.
- ``length`` u16: the payload limit is ``MAX_PAYLOAD`` (512); u8 could not hold it.
- ``address`` u8 (optional): Modbus's numbering, so one bus plan serves both protocols: 1..247 a
  device, 0 broadcast, 248..255 refused (``BAD_ADDRESS``).
- ``crc`` u32: CRC-32C (Castagnoli), Hamming distance 6 up to 5,243 bits; the longest frame
  (13 + 1 + 512 + 16 + 4 bytes = 4,368 bits) is inside that, so any 5 bit errors are detected.

The length field is never trusted before the CRC has passed.

Compatibility rule (additive evolution): the first byte is the version and the CRC-32C
trailer covers the whole frame in every version. A frame whose version is not ours, whose type we do
not know or which carries a flag we do not know is refused with a typed, counted error
(``UNKNOWN_VERSION`` / ``UNKNOWN_TYPE`` / ``UNKNOWN_FLAGS``) and never parsed further. New
capabilities arrive as new frame types or new flags that a peer only uses after the session
handshake (HELLO) showed the other side knows them.

Delimiting: ``00 cobs(frame) 00`` (see ``idemlink.protocol.cobs``). The streaming ``FrameDecoder`` never
raises on bad input, buffers at most ``MAX_ENCODED`` bytes, and loses at most the damaged frame.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections import Counter, deque
from dataclasses import dataclass
from enum import IntEnum, IntFlag

import construct as cs
import crcmod.predefined

from idemlink.protocol import cobs
from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from idemlink.protocol.outcome import LocalProtocolError

PROTOCOL_VERSION = 1
MAX_PAYLOAD = 512
AUTH_TAG_LEN = 8  #: the MAC trailer with AUTH alone (64 bits)
AUTH_TAG_LONG_LEN = 16  #: the MAC trailer with AUTH | AUTH_LONG (128 bits)
MAC_LENS = (AUTH_TAG_LEN, AUTH_TAG_LONG_LEN)
ADDRESS_LEN = 1
BROADCAST_ADDRESS = 0  #: every device on the bus acts; none answers
MIN_ADDRESS = 1
MAX_ADDRESS = 247  #: Modbus's range: 248..255 are refused (BAD_ADDRESS)
KDF_ADDRESS_NONE = 0xFF  #: the address byte in the key derivation of a point-to-point session
KEY_LEN = 32  #: long-term and session keys (BLAKE2s's largest key)
NONCE_LEN = 16  #: each side's HELLO nonce
KDF_LABEL = b"idemlink session key v1"
SEQ_BITS = 32
CRC_NAME = "crc-32c"
CRC_POLY = 0x1EDC6F41
CRC_INIT = 0xFFFFFFFF
CRC_XOROUT = 0xFFFFFFFF
CRC_REFLECTED = True
CRC_CHECK = 0xE3069283  # CRC of b"123456789"
CRC_RESIDUE = 0x48674BC7  # CRC of any frame including its own (LE) CRC trailer: one call, no slicing

crc32c = crcmod.predefined.mkCrcFun(CRC_NAME)


class FrameType(IntEnum):
    """Frame types. HELLO/HELLO_REPLY open a session; REQUEST/RESPONSE carry commands."""

    HELLO = 1
    HELLO_REPLY = 2
    REQUEST = 3
    RESPONSE = 4


class Flags(IntFlag):
    """Header flags. Bits not listed here are refused (``UNKNOWN_FLAGS``)."""

    NONE = 0
    RETRANSMIT = 0x01  #: the host resends the same seq and content
    REPLAY = 0x02  #: the device answers with the stored bytes of the first answer
    ADDRESSED = 0x04  #: a one-byte device address follows the header (absent: this line's device)
    AUTH_LONG = 0x40  #: with AUTH: the tag is 16 bytes, not 8
    AUTH = 0x80  #: a MAC tag (8 bytes, 16 with AUTH_LONG) follows the payload


KNOWN_FLAGS = Flags.RETRANSMIT | Flags.REPLAY | Flags.ADDRESSED | Flags.AUTH_LONG | Flags.AUTH
"""Flags this version accepts (a peer of the first contract knows RETRANSMIT and REPLAY only and
refuses the others as UNKNOWN_FLAGS, silently)."""
LAYOUT_FLAGS = Flags.ADDRESSED | Flags.AUTH_LONG | Flags.AUTH
"""Flags that change the frame's layout: set by the codec from the address and key, never by a
caller."""


class Direction(IntEnum):
    """The first byte the MAC covers: a frame authenticated one way never verifies the other way
    (a device's answer reflected back to it fails)."""

    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2

HEADER = cs.Struct(
    "version" / cs.Int8ul,
    "type" / cs.Int8ul,
    "flags" / cs.Int8ul,
    "epoch" / cs.Int32ul,
    "seq" / cs.Int32ul,
    "length" / cs.Int16ul,
)
"""The header declaration: the source of truth for field order, widths and offsets."""

FRAME = cs.Struct(
    "body"
    / cs.RawCopy(
        cs.Struct(
            "header" / HEADER,
            "address" / cs.If(cs.this.header.flags & Flags.ADDRESSED, cs.Int8ul),
            "payload" / cs.Bytes(cs.this.header.length),
            "auth_tag" / cs.If(
                cs.this.header.flags & Flags.AUTH,
                cs.Bytes(lambda ctx: AUTH_TAG_LONG_LEN if ctx.header.flags & Flags.AUTH_LONG
                         else AUTH_TAG_LEN),
            ),
        )
    ),
    "crc" / cs.Checksum(cs.Int32ul, crc32c, cs.this.body.data),
    cs.Terminated,
)
"""The whole frame (before COBS), with its CRC-32C trailer."""

HEADER_LEN: int = HEADER.sizeof()
CRC_LEN = 4
MIN_FRAME = HEADER_LEN + CRC_LEN
MAX_FRAME = HEADER_LEN + ADDRESS_LEN + MAX_PAYLOAD + AUTH_TAG_LONG_LEN + CRC_LEN
MAX_ENCODED = cobs.max_encoded_len(MAX_FRAME)
"""The decoder never holds more than this many bytes."""

# The fast path: one struct format derived from the same declaration (a test checks they agree).
_HEADER_FMT = "<" + "".join(
    {cs.Int8ul: "B", cs.Int16ul: "H", cs.Int32ul: "I"}[sc.subcon] for sc in HEADER.subcons
)
_HEADER_STRUCT = struct.Struct(_HEADER_FMT)
_CRC_STRUCT = struct.Struct("<I")


def header_offsets() -> dict[str, tuple[int, int]]:
    """Offset and size of each header field, computed from the construct declaration."""
    out: dict[str, tuple[int, int]] = {}
    off = 0
    for sc in HEADER.subcons:
        size = sc.sizeof()
        out[sc.name] = (off, size)
        off += size
    return out


class FrameEncodeError(LocalProtocolError, ValueError):
    """A frame the codec refuses to build (payload over MAX_PAYLOAD, an address outside 0..247,
    a key or tag length the contract does not define, a layout flag passed by hand)."""


def check_address(address: int) -> int:
    """``address`` if it is a device's bus address (1..247), else ``FrameEncodeError`` (a
    ``LocalProtocolError``): 0 is the broadcast address, 248..255 are reserved."""
    if isinstance(address, bool) or not isinstance(address, int) or not (
            MIN_ADDRESS <= address <= MAX_ADDRESS):
        raise FrameEncodeError(f"a device address is {MIN_ADDRESS}..{MAX_ADDRESS}, not "
                               f"{address!r} (0 is the broadcast address)")
    return address


@dataclass(frozen=True, slots=True)
class MacKey:
    """A session key and the tag length it is used with. Its ``repr`` never shows the key (keys
    stay out of logs and traces)."""

    key: bytes
    tag_len: int = AUTH_TAG_LEN

    def __post_init__(self) -> None:
        if len(self.key) != KEY_LEN:
            raise FrameEncodeError(f"a MAC key is {KEY_LEN} bytes, not {len(self.key)}")
        if self.tag_len not in MAC_LENS:
            raise FrameEncodeError(f"a MAC tag is {' or '.join(map(str, MAC_LENS))} bytes, "
                                   f"not {self.tag_len}")

    def __repr__(self) -> str:
        return f"MacKey(<{len(self.key)} bytes>, tag_len={self.tag_len})"


@dataclass(frozen=True, slots=True)
class MacCheck:
    """What a verifying decoder needs: the session key and the direction frames arrive from (a
    device checks HOST_TO_DEVICE, a host DEVICE_TO_HOST)."""

    key: MacKey
    direction: Direction


def frame_mac(key: bytes, direction: Direction | int, covered: bytes, tag_len: int) -> bytes:
    """The MAC tag: keyed BLAKE2s (RFC 7693) with ``digest_size=tag_len`` over the direction byte
    then ``covered`` (every frame byte before the tag: header, address, payload). Pure."""
    h = hashlib.blake2s(key=key, digest_size=tag_len)
    h.update(bytes((int(direction),)))
    h.update(covered)
    return h.digest()


def derive_session_key(long_term_key: bytes, host_nonce: bytes, device_nonce: bytes,
                       device_id: bytes, address: int | None) -> bytes:
    """Session key = BLAKE2s-256 keyed with the long-term key over ``KDF_LABEL | host_nonce |
    device_nonce | len(device_id) u8 | device_id | address u8`` (``KDF_ADDRESS_NONE`` for a
    point-to-point session). Fresh nonces from both sides make every session's key new; the
    label's first byte is never a ``Direction``, so a KDF input never equals a MAC input."""
    if len(long_term_key) != KEY_LEN:
        raise FrameEncodeError(f"a long-term key is {KEY_LEN} bytes, not {len(long_term_key)}")
    if len(host_nonce) != NONCE_LEN or len(device_nonce) != NONCE_LEN:
        raise FrameEncodeError(f"a HELLO nonce is {NONCE_LEN} bytes")
    if len(device_id) > 255:
        raise FrameEncodeError("a device id for the key derivation is at most 255 bytes")
    addr = KDF_ADDRESS_NONE if address is None else _check_address(address)
    h = hashlib.blake2s(key=long_term_key, digest_size=KEY_LEN)
    h.update(KDF_LABEL + host_nonce + device_nonce + bytes((len(device_id),)) + device_id
             + bytes((addr,)))
    return h.digest()


def _check_address(address: int) -> int:
    if address != BROADCAST_ADDRESS and not MIN_ADDRESS <= address <= MAX_ADDRESS:
        raise FrameEncodeError(f"address {address} is not {BROADCAST_ADDRESS} (broadcast) or "
                               f"{MIN_ADDRESS}..{MAX_ADDRESS}")
    return address


@dataclass(slots=True)
class Frame:
    """A decoded, CRC-checked, version/type/flags-checked frame (treat as immutable; not frozen
    only because frozen dataclasses cost ~1 µs per construction on the hot path).

    ``address`` is None for a point-to-point frame ("the device on this line"). ``tag`` is the
    MAC trailer as received (None without AUTH); ``verified`` is True only when a decoder holding
    the session key checked it (``MacCheck``): a tag nobody checked proves nothing."""

    type: FrameType
    flags: Flags
    epoch: int
    seq: int
    payload: bytes
    version: int = PROTOCOL_VERSION
    address: int | None = None
    tag: bytes | None = None
    verified: bool = False

    def encode(self, key: MacKey | None = None, direction: Direction | None = None) -> bytes:
        """Wire bytes: ``00 cobs(frame) 00``. A frame with a tag needs the key and direction to
        re-sign it (the tag is recomputed, never copied)."""
        if self.tag is not None and (key is None or direction is None):
            raise FrameEncodeError("re-encoding an authenticated frame needs its key and direction")
        return encode_frame(self.type, self.seq, self.epoch, self.payload,
                            self.flags & ~LAYOUT_FLAGS, address=self.address,
                            key=key if self.tag is not None else None, direction=direction)


class DecodeErrorKind(IntEnum):
    """Typed decoder errors (each counted in ``FrameDecoder.counters``)."""

    BAD_CRC = 1
    OVERSIZE = 2
    UNKNOWN_VERSION = 3
    UNKNOWN_TYPE = 4
    UNKNOWN_FLAGS = 5
    MALFORMED = 6  #: not valid COBS, shorter than a header, or length field disagrees
    # 7 is never a refusal: it is the C decoder's IDL_FRAME_READY ("a frame"), an event value of
    # the same int since the first C API (idl_frame.h); the kinds added later skip it.
    BAD_ADDRESS = 8  #: an ADDRESSED frame whose address is 248..255
    BAD_MAC = 9  #: a verifying decoder (``MacCheck``): the tag is wrong or not the session's length


@dataclass(frozen=True, slots=True)
class DecodeError:
    """A refused frame. ``detail`` says why, for logs and the monitor."""

    kind: DecodeErrorKind
    detail: str


def raw_frame(
    ftype: int, seq: int, epoch: int, payload: bytes = b"", flags: int = 0, *,
    address: int | None = None, key: MacKey | None = None, direction: Direction | None = None,
) -> bytes:
    """One un-delimited frame (fast path; agrees with ``FRAME.build``). ``flags`` holds
    RETRANSMIT/REPLAY; ADDRESSED, AUTH and AUTH_LONG follow from ``address`` and ``key``."""
    if len(payload) > MAX_PAYLOAD:
        raise FrameEncodeError(
            f"payload of {len(payload)} bytes exceeds MAX_PAYLOAD={MAX_PAYLOAD}")
    if flags & LAYOUT_FLAGS:
        raise FrameEncodeError("ADDRESSED/AUTH/AUTH_LONG follow from address and key, not flags")
    if address is None and key is None:
        raw = _HEADER_STRUCT.pack(PROTOCOL_VERSION, ftype, flags, epoch, seq, len(payload))
        raw += payload
        return raw + _CRC_STRUCT.pack(crc32c(raw))
    if address is not None:
        flags |= Flags.ADDRESSED
    if key is not None:
        if direction is None:
            raise FrameEncodeError("an authenticated frame needs its direction")
        flags |= Flags.AUTH | (Flags.AUTH_LONG if key.tag_len == AUTH_TAG_LONG_LEN else 0)
    raw = _HEADER_STRUCT.pack(PROTOCOL_VERSION, ftype, flags, epoch, seq, len(payload))
    if address is not None:
        raw += bytes((_check_address(address),))
    raw += payload
    if key is not None and direction is not None:
        raw += frame_mac(key.key, direction, raw, key.tag_len)
    return raw + _CRC_STRUCT.pack(crc32c(raw))


def encode_frame(
    ftype: int, seq: int, epoch: int, payload: bytes = b"", flags: int = 0, *,
    address: int | None = None, key: MacKey | None = None, direction: Direction | None = None,
) -> bytes:
    """Build wire bytes for one frame (fast path; agrees with ``FRAME.build``)."""
    if address is None and key is None:
        if len(payload) > MAX_PAYLOAD:
            raise FrameEncodeError(
                f"payload of {len(payload)} bytes exceeds MAX_PAYLOAD={MAX_PAYLOAD}")
        if flags & LAYOUT_FLAGS:
            raise FrameEncodeError(
                "ADDRESSED/AUTH/AUTH_LONG follow from address and key, not flags")
        raw = _HEADER_STRUCT.pack(PROTOCOL_VERSION, ftype, flags, epoch, seq, len(payload))
        raw += payload
        raw += _CRC_STRUCT.pack(crc32c(raw))
        return b"\x00" + cobs.encode(raw) + b"\x00"
    raw = raw_frame(ftype, seq, epoch, payload, flags, address=address, key=key,
                    direction=direction)
    return b"\x00" + cobs.encode(raw) + b"\x00"


def build_raw(
    ftype: int, seq: int, epoch: int, payload: bytes = b"", flags: int = 0,
    version: int = PROTOCOL_VERSION, auth_tag: bytes | None = None, address: int | None = None,
) -> bytes:
    """Build an un-delimited frame through the construct declaration (reference path). ``flags``
    is taken as given (ADDRESSED and AUTH included): the declaration, not the codec, decides."""
    body = {
        "header": {
            "version": version, "type": ftype, "flags": flags,
            "epoch": epoch, "seq": seq, "length": len(payload),
        },
        "address": address,
        "payload": payload,
        "auth_tag": auth_tag,
    }
    return bytes(FRAME.build({"body": {"value": body}, "crc": None}))


_TYPES: dict[int, FrameType] = {int(t): t for t in FrameType}
_UNKNOWN_FLAGS = 0xFF & ~int(KNOWN_FLAGS)
_LAYOUT_FLAGS = int(LAYOUT_FLAGS)
_FLAGS: dict[int, Flags] = {v: Flags(v) for v in range(256) if not v & ~KNOWN_FLAGS}


def parse_raw(raw: bytes, mac: MacCheck | None = None) -> Frame | DecodeError:
    """Check and parse one un-delimited frame (fast path; agrees with ``FRAME.parse``).

    Order: size, CRC, version, flags, layout (length, address), MAC, type. The MAC is checked
    only by a decoder holding a ``MacCheck``; without one a tag is parsed, kept and left
    unverified (``Frame.verified`` False). Whether a frame *without* a tag is acceptable is the
    session's policy (HELLO never carries one), not the decoder's."""
    n = len(raw)
    if n < MIN_FRAME:
        return DecodeError(DecodeErrorKind.MALFORMED, f"{n} bytes is shorter than a frame")
    if crc32c(raw) != CRC_RESIDUE:
        return DecodeError(DecodeErrorKind.BAD_CRC, "CRC-32C mismatch")
    version, ftype, flags, epoch, seq, length = _HEADER_STRUCT.unpack_from(raw)
    if version != PROTOCOL_VERSION:
        return DecodeError(DecodeErrorKind.UNKNOWN_VERSION, f"version {version}")
    if flags & _UNKNOWN_FLAGS:
        return DecodeError(DecodeErrorKind.UNKNOWN_FLAGS, f"flags 0x{flags:02X}")
    if not flags & _LAYOUT_FLAGS:  # the first contract's frame: unchanged path
        if HEADER_LEN + length + CRC_LEN != n:
            return DecodeError(
                DecodeErrorKind.MALFORMED, f"length field {length} disagrees with frame size {n}"
            )
        ft = _TYPES.get(ftype)
        if ft is None:
            return DecodeError(DecodeErrorKind.UNKNOWN_TYPE, f"type {ftype}")
        return Frame(ft, _FLAGS[flags], epoch, seq, raw[HEADER_LEN : n - CRC_LEN])
    return _parse_extended(raw, mac, flags, ftype, epoch, seq, length)


def _parse_extended(raw: bytes, mac: MacCheck | None, flags: int, ftype: int, epoch: int,
                    seq: int, length: int) -> Frame | DecodeError:
    n = len(raw)
    if flags & Flags.AUTH_LONG and not flags & Flags.AUTH:
        return DecodeError(DecodeErrorKind.MALFORMED, "AUTH_LONG without AUTH")
    addressed = bool(flags & Flags.ADDRESSED)
    tag_len = 0
    if flags & Flags.AUTH:
        tag_len = AUTH_TAG_LONG_LEN if flags & Flags.AUTH_LONG else AUTH_TAG_LEN
    start = HEADER_LEN + (ADDRESS_LEN if addressed else 0)
    if start + length + tag_len + CRC_LEN != n:
        return DecodeError(
            DecodeErrorKind.MALFORMED, f"length field {length} disagrees with frame size {n}"
        )
    address: int | None = None
    if addressed:
        address = raw[HEADER_LEN]
        if address != BROADCAST_ADDRESS and address > MAX_ADDRESS:
            return DecodeError(DecodeErrorKind.BAD_ADDRESS, f"address {address}")
    end = start + length
    tag = raw[end : end + tag_len] if tag_len else None
    verified = False
    if mac is not None and tag is not None:
        if tag_len != mac.key.tag_len:
            return DecodeError(DecodeErrorKind.BAD_MAC,
                               f"a {tag_len}-byte tag, the session uses {mac.key.tag_len}")
        want = frame_mac(mac.key.key, mac.direction, raw[:end], tag_len)
        if not hmac.compare_digest(want, tag):
            return DecodeError(DecodeErrorKind.BAD_MAC, "MAC mismatch")
        verified = True
    ft = _TYPES.get(ftype)
    if ft is None:
        return DecodeError(DecodeErrorKind.UNKNOWN_TYPE, f"type {ftype}")
    return Frame(ft, _FLAGS[flags], epoch, seq, raw[start:end], PROTOCOL_VERSION, address, tag,
                 verified)


class FrameDecoder:
    """Streaming decoder: bytes in any chunking in, frames and typed errors out (sans-I/O shape:
    ``receive_data(data)`` then ``next_event()`` until it returns None).

    Invariants (tested):

    - ``receive_data`` never raises, whatever the input.
    - At most ``MAX_ENCODED`` bytes are buffered between calls (plus the decoded events the
      caller has not taken yet: drain ``next_event`` after each ``receive_data``).
    - Garbage between frames costs only itself (every frame starts with a delimiter); a damaged
      frame costs only itself. Nothing after the next 0x00 is ever affected by what came before.
    - Every refusal is counted in ``counters`` (keyed by ``DecodeErrorKind`` name) and returned
      as an event.

    ``mac`` (settable, e.g. once a session key exists) makes the decoder verify every tag right
    after the CRC and layout checks; without it tags are kept unverified.
    """

    __slots__ = ("_buf", "_discarding", "_events", "counters", "mac")

    def __init__(self, mac: MacCheck | None = None) -> None:
        self._buf = bytearray()
        self._discarding = False
        self._events: deque[Frame | DecodeError] = deque()
        self.counters: Counter[str] = Counter()
        self.mac = mac

    @property
    def buffered(self) -> int:
        """Bytes currently held (always <= MAX_ENCODED)."""
        return len(self._buf)

    def reset(self) -> None:
        """Forget any partial frame and any event not taken yet (e.g. after a port reopen)."""
        self._buf.clear()
        self._discarding = False
        self._events.clear()

    def next_event(self) -> Frame | DecodeError | None:
        """The next decoded frame or refusal, in wire order; None when there is nothing more."""
        events = self._events
        return events.popleft() if events else None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Take received bytes (any chunking); what they complete waits in ``next_event``."""
        if not isinstance(data, bytes):
            data = bytes(data)
        parts = data.split(b"\x00")
        last = len(parts) - 1
        out = self._events
        if last == 0:  # no delimiter in this chunk: it continues the current segment
            self._accumulate(data, out)
            return
        first = parts[0]
        if self._discarding:
            self._discarding = False
        elif self._buf:
            self._buf += first
            out.append(self._decode_segment(bytes(self._buf)))
            self._buf.clear()
        elif first:
            out.append(self._decode_segment(first))
        for i in range(1, last):
            segment = parts[i]
            if segment:
                out.append(self._decode_segment(segment))
        if parts[last]:
            self._accumulate(parts[last], out)

    def _accumulate(self, chunk: bytes, out: deque[Frame | DecodeError]) -> None:
        if self._discarding:
            return
        if len(self._buf) + len(chunk) > MAX_ENCODED:
            self._buf.clear()
            self._discarding = True
            self.counters[DecodeErrorKind.OVERSIZE.name] += 1
            out.append(
                DecodeError(DecodeErrorKind.OVERSIZE, f"no delimiter within {MAX_ENCODED} bytes")
            )
            return
        self._buf += chunk

    def _decode_segment(self, segment: bytes) -> Frame | DecodeError:
        if len(segment) > MAX_ENCODED:
            err: Frame | DecodeError = DecodeError(
                DecodeErrorKind.OVERSIZE, f"{len(segment)} encoded bytes > {MAX_ENCODED}"
            )
        else:
            raw = cobs.decode_segment(segment)
            err = (
                DecodeError(DecodeErrorKind.MALFORMED, "invalid COBS")
                if raw is None
                else parse_raw(raw, self.mac)
            )
        if isinstance(err, DecodeError):
            self.counters[err.kind.name] += 1
        else:
            self.counters["FRAMES"] += 1
        return err


def decode_frames(data: bytes | bytearray | memoryview,
                  mac: MacCheck | None = None) -> list[Frame | DecodeError]:
    """Every event a fresh ``FrameDecoder`` finds in ``data`` taken whole (a capture, one answer
    in a test); a streaming reader keeps its own decoder instead."""
    decoder = FrameDecoder(mac)
    decoder.receive_data(data)
    return list(iter(decoder.next_event, None))


_ALL_FLAGS = (Flags.RETRANSMIT, Flags.REPLAY, Flags.ADDRESSED, Flags.AUTH_LONG, Flags.AUTH)
FIRST_CONTRACT_FLAGS = (Flags.RETRANSMIT, Flags.REPLAY, Flags.AUTH)
"""The flags the contract hash has covered since the first devices were built (AUTH reserved
then, with its 8-byte tag); ADDRESSED and AUTH_LONG came later and are not hashed."""


def _auth_markdown() -> str:
    return (
        "## Addressed and authenticated frames\n\n"
        "One revision of the header serves both the bus (a device address) and authentication "
        "(a MAC trailer), so the MAC covers the address and neither needs a second layout "
        "change. Both are optional and signalled by flag bits; a frame with neither is byte for "
        "byte the frame of the first contract and means \"the device on this line\".\n\n"
        "```\n"
        "version | type | flags | epoch u32 | seq u32 | length u16 | [address u8] | payload "
        "| [tag 8|16] | crc u32\n"
        "<------------------- covered by the MAC (after the direction byte) -----------> "
        "<-- CRC covers all before it -->\n"
        "```\n\n"
        + md_table(
            ["flag", "adds", "where"],
            [["ADDRESSED", f"address u8: {MIN_ADDRESS}..{MAX_ADDRESS} one device, "
              f"{BROADCAST_ADDRESS} broadcast (every device acts, none answers); "
              f"{MAX_ADDRESS + 1}..255 refused BAD_ADDRESS", f"offset {HEADER_LEN}"],
             ["AUTH", f"MAC tag, {AUTH_TAG_LEN} bytes", "after the payload, before the CRC"],
             ["AUTH_LONG (with AUTH)", f"MAC tag of {AUTH_TAG_LONG_LEN} bytes instead",
              "after the payload, before the CRC"]],
        )
        + "\n**Decoding order.** CRC (over everything, the tag included: noise is caught by the "
        "CRC first, never reported as a forgery), version, flags, layout (the length field "
        "must agree with the frame size given ADDRESSED/AUTH/AUTH_LONG; AUTH_LONG without AUTH "
        "is MALFORMED), address range (BAD_ADDRESS), then, in a decoder that holds the session "
        "key, the tag (BAD_MAC: wrong tag, or a tag length other than the session's, so a "
        "truncated tag never verifies), then the type.\n\n"
        "**MAC.** Keyed BLAKE2s (RFC 7693) with the session key (32 bytes) and digest size "
        f"{AUTH_TAG_LEN} or {AUTH_TAG_LONG_LEN} over `direction u8 | every frame byte before "
        "the tag`. Direction: "
        + ", ".join(f"{d.name} = {d.value}" for d in Direction)
        + " (a device's answer reflected back to it fails). Freshness is the sequence number "
        "and boot epoch already in the header (no clock): the tag is a pure function of key, "
        "direction and bytes, so a retransmission under one session key carries the same "
        "tag as the first send but for the RETRANSMIT bit, and de-duplication works unchanged; "
        "a replayed answer (REPLAY set) is re-signed with the current session key.\n\n"
        "**Session key.** `BLAKE2s-256(key = long-term key, data = \"" + KDF_LABEL.decode()
        + f"\" | host nonce ({NONCE_LEN}) | device nonce ({NONCE_LEN}) | len(device id) u8 | "
        f"device id | address u8)`, the address byte 0x{KDF_ADDRESS_NONE:02X} for a "
        "point-to-point session. The host nonce and the id of the host's key travel in HELLO's "
        "auth extension, the device nonce and the id of the key it used in HELLO_REPLY's "
        "fourth extension (session section; `idemlink.protocol.auth`, docs/SECURITY.md). "
        "HELLO is never authenticated (no side effect; it carries the host nonce); a "
        "keyed device signs its HELLO_REPLY with the new session key, so a host learns the "
        "device holds the key before it sends anything else.\n\n"
        "**Old peers.** A peer of the first contract refuses ADDRESSED and AUTH frames as "
        "UNKNOWN_FLAGS, counted, and stays silent: on a bus an answer would collide with the "
        "addressed device's, and it could not name the address it refuses. A device without an "
        "address or key (this revision's sessions) ignores such frames silently as well "
        "(counted as unexpected frames). A keyed device answers an unauthenticated REQUEST "
        "with AUTHENTICATION_REQUIRED (NOT_EXECUTED).\n\n"
        "**The contract hash is unchanged.** Everything above is additive (listed under \"Added "
        "since the first devices\"): a device says what it serves in HELLO_REPLY's "
        "`capabilities`, a host sends an ADDRESSED or AUTH frame only to a device that said so, "
        "and a device answers in the shape it was asked (an addressed answer only to an "
        "addressed request). An old host and a new device, or a new host and an old device, "
        "keep the hash and the first contract's frames.\n"
    )


def contract_section() -> ContractSection:
    offs = header_offsets()
    defines = [
        CDefine("IDL_PROTOCOL_VERSION", PROTOCOL_VERSION, "the version byte of this contract"),
        CDefine("IDL_SEQ_BITS", SEQ_BITS, "width of the sequence number"),
        CDefine("IDL_HEADER_LEN", HEADER_LEN, "header bytes before the payload"),
        CDefine("IDL_MAX_PAYLOAD", MAX_PAYLOAD, "largest payload"),
        CDefine("IDL_AUTH_TAG_LEN", AUTH_TAG_LEN, "MAC tag with flag AUTH"),
        CDefine("IDL_AUTH_TAG_LONG_LEN", AUTH_TAG_LONG_LEN, "MAC tag with AUTH | AUTH_LONG"),
        CDefine("IDL_ADDRESS_LEN", ADDRESS_LEN, "address byte with flag ADDRESSED"),
        CDefine("IDL_OFF_ADDRESS", HEADER_LEN, "offset of the address (flag ADDRESSED)"),
        CDefine("IDL_BROADCAST_ADDRESS", BROADCAST_ADDRESS, "every device acts, none answers"),
        CDefine("IDL_MIN_ADDRESS", MIN_ADDRESS, "lowest device address"),
        CDefine("IDL_MAX_ADDRESS", MAX_ADDRESS, "highest device address"),
        CDefine("IDL_KDF_ADDRESS_NONE", f"0x{KDF_ADDRESS_NONE:02X}u",
                "address byte of a point-to-point session's key derivation"),
        CDefine("IDL_KEY_LEN", KEY_LEN, "long-term and session key bytes (BLAKE2s)"),
        CDefine("IDL_NONCE_LEN", NONCE_LEN, "HELLO nonce bytes, each side"),
        CDefine("IDL_KDF_LABEL", '"' + KDF_LABEL.decode() + '"', "key derivation label"),
        CDefine("IDL_CRC_LEN", CRC_LEN, "CRC-32C trailer"),
        CDefine("IDL_MAX_FRAME", MAX_FRAME, "largest frame before COBS"),
        CDefine("IDL_MAX_ENCODED", MAX_ENCODED, "largest COBS-encoded frame (decoder buffer)"),
        CDefine("IDL_CRC_POLY", f"0x{CRC_POLY:08X}u", "CRC-32C (Castagnoli), normal form"),
        CDefine("IDL_CRC_INIT", f"0x{CRC_INIT:08X}u", "initial value"),
        CDefine("IDL_CRC_XOROUT", f"0x{CRC_XOROUT:08X}u", "final xor"),
        CDefine("IDL_CRC_REFLECTED", 1 if CRC_REFLECTED else 0, "input and output reflected"),
        CDefine("IDL_CRC_CHECK", f"0x{CRC_CHECK:08X}u", "CRC of the ASCII bytes 123456789"),
        CDefine("IDL_KNOWN_FLAGS", f"0x{int(KNOWN_FLAGS):02X}u", "flags accepted by this version"),
        CDefine("IDL_LAYOUT_FLAGS", f"0x{int(LAYOUT_FLAGS):02X}u",
                "flags that add an address or a tag"),
        CDefine("IDL_DECODE_COUNTERS", max(DecodeErrorKind) + 1,
                "decoder counters: [0] frames, [IDL_DECODE_*] refusals"),
    ]
    for name, (off, size) in offs.items():
        defines.append(CDefine(f"IDL_OFF_{name.upper()}", off, f"offset of {name}"))
        defines.append(CDefine(f"IDL_SIZE_{name.upper()}", size, f"size of {name}"))
    rows = [[name, off, size, "u" + str(8 * size) + (" LE" if size > 1 else "")]
            for name, (off, size) in offs.items()]
    rows.append(["address", HEADER_LEN, f"{ADDRESS_LEN} if flags & ADDRESSED", "u8"])
    rows.append(["payload", f"{HEADER_LEN} (+1 if ADDRESSED)", "length", "bytes"])
    rows.append(["auth_tag", "after payload",
                 f"{AUTH_TAG_LEN} if flags & AUTH ({AUTH_TAG_LONG_LEN} with AUTH_LONG)",
                 "bytes: keyed BLAKE2s"])
    rows.append(["crc", "last 4", CRC_LEN, "u32 LE, CRC-32C of all bytes before it"])
    md = (
        "## Frame layout\n\n"
        f"Version {PROTOCOL_VERSION}. On the wire: `00 COBS(frame) 00`. Little-endian.\n\n"
        + md_table(["field", "offset", "size", "encoding"], rows)
        + "\n"
        + md_table(
            ["constant", "value"],
            [["max payload", MAX_PAYLOAD], ["max frame", MAX_FRAME],
             ["max encoded (decoder bound)", MAX_ENCODED],
             ["CRC", f"CRC-32C poly 0x{CRC_POLY:08X} reflected, init/xorout 0xFFFFFFFF, "
                     f"check 0x{CRC_CHECK:08X}"]],
        )
        + "\n**Compatibility (additive only).** The version byte comes first and the CRC-32C "
        "trailer covers the whole frame in every version; the CRC is checked before anything "
        "else, and the length field is trusted only after it. A frame of another version, of an "
        "unknown type or with an unknown flag is refused with a typed, counted decoder error "
        "(UNKNOWN_VERSION, UNKNOWN_TYPE, UNKNOWN_FLAGS) and never parsed further. New "
        "capabilities arrive as new types, flags or appended HELLO_REPLY fields, used only after "
        "the handshake showed the peer knows them.\n"
        + "\n**Resynchronisation.** Every frame is sent between two 0x00 delimiters: garbage "
        "between frames costs only itself and a damaged frame costs only itself.\n"
        + "\n### Frame types\n\n"
        + md_table(["value", "type"], [[t.value, t.name] for t in FrameType])
        + "\n### Flags\n\n"
        + md_table(
            ["bit", "flag", "decoded by this version (ADDRESSED, AUTH: see below)"],
            [[f"0x{int(f):02X}", f.name, "yes" if f & KNOWN_FLAGS else "no (reserved)"]
             for f in _ALL_FLAGS],
        )
        + "\n### Decoder errors\n\n"
        + md_table(["value", "error"], [[k.value, k.name] for k in DecodeErrorKind])
        + "\n" + _auth_markdown()
    )
    return ContractSection(
        name="frame",
        defines=defines,
        enums=[
            CEnum("idl_frame_type_t", "IDL_FT", FrameType, "frame types"),
            CEnum("idl_flags_t", "IDL_FLAG", Flags, "header flag bits"),
            CEnum("idl_decode_error_t", "IDL_DECODE", DecodeErrorKind, "decoder errors"),
            CEnum("idl_direction_t", "IDL_DIR", Direction, "first byte under the MAC"),
        ],
        markdown=md,
        data={
            "version": PROTOCOL_VERSION,
            "header": {k: list(v) for k, v in offs.items()},
            "max_payload": MAX_PAYLOAD,
            "auth_tag_len": AUTH_TAG_LEN,
            "crc": [CRC_NAME, CRC_POLY, CRC_INIT, CRC_XOROUT, CRC_REFLECTED],
            "types": {t.name: t.value for t in FrameType},
            "flags": {f.name: int(f) for f in FIRST_CONTRACT_FLAGS},
        },
        # The revision's additions (issues 22 and 23): optional for both peers, advertised by
        # HELLO_REPLY capabilities, so never hashed (``ContractSection.additive``).
        additive={
            "flags": {f.name: int(f) for f in _ALL_FLAGS if f not in FIRST_CONTRACT_FLAGS},
            "address": {"offset": HEADER_LEN, "size": ADDRESS_LEN,
                        "broadcast": BROADCAST_ADDRESS, "range": [MIN_ADDRESS, MAX_ADDRESS]},
            "auth": {"mac": "blake2s", "tag_lens": list(MAC_LENS), "key_len": KEY_LEN,
                     "nonce_len": NONCE_LEN, "kdf_label": KDF_LABEL.decode(),
                     "kdf_address_none": KDF_ADDRESS_NONE,
                     "directions": {d.name: d.value for d in Direction}},
            "decode_errors": {k.name: k.value for k in DecodeErrorKind},
        },
    )
