"""``idemlink clear [BIT...|--mask M] [--register NAME]``: clear latched fault bits (W1C).

Contract: bits by name or number, or ``--mask``; none given: every declared bit. Bit names pick
their fault word; several words need ``--register``; a bit the map does not declare is refused
(one line, exit 1, nothing sent), as ``write`` refuses it. The word is read before and after the
clear (unless the clear is UNKNOWN) and the output says exactly what the device holds
(``clear_notes``): unnamed bits that changed (a plain holding register is not write-1-to-clear),
named bits still latched. A clear that got
no answer is UNKNOWN (exit 5), read back, never re-sent on a Modbus RTU slave.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from idemlink.cli import EXIT_REJECTED, UserError, regmap_from
from idemlink.commands.common import (
    add_rtu_options,
    device_options,
    fault_word_of_bits,
    int_arg,
    not_sent,
    only_register,
    reading_entry,
    result_json,
    schema_of,
)
from idemlink.commands.device_io import finish, link_guarded, open_any_device
from idemlink.commands.faults_cmd import clear_notes, decode_fault_word, fault_line
from idemlink.output import add_json_option, emit
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import REGISTER_MAX, RegisterKind, RegisterSpec


def register(sub: Any) -> None:
    p = sub.add_parser("clear", parents=[device_options()],
                       help="clear latched fault bits (write 1s)")
    add_rtu_options(p)
    p.add_argument("bits", nargs="*", metavar="BIT",
                   help="bit names or numbers (default: every declared bit)")
    p.add_argument("--mask", type=int_arg, metavar="M", help="the bits to clear as a mask")
    p.add_argument("--register", metavar="NAME", help="the fault register (default: the only one)")
    add_json_option(p, "idemlink.clear/1")
    p.set_defaults(handler=link_guarded(run_clear))


def fault_mask(spec: RegisterSpec, bits: Sequence[str], mask: int | None) -> int:
    if bits and mask is not None:
        raise UserError("give bit names or --mask, not both")
    if mask is not None:
        if not 0 < mask <= REGISTER_MAX:
            raise UserError(f"mask {mask:#x} outside 1..0xFFFF")
        return mask
    if not bits:
        return spec.fault_mask
    by_name = {b.name: b.bit for b in spec.bits}
    out = 0
    for text in bits:
        if text in by_name:
            out |= 1 << by_name[text]
            continue
        try:
            n = int(text, 0)
        except ValueError:
            raise UserError(f"no fault bit {text!r} in {spec.name} (bits: "
                            + ", ".join(f"{b.bit} {b.name}" for b in spec.bits) + ")") from None
        if not 0 <= n <= 15:
            raise UserError(f"bit {n} outside 0..15")
        out |= 1 << n
    return out


def run_clear(args: argparse.Namespace) -> int:
    regmap = regmap_from(args)
    register = args.register
    if register is None and args.bits:
        register = fault_word_of_bits(regmap, args.bits)
    spec = only_register(regmap, RegisterKind.FAULT, register, "clear")
    mask = fault_mask(spec, args.bits, args.mask)
    undeclared = mask & ~spec.fault_mask
    if undeclared:
        why = (f"{spec.name}: bits 0x{undeclared:04X} not declared (bits: "
               + ", ".join(f"{b.bit} {b.name}" for b in spec.bits) + ")")
        emit(args, schema_of(args), {"outcome": Outcome.REJECTED.name, "register": spec.name,
                                     "mask": mask, "clear": not_sent(why)},
             [f"REJECTED (checked against the register map, nothing sent): {why}"])
        return EXIT_REJECTED
    with open_any_device(args) as dev:
        first = dev.read(spec.name)  # to tell what the clear changed besides the named bits
        before = first.values[0] if first.ok else None
        r = dev.clear_faults(mask, spec.name)
        doc: dict[str, Any] = {"register": spec.name, "mask": mask, "clear": result_json(r)}
        lines = [f"clear {spec.name} mask 0x{mask:04X}: {r.describe()}"]
        sent = [r]
        if r.outcome is not Outcome.UNKNOWN:
            back = dev.read(spec.name)
            sent.append(back)
            if back.ok:
                after = decode_fault_word(spec, back.values[0])
                doc["after"] = after
                doc["registers"] = [{**reading_entry(spec, back),
                                     "latched": after["latched"]}]
                notes = clear_notes(spec, mask, before, back.values[0])
                if before is not None:
                    doc["before"] = before
                doc["notes"] = notes
                lines.append(fault_line(spec, back.values[0]))
                lines.extend(f"  {note}" for note in notes)
        return finish(args, dev, sent, doc, lines)
