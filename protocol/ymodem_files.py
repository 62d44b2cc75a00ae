"""Received YMODEM files on disk: the safe directory sink and the port-less receiver driver.

Shared by the host (``idemlink receive`` through ``idemlink.host.ymodem_io.receive_files``) and the
simulated device (its FILE_RECEIVE mode, ``idemlink.device_sim.file_receive``), so it lives below
both. No port, no clock, no thread: the caller passes the bytes and the time.

Contract:

- ``DirectorySink`` is the safe file sink: each file is written to a hidden temporary file in the
  target directory and becomes visible only on commit (truncate to the declared size, fsync,
  sanitised mode, mtime, then link/rename and fsync the directory: the temporary and the commit
  are ``idemlink.protocol.regular_file``'s ``create_temp`` and ``commit_temp``, the one safe
  writer's pieces); it never writes outside its directory, enforces a
  byte quota, never replaces an existing file unless ``overwrite``; any refusal or write error
  raises ``SinkRefused`` and the driver cancels the batch (CAN CAN) and deletes the temporary file.
  With ``follow_symlink=False`` (a device's own storage, ``<flash-dir>/files``) the directory
  itself must not be a symbolic link: it is checked at each file's header, so a link put there
  cancels the batch instead of sending the files elsewhere; nothing is checked at construction.
  A re-sent file identical to the one already there is accepted: a regular file of that name and
  of the declared size (or of any size when the header declares none) is not refused at the
  header; at commit the received bytes are compared with it — identical: the temporary is
  deleted, the existing file kept untouched and ``identical`` set (the batch goes on, ACKed as
  usual); different: refused as any existing file (``exists (use --overwrite)``). The receiver
  machine is unchanged: the sink decides.
- ``ReceiverDriver`` couples a ``Receiver`` to any ``FileSink`` without touching a port (the
  sans-I/O shape: ``receive_data(data, now)``, ``tick(now)``, ``data_to_send()``; ``exchange``
  is one round of a shell's loop), so the host's port loop and the simulated device's serve loop run
  the same receiver.
- ``TransferReport`` / ``FileResult``: per-file results, bytes, seconds, throughput of one batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from idemlink.protocol.outcome import IdemlinkError
from idemlink.protocol.regular_file import commit_temp, create_temp
from idemlink.protocol.ymodem_events import (
    Aborted,
    BatchEnded,
    Event,
    FileCommitted,
    FileData,
    FileStarted,
    HeaderRefused,
)
from idemlink.protocol.ymodem_names import check_name, sanitize_mode
from idemlink.protocol.ymodem_receiver import Receiver, ReceiverConfig
from idemlink.protocol.ymodem_tables import RxState

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, int | None], None]
"""``progress(name, bytes_done, size_or_None)``."""

class SinkRefused(IdemlinkError):
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
    identical: bool = False  #: already there with the same bytes: send: same size and CRC-32C,
    #: not sent; receive: the received bytes equal the existing file, which is kept


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
        follow_symlink: bool = True,
    ) -> None:
        self.follow_symlink = follow_symlink
        if follow_symlink:
            self.directory = Path(directory).resolve()
            if not self.directory.is_dir():
                raise SinkRefused(f"not a directory: {self.directory}")
        else:  # the last component is kept as given: checked (never followed) at each header
            given = Path(directory)
            self.directory = given.parent.resolve() / given.name
        self.overwrite = overwrite
        self.quota = quota
        self.default_mode = default_mode
        self.used = 0
        self._fd: int | None = None
        self._tmp: Path | None = None
        self._file: FileStarted | None = None
        self._written = 0
        self._compare = False  #: a regular file of this name is there: compare at commit
        self.identical = False  #: the last commit found the same bytes there and kept them

    def _target(self, name: str) -> Path:
        checked = check_name(name.encode("utf-8"))
        if not isinstance(checked, str):
            raise SinkRefused(f"name refused: {checked.value}")
        target = self.directory / checked
        if target.parent != self.directory:  # belt and braces: one component only
            raise SinkRefused("name escapes the target directory")
        return target

    def _check_directory(self) -> None:
        """``follow_symlink=False``: the directory is a directory, not a symbolic link."""
        try:
            mode = os.lstat(self.directory).st_mode
        except OSError as exc:
            raise SinkRefused(f"{self.directory}: {exc.strerror or exc}") from exc
        if stat.S_ISLNK(mode):
            raise SinkRefused(f"{self.directory}: is a symbolic link; refused")
        if not stat.S_ISDIR(mode):
            raise SinkRefused(f"{self.directory}: not a directory; refused")

    def open(self, ev: FileStarted) -> None:
        self.discard()
        if not self.follow_symlink:
            self._check_directory()
        target = self._target(ev.name)
        self._compare = False
        if not self.overwrite and os.path.lexists(target):
            if not _may_be_identical(target, ev.size):
                raise SinkRefused(f"{ev.name} exists (use --overwrite)")
            self._compare = True
        if self.quota is not None and ev.size is not None and self.used + ev.size > self.quota:
            raise SinkRefused(f"{ev.name}: {ev.size} bytes exceed the quota")
        # The name is recorded before the file is created (``claim``), so an interrupt (Ctrl-C,
        # SIGTERM) landing between the creation and the bookkeeping still finds and removes it.
        def claim(name: str) -> None:
            self._tmp = Path(name)

        try:
            fd, _ = create_temp(self.directory, prefix=".ymodem-", suffix=".part", claim=claim)
        except OSError as exc:
            self._tmp = None
            raise SinkRefused(f"cannot create a temporary file: {exc.strerror or exc}") from exc
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
        self.identical = False
        if self._compare and not self.overwrite:
            return self._keep_identical(target, name, size)
        try:
            os.ftruncate(fd, size)
            os.fchmod(fd, sanitize_mode(ev.mode, self.default_mode))
            os.fsync(fd)
            os.close(fd)
            self._fd = None
            if ev.mtime is not None:
                os.utime(tmp, (ev.mtime, ev.mtime))
            # without overwrite, a link that fails if the name appeared meanwhile; then the
            # directory is fsynced, as for every file idemlink writes
            commit_temp(os.fspath(tmp), target, replace=self.overwrite)
        except (OSError, OverflowError) as exc:  # utime: a header mtime beyond time_t overflows
            self.discard()
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise SinkRefused(f"commit failed: {detail}") from exc
        self._tmp = self._file = None
        self.used += size
        return target

    def _keep_identical(self, target: Path, name: str, size: int) -> Path:
        """Commit of a file whose name exists: the same bytes keep the existing file (the
        temporary is deleted, ``identical`` set); different bytes are refused."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, size)
            same = _same_bytes(self._fd, target, size)
        except OSError as exc:
            self.discard()
            raise SinkRefused(f"commit failed: {exc.strerror or exc}") from exc
        self.discard()
        if not same:
            raise SinkRefused(f"{name} exists (use --overwrite)")
        self.identical = True
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


