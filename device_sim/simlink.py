"""An in-process host↔device line on a simulated clock: the driver's ``Transport`` for tests.

``SimTransport`` is a ``idemlink.host.device.Transport`` whose ``read(timeout)`` *jumps* simulated time to
the next event instead of sleeping: bytes written by the host go through the link emulator's a→b
direction into the ``SimulatedDevice``, its answers come back through b→a, and scheduled reboots
(``LinkConfig.reboot_at`` / ``reboot_every``) reboot the device. Everything is drawn from seeded
generators, so a run is reproducible from its seeds, and 20,000 commands take seconds.

The device can also be rebooted from a test at any moment with ``reboot()``.
``AsyncSimTransport(sim)`` is the same line for ``idemlink.host.aio.AsyncDevice``: each read
gives the event loop one turn, then jumps simulated time like ``SimTransport.read``.
"""

from __future__ import annotations

import asyncio

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import Link, LinkConfig

DEVICE_TURNAROUND = 0.0002
"""Simulated processing time of the device per received chunk (seconds)."""


class SimTransport:
    """Host end of a simulated line to a ``SimulatedDevice``."""

    def __init__(
        self,
        device: SimulatedDevice | None = None,
        link: LinkConfig | None = None,
        link_back: LinkConfig | None = None,
        *,
        start: float = 0.0,
    ) -> None:
        self.device = device if device is not None else SimulatedDevice(seed=0)
        self.link = Link(link, link_back)
        self._now = start
        self.link.start(start)
        self.closed = False
        self._reboots: list[float] = []
        self.drop_answers = False
        """Scripted fault for tests: while True, every answer of the device is lost."""

    # Transport interface -------------------------------------------------------------
    def now(self) -> float:
        return self._now

    def write(self, data: bytes) -> None:
        self.link.a_to_b.receive_data(data, self._now)

    def read(self, timeout: float) -> bytes:
        """Advance simulated time until bytes reach the host or ``timeout`` elapses."""
        until = self._now + max(0.0, timeout)
        while True:
            nxt = self.link.next_event_time()
            if self._reboots and (nxt is None or self._reboots[0] < nxt):
                nxt = self._reboots[0]
            if nxt is None or nxt > until:
                self._now = max(self._now, until)
                self.device.tick(self._now)
                return b""
            self._now = max(self._now, nxt)
            self._step()
            self.link.b_to_a.tick(self._now)
            got = self.link.b_to_a.data_to_send()
            if got:
                return got

    def close(self) -> None:
        self.closed = True

    # Simulation ----------------------------------------------------------------------
    def reboot(self) -> None:
        self.device.reboot(self._now)

    def set_link(self, link: LinkConfig | None, link_back: LinkConfig | None = None) -> None:
        """Replace the line (bytes still in flight on the old one are lost with it)."""
        self.link = Link(link, link_back)
        self.link.start(self._now)

    def schedule_reboot(self, at: float) -> None:
        """Reboot the device at simulated time ``at`` (e.g. while a request is in flight)."""
        self._reboots.append(at)
        self._reboots.sort()

    def _step(self) -> None:
        now = self._now
        self.link.tick(now)
        while self.link.next_event() is not None:
            self.device.reboot(now)
        while self._reboots and self._reboots[0] <= now:
            self._reboots.pop(0)
            self.device.reboot(now)
        self.link.a_to_b.tick(now)
        arrived = self.link.a_to_b.data_to_send()
        if arrived:
            self.device.receive_data(arrived, now)
            answer = self.device.data_to_send()
            if answer and not self.drop_answers:
                self.link.b_to_a.receive_data(answer, now + DEVICE_TURNAROUND)


class AsyncSimTransport:
    """``SimTransport`` behind the asyncio transport's methods (for ``AsyncDevice`` in tests):
    each ``read`` yields to the event loop once, so other tasks (and cancellations) interleave,
    then answers from simulated time without really waiting."""

    def __init__(self, sim: SimTransport) -> None:
        self.t = sim

    async def write(self, data: bytes) -> None:
        self.t.write(data)

    async def read(self, timeout: float) -> bytes:
        await asyncio.sleep(0)
        return self.t.read(timeout)

    def now(self) -> float:
        return self.t.now()

    async def close(self) -> None:
        self.t.close()
