"""The register map: one declaration of every register the device exposes, and its rules.

Contract (every register behaviour that a retry could make harmful is refused by the schema):

- Every register has exactly one ``RegisterKind``: ``INPUT`` (read-only live value), ``HOLDING``
  (set-only configuration with min/max and a unit), ``FAULT`` (latched bits, write 1s to clear),
  ``TRIGGER`` (one-shot action behind IDLE -> RUNNING -> DONE), ``GENERATION`` (the read-only
  configuration generation counter, an input register), ``COIL`` (a set-only bit) or
  ``DISCRETE_INPUT`` (a read-only bit), or ``COMMAND`` (a third-party device's command register
  that returns to 0 when its action is done). The framed device's register table knows the first
  five (``CoreKind``: the C enum and the contract hash are what they were before coils).
- There is deliberately no kind for increment, toggle or read-to-clear registers: a retried write
  or a repeated read must never change the outcome. ``RegisterSpec`` refuses such kinds (and
  unknown keyword "behaviours") with ``RegisterSchemaError``.
- INPUT and HOLDING registers have a data type (``idemlink.protocol.datatypes``: u16 by default;
  i16, 32- and 64-bit integers and floats over several registers in a declared word order,
  read-only strings), a scale and an offset, labels, or named bit fields (``BitField``; each is
  also a register of its own to read and write: ``field_view``). Values are raw integers: the
  words most significant first (a u16's is its word), shown and typed by ``show``/``typed``/
  ``raw_from_text``, checked by ``in_range`` as the type's numbers.
- Registers share one flat 16-bit address space (a value of several registers takes all of
  them); coils and discrete inputs have theirs (``Space``). The map is validated whole (unique
  addresses per space and names, at most one generation counter, min <= default <= max, fault
  bits in 0..15, fields that do not overlap). ``mask_write``: the device takes FC22.
- Names end up as C macros, so register and fault-bit names are lower-case ASCII identifiers
  (``[a-z][a-z0-9_]*``), fault-bit names are unique across the map, and every name the C header
  would define (``IDL_REG_<NAME>``, ``_MIN``/``_MAX``/``_DEFAULT``, ``IDL_FAULT_<BIT>``, the enum
  members) is unique: a map whose header would not compile is refused at construction.

The map is part of the single-source contract: ``contract_section()`` renders C defines, the
Markdown table and a JSON form (``to_json()``) from the one declaration below.

Why one module of this size: everything here is the register schema (kinds, specs and their
value/text conversions, the map and its hash, its contract rendering), and a schema change touches
all of it at once (a new field is validated, converted, hashed and rendered); the map file format
that feeds it is ``idemlink.protocol.regmap_file``'s.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import Enum, IntEnum
from fractions import Fraction
from typing import Any

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from idemlink.protocol.datatypes import (
    MAX_STRING_WORDS,
    DataType,
    WordOrder,
    combine,
    full_range,
    integer_range,
    native,
    number_text,
    parse_type,
    parse_word_order,
    raw_of,
    raw_text,
    split,
    string_text,
)
from idemlink.protocol.outcome import IdemlinkError, LocalProtocolError

_C_SAFE_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_MAP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}\Z")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
MAP_HASH_LEN = 8
MAX_NAME_LEN = 40

REGISTER_MAX = 0xFFFF
ADDRESS_MAX = 0xFFFF


class MidValueAddress(LocalProtocolError):
    """An address inside a value of several registers, not its first (``RegisterMap.addressed``)."""


class RegisterSchemaError(IdemlinkError, ValueError):
    """A register declaration breaks the schema (a programming error in the map, not a wire error)."""


#: A scale is a decimal number > 0 within these powers of ten, with at most this many significant
#: digits: shown values and typed values stay exact, and no scale can make arithmetic explode.
SCALE_EXPONENTS = (-12, 12)
SCALE_DIGITS = 15
#: Powers of ten a typed value may span before it is refused outright (beyond any register).
_TYPED_EXPONENTS = (-40, 30)


def check_scale(scale: Decimal) -> None:
    """Refuse a scale that is not a finite decimal > 0 within ``SCALE_EXPONENTS`` (1e-12..1e12)
    and ``SCALE_DIGITS`` significant digits."""
    if not scale.is_finite() or scale <= 0:
        raise RegisterSchemaError("scale must be a number > 0")
    lo, hi = SCALE_EXPONENTS
    digits = "".join(map(str, scale.as_tuple().digits)).rstrip("0")
    if not lo <= scale.adjusted() < hi or len(digits) > SCALE_DIGITS:
        raise RegisterSchemaError(f"scale must lie between 1e{lo} and 1e{hi} with at most "
                                  f"{SCALE_DIGITS} significant digits")


class RegisterKind(IntEnum):
    """The only register kinds there are. Each is idempotent under retries."""

    INPUT = 0  #: read-only live value (sensor); writes answer exception 02
    HOLDING = 1  #: set-only configuration value with min/max; a write sets an absolute value
    FAULT = 2  #: latched fault bits; reading never clears; writing 1s clears (W1C)
    TRIGGER = 3  #: one-shot action; 1 starts it once in IDLE, 0 resets to IDLE
    GENERATION = 4  #: configuration generation counter; read-only, +1 per effective change
    COIL = 5  #: one set-only bit in the coil table (FC01 reads, FC05/FC15 write an absolute 0/1)
    DISCRETE_INPUT = 6  #: one read-only bit in the discrete-input table (FC02)
    #: a plain device's command register: a non-zero value written while it reads 0 starts that
    #: command once; it reads the value while the command runs and 0 when done; a write while
    #: it runs starts nothing (docs/REGMAP.md, "Command registers")
    COMMAND = 7


class CoreKind(IntEnum):
    """The kinds of the register table a framed idemlink device (and the C reference core)
    serves: ``idl_reg_kind_t`` in the protocol contract. Coils and discrete inputs live in tables
    of their own, served on the Modbus RTU path; adding them changed no contract."""

    INPUT = RegisterKind.INPUT.value
    HOLDING = RegisterKind.HOLDING.value
    FAULT = RegisterKind.FAULT.value
    TRIGGER = RegisterKind.TRIGGER.value
    GENERATION = RegisterKind.GENERATION.value


class Space(Enum):
    """The address spaces of a map: the registers (input and holding registers share one flat
    space here, as on an idemlink device), the coils, the discrete inputs."""

    REGISTERS = "register"
    COILS = "coil"
    DISCRETE_INPUTS = "discrete input"


#: Kinds whose registers may have a data type other than u16 (and bit fields).
VALUE_KINDS = (RegisterKind.INPUT, RegisterKind.HOLDING)
#: Kinds that are one bit, not a register.
BIT_KINDS = (RegisterKind.COIL, RegisterKind.DISCRETE_INPUT)


#: Behaviours people ask for that are not idempotent, and why they are refused.
FORBIDDEN_KINDS: dict[str, str] = {
    "increment": "a retried increment adds twice; write the absolute value (HOLDING) instead",
    "decrement": "a retried decrement subtracts twice; write the absolute value (HOLDING) instead",
    "toggle": "a retried toggle flips back; write the absolute state (HOLDING) instead",
    "read_to_clear": "a repeated read loses the fault record; use a FAULT register (W1C) instead",
    "pulse": "a retried pulse fires twice; use a TRIGGER register (IDLE/RUNNING/DONE) instead",
}


class TriggerState(IntEnum):
    """The state of a trigger register, as read back by FC03/FC04."""

    IDLE = 0
    RUNNING = 1
    DONE = 2


class TriggerStatus(IntEnum):
    """The answer to a trigger write (the code a 0x42 TRIGGER answer carries)."""

    ACCEPTED = 0x0000  #: 1 written in IDLE: the action started now; or 0 written: reset to IDLE
    RUNNING = 0x0101  #: already running: nothing started
    DONE = 0x0102  #: already done: nothing started; write 0 to reset
    ABNORMAL_STATE = 0xFF00  #: the state machine is in an impossible state (Modbus exception 04)
    ILLEGAL_VALUE = 0xFF01  #: value other than 0 or 1 (Modbus exception 03); nothing changed


@dataclass(frozen=True, slots=True)
class FaultBit:
    """One bit of a fault register."""

    bit: int
    name: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class BitField:
    """A named field of ``width`` bits from ``bit`` (0 = least significant) inside one u16
    INPUT or HOLDING register; ``labels`` name its values."""

    name: str
    bit: int
    width: int = 1
    description: str = ""
    labels: tuple[tuple[int, str], ...] = ()

    @property
    def mask(self) -> int:
        """The field's bits in place in the register (``0x0030`` for bits 4-5)."""
        return ((1 << self.width) - 1) << self.bit


