"""``idemlink contract``: regenerate, or ``--check``, the committed contract artifacts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "contract", help="regenerate (or --check) the C header, PROTOCOL.md and golden vectors"
    )
    p.add_argument("--check", action="store_true", help="exit 6 and name each drifted file")
    p.add_argument("--root", default=".", help="repository root (default: .)")
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

    root = Path(args.root)
    if not (root / "pyproject.toml").is_file():
        raise UserError(f"{root} is not the idemlink repository root (no pyproject.toml)")
    if args.check:
        drifted = drifted_files(root)
        for rel in drifted:
            print(f"drifted: {rel} (run `idemlink contract` and commit it)")
        if not drifted:
            print("contract: all generated files are up to date")
        return 6 if drifted else 0
    for rel, text in render_all().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
    return 0
