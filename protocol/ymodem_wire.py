"""YMODEM wire format: control bytes, block framing and the block 0 file header.

Contract: pure functions, no I/O, no state.

- Control bytes and block sizes are declared once here (``YmodemByte``; ``contract_section`` in
  ``idemlink.protocol.ymodem`` exports them to C).
- ``build_block`` frames a payload (SOH/STX, number, complement, payload, CRC-16/XMODEM high byte
  first); ``decode_block`` checks a whole received frame (number complement and CRC) and returns
  its number and payload, or None.
- ``build_header`` writes block 0 as ``name NUL "size mtime(octal) mode(octal) 0"``, NUL padded,
  128 bytes when it fits, else 1024. ``parse_header`` reads one back under the size rule (see its
  docstring): the name only from inside the block (through ``check_name``), the metadata only
  from its area, a size cut by the block's end refused, "no metadata" only with proof.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import crcmod.predefined

from idemlink.protocol.ymodem_names import MAX_NAME_BYTES, NameRefusal, check_name

SOH = 0x01  #: 128-byte block
STX = 0x02  #: 1024-byte block
EOT = 0x04  #: end of file
ACK = 0x06
NAK = 0x15
CAN = 0x18  #: two in a row abort
CRC_REQUEST = 0x43  #: 'C': "send with CRC-16" / "send the next header"
CPMEOF = 0x1A  #: padding of the last block
BLOCK_SMALL = 128
BLOCK_LARGE = 1024
CAN_COUNT = 8  #: CAN bytes we send to abort (the peer needs two in a row)
REGULAR_FILE = 0o100000  #: S_IFREG, always sent with the mode (rb keeps padding without it)
NUDGE = 0x00  #: sent alone to end a receiver's wait-for-any-byte (see ``SenderConfig.nudge_after``)
#: In a 128-byte block 0 whose byte 125 is NUL, sz-family senders (lrzsz sb) put a block count in
#: bytes 126-127 ("a little goodie for IMP/KMD"): those two bytes are not metadata.
_SB_COUNT_AT = 126

crc16 = crcmod.predefined.mkCrcFun("xmodem")
"""CRC-16/XMODEM (poly 0x1021, init 0, not reflected); sent high byte first."""


class YmodemByte(enum.IntEnum):
    """Single control bytes on the wire."""

    SOH = SOH
    STX = STX
    EOT = EOT
    ACK = ACK
    NAK = NAK
    CAN = CAN
    C = CRC_REQUEST
    CPMEOF = CPMEOF


class HeaderRefusal(enum.Enum):
    """Why a block 0 was refused (besides the name)."""

    NAME_NOT_TERMINATED = "no NUL after the name inside block 0"
    BAD_SIZE = "declared size is not a plain decimal number"
    SIZE_CUT = "file information cut off by a long name: size unknown"
    TOO_LARGE = "declared size exceeds the receiver's limit"


_SIZE_RE = re.compile(rb"[0-9]{1,20}")
_OCTAL_RE = re.compile(rb"[0-7]{1,22}")


def parse_size(field_: bytes) -> int | None:
    """The size rule: 1..20 ASCII digits, nothing else. Returns None when not plain decimal."""
    return int(field_) if _SIZE_RE.fullmatch(field_) else None


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed block 0."""

    name: str
    size: int | None
    mtime: int | None
    mode: int | None


def parse_header(payload: bytes, max_name: int = MAX_NAME_BYTES) -> Header | NameRefusal | HeaderRefusal:
    """Parse a non-empty block 0 payload (``payload[0] != 0``).

    The metadata is read only from its *area*: after the name's NUL up to the block's end, except
    that in a 128-byte block whose byte 125 is NUL the last two bytes are not metadata (sb and the
    whole sz family write a block count there: "a little goodie for IMP/KMD"; they keep it off only
    when byte 125 is used). A metadata field counts only when a space or NUL follows it inside the
    area: a field running into the area's end is cut. A cut size is refused (``SIZE_CUT``: a
    truncated number would truncate the file); cut later fields (mtime, mode) are ignored.
    "No metadata" (size unknown) needs proof: an area of at least 2 bytes (room for one digit and
    its end) that is all NUL. A shorter area (the name's NUL at 125-127 in a 128-byte block: sb's
    125..127-character names), or an empty first field followed by other bytes, is ``SIZE_CUT``."""
    nul = payload.find(b"\x00")
    if nul < 0:
        return HeaderRefusal.NAME_NOT_TERMINATED
    name = check_name(payload[:nul], max_name)
    if isinstance(name, NameRefusal):
        return name
    area_end = len(payload)
    if len(payload) == BLOCK_SMALL and payload[_SB_COUNT_AT - 1] == 0:
        area_end = _SB_COUNT_AT  # 126-127: sb's block count, not metadata
    area = payload[nul + 1 : area_end]
    if len(area) < 2:
        return HeaderRefusal.SIZE_CUT  # no room for even "0" and its end: size cut or absent?
    end = area.find(b"\x00")
    meta = area[: end if end >= 0 else len(area)]
    if not meta:
        # no metadata only if nothing else stands in the area
        return Header(name, None, None, None) if not area.strip(b"\x00") else HeaderRefusal.SIZE_CUT
    fields = meta.split(b" ")
    if end < 0:
        fields.pop()  # the last field runs into the area's end: cut
        if not fields:
            return HeaderRefusal.SIZE_CUT
    size = parse_size(fields[0])
    if size is None:
        return HeaderRefusal.BAD_SIZE
    mtime = int(fields[1], 8) if len(fields) > 1 and _OCTAL_RE.fullmatch(fields[1]) else None
    mode = int(fields[2], 8) if len(fields) > 2 and _OCTAL_RE.fullmatch(fields[2]) else None
    return Header(name, size, mtime, mode)


def build_header(name: str, size: int, mtime: int, mode: int) -> tuple[int, bytes]:
    """Block 0 payload for a file: ``name NUL "size mtime(octal) mode(octal) 0"``, NUL padded;
    128 bytes when it fits, else 1024 (long names). Returns (block length, payload)."""
    meta = f"{size} {mtime:o} {(mode & 0o7777) | REGULAR_FILE:o} 0".encode("ascii")
    body = name.encode("utf-8") + b"\x00" + meta + b"\x00"
    if len(body) > BLOCK_LARGE:
        raise ValueError(f"name too long for block 0: {name!r}")
    length = BLOCK_SMALL if len(body) <= BLOCK_SMALL else BLOCK_LARGE
    return length, body.ljust(length, b"\x00")


def build_block(number: int, payload: bytes) -> bytes:
    """One framed block: SOH/STX, number, complement, payload, CRC high byte first."""
    lead = SOH if len(payload) == BLOCK_SMALL else STX
    if len(payload) not in (BLOCK_SMALL, BLOCK_LARGE):
        raise ValueError("payload must be 128 or 1024 bytes")
    n = number & 0xFF
    crc: int = crc16(payload)
    return bytes((lead, n, 0xFF - n)) + payload + crc.to_bytes(2, "big")




def decode_block(frame: bytes) -> tuple[int, bytes] | None:
    """``(number, payload)`` of a whole received frame (lead byte, number, complement, payload,
    CRC), or None when the complement or the CRC is wrong."""
    number, comp = frame[1], frame[2]
    if number ^ comp != 0xFF or crc16(frame[3:]) != 0:
        return None
    return number, frame[3:-2]
