"""Put the link emulator in real time between a serving device and its byte transport.

``LossyTransport(inner, link, clock)`` has the same ``read(timeout)`` / ``write(bytes)`` shape as the
transports ``idemlink.device_sim.serve`` uses: bytes the host sent arrive through the link's a→b direction
(paced, delayed, dropped, duplicated, corrupted as configured), and the device's answers leave
through b→a. So a simulator on a pseudo-terminal can sit behind a lossy line while the host opens
the pty path like any serial port.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from idemlink.device_sim.link import Link


class _Inner(Protocol):
    def read(self, timeout: float) -> bytes: ...
    def write(self, data: bytes) -> None: ...


class LossyTransport:
    """Device-side transport whose traffic crosses an emulated ``Link`` in real time."""

    def __init__(self, inner: _Inner, link: Link,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.link = link
        self.clock = clock
        link.start(clock())

    def write(self, data: bytes) -> None:
        self.link.b_to_a.receive_data(data, self.clock())
        self._flush_back()

    def read(self, timeout: float) -> bytes:
        end = self.clock() + timeout
        while True:
            now = self.clock()
            self._flush_back()
            self.link.a_to_b.tick(now)
            arrived = self.link.a_to_b.data_to_send()
            if arrived:
                return arrived
            nxt = self.link.next_event_time()
            wait = end - now if nxt is None else min(end, nxt) - now
            if wait <= 0 and now >= end:
                return b""
            got = self.inner.read(max(0.0, min(wait, 0.005)))
            if got:
                self.link.a_to_b.receive_data(got, self.clock())

    def _flush_back(self) -> None:
        self.link.b_to_a.tick(self.clock())
        out = self.link.b_to_a.data_to_send()
        if out:
            self.inner.write(out)
