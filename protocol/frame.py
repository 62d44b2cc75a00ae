"""The idemlink frame: its one declaration, a fast codec that agrees with it, and the streaming decoder.

Layout (little-endian, declared once below with ``construct`` as ``FRAME``)::

    version u8 | type u8 | flags u8 | epoch u32 | seq u32 | length u16 | payload[length]
    | [auth_tag 8 bytes, only when flags & AUTH] | crc u32 (CRC-32C over everything before it)

Width choices (written down in docs/PROTOCOL.md as well):

- ``version`` u8: one byte is plenty for additive evolution; it is checked *after* the CRC.
- ``type`` u8 and ``flags`` u8: a handful of each exist; unknown values are refused, never guessed.
- ``epoch`` u32: a random boot epoch; 2^32 values make an accidental repeat across reboots negligible.
- ``seq`` u32: at 115200 baud a link carries at most ~4,600 minimal frames/s; a 16-bit counter would
  wrap in ~14 s, letting a delayed duplicate alias a fresh number. 32 bits wrap after ~10 days of
  saturation, and the window uses RFC 1982 arithmetic anyway, so wrap is correct, just rare.
- ``length`` u16: the payload limit is ``MAX_PAYLOAD`` (512); u8 could not hold it.
- ``crc`` u32: CRC-32C (Castagnoli), Hamming distance 6 up to 5,243 bits; the longest frame
  (13 + 512 + 8 + 4 bytes = 4,296 bits) is inside that, so any 5 bit errors are detected.

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

import struct
from collections import Counter, deque
from dataclasses import dataclass
from enum import IntEnum, IntFlag

import construct as cs
import crcmod.predefined

from idemlink.protocol import cobs
from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table

PROTOCOL_VERSION = 1
MAX_PAYLOAD = 512
AUTH_TAG_LEN = 8
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
    AUTH = 0x80  #: reserved: an 8-byte truncated MAC trailer follows the payload


KNOWN_FLAGS = Flags.RETRANSMIT | Flags.REPLAY
"""Flags this version accepts. AUTH is declared (layout reserved) but not yet accepted."""

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
            "payload" / cs.Bytes(cs.this.header.length),
            "auth_tag" / cs.If(cs.this.header.flags & Flags.AUTH, cs.Bytes(AUTH_TAG_LEN)),
        )
    ),
    "crc" / cs.Checksum(cs.Int32ul, crc32c, cs.this.body.data),
    cs.Terminated,
)
"""The whole frame (before COBS), with its CRC-32C trailer."""

HEADER_LEN: int = HEADER.sizeof()
CRC_LEN = 4
MIN_FRAME = HEADER_LEN + CRC_LEN
MAX_FRAME = HEADER_LEN + MAX_PAYLOAD + AUTH_TAG_LEN + CRC_LEN
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


@dataclass(slots=True)
class Frame:
    """A decoded, CRC-checked, version/type/flags-checked frame (treat as immutable; not frozen
    only because frozen dataclasses cost ~1 µs per construction on the hot path)."""

    type: FrameType
    flags: Flags
    epoch: int
    seq: int
    payload: bytes
    version: int = PROTOCOL_VERSION

    def encode(self) -> bytes:
        """Wire bytes: ``00 cobs(frame) 00``."""
        return encode_frame(self.type, self.seq, self.epoch, self.payload, self.flags)


class DecodeErrorKind(IntEnum):
    """Typed decoder errors (each counted in ``FrameDecoder.counters``)."""

    BAD_CRC = 1
    OVERSIZE = 2
    UNKNOWN_VERSION = 3
    UNKNOWN_TYPE = 4
    UNKNOWN_FLAGS = 5
    MALFORMED = 6  #: not valid COBS, shorter than a header, or length field disagrees


@dataclass(frozen=True, slots=True)
class DecodeError:
    """A refused frame. ``detail`` says why, for logs and the monitor."""

    kind: DecodeErrorKind
    detail: str


def encode_frame(
    ftype: int, seq: int, epoch: int, payload: bytes = b"", flags: int = 0
) -> bytes:
    """Build wire bytes for one frame (fast path; agrees with ``FRAME.build``)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds MAX_PAYLOAD={MAX_PAYLOAD}")
    raw = _HEADER_STRUCT.pack(PROTOCOL_VERSION, ftype, flags, epoch, seq, len(payload)) + payload
    raw += _CRC_STRUCT.pack(crc32c(raw))
    return b"\x00" + cobs.encode(raw) + b"\x00"


def build_raw(
    ftype: int, seq: int, epoch: int, payload: bytes = b"", flags: int = 0,
    version: int = PROTOCOL_VERSION, auth_tag: bytes | None = None,
) -> bytes:
    """Build an un-delimited frame through the construct declaration (reference path)."""
    body = {
        "header": {
            "version": version, "type": ftype, "flags": flags,
            "epoch": epoch, "seq": seq, "length": len(payload),
        },
        "payload": payload,
        "auth_tag": auth_tag,
    }
    return bytes(FRAME.build({"body": {"value": body}, "crc": None}))


