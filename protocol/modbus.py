"""Modbus PDU codec and the answer rules (sans-I/O). RTU framing (unit id, CRC-16, the t3.5
streaming decoder) changes for its own reasons and lives in ``idemlink.protocol.modbus_rtu``.

Contract:

- PDUs (function code + data, no unit id, no CRC) for FC03, FC04, FC06, FC16, exception responses
  (function | 0x80, code 01-04), the standard functions a third-party device's map may need
  (``StandardFunction``: FC01/FC02 bit reads, FC05/FC15 coil writes, FC22 mask write; not part of
  the framed contract), and four functions from the user-defined range 65-72:

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
    (``idemlink.protocol.ymodem.check_name``); a refused name or a bad length is exception 03.
    Its codec is separate (``encode_file_info_request`` / ``decode_file_info_request``): ``decode_request``
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

Why one module of this size: a new function code changes its request codec, its answer codec and
its answer rules together, and all three must agree; keeping them in one file keeps that change in
one place (the RTU framing, which changes for other reasons, is apart).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

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
from idemlink.protocol.ymodem_names import NameRefusal, check_name

MAX_READ_COUNT = 125
MAX_WRITE_COUNT = 123
MAX_CONDITIONAL_WRITE_COUNT = 122  # 1 + 2 + 2 + 2 + 1 + 2*122 = 252 <= 253 (max PDU)
MAX_PDU = 253
MAX_FILE_INFO_NAME = MAX_PDU - 2  #: name bytes in a 0x45 request (fc + length byte + name)


class FunctionCode(IntEnum):
    READ_HOLDING_REGISTERS = 0x03
    READ_INPUT_REGISTERS = 0x04
    WRITE_SINGLE_REGISTER = 0x06
    WRITE_MULTIPLE_REGISTERS = 0x10
    WRITE_IF_GENERATION = 0x41  #: user-defined: conditional write guarded by the generation
    TRIGGER = 0x42  #: user-defined: trigger write answering the TriggerStatus code
    FILE_RECEIVE = 0x44  #: user-defined (framed only): switch the port to a YMODEM receive batch
    FILE_INFO = 0x45  #: user-defined (framed only): size and CRC-32C of a stored file


class StandardFunction(IntEnum):
    """Standard Modbus functions for what a third-party device's map may hold besides registers:
    coils, discrete inputs, and the mask write of one register's bits. Used on the Modbus RTU
    path and served by the simulator's core when its map needs them (a map without coils, or
    without ``mask_write``, answers them with exception 01, as before). Not part of the framed
    protocol's contract (``FunctionCode``, the contract hash)."""

    READ_COILS = 0x01
    READ_DISCRETE_INPUTS = 0x02
    WRITE_SINGLE_COIL = 0x05
    WRITE_MULTIPLE_COILS = 0x0F
    MASK_WRITE_REGISTER = 0x16  #: (current AND and_mask) OR (or_mask AND NOT and_mask)


MAX_READ_BITS = 2000
MAX_WRITE_BITS = 1968
COIL_ON = 0xFF00  #: FC05's value for 1 (0x0000 is 0; anything else is exception 03)
BIT_FUNCTIONS: frozenset[int] = frozenset({
    StandardFunction.READ_COILS, StandardFunction.READ_DISCRETE_INPUTS,
    StandardFunction.WRITE_SINGLE_COIL, StandardFunction.WRITE_MULTIPLE_COILS,
})

