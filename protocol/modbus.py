"""Modbus PDU codec and RTU framing (sans-I/O).

Contract:

- PDUs (function code + data, no unit id, no CRC) for FC03, FC04, FC06, FC16, exception responses
  (function | 0x80, code 01-04), and four functions from the user-defined range 65-72:

  * ``0x41 WRITE_IF_GENERATION``: ``gen:u16 addr:u16 count:u16 bytes:u8 values:u16*count`` — write
    these registers only if the configuration generation still equals ``gen``. Answer:
    ``status:u8 generation:u16``; status 0x00 (OK, the generation after the write) or 0x12
    (GUARD_FAILED = NOT_EXECUTED, nothing changed, the current generation). Bad requests get the
    same exceptions as FC16.
  * ``0x42 TRIGGER``: ``addr:u16 value:u16`` -> ``addr:u16 code:u16`` where ``code`` is a
    ``TriggerStatus`` (0, 0x0101, 0x0102, 0xFF01, 0xFF00). FC06 cannot carry the code back (its
    answer is an echo), so a framed host that needs it uses 0x42.
  * ``0x44 FILE_RECEIVE`` (framed only): ``[overwrite:u8]`` -> ``status:u8``; the device then
    hands its port to a YMODEM receive batch (device_sim/file_receive.py, docs/YMODEM.md).
  * ``0x45 FILE_INFO`` (framed only): ``len:u8 name:utf8*len`` -> ``status:u8 size:u32
    crc32c:u32`` of a committed file (status 0 present, 1 absent: size and CRC 0). Read-only, so
    a retry or a replay is harmless. The name follows YMODEM's receive rules
    (``idemlink.protocol.ymodem.check_name``); a refused name or a bad length is exception 03. Its codec is
    separate (``encode_file_info_request`` / ``decode_file_info_request``): ``decode_request``
    answers 01 for it, as for 0x44, so the register core (and the RTU face) never sees it.

- The answer rules a host applies, here once for every shell, the simulator and the C core's tests:
  ``answer_fits(request, answer)`` (same function or its exception, a write's echo, a read's byte
  count: an answer that does not fit belongs to another request); ``classify_answer(request,
  answer)`` (the outcome an OK answer's PDU means: a Modbus exception is REJECTED, or UNKNOWN for
  SERVER_DEVICE_FAILURE; a failed guard is NOT_EXECUTED; a TRIGGER code is classified through
  ``TRIGGER_CODE_EXCEPTION``, like the exception FC06 answers in the same case, and a code the
  contract does not define is UNKNOWN).
- ``may_have_effect(function)`` is the one rule of which requests can change the device's state: all
  but the reads (FC03, FC04) and FILE_INFO. A host blocks on an unanswered request only if it can.
- ``decode_request`` never returns a half-valid request: it raises a typed ``ModbusPduError``
  carrying the exception code to answer (short PDU / wrong byte count / trailing bytes / count 0 or
  over 125 (read) / 123 (write) -> 03; address + count past 0x10000 -> 02; unknown function -> 01).
- RTU: ``unit + PDU + CRC-16/MODBUS`` (little-endian CRC, crcmod's 'modbus'). ``RtuDecoder`` is a
  streaming decoder with one rule set (Modbus over serial line V1.02 2.5.1.1: a silence of t3.5
  ends a frame): a pause is real only when the time between two reads, less the second read's
  transmission time, reaches t3.5 (``rtu_frame_gap(baudrate)``; time is passed in); a frame is
  read at the head by its declared length and taken (or skipped, another slave's answer) when
  its CRC is right; a head that fails restarts parsing only at a real pause. See its docstring.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import crcmod.predefined

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from idemlink.protocol.outcome import (
    MODBUS_EXCEPTION_TABLE,
    ModbusException,
    Outcome,
    RemoteProtocolError,
    Status,
    known_status,
    status_info,
)
from idemlink.protocol.registers import TriggerStatus
from idemlink.protocol.ymodem import NameRefusal, check_name

MAX_READ_COUNT = 125
MAX_WRITE_COUNT = 123
MAX_CONDITIONAL_WRITE_COUNT = 122  # 1 + 2 + 2 + 2 + 1 + 2*122 = 252 <= 253 (max PDU)
MAX_PDU = 253
MAX_FILE_INFO_NAME = MAX_PDU - 2  #: name bytes in a 0x45 request (fc + length byte + name)
MAX_RTU_FRAME = 256
MIN_RTU_FRAME = 4  # unit + function + CRC
BROADCAST_UNIT = 0


class FunctionCode(IntEnum):
    READ_HOLDING_REGISTERS = 0x03
    READ_INPUT_REGISTERS = 0x04
    WRITE_SINGLE_REGISTER = 0x06
    WRITE_MULTIPLE_REGISTERS = 0x10
    WRITE_IF_GENERATION = 0x41  #: user-defined: conditional write guarded by the generation
    TRIGGER = 0x42  #: user-defined: trigger write answering the TriggerStatus code
    FILE_RECEIVE = 0x44  #: user-defined (framed only): switch the port to a YMODEM receive batch
    FILE_INFO = 0x45  #: user-defined (framed only): size and CRC-32C of a stored file


READ_ONLY_FUNCTIONS: frozenset[int] = frozenset({
    FunctionCode.READ_HOLDING_REGISTERS,
    FunctionCode.READ_INPUT_REGISTERS,
    FunctionCode.FILE_INFO,
})
"""Functions that never change the device's state (the register model has no read-to-clear)."""


