"""The world outside a simulated device, driven from another process: a control FIFO.

Contract: ``idemlink sim --control PATH`` and the C posix device (``idemlink-device --control
PATH``) read the same lines from a named pipe, so a user's tests, ``faults``/``clear`` and the
soak drive the fault logic of any map on either device:

- ``input ADDRESS VALUE``: the world changed an INPUT register (a sensor reading): its raw value,
  all its words for a typed one (0..2^32-1 for a u32 at its first address; the C device's
  registers are one word: 0..65535);
- ``condition ADDRESS BITS``: the external fault conditions of the FAULT register at ADDRESS are
  now exactly BITS (each set bit a declared fault bit whose condition holds; 0: none holds).
  A condition that holds latches its bit; a latched bit clears (W1C) only once its condition has
  gone — the same rule as every fault (docs/REGISTERS.md).

Numbers are decimal or ``0x`` hexadecimal; blank lines and lines starting with ``#`` are ignored.
A line that is wrong (unknown word, not a number, no such register, a bit the map does not
declare, longer than ``MAX_LINE`` bytes) changes nothing: it is counted and said on stderr in one
line, and the device goes on serving. ``parse_control_line`` is the rule, sans I/O;
``ControlFifo`` is the pipe (created if absent; anything else at PATH is refused); ``apply`` acts
on a ``DeviceCore``. The C twin is ``firmware_ref/port/posix/posix_control.c``;
``tests/test_device_control.py`` drives both with the same lines.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.outcome import LocalProtocolError
from idemlink.protocol.registers import RegisterKind, RegisterMap

MAX_LINE = 128
"""Longest control line in bytes (the C device's buffer); a longer one is refused whole."""



def shown(line: str) -> str:
    """What a refusal may repeat of a control line: its first word (at most 40 characters) and
    "..." when more follows. The rest may be a secret an operator pasted (a key after a command
    this device does not know): never repeated in a log. The C devices show the same."""
    first = re.split(r"[ \t\r]", line, maxsplit=1)[0][:40]
    return first + (" ..." if len(line) > len(first) else "")


class ControlError(LocalProtocolError, ValueError):
    """A control line that cannot be applied (nothing changed)."""


class ControlWord(Enum):
    INPUT = "input"
    CONDITION = "condition"


@dataclass(frozen=True, slots=True)
class ControlCommand:
    word: ControlWord
    address: int
    value: int


_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|[0-9]+")


def _number(text: str, what: str, maximum: int = 0xFFFF) -> int:
    if not _NUMBER.fullmatch(text) or len(text) > 24:  # no sign, no '_', as the C device reads it
        raise ControlError(f"{what} {text!r} is not a number")
    value = int(text, 16) if text[:2] in ("0x", "0X") else int(text, 10)
    if not 0 <= value <= maximum:
        raise ControlError(f"{what} {value} outside 0..{maximum}")
    return value


def parse_control_line(line: str, regmap: RegisterMap) -> ControlCommand | None:
    """One line: a command, None for a blank line or a comment, or ``ControlError``."""
    if len(line.encode("utf-8", "replace")) > MAX_LINE:
        raise ControlError(f"line longer than {MAX_LINE} bytes")
    words = line.split()
    if not words or words[0].startswith("#"):
        return None
    try:
        word = ControlWord(words[0])
    except ValueError:
        raise ControlError(f"{words[0]!r}: say 'input ADDRESS VALUE' or "
                           "'condition ADDRESS BITS'") from None
    if len(words) != 3:
        raise ControlError(f"{word.value} takes an address and a value")
    address = _number(words[1], "address")
    spec = regmap.at(address)
    wanted = RegisterKind.INPUT if word is ControlWord.INPUT else RegisterKind.FAULT
    if spec is None or spec.kind is not wanted or spec.address != address:
        raise ControlError(f"address {address} is not an {wanted.name} register"
                           + (f" (it is inside {spec.name}, at {spec.address})"
                              if spec is not None and spec.address != address else ""))
    value = _number(words[2], "value" if word is ControlWord.INPUT else "bits", spec.raw_max)
    if word is ControlWord.CONDITION:
        declared = sum(1 << b.bit for b in spec.bits)
        if value & ~declared:
            raise ControlError(f"bits 0x{value & ~declared:04x} of {spec.name} are not declared "
                               "fault bits")
    return ControlCommand(word, address, value)


def apply(core: DeviceCore, command: ControlCommand, now: float) -> None:
    """Act on ``core`` (its own hooks: ``set_input``, ``set_condition``)."""
    spec = core.regmap.at(command.address)
    assert spec is not None  # parse_control_line checked it
    if command.word is ControlWord.INPUT:
        core.set_input(spec.name, command.value, now)
        return
    for b in spec.bits:
        core.set_condition(b.name, bool(command.value >> b.bit & 1), now)


class ControlFifo:
    """A named pipe read without blocking: ``lines()`` returns the complete lines that came."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self.path, 0o600)
        st = os.lstat(self.path)
        if not stat.S_ISFIFO(st.st_mode):
            raise ControlError(f"--control {self.path}: exists and is not a FIFO; refused")
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        # our own writer: a writer that comes and goes never leaves us reading end-of-file
        self._keep = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        self._buf = b""
        self._skipping = False
        self.refused = 0

    def lines(self) -> list[str]:
        """What came since the last call, as complete lines (an overlong one as a marker
        longer than ``MAX_LINE``, so that parsing refuses it)."""
        while True:
            try:
                chunk = os.read(self._fd, 4096)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    break
                raise
            if not chunk:
                break
            self._buf += chunk
        out: list[str] = []
        while b"\n" in self._buf:
            raw, self._buf = self._buf.split(b"\n", 1)
            if self._skipping:
                self._skipping = False
                out.append("x" * (MAX_LINE + 1))
                continue
            out.append(raw.decode("utf-8", "replace"))
        if len(self._buf) > MAX_LINE:  # bounded: the rest of this line is dropped
            self._buf = b""
            self._skipping = True
        return out

    def close(self) -> None:
        for fd in (self._fd, self._keep):
            with contextlib.suppress(OSError):
                os.close(fd)


class Control:
    """A FIFO applied to a core: ``apply_pending(now)`` from the serve loop, between its reads."""

    def __init__(self, path: str | os.PathLike[str], core: DeviceCore,
                 extra: Callable[[str, float], bool] | None = None) -> None:
        self.fifo = ControlFifo(path)
        self.core = core
        self.refused = 0
        #: lines of a simulator's own (``plain_slave.parse_fault_line``): True when handled
        self.extra = extra

    def apply_pending(self, now: float) -> list[str]:
        """Apply every complete line; return the one-line reasons of those refused."""
        problems: list[str] = []
        for line in self.fifo.lines():
            try:
                if self.extra is not None and self.extra(line, now):
                    continue
                command = parse_control_line(line, self.core.regmap)
                if command is not None:
                    apply(self.core, command, now)
            except ControlError as exc:
                self.refused += 1
                problems.append(f"control: {shown(line)!r}: {exc}")
        return problems

    def close(self) -> None:
        self.fifo.close()


__all__ = ["MAX_LINE", "Control", "ControlCommand", "ControlError", "ControlFifo", "ControlWord",
           "apply", "parse_control_line"]
