"""The register map: one declaration of every register the device exposes, and its rules.

Contract (every register behaviour that a retry could make harmful is refused by the schema):

- Every register has exactly one ``RegisterKind``: ``INPUT`` (read-only live value), ``HOLDING``
  (set-only configuration with min/max and a unit), ``FAULT`` (latched bits, write 1s to clear),
  ``TRIGGER`` (one-shot action behind IDLE -> RUNNING -> DONE) or ``GENERATION`` (the read-only
  configuration generation counter, an input register).
- There is deliberately no kind for increment, toggle or read-to-clear registers: a retried write
  or a repeated read must never change the outcome. ``RegisterSpec`` refuses such kinds (and
  unknown keyword "behaviours") with ``RegisterSchemaError``.
- All registers share one flat 16-bit address space; the map is validated whole (unique addresses
  and names, exactly one generation counter, min <= default <= max, fault bits in 0..15).
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
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import IntEnum
from fractions import Fraction
from typing import Any

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from idemlink.protocol.outcome import IdemlinkError

_C_SAFE_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_MAP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}\Z")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
MAP_HASH_LEN = 8
MAX_NAME_LEN = 40

REGISTER_MAX = 0xFFFF
ADDRESS_MAX = 0xFFFF


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


@dataclass(frozen=True, slots=True)
class RegisterSpec:
    """One register. ``minimum``/``maximum``/``default`` apply to HOLDING; ``bits`` to FAULT."""

    address: int
    name: str
    kind: RegisterKind
    unit: str = ""
    minimum: int = 0
    maximum: int = REGISTER_MAX
    default: int = 0
    bits: tuple[FaultBit, ...] = ()
    description: str = ""
    scale: str = ""  #: decimal text; shown value = raw * scale ("" = 1, shown as the raw integer)
    labels: tuple[tuple[int, str], ...] = ()  #: (raw value, label) for enumerated values
    persist: bool = True  #: HOLDING only: kept across reboots (else back to default at boot)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_kind(self.kind))
        if not 0 <= self.address <= ADDRESS_MAX:
            raise RegisterSchemaError(f"{self.name}: address {self.address} outside 0..0xFFFF")
        if not isinstance(self.name, str) or not _C_SAFE_NAME.match(self.name):
            raise RegisterSchemaError(f"register name {self.name!r} must be a lower-case "
                                      "ASCII identifier ([a-z][a-z0-9_]*)")
        if len(self.name) > MAX_NAME_LEN:
            raise RegisterSchemaError(
                f"register name {self.name!r} is longer than {MAX_NAME_LEN} characters (its C "
                "macros must stay within the 63 significant characters C99 guarantees)")
        if not 0 <= self.minimum <= self.maximum <= REGISTER_MAX:
            raise RegisterSchemaError(f"{self.name}: need 0 <= min <= max <= 0xFFFF")
        if not self.minimum <= self.default <= self.maximum:
            raise RegisterSchemaError(f"{self.name}: default {self.default} outside min..max")
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
        if self.kind in (RegisterKind.FAULT, RegisterKind.TRIGGER, RegisterKind.GENERATION) and (
            self.default != 0
        ):
            raise RegisterSchemaError(f"{self.name}: a {self.kind.name} register starts at 0")
        if self.scale:
            try:
                scale = Decimal(self.scale)
            except InvalidOperation:
                raise RegisterSchemaError(f"{self.name}: scale {self.scale!r} is not a decimal "
                                          "number") from None
            try:
                check_scale(scale)
            except RegisterSchemaError as exc:
                raise RegisterSchemaError(f"{self.name}: {exc}") from None
            if self.kind in (RegisterKind.FAULT, RegisterKind.TRIGGER, RegisterKind.GENERATION):
                raise RegisterSchemaError(f"{self.name}: a {self.kind.name} register has no scale")
        if self.labels:
            if self.kind not in (RegisterKind.INPUT, RegisterKind.HOLDING):
                raise RegisterSchemaError(f"{self.name}: only INPUT and HOLDING registers have "
                                          "labels (trigger states and fault bits are named)")
            values = [v for v, _ in self.labels]
            texts = [s for _, s in self.labels]
            if len(set(values)) != len(values) or len(set(texts)) != len(texts):
                raise RegisterSchemaError(f"{self.name}: labels and their values must be unique")
            for v, s in self.labels:
                if not isinstance(s, str) or not _LABEL.match(s):
                    raise RegisterSchemaError(
                        f"{self.name}: label {s!r} must be a word ([A-Za-z_][A-Za-z0-9_.-]*), "
                        "so that it cannot be read as a number")
                if type(v) is not int or not self.minimum <= v <= self.maximum:
                    raise RegisterSchemaError(
                        f"{self.name}: label {s!r} = {v!r} outside {self.minimum}..{self.maximum}")
        if not self.persist and self.kind is not RegisterKind.HOLDING:
            raise RegisterSchemaError(f"{self.name}: only HOLDING registers are configuration; "
                                      "persist applies to them alone")

    @property
    def writable(self) -> bool:
        return self.kind in (RegisterKind.HOLDING, RegisterKind.FAULT, RegisterKind.TRIGGER)

    @property
    def fault_mask(self) -> int:
        mask = 0
        for b in self.bits:
            mask |= 1 << b.bit
        return mask

    # ------------------------------------------------------------------ values as people read them
    def label_of(self, raw: int) -> str | None:
        """The map's name for ``raw``: a declared label (``auto``), a trigger's state
        (``RUNNING``), else None (a number, a fault word)."""
        if self.kind is RegisterKind.TRIGGER:
            return TriggerState(raw).name if raw in set(TriggerState) else None
        for v, s in self.labels:
            if v == raw:
                return s
        return None

    def scaled(self, raw: int) -> int | Decimal:
        """The value in the register's unit: ``raw * scale`` (exact), or ``raw`` without a scale."""
        if not self.scale:
            return raw
        return raw * Decimal(self.scale)

    def show(self, raw: int) -> str:
        """``42.0 °C``, ``auto``, ``1200 rpm``, ``RUNNING``, ``0x0005 over_temperature
        fan_stall``: the value as the map describes it (no raw)."""
        if self.kind is RegisterKind.TRIGGER:
            return TriggerState(raw).name if raw in set(TriggerState) else f"state {raw}"
        if self.kind is RegisterKind.FAULT:  # undeclared set bits show as bitN
            declared = {b.bit: b.name for b in self.bits}
            names = [declared.get(i, f"bit{i}") for i in range(16) if raw >> i & 1]
            return " ".join([f"0x{raw:04X}", *(names or ["(none latched)"])])
        label = self.label_of(raw)
        if label is not None:
            return label
        text = str(self.scaled(raw))
        return f"{text} {self.unit}" if self.unit else text

    def typed(self, raw: int) -> str:
        """``30 (15.0 °C)``, ``2 (eco)``, ``80``: the raw value, and how the map reads it when that
        differs — how every command echoes a value it writes."""
        text = self.show(raw)
        return str(raw) if text == str(raw) else f"{raw} ({text})"

    def raw_from_text(self, text: str) -> int:
        """The raw register value for ``text``, as people type it: a label (``auto``; any case,
        ``Auto``, when only one label matches it so); a number
        in the register's unit (``42.5`` with scale 0.1 is raw 425; without a scale the number
        is the raw value); or an explicit raw value, ``raw:420`` or ``0x01A4``/``0b1...``.
        Raises ``ValueError`` naming the register when the text is none of these, falls between
        two steps of the scale, or is outside 0..65535 raw."""
        text = text.strip()
        for v, s in self.labels:
            if s == text:
                return v
        folded = [(v, s) for v, s in self.labels if s.casefold() == text.casefold()]
        if len(folded) == 1:  # ``Eco`` for ``eco``: labels are case-insensitive when unambiguous
            return folded[0][0]
        if folded:
            raise ValueError(f"{self.name}: {text!r} is ambiguous: labels "
                             + ", ".join(s for _, s in folded) + " differ only in case")
        lowered = text.lower()
        if lowered.startswith("raw:") or lowered.startswith(("0x", "0b")):
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
                choices = (f" or one of: {', '.join(s for _, s in self.labels)}"
                           if self.labels else "")
                raise ValueError(f"{self.name}: {text!r} is not a number{choices}")
            if number and number.adjusted() > _TYPED_EXPONENTS[1]:
                raise ValueError(f"{self.name}={text}: outside what a register holds "
                                 f"(raw 0..{REGISTER_MAX})")
            if number and number.adjusted() < _TYPED_EXPONENTS[0]:
                exact = Fraction(1, 2)  # smaller than any scale: between two steps
            else:  # exact (Decimal division would round to 28 digits)
                exact = Fraction(number) / Fraction(Decimal(self.scale or "1"))
            if exact.denominator != 1:
                raise ValueError(
                    f"{self.name}: {text} is not a multiple of the scale {self.scale}"
                    if self.scale else f"{self.name}: {text} is not an integer")
            raw = int(exact)
        if not 0 <= raw <= REGISTER_MAX:
            unit = f" {self.unit}" if self.unit and not lowered.startswith(("raw:", "0x", "0b")) else ""
            raise ValueError(f"{self.name}={text}{unit}: outside what a register holds "
                             f"(raw 0..{REGISTER_MAX})")
        return raw

    def identity(self) -> dict[str, Any]:
        """Everything about the register that changes what its bytes mean (not descriptions, not
        an input's default: that is only the simulator's first reading)."""
        return {
            "address": self.address, "name": self.name, "kind": self.kind.name.lower(),
            "min": self.minimum, "max": self.maximum,
            "default": self.default if self.kind is not RegisterKind.INPUT else 0,
            "unit": self.unit, "scale": _canonical_scale(self.scale), "persist": self.persist,
            "labels": [[v, s] for v, s in self.labels],
            "bits": sorted([b.bit, b.name] for b in self.bits),
        }

    def to_json(self) -> dict[str, Any]:
        """The register as a map file states it (``regmap_file`` reads it back unchanged): the
        fields its kind takes, defaults left out except ``min``/``max``/``default`` of a
        HOLDING register and ``persist``."""
        out: dict[str, Any] = {"address": self.address, "name": self.name,
                               "kind": self.kind.name.lower()}
        if self.unit:
            out["unit"] = self.unit
        if self.scale:
            out["scale"] = self.scale
        if self.kind is RegisterKind.HOLDING:
            out.update(min=self.minimum, max=self.maximum, default=self.default,
                       persist=self.persist)
        elif self.kind is RegisterKind.INPUT:
            if (self.minimum, self.maximum) != (0, REGISTER_MAX):
                out.update(min=self.minimum, max=self.maximum)
            out["default"] = self.default
        if self.labels:
            out["labels"] = {s: v for v, s in self.labels}
        if self.kind is RegisterKind.FAULT:
            out["bits"] = [{"bit": b.bit, "name": b.name, "description": b.description}
                           if b.description else {"bit": b.bit, "name": b.name}
                           for b in self.bits]
        if self.description:
            out["description"] = self.description
        return out


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
               "persist"}
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
    CEnum("idl_reg_kind_t", "IDL_REG_KIND", RegisterKind, "register kinds"),
    CEnum("idl_trigger_state_t", "IDL_TRIGGER", TriggerState, "trigger states"),
)


