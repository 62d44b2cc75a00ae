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
"""

from __future__ import annotations

from idemlink.host.errors import PortError
from idemlink.host.transport import Transport

MAX_EXPECTED = 65536


class EchoMismatch(PortError):
    """The line echoed other bytes than the master sent (see the module docstring)."""


class HalfDuplexTransport:
    """See the module docstring."""

    def __init__(self, inner: Transport, *, echo: bool = False, guard: float = 0.0) -> None:
        if not 0.0 <= guard <= 1.0:
            raise ValueError(f"a turnaround guard is 0..1 s, not {guard}")
        self.inner = inner
        self.echo = echo
        self.guard = guard
        self._expected = bytearray()
        self._held = bytearray()  #: read while a write waited for its guard
        self._last_heard: float | None = None
        self.guarded = 0
        self.echoed = 0  #: echo bytes recognised and removed

    @property
    def echo_pending(self) -> int:
        return len(self._expected)

    def now(self) -> float:
        return self.inner.now()

    def write(self, data: bytes) -> None:
        if self.guard and self._last_heard is not None:
            until = self._last_heard + self.guard
            if self.inner.now() < until:
                self.guarded += 1
            while (left := until - self.inner.now()) > 0:
                got = self._take(self.inner.read(left))
                self._held += got
                if got:
                    until = max(until, self._last_heard + self.guard)  # heard more: wait again
        if self.echo:
            if len(self._expected) + len(data) > MAX_EXPECTED:
                raise EchoMismatch(f"{len(self._expected)} bytes of echo still expected: the "
                                   "line does not echo what the master sends; nothing sent")
            self._expected += data
        self.inner.write(data)

    def read(self, timeout: float) -> bytes:
        if self._held:
            out = bytes(self._held)
            self._held.clear()
            return out
        return self._take(self.inner.read(timeout))

    def _take(self, data: bytes) -> bytes:
        """What of ``data`` is not the master's own echo (raises on a wrong echo)."""
        if not data:
            return data
        self._last_heard = self.inner.now()
        n = min(len(data), len(self._expected))
        if n:
            if data[:n] != self._expected[:n]:
                at = next(i for i in range(n) if data[i] != self._expected[i])
                want, got = bytes(self._expected[:n]).hex(), data[:n].hex()
                self._expected.clear()
                raise EchoMismatch(f"the line's echo differs from what was sent at byte {at}: "
                                   f"sent {want}, heard {got} (a collision, another master, a "
                                   "wiring fault, or an adapter that does not echo)")
            del self._expected[:n]
            self.echoed += n
        return data[n:]

    def close(self) -> None:
        self.inner.close()


__all__ = ["MAX_EXPECTED", "EchoMismatch", "HalfDuplexTransport"]
