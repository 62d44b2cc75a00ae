"""``idemlink regmap [FILE] [--json] [--check]``: show, or check, a device's register map.

Contract: ``FILE`` is a map file (TOML or JSON, docs/REGMAP.md) or a built-in map's name; without
it, the built-in thermal controller. The text form is a table (address, name, kind, limits, scale,
unit, labels or bits); ``--json`` prints the map as a JSON map file ``{"schema":
"idemlink.regmap/1", "name", "hash", "description", "registers": [...]}`` that loads back as is
(``idemlink regmap pump-controller --json > pump.json`` exports a built-in map to edit).
``--check`` only validates (the map, and its ``[link]`` table if it has one): it prints
``ok: NAME (N registers, hash H)`` and exits 0, or prints the one-line reason and exits 6
(``--check --json``: one ``idemlink.regmap-check/1`` object, ``{"ok", "name", "hash",
"registers", "reason"}``).
"""

from __future__ import annotations

import argparse
from typing import Any

from idemlink.cli import EXIT_CHECK_FAILED, EXIT_OK, UserError
from idemlink.output import add_json_option, emit, print_json

CHECK_SCHEMA = "idemlink.regmap-check/1"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "regmap", help="show or --check a register map file (default: the built-in map)")
    p.add_argument("file", nargs="?", default=None, metavar="FILE",
                   help="map file (TOML/JSON) or built-in map name (default: thermal-controller)")
    p.add_argument("--regmap", dest="regmap_opt", metavar="FILE", default=None,
                   help="same as FILE")
    add_json_option(p, "idemlink.regmap/1 (with --check: idemlink.regmap-check/1)")
    p.add_argument("--check", action="store_true",
                   help="validate only: exit 0 if the map loads, 6 with the reason if not")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from idemlink.protocol.link_profile import ProfileError, map_link
    from idemlink.protocol.regmap_file import RegmapFileError, map_document, resolve_regmap

    ref = args.file if args.file is not None else args.regmap_opt
    try:
        regmap = resolve_regmap(ref)
        map_link(ref)  # a [link] table a command would refuse makes the file invalid too
    except (RegmapFileError, ProfileError) as exc:
        if args.check:
            emit(args, CHECK_SCHEMA, {"ok": False, "name": None, "hash": None,
                                      "registers": None, "reason": str(exc)},
                 [f"invalid: {exc}"])
            return EXIT_CHECK_FAILED
        raise UserError(str(exc)) from None
    if args.check:
        emit(args, CHECK_SCHEMA, {"ok": True, "name": regmap.name, "hash": regmap.hash.hex(),
                                  "registers": len(regmap), "reason": None},
             [f"ok: {regmap.name} ({len(regmap)} registers, hash {regmap.hash.hex()})"])
        return EXIT_OK
    if args.json:
        doc = map_document(regmap)
        print_json(doc.pop("schema"), doc)
        return EXIT_OK
    print(f"{regmap.name} (hash {regmap.hash.hex()})")
    header = ("address", "name", "kind", "min", "max", "default", "scale", "unit", "values")
    table = [header]
    for r in regmap:
        holding = r.kind.name == "HOLDING" and r.dtype.value != "string"
        values = ", ".join(f"{r.native_text(v)}={s}" for v, s in r.labels) or ", ".join(
            f"{b.bit}:{b.name}" for b in r.bits) or ", ".join(
            f"{f.bit}{'' if f.width == 1 else f'-{f.bit + f.width - 1}'}:{f.name}"
            for f in r.fields)
        if r.type_text:
            values = r.type_text + ("; " + values if values else "")
        if r.offset:
            values = (values + "; " if values else "") + f"offset {r.offset}"
        if r.kind.name in ("HOLDING", "COIL") and not r.persist:
            values = (values + "; " if values else "") + "volatile"
        shows_default = holding or r.kind.name in ("INPUT", "COIL", "DISCRETE_INPUT")
        table.append((f"0x{r.address:04X}", r.name, r.kind.name.lower(),
                      r.native_text(r.minimum) if holding else "",
                      r.native_text(r.maximum) if holding else "",
                      r.shown_default if shows_default else "", r.scale, r.unit, values))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK
