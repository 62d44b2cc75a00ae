"""The asyncio shell: the same driver, awaited instead of blocking.

``AsyncDevice`` runs exactly the operations the blocking ``idemlink.host.device.Device`` runs —
``idemlink.host.operations.Operations``, each a transport-free generator of I/O requests over the
sans-I/O ``HostSession`` — with an ``AsyncTransport`` (``await write``, ``await read(timeout)``).
There is no second copy of the request loop's rules, the retry rules, the epoch rule or the result
decoding: only the loop differs (it awaits), the command helpers are inherited from the same
``CommandBuilder``, and every operation of the blocking ``Device`` is here, one or two lines each
(``idemlink.host.operations.OPERATIONS`` lists them; a test checks both drivers against it).

``async with AsyncDevice.open(url, ...) as dev:`` opens any pyserial URL with
``AsyncSerialTransport`` (a tty or pty, ``socket://``, ``rfc2217://``, ``loop://``, ``faulty://``)
and runs the HELLO handshake; ``dev = await AsyncDevice.open(url)`` works too (then ``await
dev.close()``). The transport itself (the port on the event loop) is
``idemlink.host.aio_transport``'s.

One operation at a time per device: every operation holds the device's ``asyncio.Lock``, so tasks
sharing one ``AsyncDevice`` queue up (their requests are never interleaved, and only one task awaits
the transport's ``read``). Separate ``AsyncDevice`` instances share nothing, so one event loop drives
many devices at once (``asyncio.gather``). ``stream(commands)`` is an async generator of results in
submission order over the continuous pipeline; close it when leaving early
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
import logging
import os
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from idemlink.host import file_transfer
from idemlink.host.aio_transport import ROUND_BYTES, AsyncSerialTransport, AsyncTransport
from idemlink.host.command import Command, Reconciliation, Result, SentRequest
from idemlink.host.errors import TRANSPORT_ERRORS, LinkLost
from idemlink.host.operations import OPERATIONS, DeviceHandle, Operations, Steps
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

if TYPE_CHECKING:
    from idemlink.protocol.ymodem_files import TransferReport
    from idemlink.protocol.ymodem_sender import SenderConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

PARITY = OPERATIONS
"""The blocking ``Device``'s operations, which ``AsyncDevice`` has too
(``idemlink.host.operations.OPERATIONS``; a test checks both drivers against it)."""

class _Opening:
    """What ``AsyncDevice.open`` returns: await it, or use it in ``async with``."""

    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = opener
        self._device: AsyncDevice | None = None

    def __await__(self) -> Generator[Any, None, AsyncDevice]:
        dev: AsyncDevice = yield from self._opener().__await__()
        return dev

    async def __aenter__(self) -> AsyncDevice:
        self._device = await self._opener()
        return self._device

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._device is not None:
            await self._device.close()


class AsyncDevice(DeviceHandle):
    """A session with one idemlink device for asyncio programs (see the module docstring)."""

    def __init__(self, transport: AsyncTransport, *,
                 regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, max_inflight: int = 8,
                 check_map: bool = True) -> None:
        if not isinstance(regmap, RegisterMap):
            regmap = resolve_regmap(regmap)
        super().__init__(regmap)
        self.transport = transport
        #: the session, its bookkeeping and every operation (the transport is only its clock)
        self.ops = Operations(transport, regmap=regmap, timeout=timeout, attempts=attempts,
                              max_inflight=max_inflight, check_map=check_map)
        self._lock = asyncio.Lock()
        self._streaming: asyncio.Task[Any] | None = None  #: the task iterating a stream

    # -------------------------------------------------------------- opening
    @classmethod
    def open(cls, url: str, *, baudrate: int = 115200, keep_lines: bool = True,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, timeout: float = 0.2,
             attempts: int = 5, max_inflight: int = 8, check_map: bool = True) -> _Opening:
        """Open ``url`` and run the HELLO handshake, as ``Device.open`` does:
        ``async with AsyncDevice.open(url) as dev:`` or ``dev = await AsyncDevice.open(url)``."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)

        async def opener() -> AsyncDevice:
            t = await AsyncSerialTransport.open(url, baudrate=baudrate, keep_lines=keep_lines)
            dev = cls(t, regmap=rm, timeout=timeout, attempts=attempts,
                      max_inflight=max_inflight, check_map=check_map)
            try:
                await dev.connect()
            except BaseException:
                await dev.close()
                raise
            return dev

        return _Opening(opener)

    async def __aenter__(self) -> AsyncDevice:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def connect(self) -> None:
        await self._drive(self.ops.connect_steps())

    async def close(self) -> None:
        await self.transport.close()

    # -------------------------------------------------------------- the request loop
    async def _drive(self, steps: Steps[T]) -> T:
        if self._streaming is not None and self._streaming is asyncio.current_task():
            steps.close()  # the stream holds the device: waiting for it would never end
            raise LocalProtocolError(
                "this task is iterating a stream of this device: one operation at a time per "
                "device (run the other operation from another task, or after the stream)")
        async with self._lock:
            return await self._drive_locked(steps)

    async def _drive_locked(self, steps: Steps[T], between: Callable[[], None] | None = None) -> T:
        """``Device._rounds``, awaited: move bytes between the transport and the operation;
        settle its requests if the transport fails (``LinkLost``) or the caller cancels."""
        t = self.transport
        ops = self.ops
        try:
            out, wait = next(steps)
            while True:
                try:
                    if out:
                        await t.write(out)
                    data = await t.read(wait)
                except TRANSPORT_ERRORS as exc:
                    raise ops.link_lost(exc) from exc
                out, wait = steps.send(data)
                if between is not None:
                    between()
        except StopIteration as stop:
            result: T = stop.value
            return result
        except LinkLost:
            raise
        except BaseException as exc:  # asyncio.CancelledError above all
            ops.interrupted(exc)
            _log_settled(exc)
            raise
        finally:
            steps.close()

    # -------------------------------------------------------------- operations
    async def run(self, commands: Iterable[Command]) -> list[Result]:
        return await self._drive(self.ops.run_steps(list(commands)))

    async def stream(self, commands: Iterable[Command]) -> AsyncIterator[Result]:
        """``Device.stream`` for asyncio: results in submission order while later requests are
        on the line. Holds the device for its whole run (other tasks' operations wait; one of
        this device's operations awaited inside the loop raises ``LocalProtocolError``); leaving
        early settles what is out as CANCELLED (close it: ``contextlib.aclosing``)."""
        ops = self.ops
        ops.refuse_if_blocked()
        ready: list[Result] = []
        async with self._lock:
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

            task = asyncio.ensure_future(self._drive_locked(steps, hand_out))
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

    async def read(self, register: str | int, count: int = 1) -> Result:
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
        progress: Callable[[str, int, int | None], None] | None = None,
        config: SenderConfig | None = None,
        overwrite: bool = False,
    ) -> tuple[Result, TransferReport | None]:
        """``Device.send_files``: files already on the device byte for byte are not sent again;
        the YMODEM batch runs in a worker thread on the transport's pyserial port (the loop stays
        free), then every file is read back (FILE_INFO)."""
        from idemlink.host.ymodem_io import send_files
        from idemlink.protocol.ymodem_files import TransferReport

        ops = self.ops
        batch = await asyncio.to_thread(file_transfer.prepare_batch, paths, overwrite)
        borrowed = getattr(self.transport, "borrowed", None)
        if borrowed is None:
            raise LocalProtocolError("file transfer needs a serial transport")
        async with self._lock:
            identical, asked = await self._drive_locked(
                file_transfer.already_there_steps(ops, batch, overwrite))
            todo = file_transfer.still_to_send(batch, identical)
            if not todo:
                return asked, TransferReport(files=identical, ok=True)
            res = (await self._drive_locked(ops.run_steps([batch.handover])))[0]
            if res.outcome not in (Outcome.OK, Outcome.UNKNOWN):
                return res, None
            async with borrowed() as port:
                report = await asyncio.to_thread(send_files, port, todo, config,
                                                 progress=progress)
            file_transfer.batch_done(ops, res, report)
            check = file_transfer.to_verify(report.files, batch.digests)
            if check:
                try:
                    back = await self._drive_locked(
                        ops.wave_steps(file_transfer.read_back_commands(check)))
                except LinkLost as exc:
                    file_transfer.not_verified(check, exc)
                else:
                    file_transfer.judge_files(check, back, batch.digests)
            report.files[:0] = identical
            return res, report

    async def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        return await self._drive(self.ops.reconcile_steps(result))

    async def reconcile_sent(self, command: Command,
                             sent_as: tuple[tuple[int, int], ...]) -> Reconciliation:
        return await self._drive(self.ops.evidence_steps(command, sent_as))

    async def execute_recorded(self, command: Command,
                               record: Callable[[SentRequest], None]) -> Result:
        return await self._drive(self.ops.recorded_steps(command, record))


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


__all__ = ["PARITY", "ROUND_BYTES", "AsyncDevice", "AsyncSerialTransport", "AsyncTransport"]
