"""The asyncio shell: the same drivers, awaited instead of blocking.

``AsyncDevice`` (an idemlink device) and ``AsyncRtuDevice`` (a plain Modbus RTU slave) run exactly
the operations their blocking twins ``idemlink.host.device.Device`` and
``idemlink.host.rtu_device.RtuDevice`` run — ``idemlink.host.operations.Operations``, each a
transport-free generator of I/O requests over a sans-I/O session — with an ``AsyncTransport``
(``await write``, ``await read(timeout)``) and the awaited spelling of the one request loop
(``idemlink.host.drive.drive_async``). There is no second copy of the loop's rules, the retry
rules, the epoch rule, the file batch or the result decoding: the command helpers are inherited
from the same ``CommandBuilder``, and every operation of ``OPERATIONS`` is here, one line each
(a test checks every driver against the list, and compares ``AsyncDriver``'s operations with
``BlockingDriver``'s line for line).

``async with AsyncDevice.open(url, ...) as dev:`` opens any pyserial URL with
``AsyncSerialTransport`` (a tty or pty, ``socket://``, ``rfc2217://``, ``loop://``, ``faulty://``)
and runs the HELLO handshake (a port where a Modbus RTU slave answers instead is
``AnswersModbusRtu``); ``dev = await AsyncDevice.open(url)`` works too (then ``await
dev.close()``). ``AsyncRtuDevice.open(url, unit=1, ...)`` the same for a Modbus RTU slave. The
transport itself (the port on the event loop) is ``idemlink.host.aio_transport``'s.

Tasks sharing one device share its pipeline: ``run``, ``execute`` and the named commands of every
task go on one ``idemlink.host.operations.SharedPipeline`` (the ordering and outcome rules are
there, once), driven by one request loop task per device, which alone awaits the transport's
``read``; their requests are on the line together up to the window, and a cancelled task settles
its own commands only. A new command cuts the loop's wait for input short (``_Wakeable``) so it
leaves at once. Operations that need the device alone (``stream``, ``send_files``,
``reconcile``, ``reconcile_sent``, ``execute_recorded``, ``connect``) hold the device's
``asyncio.Lock``: the shared pipeline takes nothing new meanwhile and hands the lock over once what
it has out has settled. Separate devices share nothing, so one event loop drives many devices at
once (``asyncio.gather``). ``stream(commands)`` is an async generator of results in submission
order over the continuous pipeline; close it when leaving early
(``async with contextlib.aclosing(dev.stream(cmds)) as results:``) so the lock is released at once.

Cancellation and timeouts (``task.cancel()``, ``asyncio.timeout``, ``asyncio.wait_for``) have the
blocking driver's outcome semantics: the operation's requests are settled before the cancellation
propagates — UNKNOWN/CANCELLED if sent, NOT_EXECUTED if not — and an UNKNOWN one that may have had an
effect (a write, trigger, fault clear, conditional write, file hand-over) blocks the handle until
``reconcile()`` / ``acknowledge_unknown()``, while a cancelled read blocks nothing. The settled
results ride on the exception (``exc.settled_results``), are logged as a warning, and
``UnknownOutstanding`` names the CANCELLED status. The rule is ``Operations.result``'s; a
transport error raises ``LinkLost`` the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from idemlink.host import file_transfer
from idemlink.host.aio_transport import AsyncSerialTransport, AsyncTransport
from idemlink.host.command import Command, Reconciliation, Result, SentRequest
from idemlink.host.drive import drive_async, nothing
from idemlink.host.framed_operations import FramedOperations
from idemlink.host.operations import (
    OPERATIONS,
    DeviceHandle,
    Job,
    Operations,
    SharedPipeline,
    Steps,
)
from idemlink.host.rtu_device import line_rate
from idemlink.host.rtu_operations import RtuOperations
from idemlink.host.tcp_device import (
    DEFAULT_TCP_ATTEMPTS,
    DEFAULT_TCP_TIMEOUT,
    TcpOperations,
    socket_url,
)
from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.frame import check_address
from idemlink.protocol.key_file import HostKey, host_keys
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

if TYPE_CHECKING:
    from idemlink.protocol.ymodem_files import ProgressCallback, TransferReport
    from idemlink.protocol.ymodem_sender import SenderConfig

log = logging.getLogger(__name__)

T = TypeVar("T")
D = TypeVar("D", bound="AsyncDriver")

PARITY = OPERATIONS
"""The blocking drivers' operations, which the asyncio drivers have too
(``idemlink.host.operations.OPERATIONS``; a test checks every driver against it)."""


class _Opening(Generic[D]):
    """What ``AsyncDevice.open`` returns: await it, or use it in ``async with``."""

    def __init__(self, opener: Callable[[], Awaitable[D]]) -> None:
        self._opener = opener
        self._device: D | None = None

    def __await__(self) -> Generator[Any, None, D]:
        return self._opener().__await__()

    async def __aenter__(self) -> D:
        self._device = await self._opener()
        return self._device

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._device is not None:
            await self._device.close()


class AsyncDriver(DeviceHandle):
    """Every operation of ``OPERATIONS`` on an ``AsyncTransport``: the shell ``AsyncDevice`` and
    ``AsyncRtuDevice`` share (each supplies its ``ops``); ``BlockingDriver`` awaited."""

    ops: Operations[Any]

    def __init__(self, transport: AsyncTransport, ops: Operations[Any]) -> None:
        super().__init__(ops.regmap)
        self.transport = transport
        #: the session, its bookkeeping and every operation (the transport is only its clock)
        self.ops = ops
        #: held by the operation that has the device alone, or by the shared pipeline's loop
        self._lock = asyncio.Lock()
        self._streaming: asyncio.Task[Any] | None = None  #: the task iterating a stream
        #: every task's run/execute/read/write/trigger... on one pipeline (``SharedPipeline``)
        self._shared = SharedPipeline(ops)
        #: bytes written and read on the line so far (a gateway's bus-load figure)
        self.line_bytes = _Counted(transport)
        self._line = _Wakeable(self.line_bytes)  #: the transport, whose wait a new command cuts short
        self._sharer: asyncio.Task[None] | None = None  #: the shared pipeline's request loop

    async def connect(self) -> None:
        """Make sure the device answers (HELLO; on a plain slave, a read of its first
        register); refuses an incompatible device."""
        await self._drive(self.ops.connect_steps())

    async def close(self) -> None:
        await self._stop_sharing()
        await self.transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -------------------------------------------------------------- the request loop
    async def _drive(self, steps: Steps[T]) -> T:
        """``idemlink.host.drive.drive_async`` with the device alone (``_alone``)."""
        self._refuse_inside_stream(steps)
        async with self._alone():
            return await self._loop(steps, nothing)

    def _refuse_inside_stream(self, steps: Steps[Any] | None = None) -> None:
        if self._streaming is not None and self._streaming is asyncio.current_task():
            if steps is not None:
                steps.close()
            # the stream holds the device: waiting for it would never end
            raise LocalProtocolError(
                "this task is iterating a stream of this device: one operation at a time per "
                "device (run the other operation from another task, or after the stream)")

    @contextlib.asynccontextmanager
    async def _alone(self) -> AsyncIterator[None]:
        """The device's lock for an operation that cannot share the line (``stream``,
        ``send_files``, ``reconcile``, ``connect``...): the shared pipeline takes nothing new
        meanwhile, and hands the lock over once what it has out has settled."""
        shared = self._shared
        shared.paused += 1
        try:
            self._line.wake()
            await self._lock.acquire()
        finally:
            shared.paused -= 1
        try:
            yield
        finally:
            self._lock.release()

    async def _share(self, commands: list[Command]) -> list[Result]:
        """``commands`` on the shared pipeline with every other task's (``SharedPipeline``):
        their results, in order. A cancelled caller settles its own commands only."""
        return await self._share_recorded(commands, None)

    async def _share_recorded(self, commands: list[Command],
                              records: list[Callable[[SentRequest], None] | None] | None,
                              ) -> list[Result]:
        """``_share``, each command with its recorder (``SharedPipeline.submit``)."""
        self._refuse_inside_stream()
        shared = self._shared
        ticket = shared.submit(commands, records)
        if ticket.done:
            return []
        done = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not done.done():
                done.set_result(None)

        ticket.on_done = wake
        if self._sharer is None:
            self._sharer = asyncio.ensure_future(self._share_loop())
        elif shared.room or shared.paused:
            self._line.wake()
        try:
            await done
        except BaseException as exc:  # asyncio.CancelledError above all
            # settled just before: the results ride along all the same
            withdrawn = not ticket.done
            settled = shared.withdraw(ticket, Status.CANCELLED) if withdrawn else ticket.settled()
            exc.settled_results = settled  # type: ignore[attr-defined]
            if withdrawn:
                self._line.wake()
                _log_settled(exc)
            raise
        if ticket.error is not None:
            raise ticket.error
        return [r for r in ticket.results if r is not None]

    async def _stop_sharing(self) -> None:
        """Stop the shared pipeline's loop (closing): tasks still waiting get their settled
        results and ``LinkLost``."""
        sharer = self._sharer
        if sharer is not None:
            sharer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sharer

    async def _share_loop(self) -> None:
        """The shared pipeline's request loop: runs while callers have commands queued or out,
        under the device's lock (an operation that needs the device alone waits for it)."""
        shared = self._shared
        try:
            while shared.incoming:
                async with self._lock:
                    await drive_async(self.ops, self._line, self._run_job, shared.steps(), nothing)
        except BaseException as exc:  # the port failed, or close() stopped it
            shared.stopped(exc)
            if not isinstance(exc, Exception):
                _log_settled(exc)
                raise
        finally:
            self._sharer = None

    async def _loop(self, steps: Steps[T], between: Callable[[], None]) -> T:
        """The loop itself; what a cancelled operation left is logged as a warning."""
        try:
            return await drive_async(self.ops, self.line_bytes, self._run_job, steps, between)
        except BaseException as exc:  # asyncio.CancelledError above all
            _log_settled(exc)
            raise

    async def _run_job(self, job: Job[Any]) -> None:
        """An operation's blocking work in a worker thread, the event loop free meanwhile; on
        the transport's pyserial port if it asks (the loop stops reading it meanwhile)."""
        if not job.on_port:
            job.value = await asyncio.to_thread(job.work, None)
            return
        borrowed = getattr(self.transport, "borrowed", None)
        if borrowed is None:
            raise LocalProtocolError("this transport cannot lend its port")
        async with borrowed() as port:
            job.value = await asyncio.to_thread(job.work, port)

    def _lends_port(self) -> bool:
        """Whether a job can have this transport's pyserial port (YMODEM), borrowed from the
        event loop."""
        return getattr(self.transport, "borrowed", None) is not None

    # -------------------------------------------------------------- operations
    async def run(self, commands: Iterable[Command]) -> list[Result]:
        """``commands`` pipelined with every other task's, one Result each in order."""
        return await self._share(list(commands))

    async def stream(self, commands: Iterable[Command]) -> AsyncIterator[Result]:
        """``BlockingDriver.stream`` for asyncio: results in submission order while later
        requests are on the line. Holds the device for its whole run (other tasks' operations
        wait; one of this device's operations awaited inside the loop raises
        ``LocalProtocolError``); leaving early settles what is out as CANCELLED (close it:
        ``contextlib.aclosing``)."""
        ops = self.ops
        ops.refuse_if_blocked()
        ready: list[Result] = []
        async with self._alone():
            ops.refuse_if_blocked()  # another task's operation may have blocked it meanwhile
            self._streaming = asyncio.current_task()
            steps = ops.flow_steps(iter(commands), ready.append, ops.lookahead)
            queue: asyncio.Queue[Result | None] = asyncio.Queue()

            def hand_out() -> None:
                for r in ready:
                    queue.put_nowait(r)
                ready.clear()

            def finished(_: object) -> None:
                hand_out()
                queue.put_nowait(None)

            task = asyncio.ensure_future(self._loop(steps, hand_out))
            task.add_done_callback(finished)
            try:
                while (r := await queue.get()) is not None:
                    yield r
                await task  # raises what the loop raised (LinkLost)
            except BaseException as exc:  # the caller was cancelled or left the loop
                settled = await _stop(task)
                if settled is not None and not hasattr(exc, "settled_results"):
                    exc.settled_results = settled  # type: ignore[attr-defined]
                raise
            finally:
                self._streaming = None
                await _stop(task)

    async def execute(self, command: Command) -> Result:
        return (await self.run([command]))[0]

    async def run_recorded(self, command: Command,
                           record: Callable[[SentRequest], None]) -> Result:
        """``execute_recorded`` on the shared pipeline: ``record`` is called with the request
        and the number it will travel under just before it leaves (``Pipeline.take``), while
        other tasks' commands — recorded or not — are on the line too, ordered by the
        pipeline's rule (``conflict``). ``record`` raising, or no certain number to give: never
        sent, NOT_EXECUTED (no status, nothing in ``sent_as``)."""
        return (await self._share_recorded([command], [record]))[0]

    async def read(self, register: str | int, count: int | None = None) -> Result:
        return await self.execute(self.read_command(register, count))

    async def write(self, values: Mapping[str | int, int | str]) -> Result:
        return await self.execute(self.write_command(values))

    async def write_if_generation(self, generation: int,
                                  values: Mapping[str | int, int | str]) -> Result:
        return await self.execute(self.write_if_generation_command(generation, values))

    async def clear_faults(self, mask: int, register: str | int | None = None) -> Result:
        return await self.execute(self.clear_faults_command(mask, register))

    async def trigger(self, register: str | int | None = None) -> Result:
        return await self.execute(self.trigger_command(register))

    async def trigger_reset(self, register: str | int | None = None) -> Result:
        return await self.execute(self.trigger_command(register, reset=True))

    async def trigger_status(self, register: str | int | None = None) -> Result:
        return await self.execute(self.trigger_status_command(register))

    async def file_info(self, name: str) -> Result:
        return await self.execute(self.file_info_command(name))

    async def send_files(
        self,
        paths: Iterable[str],
        *,
        progress: ProgressCallback | None = None,
        config: SenderConfig | None = None,
        overwrite: bool = False,
    ) -> tuple[Result, TransferReport | None]:
        """``BlockingDriver.send_files``: the YMODEM batch runs in a worker thread on the
        transport's pyserial port (the loop stays free)."""
        return await self._drive(file_transfer.send_files_steps(
            self.ops, paths, lends_port=self._lends_port(), progress=progress, config=config,
            overwrite=overwrite))

    async def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        return await self._drive(self.ops.reconcile_steps(result))

    async def reconcile_sent(self, command: Command,
                             sent_as: tuple[tuple[int, int], ...] = (),
                             read_back: bool = True) -> Reconciliation:
        return await self._drive(self.ops.evidence_steps(command, sent_as, read_back))

    async def execute_recorded(self, command: Command,
                               record: Callable[[SentRequest], None]) -> Result:
        return await self._drive(self.ops.recorded_steps(command, record))