def map_defines(regs: Iterable[RegisterSpec]) -> list[CDefine]:
    """Every C define one device's map renders (also used to check the names are unique)."""
    regs = tuple(regs)
    defines: list[CDefine] = [CDefine("IDL_REG_COUNT", f"{len(regs)}u", "registers in the map")]
    for r in regs:
        unit = r.unit.replace("°", "deg ").encode("ascii", "replace").decode()
        reading = (f", value = raw x {r.scale} {unit}".rstrip() if r.scale
                   else f", {unit}" if unit else "")
        defines.append(CDefine(f"IDL_REG_{_c_name(r.name)}", f"0x{r.address:04X}u",
                               f"{r.kind.name}{reading}"))
        if r.kind is RegisterKind.HOLDING:
            defines += [
                CDefine(f"IDL_REG_{_c_name(r.name)}_MIN", f"{r.minimum}u", "raw"),
                CDefine(f"IDL_REG_{_c_name(r.name)}_MAX", f"{r.maximum}u", "raw"),
                CDefine(f"IDL_REG_{_c_name(r.name)}_DEFAULT", f"{r.default}u", "raw"),
            ]
        defines += [CDefine(f"IDL_REG_{_c_name(r.name)}_{_c_name(s)}", f"{v}u", "label")
                    for v, s in r.labels]
        for b in r.bits:
            defines.append(CDefine(f"IDL_FAULT_{_c_name(b.name)}", f"(1u << {b.bit})",
                                   b.description))
    return defines