def parse_kind(kind: RegisterKind | str) -> RegisterKind:
    """Accept a RegisterKind or its name; refuse non-idempotent behaviours with the reason."""
    if isinstance(kind, RegisterKind):
        return kind
    key = str(kind).strip().lower().replace("-", "_").replace(" ", "_")
    if key in FORBIDDEN_KINDS:
        raise RegisterSchemaError(f"register kind {kind!r} is not allowed: {FORBIDDEN_KINDS[key]}")
    try:
        return RegisterKind[key.upper()]
    except KeyError:
        raise RegisterSchemaError(
            f"unknown register kind {kind!r}; kinds are "
            + ", ".join(k.name.lower() for k in RegisterKind)
        ) from None


#: ``minimum``/``maximum`` not given: the whole range of the register's type.
TYPE_RANGE = -1


def _decimal(name: str, what: str, text: str) -> Decimal:
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise RegisterSchemaError(f"{name}: {what} {text!r} is not a decimal number") from None
    if not number.is_finite():
        raise RegisterSchemaError(f"{name}: {what} {text!r} is not a finite number")
    return number


def _check_labels(name: str, labels: tuple[tuple[int, str], ...]) -> None:
    values = [v for v, _ in labels]
    texts = [s for _, s in labels]
    if len(set(values)) != len(values) or len(set(texts)) != len(texts):
        raise RegisterSchemaError(f"{name}: labels and their values must be unique")
    for _, s in labels:
        if not isinstance(s, str) or not _LABEL.match(s):
            raise RegisterSchemaError(
                f"{name}: label {s!r} must be a word ([A-Za-z_][A-Za-z0-9_.-]*), "
                "so that it cannot be read as a number")


