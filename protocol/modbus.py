"""Modbus PDU codec and RTU framing (sans-I/O).

Contract:

- PDUs (function code + data, no unit id, no CRC) for FC03, FC04, FC06, FC16, exception responses
  (function | 0x80, code 01-04), and two functions from the user-defined range 65-72:

  * ``0x41 WRITE_IF_GENERATION``: ``gen:u16 addr:u16 count:u16 bytes:u8 values:u16*count`` — write
    these registers only if the configuration generation still equals ``gen``. Answer:
    ``status:u8 generation:u16``; status 0x00 (OK, the generation after the write) or 0x12
    (GUARD_FAILED = NOT_EXECUTED, nothing changed, the current generation). Bad requests get the
    same exceptions as FC16.
  * ``0x42 TRIGGER``: ``addr:u16 value:u16`` -> ``addr:u16 code:u16`` where ``code`` is a
    ``TriggerStatus`` (0, 0x0101, 0x0102, 0xFF01, 0xFF00). FC06 cannot carry the code back (its
    answer is an echo), so a framed host that needs it uses 0x42.

- ``decode_request`` never returns a half-valid request: it raises a typed ``ModbusPduError``
  carrying the exception code to answer (short PDU / wrong byte count / trailing bytes / count 0 or
  over 125 (read) / 123 (write) -> 03; address + count past 0x10000 -> 02; unknown function -> 01).
- RTU: ``unit + PDU + CRC-16/MODBUS`` (little-endian CRC, crcmod's 'modbus'). ``RtuDecoder`` is a
  streaming decoder: it computes the expected length from the function code, waits for the
  whole declared length of a plausible head whatever the pauses inside it, and verifies the
  CRC; another slave's answer (shared bus) is skipped whole; a complete frame with a bad CRC is
  dropped with at least its declared length and the rest of its burst, up to a pause of t3.5
  (``rtu_frame_gap(baudrate)``; time is passed in). An unknown function code's frame is its
  whole burst (it ends at a pause).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import crcmod.predefined

from protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from protocol.outcome import ModbusException, RemoteProtocolError, Status

MAX_READ_COUNT = 125
MAX_WRITE_COUNT = 123
MAX_CONDITIONAL_WRITE_COUNT = 122  # 1 + 2 + 2 + 2 + 1 + 2*122 = 252 <= 253 (max PDU)
MAX_PDU = 253
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


EXCEPTION_FLAG = 0x80


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

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.MALFORMED_REQUEST)


class RtuFrameError(RemoteProtocolError):
    """An RTU frame that is too short or fails its CRC."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.MALFORMED_REQUEST)


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
class ExceptionResponse:
    function: int  #: the request's function code (without the 0x80 flag)
    exception: ModbusException


Response = (ReadRegistersResponse | WriteSingleRegisterResponse | WriteMultipleRegistersResponse
            | WriteIfGenerationResponse | TriggerResponse | ExceptionResponse)


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
        case ExceptionResponse(function, exception):
            return bytes([(function | EXCEPTION_FLAG) & 0xFF, exception])
    raise TypeError(f"not a response: {resp!r}")  # pragma: no cover


def exception_pdu(function: int, exception: ModbusException) -> bytes:
    return encode_response(ExceptionResponse(function, exception))


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


FRAME_GAP_FAST = 0.00175  #: t3.5 above 19200 Bd (and for ptys / unknown lines)


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
    return 3.5 * 11 / baudrate


