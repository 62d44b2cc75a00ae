"""The oracle's own reading of the wire: what a unit the line delivered says, decoded without the
code under test.

Contract: ``read_frame(unit)`` takes the bytes between two 0x00 delimiters, as the link
emulator's delivery record hands them (``idemlink.device_sim.link.DeliveryLog``), and returns the
``WireFrame`` a receiver would accept — COBS undone, CRC-32C checked, version 1, known type and
flags, a length field that agrees — or None for anything a receiver drops (noise, a corrupted or
truncated frame). ``answer_outcome`` says which of the four outcomes an answer means, from the
status byte (``WIRE_STATUS``) and, for status OK, the answer PDU (``pdu_outcome``).

Everything here is a second, deliberately independent reading of docs/PROTOCOL.md: plain
``struct``, a table-driven CRC-32C, a dozen lines of COBS. It imports nothing of idemlink's (the
frame codec, the status table and the Modbus classifier it checks live in ``idemlink.protocol``,
which the host and the device share); a test compares ``WIRE_STATUS`` with the protocol's table,
so a change there must be mirrored here on purpose.

Why a module of its own: the oracle's model of the registers changes with the register
semantics, this with the wire format; neither reason touches the other.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VERSION = 1
HELLO, HELLO_REPLY, REQUEST, RESPONSE = 1, 2, 3, 4
RETRANSMIT, REPLAY, ADDRESSED = 0x01, 0x02, 0x04
AUTH_LONG, AUTH = 0x40, 0x80  #: a MAC tag of 16 / 8 bytes after the payload (issue 23)
KNOWN_FLAGS = RETRANSMIT | REPLAY | ADDRESSED
FIRST_CONTRACT_FLAGS = RETRANSMIT | REPLAY  #: what a receiver of the first contract knows
SIGNED_FLAGS = KNOWN_FLAGS | AUTH | AUTH_LONG  #: a reader of authenticated frames (the soak's)
TAG_LEN = 8
BROADCAST = 0  #: the address every device on a bus hears and none answers
MAX_ADDRESS = 247  #: Modbus's range; 248..255 are refused
_HEADER = struct.Struct("<BBBIIH")  # version, type, flags, epoch, seq, payload length
_CRC_LEN = 4

STATUS_OK, EPOCH_MISMATCH = 0x00, 0x10
IDEMPOTENCY_CONFLICT, ANSWER_EVICTED = 0x11, 0x21

#: The status byte of a RESPONSE: its name and the outcome it means. Status OK is refined by the
#: answer PDU (``pdu_outcome``); a status not listed here means UNKNOWN (a newer device's code).
WIRE_STATUS: dict[int, tuple[str, str]] = {
    STATUS_OK: ("OK", "OK"),
    EPOCH_MISMATCH: ("EPOCH_MISMATCH", "NOT_EXECUTED"),
    IDEMPOTENCY_CONFLICT: ("IDEMPOTENCY_CONFLICT", "NOT_EXECUTED"),
    0x12: ("GUARD_FAILED", "NOT_EXECUTED"),
    0x13: ("BUSY", "NOT_EXECUTED"),
    0x14: ("AUTHENTICATION_REQUIRED", "NOT_EXECUTED"),
    0x20: ("TOO_OLD", "UNKNOWN"),
    ANSWER_EVICTED: ("ANSWER_EVICTED", "UNKNOWN"),
    0x30: ("UNSUPPORTED", "REJECTED"),
    0x31: ("MALFORMED_REQUEST", "REJECTED"),
    0x32: ("PAYLOAD_TOO_LARGE", "REJECTED"),
}

FC_WRITE_IF_GENERATION, FC_TRIGGER = 0x41, 0x42
EXC_FAILURE = 0x04
#: Trigger answer codes: accepted, running, done are OK; abnormal state and illegal value read
#: like the exceptions 04 and 03; any other code does not say whether the action started.
TRIGGER_CODE_OUTCOME: dict[int, str] = {0x0000: "OK", 0x0101: "OK", 0x0102: "OK",
                                        0xFF00: "UNKNOWN", 0xFF01: "REJECTED"}


def _crc_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # CRC-32C, reflected
        table.append(c)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli): init and final xor 0xFFFFFFFF, reflected."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def unstuff(unit: bytes) -> bytes | None:
    """COBS decoding of one delimiter-free unit; None if no encoder could have produced it."""
    out = bytearray()
    i, n = 0, len(unit)
    while i < n:
        code = unit[i]
        end = i + code
        if code == 0 or end > n:
            return None
        out += unit[i + 1:end]
        i = end
        if code != 0xFF and i < n:
            out.append(0)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class WireFrame:
    """A frame a receiver accepts."""

    type: int
    flags: int
    epoch: int
    seq: int
    payload: bytes
    address: int | None = None  #: the device address of an ADDRESSED frame (0: broadcast)
    tag: bytes | None = None  #: the MAC tag of an AUTH frame (read, not verified: no key here)


def read_frame(unit: bytes, known: int = KNOWN_FLAGS) -> WireFrame | None:
    """The frame in ``unit`` (the bytes between two delimiters), or None when a receiver would
    drop it (``known``: the flags it knows; ``FIRST_CONTRACT_FLAGS``: a receiver of the first
    contract, which drops addressed frames; ``SIGNED_FLAGS``: one that reads authenticated
    frames too — their tag is returned, not verified: the oracle holds no key)."""
    raw = unstuff(unit)
    if raw is None or len(raw) < _HEADER.size + _CRC_LEN:
        return None
    if crc32c(raw[:-_CRC_LEN]) != int.from_bytes(raw[-_CRC_LEN:], "little"):
        return None
    version, ftype, flags, epoch, seq, length = _HEADER.unpack_from(raw)
    start = _HEADER.size + (1 if flags & ADDRESSED else 0)  # the address byte, on a bus
    tag_len = (2 * TAG_LEN if flags & AUTH_LONG else TAG_LEN) if flags & AUTH else 0
    if (version != VERSION or ftype not in (HELLO, HELLO_REPLY, REQUEST, RESPONSE)
            or flags & ~known or (flags & AUTH_LONG and not flags & AUTH)
            or start + length + tag_len + _CRC_LEN != len(raw)):
        return None
    address = raw[_HEADER.size] if flags & ADDRESSED else None
    if address is not None and address > MAX_ADDRESS:
        return None  # 248..255: no device's address, refused
    end = start + length
    return WireFrame(ftype, flags, epoch, seq, raw[start:end], address,
                     raw[end:end + tag_len] if tag_len else None)


def pdu_outcome(request: bytes, response: bytes) -> str:
    """The outcome an executed answer PDU means for ``request``, read from its bytes alone."""
    if response[:1] and response[0] & 0x80:
        exc = response[1] if len(response) > 1 else EXC_FAILURE
        return "UNKNOWN" if exc == EXC_FAILURE else "REJECTED"
    fc = request[0] if request else -1
    if fc == FC_WRITE_IF_GENERATION and len(response) > 1 and response[1] != STATUS_OK:
        return WIRE_STATUS.get(response[1], ("", "UNKNOWN"))[1]
    if fc == FC_TRIGGER and len(response) == 5:
        return TRIGGER_CODE_OUTCOME.get(int.from_bytes(response[3:5], "big"), "UNKNOWN")
    return "OK"


def answer_outcome(request: bytes, status: int, pdu: bytes) -> str:
    """The outcome an answer (status byte and PDU) means for ``request``."""
    if status == STATUS_OK:
        return pdu_outcome(request, pdu)
    return WIRE_STATUS.get(status, ("", "UNKNOWN"))[1]


def carried_status(request: bytes, status: int, pdu: bytes) -> int:
    """The status an answer carries: its status byte, or for a conditional write answered OK
    the status inside its PDU (GUARD_FAILED)."""
    if status == STATUS_OK and request[:1] == bytes((FC_WRITE_IF_GENERATION,)) and len(pdu) > 1 \
            and not pdu[0] & 0x80:
        return pdu[1]
    return status


def status_name(status: int, replay: bool = False) -> str:
    """``OK``/``REPLAYED``, or the status's name (``0x..`` for one not in ``WIRE_STATUS``)."""
    if status == STATUS_OK and replay:
        return "REPLAYED"
    return WIRE_STATUS.get(status, (f"0x{status:02x}", ""))[0]