@dataclass(frozen=True, slots=True)
class RegisterSpec:
    """One register (or coil, or discrete input). ``minimum``/``maximum``/``default`` apply to
    HOLDING (``default`` also to INPUT: the simulator's first reading; and to a COIL); ``bits``
    to FAULT. Values are **raw** (``idemlink.protocol.datatypes``: the words most significant
    first; for ``u16`` the word itself). A spec with ``field`` set is the view of one bit field
    of the register ``parent``: its raw value is the field's value."""

    address: int
    name: str
    kind: RegisterKind
    unit: str = ""
    minimum: int = TYPE_RANGE  #: raw; TYPE_RANGE: the lowest value of the type
    maximum: int = TYPE_RANGE  #: raw; TYPE_RANGE: the highest value of the type
    default: int = 0
    bits: tuple[FaultBit, ...] = ()
    description: str = ""
    scale: str = ""  #: decimal text; shown value = raw * scale ("" = 1, shown as the raw integer)
    labels: tuple[tuple[int, str], ...] = ()  #: (raw value, label) for enumerated values
    persist: bool = True  #: HOLDING (and COIL) only: kept across reboots (else default at boot)
    dtype: DataType = DataType.U16  #: what the register's words mean
    word_order: WordOrder = WordOrder.BIG  #: for a type of several registers
    length: int = 0  #: registers of a ``string`` (two characters each)
    offset: str = ""  #: decimal text; shown value = native x scale + offset ("" = 0)
    fields: tuple[BitField, ...] = ()  #: named bit fields (a u16 INPUT or HOLDING register)
    field: BitField | None = None  #: this spec is the view of one field of ``parent``
    parent: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_kind(self.kind))
        if isinstance(self.dtype, str):
            try:
                object.__setattr__(self, "dtype", parse_type(self.dtype))
            except ValueError as exc:
                raise RegisterSchemaError(f"{self.name}: {exc}") from None
        if isinstance(self.word_order, str):
            try:
                object.__setattr__(self, "word_order", parse_word_order(self.word_order))
            except ValueError as exc:
                raise RegisterSchemaError(f"{self.name}: {exc}") from None
        if not 0 <= self.address <= ADDRESS_MAX:
            raise RegisterSchemaError(f"{self.name}: address {self.address} outside 0..0xFFFF")
        if not isinstance(self.name, str) or not _C_SAFE_NAME.match(self.name):
            raise RegisterSchemaError(f"register name {self.name!r} must be a lower-case "
                                      "ASCII identifier ([a-z][a-z0-9_]*)")
        if len(self.name) > MAX_NAME_LEN:
            raise RegisterSchemaError(
                f"register name {self.name!r} is longer than {MAX_NAME_LEN} characters (its C "
                "macros must stay within the 63 significant characters C99 guarantees)")
        self._check_type()
        lo, hi = self._type_range()
        if self.minimum == TYPE_RANGE:
            object.__setattr__(self, "minimum", lo)
        if self.maximum == TYPE_RANGE:
            object.__setattr__(self, "maximum", hi)
        self._check_limits()
        if self.kind is not RegisterKind.FAULT and self.bits:
            raise RegisterSchemaError(f"{self.name}: only FAULT registers declare bits")
        if self.kind is RegisterKind.FAULT:
            if not self.bits:
                raise RegisterSchemaError(f"{self.name}: a FAULT register declares its bits")
            seen_bits = [b.bit for b in self.bits]
            if len(set(seen_bits)) != len(seen_bits) or not all(0 <= b <= 15 for b in seen_bits):
                raise RegisterSchemaError(f"{self.name}: fault bits must be unique, in 0..15")
            for b in self.bits:
                if not isinstance(b.name, str) or not _C_SAFE_NAME.match(b.name):
                    raise RegisterSchemaError(f"{self.name}: fault bit name {b.name!r} must be a "
                                              "lower-case ASCII identifier ([a-z][a-z0-9_]*)")
        if self.kind in (RegisterKind.FAULT, RegisterKind.TRIGGER, RegisterKind.GENERATION,
                         RegisterKind.COMMAND) and self.default != 0:
            raise RegisterSchemaError(f"{self.name}: a {self.kind.name} register starts at 0")
        for what, text in (("scale", self.scale), ("offset", self.offset)):
            if not text:
                continue
            number = _decimal(self.name, what, text)
            try:
                if what == "scale":
                    check_scale(number)
                elif number:
                    check_scale(abs(number))
            except RegisterSchemaError as exc:
                raise RegisterSchemaError(f"{self.name}: {str(exc).replace('scale', what)}") from None
            if self.kind not in VALUE_KINDS or self.field is not None:
                raise RegisterSchemaError(f"{self.name}: a {self.kind.name} register has no {what}")
            if not self.dtype.is_integer:
                raise RegisterSchemaError(f"{self.name}: a {self.dtype.value} register has no "
                                          f"{what} (it is read as it is)")
            if self.fields:
                raise RegisterSchemaError(f"{self.name}: a register with bit fields has no {what}")
        if self.labels:
            if self.kind not in (*VALUE_KINDS, *BIT_KINDS, RegisterKind.COMMAND):
                raise RegisterSchemaError(f"{self.name}: only INPUT, HOLDING, COMMAND, COIL and "
                                          "DISCRETE_INPUT registers have labels (trigger states "
                                          "and fault bits are named)")
            if not self.dtype.is_integer:
                raise RegisterSchemaError(f"{self.name}: a {self.dtype.value} register has no "
                                          "labels")
            _check_labels(self.name, self.labels)
            for v, s in self.labels:
                if type(v) is not int or not 0 <= v <= self.raw_max or not self.in_range(v):
                    shown = repr(v) if type(v) is not int or not 0 <= v <= self.raw_max else (
                        self.native_text(v))
                    raise RegisterSchemaError(
                        f"{self.name}: label {s!r} = {shown} outside "
                        f"{self.native_text(self.minimum)}..{self.native_text(self.maximum)}")
        if not self.persist and self.kind not in (RegisterKind.HOLDING, RegisterKind.COIL):
            raise RegisterSchemaError(f"{self.name}: only HOLDING registers and coils are "
                                      "configuration; persist applies to them alone")
        self._check_fields()

    def _check_type(self) -> None:
        if self.dtype is not DataType.U16 and (self.kind not in VALUE_KINDS
                                               or self.field is not None):
            raise RegisterSchemaError(f"{self.name}: a {self.kind.name} register is u16; only "
                                      f"INPUT and HOLDING registers take type {self.dtype.value}")
        if self.dtype is DataType.STRING:
            if not 1 <= self.length <= MAX_STRING_WORDS:
                raise RegisterSchemaError(f"{self.name}: a string needs a length of 1.."
                                          f"{MAX_STRING_WORDS} registers")
        elif self.length:
            raise RegisterSchemaError(f"{self.name}: only a string has a length")
        if self.words > 1 and self.address + self.words - 1 > ADDRESS_MAX:
            raise RegisterSchemaError(f"{self.name}: its {self.words} registers pass 0xFFFF")

    def _type_range(self) -> tuple[int, int]:
        """The raw values of the lowest and highest value the register's type holds."""
        if self.field is not None:
            return 0, (1 << self.field.width) - 1
        if self.kind in BIT_KINDS:
            return 0, 1
        return full_range(self.dtype, self.words)

    def _check_limits(self) -> None:
        if self.dtype is DataType.U16 or self.kind in BIT_KINDS or self.field is not None:
            top = self.raw_max
            if not 0 <= self.minimum <= self.maximum <= top:
                raise RegisterSchemaError(f"{self.name}: need 0 <= min <= max <= "
                                          + ("0xFFFF" if top == REGISTER_MAX else str(top)))
            if not self.minimum <= self.default <= self.maximum:
                raise RegisterSchemaError(f"{self.name}: default {self.default} outside "
                                          "min..max")
            return
        for what, raw in (("min", self.minimum), ("max", self.maximum),
                          ("default", self.default)):
            if type(raw) is not int or not 0 <= raw <= self.raw_max:
                raise RegisterSchemaError(f"{self.name}: {what} {raw!r} is not a raw "
                                          f"{self.dtype.value} value")
        if self.dtype is DataType.STRING:
            return
        if not self.native(self.minimum) <= self.native(self.maximum):
            raise RegisterSchemaError(f"{self.name}: need min <= max")
        if not self.in_range(self.default):
            raise RegisterSchemaError(f"{self.name}: default {self.native_text(self.default)} "
                                      "outside min..max")

    def _check_fields(self) -> None:
        if not self.fields:
            return
        if self.kind not in VALUE_KINDS or self.dtype is not DataType.U16:
            raise RegisterSchemaError(f"{self.name}: only a u16 INPUT or HOLDING register has "
                                      "bit fields")
        if self.labels:
            raise RegisterSchemaError(f"{self.name}: a register with bit fields has no labels "
                                      "(its fields may have)")
        taken = 0
        names: set[str] = set()
        for f in self.fields:
            if not isinstance(f.name, str) or not _C_SAFE_NAME.match(f.name) or (
                    len(f.name) > MAX_NAME_LEN):
                raise RegisterSchemaError(f"{self.name}: field name {f.name!r} must be a "
                                          "lower-case ASCII identifier ([a-z][a-z0-9_]*)")
            if f.name in names:
                raise RegisterSchemaError(f"{self.name}: field {f.name!r} declared twice")
            names.add(f.name)
            if not (0 <= f.bit <= 15 and f.width >= 1 and f.bit + f.width <= 16):
                raise RegisterSchemaError(f"{self.name}: field {f.name!r}: bits {f.bit}.."
                                          f"{f.bit + f.width - 1} outside 0..15")
            if taken & f.mask:
                raise RegisterSchemaError(f"{self.name}: field {f.name!r} overlaps another field")
            taken |= f.mask
            if f.labels:
                _check_labels(f"{self.name}: field {f.name!r}", f.labels)
                for v, s in f.labels:
                    if type(v) is not int or not 0 <= v < 1 << f.width:
                        raise RegisterSchemaError(f"{self.name}: field {f.name!r}: label {s!r} = "
                                                  f"{v!r} outside 0..{(1 << f.width) - 1}")

    # ------------------------------------------------------------------ shape
    @property
    def words(self) -> int:
        """Registers the value takes (1 for a u16, a field, a coil or a discrete input)."""
        if self.dtype is DataType.STRING:
            return self.length
        return self.dtype.words

    @property
    def raw_max(self) -> int:
        """The largest raw value (``0xFFFF`` for a u16; 1 for a coil)."""
        if self.kind in BIT_KINDS:
            return 1
        if self.field is not None:
            return (1 << self.field.width) - 1
        return (1 << (16 * self.words)) - 1

    @property
    def space(self) -> Space:
        if self.kind is RegisterKind.COIL:
            return Space.COILS
        if self.kind is RegisterKind.DISCRETE_INPUT:
            return Space.DISCRETE_INPUTS
        return Space.REGISTERS

    @property
    def span(self) -> range:
        """The addresses the value takes in its space."""
        return range(self.address, self.address + self.words)

    @property
    def writable(self) -> bool:
        if self.dtype is DataType.STRING:
            return False
        return self.kind in (RegisterKind.HOLDING, RegisterKind.FAULT, RegisterKind.TRIGGER,
                             RegisterKind.COIL, RegisterKind.COMMAND)

    @property
    def plain(self) -> bool:
        """A bare number means the same in the register's unit and raw: no scale, no offset,
        an unsigned 16-bit word or a bit (every register of the maps before types)."""
        return (not self.scale or Decimal(self.scale) == 1) and not (
            self.offset and Decimal(self.offset)) and self.dtype is DataType.U16

    @property
    def fault_mask(self) -> int:
        mask = 0
        for b in self.bits:
            mask |= 1 << b.bit
        return mask

    # ------------------------------------------------------------------ words and raw values
    def raw_from_words(self, words: Sequence[int]) -> int:
        """The raw value of the words read from ``address`` on (``words`` of them)."""
        if self.field is not None:
            return (words[0] >> self.field.bit) & ((1 << self.field.width) - 1)
        if len(words) == 1:
            return words[0]
        return combine(words[: self.words], self.word_order)

    def words_of(self, raw: int) -> tuple[int, ...]:
        """The words at ``address``, ``address + 1``... that hold ``raw`` (not for a field)."""
        if self.words == 1:
            return (raw,)
        return split(raw, self.words, self.word_order)

    def native(self, raw: int) -> int | float:
        """The number the device means by ``raw`` (signed, float), before scale and offset."""
        if self.field is not None or self.kind in BIT_KINDS:
            return raw
        return native(self.dtype, raw)

    def in_range(self, raw: int) -> bool:
        """``raw`` lies within min..max (compared as the type's numbers; NaN never does)."""
        if self.dtype is DataType.STRING:
            return 0 <= raw <= self.raw_max
        value = self.native(raw)
        return self.native(self.minimum) <= value <= self.native(self.maximum)

    def native_text(self, raw: int) -> str:
        """The type's number of ``raw`` as text (``-400``, ``1234.5``; a string's text)."""
        if self.dtype is DataType.STRING:
            return string_text(raw, self.words)
        return number_text(self.dtype, self.native(raw))

    @property
    def shown_default(self) -> str:
        return self.native_text(self.default)

    @property
    def type_text(self) -> str:
        """``""`` for a u16; ``i16``, ``f32 little``, ``string[8]``: what the words mean."""
        if self.dtype is DataType.U16:
            return ""
        if self.dtype is DataType.STRING:
            return f"string[{self.length}]"
        order = f" {self.word_order.value}" if self.words > 1 else ""
        return f"{self.dtype.value}{order}"

    def raw_text(self, raw: int) -> str:
        """``420`` (a u16, as always), ``0xFFCE`` (an i16), ``0x449A5000`` (an f32)."""
        return raw_text(self.dtype, raw, self.words)

    def limits_text(self) -> str:
        """``0..1000 (0.0..100.0 °C)``: min..max raw and, when it reads otherwise, as shown."""
        unit = f" {self.unit}" if self.unit else ""
        if self.dtype is DataType.U16 or self.field is not None or self.kind in BIT_KINDS:
            limits = f"{self.minimum}..{self.maximum}"
            if self.scale or self.offset:
                return (f"{limits} ({self.scaled(self.minimum)}..{self.scaled(self.maximum)}"
                        f"{unit})")
            return limits + unit
        limits = f"{self.native_text(self.minimum)}..{self.native_text(self.maximum)}"
        if self.scale or self.offset:
            return (f"{limits} ({self.scaled(self.minimum)}..{self.scaled(self.maximum)}"
                    f"{unit})")
        return limits + unit

    # ------------------------------------------------------------------ values as people read them
    def label_of(self, raw: int) -> str | None:
        """The map's name for ``raw``: a declared label (``auto``), a trigger's state
        (``RUNNING``), else None (a number, a fault word)."""
        if self.kind is RegisterKind.TRIGGER:
            return TriggerState(raw).name if raw in set(TriggerState) else None
        for v, s in self.field.labels if self.field is not None else self.labels:
            if v == raw:
                return s
        return None

    def scaled(self, raw: int) -> int | float | Decimal:
        """The value in the register's unit: ``native x scale + offset`` (exact), the native
        number without them (a float for f32/f64)."""
        value = self.native(raw)
        if (not self.scale and not self.offset) or isinstance(value, float):
            return value
        result = value * Decimal(self.scale) if self.scale else Decimal(value)
        return result + Decimal(self.offset) if self.offset else result

    def value(self, raw: int) -> int | float | str:
        """The value as JSON gives it: a number (scaled: a float; else the integer) or, for a
        string register, its text."""
        if self.dtype is DataType.STRING:
            return string_text(raw, self.words)
        shown = self.scaled(raw)
        return float(shown) if isinstance(shown, Decimal) else shown

    def field_values(self, raw: int) -> dict[str, int]:
        """Each bit field's value in the register's raw word."""
        return {f.name: (raw >> f.bit) & ((1 << f.width) - 1) for f in self.fields}

    def show(self, raw: int) -> str:
        """``42.0 °C``, ``auto``, ``1200 rpm``, ``RUNNING``, ``0x0005 over_temperature
        fan_stall``, ``0x0013 burner=1 stage=low``, ``SN-0042``: the value as the map describes
        it (no raw)."""
        if self.kind is RegisterKind.TRIGGER:
            return TriggerState(raw).name if raw in set(TriggerState) else f"state {raw}"
        if self.kind is RegisterKind.FAULT:  # undeclared set bits show as bitN
            declared = {b.bit: b.name for b in self.bits}
            names = [declared.get(i, f"bit{i}") for i in range(16) if raw >> i & 1]
            return " ".join([f"0x{raw:04X}", *(names or ["(none latched)"])])
        if self.fields:
            parts = []
            for f in self.fields:
                v = (raw >> f.bit) & ((1 << f.width) - 1)
                label = next((s for lv, s in f.labels if lv == v), None)
                parts.append(f"{f.name}={label if label is not None else v}")
            return " ".join([f"0x{raw:04X}", *parts])
        if self.dtype is DataType.STRING:
            return string_text(raw, self.words)
        label = self.label_of(raw)
        if label is not None:
            return label
        value = self.scaled(raw)
        text = number_text(self.dtype, value) if isinstance(value, float) else str(value)
        return f"{text} {self.unit}" if self.unit else text

    def typed(self, raw: int) -> str:
        """``30 (15.0 °C)``, ``2 (eco)``, ``80``, ``0xFFCE (-5.0 °C)``: the raw value, and how the
        map reads it when that differs — how every command echoes a value it writes."""
        text = self.show(raw)
        bare = self.raw_text(raw)
        return bare if text == bare else f"{bare} ({text})"

    def raw_from_text(self, text: str) -> int:
        """The raw value for ``text``, as people type it: a label (``auto``; any case,
        ``Auto``, when only one label matches it so); a number in the register's unit (``42.5``
        with scale 0.1 is raw 425; ``-5.0`` for an i16 with scale 0.1 is raw 0xFFCE; ``12.5`` for
        an f32 its IEEE bits; without scale or offset the number is the value itself); or an
        explicit raw value, ``raw:420`` or ``0x01A4``/``0b1...``. Raises ``ValueError`` naming
        the register when the text is none of these, falls between two steps of the scale, or
        is outside what the register holds."""
        text = text.strip()
        labels = self.field.labels if self.field is not None else self.labels
        for v, s in labels:
            if s == text:
                return v
        folded = [(v, s) for v, s in labels if s.casefold() == text.casefold()]
        if len(folded) == 1:  # ``Eco`` for ``eco``: labels are case-insensitive when unambiguous
            return folded[0][0]
        if folded:
            raise ValueError(f"{self.name}: {text!r} is ambiguous: labels "
                             + ", ".join(s for _, s in folded) + " differ only in case")
        if self.dtype is DataType.STRING:
            raise ValueError(f"{self.name} is a read-only string register")
        lowered = text.lower()
        explicit = lowered.startswith(("raw:", "0x", "0b"))
        if explicit:
            digits = text[4:].strip() if lowered.startswith("raw:") else text
            try:
                raw = int(digits, 0)
            except ValueError:
                raise ValueError(f"{self.name}: {text!r} is not a raw integer") from None
        else:
            try:
                number = Decimal(text.replace("_", "")) if text else Decimal("nan")
            except InvalidOperation:
                number = Decimal("nan")
            if not number.is_finite():
                choices = (f" or one of: {', '.join(s for _, s in labels)}" if labels else "")
                raise ValueError(f"{self.name}: {text!r} is not a number{choices}")
            raw = self._raw_of_number(text, number)
        if not 0 <= raw <= self.raw_max:
            if explicit and not (self.dtype is DataType.U16 or self.field is not None
                                 or self.kind in BIT_KINDS):  # the words, not the type's number
                raise ValueError(f"{self.name}={text}: a raw value is the register's words as "
                                 f"sent, 0..0x{self.raw_max:X}; type the {self.dtype.value} "
                                 "itself as a number in the register's unit")
            unit = f" {self.unit}" if self.unit and not explicit else ""
            raise ValueError(f"{self.name}={text}{unit}: outside what {self._holds()}")
        return raw

    def _holds(self) -> str:
        if self.dtype is DataType.U16 and self.field is None and self.kind not in BIT_KINDS:
            return f"a register holds (raw 0..{REGISTER_MAX})"
        if self.field is not None:
            return f"the field holds (0..{self.raw_max})"
        if self.kind in BIT_KINDS:
            return "a bit holds (0 or 1)"
        if self.dtype.is_float:
            return f"an {self.dtype.value} holds"
        lo, hi = integer_range(self.dtype)
        return f"an {self.dtype.value} holds ({lo}..{hi} raw)"

    def _raw_of_number(self, text: str, number: Decimal) -> int:
        """The raw value of a number typed in the register's unit."""
        if self.dtype.is_float and self.field is None:
            try:
                if number and float(number) == 0:  # below even a double: raw_of cannot tell
                    raise ValueError(f"{text} is too small for an {self.dtype.value}: it would "
                                     "be written as 0")
                return raw_of(self.dtype, float(number))
            except ValueError as exc:
                raise ValueError(f"{self.name}={text}: {exc}") from None
        if number and number.adjusted() > _TYPED_EXPONENTS[1]:
            raise ValueError(f"{self.name}={text}: outside what {self._holds()}")
        if number and number.adjusted() < _TYPED_EXPONENTS[0]:
            exact = Fraction(1, 2)  # smaller than any scale: between two steps
        else:  # exact (Decimal division would round to 28 digits)
            exact = ((Fraction(number) - Fraction(Decimal(self.offset or "0")))
                     / Fraction(Decimal(self.scale or "1")))
        if exact.denominator != 1:
            raise ValueError(
                f"{self.name}: {text} is not a multiple of the scale {self.scale}"
                if self.scale else f"{self.name}: {text} is not an integer")
        value = int(exact)
        if self.dtype is DataType.U16 or self.field is not None or self.kind in BIT_KINDS:
            return value  # the range is checked by the caller, with the u16 message
        lo, hi = integer_range(self.dtype)
        if not lo <= value <= hi:
            unit = f" {self.unit}" if self.unit else ""
            raise ValueError(f"{self.name}={text}{unit}: outside what {self._holds()}")
        return raw_of(self.dtype, value)

    def identity(self) -> dict[str, Any]:
        """Everything about the register that changes what its bytes mean (not descriptions, not
        an input's default: that is only the simulator's first reading). Keys for what a map
        could not say before types (type, word order, offset, fields) appear only when used, so
        every earlier map hashes as it did."""
        out: dict[str, Any] = {
            "address": self.address, "name": self.name, "kind": self.kind.name.lower(),
            "min": self.minimum, "max": self.maximum,
            "default": self.default if self.kind not in (RegisterKind.INPUT,
                                                         RegisterKind.DISCRETE_INPUT) else 0,
            "unit": self.unit, "scale": _canonical_scale(self.scale), "persist": self.persist,
            "labels": [[v, s] for v, s in self.labels],
            "bits": sorted([b.bit, b.name] for b in self.bits),
        }
        if self.dtype is not DataType.U16:
            out["type"] = self.dtype.value
            if self.words > 1 and self.dtype is not DataType.STRING:
                out["word_order"] = self.word_order.value
            if self.dtype is DataType.STRING:
                out["length"] = self.length
        if self.offset and Decimal(self.offset):
            out["offset"] = format(Decimal(self.offset).normalize(), "f")
        if self.fields:
            out["fields"] = sorted([f.bit, f.width, f.name, [[v, s] for v, s in f.labels]]
                                   for f in self.fields)
        return out

    def _native_json(self, raw: int) -> int | float | str:
        if self.dtype is DataType.STRING:
            return string_text(raw, self.words)
        return self.native(raw)

    def to_json(self) -> dict[str, Any]:
        """The register as a map file states it (``regmap_file`` reads it back unchanged): the
        fields its kind takes, defaults left out except ``min``/``max``/``default`` of a
        HOLDING register and ``persist``. Limits, defaults and label values are given as the
        type's numbers (``-400`` for an i16), as a map file gives them."""
        out: dict[str, Any] = {"address": self.address, "name": self.name,
                               "kind": self.kind.name.lower()}
        if self.dtype is not DataType.U16:
            out["type"] = self.dtype.value
            if self.dtype is DataType.STRING:
                out["length"] = self.length
            elif self.words > 1:
                out["word_order"] = self.word_order.value
        if self.unit:
            out["unit"] = self.unit
        if self.scale:
            out["scale"] = self.scale
        if self.offset:
            out["offset"] = self.offset
        lo, hi = self._type_range()
        if self.kind is RegisterKind.HOLDING and self.dtype is not DataType.STRING:
            out.update(min=self._native_json(self.minimum), max=self._native_json(self.maximum),
                       default=self._native_json(self.default), persist=self.persist)
        elif self.kind is RegisterKind.HOLDING:
            out.update(default=self._native_json(self.default), persist=self.persist)
        elif self.kind is RegisterKind.INPUT:
            if (self.minimum, self.maximum) != (lo, hi) and self.dtype is not DataType.STRING:
                out.update(min=self._native_json(self.minimum),
                           max=self._native_json(self.maximum))
            out["default"] = self._native_json(self.default)
        elif self.kind is RegisterKind.COIL:
            out.update(default=self.default, persist=self.persist)
        elif self.kind is RegisterKind.DISCRETE_INPUT:
            out["default"] = self.default
        elif self.kind is RegisterKind.COMMAND and self.maximum != hi:
            out["max"] = self.maximum
        if self.labels:
            out["labels"] = {s: self._native_json(v) for v, s in self.labels}
        if self.kind is RegisterKind.FAULT:
            out["bits"] = [{"bit": b.bit, "name": b.name, "description": b.description}
                           if b.description else {"bit": b.bit, "name": b.name}
                           for b in self.bits]
        if self.fields:
            out["fields"] = [_field_json(f) for f in self.fields]
        if self.description:
            out["description"] = self.description
        return out