def may_have_effect(function: int) -> bool:
    """Whether a request of ``function`` can change the device's state, so that an unanswered one
    leaves something to reconcile. Only the read-only functions above cannot; any other code,
    including one this stack does not know, is assumed to act."""
    return function not in READ_ONLY_FUNCTIONS


EXCEPTION_FLAG = 0x80


class FileInfoStatus(IntEnum):
    """First byte of a FILE_INFO answer."""

    PRESENT = 0x00
    ABSENT = 0x01


FILE_INFO_ANSWER_LENGTH = 10  #: fc + status:u8 + size:u32 + crc32c:u32


# ----------------------------------------------------------------------------------------- errors


class ModbusPduError(RemoteProtocolError):
    """A request PDU the peer should not have sent. ``exception`` is the code to answer with."""

    exception: ModbusException = ModbusException.ILLEGAL_DATA_VALUE

    def __init__(self, message: str, function: int) -> None:
        status = (Status.UNSUPPORTED if self.exception is ModbusException.ILLEGAL_FUNCTION
                  else Status.MALFORMED_REQUEST)
        super().__init__(message, status)
        self.function = function


class IllegalFunction(ModbusPduError):
    exception = ModbusException.ILLEGAL_FUNCTION


class ShortPdu(ModbusPduError):
    exception = ModbusException.ILLEGAL_DATA_VALUE


class TrailingBytes(ModbusPduError):
    exception = ModbusException.ILLEGAL_DATA_VALUE


class ByteCountMismatch(ModbusPduError):
    exception = ModbusException.ILLEGAL_DATA_VALUE


class QuantityOutOfRange(ModbusPduError):
    exception = ModbusException.ILLEGAL_DATA_VALUE


class AddressOverflow(ModbusPduError):
    exception = ModbusException.ILLEGAL_DATA_ADDRESS


class BadResponse(RemoteProtocolError):
    """A response PDU that cannot be parsed."""


class RtuFrameError(RemoteProtocolError):
    """An RTU frame that is too short or fails its CRC."""


# --------------------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class ReadRegisters:
    """FC03 (holding) or FC04 (input); both read the one flat map."""

    function: FunctionCode
    address: int
    count: int


@dataclass(frozen=True, slots=True)
class WriteSingleRegister:
    address: int
    value: int


@dataclass(frozen=True, slots=True)
class WriteMultipleRegisters:
    address: int
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WriteIfGeneration:
    generation: int
    address: int
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TriggerRequest:
    address: int
    value: int


@dataclass(frozen=True, slots=True)
class FileInfoRequest:
    """0x45: a stored file's name (one plain path component, see ``check_name``)."""

    name: str


Request = (ReadRegisters | WriteSingleRegister | WriteMultipleRegisters | WriteIfGeneration
           | TriggerRequest)


# -------------------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class ReadRegistersResponse:
    function: FunctionCode
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WriteSingleRegisterResponse:
    address: int
    value: int


@dataclass(frozen=True, slots=True)
class WriteMultipleRegistersResponse:
    address: int
    count: int


@dataclass(frozen=True, slots=True)
class WriteIfGenerationResponse:
    status: Status  #: OK or GUARD_FAILED (NOT_EXECUTED: nothing changed)
    generation: int  #: after the write (OK) or the current one (GUARD_FAILED)


@dataclass(frozen=True, slots=True)
class TriggerResponse:
    address: int
    code: int  #: a TriggerStatus value


@dataclass(frozen=True, slots=True)
class FileInfoResponse:
    status: FileInfoStatus
    size: int  #: bytes stored (0 when absent)
    crc32c: int  #: CRC-32C of the stored bytes (0 when absent)


@dataclass(frozen=True, slots=True)
class ExceptionResponse:
    function: int  #: the request's function code (without the 0x80 flag)
    exception: ModbusException


Response = (ReadRegistersResponse | WriteSingleRegisterResponse | WriteMultipleRegistersResponse
            | WriteIfGenerationResponse | TriggerResponse | FileInfoResponse | ExceptionResponse)


# ----------------------------------------------------------------------------------------- decode


