"""``idemlink faults``: read every fault word and name its latched bits (reading never clears).

Contract: text ``faults = 0x0001  over_temperature``; ``--json`` one ``idemlink.faults/1`` object
(``registers`` with ``latched``, and ``faults`` keyed by fault word, ``decode_fault_word``). A set
bit the map does not declare shows as ``bitN``.
"""

from __future__ import annotations

import argparse
from typing import Any

from idemlink.cli import UserError, regmap_from
from idemlink.commands.common import (
    add_rtu_options,
    device_options,
    no_register_of_kind,
    reading_entry,
    result_json,
)
from idemlink.commands.device_io import finish, link_guarded, open_any_device
from idemlink.output import add_json_option
from idemlink.protocol.registers import RegisterKind, RegisterSpec


def register(sub: Any) -> None:
    p = sub.add_parser("faults", parents=[device_options()],
                       help="read the fault words, bit by bit")
    add_rtu_options(p)
    add_json_option(p, "idemlink.faults/1")
    p.set_defaults(handler=link_guarded(run_faults))


def decode_fault_word(spec: RegisterSpec, value: int) -> dict[str, Any]:
    """The named bits of a fault word (undeclared set bits appear as ``bitN``)."""
    declared = {b.bit: b.name for b in spec.bits}
    latched = [declared.get(i, f"bit{i}") for i in range(16) if value >> i & 1]
    return {"value": value, "latched": latched,
            "bits": {b.name: bool(value >> b.bit & 1) for b in spec.bits}}


def fault_line(spec: RegisterSpec, value: int) -> str:
    """``faults = 0x0003 over_temperature fan_stall``: as ``read`` shows it (``RegisterSpec.show``)."""
    return f"{spec.name} = {spec.show(value)}"


def clear_notes(spec: RegisterSpec, mask: int, before: int | None, after: int) -> list[str]:
    """What a clear of ``mask`` did, judged from the word read before (None: not read) and after.

    A bit the user did not name that changed is said (``low_flow changed 1→0: this device does
    not treat the word as write-1-to-clear`` — a plain holding register stores the mask written);
    a named bit still set is "still latched: the condition persists" only on a device that
    kept the unnamed bits, else it is the 1 just written, which says nothing about the condition."""
    notes: list[str] = []
    not_w1c = False
    if before is not None:
        for bit in range(16):
            if mask >> bit & 1 or not (before ^ after) >> bit & 1:
                continue
            old = before >> bit & 1
            name = decode_fault_word(spec, 1 << bit)["latched"][0]
            if old:
                not_w1c = True
                notes.append(f"{name} changed 1→0: this device does not treat the word as "
                             "write-1-to-clear")
            else:
                notes.append(f"{name} changed 0→1: latched meanwhile")
    still = decode_fault_word(spec, after & mask)["latched"]
    if still and not_w1c:
        notes.append(f"{', '.join(still)} reads 1: the device stored the 1 written, which says "
                     "nothing about the condition")
    elif still:
        notes.append(f"{', '.join(still)} still latched: the condition persists")
    return notes


def run_faults(args: argparse.Namespace) -> int:
    regmap = regmap_from(args)
    specs = regmap.of_kind(RegisterKind.FAULT)
    if not specs:
        raise UserError(no_register_of_kind(regmap, RegisterKind.FAULT))
    with open_any_device(args) as dev:
        results = dev.run([dev.read_command(s.address) for s in specs])
        faults: dict[str, Any] = {}
        registers: list[dict[str, Any]] = []
        lines: list[str] = []
        for s, r in zip(specs, results, strict=True):
            registers.append(reading_entry(s, r))
            if r.ok:
                registers[-1]["latched"] = decode_fault_word(s, r.values[0])["latched"]
                faults[s.name] = decode_fault_word(s, r.values[0])
                lines.append(fault_line(s, r.values[0]))
            else:
                faults[s.name] = result_json(r)
                lines.append(f"{s.name}: {r.describe()}")
        return finish(args, dev, results, {"registers": registers, "faults": faults}, lines)
