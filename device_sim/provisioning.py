"""The simulated device's provisioning steps, as lines of its ``--control`` FIFO (issue 23;
docs/SECURITY.md "Provisioning").

Contract: ``idemlink sim --control FIFO`` takes, besides the world's lines
(``idemlink.device_sim.control``), these — the simulator's stand-in for a button on the board
and its local service port (the FIFO is created 0600 on the simulator's machine: only someone at
that machine can write to it; nothing on the serial line can):

- ``button press`` / ``button release``: hold or let go of the provisioning button;
- ``provision-key PATH [SESSIONS]``: while the button is held, the first key of the private key
  file PATH becomes the device's current key; the key it replaces stays accepted for SESSIONS
  authenticated sessions (default ``ROTATION_SESSIONS``), then is refused. The device reboots
  (a new boot epoch);
- ``factory-reset``: while the button is held, keys, configuration and received files are
  erased and the device reboots unkeyed with its map's defaults (the recovery path for a lost
  key; the boot counter is kept, so the new epoch is new).

A step without the button held, a key file that is not private, a bad number: refused, counted
and said in one line on stderr, nothing changed (``ControlError``); a key is never in a message.
``provisioning_line(device, line, now)`` is the rule the serve loop calls (True: the line was
one of these).
"""

from __future__ import annotations

from idemlink.device_sim.control import ControlError
from idemlink.device_sim.device import SimulatedDevice
from idemlink.protocol.key_file import KeyFileError, read_key_file
from idemlink.protocol.key_rotation import (
    MAX_ROTATION_SESSIONS,
    ButtonState,
    ProvisioningRefused,
)

WORDS = ("button", "provision-key", "factory-reset")


def provisioning_line(device: SimulatedDevice, line: str, now: float) -> bool:
    """Apply one provisioning line to ``device``; False for a line that is not one of them."""
    words = line.split()
    if not words or words[0] not in WORDS:
        return False
    try:
        _apply(device, words, now)
    except (ProvisioningRefused, KeyFileError) as exc:
        raise ControlError(str(exc)) from None
    return True


def _apply(device: SimulatedDevice, words: list[str], now: float) -> None:
    word = words[0]
    if word == "button":
        if len(words) != 2 or words[1] not in ("press", "release"):
            raise ControlError("say 'button press' or 'button release'")
        if words[1] == "press":
            device.press_button()
        else:
            device.release_button()
        return
    if word == "factory-reset":
        if len(words) != 1:
            raise ControlError("factory-reset takes nothing")
        device.factory_reset(now)
        return
    if len(words) not in (2, 3):
        raise ControlError("say 'provision-key PATH [SESSIONS]'")
    window = None
    if len(words) == 3:
        if not words[2].isdigit() or int(words[2]) > MAX_ROTATION_SESSIONS:
            raise ControlError(f"SESSIONS {words[2][:12]!r} is not 0..{MAX_ROTATION_SESSIONS}")
        window = int(words[2])
    if device.button.state is not ButtonState.HELD:
        device.button.refused += 1
        raise ControlError("provision-key needs the provisioning button held (a "
                           "physical-presence step on the device): refused, nothing changed")
    key = read_key_file(words[1])[0]
    if window is None:
        device.provision_key(key, now)
    else:
        device.provision_key(key, now, window)


__all__ = ["WORDS", "provisioning_line"]
