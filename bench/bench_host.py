"""Host-to-simulator transactions per second over a socat pty pair, in one run.

Three clients read the whole 9-register map (the default map has 9 registers, so this is the
"10-register read" of the issue, one register short), each against the simulator on the other end
of the same kind of socat pty pair:

- idemlink stop-and-wait: ``Device.read`` one request at a time;
- idemlink pipelined: ``Device.run`` with batches of 16 reads in flight;
- pymodbus ``ModbusSerialClient`` (RTU, retries=0) against ``idemlink sim --modbus-rtu``.

Prints the median of ROUNDS rounds per client and the ratios. Needs socat.
Run: ``python3 bench/bench_host.py [--n 2000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

COUNT = 9


@contextlib.contextmanager
def pty_pair() -> Iterator[tuple[str, str]]:
    d = Path(tempfile.mkdtemp(prefix="idl-bench-"))
    a, b = d / "A", d / "B"
    proc = subprocess.Popen(
        ["socat", f"pty,raw,echo=0,link={a}", f"pty,raw,echo=0,link={b}"],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 5
    while not (a.exists() and b.exists()):
        if time.monotonic() > deadline:
            raise RuntimeError("socat did not create the pty pair")
        time.sleep(0.01)
    try:
        yield str(a), str(b)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def simulator(port: str, *extra: str) -> Iterator[None]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemlink", "sim", "--port", port, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # the simulator prints its port first, once it serves
    try:
        yield
    finally:
        proc.terminate()
        proc.wait()


def rate(fn: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - t0)


def ours(port: str, pipelined: bool) -> Callable[[int], None]:
    from idemlink.host.device import Device

    dev = Device.open(port, max_inflight=16)

    def run(n: int) -> None:
        if pipelined:
            cmd = dev.read_command(0, COUNT)
            done = 0
            while done < n:
                k = min(16, n - done)
                res = dev.run([cmd] * k)
                assert all(r.ok for r in res)
                done += k
        else:
            for _ in range(n):
                assert dev.read(0, COUNT).ok

    return run


def pymodbus_client(port: str) -> Callable[[int], None]:
    from pymodbus.client import ModbusSerialClient
    from pymodbus.framer import FramerType

    client = ModbusSerialClient(port, framer=FramerType.RTU, baudrate=115200, timeout=1, retries=0)
    assert client.connect()

    def run(n: int) -> None:
        for _ in range(n):
            rr = client.read_holding_registers(0, count=COUNT, device_id=1)
            assert not rr.isError()

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("socat") is None:
        sys.exit("socat is needed")
    results: dict[str, list[float]] = {"stop-and-wait": [], "pipelined": [], "pymodbus": []}
    for _ in range(args.rounds):
        with pty_pair() as (a, b), simulator(a):
            results["stop-and-wait"].append(rate(ours(b, False), args.n))
            results["pipelined"].append(rate(ours(b, True), args.n))
        with pty_pair() as (a, b), simulator(a, "--modbus-rtu"):
            results["pymodbus"].append(rate(pymodbus_client(b), max(200, args.n // 5)))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{COUNT}-register reads over a socat pty pair, median of {args.rounds} rounds "
          f"(pid {os.getpid()}):")
    print(f"  idemlink stop-and-wait : {med['stop-and-wait']:8.0f} /s")
    print(f"  idemlink pipelined (16): {med['pipelined']:8.0f} /s")
    print(f"  pymodbus RTU client    : {med['pymodbus']:8.0f} /s")
    print(f"  stop-and-wait / pymodbus = {med['stop-and-wait'] / med['pymodbus']:.1f}x, "
          f"pipelined / stop-and-wait = {med['pipelined'] / med['stop-and-wait']:.1f}x")


if __name__ == "__main__":
    main()
