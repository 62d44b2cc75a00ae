"""The asyncio bus handle (issue 22 item 3): ``AsyncBus(transport).device(address)`` gives
``AsyncDevice`` handles that share one transport, one transaction on the wire at a time, each
with its circuit breaker — ``idemlink.host.bus.Bus`` awaited (docs/BUS.md).

Contract:

- ``AsyncBus(transport)`` / ``await AsyncBus.open(url)`` owns one ``AsyncTransport``;
  ``bus.device(address)`` is that address's ``AsyncBusDevice`` (an ``AsyncDevice``, the whole
  asyncio API and its outcomes), created once per address.
- **One transaction on the wire at a time**: every handle sends at most one request at a time
  (``max_inflight=1``) and every handle's operations take one lock, the bus's (the handle's own
  lock is the bus's), so a request never meets another device's answer on the medium. Tasks on
  different handles take turns per operation.
- **The breaker** is ``idemlink.host.bus.Breaker``, the blocking bus's rule (one rule, one
  place): after ``failures`` unanswered operations in a row the handle's commands end at once
  NOT_EXECUTED / BREAKER_OPEN, nothing sent, until the cooldown; then the next command probes.
  A handle connects on its first command (its probe when it never answered).
- ``await bus.close()`` stops every handle and closes the transport.
"""

from __future__ import annotations

import asyncio
from typing import Any, Self

from idemlink.host.aio import AsyncDevice
from idemlink.host.aio_transport import AsyncSerialTransport, AsyncTransport
from idemlink.host.bus import Breaker, BreakerPolicy, refused, unanswered
from idemlink.host.command import Command, Result
from idemlink.host.errors import NoDevice
from idemlink.protocol.frame import check_address
from idemlink.protocol.host_session import SessionState
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap


class AsyncBusDevice(AsyncDevice):
    """One address's handle on an ``AsyncBus``."""

    def __init__(self, bus: AsyncBus, address: int) -> None:
        super().__init__(bus.transport, regmap=bus.regmap, timeout=bus.timeout,
                         attempts=bus.attempts, max_inflight=1, check_map=bus.check_map,
                         address=address)
        self.bus = bus
        self.address = address
        self._lock = bus.turn  # one transaction on the wire at a time, whichever handle
        self.breaker = Breaker(bus.breaker_policy)

    async def connect(self) -> None:
        if not self.breaker.allows(self.transport.now()):
            raise NoDevice(f"address {self.address}: its breaker is open (it did not answer); "
                           "nothing was sent")
        try:
            await super().connect()
        except NoDevice:
            self.breaker.record(False, self.transport.now())
            raise
        self.breaker.record(True, self.transport.now())

    async def _share(self, commands: list[Command]) -> list[Result]:
        if not self.breaker.allows(self.transport.now()):
            return refused(self.breaker, self.address, commands, "did not answer; nothing was "
                           "sent")
        if self.ops.session.state is SessionState.CLOSED:
            try:
                await super().connect()  # the first command, or the probe of a silent device
            except NoDevice:
                self.breaker.record(False, self.transport.now())
                return refused(self.breaker, self.address, commands, "did not answer its "
                               "HELLO; nothing else was sent")
        results = await super()._share(commands)
        self.breaker.record(not unanswered(results), self.transport.now())
        return results

    async def close(self) -> None:
        """Stop this handle (the bus's transport stays open: ``AsyncBus.close`` closes it)."""
        await self._stop_sharing()


class AsyncBus:
    """A shared line of idemlink devices for asyncio programs. See the module docstring."""

    def __init__(self, transport: AsyncTransport, *, regmap: RegisterMap = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, check_map: bool = True,
                 breaker: BreakerPolicy | None = None) -> None:
        self.transport = transport
        self.regmap = regmap
        self.timeout = timeout
        self.attempts = attempts
        self.check_map = check_map
        self.breaker_policy = breaker or BreakerPolicy()
        self.turn = asyncio.Lock()
        self._devices: dict[int, AsyncBusDevice] = {}

    @classmethod
    async def open(cls, url: str, *, baudrate: int = 115200, bytesize: int = 8,
                   parity: str = "N", stopbits: float = 1, keep_lines: bool = True,
                   regmap: RegisterMap | str = DEFAULT_MAP, **kw: Any) -> AsyncBus:
        """Open ``url`` (any pyserial URL) for a bus; no device is contacted yet."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        t = await AsyncSerialTransport.open(url, baudrate=baudrate, bytesize=bytesize,
                                            parity=parity, stopbits=stopbits,
                                            keep_lines=keep_lines)
        return cls(t, regmap=rm, **kw)

    def device(self, address: int) -> AsyncBusDevice:
        """The handle of the device at ``address`` (1..247), the same one each time."""
        check_address(address)
        dev = self._devices.get(address)
        if dev is None:
            dev = self._devices[address] = AsyncBusDevice(self, address)
        return dev

    async def close(self) -> None:
        for dev in self._devices.values():
            await dev.close()
        await self.transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["AsyncBus", "AsyncBusDevice"]
