#!/usr/bin/env python3
"""Write the report of `make board-m0plus` into PORTING.md as a table, never typed by hand.

    board_docs.py REPORT PORTING.md

REPORT holds the target's line (`board=m0plus-32k4k profile='...' flash=... stack_total=...`);
the table replaces what stands between `<!-- board_m0plus:begin -->` and
`<!-- board_m0plus:end -->` (the markers stay). Missing markers: one line on stderr, exit 1, the
file untouched. `table(text)` is what the tests compare PORTING.md with.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by a test
from doc_markers import replace_between

BEGIN = "<!-- board_m0plus:begin -->"
END = "<!-- board_m0plus:end -->"


def parse(text: str) -> dict[str, str]:
    line = next(x for x in text.splitlines() if x.startswith("board="))
    return {k: v.strip("'") for k, v in re.findall(r"(\w+)=('[^']*'|\S+)", line)}


def _members(text: str) -> str:
    return "none" if text == "-" else ", ".join(f"`{m}`" for m in text.split(","))


def table(text: str) -> str:
    r = parse(text)
    return "\n".join([
        f"`make -C firmware_ref board-m0plus` (profile `{r['profile']}`, arm-none-eabi-gcc -Os, "
        "Cortex-M0+, linked with --gc-sections):",
        "",
        "| | used | part | left |",
        "|---|---|---|---|",
        f"| flash (code, tables, .data image) | {r['flash']} | {r['flash_budget']} "
        f"(32 KiB less two configuration pages) | {r['flash_free']} |",
        f"| of which newlib-nano ({_members(r['libc_members'])}) + libgcc "
        f"({_members(r['libgcc_members'])}) | {r['libc']} + {r['libgcc']} | | |",
        f"| RAM: .data + .bss (the device's state {r['device_state']}, the RX ring 256) | "
        f"{r['ram_static']} | {r['ram_budget']} | |",
        f"| RAM: the stack reserved | {r['stack_reserved']} | | {r['ram_free']} for the "
        "application |",
        f"| stack measured (-fstack-usage): main path {r['stack_main']} + interrupt "
        f"{r['stack_isr']} | {r['stack_total']} | {r['stack_reserved']} reserved | "
        f"{int(r['stack_reserved']) - int(r['stack_total'])} |",
        "",
        f"The deepest path: `{r['path'].replace('>', ' > ')}`; functions without a figure "
        f"(an allowance of 32 bytes each): {', '.join(f'`{u}`' for u in r['unknown'].split(','))}.",
        "",
    ])


def replace(doc: Path, body: str) -> None:
    replace_between(doc, BEGIN, END, body)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: board_docs.py REPORT PORTING.md", file=sys.stderr)
        sys.exit(2)
    replace(Path(sys.argv[2]), table(Path(sys.argv[1]).read_text(encoding="utf-8")))
