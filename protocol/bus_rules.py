"""The bus's two scheduling rules (issue 22 item 3; docs/BUS.md): whose turn the line is, and a
device's circuit breaker with its re-probe schedule. Sans-I/O: addresses and time passed in.

Contract:

- ``next_in_turn(waiting, last)``: **round-robin among the devices with work queued**. The line
  goes to the lowest waiting address above ``last`` (the one whose transaction just ended),
  wrapping around to the lowest; None when nobody waits. A device with a deep queue gets one
  transaction, then every other waiting device gets one before its next: no device starves
  another, whatever its queue. Key 0 (a broadcast) is an address like the others.
- ``Breaker`` (``BreakerPolicy``): a state machine whose rules are the table ``TRANSITIONS``
  ((state, input) -> (next state, action)), run as written. ``record(answered, now)`` is told
  what an operation that went out found; ``allows(now)`` says whether one may go out now (at or
  after the probe time it goes out as the probe); ``probe_due(now)`` / ``next_probe`` give the
  re-probe schedule a bus follows on its own, without waiting for a command to that device.
  Each failed probe multiplies the cooldown by ``backoff``, capped at ``max(max_cooldown,
  policy.cooldown)`` (per-device backoff: a device dead for long costs fewer and fewer probe
  slots); an answer closes the breaker and resets the cooldown.

| state | input | next | action |
|---|---|---|---|
| CLOSED | ANSWERED | CLOSED | RESET: failures 0, cooldown back to the policy's |
| CLOSED | MISSED (failures stay below the policy's) | CLOSED | COUNT |
| CLOSED | MISSED_ENOUGH (failures reach the policy's) | OPEN | OPEN: probe at now + cooldown |
| CLOSED / PROBING | ASKED_EARLY, ASKED_DUE | unchanged | PASS: it goes out |
| OPEN | ASKED_EARLY (before the probe time) | OPEN | REFUSE: nothing is sent |
| OPEN | ASKED_DUE (at or after the probe time) | PROBING | PROBE: this one goes out |
| OPEN | ANSWERED (an operation sent before it opened) | CLOSED | RESET |
| OPEN | MISSED, MISSED_ENOUGH | OPEN | OPEN: the probe time moves on |
| PROBING | ANSWERED | CLOSED | RESET |
| PROBING | MISSED, MISSED_ENOUGH | OPEN | BACK_OFF: cooldown × backoff, capped; probe at now + cooldown |
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


class BreakerInput(Enum):
    ANSWERED = "answered"  #: an operation that went out was answered
    MISSED = "missed"  #: ... was not, and the failures in a row stay below the policy's
    MISSED_ENOUGH = "missed_enough"  #: ... was not, and the failures reach the policy's
    ASKED_EARLY = "asked_early"  #: may one go out? before the probe time
    ASKED_DUE = "asked_due"  #: may one go out? at or after the probe time


class BreakerAction(Enum):
    RESET = "reset"
    COUNT = "count"
    OPEN = "open"
    PASS = "pass"
    REFUSE = "refuse"
    PROBE = "probe"
    BACK_OFF = "back_off"


_S, _I, _A = BreakerState, BreakerInput, BreakerAction
TRANSITIONS: dict[tuple[BreakerState, BreakerInput], tuple[BreakerState, BreakerAction]] = {
    (_S.CLOSED, _I.ANSWERED): (_S.CLOSED, _A.RESET),
    (_S.CLOSED, _I.MISSED): (_S.CLOSED, _A.COUNT),
    (_S.CLOSED, _I.MISSED_ENOUGH): (_S.OPEN, _A.OPEN),
    (_S.CLOSED, _I.ASKED_EARLY): (_S.CLOSED, _A.PASS),
    (_S.CLOSED, _I.ASKED_DUE): (_S.CLOSED, _A.PASS),
    (_S.OPEN, _I.ASKED_EARLY): (_S.OPEN, _A.REFUSE),
    (_S.OPEN, _I.ASKED_DUE): (_S.PROBING, _A.PROBE),
    (_S.OPEN, _I.ANSWERED): (_S.CLOSED, _A.RESET),
    (_S.OPEN, _I.MISSED): (_S.OPEN, _A.OPEN),
    (_S.OPEN, _I.MISSED_ENOUGH): (_S.OPEN, _A.OPEN),
    (_S.PROBING, _I.ANSWERED): (_S.CLOSED, _A.RESET),
    (_S.PROBING, _I.MISSED): (_S.OPEN, _A.BACK_OFF),
    (_S.PROBING, _I.MISSED_ENOUGH): (_S.OPEN, _A.BACK_OFF),
    (_S.PROBING, _I.ASKED_EARLY): (_S.PROBING, _A.PASS),
    (_S.PROBING, _I.ASKED_DUE): (_S.PROBING, _A.PASS),
}
"""The breaker's rules (the module docstring's table), run by ``Breaker.step``."""


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
        due = self.state is not BreakerState.OPEN or now >= self.open_until
        return self.step(BreakerInput.ASKED_DUE if due else BreakerInput.ASKED_EARLY,
                         now) is not BreakerAction.REFUSE

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
            self.step(BreakerInput.ANSWERED, now)
        elif self.failures + 1 >= self.policy.failures:
            self.step(BreakerInput.MISSED_ENOUGH, now)
        else:
            self.step(BreakerInput.MISSED, now)

    def step(self, event: BreakerInput, now: float) -> BreakerAction:
        """One row of ``TRANSITIONS``: the next state, and the action done."""
        self.state, action = TRANSITIONS[(self.state, event)]
        if action is BreakerAction.RESET:
            self.failures, self.cooldown = 0, self.policy.cooldown
        elif action is BreakerAction.COUNT:
            self.failures += 1
        elif action is BreakerAction.OPEN:
            self.failures += 1
            self.open_until = now + self.cooldown
        elif action is BreakerAction.BACK_OFF:
            self.failures += 1
            cap = max(self.policy.max_cooldown, self.policy.cooldown)
            self.cooldown = min(cap, self.cooldown * self.policy.backoff)
            self.open_until = now + self.cooldown
        elif action is BreakerAction.PROBE:
            self.probes += 1
        return action


__all__ = ["TRANSITIONS", "Breaker", "BreakerAction", "BreakerInput", "BreakerPolicy",
           "BreakerState", "next_in_turn"]
