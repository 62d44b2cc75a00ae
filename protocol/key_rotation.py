"""A keyed device's key ring (issue 23 item 4): rotation with a stated window, provisioning only
under a physical-presence step, factory reset. Sans-I/O: keys in, decisions out; persisting them
is the shell's (the simulator keeps them in its flash directory, docs/SECURITY.md).

Contract:

- ``KeyRing(keys, old_sessions_left)``: ``keys[0]`` is the current key (named in HELLO_REPLY when
  a host names no key the device holds); the others are the keys it replaced, still accepted
  while ``old_sessions_left > 0`` (``accepted()``), refused after.
- **The window is counted in authenticated sessions, not in time.** ``provision(new, window)``
  makes ``new`` current and keeps the previous keys accepted for ``window`` more authenticated
  sessions (default ``ROTATION_SESSIONS``); ``session_used()`` counts one. A session counts once,
  when its first request runs — so only a host holding one of the keys can spend the window
  (a HELLO is unauthenticated: anyone could send them), and every host's sessions, on the old key
  or the new, bring the end nearer, so the window closes once the hosts have moved even if
  nobody uses the old key any more. Why not time: a device has no trustworthy clock (no RTC on
  most boards; uptime restarts at each boot, and counting it in flash would cost a write per
  tick), and a window in sessions cannot be stretched or shortened by anyone without a key.
  When the count reaches 0 the older keys are dropped: a HELLO naming them is answered unsigned
  with the current key id, and a host holding only the old key is refused.
- ``ring.session_used()`` and ``ring.provision()`` return new rings (frozen); ``to_lines`` /
  ``from_lines`` are the persisted form: the key file's lines (current first) and a line
  ``# rotation-sessions-left N`` (a comment to the key-file reader).
- **Physical presence** (``Button``): provisioning a key and factory reset are accepted only
  while the device's provisioning button is held (``BUTTON_TABLE``: the button's state and the
  event give the next state and whether the step is allowed). On hardware the button is a pin
  the firmware reads (held at power-up, or a jumper) and the step comes over the local service
  port only; the simulator's button and steps are lines of its ``--control`` FIFO
  (``idemlink.device_sim.provisioning``). Nothing on the field bus can provision or reset.
- ``repr`` shows key ids only; nothing here logs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from idemlink.protocol.auth import key_id
from idemlink.protocol.outcome import IdemlinkError

ROTATION_SESSIONS = 64
"""Authenticated sessions the replaced key is still accepted for after a new key is provisioned
(the default window; ``provision-key PATH N`` states another)."""

MAX_ROTATION_SESSIONS = 1_000_000
MAX_RING_KEYS = 4  #: the current key and up to three it replaced (``key_file.MAX_KEYS``)
WINDOW_LINE = "# rotation-sessions-left"


class ProvisioningRefused(IdemlinkError, PermissionError):
    """A provisioning step (a new key, a factory reset) refused: the button is not held, or the
    key or window is not acceptable. Nothing changed."""


@dataclass(frozen=True, slots=True)
class KeyRing:
    """See the module docstring."""

    keys: tuple[bytes, ...]
    old_sessions_left: int = 0

    def __post_init__(self) -> None:
        if not 1 <= len(self.keys) <= MAX_RING_KEYS:
            raise ProvisioningRefused(f"a key ring holds 1..{MAX_RING_KEYS} keys")
        for k in self.keys:
            key_id(k)  # checks the length
        if not 0 <= self.old_sessions_left <= MAX_ROTATION_SESSIONS:
            raise ProvisioningRefused(f"a rotation window is 0..{MAX_ROTATION_SESSIONS} "
                                      "sessions")

    @classmethod
    def given(cls, keys: tuple[bytes, ...], window: int = ROTATION_SESSIONS) -> KeyRing:
        """Keys given at once (a key file at the simulator's start): the first current, the
        others accepted for ``window`` sessions."""
        return cls(keys, window if len(keys) > 1 else 0)

    def accepted(self) -> tuple[bytes, ...]:
        """The keys a HELLO may name now: every key while the window is open, else the current."""
        return self.keys if self.old_sessions_left > 0 else self.keys[:1]

    @property
    def rotating(self) -> bool:
        return len(self.keys) > 1 and self.old_sessions_left > 0

    def provision(self, new: bytes, window: int = ROTATION_SESSIONS) -> KeyRing:
        """``new`` current, the keys accepted now kept for ``window`` more sessions (a key
        already in the ring moves to the front; a key past the window is not kept)."""
        if not 0 <= window <= MAX_ROTATION_SESSIONS:
            raise ProvisioningRefused(f"a rotation window is 0..{MAX_ROTATION_SESSIONS} "
                                      f"sessions, not {window}")
        key_id(new)
        older = tuple(k for k in self.accepted() if k != new)[:MAX_RING_KEYS - 1]
        return KeyRing((new, *older), window if older else 0)

    def session_used(self) -> KeyRing:
        """One authenticated session began (its first request ran); at 0 the old keys go."""
        if self.old_sessions_left == 0:
            return self if len(self.keys) == 1 else KeyRing(self.keys[:1])
        left = self.old_sessions_left - 1
        return replace(self, old_sessions_left=left) if left else KeyRing(self.keys[:1])

    def to_lines(self) -> str:
        """The persisted form (a key file the key-file reader takes, the window as a comment)."""
        text = "".join(k.hex() + "\n" for k in self.keys)
        return text + (f"{WINDOW_LINE} {self.old_sessions_left}\n" if self.rotating else "")

    @classmethod
    def from_lines(cls, keys: tuple[bytes, ...], text: str) -> KeyRing:
        """The ring of a persisted key file: its keys and the window line; a file listing
        several keys without one (written by hand, or before the window was kept) is a rotation
        just begun (``given``: the default window)."""
        for line in text.splitlines():
            if line.startswith(WINDOW_LINE):
                try:
                    left = int(line[len(WINDOW_LINE):].strip())
                except ValueError:
                    raise ProvisioningRefused("the key ring's window line is not a number") \
                        from None
                return cls(keys, left)
        return cls.given(keys)

    def __repr__(self) -> str:
        ids = ", ".join(f"{key_id(k):08x}" for k in self.keys)
        return f"KeyRing({ids}, old keys for {self.old_sessions_left} sessions)"


class ButtonState(Enum):
    RELEASED = "released"
    HELD = "held"


class ButtonEvent(Enum):
    PRESS = "press"
    RELEASE = "release"
    PROVISION = "provision"  #: a new key over the local port
    FACTORY_RESET = "factory-reset"


BUTTON_TABLE: dict[tuple[ButtonState, ButtonEvent], tuple[ButtonState, bool]] = {
    (ButtonState.RELEASED, ButtonEvent.PRESS): (ButtonState.HELD, True),
    (ButtonState.RELEASED, ButtonEvent.RELEASE): (ButtonState.RELEASED, True),
    (ButtonState.RELEASED, ButtonEvent.PROVISION): (ButtonState.RELEASED, False),
    (ButtonState.RELEASED, ButtonEvent.FACTORY_RESET): (ButtonState.RELEASED, False),
    (ButtonState.HELD, ButtonEvent.PRESS): (ButtonState.HELD, True),
    (ButtonState.HELD, ButtonEvent.RELEASE): (ButtonState.RELEASED, True),
    (ButtonState.HELD, ButtonEvent.PROVISION): (ButtonState.HELD, True),
    (ButtonState.HELD, ButtonEvent.FACTORY_RESET): (ButtonState.HELD, True),
}
"""(button state, event) -> (next state, whether the event is allowed): a provisioning step only
while the button is held (see the module docstring)."""


class Button:
    """The provisioning button's state (``BUTTON_TABLE``)."""

    def __init__(self) -> None:
        self.state = ButtonState.RELEASED
        self.refused = 0  #: provisioning steps refused because the button was not held

    def event(self, event: ButtonEvent) -> None:
        """Apply ``event``; ``ProvisioningRefused`` (counted, nothing changed) if not allowed."""
        state, allowed = BUTTON_TABLE[(self.state, event)]
        if not allowed:
            self.refused += 1
            raise ProvisioningRefused(f"{event.value} needs the provisioning button held (a "
                                      "physical-presence step on the device): refused, nothing "
                                      "changed")
        self.state = state


__all__ = ["BUTTON_TABLE", "MAX_ROTATION_SESSIONS", "ROTATION_SESSIONS", "Button", "ButtonEvent",
           "ButtonState", "KeyRing", "ProvisioningRefused"]
