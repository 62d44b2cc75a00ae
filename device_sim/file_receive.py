"""The device's YMODEM receive mode: one batch on the serving transport, then back to frames.

After a FILE_RECEIVE command (``idemlink.protocol.modbus.FunctionCode.FILE_RECEIVE``) the serve loop hands
its transport to ``receive_batch``: the same sans-I/O receiver as ``idemlink receive``
(``idemlink.protocol.ymodem_files.ReceiverDriver``, the idempotent EOT machine) writes into the device's
``files_dir`` through the safe ``DirectorySink`` (invisible until complete, never outside the
directory, never a half file). The batch ends on the empty header, on CAN CAN, on the receiver's own
timeouts (no sender: 'C' every second, ten times), or when the server is stopped — and the port
returns to framed mode in every case. Whatever ends the batch (including an exception from the
transport), an uncommitted file's temporary is deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from idemlink.protocol.ymodem_files import DirectorySink, ReceiverDriver, TransferReport, exchange
from idemlink.protocol.ymodem_receiver import ReceiverConfig

DEVICE_RECEIVER = ReceiverConfig(c_interval=1.0, header_retries=10)
"""The device gives up after ~10 s without a sender (the spec's 'C' cadence would wait 60 s)."""


class _Transport(Protocol):
    def read(self, timeout: float) -> bytes: ...
    def write(self, data: bytes) -> None: ...


def _send(transport: _Transport, data: bytes) -> None:
    """A reply the sender does not read in time is dropped: the protocol's retries cover it
    (the batch must not end the serving loop)."""
    with contextlib.suppress(TimeoutError):
        transport.write(data)


def receive_batch(
    files_dir: Path,
    transport: _Transport,
    clock: Callable[[], float],
    stop: threading.Event | None = None,
    config: ReceiverConfig = DEVICE_RECEIVER,
    *,
    overwrite: bool = False,
    quota: int | None = None,
) -> TransferReport:
    """Run one YMODEM receive batch on ``transport``; returns the per-file report. An existing
    file is replaced only with ``overwrite`` (else the batch is cancelled, nothing written)."""
    if quota is not None:  # a declared size over the quota is refused at the header
        config = dataclasses.replace(config, max_file_size=quota)
    # the device's own directory: a symbolic link put there cancels the batch (never followed)
    sink = DirectorySink(files_dir, overwrite=overwrite, quota=quota, follow_symlink=False)
    driver = ReceiverDriver(sink, config)
    try:
        driver.start(clock())
        out = driver.data_to_send()
        if out:
            _send(transport, out)
        while not driver.finished:
            if stop is not None and stop.is_set():
                driver.rx.abort("device stopping", clock())
                out = exchange(driver, b"", clock())
                if out:
                    _send(transport, out)
                break
            now = clock()
            due = driver.next_deadline()
            wait = 0.05 if due is None else min(0.05, max(0.0, due - now))
            data = transport.read(wait)
            out = exchange(driver, data, clock())
            if out:
                _send(transport, out)
    finally:
        driver.close()  # a closed pty or any error mid-file: no .ymodem-*.part left in flash
    return driver.report
