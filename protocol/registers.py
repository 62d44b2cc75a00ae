"""The register map: one declaration of every register the device exposes, and its rules.

Contract (seed 004's Modbus audit, made a schema):

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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table

_C_SAFE_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")

REGISTER_MAX = 0xFFFF
ADDRESS_MAX = 0xFFFF


class RegisterSchemaError(ValueError):
    """A register declaration breaks the schema (a programming error in the map, not a wire error)."""


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
    """The answer to a trigger write (seed 004's codes)."""

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_kind(self.kind))
        if not 0 <= self.address <= ADDRESS_MAX:
            raise RegisterSchemaError(f"{self.name}: address {self.address} outside 0..0xFFFF")
        if not isinstance(self.name, str) or not _C_SAFE_NAME.match(self.name):
            raise RegisterSchemaError(f"register name {self.name!r} must be a lower-case "
                                      "ASCII identifier ([a-z][a-z0-9_]*)")
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

    @property
    def writable(self) -> bool:
        return self.kind in (RegisterKind.HOLDING, RegisterKind.FAULT, RegisterKind.TRIGGER)

    @property
    def fault_mask(self) -> int:
        mask = 0
        for b in self.bits:
            mask |= 1 << b.bit
        return mask

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "address": self.address,
            "name": self.name,
            "kind": self.kind.name.lower(),
            "unit": self.unit,
            "description": self.description,
        }
        if self.kind is RegisterKind.HOLDING:
            out.update(min=self.minimum, max=self.maximum, default=self.default)
        else:
            out.update(min=None, max=None, default=None)
        if self.kind is RegisterKind.FAULT:
            out["bits"] = [{"bit": b.bit, "name": b.name, "description": b.description}
                           for b in self.bits]
        return out


def register(
    address: int, name: str, kind: RegisterKind | str, **options: Any
) -> RegisterSpec:
    """Declare a register; refuses forbidden kinds and unknown options (e.g. ``clear_on_read``)."""
    allowed = {"unit", "minimum", "maximum", "default", "bits", "description"}
    unknown = set(options) - allowed
    if unknown:
        raise RegisterSchemaError(
            f"{name}: unknown register option(s) {sorted(unknown)}; a register has no side "
            "effect on read and no increment/toggle behaviour"
        )
    return RegisterSpec(address=address, name=name, kind=parse_kind(kind), **options)


def _c_name(name: str) -> str:
    return name.upper()


_ENUMS = (
    CEnum("idl_reg_kind_t", "IDL_REG_KIND", RegisterKind, "register kinds"),
    CEnum("idl_trigger_state_t", "IDL_TRIGGER", TriggerState, "trigger states"),
)


def _defines(regs: tuple[RegisterSpec, ...]) -> list[CDefine]:
    """Every C define the map renders (also used to check the names are unique)."""
    defines: list[CDefine] = [CDefine("IDL_REG_COUNT", f"{len(regs)}u", "registers in the map")]
    for r in regs:
        defines.append(CDefine(f"IDL_REG_{_c_name(r.name)}", f"0x{r.address:04X}u",
                               f"{r.kind.name} {r.unit}".strip()))
        if r.kind is RegisterKind.HOLDING:
            defines += [
                CDefine(f"IDL_REG_{_c_name(r.name)}_MIN", f"{r.minimum}u"),
                CDefine(f"IDL_REG_{_c_name(r.name)}_MAX", f"{r.maximum}u"),
                CDefine(f"IDL_REG_{_c_name(r.name)}_DEFAULT", f"{r.default}u"),
            ]
        for b in r.bits:
            defines.append(CDefine(f"IDL_FAULT_{_c_name(b.name)}", f"(1u << {b.bit})",
                                   b.description))
    # Trigger answers are 16-bit codes up to 0xFF01: defines (unsigned), not an enum, so a
    # 16-bit-int C compiler takes them too.
    defines += [CDefine(f"IDL_TRIGGER_STATUS_{s.name}", f"0x{s.value:04X}u",
                        "answer to a trigger write") for s in TriggerStatus]
    return defines


