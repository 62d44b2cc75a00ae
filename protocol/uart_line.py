"""A UART line, bit by bit: characters framed by one end's format, sampled by the other's.

Contract (sans-I/O: bytes in, characters out; time is bit times, no clock):

- ``line_levels(data, fmt)`` is what a transmitter at ``fmt`` puts on the line for ``data``,
  back to back as a UART's FIFO sends a burst: per character a start bit (0), the data bits
  least significant first, the parity bit (even: the data's ones made even; odd: odd; mark: 1;
  space: 0; none: absent) and the stop bits (1), as line levels in quarter-bit units
  (``UNITS_PER_BIT``: 1.5 stop bits are 6 units). ``idle_levels(bits)`` is the line high between
  bursts.
- ``UartReceiver(fmt)`` samples a line as a 16550-style receiver does: a falling edge after the
  line was high starts a character; each bit is sampled in its middle (unit 2 of 4); a start bit
  that reads 1 there was a glitch (nothing received); the parity bit is checked (a mismatch is a
  parity error); only the first stop bit is checked (0 is a framing error) and, as the 16550
  does, a framing error is taken to be the next character's start bit (re-synchronised on it).
  It has the sans-I/O shape: ``receive_data(levels)`` takes line levels, ``next_event()`` gives
  each ``RxChar`` completed (value as sampled, ``parity_error``, ``framing_error``) or None; a
  character cut by the end of ``levels`` completes with the next levels.
- ``RxChar.ok``: no error. What a receiver does with an erroneous character is its driver's
  choice: Linux's tty layer, as pyserial leaves it (``INPCK`` off), delivers it as sampled;
  a Modbus RTU device discards it (Modbus over serial line V1.02, 2.5.1: a frame with a parity
  error is discarded). ``transfer(data, sender, receiver)`` is one burst from one end to the
  other, followed by idle: the characters the receiver got.

Both ends run at one speed (a speed mismatch is not modelled); the format is all that differs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from idemlink.protocol.char_format import CharFormat

UNITS_PER_BIT = 4
_MID = 2  #: the unit of a bit its level is sampled in


def _parity_bit(value: int, fmt: CharFormat) -> int | None:
    ones = bin(value & ((1 << fmt.bytesize) - 1)).count("1")
    return {"N": None, "E": ones & 1, "O": 1 - (ones & 1), "M": 1, "S": 0}[fmt.parity]


def char_levels(value: int, fmt: CharFormat) -> bytes:
    """One character at ``fmt``: start, data (LSB first), parity, stop bits; quarter-bit units."""
    bits = [0] + [(value >> i) & 1 for i in range(fmt.bytesize)]
    parity = _parity_bit(value, fmt)
    if parity is not None:
        bits.append(parity)
    levels = bytearray()
    for bit in bits:
        levels += bytes([bit]) * UNITS_PER_BIT
    levels += b"\x01" * int(fmt.stopbits * UNITS_PER_BIT)
    return bytes(levels)


def line_levels(data: bytes, fmt: CharFormat) -> bytes:
    """``data`` sent back to back at ``fmt``."""
    return b"".join(char_levels(b, fmt) for b in data)


def idle_levels(bits: int) -> bytes:
    """The line high for ``bits`` bit times."""
    return b"\x01" * (bits * UNITS_PER_BIT)


@dataclass(frozen=True, slots=True)
class RxChar:
    value: int  #: the data bits as sampled
    parity_error: bool = False
    framing_error: bool = False

    @property
    def ok(self) -> bool:
        return not (self.parity_error or self.framing_error)


class UartReceiver:
    """A receiver at ``fmt``; see the module docstring."""

    def __init__(self, fmt: CharFormat) -> None:
        self.fmt = fmt
        self._high = True  #: the line was high since the last character (an edge can start one)
        self._pending = bytearray()  #: levels of a character not yet complete (from its start)
        self._in_char = False
        self._chars: deque[RxChar] = deque()
        parity = 0 if fmt.parity == "N" else 1
        #: units from a start bit's first unit to the first stop bit's sample
        self._span = (1 + fmt.bytesize + parity) * UNITS_PER_BIT + _MID

    def next_event(self) -> RxChar | None:
        return self._chars.popleft() if self._chars else None

    def receive_data(self, data: bytes) -> None:
        """Line levels (``UNITS_PER_BIT`` a bit), as ``line_levels`` makes them."""
        levels = data
        out = self._chars
        i = 0
        n = len(levels)
        while i < n:
            if not self._in_char:
                level = levels[i]
                if level and not self._high:
                    self._high = True
                elif not level and self._high:
                    self._in_char = True
                    self._pending.clear()
                    continue  # this unit is the start bit's first
                i += 1
                continue
            need = _MID + 1 if len(self._pending) <= _MID else self._span + 1
            take = min(need - len(self._pending), n - i)
            self._pending += levels[i:i + take]
            i += take
            if len(self._pending) < need:
                break
            if need == _MID + 1:
                if self._pending[_MID]:  # the start bit reads 1 in its middle: a glitch
                    self._in_char = False
                    self._high = True
                continue
            out.extend(self._complete())

    def _complete(self) -> list[RxChar]:
        p = self._pending

        def bit(k: int) -> int:
            return p[k * UNITS_PER_BIT + _MID]

        self._in_char = False
        fmt = self.fmt
        value = sum(bit(1 + k) << k for k in range(fmt.bytesize))
        k = 1 + fmt.bytesize
        parity_error = False
        expected = _parity_bit(value, fmt)
        if expected is not None:
            parity_error = bit(k) != expected
            k += 1
        stop = bit(k)
        char = RxChar(value, parity_error, framing_error=not stop)
        if stop:
            self._high = True
        else:
            # a 16550 takes the low stop bit for the next start bit: a character starts there
            self._in_char = True
            rest = bytes(p[k * UNITS_PER_BIT:])
            self._pending = bytearray(rest)
        return [char]


def transfer(data: bytes, sender: CharFormat, receiver: UartReceiver,
             idle_bits: int = 12) -> list[RxChar]:
    """``data`` sent at ``sender`` as one burst then ``idle_bits`` of idle line, as ``receiver``
    samples it."""
    receiver.receive_data(line_levels(data, sender) + idle_levels(idle_bits))
    chars = []
    while (char := receiver.next_event()) is not None:
        chars.append(char)
    return chars


__all__ = ["UNITS_PER_BIT", "RxChar", "UartReceiver", "char_levels", "idle_levels", "line_levels",
           "transfer"]
