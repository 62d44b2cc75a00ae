"""A peer that stops reading answers never kills the simulator.

Answers the reader does not take in time are dropped and counted; the device keeps serving, and
SIGTERM still ends ``idemlink sim`` (framed and ``--modbus-rtu``) with exit 0.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import termios
import threading
import time
import tty

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.pty import WRITE_STALL, FdTransport, WriteStalled, open_pty
from idemlink.device_sim.serve import ServeStats, serve
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.modbus_rtu import encode_rtu

CLI = [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())"]
HELLO = encode_frame(FrameType.HELLO, 1, 0, b"\x01" + contract_hash())
RTU_READ = encode_rtu(1, bytes.fromhex("030000007d"))  # 125 registers: a 255-byte answer


def _flood(fd: int, request: bytes, count: int) -> None:
    """Send ``count`` requests and never read an answer (fails if the device stops reading: no
    byte taken for 10 s; a busy machine may make the whole flood take longer than that)."""
    deadline = time.monotonic() + 10
    for _ in range(count):
        view = memoryview(request)
        while view:
            _, ready, _ = select.select([], [fd], [], 0.5)
            assert time.monotonic() < deadline, "the device stopped reading requests"
            if ready:
                view = view[os.write(fd, view):]
                deadline = time.monotonic() + 10


def test_a_write_nobody_reads_is_dropped_not_blocking() -> None:
    pair = open_pty()
    try:
        t = FdTransport(pair.master_fd)
        with pytest.raises(WriteStalled):
            for _ in range(10_000):
                t.write(b"x" * 512)
        # Still stalled: each answer is dropped at once. Waiting WRITE_STALL for each would take
        # at least 10 x WRITE_STALL; a busy machine may delay a write, not ten by that much.
        start = time.monotonic()
        for _ in range(10):
            with pytest.raises(WriteStalled):
                t.write(b"y" * 64)
        assert time.monotonic() - start < 5 * WRITE_STALL, "still stalled: dropped at once"
    finally:
        pair.close()


def test_serve_keeps_serving_and_counts_dropped_answers() -> None:
    pair = open_pty()
    stop = threading.Event()
    result: list[ServeStats] = []
    thread = threading.Thread(target=lambda: result.append(
        serve(SimulatedDevice(seed=1), pair.transport(), stop)))
    thread.start()
    try:
        _flood(pair.slave_fd, HELLO, 3000)
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            stop.set()
            thread.join(0.5)
    finally:
        stop.set()
        thread.join(5)
        pair.close()
    assert not thread.is_alive() and result, "the loop ended on stop, not on an error"
    assert result[0].answers_dropped > 0


def _start_sim(extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([*CLI, "sim", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    return proc, line


@pytest.mark.parametrize(("mode", "request_bytes"), [([], HELLO), (["--modbus-rtu"], RTU_READ)])
def test_cli_sim_survives_a_reader_that_stopped_and_exits_0_on_sigterm(
        mode: list[str], request_bytes: bytes) -> None:
    proc, path = _start_sim(mode)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(fd, termios.TCSANOW)
        _flood(fd, request_bytes, 2500)
        time.sleep(0.3)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
        os.close(fd)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0


def test_cli_sim_on_a_port_survives_a_reader_that_stopped() -> None:
    pair = open_pty()  # the sim serves the slave path; this test holds the master and never reads
    proc = subprocess.Popen([*CLI, "sim", "--port", pair.slave_path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().strip() == pair.slave_path
        _flood(pair.master_fd, HELLO, 2500)
        time.sleep(0.3)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pair.close()
    assert rc == 0