def _field_json(f: BitField) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f.name, "bit": f.bit}
    if f.width != 1:
        out["width"] = f.width
    if f.labels:
        out["labels"] = {s: v for v, s in f.labels}
    if f.description:
        out["description"] = f.description
    return out


def field_view(spec: RegisterSpec, f: BitField) -> RegisterSpec:
    """The bit field ``f`` of ``spec`` as a register of its own: read at the register's address,
    its raw value the field's; writable (by a mask write) when the register is."""
    mask = (1 << f.width) - 1
    return RegisterSpec(address=spec.address, name=f.name, kind=spec.kind,
                        default=(spec.default >> f.bit) & mask, description=f.description,
                        persist=spec.persist, field=f, parent=spec.name)


def _canonical_scale(scale: str) -> str:
    """One text per scale value for the map hash: ``0.10`` is ``0.1``; a scale of 1 is no scale."""
    if not scale or Decimal(scale) == 1:
        return ""
    return format(Decimal(scale).normalize(), "f")


def register(
    address: int, name: str, kind: RegisterKind | str, **options: Any
) -> RegisterSpec:
    """Declare a register; refuses forbidden kinds and unknown options (e.g. ``clear_on_read``)."""
    allowed = {"unit", "minimum", "maximum", "default", "bits", "description", "scale", "labels",
               "persist", "dtype", "word_order", "length", "offset", "fields"}
    unknown = set(options) - allowed
    if unknown:
        raise RegisterSchemaError(
            f"{name}: unknown register option(s) {sorted(unknown)}; a register has no side "
            "effect on read and no increment/toggle behaviour"
        )
    return RegisterSpec(address=address, name=name, kind=parse_kind(kind), **options)


