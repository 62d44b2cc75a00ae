"""The YMODEM receiver and the ``send``/``receive`` commands when the peer or the line misbehaves.

- A sender that goes silent mid-file is given up after ``silence_timeout`` (60 s by default,
  ``receive --timeout``), not after ``max_errors`` × ``block_timeout`` (100 s).
- SIGTERM and SIGHUP during ``receive`` delete the ``.ymodem-*.part`` temporary (as Ctrl-C did).
- A line that dies mid-transfer is one line on stderr and exit 5 for ``send --plain`` and
  ``receive``, never a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import termios
import time
import tty
from pathlib import Path
from typing import Any

import pytest
import serial
from support.timing import wait_until

from idemlink.cli import EXIT_UNKNOWN, main
from idemlink.commands import ymodem_cmd
from idemlink.device_sim.pty import open_pty
from idemlink.protocol.ymodem_events import Aborted
from idemlink.protocol.ymodem_receiver import Receiver, ReceiverConfig
from idemlink.protocol.ymodem_tables import RxState
from idemlink.protocol.ymodem_wire import BLOCK_LARGE, build_block, build_header

CLI = [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())"]


def _header_and_first_block() -> bytes:
    _, header = build_header("f.bin", 3 * BLOCK_LARGE, 0, 0o644)
    return build_block(0, header) + build_block(1, b"\x11" * BLOCK_LARGE)


def _silent_sender_gives_up_at(config: ReceiverConfig) -> float:
    rx = Receiver(config)
    rx.start(0.0)
    rx.receive_data(_header_and_first_block(), 1.0)
    now = 1.0
    while rx.state is not RxState.ABORTED and now < 1000:
        due = rx.next_deadline()
        assert due is not None
        now = max(now, due)
        rx.tick(now)
    events = []
    while (ev := rx.next_event()) is not None:
        events.append(ev)
    assert any(isinstance(e, Aborted) for e in events)
    return now - 1.0


def test_a_sender_silent_mid_file_is_given_up_within_a_minute() -> None:
    waited = _silent_sender_gives_up_at(ReceiverConfig())
    assert 55 <= waited <= 61
    assert _silent_sender_gives_up_at(ReceiverConfig(silence_timeout=5.0)) == pytest.approx(5.0)


def test_receive_timeout_bounds_the_silence(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    seen: list[ReceiverConfig] = []

    def fake_receive(port: Any, sink: Any, config: ReceiverConfig, bar: Any) -> Any:
        seen.append(config)
        raise serial.SerialException("stop here")

    monkeypatch.setattr("idemlink.host.ymodem_io.receive_files", fake_receive)
    main(["receive", "--port", "loop://", "--dir", str(tmp_path), "--timeout", "7"])
    assert seen[0].silence_timeout == 7.0


class _DyingPort:
    """A port whose line dies after a few reads."""

    def __init__(self) -> None:
        self.timeout: float = 0.0
        self.in_waiting = 0
        self._reads = 0

    def read(self, size: int = 1) -> bytes:
        self._reads += 1
        if self._reads > 3:
            raise serial.SerialException("device reports readiness to read but returned no data "
                                         "(device disconnected or multiple access on port?)")
        return b"C" if self._reads == 1 else b""

    def write(self, data: bytes) -> int:
        return len(data)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("verb", ["send", "receive"])
def test_a_line_dying_mid_transfer_is_one_line_exit_5(
        verb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ymodem_cmd, "_open", lambda url, baud: _DyingPort())
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"x" * 5000)
    argv = (["send", "--plain", str(payload), "--port", "x", "--no-progress"] if verb == "send"
            else ["receive", "--port", "x", "--dir", str(tmp_path), "--no-progress"])
    assert main(argv) == EXIT_UNKNOWN
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mid-transfer" in err and "Traceback" not in err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_receive_cleans_its_temporary_on_sigterm_and_sighup(signum: int, tmp_path: Path) -> None:
    pair = open_pty()
    target = tmp_path / "in"
    target.mkdir()
    proc = subprocess.Popen([*CLI, "receive", "--port", pair.slave_path, "--dir", str(target),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        tty.setraw(pair.master_fd, termios.TCSANOW)
        deadline = time.monotonic() + 10
        while os.read(pair.master_fd, 1) != b"C":  # the receiver is up
            assert time.monotonic() < deadline
        os.write(pair.master_fd, _header_and_first_block())
        wait_until(lambda: any(p.name.endswith(".part") for p in target.iterdir()),
                   what="the temporary to appear")
        proc.send_signal(signum)
        rc = proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pair.close()
    assert rc == 128 + signum
    assert list(target.iterdir()) == []
    assert proc.stderr is not None and proc.stderr.read().decode().count("\n") == 1


def test_framed_send_to_a_device_that_dies_mid_transfer_is_one_line_exit_5(tmp_path: Path) -> None:
    """The device (its simulator process) is killed while the file crosses a paced line: one
    line on stderr, exit 5 (part of the batch may be on the device), no traceback."""
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 800)  # 200 KB: ~18 s at 115200 baud
    sim = subprocess.Popen([*CLI, "sim", "--flash-dir", str(tmp_path / "flash")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert sim.stdout is not None
        port = sim.stdout.readline().strip()
        send = subprocess.Popen([*CLI, "send", "--port", f"faulty://{port}?baud=115200",
                                 "--no-progress", str(big)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: any((tmp_path / "flash" / "files").glob(".ymodem-*.part")),
                   timeout=20, what="the transfer to start")
        sim.kill()
        _, err = send.communicate(timeout=60)
    finally:
        if sim.poll() is None:
            sim.kill()
        sim.wait()
    assert send.returncode == 5, err
    assert "Traceback" not in err and err.count("\n") == 1 and "mid-transfer" in err, err
