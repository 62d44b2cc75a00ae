"""Driving the plain Modbus RTU face: one read through an ``RtuServer``, an ``RtuServer`` serving a
pty in a thread (``rtu_on_pty``), an in-process lossy wire for ``RtuDevice``, and ``idemlink sim
--modbus-rtu`` as a child process."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from idemlink.device_sim.pty import open_pty
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.modbus import FunctionCode
from idemlink.protocol.modbus_rtu import decode_rtu
from idemlink.protocol.regmap_file import DEFAULT_MAP
from support.timing import read_line, scaled

TH, MODE, FAULTS, TRIG, GEN, TEMP = 4, 5, 7, 8, 3, 0  # addresses in the default map


def rtu_reply(server: RtuServer, data: bytes, now: float) -> bytes:
    """What ``server`` answers by ``now`` to the bytes of one read (b"": the read was empty)."""
    if data:
        server.receive_data(data, now)
    else:
        server.tick(now)
    return server.data_to_send()


@contextmanager
def rtu_on_pty(core: DeviceCore, unit: int = 1) -> Iterator[str]:
    """``core`` as a plain Modbus RTU slave at ``unit`` on a pty: yields the path to open."""
    pair = open_pty()
    server = RtuServer(core, unit=unit)
    stop = threading.Event()
    th = threading.Thread(target=server.serve, args=(pair.transport(), stop), daemon=True)
    th.start()
    try:
        yield pair.slave_path
    finally:
        stop.set()
        th.join(5)
        pair.close()


class LossyWire:
    """``RtuDevice``'s transport, in process, on a simulated clock: requests reach an
    ``RtuServer`` whole; ``lose(request_pdu, n)`` says whether the n-th answer is lost."""

    def __init__(self, lose: Callable[[bytes, int], bool], trigger_duration: float = 5.0) -> None:
        self.core = DeviceCore(DEFAULT_MAP, trigger_duration=trigger_duration)
        self.server = RtuServer(self.core, unit=1)
        self.lose = lose
        self.t = 0.0
        self.requests: list[bytes] = []
        self._inbox = b""

    def write(self, data: bytes) -> None:
        self.t += 0.001
        self.requests.append(data)
        answer = rtu_reply(self.server, data, self.t)
        n = sum(r == data for r in self.requests)
        if answer and not self.lose(decode_rtu(data).pdu, n):
            self._inbox += answer

    def read(self, timeout: float) -> bytes:
        data, self._inbox = self._inbox, b""
        if not data:
            self.t += timeout
            rtu_reply(self.server, b"", self.t)
        return data

    def now(self) -> float:
        return self.t

    def close(self) -> None:
        pass


def writes_to(address: int) -> Callable[[bytes, int], bool]:
    """A ``lose`` rule for ``LossyWire``: every answer to an FC06 write of ``address``."""
    return lambda p, n: p[0] == FunctionCode.WRITE_SINGLE_REGISTER and p[1:3] == address.to_bytes(2, "big")


def start_sim(*args: str) -> tuple[subprocess.Popen[bytes], str]:
    """``idemlink sim --modbus-rtu ARGS`` as a child; returns it and the port it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--modbus-rtu", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    path = read_line(proc.stdout, proc)
    return proc, path


def stop_sim(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Send ``sig``; the exit status."""
    proc.send_signal(sig)
    rc = proc.wait(scaled(10))
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    return rc