def _c_name(name: str) -> str:
    return re.sub(r"[^A-Z0-9_]", "_", name.upper())


_ENUMS = (
    CEnum("idl_reg_kind_t", "IDL_REG_KIND", CoreKind, "register kinds"),
    CEnum("idl_trigger_state_t", "IDL_TRIGGER", TriggerState, "trigger states"),
)


def _c_number(dtype: DataType, value: int | float) -> str:
    """A C literal of the type's number: ``-400`` for an i16, ``4294967295uL``, ``1.5f``."""
    if isinstance(value, float):
        return repr(value) + ("f" if dtype is DataType.F32 else "")
    suffix = {1: "", 2: "L", 4: "LL"}[dtype.words]
    if value >= 0:
        return f"{value}{suffix}" if dtype.signed else f"{value}u{suffix}"
    if value == integer_range(dtype)[0]:  # -32768 is not a literal: unary minus of 32768
        return f"({value + 1}{suffix} - 1)"
    return f"({value}{suffix})"


def _c_type_note(r: RegisterSpec) -> str:
    """``i16``, ``f32, 2 registers, little word first``: what a typed register's words mean."""
    if r.dtype is DataType.U16:
        return ""
    if r.dtype is DataType.STRING:
        return f" string of {r.length} registers"
    if r.words > 1:
        return f" {r.dtype.value}, {r.words} registers, {r.word_order.value} word first"
    return f" {r.dtype.value}"


