"""The YMODEM shell: move bytes between a pyserial port and ``idemlink.protocol.ymodem``, and files to disk.

Contract:

- ``send_files(port, paths)`` / ``receive_files(port, sink)`` drive the sans-I/O core over any
  open pyserial port (``serial_for_url`` works: ``/dev/ttyUSB0``, a pty, ``socket://``...) and
  return a ``TransferReport`` (per-file results, bytes, seconds, throughput).
- The receiving side's file handling (``DirectorySink``, the port-less ``ReceiverDriver``, the
  report types) lives in ``idemlink.protocol.ymodem_files``, shared with the simulated device.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from idemlink.protocol.ymodem_events import (
    Aborted,
    BatchEnded,
    FileCommitted,
    FileUnconfirmed,
    Progress,
)
from idemlink.protocol.ymodem_files import (
    FileResult,
    FileSink,
    ProgressCallback,
    ReceiverDriver,
    TransferReport,
    exchange,
)
from idemlink.protocol.ymodem_receiver import ReceiverConfig
from idemlink.protocol.ymodem_sender import Sender, SenderConfig, SendFile
from idemlink.protocol.ymodem_tables import TxState

log = logging.getLogger(__name__)


class PortLike(Protocol):
    """What the shells need from a pyserial port."""

    timeout: float | None

    def read(self, size: int = 1) -> bytes: ...
    def write(self, data: bytes, /) -> int | None: ...
    @property
    def in_waiting(self) -> int: ...


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
        drv.start(now)
        port.write(drv.data_to_send())
        _pump(port, lambda data, at: exchange(drv, data, at), drv.next_deadline, lambda: drv.finished,
              None if overall_timeout is None else now + overall_timeout)
    except TimeoutError:
        drv.rx.abort("overall timeout")
        port.write(drv.rx.data_to_send())
        exchange(drv, b"", time.monotonic())  # hands the Aborted event to the sink and the report
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
