"""Modbus RTU framing (sans-I/O): unit id + PDU + CRC-16, and the streaming decoder.

Contract:

- ``unit + PDU + CRC-16/MODBUS`` (little-endian CRC, crcmod's 'modbus'). ``RtuDecoder`` is a
  streaming decoder with one rule set (Modbus over serial line V1.02 2.5.1.1: a silence of t3.5
  ends a frame): a pause is real only when the time between two reads, less the second read's
  transmission time, reaches t3.5 (``RtuTiming.t35``; time is passed in); a frame is
  read at the head by its declared length and taken (or skipped, another slave's answer) when
  its CRC is right; a head that fails restarts parsing only at a real pause. See its docstring.
- ``encode_rtu(unit, pdu)`` / ``decode_rtu(frame)`` (``RtuFrameError`` for a bad CRC or a frame
  too short); ``request_frame_length`` / ``response_frame_length`` tell a frame's length from its
  head when the function code does.

- ``rtu_timing(baudrate, char_format)`` is the line's timing, computed in this one place from the
  real character length (``CharFormat.char_bits``: start + data + parity + stop bits; default
  8E1, 11 bits): the character time, t1.5 and t3.5 — 1.5 and 3.5 character times up to 19200 Bd,
  a fixed 750 µs and 1.75 ms above it and on a line without a rate (a pty, a socket: ``None``).
  The master (``idemlink.protocol.rtu_master.RtuMaster``), the server
  (``idemlink.device_sim.rtu_server.RtuServer``) and the decoder take their timing from it. t1.5
  is computed but cuts no frame: a host operating system hands bytes over in reads whose timing
  cannot resolve a gap inside a frame, so frames are told apart by declared length, CRC and t3.5
  pauses (``RtuDecoder``).

The PDUs inside are ``idemlink.protocol.modbus``'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import crcmod.predefined

from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.modbus import EXCEPTION_FLAG, FunctionCode
from idemlink.protocol.outcome import RemoteProtocolError

MAX_RTU_FRAME = 256
MIN_RTU_FRAME = 4  # unit + function + CRC
BROADCAST_UNIT = 0


class RtuFrameError(RemoteProtocolError):
    """An RTU frame that is too short or fails its CRC."""


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
MASK_WRITE = 0x16  #: FC22 (unit + fc + address, AND mask, OR mask + CRC: 10 bytes either way)
#: Requests whose length is ``index of byte count + 1 + byte count + CRC``.
_COUNTED_REQUEST = {0x0F: 6, 0x10: 6, 0x17: 10, FunctionCode.WRITE_IF_GENERATION: 8}


def request_frame_length(buf: bytes | bytearray) -> int:
    """Expected length of the RTU request frame at the start of ``buf``."""
    if len(buf) < 2:
        return NEED_MORE
    fc = buf[1]
    if fc in _FIXED_REQUEST:
        return 8
    if fc == MASK_WRITE:
        return 10
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
    if fc == MASK_WRITE:
        return 10
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
    return fc in _FIXED_REQUEST or fc == MASK_WRITE


FRAME_GAP_FAST = 0.00175  #: t3.5 above 19200 Bd
CHAR_GAP_FAST = 0.00075  #: t1.5 above 19200 Bd
FAST_LINE = 19200  #: above this rate the spec fixes t1.5 and t3.5 instead of counting characters
DEFAULT_BAUDRATE = 115200  #: the simulator's default line speed (also used for a pty)
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


@dataclass(frozen=True, slots=True)
class RtuTiming:
    """A Modbus RTU line's timing (``rtu_timing``): seconds per character, t1.5 (the longest
    silence inside a frame) and t3.5 (the silence that ends one)."""

    char_time: float
    t15: float
    t35: float


def rtu_timing(baudrate: int | None,
               char_format: CharFormat = MODBUS_CHAR_FORMAT) -> RtuTiming:
    """Modbus over serial line V1.02 2.5.1.1: t1.5 and t3.5 are 1.5 and 3.5 character times up
    to 19200 Bd and a fixed 750 µs and 1.75 ms above. A character is ``char_format.char_bits``
    long (8E1 and 8N2: 11 bits; 8N1: 10). ``None`` (a pty, a socket: no line rate) times
    characters at ``DEFAULT_BAUDRATE`` with the fast line's t1.5 and t3.5."""
    if baudrate is not None and baudrate <= 0:
        raise ValueError(f"baud rate {baudrate} must be positive")
    char_time = char_format.char_bits / (DEFAULT_BAUDRATE if baudrate is None else baudrate)
    if baudrate is None or baudrate > FAST_LINE:
        return RtuTiming(char_time, CHAR_GAP_FAST, FRAME_GAP_FAST)
    return RtuTiming(char_time, 1.5 * char_time, 3.5 * char_time)


def rtu_frame_gap(baudrate: int | None, char_format: CharFormat = MODBUS_CHAR_FORMAT) -> float:
    """t3.5 of ``rtu_timing(baudrate, char_format)``."""
    return rtu_timing(baudrate, char_format).t35


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
       before them only if ``(now - last_rx) - len(data) * char_time >= t3.5`` (both from
       ``timing``, by default ``rtu_timing(baudrate)``: 8E1 characters). ``tick(now)`` (an empty
       read that began at ``now``) is a pause after t3.5 for a head that only a pause can end, else
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
                 unit: int | None = None, resync_silence: float = 0.1,
                 timing: RtuTiming | None = None) -> None:
        if baudrate <= 0:
            raise ValueError(f"baud rate {baudrate} must be positive")
        if timing is None:
            timing = rtu_timing(baudrate)
        self._length_of = length_of
        if other_length_of is None and length_of is request_frame_length:
            other_length_of = response_frame_length
        self._other_length_of = other_length_of
        self._head_ok = _plausibility(length_of)
        self._other_head_ok = _plausibility(other_length_of)
        self.unit = unit
        self.baudrate = baudrate
        self.timing = timing
        self.char_time = timing.char_time
        self.frame_gap = timing.t35
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
        """Nothing arrived by ``now``: a read that began at ``now`` returned nothing, so the line
        was silent from the last bytes until at least ``now`` (a shell stamps an empty read when
        it starts: bytes that come in while the read returns are not taken for silence). A head
        whose function code tells no length is ended by that silence once it lasts t3.5, as on
        the line: nothing else can end it and its sender waits for the answer. Any other head
        waits ``resync_silence`` (a host late in the middle of a frame of known length is not
        cut; the next read's own timing says whether the line paused)."""
        silent = None if self._last_rx is None else now - self._last_rx
        if silent is None or silent >= self.resync_silence or (
                silent >= self.frame_gap and self.awaits_pause):
            self.gap()

    @property
    def awaits_pause(self) -> bool:
        """The head's length is told by no function code: only a pause ends it."""
        return bool(self._buf) and self._views()[0] == _WAIT_PAUSE

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
