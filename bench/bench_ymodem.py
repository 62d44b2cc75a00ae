"""YMODEM throughput through a paced link: 115200 baud (10 bits a byte), 1 ms one-way latency.

Every direction, with the CLI's own defaults (the settings ``idemlink send --plain`` and
``idemlink receive`` take when given no option, from ``idemlink.commands.ymodem_cmd``), through the
same emulated line (``idemlink.device_sim.link``'s ``LinkDirection`` relaying between two pty pairs
in a separate process):

1. lrzsz ``sb -k`` -> ``rb`` (the reference),
2. idemlink -> idemlink (``idemlink receive``),
3. idemlink -> ``rb``,
4. lrzsz ``sb -k`` -> idemlink,

for one 1 MiB random file and one 20 KB file. ``--before`` adds idemlink -> idemlink and
idemlink -> ``rb`` with the sender's previous defaults (2 ms turnaround on every answer, no nudge,
2 s end-of-batch wait), measured in the same run. Wall time runs from the sender's start until the
receiver exited with the whole batch; every figure is the median of ``--repeat`` runs. An
``idemlink receive`` receiver is started 0.5 s before the sender (its Python start-up is not the
protocol's), rb just before it (it starts in milliseconds).
``--update-docs`` writes the table into docs/YMODEM.md between its bench_ymodem markers.

Run: ``python3 bench/bench_ymodem.py [--size BYTES] [--repeat 3] [--before] [--update-docs]``
(~95 s a run at 1 MiB). Needs lrzsz (sb, rb).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from docs_table import DOCS, markdown_table, replace_between_markers

BAUD = 115200
LATENCY = 0.001
SMALL = 20_000
DOC = DOCS / "YMODEM.md"


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
                fds[fd][0].receive_data(data, now)
        for direction, out_fd in ((ab, b.master_fd), (ba, a.master_fd)):
            direction.tick(now)
            out = direction.data_to_send()
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


def _wait_rx(proc: subprocess.Popen[bytes], t0: float, what: str) -> float:
    done: list[float] = []
    _exit_time(proc, done).join(600)
    if not done:
        proc.kill()
        raise SystemExit(f"{what}: the receiver did not finish")
    return done[0] - t0


def run_sb(src: Path, dst: Path, to_rb: bool) -> float:
    """lrzsz sb -> rb or -> ``idemlink receive``: seconds until the receiver exited with the file."""
    line = Line()
    try:
        with open(line.b, "r+b", buffering=0) as tb, open(line.a, "r+b", buffering=0) as ta:
            if to_rb:
                rx = subprocess.Popen(["rb", "--ymodem", "-y"], stdin=tb, stdout=tb,
                                      stderr=subprocess.DEVNULL, cwd=dst)
            else:
                rx = _idemlink_receive(line.b, dst)
                time.sleep(0.5)  # its port open and 'C' sent, as a user would start it first
            t0 = time.monotonic()
            sb = subprocess.Popen(["sb", "--ymodem", "-k", "-t", "100", src.name], stdin=ta,
                                  stdout=ta, stderr=subprocess.DEVNULL, cwd=src.parent)
            wall = _wait_rx(rx, t0, "sb")
            try:
                sb.wait(15)
            except subprocess.TimeoutExpired:  # still waiting for rb's lost final ACK
                sb.kill()
                sb.wait()
        if rx.returncode != 0 or sha(dst / src.name) != sha(src):
            raise SystemExit(f"sb -> {'rb' if to_rb else 'idemlink'} failed (exit {rx.returncode})")
        return wall
    finally:
        line.close()


def _idemlink_receive(port: str, dst: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "idemlink", "receive", "--port", port, "--dir",
                             str(dst), "--no-progress"], stdout=subprocess.DEVNULL)


def cli_sender_config(before: bool = False) -> object:
    """What ``idemlink send --plain`` uses with no option; ``before``: the previous defaults."""
    from idemlink.cli import build_parser
    from idemlink.commands.ymodem_cmd import sender_config

    args = build_parser().parse_args(["send", "--plain", "--port", "x", "f"])
    cfg = sender_config(args)
    if before:
        cfg.turnaround, cfg.nudge_after, cfg.end_timeout = 0.002, None, 2.0
    return cfg


def run_ours(src: Path, dst: Path, to_rb: bool, before: bool = False) -> float:
    """idemlink (the CLI's sender settings) -> rb or -> ``idemlink receive``: seconds until the
    receiver exited with the file."""
    import serial

    from idemlink.host.ymodem_io import send_files

    config = cli_sender_config(before)  # the CLI's option parsing: before the clock starts
    line = Line()
    try:
        with open(line.b, "r+b", buffering=0) as tb:
            port = serial.serial_for_url(line.a)  # before the receiver: its 'C' is not lost
            if to_rb:
                peer = subprocess.Popen(["rb", "--ymodem", "-y"], stdin=tb, stdout=tb,
                                        stderr=subprocess.DEVNULL, cwd=dst)
            else:
                peer = _idemlink_receive(line.b, dst)
                time.sleep(0.5)  # started first and waiting, as for sb -> idemlink
            t0 = time.monotonic()
            rx_done: list[float] = []
            waiter = _exit_time(peer, rx_done)
            report = send_files(port, [src], config)  # type: ignore[arg-type]
            port.close()
            waiter.join(30)
        if not report.ok or not rx_done or sha(dst / src.name) != sha(src):
            raise SystemExit(f"ours failed: {report}")
        return rx_done[0] - t0
    finally:
        line.close()


@dataclass
class Row:
    name: str
    size: int
    walls: list[float]

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)


def table(rows: list[Row], repeat: int) -> str:
    """The Markdown table (with its conditions line) that --update-docs writes."""
    ref = {r.size: r.wall for r in rows if r.name == "lrzsz sb -k -> rb"}
    flags = (" --before" if any("before" in r.name for r in rows) else "") + (
        f" --repeat {repeat}" if repeat > 1 else "")
    head = (f"{BAUD} baud (10 bits a byte), {LATENCY * 1000:g} ms one-way latency, no faults; median "
            f"of {repeat} run(s) each; wall = the sender's start until the receiver exited with the "
            f"file; `python3 bench/bench_ymodem.py{flags} --update-docs`.\n\n")
    body = [[r.name, _size(r.size), f"{r.wall:.2f} s", f"{r.size / r.wall / 1000:.2f} kB/s",
             f"{r.size / (BAUD / 10) / r.wall:.1%}",
             f"{ref[r.size] / r.wall:.3f}×" if r.size in ref else "-",
             ", ".join(f"{w:.2f}" for w in r.walls)] for r in rows]
    return head + markdown_table(["run", "file", "wall (median)", "throughput", "of line rate",
                                  "vs sb -> rb", "runs (s)"], body)


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n % (1 << 20) == 0 else f"{n / 1000:g} KB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1 << 20, help="the large file (default 1 MiB)")
    ap.add_argument("--small", type=int, default=SMALL, help="the small file (0: none)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per row; the median is shown")
    ap.add_argument("--before", action="store_true",
                    help="also idemlink -> idemlink and -> rb with the previous sender defaults")
    ap.add_argument("--update-docs", action="store_true",
                    help="write the table into docs/YMODEM.md between its bench_ymodem markers")
    args = ap.parse_args()
    if not (shutil.which("sb") and shutil.which("rb")):
        raise SystemExit("needs lrzsz (sb, rb)")
    blocks = -(-args.size // 1024)
    ceiling = blocks * ((1029 + 1) * 10 / BAUD + 2 * LATENCY)
    bound = args.size / (BAUD / 10)
    print(f"{BAUD} baud, {LATENCY * 1000:g} ms one-way latency; line bound {bound:.2f} s for "
          f"{args.size} bytes; 1K stop-and-wait ceiling {ceiling:.2f} s ({bound / ceiling:.1%})")
    runs: list[tuple[str, Callable[[Path, Path], float]]] = [
        ("lrzsz sb -k -> rb", lambda s, d: run_sb(s, d, to_rb=True)),
        ("idemlink -> idemlink", lambda s, d: run_ours(s, d, to_rb=False)),
        ("idemlink -> rb", lambda s, d: run_ours(s, d, to_rb=True)),
        ("lrzsz sb -k -> idemlink", lambda s, d: run_sb(s, d, to_rb=False)),
    ]
    if args.before:
        runs += [
            ("idemlink -> idemlink, before", lambda s, d: run_ours(s, d, False, before=True)),
            ("idemlink -> rb, before", lambda s, d: run_ours(s, d, True, before=True)),
        ]
    sizes = [args.size] + ([args.small] if args.small else [])
    rows = [Row(name, size, []) for size in sizes for name, _ in runs]
    fns = dict(runs)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for k in range(args.repeat):
            for row in rows:  # interleaved: slow drifts of a shared machine hit every row alike
                src = root / f"src{row.size}" / "payload.bin"
                if not src.exists():
                    src.parent.mkdir()
                    src.write_bytes(random.Random(row.size).randbytes(row.size))
                dst = root / f"dst{len(os.listdir(root))}"
                dst.mkdir()
                wall = fns[row.name](src, dst)
                row.walls.append(wall)
                print(f"[{k + 1}/{args.repeat}] {row.name:30s} {_size(row.size):>8s} {wall:7.2f} s",
                      flush=True)
    text = table(rows, args.repeat)
    print(text)
    if args.update_docs:
        replace_between_markers(DOC, "bench_ymodem", text)
        print(f"written to {DOC}")


if __name__ == "__main__":
    main()
