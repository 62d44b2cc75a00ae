"""The plan format of ``idemlink apply``: set-only writes that converge, one-shot steps journaled.

Contract.

- A plan is one JSON object (``load_plan``/``parse_plan``)::

      {"format": "idemlink.plan", "version": 1, "name": "summer-profile",
       "steps": [{"write": {"threshold": "40.0", "mode": 2}},
                 {"write_if_generation": {"fan_setpoint": 80}},
                 {"trigger": "self_clean"},
                 {"clear": {"faults": ["over_temperature"]}}]}

  ``format`` and ``version`` are optional (if present they must be these); ``name`` defaults to
  the file name without ``.json``. Each step is an object with exactly one of:

  - ``write``: ``{NAME: VALUE, ...}``, one atomic write (``atomic_writes``): HOLDING registers
    at contiguous addresses (a value of several registers counts all of them), coils at
    contiguous addresses, or bit fields of one register (a mask write: the map must say
    ``mask_write``). Set-only: the runner reads them back and writes only those that differ, so
    applying it again, or to another device, converges; it needs no journal.
  - ``write_if_generation``: the same shape (registers only); written only if the device's
    generation counter still equals the generation this run observed (read at the start of the
    run, plus one for each write of this run that changed the device): nobody else changed the
    configuration meanwhile. Refused when the map has no generation register.
  - ``trigger``: a TRIGGER register's name; starts its one-shot action.
  - ``clear``: ``{FAULT_REGISTER: [BIT_NAME, ...]}`` (exactly one register, bit names as the
    map declares them): clears those latched bits (W1C).

  The last three are one-shot: run at most once per device, recorded in the receipt journal keyed
  by (device id, step key).
- Values mean what they mean on the command line: a string as typed there (``"42.5"`` in the
  register's unit, a label such as ``"auto"``, ``"raw:420"`` for the raw value;
  ``RegisterSpec.raw_from_text``), or a bare JSON number, read in the register's unit too. A
  bare number is refused (``PlanError`` with the hint ``use "40.0" for the unit or "raw:400"``)
  for a register with a scale or an offset, where it was the raw value before this rule: it
  would change meaning silently. For every other register (no scale, no offset: the unit is the
  raw value for a u16) a bare number is unambiguous. Booleans are refused, and an integer too long
  to convert is refused naming its step and register (``protocol.long_integers``). The map
  resolves every name (``PlanError`` naming the known ones otherwise). ``map_refusals`` says which
  writes the map already shows to be out of range or read-only.
- A one-shot step's key is ``step_key(KeySource.PLAN_STEP, name, index, content)`` with content
  ``trigger:ADDR``, ``clear:ADDR=MASK`` or ``write_if_generation:ADDR=VALUE,...`` (decimal,
  by address): the same step of the same plan has the same key on every run; an edited step is a
  new step. The device id is not in the key: the journal scopes keys by device.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from pathlib import Path

from idemlink.host.command import CommandBuilder, atomic_writes
from idemlink.host.keys import KeySource, step_key
from idemlink.protocol.long_integers import LongIntegerError, load_json
from idemlink.protocol.outcome import IdemlinkError, LocalProtocolError
from idemlink.protocol.registers import RegisterKind, RegisterMap, RegisterSpec, Space
from idemlink.protocol.regular_file import FileRefused, Problem, read_regular_file

__all__ = [
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "Plan",
    "PlanError",
    "PlanStep",
    "StepKind",
    "bare_number",
    "load_plan",
    "map_refusals",
    "parse_plan",
]

PLAN_FORMAT = "idemlink.plan"
PLAN_VERSION = 1


class PlanError(IdemlinkError, ValueError):
    """A plan file that cannot be read or does not follow the format (one line, names the step)."""


class StepKind(Enum):
    WRITE = "write"
    WRITE_IF_GENERATION = "write_if_generation"
    TRIGGER = "trigger"
    CLEAR = "clear"


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One step. ``writes`` for the two write kinds (sorted by address); ``register`` for a
    trigger or a clear; ``mask`` the bits of a clear; ``key`` for one-shot steps only."""

    index: int  #: 0-based position in the plan
    kind: StepKind
    writes: tuple[tuple[RegisterSpec, int], ...] = ()
    register: RegisterSpec | None = None
    mask: int = 0
    key: uuid.UUID | None = None

    @property
    def one_shot(self) -> bool:
        return self.kind is not StepKind.WRITE

    @property
    def values(self) -> dict[str | int, int]:
        return {spec.name: value for spec, value in self.writes}

    def text(self) -> str:
        """The step as a line shows it: ``threshold=400 (40.0 °C) mode=2 (manual)``, ``trigger
        self_clean``... (values echoed as ``write`` echoes them, ``RegisterSpec.typed``)"""
        assigned = " ".join(f"{s.name}={s.typed(v)}" for s, v in self.writes)
        if self.kind is StepKind.WRITE:
            return assigned
        if self.kind is StepKind.WRITE_IF_GENERATION:
            return f"if-generation {assigned}"
        assert self.register is not None
        if self.kind is StepKind.TRIGGER:
            return f"trigger {self.register.name}"
        bits = [b.name for b in self.register.bits if self.mask >> b.bit & 1]
        return f"clear {self.register.name} {','.join(bits)}"

    def to_json(self) -> dict[str, object]:
        if self.kind in (StepKind.WRITE, StepKind.WRITE_IF_GENERATION):
            return {self.kind.value: {s.name: v for s, v in self.writes}}
        assert self.register is not None
        if self.kind is StepKind.TRIGGER:
            return {"trigger": self.register.name}
        return {"clear": {self.register.name: [b.name for b in self.register.bits
                                                 if self.mask >> b.bit & 1]}}


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    steps: tuple[PlanStep, ...]

    @property
    def one_shot(self) -> tuple[PlanStep, ...]:
        return tuple(s for s in self.steps if s.one_shot)


