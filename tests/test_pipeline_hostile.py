"""Hostile checks of the continuous pipeline's dependency rule, against the simulated device's
own execution log (the ground truth of what ran, in which order)."""

from __future__ import annotations

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.protocol.outcome import Outcome


def paced_device(latency: float = 0.01) -> tuple[Device, SimTransport]:
    t = SimTransport(SimulatedDevice(seed=1), LinkConfig(baud=115200, latency=latency))
    dev = Device(t, max_inflight=8)
    dev.connect()
    return dev, t


def test_a_read_of_the_generation_waits_for_earlier_writes() -> None:
    """Every effective write moves the generation counter, so reading it does not commute with a
    write to any register: the read after the second write must see both writes (it overtook
    the second write and reported the generation of one)."""
    dev, t = paced_device()
    gen = dev.regmap.generation.name
    results = dev.run([dev.write_command({"threshold": 7}), dev.read_command(gen),
                       dev.write_command({"threshold": 8}), dev.read_command(gen)])
    assert [r.outcome for r in results] == [Outcome.OK] * 4
    assert results[1].values == (1,) and results[3].values == (2,)
    ran = [e.seq for e in t.device.executions]
    assert ran == sorted(ran)  # the device ran them in submission order


def test_reads_of_other_registers_still_overtake_a_write() -> None:
    """The rule stays narrow: a read of another register is not held behind a write."""
    dev, _ = paced_device()
    results = dev.run([dev.write_command({"threshold": 7}), dev.read_command("temperature"),
                       dev.write_command({"threshold": 8}), dev.read_command("temperature")])
    assert [r.outcome for r in results] == [Outcome.OK] * 4
    assert results[3].seq < results[2].seq  # the second read left before the second write
