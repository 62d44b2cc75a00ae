"""An in-process byte pair on a simulated clock, optionally through an emulated ``Link``.

Contract:

- ``SimClock`` is a shared, explicitly advanced clock (seconds). Nothing here sleeps: tests jump
  the clock, so they are deterministic and fast.
- ``SimPair(link)`` gives two endpoints, ``a`` and ``b``, with the pyserial-like surface a driver
  needs: ``write(bytes) -> int``, ``read(n) -> bytes`` (never blocks: returns what has arrived by
  ``clock.now``, at most ``n`` bytes), ``read_available()``, ``in_waiting``,
  ``reset_input_buffer()``. ``a.write`` goes through ``link.a_to_b``, ``b.write`` through
  ``link.b_to_a``. Without a link the pair is an unpaced, faultless wire.
- ``next_event_time()`` is when something next arrives (or a reboot is due); ``advance_to(t)``,
  ``advance(dt)`` and ``step()`` move the clock and return the reboots that fell due, which are
  also handed to ``on_reboot``. Every endpoint operation first collects due reboots, so a reboot
  scheduled before a read is seen before that read.
"""

from __future__ import annotations

from collections.abc import Callable

from idemlink.device_sim.link import Link, LinkDirection, RebootEvent
from idemlink.protocol.outcome import LocalProtocolError


class SimClockError(LocalProtocolError, ValueError):
    """The simulated clock was asked to run backwards."""


class SimClock:
    """A clock that moves only when told to."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    @property
    def now(self) -> float:
        return self._now

    def advance(self, dt: float) -> float:
        """Move forward by ``dt >= 0`` seconds; returns the new time."""
        if not dt >= 0.0:
            raise SimClockError(f"cannot advance by {dt!r} seconds")
        self._now += dt
        return self._now

    def advance_to(self, t: float) -> float:
        """Move to ``t`` (not before now); returns the new time."""
        if t < self._now:
            raise SimClockError(f"cannot go back from {self._now!r} to {t!r}")
        self._now = float(t)
        return self._now

    def __call__(self) -> float:
        return self._now


class SimEndpoint:
    """One end of a ``SimPair``: a non-blocking, serial-port-like byte stream."""

    def __init__(
        self, pair: SimPair, name: str, outbound: LinkDirection, inbound: LinkDirection
    ) -> None:
        self.name = name
        self._pair = pair
        self._out = outbound
        self._in = inbound
        self._rx = bytearray()
        self.bytes_written = 0
        self.bytes_read = 0

    def pump(self) -> None:
        """Move what has arrived by now into this endpoint's input buffer."""
        now = self._pair.clock.now
        self._pair.due_reboots()
        self._in.tick(now)
        self._rx += self._in.data_to_send()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Put ``data`` on the line now; returns its length."""
        data = bytes(data)
        self._pair.due_reboots()
        self._out.receive_data(data, self._pair.clock.now)
        self.bytes_written += len(data)
        return len(data)

    def read(self, n: int = 1) -> bytes:
        """At most ``n`` bytes that have arrived by now (possibly none)."""
        if n < 0:
            raise ValueError(f"read size must be >= 0, got {n}")
        self.pump()
        out = bytes(self._rx[:n])
        del self._rx[:n]
        self.bytes_read += len(out)
        return out

    def read_available(self) -> bytes:
        """Every byte that has arrived by now."""
        self.pump()
        out = bytes(self._rx)
        self._rx.clear()
        self.bytes_read += len(out)
        return out

    @property
    def in_waiting(self) -> int:
        self.pump()
        return len(self._rx)

    def reset_input_buffer(self) -> None:
        """Discard what has arrived (bytes still on the line keep coming)."""
        self.pump()
        self._rx.clear()

    def next_arrival_time(self) -> float | None:
        """When the next byte for this endpoint is due (None: nothing on the way)."""
        return self._in.next_event_time()

    def __repr__(self) -> str:
        return f"SimEndpoint({self.name!r}, in_waiting={len(self._rx)})"


class SimPair:
    """Two endpoints joined by a ``Link`` on a shared ``SimClock``."""

    def __init__(
        self,
        link: Link | None = None,
        *,
        clock: SimClock | None = None,
        on_reboot: Callable[[RebootEvent], None] | None = None,
    ) -> None:
        self.link = link if link is not None else Link()
        self.clock = clock if clock is not None else SimClock()
        if on_reboot is not None:
            self.link.on_reboot = on_reboot
        self.link.start(self.clock.now)
        self.a = SimEndpoint(self, "a", self.link.a_to_b, self.link.b_to_a)
        self.b = SimEndpoint(self, "b", self.link.b_to_a, self.link.a_to_b)

    def due_reboots(self) -> list[RebootEvent]:
        """Reboots due by now (also handed to ``link.on_reboot``)."""
        self.link.tick(self.clock.now)
        return list(iter(self.link.next_event, None))

    def next_event_time(self) -> float | None:
        """The earliest pending delivery or reboot, or None when the line is idle."""
        return self.link.next_event_time()

    def _collect(self) -> list[RebootEvent]:
        events = self.due_reboots()
        self.a.pump()
        self.b.pump()
        return events

    def advance_to(self, t: float) -> list[RebootEvent]:
        """Move the clock to ``t``: due reboots are returned, due bytes land in the endpoints."""
        self.clock.advance_to(t)
        return self._collect()

    def advance(self, dt: float) -> list[RebootEvent]:
        self.clock.advance(dt)
        return self._collect()

    def step(self, limit: float | None = None) -> float | None:
        """Jump to the next event (not past ``limit``); returns the new time, or None if there
        was nothing to jump to (the clock then moves to ``limit`` if given)."""
        t = self.next_event_time()
        if t is None or (limit is not None and t > limit):
            if limit is not None and limit > self.clock.now:
                self.advance_to(limit)
            return None
        self.advance_to(max(t, self.clock.now))
        return self.clock.now