class RtuDecoder:
    """Streaming RTU decoder, framed by length and CRC, resynchronised only at pauses.

    ``feed(data, now)``; call ``idle(now)`` when a read returned nothing (or ``gap()`` to say the
    line has certainly been silent); ``next_frame()`` returns the next CRC-valid frame or None.

    - The head of the buffer is read both as a request (``length_of``) and as an answer of the
      other direction (``other_length_of``; by default another slave's answer on a shared
      RS-485 bus). A view is *plausible* when its length is known and at most 256 bytes and its
      counts agree. A CRC-valid request is taken; a CRC-valid answer is skipped whole
      (``skipped``) once the request view is impossible or has failed.
    - While a plausible view is incomplete the decoder waits for its whole declared length (or
      ``resync_silence``); pauses inside it do not matter, so a frame arriving slowly or in
      chunks is never cut, and nothing inside it is looked at.
    - When every plausible view is complete and fails its CRC, the head is damaged: at least
      its declared length is dropped, and the rest of the burst up to the next pause of at
      least ``frame_gap`` seconds (t3.5; ``rtu_frame_gap(baudrate)``) with it (Modbus over
      serial line V1.02, 2.5.1.1). Only a CRC-valid request that begins after a pause inside
      the head and ends beyond its declared length is taken (garbage, pause, request).
    - A head that cannot be a frame (unknown function code, counts that disagree, over 256
      bytes) ends at a pause: an unknown function code's frame is its whole burst; it is given up
      as soon as a later burst starts a complete valid frame, or at silence.
    - An incomplete head is given up after ``resync_silence`` seconds of silence (much longer
      than t3.5: ptys and USB adapters pause inside frames); parsing restarts at its first pause.
    - ``discarded`` counts dropped bytes. Without times (``now=None``) only ``gap()`` and
      ``idle()`` mark pauses.
    """

    def __init__(self, length_of: Callable[[bytes | bytearray], int] = request_frame_length,
                 resync_silence: float = 0.1, frame_gap: float = FRAME_GAP_FAST,
                 other_length_of: Callable[[bytes | bytearray], int] | None = None) -> None:
        self._buf = bytearray()
        self._length_of = length_of
        if other_length_of is None and length_of is request_frame_length:
            other_length_of = response_frame_length
        self._other_length_of = other_length_of
        self._head_ok = _plausibility(length_of)
        self._other_head_ok = _plausibility(other_length_of)
        self._silent = False
        self._last_rx: float | None = None
        self._consumed = 0  #: stream offset of ``_buf[0]``
        self._starts: list[int] = []  #: stream offsets where a burst began after a pause
        self._discarding = False  #: dropping the rest of a damaged burst
        self.resync_silence = resync_silence
        self.frame_gap = frame_gap
        self.discarded = 0
        self.skipped = 0
        self._wait_head = -1  #: stream offset of the head that waits for ``_wait_need`` bytes
        self._wait_need = 0

    def feed(self, data: bytes, now: float | None = None) -> None:
        if not data:
            return
        pause = self._silent or (now is not None and self._last_rx is not None
                                 and now - self._last_rx >= self.frame_gap)
        self._silent = False
        self._last_rx = now
        if self._discarding and not pause:
            self.discarded += len(data)
            return
        self._discarding = False
        if pause and self._buf:
            self._starts.append(self._consumed + len(self._buf))
        self._buf += data

    def gap(self) -> None:
        """The line went silent after the bytes fed so far (long enough to give up on them)."""
        self._silent = True
        self._discarding = False

    def idle(self, now: float) -> None:
        """Nothing arrived; at ``resync_silence`` seconds after the last byte this is a ``gap``.
        (Much longer than Modbus's 3.5 characters on purpose: a pty, a loaded host or a USB
        adapter can pause inside a frame for milliseconds, and dropping a good frame's head
        costs a client timeout, while waiting a little longer costs nothing.)"""
        if self._last_rx is None or now - self._last_rx >= self.resync_silence:
            self.gap()

    @property
    def pending(self) -> int:
        return len(self._buf)

    # ------------------------------------------------------------------------------ internals

    def _drop(self, n: int) -> None:
        del self._buf[:n]
        self._consumed += n
        if self._starts and self._starts[0] <= self._consumed:
            self._starts = [s for s in self._starts if s > self._consumed]

    def _pauses(self) -> list[int]:
        """Buffer offsets where a burst began after a pause."""
        return [s - self._consumed for s in self._starts]

    def _drop_to_pause(self, at_least: int) -> None:
        """Drop ``at_least`` bytes and the rest of their burst: up to the next pause, or all
        that is buffered and what still arrives before a pause."""
        later = [p for p in self._pauses() if p >= at_least]
        n = later[0] if later else len(self._buf)
        self.discarded += n
        self._drop(n)
        if not later and not self._silent:
            self._discarding = True

    @staticmethod
    def _valid(buf: bytes | bytearray, n: int) -> bool:
        return MIN_RTU_FRAME <= n <= len(buf) and crc16(bytes(buf[:n - 2])) == int.from_bytes(
            buf[n - 2:n], "little")

    def _request_view(self, buf: bytes | bytearray) -> int:
        """Declared length of a plausible request at the head (NEED_MORE while unknown), or 0."""
        n = self._length_of(buf)
        if n == UNKNOWN_LENGTH or n > MAX_RTU_FRAME or not self._head_ok(buf):
            return 0
        return n

    def _answer_view(self, buf: bytes | bytearray) -> int:
        """Declared length of a plausible answer at the head (NEED_MORE while unknown), or 0."""
        if self._other_length_of is None:
            return 0
        m = self._other_length_of(buf)
        if m == UNKNOWN_LENGTH or m > MAX_RTU_FRAME or not self._other_head_ok(buf):
            return 0
        return m

    def _later_burst_starts_a_frame(self) -> bool:
        for p in self._pauses():
            rest = self._buf[p:]
            if self._valid(rest, self._length_of(rest)) or self._valid(rest, self._answer_view(rest)):
                return True
        return False

    def _request_across(self, declared: int) -> int | None:
        """A damaged head of ``declared`` bytes: the first pause inside it where a CRC-valid
        request begins that ends beyond it (0 if none; None while such a request is incomplete)."""
        waiting = False
        for p in self._pauses():
            if p >= declared:
                break
            rest = self._buf[p:]
            n = self._request_view(rest)
            if n == NEED_MORE or (n and p + n > declared and n > len(rest)):
                waiting = True
            elif n and p + n > declared and self._valid(rest, n):
                return p
        return None if waiting else 0

    def _wait(self, need: int) -> None:
        """Nothing can change for this head before it has ``need`` bytes (or silence)."""
        self._wait_head = self._consumed
        self._wait_need = need if need > 0 else len(self._buf) + 1

    def next_frame(self) -> RtuFrame | None:
        while self._buf:
            buf = self._buf
            size = len(buf)
            if self._wait_head == self._consumed and size < self._wait_need and not self._silent:
                return None  # bytes trickling into a known length: O(1) per read
            n = self._length_of(buf)
            if 0 < n <= size and self._valid(buf, n):
                return self._take(n)
            req = self._request_view(buf)
            ans = self._answer_view(buf)
            req_waits = req == NEED_MORE or req > size
            if 0 < ans <= size and self._valid(buf, ans):
                if req_waits and not self._silent:
                    self._wait(req)
                    return None  # the head may still become a longer valid request
                self.skipped += 1
                self._drop(ans)
                continue
            if req_waits or ans == NEED_MORE or ans > size:
                if not self._silent:
                    pending = [v for v in (req, ans) if v == NEED_MORE or v > size]
                    self._wait(min(pending) if NEED_MORE not in pending else NEED_MORE)
                    return None  # wait for the whole declared length
                self._drop_to_pause(1)  # silence inside it: restart at its first pause
                continue
            if req or ans:  # every plausible view is complete and its CRC is wrong: damaged
                declared = max(req, ans)
                at = self._request_across(declared)
                if at is None and not self._silent:
                    return None
                if at:
                    self.discarded += at
                    self._drop(at)
                else:
                    self._drop_to_pause(declared)
                continue
            # The head cannot be a request or an answer: an unknown function's frame ends at a
            # pause; anything else is junk up to the next pause.
            if n == UNKNOWN_LENGTH:
                for end in self._pauses() + ([size] if self._silent else []):
                    if self._valid(buf, end):
                        return self._take(end)
            if (self._silent or size > MAX_RTU_FRAME or n > MAX_RTU_FRAME or 0 < n <= size
                    or self._later_burst_starts_a_frame()):
                self._drop_to_pause(1)
                continue
            return None
        return None

    def _take(self, n: int) -> RtuFrame:
        frame = bytes(self._buf[:n])
        self._drop(n)
        return RtuFrame(frame[0], frame[1:-2])


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
        ],
        enums=[CEnum("idl_mb_function_t", "IDL_MB_FC", FunctionCode, "Modbus function codes")],
        markdown=md,
        data={"functions": {f.name: f.value for f in FunctionCode},
              "limits": [MAX_READ_COUNT, MAX_WRITE_COUNT, MAX_CONDITIONAL_WRITE_COUNT]},
    )