def _u16s(data: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(data) // 2}H", data)


def _check_len(pdu: bytes, need: int, fc: int, exact: bool = True) -> None:
    if len(pdu) < need:
        raise ShortPdu(f"function 0x{fc:02X}: PDU of {len(pdu)} bytes, need {need}", fc)
    if exact and len(pdu) > need:
        raise TrailingBytes(f"function 0x{fc:02X}: {len(pdu) - need} trailing bytes", fc)


def _check_range(fc: int, address: int, count: int, limit: int) -> None:
    if not 1 <= count <= limit:
        raise QuantityOutOfRange(f"function 0x{fc:02X}: count {count} outside 1..{limit}", fc)
    if address + count > 0x10000:
        raise AddressOverflow(
            f"function 0x{fc:02X}: {count} registers from 0x{address:04X} pass 0xFFFF", fc)


def _decode_values(pdu: bytes, fc: int, head: int, count: int) -> tuple[int, ...]:
    """``pdu[head]`` is the byte count; the values follow."""
    _check_len(pdu, head + 1, fc, exact=False)
    byte_count = pdu[head]
    if byte_count != 2 * count:
        raise ByteCountMismatch(
            f"function 0x{fc:02X}: byte count {byte_count} for {count} registers", fc)
    _check_len(pdu, head + 1 + byte_count, fc)
    return _u16s(pdu[head + 1:])


def decode_request(pdu: bytes) -> Request:
    """Parse a request PDU; raise a ``ModbusPduError`` subclass for anything not well-formed."""
    if not pdu:
        raise ShortPdu("empty PDU", 0)
    fc = pdu[0]
    if fc in (FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS):
        _check_len(pdu, 5, fc)
        address, count = struct.unpack_from(">HH", pdu, 1)
        _check_range(fc, address, count, MAX_READ_COUNT)
        return ReadRegisters(FunctionCode(fc), address, count)
    if fc == FunctionCode.WRITE_SINGLE_REGISTER:
        _check_len(pdu, 5, fc)
        address, value = struct.unpack_from(">HH", pdu, 1)
        return WriteSingleRegister(address, value)
    if fc == FunctionCode.WRITE_MULTIPLE_REGISTERS:
        _check_len(pdu, 6, fc, exact=False)
        address, count = struct.unpack_from(">HH", pdu, 1)
        _check_range(fc, address, count, MAX_WRITE_COUNT)
        return WriteMultipleRegisters(address, _decode_values(pdu, fc, 5, count))
    if fc == FunctionCode.WRITE_IF_GENERATION:
        _check_len(pdu, 8, fc, exact=False)
        generation, address, count = struct.unpack_from(">HHH", pdu, 1)
        _check_range(fc, address, count, MAX_CONDITIONAL_WRITE_COUNT)
        return WriteIfGeneration(generation, address, _decode_values(pdu, fc, 7, count))
    if fc == FunctionCode.TRIGGER:
        _check_len(pdu, 5, fc)
        address, value = struct.unpack_from(">HH", pdu, 1)
        return TriggerRequest(address, value)
    raise IllegalFunction(f"function 0x{fc:02X} not supported", fc)


def decode_response(pdu: bytes) -> Response:
    """Parse a response PDU (host side)."""
    if len(pdu) < 2:
        raise BadResponse(f"response PDU of {len(pdu)} bytes")
    fc = pdu[0]
    try:
        if fc & EXCEPTION_FLAG:
            if len(pdu) != 2:
                raise BadResponse("exception response must be 2 bytes")
            return ExceptionResponse(fc & 0x7F, ModbusException(pdu[1]))
        if fc in (FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS):
            if pdu[1] % 2 or len(pdu) != 2 + pdu[1]:
                raise BadResponse("read response byte count does not match its length")
            return ReadRegistersResponse(FunctionCode(fc), _u16s(pdu[2:]))
        if len(pdu) == 5 and fc == FunctionCode.WRITE_SINGLE_REGISTER:
            return WriteSingleRegisterResponse(*struct.unpack_from(">HH", pdu, 1))
        if len(pdu) == 5 and fc == FunctionCode.WRITE_MULTIPLE_REGISTERS:
            return WriteMultipleRegistersResponse(*struct.unpack_from(">HH", pdu, 1))
        if len(pdu) == 4 and fc == FunctionCode.WRITE_IF_GENERATION:
            return WriteIfGenerationResponse(Status(pdu[1]), struct.unpack_from(">H", pdu, 2)[0])
        if len(pdu) == 5 and fc == FunctionCode.TRIGGER:
            return TriggerResponse(*struct.unpack_from(">HH", pdu, 1))
        if len(pdu) == FILE_INFO_ANSWER_LENGTH and fc == FunctionCode.FILE_INFO:
            status, size, crc = struct.unpack_from(">BII", pdu, 1)
            return FileInfoResponse(FileInfoStatus(status), size, crc)
    except ValueError as exc:  # unknown exception or status code
        raise BadResponse(str(exc)) from None
    raise BadResponse(f"cannot parse a 0x{fc:02X} response of {len(pdu)} bytes")


# ----------------------------------------------------------------------------------------- encode


def _values(values: tuple[int, ...]) -> bytes:
    return bytes([2 * len(values)]) + struct.pack(f">{len(values)}H", *values)


def encode_request(req: Request) -> bytes:
    """Build a request PDU. Raises ``struct.error``/``ValueError`` on out-of-range fields."""
    match req:
        case ReadRegisters(function, address, count):
            return struct.pack(">BHH", function, address, count)
        case WriteSingleRegister(address, value):
            return struct.pack(">BHH", FunctionCode.WRITE_SINGLE_REGISTER, address, value)
        case WriteMultipleRegisters(address, values):
            return (struct.pack(">BHH", FunctionCode.WRITE_MULTIPLE_REGISTERS, address,
                                len(values)) + _values(values))
        case WriteIfGeneration(generation, address, values):
            return (struct.pack(">BHHH", FunctionCode.WRITE_IF_GENERATION, generation, address,
                                len(values)) + _values(values))
        case TriggerRequest(address, value):
            return struct.pack(">BHH", FunctionCode.TRIGGER, address, value)
    raise TypeError(f"not a request: {req!r}")  # pragma: no cover


def encode_response(resp: Response) -> bytes:
    match resp:
        case ReadRegistersResponse(function, values):
            return bytes([function]) + _values(values)
        case WriteSingleRegisterResponse(address, value):
            return struct.pack(">BHH", FunctionCode.WRITE_SINGLE_REGISTER, address, value)
        case WriteMultipleRegistersResponse(address, count):
            return struct.pack(">BHH", FunctionCode.WRITE_MULTIPLE_REGISTERS, address, count)
        case WriteIfGenerationResponse(status, generation):
            return struct.pack(">BBH", FunctionCode.WRITE_IF_GENERATION, status, generation)
        case TriggerResponse(address, code):
            return struct.pack(">BHH", FunctionCode.TRIGGER, address, code)
        case FileInfoResponse(status, size, crc):
            return struct.pack(">BBII", FunctionCode.FILE_INFO, status, size, crc)
        case ExceptionResponse(function, exception):
            return bytes([(function | EXCEPTION_FLAG) & 0xFF, exception])
    raise TypeError(f"not a response: {resp!r}")  # pragma: no cover


def encode_file_info_request(req: FileInfoRequest) -> bytes:
    """``0x45 len:u8 name``. Raises ``ValueError`` for a name the device would refuse."""
    raw = req.name.encode("utf-8")
    checked = check_name(raw, MAX_FILE_INFO_NAME)
    if isinstance(checked, NameRefusal) or checked != req.name:
        why = checked.value if isinstance(checked, NameRefusal) else "not a plain file name"
        raise ValueError(f"file name {req.name!r} refused: {why}")
    return bytes([FunctionCode.FILE_INFO, len(raw)]) + raw


def decode_file_info_request(pdu: bytes) -> FileInfoRequest:
    """Parse a 0x45 request; ``ModbusPduError`` (exception 03) for a bad length or name."""
    fc = FunctionCode.FILE_INFO
    if pdu[:1] != bytes([fc]):
        raise IllegalFunction(f"not a FILE_INFO request: {pdu[:1].hex()}", pdu[0] if pdu else 0)
    _check_len(pdu, 2, fc, exact=False)
    _check_len(pdu, 2 + pdu[1], fc)
    checked = check_name(pdu[2:], MAX_FILE_INFO_NAME)
    if isinstance(checked, NameRefusal):
        raise QuantityOutOfRange(f"function 0x{fc:02X}: name refused: {checked.value}", fc)
    return FileInfoRequest(checked)


def exception_pdu(function: int, exception: ModbusException) -> bytes:
    return encode_response(ExceptionResponse(function, exception))


# ------------------------------------------------------------------------------- answer rules

TRIGGER_CODE_EXCEPTION: dict[TriggerStatus, ModbusException] = {
    TriggerStatus.ILLEGAL_VALUE: ModbusException.ILLEGAL_DATA_VALUE,
    TriggerStatus.ABNORMAL_STATE: ModbusException.SERVER_DEVICE_FAILURE,
}
"""TRIGGER codes that mean "nothing started", and the exception FC06 answers in the same case
(the device raises it for an FC06/FC16 trigger write; a host classifies a 0x42 code through it)."""
_TRIGGER_CODES = frozenset(int(c) for c in TriggerStatus)
"""Every TRIGGER code the contract defines; any other answer is UNKNOWN."""


def answer_fits(request_pdu: bytes, pdu: bytes) -> bool:
    """Whether an OK answer's PDU can be the answer to ``request_pdu``: the same function (or its
    exception), a write's echo, a read's byte count. False means the answer belongs to another
    request that travelled under the same number (e.g. a delayed frame of a host process that
    died); True is necessary, not sufficient."""
    if not request_pdu:
        return True  # nothing to compare with (the device answers an empty PDU with an exception)
    if not pdu:
        return False
    fc = request_pdu[0]
    if pdu[0] == fc | EXCEPTION_FLAG:
        return len(pdu) == 2
    if pdu[0] != fc:
        return False
    if (fc in (FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS)
            and len(request_pdu) == 5):
        count = int.from_bytes(request_pdu[3:5], "big")
        return len(pdu) >= 2 and pdu[1] == 2 * count and len(pdu) == 2 + 2 * count
    if fc == FunctionCode.WRITE_SINGLE_REGISTER:
        return pdu == request_pdu
    if fc == FunctionCode.WRITE_MULTIPLE_REGISTERS:
        return pdu[1:5] == request_pdu[1:5] and len(pdu) == 5
    if fc == FunctionCode.TRIGGER:
        return pdu[1:3] == request_pdu[1:3] and len(pdu) == 5
    if fc == FunctionCode.FILE_INFO:
        return len(pdu) == FILE_INFO_ANSWER_LENGTH and pdu[1] in set(FileInfoStatus)
    return True


def classify_answer(request_pdu: bytes, pdu: bytes,
                    ) -> tuple[Outcome, Status | None, ModbusException | None]:
    """The outcome, status and exception an OK answer's PDU means for ``request_pdu`` (one rule
    for every host shell; see the module contract)."""
    if pdu and pdu[0] & EXCEPTION_FLAG:
        try:
            exc = ModbusException(pdu[1]) if len(pdu) > 1 else ModbusException.SERVER_DEVICE_FAILURE
        except ValueError:
            exc = ModbusException.SERVER_DEVICE_FAILURE
        return MODBUS_EXCEPTION_TABLE[exc].outcome, None, exc
    fc = request_pdu[0] if request_pdu else None
    if fc == FunctionCode.WRITE_IF_GENERATION and len(pdu) > 1:
        inner = pdu[1]
        if inner != Status.OK:
            return status_info(inner).outcome, known_status(inner), None
    if fc == FunctionCode.TRIGGER and len(pdu) == 5:
        code = int.from_bytes(pdu[3:5], "big")
        if code in TRIGGER_CODE_EXCEPTION:
            exc = TRIGGER_CODE_EXCEPTION[TriggerStatus(code)]
            return MODBUS_EXCEPTION_TABLE[exc].outcome, None, exc
        if code not in _TRIGGER_CODES:
            # a code this contract does not define: whether the action started is not known
            return Outcome.UNKNOWN, Status.OK, None
    return Outcome.OK, Status.OK, None


# -------------------------------------------------------------------------------------------- RTU

_crc16: Callable[[bytes], int] = crcmod.predefined.mkCrcFun("modbus")


def crc16(data: bytes) -> int:
    """CRC-16/MODBUS (poly 0x8005 reflected, init 0xFFFF)."""
    return _crc16(data)


@dataclass(frozen=True, slots=True)
class RtuFrame:
    unit: int
    pdu: bytes


def encode_rtu(unit: int, pdu: bytes) -> bytes:
    """``unit + pdu + CRC`` (CRC low byte first)."""
    if not 0 <= unit <= 247:
        raise ValueError(f"unit id {unit} outside 0..247")
    body = bytes([unit]) + pdu
    return body + crc16(body).to_bytes(2, "little")


def decode_rtu(frame: bytes) -> RtuFrame:
    """Check one whole RTU frame's CRC and split it."""
    if len(frame) < MIN_RTU_FRAME:
        raise RtuFrameError(f"RTU frame of {len(frame)} bytes")
    if crc16(frame[:-2]) != int.from_bytes(frame[-2:], "little"):
        raise RtuFrameError("RTU CRC mismatch")
    return RtuFrame(frame[0], bytes(frame[1:-2]))


NEED_MORE = -1  #: the length is not known yet: more bytes needed
UNKNOWN_LENGTH = -2  #: the function code does not tell the length

#: Requests with a fixed frame length (unit + fc + 4 + CRC), including standard codes that the
#: device does not support, so that it can answer them with exception 01 at once.
_FIXED_REQUEST = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, FunctionCode.TRIGGER}
#: Requests whose length is ``index of byte count + 1 + byte count + CRC``.
_COUNTED_REQUEST = {0x0F: 6, 0x10: 6, 0x17: 10, FunctionCode.WRITE_IF_GENERATION: 8}


