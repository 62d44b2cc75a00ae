"""A Modbus RTU master session (sans-I/O): the four outcomes over a standard RTU slave.

``RtuMaster`` is the RTU analogue of ``idemlink.protocol.host_session.HostSession``: the host's
operations (``idemlink.host.operations``) submit the same request PDUs to either and get the same
``Completion``s back, so every driver rule above the session is written once for both protocols.

Contract:

- One request on the line at a time (RTU has no pipelining and no transaction id: ``max_inflight``
  is 1): ``submit`` queues a request PDU; the session sends the next one once the previous one is
  settled and the line has been silent for t3.5 (``rtu_timing(baudrate, char_format)``: the
  line's character format, 8E1 by default, sets the character length). Time is passed in;
  bytes go out through ``data_to_send()`` and come in through ``receive_data(data, now)``;
  ``tick(now)`` fires the deadlines and sends; ``next_event()`` hands out one ``Completion`` per
  request, in order, then None (nothing more now).
- Input that arrives while no request is out answers nothing: a request leaves on a ``tick``
  only after a round of input with nothing in it (at most ``DRAIN_ROUNDS`` rounds: a babbling
  line does not hold it forever). A shell's loop (read, ``receive_data``, ``tick``) reads with
  ``next_deadline()``, which is then due, so what was buffered before the request (a late answer
  to an earlier one, which would fit the next request of the same shape) is read and dropped
  before the request is sent.
- An answer is the next CRC-valid frame (``RtuDecoder`` over ``response_frame_length``) from the
  request's unit whose PDU fits the request (``answer_fits``: same function or its exception, a
  write's echo, a read's byte count); anything else is ignored and counted (``ignored``). A frame
  of the request's function from its unit that does not fit (a slave echoing the value its own
  logic stored instead of the one written) is remembered: without a fitting answer the request
  ends UNKNOWN with ``Status.ANSWER_MISMATCH`` and ``Completion.detail`` saying what came
  (``wrote 0x0001, echo 0x0004``), not NO_ANSWER.
- How many times a request may be sent is decided here, from the register map, never by the
  caller (``attempts_for``; ``submit``'s ``set_only`` is ignored): a read (FC03/FC04, FC01/FC02),
  an FC06/FC16 write whose every register is a HOLDING register, an FC22 mask write of one, or an
  FC05/FC15 write of coils (an absolute value: running it twice leaves the same state), is sent
  up to ``attempts`` times; anything else — a write to a FAULT
  word (write-1-to-clear), to a TRIGGER register, to an address the map does not know — is sent
  exactly once. Modbus RTU has no de-duplication: a retried set-only write may execute twice on
  the slave, which is harmless by construction, and is why only those are retried.
- The idemlink TRIGGER function (0x42) is carried the way a plain slave can: a start (value 1)
  first reads the trigger register (FC03, a read: retried), and the device's own state machine
  (``idemlink.protocol.device_core.start_row``: ``TRIGGER_TABLE`` for a trigger register; for a
  plain device's COMMAND register, 0 is IDLE and any other value RUNNING) decides on the state
  read: IDLE -> an FC06
  write of 1, sent once; RUNNING or DONE -> nothing is written and the request completes OK with
  the TRIGGER answer the device would give (code RUNNING / DONE); a state outside the table ->
  nothing written, NOT_EXECUTED. A reset (value 0) is an FC06 write of 0, sent once. A written
  trigger that is echoed completes with code ACCEPTED, so ``Completion.pdu`` is a TRIGGER answer
  (function 0x42, address, code) whatever the slave put on the line. The read and the write are
  two requests: another master may start it between them (docs/MODBUS_RTU.md). A start whose
  state read gets no answer, or an exception, wrote nothing: NOT_EXECUTED (REJECTED for
  exceptions 01-03), ``detail`` saying why.
- What a plain slave cannot do is refused before anything is queued (``check``,
  ``LocalProtocolError``): the idemlink functions WRITE_IF_GENERATION (0x41),
  FILE_RECEIVE (0x44), FILE_INFO (0x45) and any other function; a trigger value other than 0/1;
  a pinned request number (a plain slave numbers nothing: ``numbered`` is False).
- Outcomes: OK (a fitting answer), REJECTED (exception 01-03: nothing changed), UNKNOWN
  (exception 04; or no fitting answer after the allowed attempts: NO_ANSWER, or
  ANSWER_MISMATCH). Exception codes beyond 01-04 (a third-party device's or a gateway's, RTU and
  TCP alike) keep their code (``Completion.exception_code``) and name in ``detail``
  (``Modbus exception 0x06 SERVER_DEVICE_BUSY: ...``; a code the spec does not define by its
  number), never shown as another: 06 SERVER_DEVICE_BUSY (the spec: the device is processing a
  long command, the client retransmits later — this request did nothing) and 0x0A
  GATEWAY_PATH_UNAVAILABLE (nothing reached the device) are NOT_EXECUTED, sent once — UNKNOWN
  when an earlier send of the request went unanswered (it may have run); 0x0B
  GATEWAY_TARGET_FAILED_TO_RESPOND is the device's silence seen through a gateway: treated as
  no answer (sent again where the map allows it, then UNKNOWN/NO_ANSWER); 05 ACKNOWLEDGE
  (accepted, still processing: it may yet take effect), 08 and any other code are UNKNOWN. A
  trigger start's state read answered with any of them wrote nothing: NOT_EXECUTED.
  NOT_EXECUTED only when certain: ``abandon``
  settles a request never sent (or a trigger start whose write was never sent) as NOT_EXECUTED
  and one that was sent as UNKNOWN with the given status.
- The wait for an answer is ``timeout`` plus the transmission time of the request and of the
  expected answer at the line's baud rate (``char_format.char_bits`` a character), stretched
  while an answer is still arriving (at most one frame's time).
- Broadcast (unit 0): slaves execute without answering, so nothing is awaited: the request is
  sent once (whatever its kind), completes UNKNOWN / NO_ANSWER (it may have run; nothing can say
  so) after ``turnaround`` seconds; a read at unit 0, and so a trigger start, is refused
  (``LocalProtocolError``).
- Every frame both ways is logged at DEBUG on ``idemlink.frames`` (``idemlink -vv``), bytes and
  what became of an incoming one.
- A late answer is never knowingly taken for the next request: after a request got no answer
  (its last send's wait ran out), the line is left for a guard window (``late_guard``: the
  request's whole wait again, ``timeout`` plus the request's and answer's transmission times)
  before anything more is sent. A frame that arrives while no request is out — the late answer
  landing in that window — answers nothing: it is dropped and counted (``late``). A retry needs
  no guard: the first send's late answer and the retry's answer are both this request's.
- Limit: with no transaction id, an answer later than twice the whole wait, arriving while the
  next request is out and fitting it, would be taken for its answer; choose a timeout above the
  slave's worst answer time (docs/MODBUS_RTU.md).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.device_core import TriggerAction, start_row
from idemlink.protocol.host_session import Completion
from idemlink.protocol.modbus import (
    FunctionCode,
    StandardFunction,
    answer_fits,
    classify_answer,
    exception_code,
    exception_name,
)
from idemlink.protocol.modbus_rtu import (
    BROADCAST_UNIT,
    DEFAULT_BAUDRATE,
    MAX_RTU_FRAME,
    RtuDecoder,
    encode_rtu,
    response_frame_length,
    rtu_timing,
)
from idemlink.protocol.outcome import (
    LocalProtocolError,
    ModbusException,
    Outcome,
    Status,
)
from idemlink.protocol.registers import (
    RegisterKind,
    RegisterMap,
    Space,
    TriggerStatus,
)

READS = (FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS)
BIT_READS = (StandardFunction.READ_COILS, StandardFunction.READ_DISCRETE_INPUTS)
SET_ONLY_WRITES = (FunctionCode.WRITE_SINGLE_REGISTER, FunctionCode.WRITE_MULTIPLE_REGISTERS,
                   StandardFunction.MASK_WRITE_REGISTER)
COIL_WRITES = (StandardFunction.WRITE_SINGLE_COIL, StandardFunction.WRITE_MULTIPLE_COILS)
CARRIED = (*READS, *BIT_READS, *SET_ONLY_WRITES, *COIL_WRITES, FunctionCode.TRIGGER)
"""The functions a plain slave can be asked for (TRIGGER as a read and an FC06 write; coils,
discrete inputs and FC22 for what a third-party device's map holds)."""
IDEMLINK_ONLY = (FunctionCode.WRITE_IF_GENERATION, FunctionCode.FILE_RECEIVE,
                 FunctionCode.FILE_INFO)
"""The idemlink functions a plain slave does not have."""
OWN_EXCEPTIONS = frozenset(int(e) for e in ModbusException)  #: 01-04: ``classify_answer``
GATEWAY_PATH_UNAVAILABLE = 0x0A
GATEWAY_TARGET_FAILED = 0x0B
NOTHING_DONE = {
    GATEWAY_PATH_UNAVAILABLE: "nothing reached the device",
    0x06: "the device is busy with a long command and did nothing; send it again later",
}
"""Exception codes that say this send did nothing (Modbus Application Protocol V1.1b3, 7)."""
UNSETTLED = {
    0x05: "the device accepted the request and is still processing it: it may yet take effect",
    0x08: "the device found a memory parity error",
}
"""Exception codes after which whether the request took effect is not known."""
DRAIN_ROUNDS = 64
"""Rounds of input read and dropped before a request at most (a babbling line ends it)."""

frame_log = logging.getLogger("idemlink.frames")


def written_addresses(pdu: bytes) -> range | None:
    """The registers an FC06/FC16/FC22 request PDU writes, or the coils an FC05/FC15 one writes
    (None for another or a short PDU)."""
    if len(pdu) < 5 or pdu[0] not in (*SET_ONLY_WRITES, *COIL_WRITES):
        return None
    address = int.from_bytes(pdu[1:3], "big")
    single = (FunctionCode.WRITE_SINGLE_REGISTER, StandardFunction.WRITE_SINGLE_COIL,
              StandardFunction.MASK_WRITE_REGISTER)
    count = 1 if pdu[0] in single else int.from_bytes(pdu[3:5], "big")
    return range(address, address + count)


def retry_allowed(pdu: bytes, regmap: RegisterMap) -> bool:
    """Whether sending ``pdu`` again is harmless: a read (of registers or bits), a plain write
    of HOLDING registers only, a mask write of one (FC22 sets its bits to absolute values:
    twice is once), or a write of coils only (FC05/FC15 set absolute 0/1s). The map says which
    is which. W1C fault words, triggers, unknown addresses, conditional writes and every other
    function are not."""
    if pdu[:1] and pdu[0] in (*READS, *BIT_READS):
        return True
    span = written_addresses(pdu)
    if span is None or not span:
        return False
    if pdu[0] in COIL_WRITES:
        return all(regmap.spec_at(a, Space.COILS) is not None for a in span)
    return all((s := regmap.at(a)) is not None and s.kind is RegisterKind.HOLDING for a in span)


def expected_answer_length(pdu: bytes) -> int:
    """Bytes of the RTU frame that answers ``pdu`` when it succeeds (reads: 5 + 2 * count; bit
    reads: 5 + one byte per 8 bits; a mask write's echo: 10)."""
    if pdu[:1] and pdu[0] in READS and len(pdu) >= 5:
        return 5 + 2 * int.from_bytes(pdu[3:5], "big")
    if pdu[:1] and pdu[0] in BIT_READS and len(pdu) >= 5:
        return 5 + (int.from_bytes(pdu[3:5], "big") + 7) // 8
    if pdu[:1] and pdu[0] == StandardFunction.MASK_WRITE_REGISTER:
        return 10
    return 8


def misfit(request: bytes, answer: bytes) -> str:
    """What an answer of the request's function says that does not fit it, in a user's words:
    ``wrote 0x0001, echo 0x0004``."""
    fc = request[0]
    if fc == FunctionCode.WRITE_SINGLE_REGISTER and len(request) == 5 and len(answer) == 5:
        value, echo = int.from_bytes(request[3:5], "big"), int.from_bytes(answer[3:5], "big")
        if request[1:3] == answer[1:3]:
            return f"wrote 0x{value:04X}, echo 0x{echo:04X}"
        return (f"wrote 0x{value:04X} to {int.from_bytes(request[1:3], 'big')}, echo "
                f"0x{echo:04X} at {int.from_bytes(answer[1:3], 'big')}")
    if fc == FunctionCode.WRITE_MULTIPLE_REGISTERS and len(request) >= 5 and len(answer) >= 5:
        return (f"wrote {int.from_bytes(request[3:5], 'big')} register(s) at "
                f"{int.from_bytes(request[1:3], 'big')}, answer says "
                f"{int.from_bytes(answer[3:5], 'big')} at {int.from_bytes(answer[1:3], 'big')}")
    if fc in READS and len(request) == 5:
        return (f"asked {int.from_bytes(request[3:5], 'big')} register(s), answer carries "
                f"{max(len(answer) - 2, 0)} byte(s)")
    return f"answer {answer.hex(' ')} does not fit request {request.hex(' ')}"


def _trigger_answer(request: bytes, code: TriggerStatus) -> bytes:
    """The TRIGGER answer (0x42, address, code) the device's function gives ``request``."""
    return bytes([FunctionCode.TRIGGER]) + request[1:3] + int(code).to_bytes(2, "big")


@dataclass(slots=True)
class _Request:
    tag: Any
    unit: int
    pdu: bytes  #: as submitted (a TRIGGER travels as ``wire``: a state read, an FC06 write)
    wire: bytes  #: the PDU put on the line
    allowed: int  #: sends allowed (1 for anything not harmless to repeat)
    state_read: bool = False  #: ``wire`` is a trigger start's read of the trigger's state
    attempts: int = 0
    deadline: float = 0.0
    stretch_until: float = 0.0  #: the latest an answer still arriving may push the deadline
    sent_at: float = 0.0  #: when the last send left
    misfit: str = ""  #: the last answer of this function from the unit that did not fit


class RtuMaster:
    """One Modbus RTU master on one line. See the module docstring."""

    max_inflight = 1  #: one request on the line at a time
    numbered = False  #: a plain slave numbers nothing: there is no number to pin or re-send

    def __init__(self, regmap: RegisterMap, *, unit: int = 1, baudrate: int | None = None,
                 timeout: float = 0.2, attempts: int = 5, turnaround: float = 0.1,
                 char_format: CharFormat = MODBUS_CHAR_FORMAT) -> None:
        if not 0 <= unit <= 247:
            raise ValueError(f"unit id {unit} outside 0..247")
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        if not timeout > 0:
            raise ValueError("timeout must be > 0")
        self.regmap = regmap
        self.unit = unit
        self.baudrate = DEFAULT_BAUDRATE if baudrate is None else baudrate
        self.char_format = char_format
        self.timing = rtu_timing(baudrate, char_format)
        self.frame_gap = self.timing.t35
        self.char_time = self.timing.char_time
        self.timeout = timeout
        self.attempts = attempts
        self.turnaround = turnaround
        self.ignored = 0  #: frames that were no answer to the request out (stray, late, other unit)
        self.late = 0  #: frames that arrived while no request was out (a late answer): dropped
        self.late_guard = True  #: after a request got no answer, wait as long again before the next
        self.sent = 0  #: request frames written
        self._queue: deque[_Request] = deque()
        self._out = bytearray()
        self._current: _Request | None = None
        self._quiet_until = 0.0
        self._stale = False  #: input arrived while no request was out, since the last tick
        self._drained = 0  #: rounds of such input dropped before the next request
        self._events: deque[Completion] = deque()
        self._decoder = self._new_decoder()

    def _new_decoder(self) -> RtuDecoder:
        return RtuDecoder(response_frame_length, baudrate=self.baudrate, other_length_of=None,
                          timing=self.timing)

    # ------------------------------------------------------------------------------ input
    def attempts_for(self, pdu: bytes, unit: int | None = None) -> int:
        """Sends allowed for ``pdu``: ``attempts`` if repeating it is harmless, else 1."""
        if (self.unit if unit is None else unit) == BROADCAST_UNIT:
            return 1
        return self.attempts if retry_allowed(pdu, self.regmap) else 1

    def check(self, pdu: bytes, unit: int | None = None) -> None:
        """Refuse, before anything is queued, a request this session cannot carry to a plain
        slave (``LocalProtocolError``; ``ValueError`` for a PDU that cannot travel)."""
        u = self.unit if unit is None else unit
        if not 0 <= u <= 247:
            raise LocalProtocolError(f"unit id {u} outside 0..247")
        if not pdu:
            raise LocalProtocolError("empty request PDU")
        fc = pdu[0]
        if fc not in CARRIED:
            if fc in IDEMLINK_ONLY:
                raise LocalProtocolError(
                    f"{FunctionCode(fc).name} (0x{fc:02X}) is an idemlink function, which a "
                    "standard Modbus RTU slave does not have; nothing was sent")
            raise LocalProtocolError(
                f"function 0x{fc:02X} is not one this master carries (FC03/FC04 reads, FC06/FC16 "
                "writes, the trigger; FC01/FC02, FC05/FC15 and FC22 for what a map holds); "
                "nothing was sent")
        start = fc == FunctionCode.TRIGGER and pdu[3:5] == b"\x00\x01"
        if fc == FunctionCode.TRIGGER and (len(pdu) != 5 or pdu[3:5] not in (b"\x00\x00",
                                                                             b"\x00\x01")):
            raise LocalProtocolError("a trigger on a Modbus RTU slave writes 1 (start) or 0 "
                                     "(reset); nothing was sent")
        if u == BROADCAST_UNIT and (fc in READS or fc in BIT_READS or start):
            raise LocalProtocolError(
                "a read cannot be broadcast (unit 0): no slave answers it"
                if fc in READS or fc in BIT_READS else
                "a trigger start reads the trigger's state first, which a broadcast (unit 0) "
                "cannot")
        encode_rtu(u, pdu)  # ValueError for a PDU that cannot travel, before it is queued

    def submit(self, pdu: bytes, now: float, *, tag: Any = None, unit: int | None = None,
               set_only: bool | None = None, number: tuple[int, int] | None = None) -> None:
        """Queue a request PDU (no unit id, no CRC) for ``unit`` (default: the session's); it
        leaves on a later ``tick``. ``set_only`` is not taken from the caller (the map decides
        what is retried); a ``number`` cannot be pinned (``LocalProtocolError``)."""
        u = self.unit if unit is None else unit
        self.check(pdu, u)
        if number is not None:
            raise LocalProtocolError("a plain Modbus slave numbers nothing: no request number "
                                     "can be pinned")
        if pdu[0] == FunctionCode.TRIGGER:
            address = pdu[1:3]
            if pdu[3:5] == b"\x00\x01":
                read = bytes([FunctionCode.READ_HOLDING_REGISTERS]) + address + b"\x00\x01"
                req = _Request(tag, u, pdu, read, self.attempts, state_read=True)
            else:
                reset = bytes([FunctionCode.WRITE_SINGLE_REGISTER]) + address + b"\x00\x00"
                req = _Request(tag, u, pdu, reset, 1)
        else:
            req = _Request(tag, u, pdu, pdu, self.attempts_for(pdu, u))
        self._queue.append(req)

    def receive_data(self, data: bytes, now: float) -> None:
        if not data:
            return
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("rx RTU bytes %s", data.hex(" "))
        if self._current is None:
            self._stale = True
        self._decoder.receive_data(data, now)
        req = self._current
        if req is not None:  # an answer still arriving keeps the wait open a little longer
            req.deadline = max(req.deadline, min(now + self.frame_gap + self.char_time,
                                                 req.stretch_until))
        while (frame := self._decoder.next_event()) is not None:
            req = self._current
            if req is None:
                self.late += 1
                self._ignore(frame.unit, frame.pdu, "no request out (a late answer)")
            elif req.unit == BROADCAST_UNIT or frame.unit != req.unit:
                self._ignore(frame.unit, frame.pdu, "no request out to that unit")
            elif not answer_fits(req.wire, frame.pdu):
                if frame.pdu[:1] == req.wire[:1]:
                    req.misfit = misfit(req.wire, frame.pdu)
                self._ignore(frame.unit, frame.pdu, req.misfit or "another function")
            else:
                if frame_log.isEnabledFor(logging.DEBUG):
                    frame_log.debug("rx RTU unit=%d fc=0x%02x: the answer", frame.unit,
                                    frame.pdu[0])
                self._answered(req, frame.pdu, now)

    def tick(self, now: float) -> None:
        req = self._current
        if req is not None and now >= req.deadline:
            if req.unit == BROADCAST_UNIT or req.attempts >= req.allowed:
                self._unanswered(req, now)
            else:
                self._send(req, now)
        if self._current is None and self._queue and now >= self._quiet_until:
            if self._stale and self._drained < DRAIN_ROUNDS:
                self._drained += 1  # what came answers nothing: read again before sending
            else:
                self._drained = 0
                req = self._queue.popleft()
                self._current = req
                self._send(req, now)
        self._stale = False

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
    def outstanding(self) -> int:
        """Requests out or queued."""
        return len(self._queue) + (self._current is not None)

    @property
    def busy(self) -> bool:
        """A request is out or queued."""
        return self.outstanding > 0

    def abandon(self, status: Status, tags: Collection[Any] | None = None) -> None:
        """Settle every request: the one out is UNKNOWN with ``status`` (it may have run; a
        trigger start's state read changed nothing: NOT_EXECUTED), the queued ones NOT_EXECUTED
        (never sent). With ``tags``, only the requests submitted under those tags (one caller of
        a shared pipeline gave up; the others go on); when the one out is among them, nothing
        more is sent before its deadline, so its late answer is not taken for the next
        request's."""
        req = self._current
        if req is not None and (tags is None or req.tag in tags):
            self._current = None
            if tags is not None:
                self._quiet_until = max(self._quiet_until, req.deadline)
            if req.state_read:
                self._events.append(Completion(req.tag, Outcome.NOT_EXECUTED, None,
                                               detail="stopped while reading the trigger's "
                                                      "state; nothing written"))
            else:
                self._events.append(Completion(req.tag, Outcome.UNKNOWN, status,
                                               attempts=req.attempts))
            self._out.clear()
        kept: deque[_Request] = deque()
        while self._queue:
            req = self._queue.popleft()
            if tags is not None and req.tag not in tags:
                kept.append(req)
                continue
            self._events.append(Completion(req.tag, Outcome.NOT_EXECUTED, None))
        self._queue = kept
        if tags is None:
            self._out.clear()

    # ---------------------------------------------------------------------------- internal
    def _send(self, req: _Request, now: float) -> None:
        frame = encode_rtu(req.unit, req.wire)
        self._decoder = self._new_decoder()  # what arrived before this request answers nothing
        self._out += frame
        self.sent += 1
        req.attempts += 1
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("tx RTU unit=%d fc=0x%02x attempt=%d: %s", req.unit, req.wire[0],
                            req.attempts, frame.hex(" "))
        on_line = len(frame) * self.char_time
        req.sent_at = now
        if req.unit == BROADCAST_UNIT:
            req.deadline = now + on_line + self.turnaround
            return
        answer = expected_answer_length(req.wire) * self.char_time
        req.deadline = now + on_line + self.timeout + answer
        req.stretch_until = req.deadline + MAX_RTU_FRAME * self.char_time + self.frame_gap

    def _ignore(self, unit: int, pdu: bytes, why: str) -> None:
        self.ignored += 1
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("rx RTU unit=%d fc=0x%02x ignored: %s", unit,
                            pdu[0] if pdu else 0, why)

    def _answered(self, req: _Request, pdu: bytes, now: float) -> None:
        code = exception_code(pdu)
        if code is not None and code not in OWN_EXCEPTIONS:
            self._other_exception(req, code, now)
            return
        outcome, status, exc = classify_answer(req.wire, pdu)
        if req.state_read:
            self._state_read(req, pdu, exc, now)
        elif req.pdu[0] == FunctionCode.TRIGGER and exc is None:
            self._complete(req, outcome, status, None, _trigger_answer(req.pdu,
                                                                        TriggerStatus.ACCEPTED),
                           now)
        else:
            self._complete(req, outcome, status, exc, pdu, now)

    def _other_exception(self, req: _Request, code: int, now: float) -> None:
        """An exception code outside 01-04 (a third-party device's or a gateway's, on RTU and
        TCP alike): its outcome by what the Modbus spec says it means (module docstring)."""
        gateway = code in (GATEWAY_PATH_UNAVAILABLE, GATEWAY_TARGET_FAILED)
        said = f"{'gateway' if gateway else 'Modbus'} exception {exception_name(code)}"
        if code == GATEWAY_TARGET_FAILED:  # the target did not answer the gateway: no answer
            if req.attempts < req.allowed:
                self._send(req, now)  # as if unanswered: sent again where the map allows it
                return
            if req.state_read:
                self._complete(req, Outcome.NOT_EXECUTED, None, None, b"", now, attempts=0,
                               detail=f"the trigger's state read: {said}; nothing written",
                               code=code)
                return
            self._complete(req, Outcome.UNKNOWN, Status.NO_ANSWER, None, b"", now,
                           detail=f"{said}: the device did not answer the gateway", code=code)
            return
        if req.state_read:  # a read changed nothing, whatever its earlier sends did
            self._complete(req, Outcome.NOT_EXECUTED, None, None, b"", now, attempts=0,
                           detail=f"the trigger's state read: {said}; nothing written", code=code)
            return
        if code in NOTHING_DONE:
            if req.attempts > 1:  # an earlier send went unanswered: it may have run
                self._complete(req, Outcome.UNKNOWN, Status.NO_ANSWER, None, b"", now,
                               detail=f"{said} after {req.attempts - 1} unanswered send(s)",
                               code=code)
                return
            self._complete(req, Outcome.NOT_EXECUTED, None, None, b"", now,
                           detail=f"{said}: {NOTHING_DONE[code]}", code=code)
            return
        self._complete(req, Outcome.UNKNOWN, None, None, b"", now, code=code,
                       detail=f"{said}: {UNSETTLED.get(code, 'whether it ran is not known')}")

    def _state_read(self, req: _Request, pdu: bytes, exc: ModbusException | None,
                    now: float) -> None:
        """A trigger start's state read answered: the device's state machine says whether to
        write 1 (the action starts), or what the TRIGGER function would have answered."""
        if exc is not None:  # nothing written: REJECTED when the request itself is wrong
            outcome = (Outcome.REJECTED if exc is not ModbusException.SERVER_DEVICE_FAILURE
                       else Outcome.NOT_EXECUTED)
            self._complete(req, outcome, None, exc, b"", now, attempts=0,
                           detail=f"the trigger's state read answered {exc.name}; "
                                  "nothing written")
            return
        state = int.from_bytes(pdu[2:4], "big")
        spec = self.regmap.at(int.from_bytes(req.pdu[1:3], "big"))
        row = start_row(spec.kind if spec is not None else RegisterKind.TRIGGER, state)
        if row is None:
            self._complete(req, Outcome.NOT_EXECUTED, None, None, b"", now, attempts=0,
                           detail=f"trigger state 0x{state:04X} is none of IDLE, RUNNING, "
                                  "DONE; nothing written")
        elif row[1] is TriggerAction.START:  # IDLE: now the write, sent once, after t3.5
            req.wire = bytes([FunctionCode.WRITE_SINGLE_REGISTER]) + req.pdu[1:5]
            req.allowed, req.attempts, req.misfit, req.state_read = 1, 0, "", False
            self._current = None
            self._quiet_until = now + self.frame_gap
            self._queue.appendleft(req)
        else:  # RUNNING or DONE: nothing started, as the device's TRIGGER function answers
            self._complete(req, Outcome.OK, Status.OK, None, _trigger_answer(req.pdu, row[2]),
                           now, attempts=0)

    def _unanswered(self, req: _Request, now: float) -> None:
        wait = req.deadline - req.sent_at
        if req.state_read:
            why = (f"the trigger's state read got no fitting answer ({req.misfit})" if req.misfit
                   else f"the trigger's state read got no answer ({req.attempts} attempt(s))")
            self._complete(req, Outcome.NOT_EXECUTED, None, None, b"", now, attempts=0,
                           detail=f"{why}; nothing written")
        else:
            status = Status.ANSWER_MISMATCH if req.misfit else Status.NO_ANSWER
            self._complete(req, Outcome.UNKNOWN, status, None, b"", now, detail=req.misfit)
        if self.late_guard and req.unit != BROADCAST_UNIT:
            # its answer may still come: leave the line that long again before the next request,
            # so the late answer lands while no request is out (dropped, counted in ``late``)
            self._quiet_until = max(self._quiet_until, now + wait)

    def _complete(self, req: _Request, outcome: Outcome, status: Status | None,
                  exc: ModbusException | None, pdu: bytes, now: float, *,
                  attempts: int | None = None, detail: str = "", code: int | None = None) -> None:
        self._current = None
        self._quiet_until = now + self.frame_gap
        if code is None and exc is not None:
            code = int(exc)
        self._events.append(Completion(req.tag, outcome, status, exc, pdu,
                                       attempts=req.attempts if attempts is None else attempts,
                                       detail=detail, exception_code=code))
