"""The host at full speed and at scale: reads/s through a paced 115200-baud line, one and many devices.

Arrangement (every piece but the host in its own process, so the host's figures are its own):
``idemlink sim`` serves a simulated device on a pty; a line process relays between that pty and a
pty the host opens, pacing bytes at 10 bits per byte plus a fixed one-way latency. The line is the
link emulator (``idemlink link --baud 115200 --latency-ms L``, ``idemlink.device_sim.link_proxy``)
or the independent yardstick ``bench/paced_relay.py`` (a plain relay that only delays bytes).

Single device, at 0 / 2 / 10 / 20 ms (9-register reads, the simulator's whole map):
- stop-and-wait (``Device.execute`` in a loop);
- ``Device.run`` in batches of 16 (each batch drains before the next leaves);
- the continuous pipeline (``Device.stream`` over an endless source, ``max_inflight=32``), through
  the emulator and through the yardstick;
- pymodbus's ``ModbusSerialClient`` (RTU) against ``idemlink sim --modbus-rtu``.
Each figure is the median of ``--runs`` runs of ``--seconds``; ratios are taken within the run.

Many tasks on one device (``--tasks``), at the same latencies on the same emulated line: 32 asyncio
tasks each awaiting ``AsyncDevice.execute()`` of the same read (the shared pipeline), next to one
``Device.stream`` measured in the same run, both as % of the full-duplex bound, and 32 threads
each calling ``Device.execute()``; the table between
the ``bench_pipeline_tasks`` markers of bench/PIPELINE.md is rewritten with the medians.

Many devices (``--devices``): N = 1, 4, 16 devices from one asyncio process (``AsyncDevice.stream``
each), aggregate reads/s against N × the N = 1 figure, the host process's CPU µs per transaction
(``time.process_time``), and the event loop's lag (a task asking to sleep 1 ms: how late it wakes).

Usage: ``python3 bench/bench_pipeline.py [--runs 3] [--seconds 3] [--latencies 0,2,10,20]
[--tasks] [--devices] [--device-latency-ms 2] [--plot]``. The single-device medians are saved to
``bench/pipeline_results.json``; ``--plot`` draws ``bench/pipeline.png`` from the figures just
measured, or with ``--skip-single`` from the saved ones.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from docs_table import markdown_table, replace_between_markers

from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.modbus_rtu import encode_rtu

BAUD = 115200
COUNT = 9
TASKS = 32
HERE = Path(__file__).resolve().parent
DOC = HERE / "PIPELINE.md"


def frame_sizes() -> tuple[int, int]:
    req = encode_frame(FrameType.REQUEST, 0x01020304, 0x0A0B0C0D, bytes([3, 0, 0, 0, COUNT]))
    resp = encode_frame(FrameType.RESPONSE, 0x01020304, 0x0A0B0C0D,
                        bytes([0, 3, 2 * COUNT]) + bytes(range(1, 2 * COUNT + 1)))
    return len(req), len(resp)


def rtu_sizes() -> tuple[int, int]:
    return (len(encode_rtu(1, bytes([3, 0, 0, 0, COUNT]))),
            len(encode_rtu(1, bytes([3, 2 * COUNT]) + bytes(2 * COUNT))))


def full_duplex_bound(sizes: tuple[int, int]) -> float:
    return BAUD / (10 * max(sizes))


def stop_and_wait_bound(sizes: tuple[int, int], latency: float) -> float:
    return 1 / (sum(sizes) * 10 / BAUD + 2 * latency)


# ---------------------------------------------------------------------------- processes
@contextlib.contextmanager
def process(argv: list[str], lines: int) -> Iterator[list[str]]:
    """Start ``argv``, yield the first ``lines`` lines it prints, stop it at the end."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield [proc.stdout.readline().strip() for _ in range(lines)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def sims(n: int, *, rtu: bool = False) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        paths = []
        for i in range(n):
            argv = [sys.executable, "-m", "idemlink", "sim", "--seed", str(i)]
            paths += stack.enter_context(process(argv + (["--modbus-rtu"] if rtu else []), 1))
        yield paths