def request_frame_length(buf: bytes | bytearray) -> int:
    """Expected length of the RTU request frame at the start of ``buf``."""
    if len(buf) < 2:
        return NEED_MORE
    fc = buf[1]
    if fc in _FIXED_REQUEST:
        return 8
    if fc in _COUNTED_REQUEST:
        at = _COUNTED_REQUEST[fc]
        return buf[at] + at + 3 if len(buf) > at else NEED_MORE
    return UNKNOWN_LENGTH


def response_frame_length(buf: bytes | bytearray) -> int:
    """Expected length of the RTU response frame at the start of ``buf`` (host side)."""
    if len(buf) < 2:
        return NEED_MORE
    fc = buf[1]
    if fc & EXCEPTION_FLAG:
        return 5
    if fc in (0x01, 0x02, 0x03, 0x04, 0x17):
        return buf[2] + 5 if len(buf) > 2 else NEED_MORE
    if fc in (0x05, 0x06, 0x0F, 0x10, FunctionCode.TRIGGER):
        return 8
    if fc == FunctionCode.WRITE_IF_GENERATION:
        return 7
    return UNKNOWN_LENGTH


def _request_head_plausible(buf: bytes | bytearray) -> bool:
    """Could the head of ``buf`` still become a well-formed request? Counted requests carry
    their byte count twice (quantity and byte count), which another slave's answer almost never
    matches; fixed-length requests and heads too short to tell stay plausible."""
    if len(buf) < 2:
        return True
    fc = buf[1]
    if fc in (0x10, FunctionCode.WRITE_IF_GENERATION, 0x0F, 0x17):
        at = _COUNTED_REQUEST[fc]
        if len(buf) <= at:
            return True
        quantity = int.from_bytes(buf[at - 2:at], "big")
        need = (quantity + 7) // 8 if fc == 0x0F else 2 * quantity
        return bool(buf[at] == need and quantity)
    return fc in _FIXED_REQUEST


