"""``idemlink regmap [--json]``: print the device's register map (address, name, kind, limits).

Contract: the map printed is ``idemlink.protocol.registers.DEFAULT_MAP``, the same declaration the device
core, the C header and docs/PROTOCOL.md are built from. ``--json`` prints a JSON list for tools.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from idemlink.cli import EXIT_OK


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("regmap", help="print the register map")
    p.add_argument("--json", action="store_true", help="JSON for tools")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from idemlink.protocol.registers import DEFAULT_MAP

    rows = DEFAULT_MAP.to_json()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    header = ("address", "name", "kind", "min", "max", "unit")
    table = [header] + [
        (f"0x{r['address']:04X}", r["name"], r["kind"],
         "" if r["min"] is None else str(r["min"]),
         "" if r["max"] is None else str(r["max"]), r["unit"])
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK
