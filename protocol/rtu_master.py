"""A Modbus RTU master session (sans-I/O): the four outcomes over a standard RTU slave.

Contract:

- One request on the line at a time (RTU has no pipelining and no transaction id): ``submit``
  queues a request PDU; the session sends the next one once the previous one is settled and the
  line has been silent for t3.5 (``rtu_frame_gap(baudrate)``). Time is passed in; bytes go out
  through ``data_to_send()`` and come in through ``receive_data(data, now)``; ``tick(now)``
  fires the deadlines; ``next_event()`` hands out one ``Completion`` per request, in order, then
  None (nothing more now).
- An answer is the next CRC-valid frame (``RtuDecoder`` over ``response_frame_length``) from the
  request's unit whose PDU fits the request (``answer_fits``: same function or its exception, a
  write's echo, a read's byte count); anything else is ignored and counted (``ignored``).
- How many times a request may be sent is decided here, from the register map, never by the
  caller (``attempts_for``): a read (FC03/FC04), or an FC06/FC16 write whose every register is a
  HOLDING register (an absolute value: running it twice leaves the same state), is sent up to
  ``attempts`` times; anything else — a write to a FAULT word (write-1-to-clear), to a TRIGGER
  register, to an address the map does not know, a conditional write, any other function — is
  sent exactly once. Modbus RTU has no de-duplication: a retried set-only write may execute twice
  on the slave, which is harmless by construction, and is why only those are retried.
- Outcomes: OK (a fitting answer), REJECTED (exception 01-03: nothing changed), UNKNOWN
  (exception 04 or an exception code this stack does not know; or no fitting answer after the
  allowed attempts: status NO_ANSWER). NOT_EXECUTED only when certain: ``abandon`` settles a
  request never sent as NOT_EXECUTED and one that was sent as UNKNOWN with the given status.
- The wait for an answer is ``timeout`` plus the transmission time of the request and of the
  expected answer at the line's baud rate (11 bits a character), stretched while an answer is
  still arriving (at most one frame's time).
- Broadcast (unit 0): slaves execute without answering, so nothing is awaited: the request is
  sent once (whatever its kind), completes UNKNOWN / NO_ANSWER (it may have run; nothing can say
  so) after ``turnaround`` seconds, and a read at unit 0 is refused (``LocalProtocolError``).
- Limit: with no transaction id, an answer later than the whole wait that arrives while the next
  request is out and fits it would be taken for its answer. Input buffered before a request is
  sent is discarded; choose a timeout above the slave's worst answer time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from idemlink.protocol.host_session import Completion
from idemlink.protocol.modbus import FunctionCode, answer_fits, classify_answer
from idemlink.protocol.modbus_rtu import (
    BROADCAST_UNIT,
    CHAR_BITS,
    DEFAULT_BAUDRATE,
    MAX_RTU_FRAME,
    RtuDecoder,
    encode_rtu,
    response_frame_length,
    rtu_frame_gap,
)
from idemlink.protocol.outcome import LocalProtocolError, ModbusException, Outcome, Status
from idemlink.protocol.registers import RegisterKind, RegisterMap

READS = (FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS)
SET_ONLY_WRITES = (FunctionCode.WRITE_SINGLE_REGISTER, FunctionCode.WRITE_MULTIPLE_REGISTERS)


def written_addresses(pdu: bytes) -> range | None:
    """The registers an FC06/FC16 request PDU writes (None for another or a short PDU)."""
    if len(pdu) < 5 or pdu[0] not in SET_ONLY_WRITES:
        return None
    address = int.from_bytes(pdu[1:3], "big")
    count = 1 if pdu[0] == FunctionCode.WRITE_SINGLE_REGISTER else int.from_bytes(pdu[3:5], "big")
    return range(address, address + count)


def retry_allowed(pdu: bytes, regmap: RegisterMap) -> bool:
    """Whether sending ``pdu`` again is harmless: a read, or a plain write of HOLDING registers
    only (the map says which). W1C fault words, triggers, unknown addresses, conditional writes
    and every other function are not."""
    if pdu[:1] and pdu[0] in READS:
        return True
    span = written_addresses(pdu)
    if span is None or not span:
        return False
    return all((s := regmap.at(a)) is not None and s.kind is RegisterKind.HOLDING for a in span)


def expected_answer_length(pdu: bytes) -> int:
    """Bytes of the RTU frame that answers ``pdu`` when it succeeds (reads: 5 + 2 * count)."""
    if pdu[:1] and pdu[0] in READS and len(pdu) >= 5:
        return 5 + 2 * int.from_bytes(pdu[3:5], "big")
    return 8


@dataclass(slots=True)
class _Request:
    tag: Any
    unit: int
    pdu: bytes
    allowed: int  #: sends allowed (1 for anything not harmless to repeat)
    attempts: int = 0
    deadline: float = 0.0
    stretch_until: float = 0.0  #: the latest an answer still arriving may push the deadline


class RtuMaster:
    """One Modbus RTU master on one line. See the module docstring."""

    def __init__(self, regmap: RegisterMap, *, unit: int = 1, baudrate: int | None = None,
                 timeout: float = 0.2, attempts: int = 5, turnaround: float = 0.1) -> None:
        if not 0 <= unit <= 247:
            raise ValueError(f"unit id {unit} outside 0..247")
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        if not timeout > 0:
            raise ValueError("timeout must be > 0")
        self.regmap = regmap
        self.unit = unit
        self.baudrate = DEFAULT_BAUDRATE if baudrate is None else baudrate
        self.frame_gap = rtu_frame_gap(baudrate)
        self.char_time = CHAR_BITS / self.baudrate
        self.timeout = timeout
        self.attempts = attempts
        self.turnaround = turnaround
        self.ignored = 0  #: frames that were no answer to the request out (stray, late, other unit)
        self.sent = 0  #: request frames written
        self._queue: deque[_Request] = deque()
        self._out = bytearray()
        self._current: _Request | None = None
        self._quiet_until = 0.0
        self._events: deque[Completion] = deque()
        self._decoder = self._new_decoder()

    def _new_decoder(self) -> RtuDecoder:
        return RtuDecoder(response_frame_length, baudrate=self.baudrate, other_length_of=None)

    # ------------------------------------------------------------------------------ input
    def attempts_for(self, pdu: bytes, unit: int | None = None) -> int:
        """Sends allowed for ``pdu``: ``attempts`` if repeating it is harmless, else 1."""
        if (self.unit if unit is None else unit) == BROADCAST_UNIT:
            return 1
        return self.attempts if retry_allowed(pdu, self.regmap) else 1

    def submit(self, pdu: bytes, now: float, *, tag: Any = None, unit: int | None = None) -> None:
        """Queue a request PDU (no unit id, no CRC) for ``unit`` (default: the session's)."""
        u = self.unit if unit is None else unit
        if not 0 <= u <= 247:
            raise LocalProtocolError(f"unit id {u} outside 0..247")
        if not pdu:
            raise LocalProtocolError("empty request PDU")
        if u == BROADCAST_UNIT and pdu[0] in READS:
            raise LocalProtocolError("a read cannot be broadcast (unit 0): no slave answers it")
        encode_rtu(u, pdu)  # ValueError for a PDU that cannot travel, before it is queued
        self._queue.append(_Request(tag, u, pdu, self.attempts_for(pdu, u)))
        self._pump(now)

    def receive_data(self, data: bytes, now: float) -> None:
        if not data:
            return
        self._decoder.receive_data(data, now)
        req = self._current
        if req is not None:  # an answer still arriving keeps the wait open a little longer
            req.deadline = max(req.deadline, min(now + self.frame_gap + self.char_time,
                                                 req.stretch_until))
        while (frame := self._decoder.next_event()) is not None:
            req = self._current
            if (req is None or req.unit == BROADCAST_UNIT or frame.unit != req.unit
                    or not answer_fits(req.pdu, frame.pdu)):
                self.ignored += 1
                continue
            outcome, status, exc = classify_answer(req.pdu, frame.pdu)
            self._complete(req, outcome, status, exc, frame.pdu, now)
        self._pump(now)

    def tick(self, now: float) -> None:
        req = self._current
        if req is not None and now >= req.deadline:
            if req.unit == BROADCAST_UNIT or req.attempts >= req.allowed:
                self._complete(req, Outcome.UNKNOWN, Status.NO_ANSWER, None, b"", now)
            else:
                self._send(req, now)
        self._pump(now)

    # ----------------------------------------------------------------------------- output
    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Completion | None:
        """The oldest ``Completion`` not yet taken, or None: nothing more now."""
        events = self._events
        return events.popleft() if events else None

    def next_deadline(self) -> float | None:
        if self._current is not None:
            return self._current.deadline
        if self._queue:
            return self._quiet_until
        return None

    @property
    def busy(self) -> bool:
        """A request is out or queued."""
        return self._current is not None or bool(self._queue)

    def abandon(self, status: Status) -> None:
        """Settle every request: the one out is UNKNOWN with ``status`` (it may have run), the
        queued ones NOT_EXECUTED (never sent)."""
        if self._current is not None:
            req = self._current
            self._current = None
            self._events.append(Completion(req.tag, Outcome.UNKNOWN, status,
                                           attempts=req.attempts))
        while self._queue:
            req = self._queue.popleft()
            self._events.append(Completion(req.tag, Outcome.NOT_EXECUTED, None))
        self._out.clear()

    # ---------------------------------------------------------------------------- internal
    def _pump(self, now: float) -> None:
        if self._current is None and self._queue and now >= self._quiet_until:
            req = self._queue.popleft()
            self._current = req
            self._send(req, now)

    def _send(self, req: _Request, now: float) -> None:
        frame = encode_rtu(req.unit, req.pdu)
        self._decoder = self._new_decoder()  # what arrived before this request answers nothing
        self._out += frame
        self.sent += 1
        req.attempts += 1
        on_line = len(frame) * self.char_time
        if req.unit == BROADCAST_UNIT:
            req.deadline = now + on_line + self.turnaround
            return
        answer = expected_answer_length(req.pdu) * self.char_time
        req.deadline = now + on_line + self.timeout + answer
        req.stretch_until = req.deadline + MAX_RTU_FRAME * self.char_time + self.frame_gap

    def _complete(self, req: _Request, outcome: Outcome, status: Status | None,
                  exc: ModbusException | None, pdu: bytes, now: float) -> None:
        self._current = None
        self._quiet_until = now + self.frame_gap
        self._events.append(Completion(req.tag, outcome, status, exc, pdu,
                                       attempts=req.attempts))
