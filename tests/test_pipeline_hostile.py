"""Hostile checks of the continuous pipeline's dependency rule, against the simulated device's
own execution log (the ground truth of what ran, in which order)."""

from __future__ import annotations

import asyncio

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import AsyncSimTransport, SimTransport
from idemlink.host.aio import AsyncDevice
from idemlink.host.command import Result
from idemlink.host.device import Device
from idemlink.host.errors import UnknownOutstanding
from idemlink.protocol.outcome import Outcome, Status


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




def test_a_cancelled_async_stream_says_what_it_left_out() -> None:
    """The consumer of ``AsyncDevice.stream`` is cancelled while writes are out: the
    CancelledError it gets carries the settled requests (they rode only on the inner request
    loop's own exception, which nobody sees), and they agree with the blocked handle."""
    t = SimTransport(SimulatedDevice(seed=2), LinkConfig(baud=115200, latency=0.01))

    async def session() -> tuple[tuple[Result, ...], AsyncDevice]:
        dev = AsyncDevice(AsyncSimTransport(t), max_inflight=8)
        await dev.connect()
        cmds = [dev.write_command({"threshold": v}) if v % 2 else dev.read_command("temperature")
                for v in range(20)]

        async def consume() -> None:
            async for _ in dev.stream(cmds):
                pass

        task = asyncio.create_task(consume())
        for _ in range(6):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as caught:
            await task
        return caught.value.settled_results, dev  # type: ignore[attr-defined]

    settled, dev = asyncio.run(session())
    unknown = [r for r in settled if r.outcome is Outcome.UNKNOWN]
    assert unknown and all(r.status is Status.CANCELLED for r in unknown)
    assert dev.unknown is not None and dev.unknown in settled
    assert dev.ops.session.outstanding == 0


def test_an_async_stream_waiting_for_the_device_refuses_once_it_is_blocked() -> None:
    """Task A's write ends UNKNOWN while task B's stream waits for the device: B must raise
    UnknownOutstanding, not end silently with no result for its commands."""
    t = SimTransport(SimulatedDevice(seed=1))

    async def session() -> None:
        dev = AsyncDevice(AsyncSimTransport(t), timeout=0.05, attempts=2)
        await dev.connect()
        t.drop_answers = True
        a = asyncio.create_task(dev.write({"threshold": 5}))
        await asyncio.sleep(0)

        async def b() -> list[Result]:
            return [r async for r in dev.stream([dev.read_command("mode")] * 3)]

        bt = asyncio.create_task(b())
        assert (await a).outcome is Outcome.UNKNOWN
        with pytest.raises(UnknownOutstanding):
            await bt

    asyncio.run(session())
