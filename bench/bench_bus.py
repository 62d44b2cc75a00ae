"""Reads/s on the simulated half-duplex bus (docs/BUS.md) against its bound, in simulated time.

    python3 bench/bench_bus.py [--devices 8] [--baud 115200] [--turnaround 0.001] [--reads 400]

N simulated devices on ``idemlink.device_sim.bus.Bus``; the host's bus handle
(``idemlink.host.bus.Bus``) reads one register of each in turn (round robin). The bound is the
half-duplex one of issue 22: one request + one answer + two turnarounds per transaction, at 10
bits a byte. Also measured: the same with one device dead (its breaker open after two misses),
the other devices' rate against their rate without it. Simulated time, so the figures are the
protocol's, not this machine's: a run is deterministic.
"""

from __future__ import annotations

import argparse
import contextlib

from idemlink.device_sim.bus import Bus, BusConfig, BusTransport
from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.bus import BreakerPolicy
from idemlink.host.bus import Bus as HostBus
from idemlink.host.errors import NoDevice
from idemlink.protocol.frame import FrameType, encode_frame
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--baud", type=int, default=115200)
    p.add_argument("--turnaround", type=float, default=0.001)
    p.add_argument("--reads", type=int, default=400)
    a = p.parse_args()
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