FRAME_GAP_FAST = 0.00175  #: t3.5 above 19200 Bd
DEFAULT_BAUDRATE = 115200  #: the simulator's default line speed (also used for a pty)
CHAR_BITS = 11  #: start + 8 data + parity (or a second stop bit) + stop
_HEAD_BYTES = 16  #: every length function and head check looks at fewer bytes than this


def _answer_head_plausible(buf: bytes | bytearray) -> bool:
    """Could the head of ``buf`` be a well-formed answer? Register reads carry an even byte count
    of 2..250, bit reads 1..250; the other answers have a fixed length."""
    if len(buf) < 3:
        return True
    fc = buf[1]
    if fc in (0x03, 0x04, 0x17):
        return 2 <= buf[2] <= 250 and buf[2] % 2 == 0
    if fc in (0x01, 0x02):
        return 1 <= buf[2] <= 250
    return True


def _any_head(buf: bytes | bytearray) -> bool:
    return True


def _plausibility(length_of: Callable[[bytes | bytearray], int] | None,
                  ) -> Callable[[bytes | bytearray], bool]:
    """The head check that goes with a length function (none for a caller's own)."""
    if length_of is request_frame_length:
        return _request_head_plausible
    if length_of is response_frame_length:
        return _answer_head_plausible
    return _any_head