class AsyncDevice(AsyncDriver):
    """A session with one idemlink device for asyncio programs (see the module docstring)."""

    ops: FramedOperations

    def __init__(self, transport: AsyncTransport, *,
                 regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, max_inflight: int | None = None,
                 check_map: bool = True, address: int | None = None,
                 key: bytes | tuple[bytes, ...] | None = None) -> None:
        if not isinstance(regmap, RegisterMap):
            regmap = resolve_regmap(regmap)
        super().__init__(transport, FramedOperations(
            transport, regmap=regmap, timeout=timeout, attempts=attempts,
            max_inflight=max_inflight, check_map=check_map, address=address, key=key))

    @classmethod
    def open(cls, url: str, *, baudrate: int = 115200, bytesize: int = 8, parity: str = "N",
             stopbits: float = 1, keep_lines: bool = True,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, timeout: float = 0.2,
             attempts: int = 5, max_inflight: int | None = None,
             check_map: bool = True, address: int | None = None,
             key: HostKey | None = None) -> _Opening[AsyncDevice]:
        """Open ``url`` and run the HELLO handshake, as ``Device.open`` does (the same line
        keywords, 8N1 by default; ``address``: the device of that bus address, docs/BUS.md;
        ``key``: the device's key, keys or private key file, docs/SECURITY.md — a device that
        does not sign with it is ``IncompatibleDevice``, no downgrade):
        ``async with AsyncDevice.open(url) as dev:`` or ``dev = await AsyncDevice.open(url)``.
        A gateway URL (``idemlink+http://HOST:PORT/PORTNAME``) gives an
        ``idemlink.host.gateway_device.AsyncGatewayDevice``, as ``Device.open`` does (an
        address or a key through it is ``NotThroughGateway``: they are the gateway's own)."""
        if url.startswith(("idemlink+http://", "idemlink+https://")):
            from idemlink.host.gateway_device import AsyncGatewayDevice, NotThroughGateway

            if address is not None or key is not None:
                raise NotThroughGateway("a bus address and a key are the gateway's own through a "
                                         "gateway URL (docs/API.md, \"Through a gateway\")")
            gateway_map = regmap

            async def remote() -> AsyncDevice:
                return await AsyncGatewayDevice.open_url(url, regmap=gateway_map,
                                                         check_map=check_map)

            return _Opening(remote)
        if address is not None:
            check_address(address)
        keys = host_keys(key)  # a refused key file: before the port is opened
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)

        async def opener() -> AsyncDevice:
            t = await AsyncSerialTransport.open(url, baudrate=baudrate, bytesize=bytesize,
                                                parity=parity, stopbits=stopbits,
                                                keep_lines=keep_lines)
            dev = cls(t, regmap=rm, timeout=timeout, attempts=attempts,
                      max_inflight=max_inflight, check_map=check_map, address=address, key=keys)
            return await _opened(dev)

        return _Opening(opener)


