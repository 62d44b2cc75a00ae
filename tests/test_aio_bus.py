"""``AsyncBus`` (issue 22 item 3, asyncio): tasks on different devices of one half-duplex bus take
turns on the wire (no collision), and a dead device's breaker ends its commands at once."""

from __future__ import annotations

import asyncio

from idemlink.device_sim.bus import Bus as Medium
from idemlink.device_sim.bus import BusConfig, BusTransport
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import AsyncSimTransport
from idemlink.host.aio_bus import AsyncBus
from idemlink.protocol.bus_rules import BreakerPolicy
from idemlink.protocol.outcome import Outcome, Status


def test_tasks_on_several_devices_take_turns_and_a_dead_one_is_refused_by_its_breaker() -> None:
    medium = Medium([SimulatedDevice(seed=a, address=a) for a in (1, 2, 3)], BusConfig())
    medium.set_dead(3)
    wire = BusTransport(medium)

    async def main() -> None:
        async with AsyncBus(AsyncSimTransport(wire), timeout=0.02, attempts=2,  # type: ignore[arg-type]
                            breaker=BreakerPolicy(failures=2, cooldown=60.0)) as bus:

            async def work(a: int) -> list[Outcome]:
                dev = bus.device(a)
                out = []
                for v in range(4):
                    out.append((await dev.write({"mode": v % 3})).outcome)
                    out.append((await dev.read("mode")).outcome)
                return out

            got = await asyncio.gather(work(1), work(2))
            assert all(o is Outcome.OK for outs in got for o in outs)
            dead = bus.device(3)
            first = [await dead.read("mode") for _ in range(2)]
            assert all(r.status is not Status.OK for r in first)
            t = wire.now()
            later = await dead.write({"mode": 1})
            assert (later.outcome, later.status) == (Outcome.NOT_EXECUTED, Status.BREAKER_OPEN)
            assert wire.now() == t and dead.breaker.refused >= 1  # nothing sent, no time spent

    asyncio.run(main())
    assert medium.stats.collisions == 0
