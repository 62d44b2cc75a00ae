"""The asyncio bus handle (issue 22 item 3): ``AsyncBus(transport).device(address)`` gives
``AsyncDevice`` handles that share one transport, one transaction on the wire at a time, each
with its circuit breaker — ``idemlink.host.bus.Bus`` awaited (docs/BUS.md).

Contract:

- ``AsyncBus(transport)`` / ``await AsyncBus.open(url)`` owns one ``AsyncTransport``;
  ``bus.device(address)`` is that address's ``AsyncBusDevice`` (an ``AsyncDevice``, the whole
  asyncio API and its outcomes), created once per address.
- **One transaction on the wire at a time, fairly**: every handle sends at most one request at a
  time (``max_inflight=1``) and every byte it writes or reads is under the line's turn
  (``AsyncFairTurn`` through its ``AsyncTurnTransport``), so a request never meets another
  device's answer on the medium. The turn passes per transaction, round-robin among the
  handles with work queued (``idemlink.protocol.bus_rules.next_in_turn``, the blocking bus's
  rule): tasks on different handles take turns per transaction, whatever their queues.
- **The breaker** is ``idemlink.protocol.bus_rules.Breaker``, the blocking bus's rule (one rule,
  one place): after ``failures`` unanswered operations in a row the handle's commands end at once
  NOT_EXECUTED / BREAKER_OPEN, nothing sent, until the probe time; then ``await
  bus.probe_due()`` (every handle's command awaits it first) or the next command probes, and a
  failed probe backs off. A handle connects on its first command (its probe when it never
  answered).
- ``await AsyncBus.open(url, echo=True, guard=S)``: the master's echo removed and its
  turnaround guard (``idemlink.host.half_duplex.AsyncHalfDuplexTransport``), as ``Bus.open``.
- **Keys**: ``key=`` as ``idemlink.host.bus.Bus`` takes it (one key for every device, or
  ``{address: key}``; an address missing from the mapping is refused, never driven unkeyed):
  each ``AsyncBusDevice`` is made with ``key_of(bus.keys, address)``.
- ``await bus.close()`` stops every handle and closes the transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Self

from idemlink.host.aio import AsyncDevice
from idemlink.host.aio_transport import AsyncSerialTransport, AsyncTransport
from idemlink.host.bus import Holding, bus_keys, key_of, refused, unanswered
from idemlink.host.command import Command, Result
from idemlink.host.errors import NoDevice
from idemlink.host.half_duplex import AsyncHalfDuplexTransport
from idemlink.host.rtu_operations import probe_command
from idemlink.protocol.bus_rules import Breaker, BreakerPolicy, next_in_turn
from idemlink.protocol.frame import check_address
from idemlink.protocol.host_session import SessionState
from idemlink.protocol.key_file import HostKey
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap


class AsyncFairTurn:
    """``idemlink.host.bus.FairTurn`` for tasks: whose turn the line is, handed on round-robin
    (``next_in_turn``) among the keys waiting; a task that holds it and asks it for another key
    has it at once, nested (it would wait for itself)."""

    def __init__(self) -> None:
        self.holder: int | None = None
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.last: int | None = None
        self._task: asyncio.Task[Any] | None = None  #: the task that last acquired the turn
        self._lent: list[tuple[int, int | None]] = []  #: (nested key, the key it was lent from)

    async def acquire(self, key: int) -> None:
        if self.holder == key:
            return
        me = asyncio.current_task()
        if self.holder is not None and self._task is me:
            self._lent.append((key, self.holder))
            self.holder = key
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[key] = fut
        if self.holder is None:
            self._grant()
        try:
            await fut
        except BaseException:
            if self.waiting.get(key) is fut:
                del self.waiting[key]
            self.release(key)  # granted as it was cancelled: hand it on
            raise
        self._task = me

    def release(self, key: int) -> None:
        if self.holder != key:
            return
        if self._lent and self._lent[-1][0] == key:
            self.holder = self._lent.pop()[1]
            return
        self.holder, self.last, self._task = None, key, None
        self._grant()

    def contended(self, key: int) -> bool:
        return not self._lent and any(k != key and not f.done()
                                      for k, f in self.waiting.items())

    def _grant(self) -> None:
        while (nxt := next_in_turn(self.waiting, self.last)) is not None:
            fut = self.waiting.pop(nxt)
            if not fut.done():  # a cancelled waiter is skipped
                self.holder = nxt
                fut.set_result(None)
                return


class AsyncTurnTransport(Holding):
    """``idemlink.host.bus.TurnTransport`` awaited: every write and read under the turn; once a
    transaction settled during its turn and another key waits, it gives the turn up first."""

    def __init__(self, inner: AsyncTransport, turn: AsyncFairTurn, key: int) -> None:
        super().__init__(turn, key)
        self.inner = inner

    async def take(self) -> None:
        if self.holding:
            if not self.gives_up():
                return
            self.release()
        await self.turn.acquire(self.key)
        self.took()

    async def write(self, data: bytes) -> None:
        await self.take()
        await self.inner.write(data)

    async def read(self, timeout: float) -> bytes:
        await self.take()
        return await self.inner.read(timeout)

    def now(self) -> float:
        return self.inner.now()

    async def close(self) -> None:
        self.release()

    def __getattr__(self, name: str) -> Any:  # ``borrowed`` (YMODEM jobs)
        return getattr(self.inner, name)


class _HandleLock(asyncio.Lock):
    """A handle's own lock: an operation's end (its release) also ends the handle's turn."""

    def __init__(self, line: AsyncTurnTransport) -> None:
        super().__init__()
        self.line = line

    def release(self) -> None:
        self.line.release()
        super().release()


