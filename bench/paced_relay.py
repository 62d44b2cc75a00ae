"""An independent yardstick for the link emulator: a plain paced relay between pseudo-terminals.

It only delays bytes: a byte leaves its sender's side 10 bits / baud after the previous one finished
(or when it arrives, if the line was idle), and is delivered ``latency`` later. No frames, no faults,
no idemlink code: it shares nothing with ``idemlink.device_sim.link`` but the arithmetic of a UART.

Usage: ``python3 bench/paced_relay.py [--baud 115200] [--latency-ms L] TARGET...`` — for each
TARGET (a pty or tty path, e.g. the one ``idemlink sim`` prints) it creates a pty for the host and
prints its path, one line per target, then relays every pair in one select loop until SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time
import tty
from collections import deque


class Direction:
    """One direction of one line: bytes in, the same bytes out when their wire time has passed."""

    def __init__(self, byte_time: float, latency: float) -> None:
        self.byte_time = byte_time
        self.latency = latency
        self.free_at = 0.0  # when the line finishes the last byte accepted so far
        self.chunks: deque[tuple[float, bytes]] = deque()  # (when its first byte is done, bytes)
        self.out = bytearray()

    def accept(self, data: bytes, now: float) -> None:
        first_done = max(now, self.free_at) + self.byte_time
        self.free_at = first_done + self.byte_time * (len(data) - 1)
        self.chunks.append((first_done, data))

    def due(self, now: float) -> bytes:
        got = bytearray()
        while self.chunks:
            first_done, data = self.chunks[0]
            n = int((now - self.latency - first_done) / self.byte_time) + 1
            if n <= 0:
                break
            got += data[:n]
            if n >= len(data):
                self.chunks.popleft()
            else:
                self.chunks[0] = (first_done + n * self.byte_time, data[n:])
                break
        return bytes(got)

    def next_time(self) -> float | None:
        return self.chunks[0][0] + self.latency if self.chunks else None


def raw_fd(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    tty.setraw(fd)
    return fd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--baud", type=int, default=115200)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--quantum-ms", type=float, default=0.2,
                    help="at most this late: the loop wakes at most this often while bytes fly")
    args = ap.parse_args()
    byte_time = 10 / args.baud
    latency = args.latency_ms / 1000
    quantum = args.quantum_ms / 1000
    routes: dict[int, tuple[Direction, int]] = {}  # readable fd -> (direction, destination fd)
    keep: list[int] = []
    for target in args.targets:
        dev = raw_fd(target)
        master, slave = os.openpty()
        tty.setraw(slave)
        os.set_blocking(master, False)
        keep.append(slave)  # held open: the pty survives the host reopening it
        routes[master] = (Direction(byte_time, latency), dev)
        routes[dev] = (Direction(byte_time, latency), master)
        print(os.ttyname(slave), flush=True)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    clock = time.monotonic
    while not stop:
        now = clock()
        times = []
        for direction, dst in routes.values():
            data = direction.due(now)
            if data:
                direction.out += data
            if direction.out:
                try:
                    n = os.write(dst, direction.out)
                    del direction.out[:n]
                except BlockingIOError:
                    pass
            t = direction.next_time()
            if t is not None:
                times.append(t)
        timeout = None if not times else max(min(times) - clock(), quantum)
        try:
            readable, _, _ = select.select(list(routes), [], [], timeout if timeout is not None else 0.5)
        except InterruptedError:
            continue
        now = clock()
        for fd in readable:
            try:
                data = os.read(fd, 4096)
            except (BlockingIOError, OSError):  # EIO: nobody on the other side right now
                continue
            if data:
                routes[fd][0].accept(data, now)
    sys.exit(0)


if __name__ == "__main__":
    main()
