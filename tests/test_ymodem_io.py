"""The YMODEM shell's safe file sink and the embeddable ReceiverDriver, driven in-process.

The sender is the real ``idemlink.protocol.ymodem.Sender``; the oracle is the source bytes and the
directory listing, never a value the sink computed.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import threading
from pathlib import Path

import pytest

from idemlink.protocol.ymodem_events import FileStarted, drain_events
from idemlink.protocol.ymodem_files import DirectorySink, ReceiverDriver, SinkRefused, exchange
from idemlink.protocol.ymodem_receiver import ReceiverConfig
from idemlink.protocol.ymodem_sender import Sender, SenderConfig, SendFile
from idemlink.protocol.ymodem_tables import RxState, TxState
from idemlink.protocol.ymodem_wire import CAN


def run(tx: Sender, drv: ReceiverDriver, step: float = 0.01, until: float = 600.0) -> bytes:
    """Drive sender and driver in virtual time with no loss; returns every byte the driver sent."""
    now = 0.0
    tx.start(now)
    drv.start(now)
    to_tx = drv.data_to_send()
    sent = bytearray(to_tx)
    to_rx = b""
    while now < until:
        if to_tx:
            tx.receive_data(to_tx, now)
        tx.tick(now)
        drain_events(tx)
        to_rx = tx.data_to_send()
        to_tx = exchange(drv, to_rx, now)
        sent += to_tx
        if drv.finished and tx.state in (TxState.DONE, TxState.ABORTED):
            break
        now += step
    return bytes(sent)


def files(spec: dict[str, bytes], mode: int = 0o644, mtime: int = 1_700_000_000) -> list[SendFile]:
    return [SendFile.from_bytes(n, d, mtime=mtime, mode=mode) for n, d in spec.items()]


def visible(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir()}


def test_batch_lands_complete_with_mtime_and_no_temporaries(tmp_path: Path) -> None:
    rnd = random.Random(5)
    spec = {"a.bin": rnd.randbytes(3000), "b c.txt": rnd.randbytes(129), "empty": b""}
    drv = ReceiverDriver(DirectorySink(tmp_path))
    run(Sender(files(spec)), drv)
    assert drv.report.ok and [f.name for f in drv.report.files] == list(spec)
    assert visible(tmp_path) == spec  # truncated to the declared size: no 0x1A padding
    assert os.stat(tmp_path / "a.bin").st_mtime == 1_700_000_000


def test_file_is_invisible_until_committed(tmp_path: Path) -> None:
    seen_during: list[set[str]] = []

    class Watching(DirectorySink):
        def write(self, offset: int, data: bytes) -> None:
            super().write(offset, data)
            seen_during.append({p.name for p in tmp_path.iterdir()})

    drv = ReceiverDriver(Watching(tmp_path))
    run(Sender(files({"fw.bin": bytes(5000)})), drv)
    assert seen_during and all("fw.bin" not in s for s in seen_during)
    assert all(len(s) == 1 and next(iter(s)).startswith(".ymodem-") for s in seen_during)
    assert visible(tmp_path) == {"fw.bin": bytes(5000)}


@pytest.mark.parametrize(("sent_mode", "expected"), [
    (0o4755, 0o755), (0o2755, 0o755), (0o1777, 0o775), (0o666, 0o664), (0o600, 0o600),
])
def test_mode_is_sanitised(tmp_path: Path, sent_mode: int, expected: int) -> None:
    drv = ReceiverDriver(DirectorySink(tmp_path))
    run(Sender(files({"m": b"x"}, mode=sent_mode)), drv)
    assert stat.S_IMODE(os.stat(tmp_path / "m").st_mode) == expected


def test_existing_file_is_not_overwritten_and_the_batch_is_cancelled(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_bytes(b"original")
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender(files({"keep.txt": b"attacker"}))
    sent = run(tx, drv)
    assert sent.count(CAN) >= 2 and tx.state is TxState.ABORTED
    assert visible(tmp_path) == {"keep.txt": b"original"}
    assert not drv.report.ok and "exists" in drv.report.reason


def test_an_identical_resend_is_accepted_and_the_existing_file_kept(tmp_path: Path) -> None:
    """``sb fw.bin`` twice: the second batch completes (ACKed, sender DONE), the file is reported
    identical, the existing file untouched (same inode, its mtime), no temporary left."""
    data = random.Random(9).randbytes(3000)
    target = tmp_path / "fw.bin"
    target.write_bytes(data)
    os.utime(target, (1_000_000_000, 1_000_000_000))
    inode = os.stat(target).st_ino
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender(files({"fw.bin": data, "next.bin": b"more"}))
    sent = run(tx, drv)
    assert CAN not in sent and tx.state is TxState.DONE and drv.report.ok
    assert [(f.name, f.ok, f.identical) for f in drv.report.files] == [
        ("fw.bin", True, True), ("next.bin", True, False)]
    assert visible(tmp_path) == {"fw.bin": data, "next.bin": b"more"}
    assert os.stat(target).st_ino == inode and os.stat(target).st_mtime == 1_000_000_000


def test_a_same_size_different_file_is_refused_at_commit(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_bytes(b"original")
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender(files({"keep.txt": b"attacker"}))  # same size: only the bytes can tell
    sent = run(tx, drv)
    assert sent.count(CAN) >= 2 and tx.state is TxState.ABORTED
    assert visible(tmp_path) == {"keep.txt": b"original"}
    assert "exists (use --overwrite)" in drv.report.reason


@pytest.mark.parametrize("swap", ["fifo", "symlink", "gone", "other"])
def test_a_file_replaced_between_header_and_commit_is_never_identical(
        tmp_path: Path, swap: str) -> None:
    """The existing file is swapped after the header passed (a FIFO, a symlink to a copy of the
    bytes, deleted, other bytes of the same size): the commit refuses at once, never hangs on a
    FIFO, never follows a link, never reports the file identical."""
    data = random.Random(4).randbytes(2000)
    target = tmp_path / "fw.bin"
    target.write_bytes(data)
    (tmp_path / "copy").write_bytes(data)

    class Swapping(DirectorySink):
        def write(self, offset: int, data: bytes) -> None:
            super().write(offset, data)
            if offset == 0:
                target.unlink()
                if swap == "fifo":
                    os.mkfifo(target)
                elif swap == "symlink":
                    target.symlink_to(tmp_path / "copy")
                elif swap == "other":
                    target.write_bytes(bytes(len(data)))

    drv = ReceiverDriver(Swapping(tmp_path))
    tx = Sender(files({"fw.bin": data}))
    done = threading.Event()
    worker = threading.Thread(target=lambda: (run(tx, drv), done.set()), daemon=True)
    worker.start()
    if not done.wait(5):
        fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)  # release the blocked reader
        os.close(fd)
        worker.join(5)
        pytest.fail("the commit hung opening a FIFO")
    assert tx.state is TxState.ABORTED and not drv.report.ok
    assert not any(f.identical for f in drv.report.files)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ymodem-")]


def test_a_symlink_of_that_name_is_still_refused_at_the_header(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x" * 10)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender(files({"link": b"x" * 10}))
    run(tx, drv)
    assert tx.state is TxState.ABORTED and "exists" in drv.report.reason
    assert (tmp_path / "link").is_symlink()


def test_overwrite_when_asked(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"old")
    drv = ReceiverDriver(DirectorySink(tmp_path, overwrite=True))
    run(Sender(files({"f": b"new content"})), drv)
    assert visible(tmp_path) == {"f": b"new content"}


def test_quota_refuses_a_declared_size_and_keeps_earlier_files(tmp_path: Path) -> None:
    drv = ReceiverDriver(DirectorySink(tmp_path, quota=4000))
    tx = Sender(files({"one": bytes(3000), "two": bytes(3000)}))
    run(tx, drv)
    assert visible(tmp_path) == {"one": bytes(3000)}  # committed before the refusal
    assert tx.state is TxState.ABORTED and "quota" in drv.report.reason


def test_write_error_cancels_and_leaves_nothing_partial(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    real = os.pwrite

    def failing_pwrite(fd: int, data: bytes, offset: int) -> int:
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender(files({"big": bytes(10000)}))
    sent = run(tx, drv)
    assert sent.count(CAN) >= 2 and tx.state is TxState.ABORTED
    assert list(tmp_path.iterdir()) == []
    assert "No space left" in drv.report.reason


def test_sender_cancel_midway_leaves_nothing(tmp_path: Path) -> None:
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender(files({"x": bytes(20000)}), SenderConfig(turnaround=0))
    now = 0.0
    tx.start(now)
    drv.start(now)
    tx.receive_data(drv.data_to_send(), now)
    for _ in range(6):
        now += 0.01
        tx.tick(now)
        back = exchange(drv, tx.data_to_send(), now)
        tx.receive_data(back, now)
    assert drv.rx.state is RxState.RECV_DATA
    tx.abort("user pressed ^C", now)
    exchange(drv, tx.data_to_send(), now + 0.01)
    assert drv.rx.state is RxState.ABORTED  # type: ignore[comparison-overlap]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../escape", "/abs", "a/b", "..", "C:x", "n\nl"])
def test_sink_refuses_names_itself_too(tmp_path: Path, name: str) -> None:
    sink = DirectorySink(tmp_path)
    with pytest.raises(SinkRefused):
        sink.open(FileStarted(name, 1, None, None))
    assert list(tmp_path.iterdir()) == []


def test_receiver_refuses_hostile_name_before_the_sink_sees_it(tmp_path: Path) -> None:
    target = tmp_path / "in"
    target.mkdir()
    drv = ReceiverDriver(DirectorySink(target))
    drv.start(0.0)
    # A hand-made block 0 whose name climbs out of the directory.
    from idemlink.protocol.ymodem_wire import build_block

    out = exchange(drv, build_block(0, b"../outside\x005 0 100644".ljust(128, b"\x00")), 0.1)
    assert out.count(CAN) >= 2
    assert list(tmp_path.iterdir()) == [target] and list(target.iterdir()) == []
    assert drv.report.files[0].ok is False


def test_receiver_config_size_limit_reaches_the_driver(tmp_path: Path) -> None:
    drv = ReceiverDriver(DirectorySink(tmp_path), ReceiverConfig(max_file_size=100))
    tx = Sender(files({"f": bytes(101)}))
    run(tx, drv)
    assert tx.state is TxState.ABORTED and list(tmp_path.iterdir()) == []
