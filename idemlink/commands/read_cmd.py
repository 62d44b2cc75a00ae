"""``idemlink read [NAME... | FIRST:LAST... | --all]``: read registers and show them as the map
reads them.

Contract: each NAME (a register name or address) is read by a request of its own; ranges and
``--all`` (``idemlink.commands.selection``) read each run of contiguous registers by one request.
Text: ``name = value`` per register (``shown``); ``--json``: one ``idemlink.read/1`` object
(``registers``, ``values``, ``results``). A read that got no answer is UNKNOWN (exit 5) with no
value, and is not read back (a read changes nothing).
"""

from __future__ import annotations

import argparse
from typing import Any

from idemlink.cli import regmap_from
from idemlink.commands.common import (
    add_rtu_options,
    device_options,
    reading_entry,
    result_json,
    shown,
)
from idemlink.commands.device_io import finish, link_guarded, open_any_device
from idemlink.commands.selection import is_range, select_registers
from idemlink.host.command import raw_in, read_runs
from idemlink.output import add_json_option


def register(sub: Any) -> None:
    p = sub.add_parser("read", parents=[device_options()],
                       help="read registers by name, address or range")
    add_rtu_options(p)
    p.add_argument("registers", nargs="*", metavar="NAME",
                   help="register names, addresses, or inclusive address ranges FIRST:LAST "
                        "(0:9, 0x100:0x10F; addresses without a register skipped); "
                        "default: every register")
    p.add_argument("--all", action="store_true",
                   help="every register of the map, contiguous runs read together")
    add_json_option(p, "idemlink.read/1")
    p.set_defaults(handler=link_guarded(run_read))


def run_read(args: argparse.Namespace) -> int:
    """``read NAME...`` reads each register by its own request; ``--all`` and ranges read each
    run of contiguous registers by one request."""
    regmap = regmap_from(args)
    specs = select_registers(regmap, args.registers, args.all)
    in_runs = args.all or any(is_range(r) for r in args.registers)
    groups = read_runs(specs) if in_runs else [[s] for s in specs]
    with open_any_device(args) as dev:
        results = dev.run([dev.read_covering(g) for g in groups])
        registers: list[dict[str, Any]] = []
        values: dict[str, int] = {}
        per: dict[str, Any] = {}
        lines: list[str] = []
        width = max(len(s.name) for s in specs)
        for group, r in zip(groups, results, strict=True):
            for s in group:
                per[s.name] = {"address": s.address, **result_json(r)}
                raw = raw_in(s, r.command, r.values) if r.ok else None
                registers.append(reading_entry(s, r, raw))
                if raw is not None:
                    values[s.name] = raw
                    per[s.name]["value"] = raw
                    per[s.name]["shown"] = s.show(raw)
                    lines.append(f"{s.name:<{width}} = {shown(s, raw)}")
                else:
                    lines.append(f"{s.name:<{width}} : {r.describe()}")
        doc: dict[str, Any] = {"registers": registers, "values": values, "results": per}
        return finish(args, dev, results, doc, lines)
