"""The character format of an asynchronous serial line: data bits, parity, stop bits.

Contract:

- ``CharFormat(bytesize, parity, stopbits)`` is one validated format (``8N1``, ``8E1``, ``7O2``...):
  ``bytesize`` 5..8, ``parity`` one of ``N E O M S`` (none, even, odd, mark, space), ``stopbits``
  1, 1.5 or 2 — what pyserial and a UART take. Anything else is one ``CharFormatError`` line
  naming the field and the values it takes; nothing is guessed.
- ``char_bits`` is the length of one character on the wire: start bit + data bits + parity bit
  (none for ``N``) + stop bits. It is the one place that length is computed: the Modbus RTU
  timing (``idemlink.protocol.modbus_rtu.rtu_timing``) takes it from here.
- ``parse_bytesize`` / ``parse_parity`` / ``parse_stopbits`` read one field as typed on a
  command line, in an environment variable or in a profile (``"8"``, ``"e"``, ``"even"``,
  ``"1.5"``, or the number itself); ``CharFormat.parse("8E1")`` reads the short form and
  ``str()`` writes it.
- ``IDEMLINK_CHAR_FORMAT`` (8N1) is what an idemlink device's port uses unless told otherwise;
  ``MODBUS_CHAR_FORMAT`` (8E1) is the Modbus over serial line specification's default (V1.02
  2.5.1: even parity required as the default), used for ``--modbus-rtu`` unless told otherwise.

A pseudo-terminal takes any format and enforces none (Linux keeps the stop bits and the odd-parity
flag a port was set to, but resets the data bits to 8 and parity to off): a format mismatch shows
only on a real UART, or to a peer told the format (an RFC 2217 server) — as on the wire of
``idemlink.device_sim.uart_wire``, which frames characters bit by bit at each end's format
(``idemlink.protocol.uart_line``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from idemlink.protocol.outcome import LocalProtocolError

BYTESIZES: tuple[int, ...] = (5, 6, 7, 8)
PARITIES: dict[str, str] = {"N": "none", "E": "even", "O": "odd", "M": "mark", "S": "space"}
STOPBITS: tuple[float, ...] = (1, 1.5, 2)


class CharFormatError(LocalProtocolError, ValueError):
    """A data-bits, parity or stop-bits value outside what a serial line takes (the caller's
    mistake: an ``IdemlinkError``, and a ``ValueError`` as a bad argument is)."""


def parse_bytesize(value: object) -> int:
    """Data bits: 5, 6, 7 or 8 (an int, or its text)."""
    text = str(value).strip() if not isinstance(value, bool) else ""
    if text in {str(b) for b in BYTESIZES}:
        return int(text)
    raise CharFormatError(f"bytesize {value!r}: data bits are one of 5, 6, 7, 8")


def parse_parity(value: object) -> str:
    """Parity: ``N``, ``E``, ``O``, ``M``, ``S`` or the word (``none``, ``even``...), any case."""
    if isinstance(value, str):
        text = value.strip().lower()
        for letter, word in PARITIES.items():
            if text in (letter.lower(), word):
                return letter
    choices = ", ".join(f"{k} ({w})" for k, w in PARITIES.items())
    raise CharFormatError(f"parity {value!r}: one of {choices}")


def parse_stopbits(value: object) -> float:
    """Stop bits: 1, 1.5 or 2 (a number, or its text). An integral value comes back as an int."""
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is not None and number in STOPBITS:
        return int(number) if number == int(number) else number
    raise CharFormatError(f"stopbits {value!r}: stop bits are one of 1, 1.5, 2")


_SHORT = re.compile(r"([5-8])([NEOMS])(1|1\.5|2)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class CharFormat:
    """One character format; see the module docstring."""

    bytesize: int = 8
    parity: str = "N"
    stopbits: float = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytesize", parse_bytesize(self.bytesize))
        object.__setattr__(self, "parity", parse_parity(self.parity))
        object.__setattr__(self, "stopbits", parse_stopbits(self.stopbits))

    @property
    def char_bits(self) -> float:
        """Bits one character occupies on the line: start + data + parity + stop."""
        return 1 + self.bytesize + (0 if self.parity == "N" else 1) + self.stopbits

    @classmethod
    def parse(cls, text: str) -> CharFormat:
        """``8E1``, ``8N2``, ``7O1``, ``8N1.5`` (case does not matter)."""
        m = _SHORT.fullmatch(text.strip())
        if m is None:
            raise CharFormatError(f"character format {text!r}: need data bits, parity and stop "
                                  "bits, e.g. 8N1 or 8E1")
        return cls(int(m[1]), m[2], float(m[3]))

    def __str__(self) -> str:
        stop = f"{self.stopbits:g}"
        return f"{self.bytesize}{self.parity}{stop}"


IDEMLINK_CHAR_FORMAT = CharFormat(8, "N", 1)
"""An idemlink device's line unless told otherwise."""
MODBUS_CHAR_FORMAT = CharFormat(8, "E", 1)
"""The Modbus over serial line default (V1.02 2.5.1): 8 data bits, even parity, 1 stop bit."""

__all__ = ["BYTESIZES", "IDEMLINK_CHAR_FORMAT", "MODBUS_CHAR_FORMAT", "PARITIES", "STOPBITS",
           "CharFormat", "CharFormatError", "parse_bytesize", "parse_parity", "parse_stopbits"]
