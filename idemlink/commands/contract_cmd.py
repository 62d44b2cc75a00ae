"""``idemlink contract``: regenerate, or ``--check``, the committed contract artifacts.

With ``--regmap FILE --out DIR`` it renders one device's map instead: ``DIR/idemlink_regmap.h``
(defines and a const register table for the C device core) and ``DIR/<map name>.md``.
``--json`` prints one ``idemlink.contract/1`` object: ``{"check", "drifted", "wrote"}`` (paths).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from idemlink.output import add_json_option, emit

CONTRACT_SCHEMA = "idemlink.contract/1"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "contract", help="regenerate (or --check) the C header, PROTOCOL.md and golden vectors"
    )
    p.add_argument("--check", action="store_true", help="exit 6 and name each drifted file")
    p.add_argument("--root", default=".", help="repository root (default: .)")
    p.add_argument("--regmap", metavar="FILE", default=None,
                   help="render this device's map (C header + register document) instead")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="with --regmap: the directory to write into (created if missing)")
    add_json_option(p, CONTRACT_SCHEMA)
    p.set_defaults(handler=run)


def drifted_files(root: Path) -> list[str]:
    """Committed artifacts whose content differs from a fresh rendering."""
    from idemlink.protocol.contract import render_all

    out = []
    for rel, text in render_all().items():
        path = root / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(rel)
    return out


def run(args: argparse.Namespace) -> int:
    from idemlink.cli import UserError
    from idemlink.protocol.contract import render_all

    if args.regmap is not None or args.out is not None:
        return _run_map(args)
    root = Path(args.root)
    if not (root / "pyproject.toml").is_file():
        raise UserError(f"{root} is not the idemlink repository root (no pyproject.toml)")
    if args.check:
        drifted = drifted_files(root)
        lines = [f"drifted: {rel} (run `idemlink contract` and commit it)" for rel in drifted]
        emit(args, CONTRACT_SCHEMA, {"check": True, "drifted": drifted, "wrote": []},
             lines or ["contract: all generated files are up to date"])
        return 6 if drifted else 0
    wrote: list[str] = []
    for rel, text in render_all().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            wrote.append(rel)
    emit(args, CONTRACT_SCHEMA, {"check": False, "drifted": [], "wrote": wrote},
         [f"wrote {rel}" for rel in wrote])
    return 0


def _run_map(args: argparse.Namespace) -> int:
    import sys

    from idemlink.cli import UserError, regmap_from
    from idemlink.protocol.contract import c_core_unserved, render_map

    if args.regmap is None or args.out is None:
        raise UserError("--regmap FILE and --out DIR go together")
    regmap = regmap_from(args)
    files = render_map(regmap)
    for note in c_core_unserved(regmap):  # the header is still right; the C device is less
        print(f"idemlink contract: note: {note} (firmware_ref/PORTING.md)", file=sys.stderr)
    out = Path(args.out)
    if args.check:
        drifted = [str(out / n) for n, text in files.items()
                   if not (out / n).is_file() or (out / n).read_text(encoding="utf-8") != text]
        lines = [f"drifted: {n} (run `idemlink contract --regmap ... --out ...`)"
                 for n in drifted]
        emit(args, CONTRACT_SCHEMA, {"check": True, "drifted": drifted, "wrote": []},
             lines or ["contract: the map's generated files are up to date"])
        return 6 if drifted else 0
    wrote: list[str] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
            wrote.append(str(out / name))
            if not args.json:  # as it goes: a failure later still shows what was written
                print(f"wrote {out / name}")
    except OSError as exc:
        raise UserError(f"cannot write into {out}: {exc.strerror or exc}") from None
    emit(args, CONTRACT_SCHEMA, {"check": False, "drifted": [], "wrote": wrote}, [])
    return 0