def rtu_frame_gap(baudrate: int | None) -> float:
    """Modbus over serial line V1.02 2.5.1.1: t3.5 is 3.5 character times (11 bits each) up to
    19200 Bd and a fixed 1.75 ms above; ``None`` (a pty, an unknown line) gives 1.75 ms."""
    if baudrate is None or baudrate > 19200:
        return FRAME_GAP_FAST
    if baudrate <= 0:
        raise ValueError(f"baud rate {baudrate} must be positive")
    return 3.5 * CHAR_BITS / baudrate


_WAIT = -3  #: a view whose length is not reached yet (and no pause cut it)
_WAIT_PAUSE = -4  #: a view of unknown length waiting for the next pause
_DEAD = 0  #: a view that cannot be a frame (implausible, unknown size, or cut by a pause)


class RtuDecoder:
    """Streaming RTU decoder: frames end at a silence of t3.5 (Modbus over serial line V1.02
    2.5.1.1) or at their declared length; nothing is parsed from a position that is neither.

    The project's sans-I/O shape (docs/ARCHITECTURE.md): ``receive_data(data, now)`` with ``now``
    the time the read returned; ``tick(now)`` when a read returned nothing; the command ``gap()``
    when the line has certainly been silent; ``next_event()`` returns the next CRC-valid frame
    (any unit; the caller filters) or None. The rules:

    1. Real pauses only. A read's bytes are contiguous on the line, and the line was silent
       before them only if ``(now - last_rx) - len(data) * char_time >= t3.5`` (``char_time`` =
       11 bits / ``baudrate``, t3.5 = ``rtu_frame_gap(baudrate)``). ``tick(now)`` is a pause
       only after ``resync_silence`` (0.1 s) without bytes. Bytes received without ``now`` are
       contiguous (only ``gap``/``tick`` mark pauses). The first byte ever starts a frame.
    2. The head (the first byte after a pause or after the previous frame) is read by declared
       length: as a request (``length_of``) and, unless it is addressed to ``unit``, as another
       slave's answer (``other_length_of``). A function code that tells no length is framed by
       the next pause. A view is dead when it is implausible, longer than 256 bytes, or still
       incomplete when a pause is recorded after the head.
    3. A complete CRC-valid request view is returned; a complete CRC-valid answer view is
       skipped whole (``skipped``), once no request view is still waiting for a declared length.
       Parsing goes on right after the frame.
    4. Otherwise, while a view waits for its length, the decoder waits. When no view is left,
       the head failed: parsing restarts at the first pause after the head's start; if none is
       recorded, every byte is dropped until the next pause (``discarded`` counts them).
       A burst shorter than 4 bytes thus ends at the pause that follows it.
    5. A pause is only known at a read's boundary, but it may lie anywhere in that read (a
       late read returns bytes from before and after it together). So a frame that starts at a
       head restarted after a failure, or that runs across a recorded pause (a host late in
       the middle of a frame), counts only if it and the CRC-valid frames right after it end
       where a read ended: no pause can hide inside them; a valid view that stays before the
       pause wins over one that runs across it. The next head is sure again.

    Consequence (limit): a frame that follows an unknown-length or damaged frame without a
    t3.5 pause is lost with it (the spec gives no boundary between them). Cost per read is
    O(read size) plus at most one CRC per view length of a head.
    """

    def __init__(self, length_of: Callable[[bytes | bytearray], int] = request_frame_length,
                 baudrate: int = DEFAULT_BAUDRATE,
                 other_length_of: Callable[[bytes | bytearray], int] | None = None,
                 unit: int | None = None, resync_silence: float = 0.1) -> None:
        if baudrate <= 0:
            raise ValueError(f"baud rate {baudrate} must be positive")
        self._length_of = length_of
        if other_length_of is None and length_of is request_frame_length:
            other_length_of = response_frame_length
        self._other_length_of = other_length_of
        self._head_ok = _plausibility(length_of)
        self._other_head_ok = _plausibility(other_length_of)
        self.unit = unit
        self.baudrate = baudrate
        self.char_time = CHAR_BITS / baudrate
        self.frame_gap = rtu_frame_gap(baudrate)
        self.resync_silence = resync_silence
        self._buf = bytearray()
        self._consumed = 0  #: stream offset of ``_buf[0]``
        self._pauses: list[int] = []  #: stream offsets (> _consumed) after a real pause
        self._read_ends: list[int] = []  #: stream offsets (> _consumed) where a read ended
        self._silent = True  #: the line is silent after the last byte (start: idle line)
        self._hunting = False  #: dropping bytes until the next pause
        self._unsure = False  #: the head starts at a pause after a failure (rule 5)
        self._last_rx: float | None = None
        self._crc_cache: dict[tuple[int, int], bool] = {}  #: (offset, length) -> CRC ok
        self.discarded = 0
        self.skipped = 0

    # -------------------------------------------------------------------------------- input

    def receive_data(self, data: bytes, now: float | None = None) -> None:
        """Take the bytes one read returned (``now``: when it returned; frames wait in
        ``next_event``)."""
        if not data:
            return
        if self._silent or (
                now is not None and self._last_rx is not None
                and (now - self._last_rx) - len(data) * self.char_time >= self.frame_gap):
            self._pause_here()
        self._silent = False
        if now is not None:
            self._last_rx = now
        if self._hunting:
            self.discarded += len(data)
            return
        self._buf += data
        self._read_ends.append(self._consumed + len(self._buf))

    def gap(self) -> None:
        """The line has been silent (at least t3.5) since the last byte fed."""
        self._silent = True
        self._pause_here()

    def tick(self, now: float) -> None:
        """Nothing arrived by ``now``. A read that returns late may still hold bytes that were
        on the line meanwhile, so an empty read is a pause only after ``resync_silence`` (the
        last resort; the next read's own timing says whether the line paused)."""
        if self._last_rx is None or now - self._last_rx >= self.resync_silence:
            self.gap()

    @property
    def pending(self) -> int:
        return len(self._buf)

    # ------------------------------------------------------------------------------ framing

    def _pause_here(self) -> None:
        """A real pause after the bytes received so far."""
        if self._hunting:
            self._hunting = False
            self._unsure = True
        end = self._consumed + len(self._buf)
        if self._buf and (not self._pauses or self._pauses[-1] != end):
            self._pauses.append(end)

    def _drop(self, n: int, *, junk: bool) -> None:
        del self._buf[:n]
        self._consumed += n
        self._crc_cache.clear()
        if junk:
            self.discarded += n
        while self._pauses and self._pauses[0] <= self._consumed:
            self._pauses.pop(0)
        while self._read_ends and self._read_ends[0] <= self._consumed:
            self._read_ends.pop(0)

    def _fail(self) -> None:
        """The head is no frame: restart at the first pause after its start, or hunt for one."""
        self._unsure = True
        if self._pauses:
            self._drop(self._pauses[0] - self._consumed, junk=True)
        else:
            self._drop(len(self._buf), junk=True)
            self._hunting = not self._silent

    def _view(self, n: int, size: int, cut: bool) -> int:
        """Classify a declared length ``n`` against the ``size`` bytes buffered: complete (its
        CRC and rule 5 decide), waiting, or dead (incomplete and cut by a pause)."""
        if n == NEED_MORE or n > size:
            return _DEAD if cut or n > MAX_RTU_FRAME else _WAIT
        return n if n >= MIN_RTU_FRAME else _DEAD

    def _views(self, at: int = 0) -> tuple[int, int]:
        """(request view, answer view) of the frame at buffer offset ``at`` (the head: 0): a
        length, ``_WAIT``, ``_WAIT_PAUSE`` or ``_DEAD``. Pauses only bound the head."""
        cut = bool(self._pauses) and at == 0
        limit = self._pauses[0] - self._consumed if cut else len(self._buf)
        size = len(self._buf) - at
        head = bytes(self._buf[at:at + _HEAD_BYTES])
        n = self._length_of(head)
        if n == UNKNOWN_LENGTH:  # framed by the next pause
            if at:
                req = _DEAD
            elif cut:
                req = limit if MIN_RTU_FRAME <= limit <= MAX_RTU_FRAME else _DEAD
            else:
                req = _DEAD if limit > MAX_RTU_FRAME else _WAIT_PAUSE
        else:
            req = self._view(n, size, cut) if self._head_ok(head) else _DEAD
        ans = _DEAD
        if self._other_length_of is not None and head[0] != self.unit:
            m = self._other_length_of(head)
            if m != UNKNOWN_LENGTH and self._other_head_ok(head):
                ans = self._view(m, size, cut)
        return req, ans

    def _crc_ok(self, at: int, n: int) -> bool:
        if (at, n) not in self._crc_cache:
            self._crc_cache[at, n] = crc16(bytes(self._buf[at:at + n - 2])) == int.from_bytes(
                self._buf[at + n - 2:at + n], "little")
        return self._crc_cache[at, n]

    def _tiles_a_read(self, at: int) -> bool:
        """Rule 5: from buffer offset ``at``, CRC-valid frames back to back reach a read's end."""
        while True:
            i = bisect.bisect_left(self._read_ends, self._consumed + at)
            if i < len(self._read_ends) and self._read_ends[i] == self._consumed + at:
                return True
            n = next((v for v in self._views(at) if v > 0 and self._crc_ok(at, v)), 0)
            if not n:
                return False
            at += n

    def _across(self, n: int) -> bool:
        """Do the head's first ``n`` bytes run across a recorded pause?"""
        return bool(self._pauses) and self._pauses[0] - self._consumed < n

    def _valid(self, n: int) -> bool:
        """The head's complete view of ``n`` bytes is a frame: CRC right, and rule 5."""
        if n <= 0 or not self._crc_ok(0, n):
            return False
        return not (self._unsure or self._across(n)) or self._tiles_a_read(n)

    def next_event(self) -> RtuFrame | None:
        """The next CRC-valid frame (any unit), or None until more bytes or a pause arrive."""
        while self._buf:
            req, ans = self._views()
            ans_ok = self._valid(ans)
            if self._valid(req) and not (ans_ok and self._across(req) and not self._across(ans)):
                frame = bytes(self._buf[:req])
                self._drop(req, junk=False)
                self._unsure = False
                return RtuFrame(frame[0], frame[1:-2])
            if ans_ok and req != _WAIT:
                self.skipped += 1
                self._drop(ans, junk=False)
                self._unsure = False
                continue
            if req in (_WAIT, _WAIT_PAUSE) or ans == _WAIT:
                return None
            self._fail()
        return None


