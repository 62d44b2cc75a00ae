"""A half-duplex line's two chores on the master's side, as a transport wrapper (issue 22 item 3):
echo suppression and a turnaround guard, for the framed protocol and Modbus RTU alike.

Contract (``HalfDuplexTransport(inner, echo=..., guard=...)``, a ``Transport``):

- **Echo** (``echo=True``): an RS-485 adapter that does not suppress its echo hands the master
  every byte it sends. Each write's bytes are expected back first, in order; they are recognised
  and removed from what ``read`` returns (a driver never sees them). A byte that differs from the
  one expected raises ``EchoMismatch`` (a ``PortError``: the request loop settles what was out
  and says ``LinkLost`` with this message) — a collision, a second master, a wiring or
  termination fault, or an adapter that does not echo at all (a device's answer then arrives
  where the echo was expected). ``echo_pending`` says how many bytes are still expected.
- **Turnaround guard** (``guard`` seconds): a write waits until ``guard`` seconds have passed
  since the last byte was heard, so a device that just answered has released the line before
  the master drives it again. The wait reads the line (what comes is kept for the next
  ``read``); it never sleeps without reading. ``guarded`` counts the writes that waited.
- Only bytes move here: what the bytes mean is the session's business. Bounded: at most
  ``MAX_EXPECTED`` echo bytes are expected (a write beyond that is ``EchoMismatch``, nothing
  sent).
- ``AsyncHalfDuplexTransport`` is the same on an ``AsyncTransport`` (``AsyncBus.open(url,
  echo=..., guard=...)``); both keep their bytes and times in one ``_Line`` (the echo's
  matching, the guard's time), so the rule is written once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemlink.host.errors import PortError
from idemlink.host.transport import Transport

if TYPE_CHECKING:  # the blocking wrapper needs no event loop
    from idemlink.host.aio_transport import AsyncTransport

MAX_EXPECTED = 65536


class EchoMismatch(PortError):
    """The line echoed other bytes than the master sent (see the module docstring)."""


class _Line:
    """What both wrappers keep: the echo still expected, what a guard's wait read, when a byte
    was last heard (the transport's clock)."""

    def __init__(self, echo: bool, guard: float) -> None:
        if not 0.0 <= guard <= 1.0:
            raise ValueError(f"a turnaround guard is 0..1 s, not {guard}")
        self.echo = echo
        self.guard = guard
        self.expected = bytearray()
        self.held = bytearray()  #: read while a write waited for its guard
        self.last_heard: float | None = None
        self.guarded = 0
        self.echoed = 0  #: echo bytes recognised and removed

    def guard_until(self, now: float) -> float | None:
        """Until when a write waits (None: it need not), counting a write that waits."""
        if not self.guard or self.last_heard is None:
            return None
        until = self.last_heard + self.guard
        if now < until:
            self.guarded += 1
        return until

    def waited(self, got: bytes, until: float) -> float:
        """A guard's read: kept for the next ``read``; heard more, the wait starts again."""
        self.held += got
        if got and self.last_heard is not None:
            return max(until, self.last_heard + self.guard)
        return until

    def sending(self, data: bytes) -> None:
        if self.echo:
            if len(self.expected) + len(data) > MAX_EXPECTED:
                raise EchoMismatch(f"{len(self.expected)} bytes of echo still expected: the "
                                   "line does not echo what the master sends; nothing sent")
            self.expected += data

    def held_bytes(self) -> bytes:
        out = bytes(self.held)
        self.held.clear()
        return out

    def take(self, data: bytes, now: float) -> bytes:
        """What of ``data`` is not the master's own echo (raises on a wrong echo)."""
        if not data:
            return data
        self.last_heard = now
        n = min(len(data), len(self.expected))
        if n:
            if data[:n] != self.expected[:n]:
                at = next(i for i in range(n) if data[i] != self.expected[i])
                want, got = bytes(self.expected[:n]).hex(), data[:n].hex()
                self.expected.clear()
                raise EchoMismatch(f"the line's echo differs from what was sent at byte {at}: "
                                   f"sent {want}, heard {got} (a collision, another master, a "
                                   "wiring fault, or an adapter that does not echo)")
            del self.expected[:n]
            self.echoed += n
        return data[n:]


class HalfDuplexTransport:
    """See the module docstring."""

    def __init__(self, inner: Transport, *, echo: bool = False, guard: float = 0.0) -> None:
        self.inner = inner
        self.line = _Line(echo, guard)
        self.echo, self.guard = echo, guard

    @property
    def echo_pending(self) -> int:
        return len(self.line.expected)

    @property
    def guarded(self) -> int:
        return self.line.guarded

    @property
    def echoed(self) -> int:
        return self.line.echoed

    def now(self) -> float:
        return self.inner.now()

    def write(self, data: bytes) -> None:
        until = self.line.guard_until(self.inner.now())
        while until is not None and (left := until - self.inner.now()) > 0:
            until = self.line.waited(self._take(self.inner.read(left)), until)
        self.line.sending(data)
        self.inner.write(data)

    def read(self, timeout: float) -> bytes:
        if self.line.held:
            return self.line.held_bytes()
        return self._take(self.inner.read(timeout))

    def _take(self, data: bytes) -> bytes:
        return self.line.take(data, self.inner.now())

    def close(self) -> None:
        self.inner.close()


class AsyncHalfDuplexTransport:
    """``HalfDuplexTransport`` on an ``AsyncTransport`` (the module docstring)."""

    def __init__(self, inner: AsyncTransport, *, echo: bool = False,
                 guard: float = 0.0) -> None:
        self.inner = inner
        self.line = _Line(echo, guard)

    @property
    def echo_pending(self) -> int:
        return len(self.line.expected)

    def now(self) -> float:
        return self.inner.now()

    async def write(self, data: bytes) -> None:
        until = self.line.guard_until(self.inner.now())
        while until is not None and (left := until - self.inner.now()) > 0:
            got = self.line.take(await self.inner.read(left), self.inner.now())
            until = self.line.waited(got, until)
        self.line.sending(data)
        await self.inner.write(data)

    async def read(self, timeout: float) -> bytes:
        if self.line.held:
            return self.line.held_bytes()
        return self.line.take(await self.inner.read(timeout), self.inner.now())

    async def close(self) -> None:
        await self.inner.close()


__all__ = ["MAX_EXPECTED", "AsyncHalfDuplexTransport", "EchoMismatch", "HalfDuplexTransport"]
