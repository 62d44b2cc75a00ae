"""The bus's two scheduling rules (issue 22 item 3; docs/BUS.md): whose turn the line is, and a
device's circuit breaker with its re-probe schedule. Sans-I/O: addresses and time passed in.

Contract:

- ``next_in_turn(waiting, last)``: **round-robin among the devices with work queued**. The line
  goes to the lowest waiting address above ``last`` (the one whose transaction just ended),
  wrapping around to the lowest; None when nobody waits. A device with a deep queue gets one
  transaction, then every other waiting device gets one before its next: no device starves
  another, whatever its queue. Key 0 (a broadcast) is an address like the others.
- ``Breaker`` (``BreakerPolicy``): the rule table below. ``record(answered, now)`` is told what an
  operation that went out found; ``allows(now)`` says whether one may go out now (after the
  cooldown it goes out as a probe); ``probe_due(now)`` / ``next_probe`` give the re-probe schedule
  a bus follows on its own, without waiting for a command to that device. Each failed probe
  multiplies the cooldown by ``backoff`` up to ``max_cooldown`` (per-device backoff: a device
  dead for long costs fewer and fewer probe slots); an answer closes the breaker and resets it.

| state | event | next state | effect |
|---|---|---|---|
| CLOSED | answered | CLOSED | failures = 0 |
| CLOSED | unanswered, failures < policy.failures | CLOSED | failures += 1 |
| CLOSED | unanswered, failures reach policy.failures | OPEN | probe at now + cooldown |
| OPEN | ``allows(now)`` before the probe time | OPEN | refused (nothing sent) |
| OPEN | ``allows(now)`` at or after the probe time | PROBING | one operation goes out |
| PROBING | answered | CLOSED | failures = 0, cooldown back to policy.cooldown |
| PROBING | unanswered | OPEN | cooldown × backoff, capped; probe at now + cooldown |

The cap is ``max(max_cooldown, policy.cooldown)``: the cooldown never shrinks below the policy's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from idemlink.protocol.outcome import LocalProtocolError


def next_in_turn(waiting: Iterable[int], last: int | None) -> int | None:
    """Whose turn the line is after ``last``'s transaction: see the module docstring."""
    keys = sorted(set(waiting))
    if not keys:
        return None
    if last is None:
        return keys[0]
    return next((k for k in keys if k > last), keys[0])


class BreakerState(Enum):
    CLOSED = "closed"  #: commands are sent
    OPEN = "open"  #: nothing is sent until the probe time
    PROBING = "probing"  #: one operation goes out to see whether the device is back


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failures: int = 2  #: unanswered operations in a row that open the breaker
    cooldown: float = 2.0  #: seconds it stays open before the first probe
    backoff: float = 2.0  #: each failed probe multiplies the cooldown by this
    max_cooldown: float = 60.0  #: the cooldown never grows beyond this (or ``cooldown``, if longer)

    def __post_init__(self) -> None:
        if self.failures < 1 or not 0 <= self.cooldown < 3600:
            raise LocalProtocolError("a breaker opens after >= 1 failures and cools down for "
                                     "0..3600 s")
        if not 1.0 <= self.backoff <= 100.0 or not 0 <= self.max_cooldown <= 86400:
            raise LocalProtocolError("a breaker's backoff is 1..100 and its max_cooldown "
                                     "0..86400 s")


class Breaker:
    """One device's circuit breaker (time passed in). See the module docstring."""

    def __init__(self, policy: BreakerPolicy | None = None) -> None:
        self.policy = policy or BreakerPolicy()
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.cooldown = self.policy.cooldown  #: the current cooldown (grows by the backoff)
        self.open_until = 0.0  #: the probe time while OPEN
        self.refused = 0  #: commands ended BREAKER_OPEN without being sent
        self.probes = 0  #: probes that went out (a command after the cooldown, or a scheduled one)

    def allows(self, now: float) -> bool:
        """Whether an operation may go out now (at or after the probe time: as the probe)."""
        if self.state is BreakerState.OPEN:
            if now < self.open_until:
                return False
            self.state = BreakerState.PROBING
            self.probes += 1
        return True

    def probe_due(self, now: float) -> bool:
        """Whether the schedule asks for a probe now (open, and its probe time has come)."""
        return self.state is BreakerState.OPEN and now >= self.open_until

    @property
    def next_probe(self) -> float | None:
        """When the next probe is due (None unless open)."""
        return self.open_until if self.state is BreakerState.OPEN else None

    def record(self, answered: bool, now: float) -> None:
        """What the operation that went out found: the device answered, or not."""
        if answered:
            self.state, self.failures, self.cooldown = BreakerState.CLOSED, 0, self.policy.cooldown
            return
        self.failures += 1
        if self.state is BreakerState.PROBING:
            cap = max(self.policy.max_cooldown, self.policy.cooldown)
            self.cooldown = min(cap, self.cooldown * self.policy.backoff)
        elif self.failures < self.policy.failures:
            return
        self.state = BreakerState.OPEN
        self.open_until = now + self.cooldown


__all__ = ["Breaker", "BreakerPolicy", "BreakerState", "next_in_turn"]