@contextlib.contextmanager
def lines(kind: str, targets: list[str], latency_ms: float) -> Iterator[list[str]]:
    """Host-side pty paths, one per target, through the emulator or the yardstick."""
    with contextlib.ExitStack() as stack:
        if kind == "yardstick":
            argv = [sys.executable, str(HERE / "paced_relay.py"), "--baud", str(BAUD),
                    "--latency-ms", str(latency_ms), *targets]
            yield stack.enter_context(process(argv, len(targets)))
            return
        if len(targets) > 1:  # one process, one proxy thread per device
            argv = [sys.executable, str(HERE / "emulator_rack.py"), "--baud", str(BAUD),
                    "--latency-ms", str(latency_ms), "--quantum-ms", "1", *targets]
            yield stack.enter_context(process(argv, len(targets)))
            return
        paths = []
        for t in targets:
            argv = [sys.executable, "-m", "idemlink", "link", "--b", t, "--baud", str(BAUD),
                    "--latency-ms", str(latency_ms)]
            paths.append(stack.enter_context(process(argv, 2))[0])
        yield paths


# ---------------------------------------------------------------------------- single device
def timed(fn: Callable[[], int], seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += fn()
    return n / (time.perf_counter() - t0)


def ours(path: str, seconds: float, modes: tuple[str, ...]) -> dict[str, float]:
    from idemlink.host.device import Device

    out = {}
    with Device.open(path, max_inflight=32, timeout=0.5) as dev:
        cmd = dev.read_command(0, COUNT)
        assert dev.execute(cmd).ok  # warm up
        if "stop_and_wait" in modes:
            def one() -> int:
                assert dev.execute(cmd).ok
                return 1
            out["stop_and_wait"] = timed(one, seconds)
        if "batches16" in modes:
            def batch() -> int:
                assert all(r.ok for r in dev.run([cmd] * 16))
                return 16
            out["batches16"] = timed(batch, seconds)
        if "pipeline" in modes:
            n = 0
            t0 = time.perf_counter()
            for r in dev.stream(itertools.repeat(cmd)):
                assert r.ok
                n += 1
                if n % 32 == 0 and time.perf_counter() - t0 >= seconds:
                    break
            out["pipeline"] = n / (time.perf_counter() - t0)
    return out


def pymodbus_rate(path: str, seconds: float) -> float:
    from pymodbus.client import ModbusSerialClient
    from pymodbus.exceptions import ModbusException
    from pymodbus.framer import FramerType

    client = ModbusSerialClient(path, framer=FramerType.RTU, baudrate=BAUD, timeout=1, retries=0)
    assert client.connect()

    def one() -> int:  # a lost answer (pymodbus gives up after its timeout) counts nothing
        try:
            return 0 if client.read_holding_registers(0, count=COUNT, device_id=1).isError() else 1
        except ModbusException:
            return 0

    try:
        return timed(one, seconds)
    finally:
        client.close()


def single(latency_ms: float, seconds: float) -> dict[str, float]:
    row: dict[str, float] = {"latency_ms": latency_ms}
    with sims(1) as (target,):
        with lines("emulator", [target], latency_ms) as (path,):
            row.update(ours(path, seconds, ("stop_and_wait", "batches16", "pipeline")))
        with lines("yardstick", [target], latency_ms) as (path,):
            row["pipeline_yardstick"] = ours(path, seconds, ("pipeline",))["pipeline"]
    with sims(1, rtu=True) as (target,), lines("emulator", [target], latency_ms) as (path,):
        row["pymodbus"] = pymodbus_rate(path, seconds)
    return row


# ---------------------------------------------------------------------------- many tasks, one device
async def tasks_rate(path: str, seconds: float, tasks: int = TASKS) -> float:
    """``tasks`` asyncio tasks each awaiting ``execute()`` of the same read on one
    ``AsyncDevice``: reads answered per second until ``seconds`` have passed."""
    from idemlink.host.aio import AsyncDevice

    loop = asyncio.get_running_loop()
    async with AsyncDevice.open(path, max_inflight=32, timeout=0.5) as dev:
        cmd = dev.read_command(0, COUNT)
        assert (await dev.execute(cmd)).ok  # warm up
        done = 0
        t0 = loop.time()
        deadline = t0 + seconds

        async def caller() -> None:
            nonlocal done
            while loop.time() < deadline:
                assert (await dev.execute(cmd)).ok
                if loop.time() <= deadline:
                    done += 1

        await asyncio.gather(*(caller() for _ in range(tasks)))
        return done / seconds


def threads_rate(path: str, seconds: float, threads: int = TASKS) -> float:
    """``threads`` threads each calling ``execute()`` of the same read on one blocking
    ``Device``: reads answered per second until ``seconds`` have passed."""
    import threading

    from idemlink.host.device import Device

    with Device.open(path, max_inflight=32, timeout=0.5) as dev:
        cmd = dev.read_command(0, COUNT)
        assert dev.execute(cmd).ok  # warm up
        counts = [0] * threads
        t0 = time.perf_counter()
        deadline = t0 + seconds

        def caller(i: int) -> None:
            while time.perf_counter() < deadline:
                assert dev.execute(cmd).ok
                if time.perf_counter() <= deadline:
                    counts[i] += 1

        pool = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        return sum(counts) / seconds


def shared(latency_ms: float, seconds: float) -> dict[str, float]:
    """``Device.stream``, 32 tasks each awaiting ``execute()`` and 32 threads each calling it,
    one after the other through the same emulated line to the same simulator."""
    with sims(1) as (target,), lines("emulator", [target], latency_ms) as (path,):
        row = {"latency_ms": latency_ms, "stream": ours(path, seconds, ("pipeline",))["pipeline"]}
        row["tasks"] = asyncio.run(tasks_rate(path, seconds))
        row["threads"] = threads_rate(path, seconds)
    return row


def report_shared(rows: list[dict[str, float]], runs: int, seconds: float) -> None:
    ob = full_duplex_bound(frame_sizes())
    table = []
    for m in rows:
        line = (f"{m['latency_ms']:.0f} ms", f"{m['stream']:.1f}/s = {m['stream'] / ob:.1%}",
                f"{m['tasks']:.1f}/s = **{m['tasks'] / ob:.1%}**",
                f"{m['tasks'] / m['stream']:.1%}",
                f"{m['threads']:.1f}/s = {m['threads'] / ob:.1%}")
        table.append(line)
        print(f"latency {line[0]}: stream() {line[1]}, {TASKS} tasks execute() {line[2]}, "
              f"{TASKS} threads execute() {line[4]}")
    text = (f"Median of {runs} runs of {seconds:g} s; full-duplex bound {ob:.1f} reads/s; machine: "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end.\n\n"
            + markdown_table(["one-way latency", "one task's `Device.stream()`",
                              f"{TASKS} tasks each awaiting `AsyncDevice.execute()`",
                              "tasks / stream",
                              f"{TASKS} threads each calling `Device.execute()`"], table))
    replace_between_markers(DOC, "bench_pipeline_tasks", text)
    print(f"table written to {DOC}")


# ---------------------------------------------------------------------------- many devices
async def many(paths: list[str], seconds: float) -> dict[str, float]:
    from idemlink.host.aio import AsyncDevice

    loop = asyncio.get_running_loop()
    lags: list[float] = []
    held: list[float] = []
    running = True

    async def lag_probe() -> None:
        # Wall-clock lag counts the time the OS ran other processes too; the CPU this thread
        # spent during the interval bounds what our own callbacks held the loop for.
        while running:
            t, c = loop.time(), time.thread_time()
            await asyncio.sleep(0.005)
            lag = loop.time() - t - 0.005
            lags.append(lag)
            held.append(min(lag, time.thread_time() - c))

    devs = [await AsyncDevice.open(p, max_inflight=32, timeout=0.5) for p in paths]
    counts = [0] * len(devs)

    async def poll(i: int, deadline: float) -> None:
        dev = devs[i]
        cmd = dev.read_command(0, COUNT)
        async with contextlib.aclosing(dev.stream(itertools.repeat(cmd))) as results:
            async for r in results:
                assert r.ok
                counts[i] += 1
                if counts[i] % 32 == 0 and loop.time() >= deadline:
                    break

    longest = [0.0]
    run = asyncio.events.Handle._run

    def timed_run(handle: asyncio.events.Handle) -> None:  # the CPU one callback held the loop
        c = time.thread_time()
        run(handle)
        longest[0] = max(longest[0], time.thread_time() - c)

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    probe = asyncio.ensure_future(lag_probe())
    cpu0, t0 = time.process_time(), loop.time()
    await asyncio.gather(*(poll(i, t0 + seconds) for i in range(len(devs))))
    cpu, elapsed = time.process_time() - cpu0, loop.time() - t0
    running = False
    await probe
    asyncio.events.Handle._run = run  # type: ignore[method-assign]
    for d in devs:
        await d.close()
    total = sum(counts)
    lags.sort()
    held.sort()
    return {"rate": total / elapsed, "cpu_us": cpu / total * 1e6,
            "lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1000, "lag_max_ms": lags[-1] * 1000,
            "held_p99_ms": held[int(0.99 * (len(held) - 1))] * 1000,
            "held_max_ms": held[-1] * 1000, "callback_max_ms": longest[0] * 1000,
            "min_device_rate": min(counts) / elapsed}


def devices(n: int, latency_ms: float, seconds: float, line: str) -> dict[str, float]:
    with sims(n) as targets, lines(line, targets, latency_ms) as paths:
        return asyncio.run(many(paths, seconds))


# ---------------------------------------------------------------------------- report
def median_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def report_single(m: dict[str, float], runs: int) -> None:
    ob = full_duplex_bound(frame_sizes())
    lat = m["latency_ms"] / 1000
    rsw = stop_and_wait_bound(rtu_sizes(), lat)
    print(f"latency {m['latency_ms']:.0f} ms (median of {runs}): "
          f"full-duplex bound {ob:.1f}/s")
    print(f"  continuous pipeline, emulator  {m['pipeline']:6.1f}/s = {m['pipeline'] / ob:6.1%}")
    print(f"  continuous pipeline, yardstick {m['pipeline_yardstick']:6.1f}/s = "
          f"{m['pipeline_yardstick'] / ob:6.1%}")
    print(f"  run() in batches of 16         {m['batches16']:6.1f}/s = {m['batches16'] / ob:6.1%}")
    print(f"  stop-and-wait                  {m['stop_and_wait']:6.1f}/s = "
          f"{m['stop_and_wait'] / stop_and_wait_bound(frame_sizes(), lat):6.1%} of its bound")
    print(f"  pymodbus RTU                   {m['pymodbus']:6.1f}/s = "
          f"{m['pymodbus'] / rsw:6.1%} of its stop-and-wait bound {rsw:.1f}/s")
    print(f"  pipeline / pymodbus = {m['pipeline'] / m['pymodbus']:.2f}x, "
          f"pipeline / stop-and-wait = {m['pipeline'] / m['stop_and_wait']:.2f}x")


def single_table(rows: list[dict[str, float]]) -> None:
    """Write the one-device table of bench/PIPELINE.md (``bench_pipeline_single`` markers) from
    the medians just measured (or saved in pipeline_results.json by the last measuring run)."""
    ob = full_duplex_bound(frame_sizes())
    body = []
    for m in rows:
        p, y = m["pipeline"], m["pipeline_yardstick"]
        body.append([f"{m['latency_ms']:.0f} ms", f"{p:.1f}/s = {p / ob:.1%}",
                     f"{y:.1f}/s = {y / ob:.1%}", f"{m['batches16']:.1f}/s = {m['batches16'] / ob:.1%}",
                     f"{m['stop_and_wait']:.1f}/s", f"{m['pymodbus']:.1f}/s",
                     f"{p / m['pymodbus']:.2f}x"])
    head = ["one-way latency", "continuous pipeline (emulator)", "same (yardstick)",
            "`run()` in batches of 16", "stop-and-wait", "pymodbus RTU", "pipeline / pymodbus"]
    text = (f"Full-duplex bound {ob:.1f} reads/s; medians of the runs saved in "
            f"bench/pipeline_results.json.\n\n" + markdown_table(head, body))
    replace_between_markers(DOC, "bench_pipeline_single", text)


def plot(rows: list[dict[str, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["latency_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(x, [r["pipeline"] for r in rows], "o-", label="continuous pipeline (emulator)")
    ax.plot(x, [r["pipeline_yardstick"] for r in rows], "x--", label="continuous pipeline (yardstick)")
    ax.plot(x, [r["batches16"] for r in rows], "d-", label="run() in batches of 16")
    ax.plot(x, [r["stop_and_wait"] for r in rows], "s-", label="stop-and-wait")
    ax.plot(x, [r["pymodbus"] for r in rows], "^-", label="pymodbus RTU client")
    ax.axhline(full_duplex_bound(frame_sizes()), ls=":", color="grey", label="full-duplex bound")
    ax.set_xlabel("one-way latency (ms)")
    ax.set_ylabel("9-register reads per second")
    ax.set_title(f"One device through a paced {BAUD}-baud line")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--latencies", default="0,2,10,20", help="one-way latencies in ms")
    ap.add_argument("--tasks", action="store_true",
                    help=f"{TASKS} tasks awaiting execute() on one device next to stream(); "
                         "rewrites the table in bench/PIPELINE.md")
    ap.add_argument("--devices", action="store_true", help="N = 1, 4, 16 devices from one loop")
    ap.add_argument("--device-latency-ms", type=float, default=2.0)
    ap.add_argument("--devices-line", choices=["emulator", "yardstick"], default="emulator",
                    help="the line of each device in the many-device runs")
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--plot", action="store_true", help="regenerate bench/pipeline.png")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    rows = []
    saved = HERE / "pipeline_results.json"
    if not args.skip_single:
        for ms in (float(x) for x in args.latencies.split(",")):
            rows.append(median_rows([single(ms, args.seconds) for _ in range(args.runs)]))
            report_single(rows[-1], args.runs)
        saved.write_text(json.dumps(rows, indent=1) + "\n")
    elif args.plot and saved.exists():  # redraw the last measured figures
        rows = json.loads(saved.read_text())
    if rows:
        single_table(rows)
    if args.plot and rows:
        out = HERE / "pipeline.png"
        plot(rows, out)
        print(f"plot: {out}")
    if args.tasks:
        shared_rows = [median_rows([shared(ms, args.seconds) for _ in range(args.runs)])
                       for ms in (float(x) for x in args.latencies.split(","))]
        report_shared(shared_rows, args.runs, args.seconds)
    if args.devices:
        print(f"devices from one asyncio process at {args.device_latency_ms:.0f} ms, "
              f"through the {args.devices_line} "
              f"(median of {args.runs}):")
        base = None
        for n in (1, 4, 16):
            m = median_rows([devices(n, args.device_latency_ms, args.seconds, args.devices_line)
                             for _ in range(args.runs)])
            base = base if base is not None else m["rate"]
            print(f"  N={n:2d}: {m['rate']:7.1f} reads/s = {m['rate'] / (n * base):6.1%} of "
                  f"{n} x {base:.1f}; slowest device {m['min_device_rate']:.1f}/s; "
                  f"host CPU {m['cpu_us']:.0f} us/transaction")
            print(f"        loop lag (wall) p99 {m['lag_p99_ms']:.2f} ms, max {m['lag_max_ms']:.2f} "
                  f"ms; loop CPU per 5 ms interval p99 {m['held_p99_ms']:.2f} ms, max "
                  f"{m['held_max_ms']:.2f} ms; longest single callback (CPU) "
                  f"{m['callback_max_ms']:.2f} ms")


if __name__ == "__main__":
    main()
