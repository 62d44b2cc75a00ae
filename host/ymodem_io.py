"""The YMODEM shell: move bytes between a pyserial port and ``idemlink.protocol.ymodem``, and files to disk.

Contract:

- ``send_files(port, paths)`` / ``receive_files(port, sink)`` drive the sans-I/O core over any
  open pyserial port (``serial_for_url`` works: ``/dev/ttyUSB0``, a pty, ``socket://``...) and
  return a ``TransferReport`` (per-file results, bytes, seconds, throughput).
- ``DirectorySink`` is the safe file sink: each file is written to a hidden temporary file in the
  target directory and becomes visible only on commit (truncate to the declared size, fsync,
  sanitised mode, mtime, then link/rename); it never writes outside its directory, enforces a
  byte quota, never replaces an existing file unless ``overwrite``; any refusal or write error
  raises ``SinkRefused`` and the driver cancels the batch (CAN CAN) and deletes the temporary file.
- ``ReceiverDriver`` couples a ``Receiver`` to any ``FileSink`` without touching a port, so the
  simulated device can embed the same receiver on its own port loop (``feed(data, now) -> bytes``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from idemlink.protocol.ymodem import (
    Aborted,
    BatchEnded,
    Event,
    FileCommitted,
    FileData,
    FileStarted,
    FileUnconfirmed,
    HeaderRefused,
    Progress,
    Receiver,
    ReceiverConfig,
    RxState,
    Sender,
    SenderConfig,
    SendFile,
    TxState,
    check_name,
    sanitize_mode,
)

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, int | None], None]
"""``progress(name, bytes_done, size_or_None)``."""


class PortLike(Protocol):
    """What the shells need from a pyserial port."""

    timeout: float | None

    def read(self, size: int = 1) -> bytes: ...
    def write(self, data: bytes, /) -> int | None: ...
    @property
    def in_waiting(self) -> int: ...


class SinkRefused(Exception):
    """The sink will not take (or keep) this file; the transfer is cancelled."""


class FileSink(Protocol):
    """Where a receiver's files go. One file is open at a time."""

    def open(self, ev: FileStarted) -> None: ...
    def write(self, offset: int, data: bytes) -> None: ...
    def commit(self, name: str, size: int) -> Path | str: ...
    def discard(self) -> None: ...


@dataclass(slots=True)
class FileResult:
    name: str
    size: int
    ok: bool
    seconds: float
    detail: str = ""
    unconfirmed: bool = False  #: the whole file went out, the receiver never proved it kept it
    verified: bool | None = None  #: framed hand-over read-back: same bytes / not / no answer
    identical: bool = False  #: already on the device with the same size and CRC-32C: not sent