#: Names the generated map header defines besides ``map_defines`` (reserved: no register or bit
#: may render to one of them).
MAP_FLAG_PERSIST = "IDL_REG_FLAG_PERSIST"
MAP_HEADER_NAMES = ("IDL_MAP_NAME", "IDL_MAP_HASH", "IDL_MAP_HASH_BYTES", MAP_FLAG_PERSIST)

#: Trigger answers are 16-bit codes up to 0xFF01: defines (unsigned), not an enum, so a 16-bit-int
#: C compiler takes them too. They belong to the protocol, whatever the device's map.
_PROTOCOL_DEFINES = [CDefine(f"IDL_TRIGGER_STATUS_{s.name}", f"0x{s.value:04X}u",
                             "answer to a trigger write") for s in TriggerStatus]


@dataclass(frozen=True, slots=True)
class RegisterMap:
    """A validated set of registers, indexed by address and by name."""

    registers: tuple[RegisterSpec, ...]
    name: str = "unnamed"
    description: str = ""
    _by_address: Mapping[int, RegisterSpec] = field(init=False, repr=False, compare=False)
    _by_name: Mapping[str, RegisterSpec] = field(init=False, repr=False, compare=False)
    _hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regs = tuple(sorted(self.registers, key=lambda r: r.address))
        by_addr: dict[int, RegisterSpec] = {}
        by_name: dict[str, RegisterSpec] = {}
        for r in regs:
            if r.address in by_addr:
                raise RegisterSchemaError(f"address {r.address} declared twice")
            if r.name in by_name:
                raise RegisterSchemaError(f"name {r.name!r} declared twice")
            by_addr[r.address] = r
            by_name[r.name] = r
        gens = [r for r in regs if r.kind is RegisterKind.GENERATION]
        if len(gens) != 1:
            raise RegisterSchemaError("a map has exactly one GENERATION register")
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
        object.__setattr__(self, "_by_address", by_addr)
        object.__setattr__(self, "_by_name", by_name)
        identity = json.dumps([r.identity() for r in regs], sort_keys=True,
                              separators=(",", ":")).encode()
        object.__setattr__(self, "_hash", hashlib.sha256(identity).digest()[:MAP_HASH_LEN])

    @property
    def hash(self) -> bytes:
        """8 bytes of SHA-256 over what the registers mean (addresses, kinds, limits, bits,
        units, scales, labels, persistence; not the descriptions or the map's name). A device
        advertises it at HELLO; a host refuses a device whose map hash differs from its own."""
        return self._hash

    def __iter__(self) -> Iterator[RegisterSpec]:
        return iter(self.registers)

    def __len__(self) -> int:
        return len(self.registers)

    def at(self, address: int) -> RegisterSpec | None:
        return self._by_address.get(address)

    def named(self, name: str) -> RegisterSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no register named {name!r}") from None

    def of_kind(self, kind: RegisterKind) -> tuple[RegisterSpec, ...]:
        return tuple(r for r in self.registers if r.kind is kind)

    @property
    def generation(self) -> RegisterSpec:
        return self.of_kind(RegisterKind.GENERATION)[0]

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
             description: str = "") -> RegisterMap:
    return RegisterMap(tuple(specs), name=name, description=description)


