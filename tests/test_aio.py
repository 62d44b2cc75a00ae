"""The asyncio shell runs the same operations as the blocking one (no second request loop)."""

from __future__ import annotations

import asyncio

from device_sim.device import SimulatedDevice
from device_sim.link import LinkConfig
from device_sim.simlink import SimTransport
from host.aio import AsyncDevice
from protocol.outcome import Outcome


class AsyncSim:
    """SimTransport behind async methods (its read jumps simulated time, so nothing blocks)."""

    def __init__(self, t: SimTransport) -> None:
        self.t = t

    async def write(self, data: bytes) -> None:
        self.t.write(data)

    async def read(self, timeout: float) -> bytes:
        await asyncio.sleep(0)
        return self.t.read(timeout)

    def now(self) -> float:
        return self.t.now()

    async def close(self) -> None:
        self.t.close()


def test_async_device_over_a_lossy_line() -> None:
    sim = SimTransport(SimulatedDevice(seed=8), LinkConfig(frame_loss=0.2, frame_dup=0.1, seed=8))

    async def session() -> None:
        dev = AsyncDevice(AsyncSim(sim), timeout=0.02, attempts=10)
        await dev.connect()
        assert (await dev.write({"threshold": 444})).outcome is Outcome.OK
        res = await dev.run([dev.core.read_command("threshold"), dev.core.write_command({"mode": 0})])
        assert [r.outcome for r in res] == [Outcome.OK, Outcome.OK]
        assert res[0].values == (444,)
        await dev.close()

    asyncio.run(session())
    assert sim.device.core.value("threshold") == 444 and sim.device.core.value("mode") == 0
    assert sim.closed
