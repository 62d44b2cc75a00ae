"""The asyncio shell: the same driver, awaited instead of blocking.

``AsyncDevice`` runs exactly the operations ``host.device.Device`` defines — each is a generator
of I/O requests over the sans-I/O ``HostSession`` — with an ``AsyncTransport`` (``await write``,
``await read(timeout)``). There is no second copy of the request loop, the retry rules, the epoch
rule or the result decoding: only ``_drive`` differs, and the typed helpers are one line each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

from host.device import Command, Device, Reconciliation, Result, Steps
from protocol.registers import DEFAULT_MAP, RegisterMap

T = TypeVar("T")


class AsyncTransport(Protocol):
    async def write(self, data: bytes) -> None: ...
    async def read(self, timeout: float) -> bytes: ...
    def now(self) -> float: ...
    async def close(self) -> None: ...


class AsyncDevice:
    """A session with one idemlink device for asyncio programs."""

    def __init__(self, transport: AsyncTransport, *, regmap: RegisterMap = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, max_inflight: int = 8) -> None:
        self.transport = transport
        # The synchronous Device holds the session, the tag table and every operation; its own
        # transport is only asked for the time, which both kinds of transport provide.
        self.core = Device(transport, regmap=regmap, timeout=timeout,  # type: ignore[arg-type]
                           attempts=attempts, max_inflight=max_inflight)

    async def _drive(self, steps: Steps[T]) -> T:
        t = self.transport
        try:
            out, wait = next(steps)
            while True:
                if out:
                    await t.write(out)
                out, wait = steps.send(await t.read(wait))
        except StopIteration as stop:
            result: T = stop.value
            return result

    async def connect(self) -> None:
        await self._drive(self.core._connect_steps())

    async def run(self, commands: Iterable[Command]) -> list[Result]:
        return await self._drive(self.core._run_steps(list(commands)))

    async def execute(self, command: Command) -> Result:
        return (await self.run([command]))[0]

    async def read(self, register: str | int, count: int = 1) -> Result:
        return await self.execute(self.core.read_command(register, count))

    async def write(self, values: Mapping[str | int, int]) -> Result:
        return await self.execute(self.core.write_command(values))

    async def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        return await self._drive(self.core._reconcile_steps(result))

    def acknowledge_unknown(self) -> None:
        self.core.acknowledge_unknown()

    async def close(self) -> None:
        await self.transport.close()
