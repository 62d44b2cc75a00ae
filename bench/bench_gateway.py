"""Load through the gateway: reads/s with 50 concurrent HTTP clients, and the latency the gateway
adds against a direct ``AsyncDevice`` on the same kind of line, in one run.

Arrangement: ``idemlink sim`` serves a simulated device on a pty (an unpaced line); ``idemlink
gateway`` owns it, in its own process, on port 0. The load is ``--clients`` aiohttp clients, each
awaiting ``GET /v1/ports/dev/registers?names=threshold`` (one register; with the generation
counter, two reads on the line) in a loop for ``--seconds``; then the same clients write for
``--seconds``, each call under a new Idempotency-Key, client ``i`` to the ``i % 3``-th holding
register of the map (``WRITTEN``). The direct figure: the same read through ``AsyncDevice.read`` (one task,
sequential) on a second simulator, and through the gateway one client, sequential: p50/p99 of
each and their ratio. The table between the ``bench_gateway`` markers of docs/GATEWAY.md is
rewritten with the figures (``--no-doc`` to print only).

``--latency-ms L`` puts ``idemlink link --latency-ms L`` between the gateway and its simulator
(the direct figure stays unpaced): a line whose round trip is not free, where sharing the
pipeline between writes shows; printed only.

Usage: ``python3 bench/bench_gateway.py [--clients 50] [--seconds 5] [--no-doc] [--latency-ms L]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_table import DOCS, markdown_table, replace_between_markers

from idemlink.host.keys import new_key

TOKEN = "bench-token-0123456789abcdef"


def start_sim() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def start_link(path: str, latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    """``idemlink link`` between the simulator's pty and a new one, ``latency_ms`` each way:
    the gateway's side of a line whose round trip is not free (a remote or slow device)."""
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "link", "--a", path,
                             "--latency-ms", f"{latency_ms:g}"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # side a: the simulator's
    return proc, proc.stdout.readline().strip()


def start_gateway(path: str, directory: Path) -> tuple[subprocess.Popen[str], str]:
    tokens = directory / "tokens"
    tokens.write_text(f"{TOKEN} bench\n")
    tokens.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "gateway", "--port", f"{path}=dev",
                             "--listen", "127.0.0.1:0", "--tokens", str(tokens), "--store",
                             str(directory / "calls.db")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    return proc, line.rsplit(" ", 1)[1]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def load(url: str, clients: int, seconds: float) -> tuple[int, float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    done = 0
    async with aiohttp.ClientSession(headers=headers,
                                     connector=aiohttp.TCPConnector(limit=clients)) as s:
        end = time.perf_counter() + seconds

        async def one() -> None:
            nonlocal done
            while time.perf_counter() < end:
                async with s.get(f"{url}/v1/ports/dev/registers?names=threshold") as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        return done, time.perf_counter() - t0


WRITTEN = (("threshold", 3), ("mode", 3), ("fan_setpoint", 101))
"""The default map's three holding registers (name, how many values from 0): client ``i`` writes
the ``i % 3``-th, so independent writes exist to share the line, as on a real panel."""


async def writes(url: str, clients: int, seconds: float) -> tuple[int, float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    done = 0
    async with aiohttp.ClientSession(headers=headers,
                                     connector=aiohttp.TCPConnector(limit=clients)) as s:
        end = time.perf_counter() + seconds

        async def one(i: int) -> None:
            nonlocal done
            name, values = WRITTEN[i % len(WRITTEN)]
            n = i
            while time.perf_counter() < end:
                n += 1
                async with s.post(f"{url}/v1/ports/dev/write",
                                  json={"values": {name: n % values}},
                                  headers={"Idempotency-Key": new_key(time.time())}) as r:
                    assert r.status == 200, await r.text()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(clients)))
        return done, time.perf_counter() - t0


async def latencies(url: str, path: str, n: int) -> tuple[list[float], list[float]]:
    from idemlink.host.aio import AsyncDevice

    direct: list[float] = []
    async with AsyncDevice.open(path) as dev:
        for _ in range(n):
            t0 = time.perf_counter()
            assert (await dev.read("threshold")).ok
            direct.append(time.perf_counter() - t0)
    via: list[float] = []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
        for _ in range(n):
            t0 = time.perf_counter()
            async with s.get(f"{url}/v1/ports/dev/registers?names=threshold") as r:
                await r.read()
            via.append(time.perf_counter() - t0)
    return direct, via


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="put `idemlink link --latency-ms` between the gateway and its device "
                         "(printed only, never written into the docs)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        sim, path = start_sim()
        sim2, path2 = start_sim()
        link = None
        if args.latency_ms:
            link, path = start_link(path, args.latency_ms)
        gw, url = start_gateway(path, Path(d))
        try:
            done, took = asyncio.run(load(url, args.clients, args.seconds))
            wrote, wrote_in = asyncio.run(writes(url, args.clients, args.seconds))
            direct, via = asyncio.run(latencies(url, path2, 300))
        finally:
            for p in (gw, *([link] if link is not None else []), sim, sim2):
                p.terminate()
                p.wait()
    rows = [
        [f"{args.clients} clients, GET one register (2 reads on the line)",
         f"{done / took:.0f} requests/s", ""],
        [f"{args.clients} clients, POST write, a new key each (3 registers)",
         f"{wrote / wrote_in:.0f} requests/s", ""],
        ["one read, direct `AsyncDevice`", f"p50 {statistics.median(direct) * 1e3:.2f} ms",
         f"p99 {pct(direct, 0.99) * 1e3:.2f} ms"],
        ["one read, through the gateway", f"p50 {statistics.median(via) * 1e3:.2f} ms",
         f"p99 {pct(via, 0.99) * 1e3:.2f} ms"],
        ["gateway / direct", f"p50 × {statistics.median(via) / statistics.median(direct):.2f}",
         f"p99 × {pct(via, 0.99) / pct(direct, 0.99):.2f}"],
    ]
    table = markdown_table(["what", "figure", ""], rows)
    print(table)
    if args.latency_ms:
        print(f"(the gateway's line: {args.latency_ms:g} ms each way through idemlink link)")
    if not args.no_doc and not args.latency_ms:
        replace_between_markers(DOCS / "GATEWAY.md", "bench_gateway",
                                f"{table}\n(`{os.cpu_count()}` cores, `python3 "
                                f"bench/bench_gateway.py --clients {args.clients} --seconds "
                                f"{args.seconds:g}`)\n")


if __name__ == "__main__":
    main()