_TYPES: dict[int, FrameType] = {int(t): t for t in FrameType}
_UNKNOWN_FLAGS = 0xFF & ~int(KNOWN_FLAGS)
_FLAGS: dict[int, Flags] = {v: Flags(v) for v in range(256) if not v & ~KNOWN_FLAGS}


def parse_raw(raw: bytes) -> Frame | DecodeError:
    """Check and parse one un-delimited frame (fast path; agrees with ``FRAME.parse``)."""
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
    if HEADER_LEN + length + CRC_LEN != n:
        return DecodeError(
            DecodeErrorKind.MALFORMED, f"length field {length} disagrees with frame size {n}"
        )
    ft = _TYPES.get(ftype)
    if ft is None:
        return DecodeError(DecodeErrorKind.UNKNOWN_TYPE, f"type {ftype}")
    return Frame(ft, _FLAGS[flags], epoch, seq, raw[HEADER_LEN : n - CRC_LEN])


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
    """

    __slots__ = ("_buf", "_discarding", "_events", "counters")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._discarding = False
        self._events: deque[Frame | DecodeError] = deque()
        self.counters: Counter[str] = Counter()

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
                else parse_raw(raw)
            )
        if isinstance(err, DecodeError):
            self.counters[err.kind.name] += 1
        else:
            self.counters["FRAMES"] += 1
        return err


def decode_frames(data: bytes | bytearray | memoryview) -> list[Frame | DecodeError]:
    """Every event a fresh ``FrameDecoder`` finds in ``data`` taken whole (a capture, one answer
    in a test); a streaming reader keeps its own decoder instead."""
    decoder = FrameDecoder()
    decoder.receive_data(data)
    return list(iter(decoder.next_event, None))


def contract_section() -> ContractSection:
    offs = header_offsets()
    defines = [
        CDefine("IDL_PROTOCOL_VERSION", PROTOCOL_VERSION, "the version byte of this contract"),
        CDefine("IDL_SEQ_BITS", SEQ_BITS, "width of the sequence number"),
        CDefine("IDL_HEADER_LEN", HEADER_LEN, "header bytes before the payload"),
        CDefine("IDL_MAX_PAYLOAD", MAX_PAYLOAD, "largest payload"),
        CDefine("IDL_AUTH_TAG_LEN", AUTH_TAG_LEN, "truncated MAC trailer (flag AUTH, reserved)"),
        CDefine("IDL_CRC_LEN", CRC_LEN, "CRC-32C trailer"),
        CDefine("IDL_MAX_FRAME", MAX_FRAME, "largest frame before COBS"),
        CDefine("IDL_MAX_ENCODED", MAX_ENCODED, "largest COBS-encoded frame (decoder buffer)"),
        CDefine("IDL_CRC_POLY", f"0x{CRC_POLY:08X}u", "CRC-32C (Castagnoli), normal form"),
        CDefine("IDL_CRC_INIT", f"0x{CRC_INIT:08X}u", "initial value"),
        CDefine("IDL_CRC_XOROUT", f"0x{CRC_XOROUT:08X}u", "final xor"),
        CDefine("IDL_CRC_REFLECTED", 1 if CRC_REFLECTED else 0, "input and output reflected"),
        CDefine("IDL_CRC_CHECK", f"0x{CRC_CHECK:08X}u", "CRC of the ASCII bytes 123456789"),
        CDefine("IDL_KNOWN_FLAGS", f"0x{int(KNOWN_FLAGS):02X}u", "flags accepted by this version"),
    ]
    for name, (off, size) in offs.items():
        defines.append(CDefine(f"IDL_OFF_{name.upper()}", off, f"offset of {name}"))
        defines.append(CDefine(f"IDL_SIZE_{name.upper()}", size, f"size of {name}"))
    rows = [[name, off, size, "u" + str(8 * size) + (" LE" if size > 1 else "")]
            for name, (off, size) in offs.items()]
    rows.append(["payload", HEADER_LEN, "length", "bytes"])
    rows.append(["auth_tag", "after payload", f"{AUTH_TAG_LEN} if flags & AUTH", "bytes (reserved)"])
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
            ["bit", "flag", "accepted in this version"],
            [[f"0x{int(f):02X}", f.name, "yes" if f & KNOWN_FLAGS else "no (reserved)"]
             for f in (Flags.RETRANSMIT, Flags.REPLAY, Flags.AUTH)],
        )
    )
    return ContractSection(
        name="frame",
        defines=defines,
        enums=[
            CEnum("idl_frame_type_t", "IDL_FT", FrameType, "frame types"),
            CEnum("idl_flags_t", "IDL_FLAG", Flags, "header flag bits"),
            CEnum("idl_decode_error_t", "IDL_DECODE", DecodeErrorKind, "decoder errors"),
        ],
        markdown=md,
        data={
            "version": PROTOCOL_VERSION,
            "header": {k: list(v) for k, v in offs.items()},
            "max_payload": MAX_PAYLOAD,
            "auth_tag_len": AUTH_TAG_LEN,
            "crc": [CRC_NAME, CRC_POLY, CRC_INIT, CRC_XOROUT, CRC_REFLECTED],
            "types": {t.name: t.value for t in FrameType},
            "flags": {f.name: int(f) for f in (Flags.RETRANSMIT, Flags.REPLAY, Flags.AUTH)},
        },
    )