def map_defines(regs: Iterable[RegisterSpec]) -> list[CDefine]:
    """Every C define one device's map renders (also used to check the names are unique)."""
    regs = tuple(regs)
    words = sum(r.words for r in regs if r.space is Space.REGISTERS)
    defines: list[CDefine] = [CDefine("IDL_REG_COUNT", f"{words}u", "registers in the map")]
    if any(r.kind is RegisterKind.COMMAND for r in regs):  # not in idl_reg_kind_t: only here
        defines.append(CDefine("IDL_REG_KIND_COMMAND", f"{RegisterKind.COMMAND.value}u",
                               "a plain device's command register (returns to 0 when done); "
                               "the C reference core does not serve it"))
    for r in regs:
        unit = r.unit.replace("°", "deg ").encode("ascii", "replace").decode()
        offset = f" + {r.offset}" if r.offset else ""
        reading = (f", value = raw x {r.scale}{offset} {unit}".rstrip() if r.scale
                   else f", value = raw{offset} {unit}".rstrip() if offset
                   else f", {unit}" if unit else "")
        if r.space is Space.COILS or r.space is Space.DISCRETE_INPUTS:
            prefix = "IDL_COIL_" if r.space is Space.COILS else "IDL_DISCRETE_"
            defines.append(CDefine(f"{prefix}{_c_name(r.name)}", f"0x{r.address:04X}u",
                                   f"{r.kind.name}{reading}"))
            defines += [CDefine(f"{prefix}{_c_name(r.name)}_{_c_name(s)}", f"{v}u", "label")
                        for v, s in r.labels]
            continue
        defines.append(CDefine(f"IDL_REG_{_c_name(r.name)}", f"0x{r.address:04X}u",
                               f"{r.kind.name}{_c_type_note(r)}{reading}"))
        if r.words > 1:
            defines.append(CDefine(f"IDL_REG_{_c_name(r.name)}_WORDS", f"{r.words}u",
                                   "registers the value takes"))
        if r.kind is RegisterKind.HOLDING and r.dtype is DataType.U16:
            defines += [
                CDefine(f"IDL_REG_{_c_name(r.name)}_MIN", f"{r.minimum}u", "raw"),
                CDefine(f"IDL_REG_{_c_name(r.name)}_MAX", f"{r.maximum}u", "raw"),
                CDefine(f"IDL_REG_{_c_name(r.name)}_DEFAULT", f"{r.default}u", "raw"),
            ]
        elif r.kind is RegisterKind.HOLDING and r.dtype is not DataType.STRING:
            for what, raw in (("MIN", r.minimum), ("MAX", r.maximum), ("DEFAULT", r.default)):
                value = r.native(raw)
                if isinstance(value, float) and not math.isfinite(value):
                    continue  # a float without that limit
                defines.append(CDefine(f"IDL_REG_{_c_name(r.name)}_{what}",
                                       _c_number(r.dtype, value), f"raw, as {r.dtype.value}"))
        defines += [CDefine(f"IDL_REG_{_c_name(r.name)}_{_c_name(s)}",
                            f"{v}u" if r.dtype is DataType.U16 else _c_number(r.dtype,
                                                                               r.native(v)),
                            "label")
                    for v, s in r.labels]
        for b in r.bits:
            defines.append(CDefine(f"IDL_FAULT_{_c_name(b.name)}", f"(1u << {b.bit})",
                                   b.description))
        for f in r.fields:
            defines += [
                CDefine(f"IDL_FIELD_{_c_name(f.name)}_SHIFT", f"{f.bit}u",
                        f"bit field of {r.name}" + (f": {f.description}" if f.description
                                                    else "")),
                CDefine(f"IDL_FIELD_{_c_name(f.name)}_MASK", f"0x{f.mask:04X}u",
                        "its bits in place"),
            ]
            defines += [CDefine(f"IDL_FIELD_{_c_name(f.name)}_{_c_name(s)}", f"{v}u", "label")
                        for v, s in f.labels]
    return defines