class AsyncBusDevice(AsyncDevice):
    """One address's handle on an ``AsyncBus``."""

    def __init__(self, bus: AsyncBus, address: int) -> None:
        line = AsyncTurnTransport(bus.transport, bus.turn, address)
        super().__init__(line, regmap=bus.regmap, timeout=bus.timeout,
                         attempts=bus.attempts, max_inflight=1, check_map=bus.check_map,
                         address=address, key=key_of(bus.keys, address))
        self.bus = bus
        self.address = address
        self.line = line
        stats = self.ops.stats
        line.settled = lambda: stats.commands
        self._lock = _HandleLock(line)
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
        await self.bus.probe_due(skip=self.address)
        if not self.breaker.allows(self.transport.now()):
            return refused(self.breaker, self.address, commands, "did not answer; nothing was "
                           "sent")
        if self.ops.session.state is SessionState.CLOSED:
            try:
                await AsyncDevice.connect(self)  # the first command, or the probe of a silent one
            except NoDevice:
                self.breaker.record(False, self.transport.now())
                return refused(self.breaker, self.address, commands, "did not answer its "
                               "HELLO; nothing else was sent")
        results = await super()._share(commands)
        self.breaker.record(not unanswered(results), self.transport.now())
        return results

    async def probe(self) -> bool | None:
        """``idemlink.host.bus.BusHandle.probe`` awaited."""
        if self.ops.unknown is not None or not self.breaker.probe_due(self.transport.now()):
            return None
        self.breaker.allows(self.transport.now())
        try:
            if self.ops.session.state is SessionState.CLOSED:
                await AsyncDevice.connect(self)
                answered = True
            else:
                answered = not unanswered(await AsyncDevice._share(
                    self, [probe_command(self.regmap)]))
        except NoDevice:
            answered = False
        self.breaker.record(answered, self.transport.now())
        return answered

    async def close(self) -> None:
        """Stop this handle (the bus's transport stays open: ``AsyncBus.close`` closes it)."""
        await self._stop_sharing()
        self.line.release()


class AsyncBus:
    """A shared line of idemlink devices for asyncio programs. See the module docstring."""

    def __init__(self, transport: AsyncTransport, *, regmap: RegisterMap = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, check_map: bool = True,
                 breaker: BreakerPolicy | None = None,
                 key: HostKey | Mapping[int, HostKey] | None = None) -> None:
        self.keys = bus_keys(key)  # read (and refused) before anything is sent
        self.transport = transport
        self.regmap = regmap
        self.timeout = timeout
        self.attempts = attempts
        self.check_map = check_map
        self.breaker_policy = breaker or BreakerPolicy()
        self.turn = AsyncFairTurn()
        self._devices: dict[int, AsyncBusDevice] = {}
        self._probing = False

    @classmethod
    async def open(cls, url: str, *, baudrate: int = 115200, bytesize: int = 8,
                   parity: str = "N", stopbits: float = 1, keep_lines: bool = True,
                   regmap: RegisterMap | str = DEFAULT_MAP, echo: bool = False,
                   guard: float = 0.0, **kw: Any) -> AsyncBus:
        """Open ``url`` (any pyserial URL) for a bus; no device is contacted yet. ``echo`` and
        ``guard`` as ``Bus.open``'s (``idemlink.host.half_duplex.AsyncHalfDuplexTransport``)."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        if kw.get("key") is not None:
            kw["key"] = bus_keys(kw["key"])  # a refused key file: before the port is opened
        t: AsyncTransport = await AsyncSerialTransport.open(
            url, baudrate=baudrate, bytesize=bytesize, parity=parity, stopbits=stopbits,
            keep_lines=keep_lines)
        if echo or guard:
            t = AsyncHalfDuplexTransport(t, echo=echo, guard=guard)
        return cls(t, regmap=rm, **kw)

    def device(self, address: int) -> AsyncBusDevice:
        """The handle of the device at ``address`` (1..247), the same one each time."""
        check_address(address)
        dev = self._devices.get(address)
        if dev is None:
            dev = self._devices[address] = AsyncBusDevice(self, address)
        return dev

    async def probe_due(self, *, skip: int | None = None) -> dict[int, bool]:
        """``idemlink.host.bus.Bus.probe_due`` awaited."""
        if self._probing:
            return {}
        self._probing = True
        try:
            now = self.transport.now()
            found = {a: await d.probe() for a, d in sorted(self._devices.items())
                     if a != skip and d.breaker.probe_due(now)}
            return {a: f for a, f in found.items() if f is not None}
        finally:
            self._probing = False

    def next_probe(self) -> float | None:
        """When the next scheduled probe is due, None if no breaker is open."""
        times = [t for d in self._devices.values() if (t := d.breaker.next_probe) is not None]
        return min(times) if times else None

    async def close(self) -> None:
        for dev in self._devices.values():
            await dev.close()
        await self.transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["AsyncBus", "AsyncBusDevice", "AsyncFairTurn", "AsyncTurnTransport"]
