"""``idemlink contract``: regenerate or check the committed contract artifacts."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "contract", help="regenerate (or --check) the C header, PROTOCOL.md and golden vectors"
    )
    p.add_argument("--check", action="store_true", help="exit 6 and name drifted files")
    p.add_argument("--root", default=".", help="repository root (default: .)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from protocol.contract import check, write_all

    if args.check:
        drifted = check(args.root)
        for name in drifted:
            print(f"drifted: {name} (run `idemlink contract` and commit)")
        return 6 if drifted else 0
    for name in write_all(args.root):
        print(f"wrote {name}")
    return 0
