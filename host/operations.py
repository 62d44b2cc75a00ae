"""Every driver operation, written once as a transport-free step generator, for both protocols.

An operation (``Steps``) is a generator of I/O requests: it yields ``(bytes to write, seconds to
wait for input)``, is sent the bytes that arrived, and returns its result; an operation that needs
blocking work done (reading a batch's files, YMODEM on the port itself) yields a ``Job`` instead
(``job_steps``), which the driver runs — on the port it lends when ``Job.on_port``, off the event
loop in the asyncio drivers — and is sent ``b""``. It never touches a port: ``Operations`` holds a
sans-I/O session (the framed protocol's ``HostSession``, or ``RtuMaster`` for a plain Modbus RTU
slave: both take request PDUs and settle each in one ``Completion``) and the bookkeeping of one
device (which command each tag stands for, the UNKNOWN that blocks the handle, the counters) and
asks a clock for the time. A driver only moves bytes: the four drivers (``Device``,
``AsyncDevice``, ``RtuDevice``, ``AsyncRtuDevice``) run these steps with the one request loop of
``idemlink.host.drive`` and hold no rule of their own.

The rules here, once for both protocols: the continuous pipeline and which commands may overtake
which (``flow_steps``, ``conflict``; a plain slave takes one request at a time); a wave of
commuting commands (``wave_steps``); reconciling an UNKNOWN by the device's evidence
(``reconcile_steps``, ``evidence_steps``) and a command recorded before it leaves
(``recorded_steps``); and what an interrupted or link-lost operation leaves (``interrupted``,
``link_lost``): every request it holds settled, an UNKNOWN that may have had an effect blocking
the handle (``result``, the one place that rule is applied). What differs by protocol is a
subclass's: the HELLO handshake, the map check and the re-send under a request's own number
(``idemlink.host.framed_operations.FramedOperations``); the probe of a slave and what a plain slave
cannot carry (``idemlink.host.rtu_operations.RtuOperations``). What may be retried, and how a
trigger is carried, is the session's (``HostSession``, ``RtuMaster``).

``OPERATIONS`` lists the operations every driver offers (besides the ``CommandBuilder`` helpers
they inherit); a test checks each driver against it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, cast

from idemlink.host.command import (
    Command,
    CommandBuilder,
    CommandKind,
    Reconciliation,
    Result,
    SentRequest,
    answer_of,
    file_info_of,
    judge_read_back,
    read_back_of,
)
from idemlink.host.errors import LinkLost, UnknownOutstanding
from idemlink.host.evidence import no_resend_reason, resend_number, with_evidence
from idemlink.protocol.host_session import Completion, HelloFailed, SessionOpened
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.payloads import DeviceInfo
from idemlink.protocol.registers import RegisterKind, RegisterMap, RegisterSpec

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Job(Generic[T]):
    """Blocking work an operation hands its driver: ``work(port)`` — the driver's pyserial port
    when ``on_port`` (lent for the time of the job; YMODEM), else None. The driver stores what it
    returns in ``value`` and sends the operation ``b""``, or raises what it raised inside the
    operation. The asyncio drivers run it in a worker thread."""

    work: Callable[[Any], T]
    on_port: bool = False
    value: T | None = None


Round = tuple[bytes, float]
"""One I/O round: the bytes to write, then how long to wait for input."""
Steps = Generator[Round | Job[Any], bytes, T]
"""An operation as a generator: yields an I/O round (bytes to write, seconds to wait for input)
and is sent the bytes that arrived, or yields a ``Job``; returns its result."""


def job_steps(work: Callable[[Any], T], *, on_port: bool = False) -> Steps[T]:
    """``work`` done by the driver (``Job``) as a step of an operation; returns its value."""
    job = Job(work, on_port)
    yield job
    return cast(T, job.value)

ReconcilePlan = Generator[list[Command], list[Result], Reconciliation]
"""A read-back as a generator: yields the reads to make, is sent their results, returns the verdict."""

OPERATIONS = (
    "connect", "close", "run", "stream", "execute", "read", "write", "write_if_generation",
    "clear_faults", "trigger", "trigger_reset", "trigger_status", "file_info", "send_files",
    "reconcile", "reconcile_sent", "execute_recorded", "run_recorded", "acknowledge_unknown",
    "info", "unknown",
)
"""The operations of a device handle, the same in all four drivers (each also inherits every
``CommandBuilder`` helper: ``spec``, ``read_command``, ``write_command``...). On a plain Modbus RTU
slave the idemlink-only ones (``write_if_generation``, ``file_info``, ``send_files``) are refused
before anything is sent (``LocalProtocolError``)."""

RECONCILE_ROUNDS = 3
"""Read-back attempts of ``reconcile()`` (each with the session's own retries)."""


class Clock(Protocol):
    """Where the time comes from: a transport (its clock travels with it), blocking or not."""

    def now(self) -> float: ...


Event = Completion | SessionOpened | HelloFailed


class Session(Protocol):
    """What the operations need of a sans-I/O session (``HostSession``, ``RtuMaster``): the shape
    of docs/ARCHITECTURE.md, requests in through ``submit``, one ``Completion`` each out."""

    @property
    def max_inflight(self) -> int: ...
    @property
    def outstanding(self) -> int: ...
    def submit(self, pdu: bytes, now: float, *, set_only: bool, tag: Any = None,
               number: tuple[int, int] | None = None) -> None: ...
    def receive_data(self, data: bytes, now: float) -> None: ...
    def tick(self, now: float) -> None: ...
    def data_to_send(self) -> bytes: ...
    def next_event(self) -> Event | None: ...
    def next_deadline(self) -> float | None: ...
    def abandon(self, status: Status, tags: Collection[Any] | None = None) -> None: ...


S = TypeVar("S", bound=Session)


@dataclass(slots=True)
class DriverStats:
    commands: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------- which commands commute


def _span(c: Command) -> range:
    return range(c.address, c.address + max(c.count, len(c.values), 1))


def conflict(a: Command, b: Command, generation: int | None = None) -> bool:
    """Would running ``a`` and ``b`` in either order give different results? ``generation`` is
    the address of the map's generation counter, which every effective write moves."""
    return _flows_conflict(_flow(0, a, generation), _flow(0, b, generation))


@dataclass(frozen=True, slots=True)
class _Flow:
    """A command of the continuous pipeline, with what the dependency rule needs precomputed."""

    tag: int
    command: Command
    effect: bool
    span: range
    sees_generation: bool  #: a conditional write, or a read of the generation counter
    #: called with the request and the number it will travel under just before it is submitted
    #: (a recorded command: ``SharedPipeline.submit``'s ``records``); raising: never sent
    record: Callable[[SentRequest], None] | None = None


def _flow(tag: int, c: Command, generation: int | None,
          record: Callable[[SentRequest], None] | None = None) -> _Flow:
    span = _span(c)
    sees = (c.kind is CommandKind.WRITE_IF_GENERATION
            or (generation is not None and generation in span))
    return _Flow(tag, c, c.may_have_effect, span, sees, record)


def _flows_conflict(a: _Flow, b: _Flow) -> bool:
    """``conflict`` on precomputed facts (the pipeline checks it often): overlapping registers
    when one may have an effect; a command that sees the generation counter (a conditional
    write's guard, a read of the counter) next to any command that may have an effect."""
    if not (a.effect or b.effect):
        return False
    if (a.sees_generation and b.effect) or (b.sees_generation and a.effect):
        return True
    return a.span.start < b.span.stop and b.span.start < a.span.stop


def reissuable(c: Command, regmap: RegisterMap) -> bool:
    """Harmless to run again after a reboot: a read, or a write (a mask write) that touches
    only HOLDING registers or coils (checked against the map, whoever built the Command)."""
    if not c.may_have_effect:
        return True
    if c.kind is not CommandKind.WRITE and c.kind is not CommandKind.MASK_WRITE:
        return False
    span = range(c.address, c.address + (1 if c.kind is CommandKind.MASK_WRITE
                                         else len(c.values)))
    specs = [regmap.spec_at(a, c.space) for a in span]
    return all(s is not None and s.kind in (RegisterKind.HOLDING, RegisterKind.COIL)
               for s in specs)


# ---------------------------------------------------------------------- the operations


class Machine(Protocol):
    """What an I/O round needs of a sans-I/O machine (a session, ``idemlink.protocol.rtu_scan.
    BusScan``)."""

    def next_deadline(self) -> float | None: ...
    def data_to_send(self) -> bytes: ...
    def receive_data(self, data: bytes, now: float) -> None: ...
    def tick(self, now: float) -> None: ...


def io_round(machine: Machine, clock: Clock) -> Steps[None]:
    """One I/O round of every request loop: send what the machine has, wait for input until its
    next deadline (at most 50 ms when it has none), feed what came, let time pass."""
    deadline = machine.next_deadline()
    wait = 0.05 if deadline is None else max(0.0, deadline - clock.now())
    data = yield machine.data_to_send(), wait
    now = clock.now()
    if data:
        machine.receive_data(data, now)
    machine.tick(now)


R = TypeVar("R")


class Scanner(Machine, Protocol[R]):
    """A scan machine (``idemlink.protocol.rtu_scan.BusScan``, ``idemlink.protocol.framed_scan.
    FramedScan``): probes until ``done``, its findings in ``reports``."""

    reports: list[R]

    @property
    def done(self) -> bool: ...


def scan_steps(scan: Scanner[R], clock: Clock) -> Steps[list[R]]:
    """``scan`` as an operation: its bytes out, the line's in, until every address is probed."""
    scan.tick(clock.now())
    while not scan.done:
        yield from io_round(scan, clock)
    return scan.reports


def no_job(job: Job[Any]) -> None:  # pragma: no cover - a scan asks for none
    """The job runner of an operation that asks for no job (a scan)."""
    raise AssertionError("a scan runs no job")



class Operations(Generic[S]):
    """One device's session and bookkeeping, and every operation on it as ``Steps``. What
    differs by protocol is a subclass's (``FramedOperations``, ``RtuOperations``): the hooks
    ``connect_steps``, ``open_steps``, ``info``, ``open_epoch``, ``numbered``, ``resend_steps``,
    ``require_open`` and ``refuse_unsupported``."""

    numbered = False
    """Whether the session gives each request a number known before it leaves (the framed
    protocol's (epoch, seq)), which a journal records and a re-send asks about."""

    def __init__(self, clock: Clock, session: S, regmap: RegisterMap) -> None:
        self.clock = clock
        self.regmap = regmap
        self.builder = CommandBuilder(regmap)
        self.session = session
        self.unknown: Result | None = None
        self.stats = DriverStats()
        self.completions: dict[int, Completion] = {}  #: tag -> completion, not yet a Result
        self.awaiting: dict[int, Command] = {}  #: tag -> command, taken and not yet settled
        #: called with every Result made, also those of an operation that then fails (a test
        #: harness that must know under which (epoch, seq) every request travelled)
        self.on_result: Callable[[Result], None] | None = None
        #: tag -> where its Result goes, for a command of a shared pipeline (``SharedPipeline``)
        self.sinks: dict[int, Callable[[Result], None]] = {}
        #: tag -> Result of the requests the last interrupted or link-lost operation settled
        self.abandoned: dict[int, Result] = {}
        self._tag = 0

    # ------------------------------------------------------------------ by protocol
    @property
    def info(self) -> DeviceInfo | None:
        """What the device advertised at HELLO (None before ``connect``; a plain slave: None)."""
        return None

    def connect_steps(self) -> Steps[None]:
        """Make sure a device answers, the way the protocol can (``NoDevice`` otherwise)."""
        raise NotImplementedError
        yield  # pragma: no cover - a generator

    def open_steps(self) -> Steps[None]:
        """``connect_steps`` when a driver opens a port (a subclass may say more on failure)."""
        return (yield from self.connect_steps())

    def open_epoch(self) -> int | None:
        """The boot epoch requests can be re-sent in now (None: no re-send can ask anything)."""
        return None

    def next_number(self) -> tuple[int, int] | None:
        """The number the next request will travel under, when ``numbered`` and certain."""
        return None

    def queued_number(self) -> tuple[int, int] | None:
        """The number a request submitted now will travel under behind what is queued and out
        (``HostSession.queued_number``), when ``numbered``; None otherwise."""
        return None

    def resend_steps(self, c: Command, number: tuple[int, int]) -> Steps[Result]:
        """``c`` sent again under its original ``number`` (only a numbered protocol can)."""
        raise LocalProtocolError("this session numbers nothing: nothing can be re-sent under a "
                                 "number")
        yield  # pragma: no cover - a generator

    def require_open(self) -> None:
        """``LocalProtocolError`` when nothing could be sent (the framed session is closed)."""

    def refuse_unsupported(self, c: Command) -> None:
        """``LocalProtocolError`` for a command the session cannot carry, before anything of the
        operation is sent."""

    # ------------------------------------------------------------------ the I/O round
    def io_round(self) -> Steps[None]:
        """One I/O round of every request loop (``io_round``) on this device's session."""
        return io_round(self.session, self.clock)

    def _exchange(
        self, done: Callable[[], bool], sink: list[SessionOpened | HelloFailed] | None = None
    ) -> Steps[None]:
        next_event = self.session.next_event
        while True:
            while (ev := next_event()) is not None:
                if isinstance(ev, Completion):
                    self.completions[ev.tag] = ev
                elif sink is not None:
                    sink.append(ev)
            if done():
                return
            yield from self.io_round()

    # ------------------------------------------------------------------ settling
    def interrupted(self, exc: BaseException) -> None:
        """The caller stopped the operation (KeyboardInterrupt, asyncio cancellation): settle its
        requests as CANCELLED (a cancelled read blocks nothing, a cancelled write does). The
        interrupt propagates unchanged; the settled requests ride along on it so a caller that
        reports it (the CLI) can say whether something may have run."""
        exc.settled_results = tuple(  # type: ignore[attr-defined]
            self._settle_abandoned(Status.CANCELLED))

    def link_lost(self, exc: BaseException) -> LinkLost:
        """The transport failed under the operation (``exc``, its cause): its requests settled,
        as a ``LinkLost`` the driver raises inside the operation."""
        results = self._settle_abandoned(Status.LINK_LOST)
        sent = sum(r.outcome is Outcome.UNKNOWN for r in results)
        what = (f"{sent} request(s) may have run (UNKNOWN)" if sent
                else "nothing was out")
        lost = LinkLost(f"the port failed: {exc}; {what}", tuple(results))
        lost.__cause__ = exc
        return lost

    def _settle_abandoned(self, status: Status) -> list[Result]:
        """Give up every request the session holds (``HostSession.abandon``) and turn those of
        the interrupted operation into Results; an UNKNOWN one blocks the handle if it may have
        had an effect (``result``)."""
        self.session.abandon(status)
        while (ev := self.session.next_event()) is not None:
            if isinstance(ev, Completion):
                self.completions[ev.tag] = ev
        never_sent = Completion(None, Outcome.NOT_EXECUTED, None)  # taken, not yet submitted
        self.abandoned = {tag: self.result(c, self.completions.pop(tag, never_sent))
                          for tag, c in sorted(self.awaiting.items())}
        self.completions.clear()
        self.awaiting.clear()
        self.sinks.clear()
        return list(self.abandoned.values())

    def result(self, c: Command, comp: Completion) -> Result:
        """The caller's Result of a completion; an UNKNOWN of a command that may have had an
        effect blocks the handle (a read changed nothing: there is nothing to reconcile)."""
        values, code = answer_of(c, comp.pdu)
        file = file_info_of(c, comp.pdu) if comp.outcome is Outcome.OK else None
        r = Result(c, comp.outcome, comp.status, comp.exception, values, code, comp.replay,
                   comp.attempts, comp.reissued, comp.seq, comp.epoch, comp.sent_as, file,
                   comp.answered, comp.detail, comp.exception_code)
        self.stats.commands += 1
        self.stats.outcomes[r.outcome.name] = self.stats.outcomes.get(r.outcome.name, 0) + 1
        if r.outcome is Outcome.UNKNOWN and self.unknown is None and c.may_have_effect:
            self.unknown = r
        if self.on_result is not None:
            self.on_result(r)
        return r

    def refuse_if_blocked(self) -> None:
        """``UnknownOutstanding`` while an UNKNOWN that may have had an effect is unacknowledged."""
        if self.unknown is not None:
            status = self.unknown.status
            raise UnknownOutstanding(
                f"a previous {self.unknown.command.kind.value} ended UNKNOWN"
                f"{f' ({status.name})' if status is not None else ''}; "
                "reconcile() and acknowledge_unknown() first")

    # ------------------------------------------------------------------ the pipeline
    @property
    def lookahead(self) -> int:
        """How far a ``stream`` reads its commands ahead: twice the pipeline depth."""
        return 2 * max(self.session.max_inflight, 1)

    def run_steps(self, commands: list[Command]) -> Steps[list[Result]]:
        """``commands`` pipelined, one Result each in order (``UnknownOutstanding`` if blocked;
        a command the session cannot carry is refused before any is sent)."""
        self.refuse_if_blocked()
        for c in commands:
            self.refuse_unsupported(c)
        results: list[Result] = []
        yield from self.flow_steps(iter(commands), results.append, None)
        return results

    def flow_steps(self, source: Iterator[Command], emit: Callable[[Result], None],
                   lookahead: int | None) -> Steps[None]:
        """The continuous pipeline as an operation: pull commands from ``source`` (all at once
        when ``lookahead`` is None), submit each as soon as the session has room and no earlier
        unfinished command conflicts with it, ``emit`` results in submission order
        (``Pipeline`` holds the rule)."""
        self.require_open()
        pipe = Pipeline(self, emit)
        clock = self.clock
        exhausted = False
        while True:
            if pipe.settle():  # blocked: what was not sent stays unsent
                exhausted = True  # and nothing more is taken from the source
            if not exhausted and (lookahead is None or pipe.pending < lookahead):
                exhausted = self._take(source, pipe, lookahead)
            if pipe.held:
                pipe.submit_ready(clock.now())
            if exhausted and pipe.empty:
                return
            yield from self.io_round()

    def _take(self, source: Iterator[Command], pipe: Pipeline, lookahead: int | None) -> bool:
        """Move commands from ``source`` into ``pipe`` (up to the lookahead); True once
        exhausted."""
        while lookahead is None or pipe.pending < lookahead:
            try:
                c = next(source)
            except StopIteration:
                return True
            pipe.take(c)
        return False

    def wave_steps(self, cmds: list[Command]) -> Steps[list[Result]]:
        """Submit ``cmds`` together (they commute: reconcile's read-back, FILE_INFO) and wait for
        all of them. Allowed while the handle is blocked."""
        self.require_open()
        for c in cmds:
            self.refuse_unsupported(c)
        now = self.clock.now()
        tags = []
        for c in cmds:
            self._tag += 1
            tags.append(self._tag)
            self.awaiting[self._tag] = c
            self.session.submit(c.pdu(), now, set_only=reissuable(c, self.regmap), tag=self._tag)
        yield from self._exchange(lambda: all(t in self.completions for t in tags))
        return [self.result(self.awaiting.pop(t), self.completions.pop(t)) for t in tags]

    # ------------------------------------------------------------------ UNKNOWN handling
    def reconcile_steps(self, result: Result | None) -> Steps[Reconciliation | None]:
        """Settle an UNKNOWN command (default: the blocking one) by the device's evidence and
        read back what it touched (``evidence_steps``). A read has no effect to reconcile: it is
        answered without sending anything."""
        r = result if result is not None else self.unknown
        if r is None:
            return None
        return (yield from self.evidence_steps(r.command, r.sent_as))

    def evidence_steps(self, c: Command, sent_as: tuple[tuple[int, int], ...],
                       read_back: bool = True) -> Steps[Reconciliation]:
        """Did ``c``, sent under the numbers ``sent_as`` (this session's, or a dead process's
        from its journal), run? Re-sent under its last number when that is in the device's
        current epoch (``idemlink.host.evidence``: the device replays, says evicted, refuses it
        as another request's number, or runs it now, once), then the state it touched read
        back. Allowed while the handle is blocked; a file hand-over is never re-sent (it would
        hand the port to YMODEM). A plain slave keeps no record: only the read-back.
        ``read_back=False``: the re-send's verdict alone, nothing read — no request under a new
        number, which would put other old numbers still to be asked behind the device's window
        (a new session starts a window ahead): a caller settling several starts with those."""
        resent: Result | None = None
        s = self.session
        open_epoch = self.open_epoch()
        number = resend_number(sent_as, open_epoch)
        if (c.may_have_effect and c.kind is not CommandKind.FILE_RECEIVE and number is not None
                and not s.outstanding):
            resent = yield from self.resend_steps(c, number)
        if not read_back and c.may_have_effect:
            return with_evidence(Reconciliation(c, {}, None, ""), resent,
                                 no_resend_reason(sent_as, open_epoch, numbered=self.numbered))
        plan = reconcile_plan(c, self.regmap)
        try:
            reads = next(plan)
            while True:
                reads = plan.send((yield from self.wave_steps(reads)))
        except StopIteration as done:
            verdict: Reconciliation = done.value
        if not c.may_have_effect:
            return verdict
        return with_evidence(verdict, resent,
                             no_resend_reason(sent_as, open_epoch, numbered=self.numbered))

    def recorded_steps(self, c: Command, record: Callable[[SentRequest], None]) -> Steps[Result]:
        """Run ``c`` alone, calling ``record(SentRequest(pdu, number))`` *before* it leaves (a
        journal keeps it, so a later process can ask the device whether it ran; ``number`` is
        the (epoch, seq) it travels under, None on a session that numbers nothing). If
        ``record`` raises, nothing was sent. If a numbered session has no certain number to give
        (a handshake after a reboot is under way, or requests are outstanding), nothing is
        recorded or sent: NOT_EXECUTED."""
        self.refuse_if_blocked()
        self.require_open()
        self.refuse_unsupported(c)
        s = self.session
        self._tag += 1
        tag = self._tag
        number = self.next_number()
        if number is None and self.numbered:
            return self.result(c, Completion(tag, Outcome.NOT_EXECUTED, None))
        record(SentRequest(c.pdu(), number))
        self.awaiting[tag] = c
        s.submit(c.pdu(), self.clock.now(), set_only=False, tag=tag, number=number)
        yield from self._exchange(lambda: tag in self.completions)
        return self.result(self.awaiting.pop(tag), self.completions.pop(tag))


def reconcile_plan(c: Command, regmap: RegisterMap) -> ReconcilePlan:
    """The read-back of an UNKNOWN command, for any driver: yields the reads to make (each time
    the same; reads are harmless to repeat): exactly what the command touched, and the
    generation counter when ``regmap`` has one; is sent their results, and returns the verdict
    (``judge_read_back``) once a round read everything, or "still unknown" after
    ``RECONCILE_ROUNDS`` failed rounds. A command with nothing to read back (``read_back_of``)
    returns at once."""
    reads = read_back_of(c, regmap.generation_address)
    if isinstance(reads, Reconciliation):
        return reads

    def spec(address: int) -> RegisterSpec:
        found = regmap.spec_at(address, c.space)
        if found is None:
            raise LocalProtocolError(f"no {c.space.value} at {address} in the map {regmap.name}")
        return found

    for _ in range(RECONCILE_ROUNDS):
        back = yield reads
        if all(b.outcome is Outcome.OK and b.values for b in back):
            generation = back[1].values[0] if len(back) > 1 else None
            return judge_read_back(c, back[0].values, generation, spec)
    return Reconciliation(c, {}, None, "read-back failed; still unknown")


# ---------------------------------------------------------------------- the pipeline's state


class Pipeline:
    """The continuous pipeline's state for one run of a request loop, and its rules: which
    command may leave (``submit_ready``: room in the session, no unfinished earlier command it
    does not commute with), what a blocked handle does to what waits (``settle``: never sent,
    NOT_EXECUTED), and giving up some commands only (``withdraw``). ``flow_steps`` (``run``,
    ``stream``: one caller, results in submission order to ``emit``) and ``SharedPipeline``
    (many callers, each result to its own sink as soon as it settles) both run it."""

    def __init__(self, ops: Operations[Any], emit: Callable[[Result], None] | None = None) -> None:
        self.ops = ops
        #: results in submission order; None: each to its tag's sink (``Operations.sinks``)
        self.emit = emit
        self.held: deque[_Flow] = deque()  # taken, not yet submitted
        self.live: dict[int, _Flow] = {}  # submitted, not yet completed
        self.done: dict[int, Result] = {}  # completed, waiting for an earlier one (in order)
        self.order: deque[int] = deque()  # tags in submission order, not yet emitted
        self.effectful_live = 0
        self._generation = ops.regmap.generation_address

    @property
    def pending(self) -> int:
        """Commands taken and not yet completed."""
        return len(self.held) + len(self.live)

    @property
    def empty(self) -> bool:
        return not self.held and not self.live and not self.order

    def take(self, c: Command, sink: Callable[[Result], None] | None = None,
             record: Callable[[SentRequest], None] | None = None) -> int:
        """Take ``c`` into the pipeline (refused before anything is sent if the session cannot
        carry it); its tag. ``sink`` gets its Result when results are not emitted in order.
        ``record``: a recorded command (``Operations.recorded_steps``' rule, on the pipeline):
        called with its PDU and the number it will travel under just before it is submitted,
        and submitted under that number only; no certain number, or ``record`` raising: never
        sent, NOT_EXECUTED."""
        ops = self.ops
        ops.refuse_unsupported(c)
        ops._tag += 1
        tag = ops._tag
        ops.awaiting[tag] = c
        if self.emit is not None:
            self.order.append(tag)
        elif sink is not None:
            ops.sinks[tag] = sink
        self.held.append(_flow(tag, c, self._generation, record))
        return tag

    def _settled(self, tag: int, r: Result) -> None:
        if self.emit is not None:
            self.done[tag] = r
        else:
            sink = self.ops.sinks.pop(tag, None)
            if sink is not None:
                sink(r)

    def _never_sent(self, f: _Flow) -> None:
        ops = self.ops
        self._settled(f.tag, ops.result(ops.awaiting.pop(f.tag),
                                        Completion(f.tag, Outcome.NOT_EXECUTED, None)))

    def settle(self) -> bool:
        """Take the session's completions and hand their results out; True when the handle is
        blocked (an UNKNOWN that may have had an effect), after settling every held command as
        NOT_EXECUTED: once blocked, nothing more is sent."""
        ops = self.ops
        next_event = ops.session.next_event
        live = self.live
        while True:
            while (ev := next_event()) is not None:
                if isinstance(ev, Completion) and ev.tag in live:
                    f = live.pop(ev.tag)
                    self.effectful_live -= f.effect
                    self._settled(f.tag, ops.result(ops.awaiting.pop(f.tag), ev))
            if self.emit is not None:
                order, done, emit = self.order, self.done, self.emit
                while order and order[0] in done:
                    emit(done.pop(order.popleft()))
            if ops.unknown is None:
                return False
            if not self.held:
                return True
            for f in self.held:
                self._never_sent(f)
            self.held.clear()

    def submit_ready(self, now: float) -> None:
        """Submit every held command (in order, scanning at most the lookahead) that conflicts
        with no unfinished earlier one, while the session has room."""
        ops = self.ops
        s = ops.session
        room = s.max_inflight - s.outstanding
        if room <= 0:
            return
        held, live = self.held, self.live
        # Only a command that may have an effect conflicts with anything: without one (a stream
        # of reads) nothing is checked.
        check = bool(self.effectful_live) or any(f.effect for f in held)
        blockers: list[_Flow] = list(live.values()) if check else []
        scan = ops.lookahead
        kept: list[_Flow] = []
        while held and room > 0 and scan > 0:
            f = held.popleft()
            scan -= 1
            if check and any(_flows_conflict(f, b) for b in blockers):
                kept.append(f)
                blockers.append(f)
                continue
            if f.record is None:
                s.submit(f.command.pdu(), now, set_only=reissuable(f.command, ops.regmap),
                         tag=f.tag)
            elif not self._recorded(f, now):
                continue  # never sent: settled NOT_EXECUTED, blocks nothing
            live[f.tag] = f
            self.effectful_live += f.effect
            room -= 1
            if check:
                blockers.append(f)
        held.extendleft(reversed(kept))

    def _recorded(self, f: _Flow, now: float) -> bool:
        """Submit a recorded command under the number its ``record`` was given (True), or
        settle it NOT_EXECUTED, never sent (False)."""
        ops = self.ops
        assert f.record is not None
        number = ops.queued_number()
        if number is None and ops.numbered:
            self._never_sent(f)
            return False
        pdu = f.command.pdu()
        try:
            f.record(SentRequest(pdu, number))
        except Exception:  # the recorder says why (its own error); nothing was sent
            self._never_sent(f)
            return False
        ops.session.submit(pdu, now, set_only=False, tag=f.tag, number=number)
        return True

    def withdraw(self, tags: Collection[int], status: Status) -> None:
        """Give up the commands of ``tags`` only (their caller was cancelled), the others go on:
        one not yet submitted is NOT_EXECUTED, one the session holds is abandoned
        (``abandon(status, tags)``: UNKNOWN with ``status`` if it was sent, which blocks the
        handle if it may have had an effect, as any UNKNOWN does)."""
        kept: deque[_Flow] = deque()
        for f in self.held:
            if f.tag in tags:
                self._never_sent(f)
            else:
                kept.append(f)
        self.held = kept
        out = [t for t in tags if t in self.live]
        if out:
            self.ops.session.abandon(status, out)
        self.settle()


@dataclass(eq=False)
class Ticket:
    """One caller's commands on a ``SharedPipeline`` and their results as they settle (in the
    caller's order). ``on_done`` is called once every command has its result or ``error`` is
    set (the request loop stopped under it)."""

    commands: list[Command]
    results: list[Result | None] = field(default_factory=list)
    #: per command, its recorder (``Pipeline.take``'s ``record``), or None
    records: list[Callable[[SentRequest], None] | None] = field(default_factory=list)
    tags: dict[int, int] = field(default_factory=dict)  #: tag -> index, once taken
    taken: int = 0  #: commands taken into the pipeline so far (in order)
    left: int = 0
    error: BaseException | None = None
    on_done: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.results = [None] * len(self.commands)
        self.left = len(self.commands)
        if not self.records:
            self.records = [None] * len(self.commands)

    @property
    def done(self) -> bool:
        return self.left == 0 or self.error is not None

    def settle(self, i: int, r: Result) -> None:
        if self.results[i] is not None:
            return
        self.results[i] = r
        self.left -= 1
        if self.left == 0 and self.on_done is not None:
            self.on_done()

    def settled(self) -> tuple[Result, ...]:
        return tuple(r for r in self.results if r is not None)


class SharedPipeline:
    """One device's continuous pipeline shared by many callers (tasks of an ``AsyncDevice``,
    threads of a ``Device``): each caller ``submit``s its commands as a ``Ticket`` and waits for
    it; one request loop runs ``steps`` — ``Pipeline``'s rule, the one ``stream`` runs — so the
    callers' requests are on the line together up to the device's window, and only commands
    that do not commute wait for each other (in the order they were submitted, whoever
    submitted them).

    Outcomes per caller are the rules of a single ``run``: a caller is refused
    (``UnknownOutstanding``) while the handle is blocked; when a command ends UNKNOWN and may
    have had an effect, the handle is blocked for everyone: the other callers' commands already
    on the line settle with their own outcomes, those not yet sent settle NOT_EXECUTED.
    ``withdraw`` settles one cancelled caller's commands only (CANCELLED/UNKNOWN if sent, which
    blocks if it may have had an effect; NOT_EXECUTED if not). ``stopped``: the loop ended under
    everyone (link lost, interrupted), every open caller gets its own settled results and an
    error. ``paused``: operations that need the device alone wait; while it is non-zero nothing
    new is taken and ``steps`` returns once what is out has settled."""

    def __init__(self, ops: Operations[Any]) -> None:
        self.ops = ops
        self.incoming: deque[Ticket] = deque()  #: submitted, not yet wholly taken
        self.open: set[Ticket] = set()  #: submitted, not yet done
        self.pipe: Pipeline | None = None  #: while ``steps`` runs
        self.paused = 0
        #: callers that gave up while another thread drives the loop: withdrawn by the loop
        self.withdrawals: deque[tuple[Ticket, Status]] = deque()

    def submit(self, commands: list[Command],
               records: list[Callable[[SentRequest], None] | None] | None = None) -> Ticket:
        """A caller's commands, queued (``UnknownOutstanding`` while blocked; a command the
        session cannot carry is refused before any is queued). ``records``: per command, a
        recorder (``Pipeline.take``), so a recorded call shares the line with the others."""
        ops = self.ops
        ops.refuse_if_blocked()
        ops.require_open()
        for c in commands:
            ops.refuse_unsupported(c)
        t = Ticket(commands, records=list(records or [None] * len(commands)))
        if commands:
            self.incoming.append(t)
            self.open.add(t)
        return t

    @property
    def room(self) -> bool:
        """Whether the session could take one more request now (a waiting loop is worth
        waking)."""
        s: Session = self.ops.session
        return s.outstanding < s.max_inflight

    def steps(self) -> Steps[None]:
        """The request loop's operation: take the callers' commands, submit what may leave,
        hand each result to its caller; returns once nothing is queued or out (or, paused,
        once nothing is out)."""
        ops = self.ops
        ops.require_open()
        pipe = self.pipe = Pipeline(ops)
        clock = ops.clock
        try:
            while True:
                while self.withdrawals:
                    self.withdraw(*self.withdrawals.popleft())
                if pipe.settle():  # blocked: what waits is never sent
                    if self.incoming:
                        self._take(pipe, None)
                        continue
                elif not self.paused:
                    self._take(pipe, ops.lookahead)
                if pipe.held:
                    pipe.submit_ready(clock.now())
                if pipe.empty and (self.paused or not self.incoming):
                    return
                yield from ops.io_round()
        finally:
            self.pipe = None

    def _take(self, pipe: Pipeline, lookahead: int | None) -> None:
        incoming = self.incoming
        while incoming and (lookahead is None or pipe.pending < lookahead):
            t = incoming[0]
            i = t.taken
            t.tags[pipe.take(t.commands[i], partial(self._settle, t, i), t.records[i])] = i
            t.taken += 1
            if t.taken == len(t.commands):
                incoming.popleft()

    def _settle(self, t: Ticket, i: int, r: Result) -> None:
        t.settle(i, r)
        if t.done:
            self.open.discard(t)

    def _never_taken(self, t: Ticket) -> None:
        """Settle what of ``t`` was never taken: NOT_EXECUTED, nothing of it was sent."""
        if t in self.incoming:
            self.incoming.remove(t)
        for i in range(t.taken, len(t.commands)):
            self._settle(t, i, self.ops.result(t.commands[i],
                                               Completion(None, Outcome.NOT_EXECUTED, None)))
        t.taken = len(t.commands)

    def withdraw(self, t: Ticket, status: Status) -> tuple[Result, ...]:
        """Settle ``t``'s commands only (its caller gave up, ``status``: CANCELLED); the other
        callers' commands go on. Returns its results. Called by whoever drives the loop (or
        while nobody does); a caller in another thread queues ``(t, status)`` on
        ``withdrawals`` instead, which the loop takes at its next round. Withdrawing a ticket
        that is done changes nothing."""
        self._never_taken(t)
        out = [tag for tag, i in t.tags.items() if t.results[i] is None]
        if out and self.pipe is not None:
            self.pipe.withdraw(out, status)
        self.open.discard(t)
        return t.settled()

    def stopped(self, exc: BaseException) -> None:
        """The request loop ended with ``exc`` (the port failed, it was interrupted or closed):
        the session settled what it held (``Operations.abandoned``); every open caller gets its
        results and ``error``: a ``LinkLost`` carrying its own results, or ``exc`` itself when
        it is an error of the operation (not an interruption)."""
        ops = self.ops
        for t in list(self.open):
            for tag, i in t.tags.items():
                if t.results[i] is None and tag in ops.abandoned:
                    self._settle(t, i, ops.abandoned[tag])
            self._never_taken(t)
            own = t.settled()
            if isinstance(exc, LinkLost):
                err: BaseException = LinkLost(str(exc), own)
                err.__cause__ = exc.__cause__
            elif isinstance(exc, Exception):
                err = exc
            else:
                sent = sum(r.outcome is Outcome.UNKNOWN for r in own)
                what = f"{sent} request(s) may have run (UNKNOWN)" if sent else "nothing was out"
                err = LinkLost(f"the device's request loop was stopped ({type(exc).__name__}: "
                               f"the device was closed or interrupted); {what}", own)
            t.error = err
            self.open.discard(t)
            if t.on_done is not None:
                t.on_done()
        ops.abandoned = {}


class DeviceHandle(CommandBuilder):
    """What the four drivers share besides the operations they drive: the command helpers
    (``CommandBuilder``), the ``ops`` they run, and the handle's UNKNOWN."""

    ops: Operations[Any]

    @property
    def unknown(self) -> Result | None:
        """The UNKNOWN result that blocks the handle (None: not blocked)."""
        return self.ops.unknown

    @property
    def info(self) -> DeviceInfo | None:
        """What the device advertised at HELLO (None before ``connect``)."""
        return self.ops.info

    def acknowledge_unknown(self) -> None:
        """Unblock the handle once the caller has reconciled."""
        self.ops.unknown = None


__all__ = [
    "OPERATIONS",
    "RECONCILE_ROUNDS",
    "Clock",
    "DeviceHandle",
    "DriverStats",
    "Job",
    "Operations",
    "Pipeline",
    "Round",
    "Session",
    "SharedPipeline",
    "Steps",
    "Ticket",
    "conflict",
    "job_steps",
    "reconcile_plan",
    "reissuable",
]