def contract_section() -> ContractSection:
    """Function codes and limits of the Modbus face of the device."""
    rows = [
        ["0x03", "READ_HOLDING_REGISTERS", "addr:u16 count:u16 (1..125)", "bytes:u8 values"],
        ["0x04", "READ_INPUT_REGISTERS", "addr:u16 count:u16 (1..125)", "bytes:u8 values"],
        ["0x06", "WRITE_SINGLE_REGISTER", "addr:u16 value:u16", "echo of the request"],
        ["0x10", "WRITE_MULTIPLE_REGISTERS", "addr:u16 count:u16 (1..123) bytes:u8 values",
         "addr:u16 count:u16"],
        ["0x41", "WRITE_IF_GENERATION",
         "gen:u16 addr:u16 count:u16 (1..122) bytes:u8 values",
         "status:u8 (0x00 OK / 0x12 GUARD_FAILED) generation:u16"],
        ["0x42", "TRIGGER", "addr:u16 value:u16", "addr:u16 code:u16 (trigger status)"],
        ["0x44", "FILE_RECEIVE (framed only)", "[overwrite:u8 (0/1)]",
         "status:u8 (0), then the port runs one YMODEM receive batch"],
        ["0x45", "FILE_INFO (framed only, read-only)",
         f"len:u8 (1..{MAX_FILE_INFO_NAME}) name:utf8 (YMODEM receive name rules)",
         "status:u8 (0 present / 1 absent) size:u32 crc32c:u32 (0 0 when absent)"],
    ]
    md = (
        "## Modbus functions\n\n"
        "Requests are validated whole before anything changes. Exceptions: 01 unknown function, "
        "02 unknown or read-only address (or address + count past 0xFFFF), 03 bad count, byte "
        "count or value, 04 impossible device state. RTU frames carry CRC-16/MODBUS, low byte "
        "first; the device is silent on another unit id and on a bad CRC.\n\n"
        + md_table(["code", "name", "request", "answer"], rows)
    )
    return ContractSection(
        name="modbus",
        defines=[
            CDefine("IDL_MB_MAX_READ", f"{MAX_READ_COUNT}u", "registers per FC03/FC04"),
            CDefine("IDL_MB_MAX_WRITE", f"{MAX_WRITE_COUNT}u", "registers per FC16"),
            CDefine("IDL_MB_MAX_COND_WRITE", f"{MAX_CONDITIONAL_WRITE_COUNT}u",
                    "registers per 0x41"),
            CDefine("IDL_MB_EXCEPTION_FLAG", f"0x{EXCEPTION_FLAG:02X}u"),
            CDefine("IDL_MB_MAX_FILE_INFO_NAME", f"{MAX_FILE_INFO_NAME}u", "name bytes per 0x45"),
            CDefine("IDL_MB_FILE_INFO_ANSWER_LEN", f"{FILE_INFO_ANSWER_LENGTH}u",
                    "0x45 answer PDU bytes"),
        ],
        enums=[CEnum("idl_mb_function_t", "IDL_MB_FC", FunctionCode, "Modbus function codes"),
               CEnum("idl_mb_file_status_t", "IDL_MB_FILE", FileInfoStatus,
                     "0x45 FILE_INFO answer status")],
        markdown=md,
        data={"functions": {f.name: f.value for f in FunctionCode},
              "limits": [MAX_READ_COUNT, MAX_WRITE_COUNT, MAX_CONDITIONAL_WRITE_COUNT],
              "file_info": {"max_name": MAX_FILE_INFO_NAME,
                            "answer_length": FILE_INFO_ANSWER_LENGTH,
                            "status": {s.name: s.value for s in FileInfoStatus}}},
    )
