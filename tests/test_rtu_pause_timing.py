"""A Modbus RTU request whose function code tells no length (here FC08 diagnostics, which the
map does not serve) ends only at a pause: both slaves, ``idemlink sim --modbus-rtu``
(``device_sim/rtu_server.py``) and the C device (``idl_rtu`` + the posix port), answer it with
exception 01 ILLEGAL FUNCTION (Modbus Application Protocol 7: a function the server does not
support is answered so, not ignored) t3.5 after its last byte, not later: the simulator used to
wait ``resync_silence`` (0.1 s) for it.

- The rule, on a simulated clock: no answer before t3.5 of silence, the answer at t3.5; the
  serve loop waits until t3.5 after the frame and confirms the silence with one short read.
- On a pty, both implementations: each request's answer comes at least t3.5 after the moment
  before its write (never before the pause) and, in the median of several requests, at most
  t3.5 + ``SLACK`` after the write returned. ``SLACK`` is scheduling room on a loaded 2-core
  machine (the answers take 2-4 ms idle, medians past 30 ms were seen with the cores saturated);
  the old simulator could not answer before its 0.1 s resync silence, so any bound under 100 ms
  tells it apart, whatever the load.

Skips the C device, naming the reason, when make or a C compiler is missing.
"""

from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
import threading
import time
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.rtu import rtu_reply

from idemlink.device_sim.rtu_server import CONFIRM_READ, RtuServer
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.modbus_rtu import FRAME_GAP_FAST, encode_rtu

UNIT = 1
REQUEST = encode_rtu(UNIT, bytes.fromhex("0800001234"))  # FC08 sub-function 0000: no length
ANSWER = encode_rtu(UNIT, bytes([0x88, 0x01]))  # exception 01, ILLEGAL FUNCTION
T35 = FRAME_GAP_FAST  # a pty has no baud rate: 1.75 ms, both implementations
SLACK = 0.070  #: below the old simulator's 0.1 s floor
TRIALS = 11


# ------------------------------------------------------------------------ on a simulated clock


def test_the_frame_ends_at_t35_of_silence() -> None:
    server = RtuServer(DeviceCore(), unit=UNIT)
    assert rtu_reply(server, REQUEST, 1.0) == b""  # the length is unknown: wait for the pause
    assert rtu_reply(server, b"", 1.0 + 0.9 * T35) == b""  # not a pause yet
    assert rtu_reply(server, b"", 1.0 + T35 + 1e-9) == ANSWER


def test_a_frame_of_known_length_is_still_not_cut_by_a_short_silence() -> None:
    """The other heads keep their patience: a host late inside a FC03 is not cut at t3.5."""
    server = RtuServer(DeviceCore(), unit=UNIT)
    read = encode_rtu(UNIT, bytes.fromhex("0300040001"))
    assert rtu_reply(server, read[:4], 1.0) == b""
    assert rtu_reply(server, b"", 1.0 + 2 * T35) == b""
    assert rtu_reply(server, read[4:], 1.01) == encode_rtu(UNIT, bytes.fromhex("0302015e"))


class SimulatedLine:
    """``RtuServer.serve``'s transport and clock: the request arrives at ``at``; an empty read
    waits its whole timeout; the first answer stops the loop."""

    def __init__(self, at: float, stop: threading.Event) -> None:
        self.t = 0.0
        self.at = at
        self.sent = False
        self.stop = stop
        self.answers: list[tuple[float, bytes]] = []
        self.timeouts: list[float] = []

    def clock(self) -> float:
        return self.t

    def read(self, timeout: float) -> bytes:
        self.timeouts.append(timeout)
        if not self.sent and self.at <= self.t + timeout:
            self.t, self.sent = max(self.t, self.at), True
            return REQUEST
        self.t += timeout
        if self.t > self.at + 1.0:
            self.stop.set()
        return b""

    def write(self, data: bytes) -> None:
        self.answers.append((self.t, data))
        self.stop.set()


@pytest.mark.parametrize("at", [0.0, 0.013, 0.0199, 0.5])
def test_the_serve_loop_answers_t35_after_the_frame(at: float) -> None:
    stop = threading.Event()
    line = SimulatedLine(at, stop)
    RtuServer(DeviceCore(), unit=UNIT).serve(line, stop, clock=line.clock)
    assert len(line.answers) == 1, line.answers
    when, answer = line.answers[0]
    assert answer == ANSWER
    assert at + T35 <= when <= at + T35 + 3 * CONFIRM_READ, (at, when)  # float rounding: 3
    assert max(line.timeouts) == 0.02  # idle: the 20 ms poll


# ------------------------------------------------------------------------------- on a pty


@pytest.fixture(scope="module")
def c_device(device_bin: Path) -> Path:
    return device_bin  # make -C firmware_ref device, once per session (support.fixtures)


@pytest.fixture(params=["sim", "c"])
def slave(request: pytest.FixtureRequest) -> Iterator[str]:
    """One implementation serving Modbus RTU unit 1 on its own pty; its path."""
    if request.param == "c":
        binary: Path = request.getfixturevalue("c_device")
        command = [str(binary), "--modbus-rtu", "--unit", str(UNIT)]
    else:
        command = [sys.executable, "-m", "idemlink", "sim", "--modbus-rtu", "--unit", str(UNIT)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    path = proc.stdout.readline().strip()
    try:
        assert path.startswith("/dev/"), (path, proc.stderr.read() if proc.stderr else "")
        yield path
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err


def _one_request(fd: int) -> tuple[float, float]:
    """Send REQUEST, read ANSWER: (answer - before the write, answer - after the write)."""
    before = time.monotonic()
    os.write(fd, REQUEST)
    after = time.monotonic()
    got = b""
    first = None
    deadline = after + 2.0
    while len(got) < len(ANSWER):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no answer within 2 s (got {got.hex()})"
        if first is None:
            first = time.monotonic()
        got += os.read(fd, 64)
    assert got == ANSWER, got.hex()
    return first - before, first - after


def test_an_unsized_frame_is_answered_t35_after_its_end(slave: str) -> None:
    fd = os.open(slave, os.O_RDWR | os.O_NOCTTY)
    try:
        tty.setraw(fd)
        gaps = [_one_request(fd) for _ in range(TRIALS)]
    finally:
        os.close(fd)
    earliest = min(g[0] for g in gaps)
    typical = statistics.median(g[1] for g in gaps)
    assert earliest >= T35, f"answered {earliest * 1000:.2f} ms after the write began: before t3.5"
    assert typical <= T35 + SLACK, (
        f"median answer {typical * 1000:.1f} ms after the request, bound "
        f"{(T35 + SLACK) * 1000:.1f} ms; all: {[round(g[1] * 1000, 1) for g in gaps]}")
