"""``idemlink write NAME=VALUE... [--if-generation G] [--no-check]``: set absolute values.

Contract: values are typed as the map reads them (``parse_value``); fault words and triggers are
refused with a pointer to ``clear`` / ``trigger`` (exit 1). A write the register map already
shows to be invalid (out of range, read-only register) is REJECTED without being sent (exit 4;
``--no-check`` sends it and lets the device refuse it). Registers at contiguous addresses are one
atomic write (a value of several registers, a u32 say, all of its words), coils at contiguous
addresses another, a register's bit fields a mask write (FC22) when the map says the device takes
it, else refused (exit 1, nothing sent: writing the field alone would rewrite its neighbours).
``--if-generation G`` is the conditional write (NOT_EXECUTED, exit 3, when the generation moved;
refused, exit 1, when the map has no generation register). After an UNKNOWN, what the write
touched is read back and reported.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from idemlink.cli import EXIT_REJECTED, UserError, regmap_from
from idemlink.commands.common import (
    add_rtu_options,
    device_options,
    int_arg,
    not_sent,
    parse_value,
    result_json,
    schema_of,
)
from idemlink.commands.device_io import finish, link_guarded, open_any_device
from idemlink.commands.selection import resolve
from idemlink.host.command import CommandBuilder, atomic_writes
from idemlink.output import add_json_option, emit, register_entry
from idemlink.protocol.datatypes import DataType
from idemlink.protocol.outcome import LocalProtocolError, Outcome
from idemlink.protocol.registers import REGISTER_MAX, RegisterKind, RegisterMap, RegisterSpec


def register(sub: Any) -> None:
    p = sub.add_parser("write", parents=[device_options()], help="set registers: NAME=VALUE...")
    add_rtu_options(p)
    p.add_argument("assignments", nargs="+", metavar="NAME=VALUE", type=assignment_syntax,
                   help="a register and its value as the map reads it (42.0, auto, raw:420)")
    add_json_option(p, "idemlink.write/1")
    p.add_argument("--if-generation", type=int_arg, metavar="G",
                   help="write only if the generation counter still equals G (else exit 3)")
    p.add_argument("--no-check", action="store_true",
                   help="send even what the register map shows to be invalid")
    p.set_defaults(handler=link_guarded(run_write))


def assignment_syntax(text: str) -> str:
    """An argument shaped ``NAME=VALUE`` (both sides non-empty): anything else is a usage error
    (exit 2) before the map is even read; what the name and value mean is checked later."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return text


@dataclass(frozen=True, slots=True)
class Assignment:
    spec: RegisterSpec
    value: int


def parse_assignments(regmap: RegisterMap, items: Sequence[str]) -> list[Assignment]:
    out: list[Assignment] = []
    seen: set[str] = set()
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name or not text:
            raise UserError(f"{item!r}: expected NAME=VALUE")
        spec = resolve(regmap, name.strip())
        if spec.name in seen:
            raise UserError(f"{spec.name} assigned twice")
        seen.add(spec.name)
        if spec.kind is RegisterKind.FAULT:
            raise UserError(f"{spec.name} is a fault word: use `idemlink clear`")
        if spec.kind is RegisterKind.TRIGGER:
            raise UserError(f"{spec.name} is a trigger: use `idemlink trigger`")
        if spec.dtype is DataType.STRING:
            raise UserError(f"{spec.name} is a read-only string register")
        value = parse_value(spec, text)
        if not 0 <= value <= spec.raw_max:
            raise UserError(f"{spec.name}={value}: a register holds 0..{REGISTER_MAX}")
        out.append(Assignment(spec, value))
    return out


def map_refusal(a: Assignment) -> str | None:
    """Why the register map already shows this write to be invalid, or None."""
    s = a.spec
    if not s.writable:
        kind = f"{s.kind.name} register" if s.field is None else f"{s.kind.name} register's field"
        return f"{s.name} is a read-only {kind}"
    if s.kind is RegisterKind.HOLDING and not s.in_range(a.value):
        return f"{s.name}={_typed(a)} outside {s.limits_text()}"
    return None


def contiguous_runs(assignments: Sequence[Assignment]) -> list[list[Assignment]]:
    """Group into atomic writes (``atomic_writes``): registers at contiguous addresses (FC06 or
    FC16), coils at contiguous addresses (FC05 or FC15), the bit fields of one register (FC22)."""
    by_spec = {a.spec.name: a for a in assignments}
    try:
        groups = atomic_writes([(a.spec, a.value) for a in assignments])
    except LocalProtocolError as exc:  # a register and its own field: assigned twice
        raise UserError(f"{exc}; nothing was sent") from None
    return [[by_spec[spec.name] for spec, _ in group] for group in groups]


def _typed(a: Assignment) -> str:
    """``420`` or ``4200 (420.0 °C)``: the raw value, and how the map reads it if that differs."""
    return a.spec.typed(a.value)


def _fmt(run: Sequence[Assignment]) -> str:
    return " ".join(f"{a.spec.name}={_typed(a)}" for a in run)


def run_write(args: argparse.Namespace) -> int:
    regmap = regmap_from(args)
    assignments = parse_assignments(regmap, args.assignments)
    runs = contiguous_runs(assignments)
    if args.if_generation is not None:
        if len(runs) != 1:
            raise UserError("--if-generation needs registers at contiguous addresses "
                            "(one atomic conditional write)")
        if not 0 <= args.if_generation <= REGISTER_MAX:
            raise UserError(f"generation {args.if_generation} outside 0..{REGISTER_MAX}")
    builder = CommandBuilder(regmap)  # what cannot be sent at all: one line, before the port
    try:
        for run in runs:
            values: dict[str | int, int | str] = {a.spec.name: a.value for a in run}
            if args.if_generation is not None:
                builder.write_if_generation_command(args.if_generation, values)
            else:
                builder.write_command(values)
    except LocalProtocolError as exc:
        raise UserError(str(exc)) from None
    if not args.no_check:
        refusals = [(a, why) for a in assignments if (why := map_refusal(a)) is not None]
        if refusals:
            emit(args, schema_of(args), {
                "outcome": Outcome.REJECTED.name,
                "registers": [register_entry(a.spec, a.value) for a, _ in refusals],
                "writes": [{"registers": [register_entry(a.spec, a.value)], **not_sent(why)}
                           for a, why in refusals]},
                 [f"REJECTED (checked against the register map, nothing sent): {why}"
                  for _, why in refusals])
            return EXIT_REJECTED
    with open_any_device(args) as dev:
        if args.if_generation is not None:
            guarded: dict[str | int, int] = {a.spec.name: a.value for a in runs[0]}
            results = [dev.write_if_generation(args.if_generation, guarded)]
        else:
            results = dev.run([dev.write_command({a.spec.name: a.value for a in run})
                               for run in runs])
        writes: list[dict[str, Any]] = []
        lines: list[str] = []
        for run, r in zip(runs, results, strict=True):
            entry = {"registers": [register_entry(a.spec, a.value) for a in run],
                     **result_json(r)}
            line = f"{_fmt(run)}: {r.describe()}"
            if args.if_generation is not None and r.code is not None:
                entry["generation"] = r.code
                line += f" (generation {'now' if r.ok else 'is'} {r.code})"
            writes.append(entry)
            lines.append(line)
        doc: dict[str, Any] = {"registers": [register_entry(a.spec, a.value)
                                             for run in runs for a in run], "writes": writes}
        return finish(args, dev, results, doc, lines)
