"""The asyncio shell: the same driver, awaited instead of blocking.

``AsyncDevice`` runs exactly the operations ``idemlink.host.device.Device`` defines — each is a generator
of I/O requests over the sans-I/O ``HostSession`` — with an ``AsyncTransport`` (``await write``,
``await read(timeout)``). There is no second copy of the request loop, the retry rules, the epoch
rule or the result decoding: only ``_drive`` differs, and the typed helpers are one line each.

One operation at a time: every operation holds the device's ``asyncio.Lock``, so tasks sharing one
``AsyncDevice`` queue up (their requests are never interleaved, and only one task awaits the
transport's ``read``). A cancelled operation (``task.cancel()``, ``asyncio.wait_for`` timing out)
settles its requests as UNKNOWN/CANCELLED (NOT_EXECUTED if never sent) before the cancellation
propagates, and an UNKNOWN one that may have had an effect blocks the handle (a cancelled read does
not), as in the blocking driver — the rule is ``Device._result``'s; a transport error raises
``LinkLost`` the same way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

from idemlink.host.device import TRANSPORT_ERRORS, Command, Device, LinkLost, Reconciliation, Result, Steps
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

T = TypeVar("T")


class AsyncTransport(Protocol):
    async def write(self, data: bytes) -> None: ...
    async def read(self, timeout: float) -> bytes: ...
    def now(self) -> float: ...
    async def close(self) -> None: ...


class AsyncDevice:
    """A session with one idemlink device for asyncio programs."""

    def __init__(self, transport: AsyncTransport, *,
                 regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, max_inflight: int = 8,
                 check_map: bool = True) -> None:
        self.transport = transport
        if not isinstance(regmap, RegisterMap):
            regmap = resolve_regmap(regmap)
        # The synchronous Device holds the session, the tag table and every operation; its own
        # transport is only asked for the time, which both kinds of transport provide.
        self.core = Device(transport, regmap=regmap, timeout=timeout,  # type: ignore[arg-type]
                           attempts=attempts, max_inflight=max_inflight, check_map=check_map)
        self._lock = asyncio.Lock()

    async def _drive(self, steps: Steps[T]) -> T:
        async with self._lock:
            return await self._drive_locked(steps)

    async def _drive_locked(self, steps: Steps[T]) -> T:
        t = self.transport
        core = self.core
        try:
            out, wait = next(steps)
            while True:
                try:
                    if out:
                        await t.write(out)
                    data = await t.read(wait)
                except TRANSPORT_ERRORS as exc:
                    raise core._link_lost(exc) from exc
                out, wait = steps.send(data)
        except StopIteration as stop:
            result: T = stop.value
            return result
        except LinkLost:
            raise
        except BaseException as exc:  # asyncio.CancelledError above all
            core._interrupted(exc)
            raise
        finally:
            steps.close()

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