MAX_PLAN_BYTES = 1 << 20
MAX_PLAN_STEPS = 1024


def load_plan(path: str | Path, regmap: RegisterMap) -> Plan:
    """Read and validate the plan file at ``path``; ``PlanError`` for anything wrong."""
    p = Path(path)
    try:
        raw = read_regular_file(p, MAX_PLAN_BYTES, follow_symlinks=True).decode("utf-8")
    except FileRefused as exc:
        if exc.problem in (Problem.TOO_LARGE, Problem.GREW):
            raise PlanError(f"plan {path}: {exc.size} bytes; a plan is at most "
                            f"{MAX_PLAN_BYTES}") from None
        if exc.problem is Problem.NOT_REGULAR:
            raise PlanError(f"cannot read plan {path}: not a regular file") from None
        raise PlanError(f"cannot read plan {path}: {exc.__cause__}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"cannot read plan {path}: {exc}") from None
    try:
        doc = load_json(raw)
    except LongIntegerError as exc:
        raise PlanError(f"plan {path}: {exc}") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise PlanError(f"plan {path} is not JSON: {reason}") from None
    return parse_plan(doc, regmap, default_name=p.name.removesuffix(".json"), where=f"plan {path}")


def parse_plan(doc: object, regmap: RegisterMap, *, default_name: str = "plan",
               where: str = "plan") -> Plan:
    """Validate a decoded plan document against ``regmap``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list) or not doc["steps"]:
        raise PlanError(f"{where}: expected an object with a non-empty \"steps\" list")
    if doc.get("format", PLAN_FORMAT) != PLAN_FORMAT or doc.get("version", 1) != PLAN_VERSION:
        raise PlanError(f"{where}: format must be {PLAN_FORMAT!r} version {PLAN_VERSION}")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise PlanError(f"{where}: \"name\" must be a non-empty string")
    if len(doc["steps"]) > MAX_PLAN_STEPS:
        raise PlanError(f"{where}: {len(doc['steps'])} steps; a plan has at most "
                        f"{MAX_PLAN_STEPS} (the journal's limit)")
    steps = tuple(_step(i, raw, regmap, name, f"{where} step {i + 1}")
                  for i, raw in enumerate(doc["steps"]))
    return Plan(name, steps)


_SHAPES = ('{"write": {NAME: VALUE, ...}}, {"write_if_generation": {NAME: VALUE, ...}}, '
           '{"trigger": NAME} or {"clear": {FAULT_REGISTER: [BIT, ...]}}')


def _step(index: int, raw: object, regmap: RegisterMap, plan: str, where: str) -> PlanStep:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise PlanError(f"{where}: expected one of {_SHAPES}")
    (verb, body), = raw.items()
    try:
        kind = StepKind(verb)
    except ValueError:
        raise PlanError(f"{where}: unknown step {verb!r}; expected one of {_SHAPES}") from None
    if kind in (StepKind.WRITE, StepKind.WRITE_IF_GENERATION):
        writes = _writes(body, regmap, where, verb)
        if kind is StepKind.WRITE:
            return PlanStep(index, kind, writes)
        content = "write_if_generation:" + ",".join(f"{s.address}={v}" for s, v in writes)
        return PlanStep(index, kind, writes, key=step_key(KeySource.PLAN_STEP, plan, index,
                                                          content))
    if kind is StepKind.TRIGGER:
        if not isinstance(body, str):
            raise PlanError(f"{where}: expected {{\"trigger\": NAME}}")
        spec = _named(regmap, body, RegisterKind.TRIGGER, where, also=RegisterKind.COMMAND)
        return PlanStep(index, kind, register=spec,
                        key=step_key(KeySource.PLAN_STEP, plan, index, f"trigger:{spec.address}"))
    if not isinstance(body, dict) or len(body) != 1:
        raise PlanError(f"{where}: expected {{\"clear\": {{FAULT_REGISTER: [BIT, ...]}}}}")
    (reg, bits), = body.items()
    spec = _named(regmap, reg, RegisterKind.FAULT, where)
    mask = _mask(spec, bits, where)
    return PlanStep(index, kind, register=spec, mask=mask,
                    key=step_key(KeySource.PLAN_STEP, plan, index,
                                 f"clear:{spec.address}={mask}"))


def _named(regmap: RegisterMap, name: str, kind: RegisterKind, where: str,
           also: RegisterKind | None = None) -> RegisterSpec:
    """The register ``name`` of ``kind`` (or ``also``: a trigger step also starts a plain
    device's command register)."""
    try:
        spec = regmap.named(name)
    except KeyError:
        known = ", ".join(r.name for r in regmap.of_kind(kind)) or "none"
        raise PlanError(f"{where}: no {kind.name.lower()} register {name!r} in the map "
                        f"{regmap.name} ({kind.name.lower()} registers: {known})") from None
    if spec.kind is not kind and (also is None or spec.kind is not also):
        raise PlanError(f"{where}: {spec.name} is a {spec.kind.name} register, not {kind.name}")
    return spec


def _mask(spec: RegisterSpec, bits: object, where: str) -> int:
    declared = {b.name: b.bit for b in spec.bits}
    names = ", ".join(declared) or "none"
    if not isinstance(bits, list) or not bits or not all(isinstance(b, str) for b in bits):
        raise PlanError(f"{where}: expected a non-empty list of {spec.name} bit names ({names})")
    mask = 0
    for name in bits:
        if name not in declared:
            raise PlanError(f"{where}: no fault bit {name!r} in {spec.name} (bits: {names})")
        if mask >> declared[name] & 1:
            raise PlanError(f"{where}: bit {name} named twice")
        mask |= 1 << declared[name]
    return mask


def bare_number(spec: RegisterSpec, value: int | float) -> int:
    """The raw value of a bare JSON number for ``spec``: in the register's unit, as on the
    command line; ``ValueError`` (with the hint) for a register with a scale or offset, where a
    bare number once meant the raw value."""
    if (spec.scale and Decimal(spec.scale) != 1) or (spec.offset and Decimal(spec.offset)):
        text = repr(value) if isinstance(value, float) else str(value)
        if type(value) is int and 0 <= value <= spec.raw_max:  # it may have meant either
            use = (f"\"{spec.scaled(value)}\" for {spec.show(value)} or \"raw:{value}\" for the "
                   "raw value")
        else:  # negative, a fraction or too large: never a raw value, so the unit was meant
            use = f"the string \"{text}\" for {text}{f' {spec.unit}' if spec.unit else ''}"
        raise ValueError(f"{spec.name}={text}: a bare number is ambiguous for a register with a "
                         f"scale or offset (it was the raw value in plans before): use {use}")
    return spec.raw_from_text(repr(value) if isinstance(value, float) else str(value))


def _writes(body: object, regmap: RegisterMap, where: str,
            verb: str) -> tuple[tuple[RegisterSpec, int], ...]:
    if not isinstance(body, dict) or not body:
        raise PlanError(f"{where}: expected {{{verb!r}: {{NAME: VALUE, ...}}}}")
    out: list[tuple[RegisterSpec, int]] = []
    for name, value in body.items():
        try:
            spec = regmap.named(name)
        except KeyError:
            known = ", ".join(r.name for r in regmap if r.writable)
            raise PlanError(f"{where}: no register {name!r} in the map {regmap.name} "
                            f"(settable: {known})") from None
        if spec.kind is RegisterKind.FAULT:
            raise PlanError(f"{where}: {spec.name} is a fault word: use a \"clear\" step")
        if spec.kind is RegisterKind.TRIGGER:
            raise PlanError(f"{where}: {spec.name} is a trigger: use a \"trigger\" step")
        if spec.kind is RegisterKind.COMMAND:  # re-applied after it returned to 0: a restart
            raise PlanError(f"{where}: {spec.name} is a command register (it returns to 0 when "
                            "done, so writing it again starts it again): use a \"trigger\" step")
        try:
            if isinstance(value, str):  # as typed on the command line: label, unit, raw:N
                raw = spec.raw_from_text(value)
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name}={value!r}: give a number in the register's unit or a "
                                 "string as typed on the command line (\"42.5\", a label, "
                                 "\"raw:420\")")
            else:
                raw = bare_number(spec, value)
        except ValueError as exc:
            raise PlanError(f"{where}: {exc}") from None
        out.append((spec, raw))
    out.sort(key=lambda sv: (sv[0].space is not Space.REGISTERS, sv[0].address))
    try:
        groups = atomic_writes(out)
    except LocalProtocolError as exc:
        raise PlanError(f"{where}: {exc}") from None
    if len(groups) != 1:
        raise PlanError(f"{where}: a step is one atomic write: registers at contiguous "
                        "addresses, coils at contiguous addresses, or bit fields of one register")
    builder = CommandBuilder(regmap)
    values: dict[str | int, int | str] = {s.name: v for s, v in out}
    try:  # what the device could not be sent is refused now, with its reason
        if verb == StepKind.WRITE_IF_GENERATION.value:
            builder.write_if_generation_command(0, values)
        elif all(s.writable for s, _ in out):
            builder.write_command(values)
    except LocalProtocolError as exc:
        raise PlanError(f"{where}: {exc}") from None
    return tuple(out)


def map_refusals(plan: Plan) -> list[tuple[PlanStep, str]]:
    """Each write the map already shows to be invalid (read-only, out of range), with why."""
    out: list[tuple[PlanStep, str]] = []
    for step in plan.steps:
        for spec, value in step.writes:
            if not spec.writable:
                out.append((step, f"{spec.name} is a read-only {spec.kind.name} register"))
            elif spec.kind is RegisterKind.HOLDING and not spec.in_range(value):
                out.append((step, f"{spec.name}={spec.raw_text(value)} outside "
                                  f"{spec.limits_text()}"))
    return out

