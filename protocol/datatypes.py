"""What a register's words mean: the data types of a register map, and their one codec.

Contract (docs/REGMAP.md, "Data types"):

- ``DataType``: ``u16`` (one register, unsigned: what every map had before types), ``i16`` (one
  register, two's complement), ``u32``/``i32``/``f32`` (two registers), ``u64``/``i64``/``f64``
  (four registers; ``f32``/``f64`` IEEE 754) and ``string`` (read-only ASCII over ``length``
  registers, two characters a register, the first character in the high byte).
- ``WordOrder``: which register of a multi-register value holds the most significant word:
  ``big`` (the first, at the lowest address: "ABCD") or ``little`` (the last: "CDAB"). Bytes
  inside one register are always big-endian, as Modbus sends them.
- A value's **raw** form is one non-negative integer: the words it is made of, most significant
  first, whatever their order on the wire (``combine``/``split``). For ``u16`` that is the word
  itself, as before; ``i16`` -5 is raw 0xFFFB; ``f32`` 1.5 is raw 0x3FC00000. ``native`` turns a
  raw value into the number the device means (before a map's scale and offset), ``raw_of``
  goes back, refusing (``ValueError``, one line) what the type cannot hold.
- ``number_text`` writes a float as the shortest decimal that reads back to the same bits of its
  width (``f32`` 0.1 is ``0.1``, not ``0.10000000149011612``); ``string_text`` writes a string
  register's text (trailing NULs and spaces dropped, any byte that is not printable ASCII shown
  as ``\\xNN``).

Pure computation: everything that encodes or decodes a typed value goes through here (the
register map, the simulator's core, the host's commands, the CLI).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from decimal import Decimal
from enum import Enum

WORD_BITS = 16
WORD_MASK = 0xFFFF


class DataType(Enum):
    U16 = "u16"
    I16 = "i16"
    U32 = "u32"
    I32 = "i32"
    F32 = "f32"
    U64 = "u64"
    I64 = "i64"
    F64 = "f64"
    STRING = "string"

    @property
    def words(self) -> int:
        """Registers a value of this type takes (0 for ``string``: its ``length`` says)."""
        return _WORDS[self]

    @property
    def signed(self) -> bool:
        return self in (DataType.I16, DataType.I32, DataType.I64)

    @property
    def is_float(self) -> bool:
        return self in (DataType.F32, DataType.F64)

    @property
    def is_integer(self) -> bool:
        return not self.is_float and self is not DataType.STRING


_WORDS = {DataType.U16: 1, DataType.I16: 1, DataType.U32: 2, DataType.I32: 2, DataType.F32: 2,
          DataType.U64: 4, DataType.I64: 4, DataType.F64: 4, DataType.STRING: 0}

#: Registers a string may span (a Modbus read carries at most 125).
MAX_STRING_WORDS = 125


class WordOrder(Enum):
    BIG = "big"  #: the first register (lowest address) holds the most significant word
    LITTLE = "little"  #: the first register holds the least significant word


def parse_type(text: str) -> DataType:
    """A data type by name (``i16``, ``F32``); ``ValueError`` naming the types otherwise."""
    try:
        return DataType(str(text).strip().lower())
    except ValueError:
        raise ValueError(f"unknown type {text!r}; types are "
                         + ", ".join(t.value for t in DataType)) from None


def parse_word_order(text: str) -> WordOrder:
    try:
        return WordOrder(str(text).strip().lower())
    except ValueError:
        raise ValueError(f"word order {text!r} is neither \"big\" (the first register holds the "
                         "most significant word) nor \"little\" (the last does)") from None


def combine(words: Sequence[int], order: WordOrder) -> int:
    """The raw value of ``words`` as read at increasing addresses: most significant first."""
    ordered = words if order is WordOrder.BIG else tuple(reversed(words))
    raw = 0
    for w in ordered:
        raw = raw << WORD_BITS | (w & WORD_MASK)
    return raw


def split(raw: int, count: int, order: WordOrder) -> tuple[int, ...]:
    """The ``count`` words of ``raw`` at increasing addresses (inverse of ``combine``)."""
    big = tuple((raw >> (WORD_BITS * (count - 1 - i))) & WORD_MASK for i in range(count))
    return big if order is WordOrder.BIG else tuple(reversed(big))


def raw_bits(dtype: DataType, words: int) -> int:
    """How many bits a raw value of ``dtype`` over ``words`` registers has."""
    return WORD_BITS * (dtype.words or words)


def integer_range(dtype: DataType) -> tuple[int, int]:
    """The lowest and highest value an integer type holds."""
    bits = WORD_BITS * dtype.words
    if dtype.signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


_FLOAT_FORMAT = {DataType.F32: ">f", DataType.F64: ">d"}


def native(dtype: DataType, raw: int) -> int | float:
    """The number a raw value means (before scale and offset). Not for ``string``."""
    if dtype.is_float:
        size = 2 * dtype.words
        value: float = struct.unpack(_FLOAT_FORMAT[dtype], raw.to_bytes(size, "big"))[0]
        return value
    if dtype is DataType.STRING:
        raise ValueError("a string has no number")
    if dtype.signed:
        bits = WORD_BITS * dtype.words
        return raw - (1 << bits) if raw >> (bits - 1) & 1 else raw
    return raw


def full_range(dtype: DataType, words: int = 0) -> tuple[int, int]:
    """The raw values of the lowest and the highest value ``dtype`` holds (for a float, -inf and
    +inf: every number; for ``u16`` and ``string``, every raw value)."""
    if dtype.is_float:
        fmt = _FLOAT_FORMAT[dtype]
        return (int.from_bytes(struct.pack(fmt, -math.inf), "big"),
                int.from_bytes(struct.pack(fmt, math.inf), "big"))
    if dtype is DataType.STRING or dtype is DataType.U16:
        return 0, (1 << raw_bits(dtype, words)) - 1
    lo, hi = integer_range(dtype)
    return raw_of(dtype, lo), raw_of(dtype, hi)


def raw_of(dtype: DataType, value: int | float) -> int:
    """The raw value of a number of ``dtype``: an integer within the type's range, or a finite
    float (rounded to the nearest ``f32`` for ``f32``; a nonzero one that would round to 0 is
    refused); ``ValueError`` otherwise."""
    if dtype.is_float:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        try:
            packed = struct.pack(_FLOAT_FORMAT[dtype], float(value))
        except (OverflowError, struct.error):
            raise ValueError(f"{value} is beyond what an {dtype.value} holds") from None
        if value != 0 and struct.unpack(_FLOAT_FORMAT[dtype], packed)[0] == 0:
            # a nonzero number too small for the type would be written as 0: say so instead
            raise ValueError(f"{value} is too small for an {dtype.value}: it would be written "
                             "as 0")
        return int.from_bytes(packed, "big")
    if dtype is DataType.STRING:
        raise ValueError("a string register is read-only")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value} is not an integer")
        value = int(value)
    lo, hi = integer_range(dtype)
    if not lo <= value <= hi:
        raise ValueError(f"{value} outside what an {dtype.value} holds ({lo}..{hi})")
    return value + (1 << (WORD_BITS * dtype.words)) if value < 0 else value


def number_text(dtype: DataType, value: int | float) -> str:
    """``-5``, ``1234.5``, ``0.1``: a number as people read it; a float as the shortest decimal
    that reads back to the same bits in its width (``5.0``, not ``5``: it is a float)."""
    if not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    text = repr(value)
    if dtype is DataType.F32:
        target = struct.pack(">f", value)
        for digits in range(1, 10):
            candidate = f"{value:.{digits}g}"
            try:
                if struct.pack(">f", float(candidate)) == target:
                    text = candidate
                    break
            except OverflowError:  # rounded up past the largest f32
                continue
    number = Decimal(text)
    if -7 <= number.adjusted() < 16:
        text = format(number, "f")
    if not any(c in text for c in ".eE"):
        text += ".0"
    return text


def string_text(raw: int, words: int) -> str:
    """The text a string register of ``words`` registers holds (raw value ``raw``)."""
    data = raw.to_bytes(2 * words, "big").rstrip(b"\x00 ")
    return "".join(chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in data)


def raw_text(dtype: DataType, raw: int, words: int) -> str:
    """A raw value as the CLI shows it: decimal for an unsigned integer (``u16`` as always,
    ``u32``, ``u64``), else hexadecimal with four digits a register (``0xFFCE``,
    ``0x449A5000``)."""
    if dtype in (DataType.U16, DataType.U32, DataType.U64):
        return str(raw)
    return f"0x{raw:0{4 * (dtype.words or words)}X}"


__all__ = [
    "MAX_STRING_WORDS",
    "DataType",
    "WordOrder",
    "combine",
    "full_range",
    "integer_range",
    "native",
    "number_text",
    "parse_type",
    "parse_word_order",
    "raw_bits",
    "raw_of",
    "raw_text",
    "split",
    "string_text",
]
