"""Reads/s on the simulated half-duplex bus (docs/BUS.md) against its bound, in simulated time.

    python3 bench/bench_bus.py [--devices 8] [--baud 115200] [--turnaround 0.001] [--reads 400]
    python3 bench/bench_bus.py --sweep [--plot] [--docs]

N simulated devices on ``idemlink.device_sim.bus.Bus``; the host's bus handle
(``idemlink.host.bus.Bus``) reads one register of each in turn (round robin). The bound is the
half-duplex one of issue 22: one request + one answer + two turnarounds per transaction, at 10
bits a byte. Also measured: the same with one device dead (its breaker open after two misses),
the other devices' rate against their rate without it. Simulated time, so the figures are the
protocol's, not this machine's: a run is deterministic.

``--fair [--docs]`` measures fair scheduling (docs/BUS.md, "Fair scheduling"): one thread per
device, device 1 with 100 reads queued and devices 2..8 with 5 each, all queued while the line is
busy; when each device's last request goes out (simulated time, from the medium), with the turn
passed per transaction (round-robin, the bus handle) and per operation (what the handle did
before, each ``run`` keeping the line to its end).

``--sweep`` measures the two curves of issue 22's figures: aggregate reads/s against the number
of devices (1..16, the bounds alongside), and, on a bus of 8, the live devices' reads/s against
the dead devices' share (0..4 of 8 dead), as a share of what those live devices read with the
dead ones unplugged; ``--plot`` draws them into ``bench/bus_throughput.png`` (matplotlib, the
``bench`` extra) and ``--docs`` writes the table into docs/BUS.md between the ``bench_bus``
markers (``bench/docs_table.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from pathlib import Path

from idemlink.device_sim.bus import Bus, BusConfig, BusTransport
from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.bus import Bus as HostBus
from idemlink.host.errors import NoDevice
from idemlink.protocol.bus_rules import BreakerPolicy
from idemlink.protocol.frame import FrameDecoder, FrameType, encode_frame
from idemlink.protocol.modbus import FunctionCode, ReadRegisters, encode_request
from idemlink.protocol.payloads import encode_response_payload


def bound(baud: int, turnaround: float, turnarounds: int = 2, address: int = 1) -> float:
    """Transactions/s of the half-duplex bound for a one-register read: request + answer +
    ``turnarounds`` turnarounds (issue 22's bound counts two; the simulated master turns
    around at once, so what it can reach has one)."""
    req = encode_frame(FrameType.REQUEST, 1000, 0x12345678,
                       encode_request(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, 5, 1)),
                       address=address)
    ans = encode_frame(FrameType.RESPONSE, 1000, 0x12345678,
                       encode_response_payload(0, bytes.fromhex("03020001")), address=address)
    return 1.0 / ((len(req) + len(ans)) * 10 / baud + turnarounds * turnaround)


def run(devices: int, baud: int, turnaround: float, reads: int,
        dead: tuple[int, ...] = ()) -> tuple[float, int]:
    """Reads/s of the live devices and how many were read."""
    sim = Bus([SimulatedDevice(seed=a, address=a) for a in range(1, devices + 1)],
              BusConfig(baud=baud, turnaround=turnaround))
    for a in dead:
        sim.set_dead(a)
    t = BusTransport(sim)
    bus = HostBus(t, timeout=0.05, attempts=2, breaker=BreakerPolicy(failures=2, cooldown=3000.0))
    for a in range(1, devices + 1):
        with contextlib.suppress(NoDevice):  # the dead one: its breaker records it
            bus.device(a).connect()
    start, done = t.now(), 0
    for i in range(reads):
        a = 1 + i % devices
        r = bus.device(a).read("mode")
        done += r.outcome.name == "OK"
    return done / (t.now() - start), done


HERE = Path(__file__).resolve().parent
COUNTS = (1, 2, 4, 6, 8, 12, 16)
DEAD = (0, 1, 2, 3, 4)


def sweep(baud: int, turnaround: float, reads: int) -> tuple[list[tuple[int, float]],
                                                           list[tuple[int, float, float]]]:
    """``[(devices, reads/s)]`` and, on 8 devices, ``[(dead, live reads/s, share of the live
    devices' rate without the dead ones)]``."""
    by_count = [(n, run(n, baud, turnaround, reads)[0]) for n in COUNTS]
    by_dead = []
    for k in DEAD:
        rate = run(8, baud, turnaround, reads, dead=tuple(range(8 - k + 1, 9)))[0]
        alone = run(8 - k, baud, turnaround, reads)[0]
        by_dead.append((k, rate, rate / alone))
    return by_count, by_dead


def plot(by_count: list[tuple[int, float]], by_dead: list[tuple[int, float, float]],
         baud: int, turnaround: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot([n for n, _ in by_count], [r for _, r in by_count], "o-", label="measured")
    left.axhline(bound(baud, turnaround, 1), ls="--", c="grey", label="bound, one turnaround")
    left.axhline(bound(baud, turnaround, 2), ls=":", c="grey", label="bound, two (issue 22)")
    left.set(xlabel="devices on the bus", ylabel="reads/s (all devices)", ylim=(0, None),
             title="aggregate throughput")
    left.legend(loc="lower right")
    share = [100 * k / 8 for k, _, _ in by_dead]
    right.plot(share, [100 * s for _, _, s in by_dead], "o-", c="C1")
    right.axhline(90, ls=":", c="grey", label="issue 22: >= 90 %")
    right.set(xlabel="dead devices, % of 8", ylabel="live devices' reads/s, % of without them",
              ylim=(0, 105), title="a dead device's cost (breaker: 2 misses)")
    right.legend(loc="lower left")
    fig.suptitle(f"simulated half-duplex bus, {baud} baud, {turnaround * 1000:g} ms turnaround")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


class _Recording(BusTransport):
    """The master's end of the medium, noting (simulated time, address) of every REQUEST."""

    def __init__(self, medium: Bus) -> None:
        super().__init__(medium)
        self.decoder = FrameDecoder()
        self.sent: list[tuple[float, int]] = []

    def write(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        while (f := self.decoder.next_event()) is not None:
            if f.type is FrameType.REQUEST and f.address is not None:
                self.sent.append((self.now(), f.address))
        super().write(data)


def fair(baud: int, turnaround: float, per_transaction: bool, deep: int = 100,
         shallow: int = 5, devices: int = 8) -> dict[int, float]:
    """Each device's last request's time (ms after the line was freed) with all queued at once."""
    sim = Bus([SimulatedDevice(seed=a, address=a) for a in range(1, devices + 1)],
              BusConfig(baud=baud, turnaround=turnaround))
    t = _Recording(sim)
    bus = HostBus(t, timeout=0.05, attempts=2)
    for a in range(1, devices + 1):
        bus.device(a).connect()
        bus.device(a).line.per_transaction = per_transaction
    t.sent.clear()
    bus.turn.acquire(0)

    def work(a: int) -> None:
        d = bus.device(a)
        d.run([d.read_command("mode") for _ in range(deep if a == 1 else shallow)])

    threads = [threading.Thread(target=work, args=(a,)) for a in range(1, devices + 1)]
    for th in threads:
        th.start()
    while bus.turn.waiting != set(range(1, devices + 1)):
        time.sleep(0.001)
    start = t.now()
    bus.turn.release(0)
    for th in threads:
        th.join()
    return {a: 1000 * (max(x for x, b in t.sent if b == a) - start)
            for a in range(1, devices + 1)}


def fair_table(baud: int, turnaround: float) -> str:
    from docs_table import markdown_table

    per_tx, per_op = fair(baud, turnaround, True), fair(baud, turnaround, False)
    shallow = range(2, 9)
    rows = [["per transaction (round-robin)", f"{max(per_tx[a] for a in shallow):.0f} ms",
             f"{per_tx[1]:.0f} ms"],
            ["per operation (before)", f"{max(per_op[a] for a in shallow):.0f} ms",
             f"{per_op[1]:.0f} ms"]]
    return markdown_table(["the turn passes", "devices 2..8 (5 reads each) all served by",
                           "device 1 (100 reads) served by"], rows)


def table(by_count: list[tuple[int, float]], by_dead: list[tuple[int, float, float]],
          baud: int, turnaround: float) -> str:
    from docs_table import markdown_table

    b1 = bound(baud, turnaround, 1)
    rows = [[str(n), f"{r:.0f}", f"{r / b1:.0%}"] for n, r in by_count]
    text = markdown_table(["devices", "reads/s", "of the one-turnaround bound"], rows)
    rows = [[f"{k} of 8", f"{r:.0f}", f"{s:.0%}"] for k, r, s in by_dead]
    text += "\n" + markdown_table(
        ["dead", "live devices' reads/s", "of their rate without the dead ones"], rows)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--baud", type=int, default=115200)
    p.add_argument("--turnaround", type=float, default=0.001)
    p.add_argument("--reads", type=int, default=400)
    p.add_argument("--sweep", action="store_true", help="the curves against devices and dead share")
    p.add_argument("--plot", action="store_true", help="with --sweep: bench/bus_throughput.png")
    p.add_argument("--docs", action="store_true", help="with --sweep: the table into docs/BUS.md")
    p.add_argument("--fair", action="store_true",
                   help="fair scheduling: one deep queue against seven shallow ones")
    a = p.parse_args()
    if a.fair:
        text = fair_table(a.baud, a.turnaround)
        print(text, end="")
        if a.docs:
            from docs_table import DOCS, replace_between_markers

            replace_between_markers(DOCS / "BUS.md", "bench_bus_fair", text)
        return
    if a.sweep:
        by_count, by_dead = sweep(a.baud, a.turnaround, a.reads)
        text = table(by_count, by_dead, a.baud, a.turnaround)
        print(text, end="")
        if a.plot:
            plot(by_count, by_dead, a.baud, a.turnaround, HERE / "bus_throughput.png")
            print(f"plot written to {HERE / 'bus_throughput.png'}")
        if a.docs:
            from docs_table import DOCS, replace_between_markers

            replace_between_markers(DOCS / "BUS.md", "bench_bus", text)
        return
    b1, b2 = bound(a.baud, a.turnaround, 1), bound(a.baud, a.turnaround, 2)
    rate, _ = run(a.devices, a.baud, a.turnaround, a.reads)
    print(f"{a.devices} devices, {a.baud} baud, turnaround {a.turnaround * 1000:.1f} ms: "
          f"{rate:.0f} reads/s; bound with one turnaround {b1:.0f} ({rate / b1:.0%}), with two "
          f"(issue 22's; the simulated master does not turn around) {b2:.0f}")
    rate_dead, _ = run(a.devices, a.baud, a.turnaround, a.reads, dead=(a.devices,))
    alone, _ = run(a.devices - 1, a.baud, a.turnaround, a.reads)
    print(f"device {a.devices} dead: the other {a.devices - 1} read at {rate_dead:.0f}/s, "
          f"{rate_dead / alone:.0%} of their {alone:.0f}/s without it")


if __name__ == "__main__":
    main()
