"""The asyncio shell runs the same operations as the blocking one (no second request loop);
tasks sharing one device get their own answers (they share its pipeline:
``tests/test_shared_pipeline.py``); a cancelled operation leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest
from support.aio import WaitingTransport

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import AsyncSimTransport, SimTransport
from idemlink.host.aio import AsyncDevice
from idemlink.host.errors import UnknownOutstanding
from idemlink.protocol.outcome import Outcome, Status


def test_async_device_over_a_lossy_line() -> None:
    sim = SimTransport(SimulatedDevice(seed=8), LinkConfig(frame_loss=0.2, frame_dup=0.1, seed=8))

    async def session() -> None:
        dev = AsyncDevice(AsyncSimTransport(sim), timeout=0.02, attempts=10)
        await dev.connect()
        assert (await dev.write({"threshold": 444})).outcome is Outcome.OK
        res = await dev.run([dev.read_command("threshold"), dev.write_command({"mode": 0})])
        assert [r.outcome for r in res] == [Outcome.OK, Outcome.OK]
        assert res[0].values == (444,)
        await dev.close()

    asyncio.run(session())
    assert sim.device.core.value("threshold") == 444 and sim.device.core.value("mode") == 0
    assert sim.closed


def test_concurrent_tasks_on_one_device_get_their_own_answers() -> None:
    """Two tasks sharing one AsyncDevice each get their own answers. ``AsyncSimTransport.read`` never
    really waits; ``test_concurrent_tasks_on_a_transport_that_really_waits`` has a transport that
    refuses a second reader (only the device's one request loop may wait on it)."""
    sim = SimTransport(SimulatedDevice(seed=3), LinkConfig(seed=3))

    async def session() -> list[Outcome]:
        dev = AsyncDevice(AsyncSimTransport(sim), timeout=0.02, attempts=3)
        await dev.connect()

        async def writer(name: str, values: range) -> list[Outcome]:
            return [(await dev.write({name: v})).outcome for v in values]

        a, b = await asyncio.gather(writer("threshold", range(100, 120)),
                                    writer("mode", range(0, 2)))
        await dev.close()
        return a + b

    outcomes = asyncio.run(session())
    assert outcomes == [Outcome.OK] * 22
    assert sim.device.core.value("threshold") == 119 and sim.device.core.value("mode") == 1


def test_concurrent_tasks_on_a_transport_that_really_waits() -> None:
    device = SimulatedDevice(seed=4)

    async def session() -> list[Outcome]:
        dev = AsyncDevice(WaitingTransport(device), timeout=1.0, attempts=2)
        await dev.connect()

        async def writer(name: str, values: range) -> list[Outcome]:
            return [(await dev.write({name: v})).outcome for v in values]

        async def reader() -> list[Outcome]:
            return [(await dev.read("threshold")).outcome for _ in range(5)]

        a, b, c = await asyncio.gather(writer("threshold", range(100, 110)),
                                       writer("mode", range(0, 3)), reader())
        return a + b + c

    assert asyncio.run(session()) == [Outcome.OK] * 18
    assert device.core.value("threshold") == 109 and device.core.value("mode") == 2


def test_cancelled_operation_is_settled_and_blocks_the_handle() -> None:
    device = SimulatedDevice(seed=5)
    threshold = device.core.value("threshold")

    async def session() -> None:
        t = WaitingTransport(device)
        dev = AsyncDevice(t, timeout=30.0, attempts=5)
        await dev.connect()
        t.answer = False  # the device runs the write; its answer is lost
        task = asyncio.create_task(dev.write({"threshold": 111}))
        await t.request_out.wait()  # the write is out
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        core = dev.ops
        assert core.session.outstanding == 0 and not core.completions  # nothing left to re-send
        assert core.unknown is not None and core.unknown.status is Status.CANCELLED
        assert core.unknown.outcome is Outcome.UNKNOWN
        with pytest.raises(UnknownOutstanding):
            await dev.write({"mode": 1})
        t.answer = True
        rec = await dev.reconcile()
        assert rec is not None and rec.intended_state_holds is True  # it did run
        dev.acknowledge_unknown()
        assert (await dev.write({"mode": 1})).ok

    asyncio.run(session())
    writes = [e for e in device.executions if e.request[:3] == bytes([6, 0, 4])]
    assert len(writes) == 1 and threshold != 111  # ran once, not re-sent behind our back