class AsyncRtuDevice(AsyncDriver):
    """A session with one Modbus RTU slave for asyncio programs: ``RtuDevice`` awaited (see
    ``idemlink.host.rtu_device`` for what differs from an idemlink device)."""

    ops: RtuOperations

    def __init__(self, transport: AsyncTransport, *,
                 regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, unit: int = 1,
                 baudrate: int | None = None, timeout: float = 0.2, attempts: int = 5,
                 char_format: CharFormat = MODBUS_CHAR_FORMAT) -> None:
        if not isinstance(regmap, RegisterMap):
            regmap = resolve_regmap(regmap)
        super().__init__(transport, RtuOperations(transport, regmap=regmap, unit=unit,
                                                  baudrate=baudrate, timeout=timeout,
                                                  attempts=attempts, char_format=char_format))

    @classmethod
    def open(cls, url: str, *, unit: int = 1, baudrate: int = 115200, bytesize: int = 8,
             parity: str = "E", stopbits: float = 1,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, timeout: float = 0.2,
             attempts: int = 5, keep_lines: bool = True,
             probe: bool = True) -> _Opening[AsyncRtuDevice]:
        """Open ``url`` and (``probe``) check that a slave answers at ``unit``, as
        ``RtuDevice.open`` does (8E1 unless told otherwise): ``async with
        AsyncRtuDevice.open(url) as dev:`` or awaited."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        fmt = CharFormat(bytesize, parity, stopbits)

        async def opener() -> AsyncRtuDevice:
            t = await AsyncSerialTransport.open(url, baudrate=baudrate, bytesize=fmt.bytesize,
                                                parity=fmt.parity, stopbits=fmt.stopbits,
                                                keep_lines=keep_lines)
            dev = cls(t, regmap=rm, unit=unit, baudrate=line_rate(t.port, baudrate),
                      timeout=timeout, attempts=attempts, char_format=fmt)
            return await _opened(dev) if probe else dev

        return _Opening(opener)


class AsyncTcpDevice(AsyncDriver):
    """A session with one Modbus TCP device (or a unit behind a gateway) for asyncio programs:
    ``idemlink.host.tcp_device.TcpDevice`` awaited."""

    ops: TcpOperations

    def __init__(self, transport: AsyncTransport, *,
                 regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, unit: int = 1,
                 timeout: float = DEFAULT_TCP_TIMEOUT,
                 attempts: int = DEFAULT_TCP_ATTEMPTS) -> None:
        if not isinstance(regmap, RegisterMap):
            regmap = resolve_regmap(regmap)
        super().__init__(transport, TcpOperations(transport, regmap=regmap, unit=unit,
                                                  timeout=timeout, attempts=attempts))

    @classmethod
    def open(cls, address: str, *, unit: int = 1,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP,
             timeout: float = DEFAULT_TCP_TIMEOUT, attempts: int = DEFAULT_TCP_ATTEMPTS,
             probe: bool = True) -> _Opening[AsyncTcpDevice]:
        """Connect to ``address`` (``HOST[:PORT]``, port 502 by default) and (``probe``) check
        that something answers at ``unit``, as ``TcpDevice.open`` does."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        url = socket_url(address)

        async def opener() -> AsyncTcpDevice:
            t = await AsyncSerialTransport.open(url)
            dev = cls(t, regmap=rm, unit=unit, timeout=timeout, attempts=attempts)
            return await _opened(dev) if probe else dev

        return _Opening(opener)


