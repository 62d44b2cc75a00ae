"""The host driver: a typed handle on one idemlink device over any byte transport.

``Device.open(url)`` opens any pyserial URL (``/dev/ttyUSB0``, the simulator's pty, ``loop://``,
``socket://``, ``rfc2217://``, ``faulty://…``) without toggling DTR/RTS by default, runs the HELLO
handshake and refuses a device whose protocol version or contract hash differs from ours; a port
where no idemlink device but a Modbus RTU slave answers is refused as ``AnswersModbusRtu``.

Every command returns a ``Result`` with exactly one ``Outcome`` — a protocol outcome is never an
exception. An UNKNOWN result of a command that may have had an effect (``Command.may_have_effect``:
writes, conditional writes, triggers, fault clears, the file hand-over — every function but the
read-only ones, ``idemlink.protocol.modbus.may_have_effect``) blocks the handle: further commands
raise ``UnknownOutstanding`` until ``acknowledge_unknown()``; ``reconcile()`` reads back what the
unknown command touched. A read (register read, FILE_INFO) that got no answer is UNKNOWN too and
carries no values, but it changed nothing: it does not block, and the next command proceeds.

A failing port (an OSError / ``PortError`` from the transport) ends the operation with
``LinkLost``, whose ``results`` settle every request of it (UNKNOWN/LINK_LOST if it was sent, which
blocks the handle if it may have had an effect); an interrupted operation (KeyboardInterrupt)
settles its requests as UNKNOWN/CANCELLED before the interrupt propagates, by the same rule.
Nothing is left in the session to run later.

``file_info(name)`` reads a stored file's size and CRC-32C back (FILE_INFO, read-only: like any
read, its UNKNOWN does not block the handle). ``send_files`` uses it to verify every
file of a framed YMODEM batch once the port is back in framed mode: a file is ok only when the
device holds exactly its bytes (``FileResult.verified``).

A ``Device`` (an ``RtuDevice``) may be shared between threads: ``run``, ``execute`` and the named
commands of every thread go on one ``idemlink.host.operations.SharedPipeline``, so the threads'
requests are on the line together up to the window, ordered and settled by the rules of a single
``run``. The thread that finds the line free drives the request loop for everyone until its own
commands are settled, then hands it to a waiting thread. Operations that need the device alone
(``stream``, ``send_files``, ``reconcile``, ``reconcile_sent``, ``execute_recorded``,
``connect``) wait for the others' requests out to settle; one called by the thread iterating a
``stream`` of the same device is refused (``LocalProtocolError``).

This module is the blocking drivers' shell: ``BlockingDriver`` runs the operations of
``idemlink.host.operations`` (transport-free step generators over a sans-I/O session) on a
blocking ``Transport`` with the request loop ``idemlink.host.drive.rounds``, moving bytes and
nothing else, and offers every operation of ``idemlink.host.operations.OPERATIONS``, one line each.
``Device`` is it over the framed protocol (``FramedOperations``); ``idemlink.host.rtu_device.
RtuDevice`` over a plain Modbus RTU slave; ``idemlink.host.aio`` has both awaited. The rest lives
by reason to change: the line and opening a port in ``idemlink.host.transport``, the errors in
``idemlink.host.errors``, commands and results in ``idemlink.host.command``, the file batch in
``idemlink.host.file_transfer``. Each name has one import path, its defining module's (``from
idemlink.host.command import Result``, ``from idemlink.host.errors import LinkLost``):
``tests/test_layers.py`` refuses an import through a module that only imports the name.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Self, TypeVar

from idemlink.host import file_transfer
from idemlink.host.command import (
    BlockingCommands,
    Command,
    Reconciliation,
    Result,
    SentRequest,
)
from idemlink.host.drive import rounds
from idemlink.host.framed_operations import FramedOperations
from idemlink.host.operations import (
    DeviceHandle,
    DriverStats,
    Job,
    Operations,
    SharedPipeline,
    Steps,
    Ticket,
)
from idemlink.host.transport import SerialTransport, Transport
from idemlink.protocol.frame import check_address
from idemlink.protocol.host_session import HostSession
from idemlink.protocol.key_file import HostKey, host_keys
from idemlink.protocol.outcome import LocalProtocolError, Status
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

if TYPE_CHECKING:
    from idemlink.protocol.ymodem_files import ProgressCallback, TransferReport
    from idemlink.protocol.ymodem_sender import SenderConfig

T = TypeVar("T")


class BlockingDriver(DeviceHandle, BlockingCommands):
    """Every operation of ``OPERATIONS`` on a blocking ``Transport``: the shell ``Device`` and
    ``RtuDevice`` share (each supplies its ``ops``). Threads share its pipeline (the module
    docstring)."""

    ops: Operations[Any]

    def __init__(self, transport: Transport, ops: Operations[Any]) -> None:
        super().__init__(ops.regmap)
        self.transport = transport
        #: the session, its bookkeeping and every operation (the transport is only its clock)
        self.ops = ops
        self._cond = threading.Condition()  #: guards who has the line; notified when it changes
        #: the thread that has the line: one running an operation alone (or iterating a
        #: stream), or one driving the shared pipeline's loop for every thread's commands
        self._owner: int | None = None
        #: every thread's run/execute/read/write/trigger... on one pipeline
        self._shared = SharedPipeline(ops)
        #: the shared pipeline's request loop, handed from thread to thread between rounds
        self._sharing: Generator[None, None, None] | None = None

    def connect(self) -> None:
        """Make sure the device answers (HELLO; on a plain slave, a read of its first
        register); refuses an incompatible device."""
        self._drive(self.ops.connect_steps())

    def close(self) -> None:
        self._stop_sharing()
        self.transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the blocking loop
    def _drive(self, steps: Steps[T]) -> T:
        """Run an operation on the blocking transport to its end (``_rounds``)."""
        loop = self._rounds(steps)
        try:
            while True:
                next(loop)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def _rounds(self, steps: Steps[T]) -> Generator[None, None, T]:
        """``idemlink.host.drive.rounds`` with the device alone (``stream`` hands results out
        between rounds): another thread's operation waits for it; the same thread's is refused
        (it would wait for itself)."""
        self._acquire(steps)
        try:
            return (yield from rounds(self.ops, self.transport, self._run_job, steps))
        finally:
            self._release()

    def _refuse_reentry(self, steps: Steps[Any] | None = None) -> None:
        if self._owner == threading.get_ident():
            if steps is not None:
                steps.close()
            raise LocalProtocolError(
                "another operation of this device is in progress (a stream being iterated?): "
                "one operation at a time per device")

    def _acquire(self, steps: Steps[Any]) -> None:
        """Have the line alone: the shared pipeline takes nothing new meanwhile, and what it
        has out is settled (driven here) before the operation starts."""
        shared = self._shared
        with self._cond:
            self._refuse_reentry(steps)
            shared.paused += 1
            try:
                while self._owner is not None:
                    self._cond.wait()
                self._owner = threading.get_ident()
            except BaseException:
                shared.paused -= 1
                steps.close()
                raise
        try:
            self._drain()
        except BaseException:
            steps.close()
            self._release()
            raise
        finally:
            with self._cond:
                shared.paused -= 1

    def _release(self) -> None:
        with self._cond:
            self._owner = None
            self._cond.notify_all()

    def _drain(self) -> None:
        """Run the shared pipeline's loop (paused) until what it has out is settled."""
        run = self._sharing
        if run is None:
            return
        try:
            for _ in run:
                pass
        except BaseException as exc:
            self._shared.stopped(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._sharing = None

    def _share(self, commands: list[Command]) -> list[Result]:
        """``commands`` on the shared pipeline with every other thread's (``SharedPipeline``):
        their results, in order. The thread that finds the line free drives the loop for
        everyone until its own commands are settled, then hands it on; the others wait."""
        return self._share_recorded(commands, None)

    def _share_recorded(self, commands: list[Command],
                        records: list[Callable[[SentRequest], None] | None] | None,
                        ) -> list[Result]:
        """``_share``, each command with its recorder (``SharedPipeline.submit``)."""
        shared = self._shared
        me = threading.get_ident()
        with self._cond:
            self._refuse_reentry()
            ticket = shared.submit(commands, records)
            ticket.on_done = self._notify
            if self._owner is not None and shared.room:  # another thread waits for input:
                self._wake()  # let this command leave now
        try:
            while True:
                with self._cond:
                    while not ticket.done and (self._owner is not None
                                               or (shared.paused and self._sharing is None)):
                        self._cond.wait()
                    if ticket.done:
                        break
                    self._owner = me
                try:
                    self._drive_shared(ticket)
                finally:
                    self._release()
        except BaseException as exc:  # KeyboardInterrupt
            with self._cond:
                if not ticket.done and self._owner is not None:  # the driving thread withdraws it
                    shared.withdrawals.append((ticket, Status.CANCELLED))
                    self._wake()
                while not ticket.done:
                    if self._owner is None:  # nobody drives: withdraw it here
                        shared.withdraw(ticket, Status.CANCELLED)
                    else:
                        self._cond.wait()
            exc.settled_results = ticket.settled()  # type: ignore[attr-defined]
            raise
        if ticket.error is not None:
            raise ticket.error
        return [r for r in ticket.results if r is not None]

    def _drive_shared(self, ticket: Ticket) -> None:
        """Drive the shared pipeline's loop, one round at a time, until ``ticket`` is done."""
        if self._sharing is None:
            self._sharing = rounds(self.ops, self.transport, self._run_job, self._shared.steps())
        run = self._sharing
        try:
            while not ticket.done:
                next(run)
        except StopIteration:
            self._sharing = None
        except BaseException as exc:
            self._sharing = None
            self._shared.stopped(exc)
            if not isinstance(exc, Exception):
                raise

    def _wake(self) -> None:
        """Cut the driving thread's wait for input short (``SerialTransport.wake``), if the
        transport can."""
        wake = getattr(self.transport, "wake", None)
        if wake is not None:
            wake()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _stop_sharing(self) -> None:
        """Stop the shared pipeline's loop (closing): threads still waiting get their settled
        results and ``LinkLost``."""
        with self._cond:
            while self._owner not in (None, threading.get_ident()):
                self._cond.wait()
            run, self._sharing = self._sharing, None
        if run is not None:
            run.close()
            self._shared.stopped(GeneratorExit())

    def _run_job(self, job: Job[Any]) -> None:
        """An operation's blocking work, here and now (on this transport's port if it asks)."""
        job.value = job.work(getattr(self.transport, "port", None) if job.on_port else None)

    def _lends_port(self) -> bool:
        """Whether a job can have this transport's pyserial port (YMODEM)."""
        return getattr(self.transport, "port", None) is not None

    # ------------------------------------------------------------------ commands
    def run(self, commands: Iterable[Command]) -> list[Result]:
        """Send commands pipelined and return one Result each, in order (``stream`` collected),
        on one pipeline with every other thread's commands. Raises ``UnknownOutstanding`` while
        an UNKNOWN is unacknowledged."""
        return self._share(list(commands))

    def stream(self, commands: Iterable[Command]) -> Iterator[Result]:
        """The continuous pipeline: yield one Result per command, in submission order, while
        later commands are already on the line.

        Requests keep leaving while answers arrive, up to the negotiated depth (the device's
        advertised window and ``max_inflight``; one at a time on a plain Modbus slave). A
        command waits only for the earlier commands it does not commute with
        (``idemlink.host.operations.conflict``: overlapping registers when one may have an
        effect, a conditional write or a read of the generation counter after any effective
        write); everything else overtakes it. Once a command that may have had an effect ends
        UNKNOWN the handle is blocked: commands not yet sent are not sent (NOT_EXECUTED, no
        status) and nothing more is taken from ``commands``: the stream ends after the results
        of the commands it had taken (``run`` takes them all, so every command gets its
        result). An unanswered read blocks nothing. ``commands`` is read lazily (at most about
        twice the pipeline depth ahead), so it may be endless. Leaving the loop early
        (``break``, an exception) settles what is still out as CANCELLED, like an interrupted
        ``run``. The device runs one operation at a time: calling another of its operations
        inside the loop raises ``LocalProtocolError``."""
        self.ops.refuse_if_blocked()
        ready: deque[Result] = deque()
        steps = self.ops.flow_steps(iter(commands), ready.append, self.ops.lookahead)
        for _ in self._rounds(steps):
            while ready:
                yield ready.popleft()
        while ready:
            yield ready.popleft()

    def execute(self, command: Command) -> Result:
        return self.run([command])[0]

    def file_info(self, name: str) -> Result:
        """Size and CRC-32C of the committed file ``name`` on the device (``Result.file``;
        ``FileInfoStatus.ABSENT`` when it has none). Read-only: harmless to retry or replay.
        A name the device would refuse raises ``ValueError`` before anything is sent."""
        return self.execute(self.file_info_command(name))

    def send_files(
        self,
        paths: Iterable[str],
        *,
        progress: ProgressCallback | None = None,
        config: SenderConfig | None = None,
        overwrite: bool = False,
    ) -> tuple[Result, TransferReport | None]:
        """Hand the device's port to YMODEM (FILE_RECEIVE), send ``paths`` as one batch, return
        to framed mode and read every file back (FILE_INFO): ``idemlink.host.file_transfer.
        send_files_steps``. The report is None when the device did not switch.

        YMODEM's bytes cannot always prove a commit (docs/YMODEM.md), so each file the batch
        reported ok or "not confirmed" is checked against the device's size and CRC-32C of what
        it stored: the same bytes → ok and ``verified``; absent or different → failed
        (``verified=False``); no answer → the YMODEM verdict stays, ``verified=None`` ("not
        verified"). A file the batch reported failed is not read back (a device that already had
        it refused it). Local digests are taken before the batch; files already on the device
        byte for byte are not sent again.

        If the hand-over answer is lost (UNKNOWN), the batch is attempted anyway: a device that
        did switch answers the sender's header, and a completed batch settles the UNKNOWN.
        """
        return self._drive(file_transfer.send_files_steps(
            self.ops, paths, lends_port=self._lends_port(), progress=progress, config=config,
            overwrite=overwrite))

    # ------------------------------------------------------------------ UNKNOWN handling
    def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        """Settle an UNKNOWN command (default: the blocking one) by the device's own evidence
        and read back what it touched. While the device is in the boot epoch it was sent in, it
        is re-sent under its own number: the device replays its answer or says it ran
        (``executed`` True), proves another request holds the number (False), or runs it now,
        once (True); otherwise — another boot, a plain Modbus slave — ``executed`` stays None,
        whatever the state read back shows (``idemlink.host.evidence``). Allowed while the
        handle is blocked (only ``acknowledge_unknown`` unblocks it). A read has no effect to
        reconcile: it is answered without sending anything."""
        return self._drive(self.ops.reconcile_steps(result))

    def reconcile_sent(self, command: Command,
                       sent_as: tuple[tuple[int, int], ...] = (),
                       read_back: bool = True) -> Reconciliation:
        """``reconcile`` for a command another process sent under the numbers ``sent_as`` (a
        journal's record, ``execute_recorded``; none on a plain Modbus slave)."""
        return self._drive(self.ops.evidence_steps(command, sent_as, read_back))

    def run_recorded(self, command: Command, record: Callable[[SentRequest], None]) -> Result:
        """``execute_recorded`` on the shared pipeline: ``record`` is called with the request
        and the number it will travel under just before it leaves (``Pipeline.take``), while
        other callers' commands — recorded or not — are on the line too, ordered by the
        pipeline's rule (``conflict``). ``record`` raising, or no certain number to give: never
        sent, NOT_EXECUTED (no status, nothing in ``sent_as``)."""
        return self._share_recorded([command], [record])[0]

    def execute_recorded(self, command: Command,
                         record: Callable[[SentRequest], None]) -> Result:
        """Run ``command`` alone, calling ``record`` with its PDU and (epoch, seq) — None on a
        plain Modbus slave — before it leaves, so that a later process can ask the device
        whether it ran (``reconcile_sent``). If ``record`` raises, nothing was sent."""
        return self._drive(self.ops.recorded_steps(command, record))


BD = TypeVar("BD", bound=BlockingDriver)


def opened(dev: BD, probe: bool = True) -> BD:
    """``dev`` once its ``open_steps`` went through (``probe``: else as it is), its transport
    closed again if they did not (``idemlink.host.aio._opened`` awaited)."""
    try:
        if probe:
            dev._drive(dev.ops.open_steps())
    except BaseException:
        dev.close()
        raise
    return dev


class Device(BlockingDriver):
    """A session with one idemlink device. See the module docstring."""

    ops: FramedOperations

    def __init__(
        self,
        transport: Transport,
        *,
        regmap: RegisterMap = DEFAULT_MAP,
        timeout: float = 0.2,
        attempts: int = 5,
        max_inflight: int | None = None,
        check_map: bool = True,
        address: int | None = None,
        key: bytes | tuple[bytes, ...] | None = None,
    ) -> None:
        super().__init__(transport, FramedOperations(
            transport, regmap=regmap, timeout=timeout, attempts=attempts,
            max_inflight=max_inflight, check_map=check_map, address=address, key=key))


    @property
    def session(self) -> HostSession:
        return self.ops.session

    @property
    def stats(self) -> DriverStats:
        return self.ops.stats

    @property
    def check_map(self) -> bool:
        return self.ops.check_map

    @classmethod
    def open(cls, url: str, *, baudrate: int = 115200, bytesize: int = 8, parity: str = "N",
             stopbits: float = 1, keep_lines: bool = True,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, timeout: float = 0.2,
             attempts: int = 5, max_inflight: int | None = None, check_map: bool = True,
             trace: str | os.PathLike[str] | None = None,
             address: int | None = None,
             key: HostKey | None = None, echo: bool = False,
             guard: float = 0.0) -> Device:
        """Open ``url`` (any pyserial URL; ``bytesize``/``parity``/``stopbits``: the line's
        character format, 8N1 by default) and run the HELLO handshake. ``regmap`` is the device's
        register map (a ``RegisterMap``, a map file's path or a built-in map's name); a device
        that advertises another map is refused (``IncompatibleDevice``) unless ``check_map`` is
        False (for tools that only ask who is there, like ``idemlink info``); a port where a
        Modbus RTU slave answers instead is ``AnswersModbusRtu``. ``trace``: append every frame
        both ways to that file as JSON lines (``idemlink.host.trace``); a trace file that cannot
        be opened raises its ``OSError`` with the port closed again. ``address`` (1..247): the
        device of that bus address (docs/BUS.md): every frame goes ADDRESSED to it, only its
        answers are taken, and a device that does not say it is that address is refused
        (``IncompatibleDevice``); None, point to point (the device on this line). ``key``: the
        device's long-term key (32 bytes) or a private key file's path (docs/SECURITY.md): every
        frame then carries a MAC, and a device that does not sign its own with that key is
        refused (``IncompatibleDevice``: no downgrade); a tuple of keys (a rotation: the first
        used first, a device naming another of them gets it); None, unauthenticated as before.
        A key file that is not private is ``KeyFileError`` before the port is opened.
        ``idemlink+http://HOST:PORT/PORTNAME`` is a device behind an ``idemlink gateway``
        (``idemlink.host.gateway_device.GatewayDevice``: the same API through its calls, the
        token from ``$IDEMLINK_GATEWAY_TOKEN`` or the file ``$IDEMLINK_GATEWAY_TOKEN_FILE``).
        ``echo`` and ``guard``: an RS-485 adapter's echo removed (a wrong one is
        ``EchoMismatch``) and the master's turnaround guard (``idemlink.host.half_duplex``), as
        ``Bus.open`` and ``RtuDevice.open`` have them."""
        if url.startswith(("idemlink+http://", "idemlink+https://")):
            from idemlink.host.gateway_device import GatewayDevice, NotThroughGateway

            if address is not None or key is not None or trace is not None or echo or guard:
                raise NotThroughGateway("address, key, trace, echo and guard are the gateway's "
                                         "own through "
                                         "a gateway URL (docs/API.md, \"Through a gateway\")")
            return GatewayDevice.open_url(url, regmap=regmap, check_map=check_map)
        if address is not None:
            check_address(address)
        key = host_keys(key)
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        transport: Transport = SerialTransport(url, baudrate=baudrate, bytesize=bytesize,
                                               parity=parity, stopbits=stopbits,
                                               keep_lines=keep_lines)
        if echo or guard:
            from idemlink.host.half_duplex import HalfDuplexTransport

            transport = HalfDuplexTransport(transport, echo=echo, guard=guard)
        if trace is not None:
            from idemlink.host.trace import TracingTransport

            try:
                transport = TracingTransport(transport, trace, rm)
            except OSError:
                transport.close()
                raise
        dev = cls(transport, regmap=rm, timeout=timeout, attempts=attempts,
                  max_inflight=max_inflight, check_map=check_map, address=address, key=key)
        return opened(dev)


__all__ = [
    "BlockingDriver",
    "Device",
]