#: Names the generated map header defines besides ``map_defines`` (reserved: no register or bit
#: may render to one of them).
MAP_FLAG_PERSIST = "IDL_REG_FLAG_PERSIST"
MAP_FLAG_SIGNED = "IDL_REG_FLAG_SIGNED"
MAP_FLAG_FLOAT = "IDL_REG_FLAG_FLOAT"
MAP_FLAG_LITTLE = "IDL_REG_FLAG_LITTLE"
MAP_FLAG_WORDS_SHIFT = "IDL_REG_FLAG_WORDS_SHIFT"
MAP_FLAG_INDEX_SHIFT = "IDL_REG_FLAG_INDEX_SHIFT"
MAP_TYPED = "IDL_REGMAP_TYPED"
MAP_NO_GENERATION = "IDL_REGMAP_NO_GENERATION"
MAP_HEADER_NAMES = ("IDL_MAP_NAME", "IDL_MAP_HASH", "IDL_MAP_HASH_BYTES", MAP_FLAG_PERSIST,
                    MAP_FLAG_SIGNED, MAP_FLAG_FLOAT, MAP_FLAG_LITTLE, MAP_FLAG_WORDS_SHIFT,
                    MAP_FLAG_INDEX_SHIFT, MAP_TYPED, MAP_NO_GENERATION)

#: Trigger answers are 16-bit codes up to 0xFF01: defines (unsigned), not an enum, so a 16-bit-int
#: C compiler takes them too. They belong to the protocol, whatever the device's map.
_PROTOCOL_DEFINES = [CDefine(f"IDL_TRIGGER_STATUS_{s.name}", f"0x{s.value:04X}u",
                             "answer to a trigger write") for s in TriggerStatus]

_SPACE_ORDER = {Space.REGISTERS: 0, Space.COILS: 1, Space.DISCRETE_INPUTS: 2}


@dataclass(frozen=True, slots=True)
class RegisterMap:
    """A validated set of registers, indexed by address (per address space) and by name (the
    registers and their bit fields). ``mask_write``: the device implements FC22 (mask write
    register), so one bit field is written without touching its neighbours."""

    registers: tuple[RegisterSpec, ...]
    name: str = "unnamed"
    description: str = ""
    mask_write: bool = False
    _by_address: Mapping[int, RegisterSpec] = field(init=False, repr=False, compare=False)
    _bits: Mapping[Space, Mapping[int, RegisterSpec]] = field(init=False, repr=False,
                                                              compare=False)
    _by_name: Mapping[str, RegisterSpec] = field(init=False, repr=False, compare=False)
    _hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regs = tuple(sorted(self.registers, key=lambda r: (_SPACE_ORDER[r.space], r.address)))
        spaces: dict[Space, dict[int, RegisterSpec]] = {s: {} for s in Space}
        by_name: dict[str, RegisterSpec] = {}
        for r in regs:
            if r.field is not None:
                raise RegisterSchemaError(f"{r.name}: a bit field is declared in its register")
            table = spaces[r.space]
            for a in r.span:
                if a in table:
                    raise RegisterSchemaError(f"{r.space.value} address {a} declared twice "
                                              f"({table[a].name!r} and {r.name!r})")
                table[a] = r
            views = [r, *(field_view(r, f) for f in r.fields)]
            for v in views:
                if v.name in by_name:
                    raise RegisterSchemaError(f"name {v.name!r} declared twice")
                by_name[v.name] = v
        gens = [r for r in regs if r.kind is RegisterKind.GENERATION]
        if len(gens) > 1:
            raise RegisterSchemaError("a map has at most one GENERATION register (the device's "
                                      "configuration generation counter)")
        bit_owner: dict[str, str] = {}
        for r in regs:
            for b in r.bits:
                if b.name in bit_owner:
                    raise RegisterSchemaError(
                        f"fault bit {b.name!r} declared in {bit_owner[b.name]!r} and {r.name!r}")
                bit_owner[b.name] = r.name
        if not isinstance(self.name, str) or not _MAP_NAME.match(self.name):
            raise RegisterSchemaError(f"map name {self.name!r} must be 1-40 characters of "
                                      "[A-Za-z0-9_.-], starting with a letter or digit")
        seen: set[str] = set()
        for name in [d.name for d in map_defines(regs)] + [d.name for d in _PROTOCOL_DEFINES] + [
            f"{e.prefix}_{m.name}" for e in _ENUMS for m in e.members
        ] + list(MAP_HEADER_NAMES):
            if name in seen:
                raise RegisterSchemaError(
                    f"the C header would define {name} twice; rename the register or bit")
            seen.add(name)
        object.__setattr__(self, "registers", regs)
        object.__setattr__(self, "_by_address", spaces[Space.REGISTERS])
        object.__setattr__(self, "_bits", {s: spaces[s] for s in (Space.COILS,
                                                                  Space.DISCRETE_INPUTS)})
        object.__setattr__(self, "_by_name", by_name)
        meaning: object = [r.identity() for r in regs]
        if self.mask_write:  # only when declared: every map without it hashes as before
            meaning = {"registers": meaning, "mask_write": True}
        identity = json.dumps(meaning, sort_keys=True, separators=(",", ":")).encode()
        object.__setattr__(self, "_hash", hashlib.sha256(identity).digest()[:MAP_HASH_LEN])

    @property
    def hash(self) -> bytes:
        """8 bytes of SHA-256 over what the registers mean (addresses, kinds, limits, bits,
        units, scales, labels, persistence, types, fields; whether the device takes mask
        writes; not the descriptions or the map's name). A device advertises it at HELLO; a
        host refuses a device whose map hash differs from its own."""
        return self._hash

    def __iter__(self) -> Iterator[RegisterSpec]:
        return iter(self.registers)

    def __len__(self) -> int:
        return len(self.registers)

    def at(self, address: int) -> RegisterSpec | None:
        """The register that holds the register address (any of a multi-register value's)."""
        return self._by_address.get(address)

    def addressed(self, address: int) -> RegisterSpec | None:
        """The register a user addresses by ``address``: the value that starts there, or None
        when the map declares nothing there. An address inside a value of several registers
        (the second word of an i32) addresses nothing a user can read or write alone: a write
        there would rewrite the whole value with the number given; ``MidValueAddress`` names the
        value and its first address. The one rule for the CLI's addresses and the API's."""
        spec = self._by_address.get(address)
        if spec is not None and spec.address != address:
            raise MidValueAddress(
                f"0x{address:04X} is word {address - spec.address + 1} of {spec.words} of "
                f"{spec.name} ({spec.dtype.value} at 0x{spec.address:04X}): address it by its "
                f"first register, 0x{spec.address:04X}, or by its name {spec.name}")
        return spec

    def spec_at(self, address: int, space: Space = Space.REGISTERS) -> RegisterSpec | None:
        """What the map declares at ``address`` of ``space`` (registers, coils, discrete
        inputs)."""
        if space is Space.REGISTERS:
            return self._by_address.get(address)
        return self._bits[space].get(address)

    def named(self, name: str) -> RegisterSpec:
        """A register, coil, discrete input or bit field (its view, ``field_view``) by name."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no register named {name!r}") from None

    def of_kind(self, kind: RegisterKind) -> tuple[RegisterSpec, ...]:
        return tuple(r for r in self.registers if r.kind is kind)

    @property
    def generation(self) -> RegisterSpec | None:
        """The configuration generation counter; None when the map has none (a third-party
        device: conditional writes are then refused before anything is sent)."""
        gens = self.of_kind(RegisterKind.GENERATION)
        return gens[0] if gens else None

    @property
    def generation_address(self) -> int | None:
        gen = self.generation
        return gen.address if gen is not None else None

    @property
    def field_views(self) -> tuple[RegisterSpec, ...]:
        """Every bit field, as a register of its own (``field_view``), in register order."""
        return tuple(v for v in self._by_name.values() if v.field is not None)

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.registers]

    def runs(self, addresses: Iterable[int]) -> list[tuple[int, int]]:
        """Contiguous ``(start, count)`` runs covering ``addresses`` (sorted, de-duplicated)."""
        out: list[tuple[int, int]] = []
        for a in sorted(set(addresses)):
            if out and out[-1][0] + out[-1][1] == a:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((a, 1))
        return out


def make_map(specs: Iterable[RegisterSpec], *, name: str = "unnamed",
             description: str = "", mask_write: bool = False) -> RegisterMap:
    return RegisterMap(tuple(specs), name=name, description=description, mask_write=mask_write)


#: Fault bit numbers of the built-in thermal controller's fault word.
FAULT_OVER_TEMPERATURE = 0
FAULT_SENSOR = 1
FAULT_FAN_STALL = 2


def _md_cell(text: str) -> str:
    """Text from the map file as one Markdown table cell (a ``|`` would split the row)."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _typed_notes(r: RegisterSpec) -> str:
    """What a register of the typed map format says beyond a u16's (empty for a u16)."""
    notes = ""
    if r.dtype is DataType.STRING:
        notes += f"; string of {r.length} registers (read-only)"
    elif r.dtype is not DataType.U16:
        notes += f"; {r.dtype.value}"
        if r.words > 1:
            notes += f", {r.words} registers, {r.word_order.value} word first"
    if r.offset:
        notes += f"; offset {r.offset}"
    if r.fields:
        notes += "; fields: " + ", ".join(
            f"{f.bit}{'' if f.width == 1 else f'-{f.bit + f.width - 1}'} {f.name}"
            + (" (" + ", ".join(f"{v} {s}" for v, s in f.labels) + ")" if f.labels else "")
            for f in r.fields)
    return notes