@dataclass(frozen=True, slots=True)
class RegisterMap:
    """A validated set of registers, indexed by address and by name."""

    registers: tuple[RegisterSpec, ...]
    _by_address: Mapping[int, RegisterSpec] = field(init=False, repr=False, compare=False)
    _by_name: Mapping[str, RegisterSpec] = field(init=False, repr=False, compare=False)

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
        seen: set[str] = set()
        for name in [d.name for d in _defines(regs)] + [
            f"{e.prefix}_{m.name}" for e in _ENUMS for m in e.members
        ]:
            if name in seen:
                raise RegisterSchemaError(
                    f"the C header would define {name} twice; rename the register or bit")
            seen.add(name)
        object.__setattr__(self, "registers", regs)
        object.__setattr__(self, "_by_address", by_addr)
        object.__setattr__(self, "_by_name", by_name)

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


def make_map(specs: Iterable[RegisterSpec]) -> RegisterMap:
    return RegisterMap(tuple(specs))


#: Fault bit numbers of the default map's fault word.
FAULT_OVER_TEMPERATURE = 0
FAULT_SENSOR = 1
FAULT_FAN_STALL = 2

#: The default map: a thermal controller. Addresses are contiguous from 0 so that a generic
#: tool (``mbpoll -r 0 -c 9``) can read it all in one request.
DEFAULT_MAP = make_map(
    [
        register(0, "temperature", "input", unit="0.1 degC",
                 description="measured temperature"),
        register(1, "humidity", "input", unit="0.1 %RH", description="measured humidity"),
        register(2, "fan_speed", "input", unit="rpm", description="measured fan speed"),
        register(3, "generation", "generation",
                 description="configuration generation: +1 per effective configuration change"),
        register(4, "threshold", "holding", unit="0.1 degC", minimum=0, maximum=1000,
                 default=350, description="over-temperature threshold"),
        register(5, "mode", "holding", minimum=0, maximum=2, default=1,
                 description="0 off, 1 auto, 2 manual"),
        register(6, "fan_setpoint", "holding", unit="%", minimum=0, maximum=100, default=50,
                 description="fan set-point in manual mode"),
        register(7, "faults", "fault", description="latched faults; write 1s to clear",
                 bits=(FaultBit(FAULT_OVER_TEMPERATURE, "over_temperature",
                                "temperature above threshold"),
                       FaultBit(FAULT_SENSOR, "sensor_fault", "sensor reading invalid"),
                       FaultBit(FAULT_FAN_STALL, "fan_stall", "fan commanded but not turning"))),
        register(8, "self_clean", "trigger",
                 description="self-clean: write 1 to start once, 0 to reset"),
    ]
)


def contract_section(regmap: RegisterMap = DEFAULT_MAP) -> ContractSection:
    """The register map's part of the contract: addresses, kinds, limits, fault bits, codes."""
    defines = _defines(regmap.registers)
    rows = [
        [f"0x{r.address:04X}", r.name, r.kind.name,
         r.minimum if r.kind is RegisterKind.HOLDING else "",
         r.maximum if r.kind is RegisterKind.HOLDING else "",
         r.default if r.kind is RegisterKind.HOLDING else "",
         r.unit, r.description
         + ("; bits: " + ", ".join(f"{b.bit} {b.name}" for b in r.bits) if r.bits else "")]
        for r in regmap
    ]
    code_rows = [[f"0x{s.value:04X}", s.name] for s in TriggerStatus]
    md = (
        "## Register map\n\n"
        "One flat 16-bit address space. Kinds: INPUT (read-only), HOLDING (set-only, absolute "
        "values within min..max), FAULT (latched; reading never clears; writing 1s clears the "
        "bits whose condition has gone), TRIGGER (one-shot IDLE -> RUNNING -> DONE; 0 resets), "
        "GENERATION (read-only; +1 per effective configuration change, never on a no-op). "
        "There is no increment, toggle or read-to-clear register: the schema refuses them.\n\n"
        + md_table(["address", "name", "kind", "min", "max", "default", "unit", "description"],
                   rows)
        + "\n### Trigger answers\n\n"
        + md_table(["code", "name"], code_rows)
    )
    return ContractSection(
        name="registers",
        defines=defines,
        enums=list(_ENUMS),
        markdown=md,
        data={
            "registers": regmap.to_json(),
            "trigger_status": {s.name: s.value for s in TriggerStatus},
            "trigger_state": {s.name: s.value for s in TriggerState},
        },
    )