class _Counted:
    """The device's transport, counting the bytes written and read through it (``sent``,
    ``received``): what a gateway shows as its line's load. It only counts."""

    def __init__(self, inner: AsyncTransport) -> None:
        self.inner = inner
        self.sent = 0
        self.received = 0

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)
        self.sent += len(data)

    async def read(self, timeout: float) -> bytes:
        data = await self.inner.read(timeout)
        self.received += len(data)
        return data

    def now(self) -> float:
        return self.inner.now()

    async def close(self) -> None:
        await self.inner.close()


class _Wakeable:
    """The device's transport as the shared pipeline's loop uses it: a ``read`` that a new
    command (``wake``) cuts short, returning what has arrived so far (maybe nothing), so the
    command leaves now rather than when the next byte comes. It only moves bytes: the wait is
    ended by cancelling the read the way ``asyncio.timeout`` does (the transports' reads leave
    what arrived in their buffer), and a cancellation of the loop itself still propagates."""

    def __init__(self, inner: AsyncTransport) -> None:
        self.inner = inner
        self._reader: asyncio.Task[Any] | None = None  #: the task waiting in ``read``
        self._woken = False

    def wake(self) -> None:
        if self._woken:
            return
        self._woken = True
        if self._reader is not None:
            self._reader.cancel()

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)

    async def read(self, timeout: float) -> bytes:
        if self._woken:
            self._woken = False
            return b""
        task = asyncio.current_task()
        self._reader = task
        try:
            data = await self.inner.read(timeout)
        except asyncio.CancelledError:
            if self._woken and task is not None and task.uncancel() == 0:
                return b""  # our own wake-up, nothing else asked to cancel the loop
            raise
        else:
            if self._woken and task is not None:  # the transport's read absorbed our wake-up
                task.uncancel()  # (``asyncio.wait_for`` may, on Python 3.11): undo its count
            return data
        finally:
            self._reader = None
            self._woken = False

    def now(self) -> float:
        return self.inner.now()

    async def close(self) -> None:
        await self.inner.close()


