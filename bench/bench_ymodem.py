"""YMODEM throughput through a paced link: 115200 baud (10 bits a byte), 1 ms one-way latency.

One 1 MiB random file, one run each, through the same emulated line (``idemlink.device_sim.link``'s
``LinkDirection`` relaying between two pty pairs in a separate process):

1. lrzsz ``sb -k`` -> ``rb`` (the peer),
2. our sender -> our receiver (``idemlink receive``), turnaround 0,
3. our sender (default 2 ms turnaround) -> ``rb``.

Prints wall time, payload throughput and the ratio to the line rate (115200/10 B/s) and to the
stop-and-wait ceiling for 1K blocks. Run: ``python3 bench/bench_ymodem.py [--size BYTES]``.
Every run takes ~95 s at 1 MiB. Needs socat-free ptys, lrzsz (sb/rb).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

BAUD = 115200
LATENCY = 0.001


def relay(conn: Connection, baud: int, latency: float) -> None:
    """Two pty pairs joined by a paced full-duplex line; sends the two slave paths, then relays
    until told to stop (any message on ``conn``)."""
    from idemlink.device_sim.link import LinkConfig, LinkDirection
    from idemlink.device_sim.pty import open_pty

    a, b = open_pty(), open_pty()
    cfg = LinkConfig(baud=baud, latency=latency)
    ab, ba = LinkDirection(cfg, "a->b"), LinkDirection(cfg, "b->a")
    conn.send((a.slave_path, b.slave_path))
    fds = {a.master_fd: (ab, b.master_fd), b.master_fd: (ba, a.master_fd)}
    while True:
        now = time.monotonic()
        nexts = [t for t in (ab.next_event_time(), ba.next_event_time()) if t is not None]
        timeout = max(0.0, min(nexts) - now) if nexts else 0.05
        ready, _, _ = select.select([a.master_fd, b.master_fd, conn.fileno()], [], [], timeout)
        now = time.monotonic()
        if conn.fileno() in ready:
            break
        for fd in ready:
            try:
                data = os.read(fd, 4096)
            except OSError:  # the slave side is closed right now
                data = b""
            if data:
                fds[fd][0].send(data, now)
        for direction, out_fd in ((ab, b.master_fd), (ba, a.master_fd)):
            out = direction.poll(now)
            if out:
                os.write(out_fd, out)
    a.close()
    b.close()


class Line:
    def __init__(self) -> None:
        parent, child = mp.Pipe()
        self.conn = parent
        self.proc = mp.Process(target=relay, args=(child, BAUD, LATENCY), daemon=True)
        self.proc.start()
        self.a, self.b = parent.recv()

    def close(self) -> None:
        self.conn.send("stop")
        self.proc.join(5)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _exit_time(proc: subprocess.Popen[bytes], out: list[float]) -> threading.Thread:
    """Record when ``proc`` exits: the receiver has the whole batch then."""

    def wait() -> None:
        proc.wait()
        out.append(time.monotonic())

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    return t


def run_sb_rb(src: Path, dst: Path) -> tuple[float, float | None]:
    """Returns (seconds until rb exited with the file, seconds until sb exited or None if sb
    was still waiting for rb's lost final ACK 15 s later)."""
    line = Line()
    try:
        with open(line.b, "r+b", buffering=0) as tb, open(line.a, "r+b", buffering=0) as ta:
            rb = subprocess.Popen(["rb", "--ymodem", "-y"], stdin=tb, stdout=tb,
                                  stderr=subprocess.DEVNULL, cwd=dst)
            t0 = time.monotonic()
            sb = subprocess.Popen(["sb", "--ymodem", "-k", "-t", "100", src.name], stdin=ta,
                                  stdout=ta, stderr=subprocess.DEVNULL, cwd=src.parent)
            rb_done: list[float] = []
            _exit_time(rb, rb_done).join(600)
            try:
                sb.wait(15)
                sb_wall: float | None = time.monotonic() - t0
            except subprocess.TimeoutExpired:
                sb.kill()
                sb.wait()
                sb_wall = None
        if rb.returncode != 0 or sha(dst / src.name) != sha(src):
            raise SystemExit(f"sb -> rb failed (rb exit {rb.returncode})")
        return rb_done[0] - t0, sb_wall
    finally:
        line.close()


def run_ours(src: Path, dst: Path, to_rb: bool) -> tuple[float, float | None]:
    """Returns (seconds until the receiver exited with the file, seconds until our sender
    finished)."""
    import serial

    from idemlink.host.ymodem_io import send_files
    from idemlink.protocol.ymodem import SenderConfig

    line = Line()
    try:
        with open(line.b, "r+b", buffering=0) as tb:
            port = serial.serial_for_url(line.a)  # before the receiver: its 'C' is not lost
            if to_rb:
                peer = subprocess.Popen(["rb", "--ymodem", "-y"], stdin=tb, stdout=tb,
                                        stderr=subprocess.DEVNULL, cwd=dst)
                cfg = SenderConfig()
            else:
                peer = subprocess.Popen(
                    [sys.executable, "-m", "idemlink", "receive", "--port", line.b, "--dir",
                     str(dst), "--no-progress"], stdout=subprocess.DEVNULL)
                cfg = SenderConfig(turnaround=0.0)
            t0 = time.monotonic()
            rx_done: list[float] = []
            waiter = _exit_time(peer, rx_done)
            report = send_files(port, [src], cfg)
            tx_wall = time.monotonic() - t0
            port.close()
            waiter.join(30)
        if not report.ok or not rx_done or sha(dst / src.name) != sha(src):
            raise SystemExit(f"ours failed: {report}")
        return rx_done[0] - t0, tx_wall
    finally:
        line.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--runs", default="1,2,3", help="which runs, e.g. 1,3 (default all)")
    args = ap.parse_args()
    if not (shutil.which("sb") and shutil.which("rb")):
        raise SystemExit("needs lrzsz (sb, rb)")
    size = args.size
    line_rate = BAUD / 10
    bound = size / line_rate
    blocks = -(-size // 1024)
    per_block = (1029 + 1) * 10 / BAUD + 2 * LATENCY
    ceiling = blocks * per_block
    print(f"{size} bytes at {BAUD} baud, {LATENCY * 1000:.0f} ms one-way latency")
    print(f"line bound {bound:.2f} s; 1K stop-and-wait ceiling {ceiling:.2f} s "
          f"({bound / ceiling:.1%} of line rate)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = root / "src" / "payload.bin"
        src.parent.mkdir()
        src.write_bytes(random.Random(0).randbytes(size))
        rows: list[tuple[str, float]] = []
        runs: list[tuple[str, Callable[[Path], tuple[float, float | None]]]] = [
            ("lrzsz sb -k -> rb", lambda d: run_sb_rb(src, d)),
            ("ours -> ours (turnaround 0)", lambda d: run_ours(src, d, to_rb=False)),
            ("ours -> rb (turnaround 2 ms)", lambda d: run_ours(src, d, to_rb=True)),
        ]
        print("wall = start of the sender until the receiver exited with the whole batch")
        wanted = {int(x) for x in args.runs.split(",")}
        for k, (name, fn) in enumerate(runs, 1):
            if k not in wanted:
                continue
            d = root / f"dst{len(rows)}"
            d.mkdir()
            wall, tx_s = fn(d)
            rows.append((name, wall))
            extra = ("; sender still waiting for the final ACK after 15 s" if tx_s is None
                     else f"; sender finished after {tx_s:.2f} s")
            print(f"{name:30s} {wall:7.2f} s  {size / wall / 1000:6.2f} kB/s  "
                  f"{bound / wall:6.1%} of line rate{extra}", flush=True)
        if 1 in wanted:
            peer = rows[0][1]
            for name, wall in rows[1:]:
                print(f"{name}: {peer / wall:.3f}x lrzsz throughput")


if __name__ == "__main__":
    main()
