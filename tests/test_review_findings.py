"""Findings of an adversarial review of the exactly-once promise: each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

from host.ymodem_io import DirectorySink, ReceiverDriver
from protocol.ymodem import CAN, Sender, SendFile, TxState


def _run_ymodem(tx: Sender, drv: ReceiverDriver, step: float = 0.01, until: float = 600.0) -> bytes:
    """Sender and driver in virtual time with no loss; returns every byte the driver sent."""
    now = 0.0
    tx.start(now)
    to_tx = drv.start(now)
    sent = bytearray(to_tx)
    while now < until:
        if to_tx:
            tx.receive_data(to_tx, now)
        tx.tick(now)
        tx.events()
        to_tx = drv.feed(tx.data_to_send(), now)
        sent += to_tx
        if drv.finished and tx.state in (TxState.DONE, TxState.ABORTED):
            break
        now += step
    return bytes(sent)


def test_unrepresentable_mtime_cancels_cleanly_and_leaves_no_partial_file(tmp_path: Path) -> None:
    """A block 0 may carry an mtime of up to 22 octal digits (the size rule accepts it), i.e. up
    to 2^66 - 1 seconds. ``os.utime`` raises OverflowError (not OSError) for a time_t that large,
    so ``DirectorySink.commit`` let it escape: the driver crashed out of ``feed`` instead of
    cancelling with CAN CAN, and the fsynced ``.ymodem-*.part`` temporary stayed in the target
    directory. The sink's contract is that any refusal cancels the batch and deletes the
    temporary file."""
    hostile = SendFile.from_bytes("late.bin", b"payload", mtime=8**22 - 1, mode=0o644)
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender([hostile])
    sent = _run_ymodem(tx, drv)
    assert sent.count(CAN) >= 2 and tx.state is TxState.ABORTED
    assert list(tmp_path.iterdir()) == []
    assert not drv.report.ok