@dataclass(slots=True)
class TransferReport:
    files: list[FileResult] = field(default_factory=list)
    ok: bool = False
    reason: str = ""
    bytes: int = 0
    seconds: float = 0.0
    final_ack: bool = True

    @property
    def throughput(self) -> float:
        """Payload bytes per second over the whole batch."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


class DirectorySink:
    """Safe sink into one directory (see the module contract)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        quota: int | None = None,
        default_mode: int = 0o644,
    ) -> None:
        self.directory = Path(directory).resolve()
        if not self.directory.is_dir():
            raise SinkRefused(f"not a directory: {self.directory}")
        self.overwrite = overwrite
        self.quota = quota
        self.default_mode = default_mode
        self.used = 0
        self._fd: int | None = None
        self._tmp: Path | None = None
        self._file: FileStarted | None = None
        self._written = 0

    def _target(self, name: str) -> Path:
        checked = check_name(name.encode("utf-8"))
        if not isinstance(checked, str):
            raise SinkRefused(f"name refused: {checked.value}")
        target = self.directory / checked
        if target.parent != self.directory:  # belt and braces: one component only
            raise SinkRefused("name escapes the target directory")
        return target

    def open(self, ev: FileStarted) -> None:
        self.discard()
        target = self._target(ev.name)
        if not self.overwrite and os.path.lexists(target):
            raise SinkRefused(f"{ev.name} exists (use --overwrite)")
        if self.quota is not None and ev.size is not None and self.used + ev.size > self.quota:
            raise SinkRefused(f"{ev.name}: {ev.size} bytes exceed the quota")
        # The name is recorded before the file is created, so an interrupt (Ctrl-C, SIGTERM)
        # landing between the creation and the bookkeeping still finds and removes it.
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        for _ in range(100):
            self._tmp = Path(self.directory) / f".ymodem-{secrets.token_hex(6)}.part"
            try:
                fd = os.open(self._tmp, flags, 0o600)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                self._tmp = None
                raise SinkRefused(f"cannot create a temporary file: {exc.strerror or exc}") from exc
        else:
            self._tmp = None
            raise SinkRefused("cannot create a temporary file: every name taken")
        self._fd, self._file, self._written = fd, ev, 0

    def write(self, offset: int, data: bytes) -> None:
        if self._fd is None:
            raise SinkRefused("data without an open file")
        if self.quota is not None and self.used + offset + len(data) > self.quota:
            raise SinkRefused("byte quota exceeded")
        try:
            os.pwrite(self._fd, data, offset)
        except OSError as exc:
            raise SinkRefused(f"write error: {exc.strerror or exc}") from exc
        self._written = max(self._written, offset + len(data))

    def commit(self, name: str, size: int) -> Path:
        if self._fd is None or self._tmp is None or self._file is None:
            raise SinkRefused("commit without an open file")
        ev, tmp, fd = self._file, self._tmp, self._fd
        target = self._target(name)
        try:
            os.ftruncate(fd, size)
            os.fchmod(fd, sanitize_mode(ev.mode, self.default_mode))
            os.fsync(fd)
            os.close(fd)
            self._fd = None
            if ev.mtime is not None:
                os.utime(tmp, (ev.mtime, ev.mtime))
            if self.overwrite:
                os.replace(tmp, target)
            else:
                os.link(tmp, target)  # fails if the name appeared meanwhile: never overwrite
                os.unlink(tmp)
        except (OSError, OverflowError) as exc:  # utime: a header mtime beyond time_t overflows
            self.discard()
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise SinkRefused(f"commit failed: {detail}") from exc
        self._tmp = self._file = None
        self.used += size
        return target

    def discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None
        self._file = None