def map_rows(regmap: RegisterMap) -> list[list[object]]:
    """One row per register for the map's Markdown table."""
    rows: list[list[object]] = []
    for r in regmap:
        holding = r.kind is RegisterKind.HOLDING and r.dtype is not DataType.STRING
        notes = r.description + _typed_notes(r)
        if r.bits:
            notes += "; bits: " + ", ".join(f"{b.bit} {b.name}" for b in r.bits)
        if r.labels:
            notes += "; labels: " + ", ".join(f"{r.native_text(v)} {s}" for v, s in r.labels)
        if r.kind in (RegisterKind.HOLDING, RegisterKind.COIL) and not r.persist:
            notes += "; volatile (default again after a reboot)"
        shows_default = holding or r.kind in (RegisterKind.INPUT, *BIT_KINDS)
        default = (r.native_text(r.default) if r.dtype is not DataType.STRING
                   else string_text(r.default, r.words)) if shows_default else ""
        rows.append([f"0x{r.address:04X}", r.name, r.kind.name,
                     r.native_text(r.minimum) if holding else "",
                     r.native_text(r.maximum) if holding else "",
                     default, r.scale, _md_cell(r.unit), _md_cell(notes.lstrip("; "))])
    return rows


def map_markdown(regmap: RegisterMap) -> str:
    """The device's register document (rendered by ``idemlink contract --regmap``)."""
    title = f"# Register map: {regmap.name}\n\n"
    about = f"{regmap.description}\n\n" if regmap.description else ""
    typed = any(r.dtype is not DataType.U16 or r.offset or r.space is not Space.REGISTERS
                for r in regmap)
    more = ""
    if typed:
        more = (" A register of another type than u16 gives min, max and default as its type's "
                "numbers (shown value = number x scale + offset); COIL and DISCRETE_INPUT "
                "addresses are in their own tables.")
    if regmap.generation is None:
        more += " No generation register: conditional writes are refused."
    if regmap.mask_write:
        more += " The device takes mask writes (FC22): one bit field is written alone."
    return (
        title + "<!-- GENERATED by `idemlink contract` from the map file. Do not edit. -->\n\n"
        + about + f"Map hash: `{regmap.hash.hex()}` (a host refuses a device whose map hash "
        f"differs from its own map's). Shown value = raw x scale, in the unit.{more}\n\n"
        + md_table(["address", "name", "kind", "min (raw)", "max (raw)", "default (raw)",
                    "scale", "unit", "notes"], map_rows(regmap))
    )


def contract_section() -> ContractSection:
    """The register model's part of the protocol contract: kinds, trigger states and answers.
    A device's own map (addresses, limits, bits) is not part of it: it has its own hash
    (``RegisterMap.hash``) and its own generated header (``idemlink contract --regmap``)."""
    code_rows = [[f"0x{s.value:04X}", s.name] for s in TriggerStatus]
    md = (
        "## Register model\n\n"
        "One flat 16-bit address space per device, described by its map file (docs/REGMAP.md). "
        "Kinds: INPUT (read-only), HOLDING (set-only, absolute values within min..max), FAULT "
        "(latched; reading never clears; writing 1s clears the bits whose condition has gone), "
        "TRIGGER (one-shot IDLE -> RUNNING -> DONE; 0 resets), GENERATION (read-only; +1 per "
        "effective configuration change, never on a no-op). There is no increment, toggle or "
        "read-to-clear register: the schema refuses them.\n\n"
        "### Trigger answers\n\n"
        + md_table(["code", "name"], code_rows)
    )
    return ContractSection(
        name="registers",
        defines=list(_PROTOCOL_DEFINES),
        enums=list(_ENUMS),
        markdown=md,
        data={
            "kinds": {k.name: k.value for k in CoreKind},
            "trigger_status": {s.name: s.value for s in TriggerStatus},
            "trigger_state": {s.name: s.value for s in TriggerState},
        },
    )