async def _opened(dev: D) -> D:
    """``dev`` once its ``open_steps`` went through; closed again if they did not."""
    try:
        await dev._drive(dev.ops.open_steps())
    except BaseException:
        await dev.close()
        raise
    return dev


async def _stop(task: asyncio.Task[Any]) -> tuple[Result, ...] | None:
    """Cancel a stream's request loop and wait for it; the requests it settled (None: it had
    already ended)."""
    if task.done():
        return None
    task.cancel()
    try:
        await task
    except asyncio.CancelledError as exc:
        settled: tuple[Result, ...] = getattr(exc, "settled_results", ())
        return settled
    return None


def _log_settled(exc: BaseException) -> None:
    """Say what a cancelled operation left: commands with an effect that may have run (a
    cancelled read changed nothing and is not worth a warning)."""
    settled: tuple[Result, ...] = getattr(exc, "settled_results", ())
    unknown = [r for r in settled if r.outcome is Outcome.UNKNOWN and r.command.may_have_effect]
    if unknown:
        log.warning("%s: %d request(s) were out and may have run (UNKNOWN/%s): %s",
                    type(exc).__name__, len(unknown), Status.CANCELLED.name,
                    ", ".join(r.command.kind.value for r in unknown))


__all__ = [
    "PARITY",
    "AsyncDevice",
    "AsyncDriver",
    "AsyncRtuDevice",
    "AsyncTcpDevice",
]