class ReceiverDriver:
    """A ``Receiver`` and a ``FileSink``: bytes in, bytes out, files handled; no port."""

    def __init__(
        self,
        sink: FileSink,
        config: ReceiverConfig | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.rx = Receiver(config)
        self.sink = sink
        self.progress = progress
        self.report = TransferReport()
        self._current: FileStarted | None = None
        self._started_at = 0.0
        self._t0: float | None = None

    @property
    def finished(self) -> bool:
        return self.rx.state in (RxState.DONE, RxState.ABORTED)

    def start(self, now: float) -> bytes:
        self._t0 = now
        self.rx.start(now)
        return self.rx.data_to_send()

    def feed(self, data: bytes, now: float) -> bytes:
        """Bytes from the line (may be empty) at ``now``; returns the bytes to write back."""
        if data:
            self.rx.receive_data(data, now)
        self.rx.tick(now)
        self._handle_events(now)
        return self.rx.data_to_send()

    def next_deadline(self) -> float | None:
        return self.rx.next_deadline()

    def close(self) -> None:
        """Whatever way the batch ends (done, CAN, Ctrl-C, a dead port): the uncommitted file, if
        any, is discarded (temporary deleted, descriptor closed). Committed files stay."""
        self.sink.discard()

    def _handle_events(self, now: float) -> None:
        while (ev := self.rx.next_event()) is not None:
            try:
                self._handle(ev, now)
            except SinkRefused as exc:
                log.warning("receiver: %s", exc)
                self.sink.discard()
                self.rx.abort(str(exc), now)  # drops the pending ACK, queues CAN CAN

    def _handle(self, ev: Event, now: float) -> None:
        if isinstance(ev, FileStarted):
            self._current, self._started_at = ev, now
            self.sink.open(ev)
        elif isinstance(ev, FileData):
            self.sink.write(ev.offset, ev.data)
            if self.progress and self._current:
                self.progress(self._current.name, ev.offset + len(ev.data), self._current.size)
        elif isinstance(ev, FileCommitted):
            where = self.sink.commit(ev.name, ev.size)
            self.report.files.append(
                FileResult(ev.name, ev.size, True, now - self._started_at, str(where))
            )
            self.report.bytes += ev.size
            self._current = None
        elif isinstance(ev, HeaderRefused):
            self.report.files.append(
                FileResult(ev.raw_name.decode("utf-8", "replace"), 0, False, 0.0, ev.reason.value)
            )
        elif isinstance(ev, BatchEnded):
            self.report.ok = True
            self._close(now)
        elif isinstance(ev, Aborted):
            self.sink.discard()
            if self._current is not None:
                self.report.files.append(
                    FileResult(self._current.name, 0, False, now - self._started_at, ev.reason)
                )
                self._current = None
            self.report.reason = ev.reason
            self._close(now)

    def _close(self, now: float) -> None:
        self.report.seconds = now - (self._t0 if self._t0 is not None else now)


_POLL = 0.002  # port read timeout: the loop's granularity for deadlines


def _pump(port: PortLike, machine_feed: Callable[[bytes, float], bytes],
          deadline: Callable[[], float | None], finished: Callable[[], bool],
          stop_at: float | None) -> None:
    """Read whatever arrived (or wait ``_POLL``), feed it with the time, write the answer."""
    port.timeout = _POLL
    while not finished():
        now = time.monotonic()
        if stop_at is not None and now >= stop_at:
            raise TimeoutError("transfer did not finish in time")
        data = port.read(max(1, port.in_waiting))
        out = machine_feed(data, time.monotonic())
        if out:
            port.write(out)
        due = deadline()
        if due is not None and not finished():
            # A deadline (e.g. the turnaround delay) closer than one poll: meet it on time.
            gap = due - time.monotonic()
            if gap < _POLL:
                time.sleep(max(0.0, gap))
                out = machine_feed(b"", time.monotonic())
                if out:
                    port.write(out)


def receive_files(
    port: PortLike,
    sink: FileSink,
    config: ReceiverConfig | None = None,
    progress: ProgressCallback | None = None,
    overall_timeout: float | None = None,
) -> TransferReport:
    """Receive one YMODEM batch into ``sink``. Start this before the sender opens its port."""
    drv = ReceiverDriver(sink, config, progress)
    now = time.monotonic()
    try:
        port.write(drv.start(now))
        _pump(port, drv.feed, drv.next_deadline, lambda: drv.finished,
              None if overall_timeout is None else now + overall_timeout)
    except TimeoutError:
        drv.rx.abort("overall timeout")
        port.write(drv.rx.data_to_send())
        drv.feed(b"", time.monotonic())  # hands the Aborted event to the sink and the report
    except KeyboardInterrupt:
        drv.rx.abort("interrupted")
        port.write(drv.rx.data_to_send())  # CAN CAN: the sender stops
        raise
    finally:
        drv.close()  # any exit that did not commit (Ctrl-C, OSError from the port) leaves nothing
    if not drv.report.ok and not drv.report.reason:
        drv.report.reason = drv.rx.abort_reason or "unfinished"
    return drv.report


def _file_reader(path: Path) -> tuple[SendFile, Callable[[], None]]:
    fh = open(path, "rb")  # noqa: SIM115 - closed by the returned closer
    st = os.fstat(fh.fileno())

    def read(offset: int, n: int) -> bytes:
        fh.seek(offset)
        return fh.read(n)

    return SendFile(path.name, st.st_size, int(st.st_mtime), st.st_mode & 0o777, read), fh.close


def check_batch_names(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Raise ``ValueError`` if two paths share a basename: only basenames go on the wire, so the
    receiver would refuse (or, with overwrite, replace) the second, and the report could not say
    which one failed. Call it before handing a port to the receiver."""
    seen: dict[str, str | os.PathLike[str]] = {}
    for p in paths:
        name = Path(p).name
        if name in seen:
            raise ValueError(f"same file name twice in one batch: {os.fspath(seen[name])} and "
                             f"{os.fspath(p)} (both arrive as {name!r})")
        seen[name] = p


def send_files(
    port: PortLike,
    paths: Sequence[str | os.PathLike[str]],
    config: SenderConfig | None = None,
    progress: ProgressCallback | None = None,
    overall_timeout: float | None = None,
) -> TransferReport:
    """Send ``paths`` as one YMODEM batch (basenames on the wire). Two paths with the same
    basename are refused (``ValueError``, see ``check_batch_names``) before anything is sent."""
    check_batch_names(paths)
    files: list[SendFile] = []
    closers: list[Callable[[], None]] = []
    try:
        for p in paths:
            f, close = _file_reader(Path(p))
            files.append(f)
            closers.append(close)
        return _send(port, files, config, progress, overall_timeout)
    finally:
        for close in closers:
            close()


def _send(
    port: PortLike,
    files: list[SendFile],
    config: SenderConfig | None,
    progress: ProgressCallback | None,
    overall_timeout: float | None,
) -> TransferReport:
    tx = Sender(files, config)
    report = TransferReport()
    t0 = time.monotonic()
    tx.start(t0)
    file_t0 = t0
    last_state = tx.state

    def feed(data: bytes, now: float) -> bytes:
        nonlocal file_t0, last_state
        if data:
            log.debug("sender %.3f rx %s", now - t0, data[:8].hex())
        try:
            if data:
                tx.receive_data(data, now)
            tx.tick(now)
        except (OSError, ValueError) as exc:  # a source file failed to read: cancel the batch
            tx.abort(f"read error: {exc}", now)
        while (ev := tx.next_event()) is not None:
            if isinstance(ev, Progress) and progress:
                progress(ev.name, ev.done, ev.size)
            elif isinstance(ev, FileCommitted):
                report.files.append(FileResult(ev.name, ev.size, True, now - file_t0))
                report.bytes += ev.size
                file_t0 = now
            elif isinstance(ev, FileUnconfirmed):
                report.files.append(FileResult(
                    ev.name, ev.size, False, now - file_t0,
                    "not confirmed: the whole file went out but the receiver's answers never "
                    "proved it kept it (it may or may not have)", unconfirmed=True))
            elif isinstance(ev, BatchEnded):
                report.ok, report.final_ack = True, ev.final_ack
            elif isinstance(ev, Aborted):
                report.reason = ev.reason
                # Files are reported in batch order, one result each: the rest failed (by index,
                # not by name).
                report.files += [
                    FileResult(f.name, f.size, False, 0.0, ev.reason)
                    for f in files[len(report.files):]
                ]
        if tx.state is not last_state:
            log.debug("sender %.3f %s -> %s", now - t0, last_state.value, tx.state.value)
            last_state = tx.state
        return tx.data_to_send()

    def finished() -> bool:
        return tx.state in (TxState.DONE, TxState.ABORTED)

    try:
        _pump(port, feed, tx.next_deadline, finished,
              None if overall_timeout is None else t0 + overall_timeout)
    except TimeoutError:
        tx.abort("overall timeout")
        port.write(tx.data_to_send())
        report.reason = "overall timeout"
    except KeyboardInterrupt:
        tx.abort("interrupted")
        port.write(tx.data_to_send())  # CAN CAN: the receiver drops its partial file
        raise
    report.seconds = time.monotonic() - t0
    return report