READ_ONLY_FUNCTIONS: frozenset[int] = frozenset({
    FunctionCode.READ_HOLDING_REGISTERS,
    FunctionCode.READ_INPUT_REGISTERS,
    FunctionCode.FILE_INFO,
    StandardFunction.READ_COILS,
    StandardFunction.READ_DISCRETE_INPUTS,
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
class ReadBits:
    """FC01 (coils) or FC02 (discrete inputs)."""

    function: StandardFunction
    address: int
    count: int


@dataclass(frozen=True, slots=True)
class WriteSingleCoil:
    address: int
    value: int  #: 0 or 1 (on the wire 0x0000 / 0xFF00)


@dataclass(frozen=True, slots=True)
class WriteMultipleCoils:
    address: int
    values: tuple[int, ...]  #: 0s and 1s


@dataclass(frozen=True, slots=True)
class MaskWriteRegister:
    """FC22: the register becomes ``(current & and_mask) | (or_mask & ~and_mask)``: the bits
    cleared in ``and_mask`` take ``or_mask``'s, the others stay (atomic on the device)."""

    address: int
    and_mask: int
    or_mask: int


@dataclass(frozen=True, slots=True)
class FileInfoRequest:
    """0x45: a stored file's name (one plain path component, see ``check_name``)."""

    name: str


Request = (ReadRegisters | WriteSingleRegister | WriteMultipleRegisters | WriteIfGeneration
           | TriggerRequest | ReadBits | WriteSingleCoil | WriteMultipleCoils | MaskWriteRegister)


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
class ReadBitsResponse:
    function: StandardFunction
    values: tuple[int, ...]  #: every bit of the answer's bytes (padding included: trim to count)


@dataclass(frozen=True, slots=True)
class WriteMultipleCoilsResponse:
    address: int
    count: int


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
            | WriteIfGenerationResponse | TriggerResponse | FileInfoResponse | ExceptionResponse
            | ReadBitsResponse | WriteSingleCoil | WriteMultipleCoilsResponse | MaskWriteRegister)


# ----------------------------------------------------------------------------------------- decode


_U16S = tuple(struct.Struct(f">{n}H") for n in range(MAX_PDU // 2 + 1))
"""Big-endian u16 arrays of every length a PDU can carry, compiled once (a read answer is decoded
for every result on the host's hot path)."""

_READ_FUNCTIONS = {int(f): f for f in (FunctionCode.READ_HOLDING_REGISTERS,
                                        FunctionCode.READ_INPUT_REGISTERS)}


def _u16s(data: bytes) -> tuple[int, ...]:
    n = len(data) // 2
    if n < len(_U16S):
        return _U16S[n].unpack(data)
    return struct.unpack(f">{n}H", data)


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


def pack_bits(values: tuple[int, ...] | list[int]) -> bytes:
    """Bits packed as Modbus sends them: the first in the lowest bit of the first byte."""
    out = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def unpack_bits(data: bytes, count: int | None = None) -> tuple[int, ...]:
    bits = tuple((b >> i) & 1 for b in data for i in range(8))
    return bits if count is None else bits[:count]


def _decode_bit_request(pdu: bytes, fc: int) -> Request:
    if fc in (StandardFunction.READ_COILS, StandardFunction.READ_DISCRETE_INPUTS):
        _check_len(pdu, 5, fc)
        address, count = struct.unpack_from(">HH", pdu, 1)
        _check_range(fc, address, count, MAX_READ_BITS)
        return ReadBits(StandardFunction(fc), address, count)
    if fc == StandardFunction.WRITE_SINGLE_COIL:
        _check_len(pdu, 5, fc)
        address, value = struct.unpack_from(">HH", pdu, 1)
        if value not in (0, COIL_ON):
            raise QuantityOutOfRange(f"function 0x05: value 0x{value:04X} (0x0000 or 0xFF00)", fc)
        return WriteSingleCoil(address, 1 if value else 0)
    if fc == StandardFunction.WRITE_MULTIPLE_COILS:
        _check_len(pdu, 6, fc, exact=False)
        address, count = struct.unpack_from(">HH", pdu, 1)
        _check_range(fc, address, count, MAX_WRITE_BITS)
        byte_count = pdu[5]
        if byte_count != (count + 7) // 8:
            raise ByteCountMismatch(f"function 0x0F: byte count {byte_count} for {count} coils",
                                    fc)
        _check_len(pdu, 6 + byte_count, fc)
        return WriteMultipleCoils(address, unpack_bits(pdu[6:], count))
    _check_len(pdu, 7, fc)  # MASK_WRITE_REGISTER
    return MaskWriteRegister(*struct.unpack_from(">HHH", pdu, 1))


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
    if fc in set(StandardFunction):
        return _decode_bit_request(pdu, fc)
    raise IllegalFunction(f"function 0x{fc:02X} not supported", fc)


def decode_read_values(pdu: bytes) -> tuple[int, ...]:
    """The register values of a read answer (FC03/FC04) PDU, without building a
    ``ReadRegistersResponse`` (the host decodes one per result); ``BadResponse`` when its byte
    count does not match its length or it is not a read answer."""
    if len(pdu) < 2 or pdu[0] not in _READ_FUNCTIONS:
        raise BadResponse(f"not a read response: {pdu[:1].hex() or 'empty'}")
    if pdu[1] % 2 or len(pdu) != 2 + pdu[1]:
        raise BadResponse("read response byte count does not match its length")
    return _u16s(pdu[2:])


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
        read_function = _READ_FUNCTIONS.get(fc)
        if read_function is not None:
            return ReadRegistersResponse(read_function, decode_read_values(pdu))
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
        if fc in (StandardFunction.READ_COILS, StandardFunction.READ_DISCRETE_INPUTS) and (
                len(pdu) == 2 + pdu[1]):
            return ReadBitsResponse(StandardFunction(fc), unpack_bits(pdu[2:]))
        if len(pdu) == 5 and fc == StandardFunction.WRITE_SINGLE_COIL:
            address, value = struct.unpack_from(">HH", pdu, 1)
            if value in (0, COIL_ON):
                return WriteSingleCoil(address, 1 if value else 0)
        if len(pdu) == 5 and fc == StandardFunction.WRITE_MULTIPLE_COILS:
            return WriteMultipleCoilsResponse(*struct.unpack_from(">HH", pdu, 1))
        if len(pdu) == 7 and fc == StandardFunction.MASK_WRITE_REGISTER:
            return MaskWriteRegister(*struct.unpack_from(">HHH", pdu, 1))
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
        case ReadBits(function, address, count):
            return struct.pack(">BHH", function, address, count)
        case WriteSingleCoil(address, value):
            return struct.pack(">BHH", StandardFunction.WRITE_SINGLE_COIL, address,
                               COIL_ON if value else 0)
        case WriteMultipleCoils(address, values):
            packed = pack_bits(values)
            return (struct.pack(">BHHB", StandardFunction.WRITE_MULTIPLE_COILS, address,
                                len(values), len(packed)) + packed)
        case MaskWriteRegister(address, and_mask, or_mask):
            return struct.pack(">BHHH", StandardFunction.MASK_WRITE_REGISTER, address, and_mask,
                               or_mask)
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
        case ReadBitsResponse(function, values):
            packed = pack_bits(values)
            return bytes([function, len(packed)]) + packed
        case WriteSingleCoil() | MaskWriteRegister():
            return encode_request(resp)  # the answer echoes the request
        case WriteMultipleCoilsResponse(address, count):
            return struct.pack(">BHH", StandardFunction.WRITE_MULTIPLE_COILS, address, count)
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
    if (fc in (StandardFunction.READ_COILS, StandardFunction.READ_DISCRETE_INPUTS)
            and len(request_pdu) == 5):
        count = int.from_bytes(request_pdu[3:5], "big")
        size = (count + 7) // 8
        return len(pdu) >= 2 and pdu[1] == size and len(pdu) == 2 + size
    if fc in (StandardFunction.WRITE_SINGLE_COIL, StandardFunction.MASK_WRITE_REGISTER):
        return pdu == request_pdu
    if fc == StandardFunction.WRITE_MULTIPLE_COILS:
        return pdu[1:5] == request_pdu[1:5] and len(pdu) == 5
    return True


EXCEPTION_NAMES: dict[int, str] = {
    0x01: "ILLEGAL_FUNCTION", 0x02: "ILLEGAL_DATA_ADDRESS", 0x03: "ILLEGAL_DATA_VALUE",
    0x04: "SERVER_DEVICE_FAILURE", 0x05: "ACKNOWLEDGE", 0x06: "SERVER_DEVICE_BUSY",
    0x08: "MEMORY_PARITY_ERROR", 0x0A: "GATEWAY_PATH_UNAVAILABLE",
    0x0B: "GATEWAY_TARGET_FAILED_TO_RESPOND",
}
"""Every exception code of the Modbus Application Protocol V1.1b3 (section 7), by its name
there. Only 01-04 are this stack's own (``ModbusException``, in the contract hash); the others
are a third-party device's or a gateway's, shown by their code and name, never as another."""


def exception_name(code: int) -> str:
    """``0x06 SERVER_DEVICE_BUSY``; a code the spec does not define by its number alone."""
    name = EXCEPTION_NAMES.get(code)
    return f"0x{code:02X} {name}" if name else f"0x{code:02X} (a code the Modbus spec does not define)"


def exception_code(pdu: bytes) -> int | None:
    """The exception code an answer PDU carries (function | 0x80, code), or None."""
    if len(pdu) == 2 and pdu[0] & EXCEPTION_FLAG:
        return pdu[1]
    return None


def classify_answer(request_pdu: bytes, pdu: bytes,
                    ) -> tuple[Outcome, Status | None, ModbusException | None]:
    """The outcome, status and exception an OK answer's PDU means for ``request_pdu`` (one rule
    for every host shell; see the module contract). An exception code outside 01-04 is no
    ``ModbusException``: UNKNOWN, exception None (never named as another code); the Modbus
    masters decide the codes a third-party device or a gateway sends
    (``rtu_master.RtuMaster``)."""
    if pdu and pdu[0] & EXCEPTION_FLAG:
        try:
            exc = ModbusException(pdu[1]) if len(pdu) > 1 else None
        except ValueError:
            exc = None
        if exc is None:
            return Outcome.UNKNOWN, None, None
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