def _may_be_identical(target: Path, size: int | None) -> bool:
    """A regular file (never followed through a link) of the declared size, or of any size when
    the header declares none: only the bytes, at commit, can tell."""
    try:
        st = os.lstat(target)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)


def _same_bytes(fd: int, target: Path, size: int) -> bool:
    """The ``size`` bytes of the open temporary ``fd`` equal the file ``target`` (whole).
    ``target`` may have been swapped since the header: a link is not followed, and a FIFO or a
    device is opened without blocking or side effect, then found not a regular file."""
    flags = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NOCTTY", 0))
    other = os.open(target, flags)
    try:
        if not stat.S_ISREG(os.fstat(other).st_mode) or os.fstat(other).st_size != size:
            return False
        offset = 0
        while offset < size:
            n = min(1 << 16, size - offset)
            if os.pread(fd, n, offset) != os.pread(other, n, offset):
                return False
            offset += n
        return True
    finally:
        os.close(other)


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

    def start(self, now: float) -> None:
        """The receiver's first 'C' (then ``data_to_send()``)."""
        self._t0 = now
        self.rx.start(now)

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes from the line at ``now``; the files are handled before this returns."""
        self.rx.receive_data(data, now)
        self._handle_events(now)

    def tick(self, now: float) -> None:
        """Time passed (timeouts); the files are handled before this returns."""
        self.rx.tick(now)
        self._handle_events(now)

    def data_to_send(self) -> bytes:
        """Drain the bytes to write back (empty after a refusal's CAN CAN went out)."""
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
            identical = bool(getattr(self.sink, "identical", False))  # DirectorySink's finding
            self.report.files.append(
                FileResult(ev.name, ev.size, True, now - self._started_at, str(where),
                           identical=identical)
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


def exchange(driver: ReceiverDriver, data: bytes, now: float) -> bytes:
    """One round of a shell's loop: ``data`` read from the line (may be empty) and the time in,
    the bytes to write back out."""
    if data:
        driver.receive_data(data, now)
    driver.tick(now)
    return driver.data_to_send()
