"""Link efficiency: full-map reads per second through the emulated line, against its bound.

Every client talks through the same real-time link emulator (``idemlink.device_sim.link_proxy.LinkProxy``,
10 bits per byte at 115200 baud, a fixed one-way latency, no faults) to the simulator:

- idemlink stop-and-wait (``Device.read``), idemlink pipelined (``Device.run`` of 128 reads, 16 in flight),
  both against the framed simulator;
- pymodbus's ``ModbusSerialClient`` (RTU) against ``idemlink sim --modbus-rtu``.

The bound of each protocol is the physical one of a full-duplex line with requests pipelined:
``baud / (10 × max(request bytes, response bytes))`` per second; stop-and-wait is also bounded by
``1 / ((request + response) × 10 / baud + 2 × latency)``. Reads cover the whole 9-register map.

Run ``python3 bench/bench_link.py`` (2 ms) or ``--sweep`` for 0–20 ms and the plot
``bench/link_efficiency.png`` (matplotlib, the ``bench`` extra); ``--update-docs`` writes the
figures table into docs/LINK.md between its bench_link markers.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from docs_table import DOCS, markdown_table, replace_between_markers

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.link_proxy import LinkProxy
from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.modbus_rtu import encode_rtu
from idemlink.pytest_plugin import start_pty_sim

BAUD = 115200
COUNT = 9
SECONDS = 2.5


def frame_sizes() -> tuple[int, int]:
    req = encode_frame(FrameType.REQUEST, 0x01020304, 0x0A0B0C0D, bytes([3, 0, 0, 0, COUNT]))
    resp_pdu = bytes([0, 3, 2 * COUNT]) + bytes(range(1, 2 * COUNT + 1))
    resp = encode_frame(FrameType.RESPONSE, 0x01020304, 0x0A0B0C0D, resp_pdu)
    return len(req), len(resp)


def rtu_sizes() -> tuple[int, int]:
    req = encode_rtu(1, bytes([3, 0, 0, 0, COUNT]))
    resp = encode_rtu(1, bytes([3, 2 * COUNT]) + bytes(2 * COUNT))
    return len(req), len(resp)


def bounds(sizes: tuple[int, int], latency: float) -> tuple[float, float]:
    req, resp = sizes
    pipelined = BAUD / (10 * max(req, resp))
    stop_and_wait = 1 / ((req + resp) * 10 / BAUD + 2 * latency)
    return pipelined, stop_and_wait


def timed(fn: Callable[[], int]) -> float:
    """Run ``fn`` (one batch, returns transactions) repeatedly for SECONDS; rate per second."""
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < SECONDS:
        n += fn()
    return n / (time.perf_counter() - t0)


@contextlib.contextmanager
def through_line(target: str, latency: float) -> Iterator[str]:
    cfg = LinkConfig(baud=BAUD, latency=latency)
    with LinkProxy(None, target, cfg).start() as proxy:
        yield proxy.a_path


def ours(latency: float) -> tuple[float, float]:
    from idemlink.host.device import Device

    sim = start_pty_sim(SimulatedDevice(seed=1))
    try:
        with through_line(sim.path, latency) as path, \
                Device.open(path, max_inflight=16, timeout=0.3) as dev:
            cmd = dev.read_command(0, COUNT)
            dev.read(0, COUNT)  # warm up

            def one() -> int:
                assert dev.execute(cmd).ok
                return 1

            def batch() -> int:
                res = dev.run([cmd] * 128)
                assert all(r.ok for r in res)
                return 128

            return timed(one), timed(batch)
    finally:
        sim.close()


def pymodbus_rate(latency: float) -> float:
    from pymodbus.client import ModbusSerialClient
    from pymodbus.framer import FramerType

    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--modbus-rtu"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        target = proc.stdout.readline().strip()
        with through_line(target, latency) as path:
            client = ModbusSerialClient(path, framer=FramerType.RTU, baudrate=BAUD, timeout=1,
                                        retries=0)
            assert client.connect()

            def one() -> int:
                assert not client.read_holding_registers(0, count=COUNT, device_id=1).isError()
                return 1

            rate = timed(one)
            client.close()
            return rate
    finally:
        proc.terminate()
        proc.wait()


def measure(latency: float) -> dict[str, float]:
    saw, pipe = ours(latency)
    pm = pymodbus_rate(latency)
    ob, osw = bounds(frame_sizes(), latency)
    rb, rsw = bounds(rtu_sizes(), latency)
    return {"latency_ms": latency * 1000, "ours_stop_and_wait": saw, "ours_pipelined": pipe,
            "pymodbus": pm, "ours_bound": ob, "ours_saw_bound": osw, "rtu_bound": rb,
            "rtu_saw_bound": rsw}


def report(m: dict[str, float]) -> None:
    req, resp = frame_sizes()
    rreq, rresp = rtu_sizes()
    print(f"latency {m['latency_ms']:.0f} ms, {BAUD} baud, {COUNT}-register reads "
          f"(idemlink frames {req}/{resp} bytes, RTU {rreq}/{rresp} bytes):")
    print(f"  idemlink pipelined     {m['ours_pipelined']:7.1f}/s = "
          f"{m['ours_pipelined'] / m['ours_bound']:5.1%} of its full-duplex bound "
          f"{m['ours_bound']:.1f}/s")
    print(f"  idemlink stop-and-wait {m['ours_stop_and_wait']:7.1f}/s = "
          f"{m['ours_stop_and_wait'] / m['ours_saw_bound']:5.1%} of its stop-and-wait bound "
          f"{m['ours_saw_bound']:.1f}/s")
    print(f"  pymodbus RTU client    {m['pymodbus']:7.1f}/s = "
          f"{m['pymodbus'] / m['rtu_saw_bound']:5.1%} of its stop-and-wait bound "
          f"{m['rtu_saw_bound']:.1f}/s (RTU full-duplex bound {m['rtu_bound']:.1f}/s)")


def table(rows: list[dict[str, float]], sweep: bool) -> str:
    """The figures table (with its conditions line) that --update-docs writes."""
    req, resp = frame_sizes()
    rreq, rresp = rtu_sizes()
    head = (f"{BAUD} baud (10 bits a byte), no faults, {COUNT}-register reads (idemlink frames "
            f"{req}/{resp} bytes, RTU {rreq}/{rresp} bytes), {SECONDS:g} s of reads a figure, one "
            f"run; pipelined: 128 reads with up to 16 in flight; `python3 bench/bench_link.py"
            f"{' --sweep' if sweep else ''} --update-docs`.\n\n")
    body = [[f"{m['latency_ms']:g} ms",
             f"{m['ours_pipelined']:.1f}/s ({m['ours_pipelined'] / m['ours_bound']:.1%} of "
             f"{m['ours_bound']:.1f})",
             f"{m['ours_stop_and_wait']:.1f}/s ({m['ours_stop_and_wait'] / m['ours_saw_bound']:.1%}"
             f" of {m['ours_saw_bound']:.1f})",
             f"{m['pymodbus']:.1f}/s ({m['pymodbus'] / m['rtu_saw_bound']:.1%} of "
             f"{m['rtu_saw_bound']:.1f})"] for m in rows]
    return head + markdown_table(["one-way latency", "idemlink pipelined (of full-duplex bound)",
                                  "idemlink stop-and-wait (of its bound)",
                                  "pymodbus RTU (of its stop-and-wait bound)"], body)


def plot(rows: list[dict[str, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["latency_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(x, [r["ours_pipelined"] for r in rows], "o-", label="idemlink pipelined (16)")
    ax.plot(x, [r["ours_stop_and_wait"] for r in rows], "s-", label="idemlink stop-and-wait")
    ax.plot(x, [r["pymodbus"] for r in rows], "^-", label="pymodbus RTU client")
    ax.plot(x, [r["ours_bound"] for r in rows], "--", color="C0", alpha=0.5,
            label="idemlink full-duplex bound")
    ax.plot(x, [r["rtu_saw_bound"] for r in rows], ":", color="C2", alpha=0.6,
            label="RTU stop-and-wait bound")
    ax.set_xlabel("one-way latency (ms)")
    ax.set_ylabel("9-register reads per second")
    ax.set_title(f"Through the emulated line at {BAUD} baud, no faults; pipelined: 16 in flight",
                 fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=2.0)
    ap.add_argument("--sweep", action="store_true", help="0, 2, 5, 10, 20 ms and the plot")
    ap.add_argument("--update-docs", action="store_true",
                    help="write the figures into docs/LINK.md between its bench_link markers")
    args = ap.parse_args()
    rows = []
    for ms in (0, 2, 5, 10, 20) if args.sweep else (args.latency_ms,):
        rows.append(measure(ms / 1000))
        report(rows[-1])
    if args.sweep:
        out = Path(__file__).with_name("link_efficiency.png")
        plot(rows, out)
        print(f"plot: {out}")
    if args.update_docs:
        replace_between_markers(DOCS / "LINK.md", "bench_link", table(rows, args.sweep))
        print(f"table: {DOCS / 'LINK.md'}")


if __name__ == "__main__":
    main()