#: Fault bit numbers of the built-in thermal controller's fault word.
FAULT_OVER_TEMPERATURE = 0
FAULT_SENSOR = 1
FAULT_FAN_STALL = 2


def _md_cell(text: str) -> str:
    """Text from the map file as one Markdown table cell (a ``|`` would split the row)."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


def map_rows(regmap: RegisterMap) -> list[list[object]]:
    """One row per register for the map's Markdown table."""
    rows: list[list[object]] = []
    for r in regmap:
        holding = r.kind is RegisterKind.HOLDING
        notes = r.description
        if r.bits:
            notes += "; bits: " + ", ".join(f"{b.bit} {b.name}" for b in r.bits)
        if r.labels:
            notes += "; labels: " + ", ".join(f"{v} {s}" for v, s in r.labels)
        if holding and not r.persist:
            notes += "; volatile (default again after a reboot)"
        rows.append([f"0x{r.address:04X}", r.name, r.kind.name,
                     r.minimum if holding else "", r.maximum if holding else "",
                     r.default if holding or r.kind is RegisterKind.INPUT else "", r.scale,
                     _md_cell(r.unit), _md_cell(notes.lstrip("; "))])
    return rows


def map_markdown(regmap: RegisterMap) -> str:
    """The device's register document (rendered by ``idemlink contract --regmap``)."""
    title = f"# Register map: {regmap.name}\n\n"
    about = f"{regmap.description}\n\n" if regmap.description else ""
    return (
        title + "<!-- GENERATED by `idemlink contract` from the map file. Do not edit. -->\n\n"
        + about + f"Map hash: `{regmap.hash.hex()}` (a host refuses a device whose map hash "
        "differs from its own map's). Shown value = raw x scale, in the unit.\n\n"
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
            "kinds": {k.name: k.value for k in RegisterKind},
            "trigger_status": {s.name: s.value for s in TriggerStatus},
            "trigger_state": {s.name: s.value for s in TriggerState},
        },
    )
