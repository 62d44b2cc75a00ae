#!/usr/bin/env python3
"""The flash-wear table of PORTING.md, computed here, never typed by hand.

    flash_wear.py PORTING.md

Writes the table between `<!-- flash_wear:begin -->` and `<!-- flash_wear:end -->`. The device
saves its configuration only when a persistent register changes or the generation reaches the
saved ceiling, so `v` volatile-only changes a day cost at most `v / RESERVE` saves (rounded up)
and `p` persistent changes `p`. The saves alternate between two pages (A/B), so each page is
erased half as often; a page's life in years is `endurance × 2 / (saves a day × 365.25)`.
The scenarios and the endurance figures are assumptions to compare with your part's data sheet,
not measurements. `table()` is what the tests compare PORTING.md with.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by a test
from doc_markers import replace_between

BEGIN = "<!-- flash_wear:begin -->"
END = "<!-- flash_wear:end -->"
RESERVE = 64  #: IDL_GENERATION_RESERVE (include/idl_regs.h)
PAGES = 2  #: A/B
ENDURANCES = (10_000, 100_000)  #: erase cycles a page survives (assumed; see your data sheet)
#: (what, persistent changes a day, volatile-only changes a day)
SCENARIOS = (
    ("a setpoint changed 10 times a day", 10, 0),
    ("+ a volatile register written every minute", 10, 1440),
    ("+ a volatile register written every second", 10, 86_400),
    ("a persistent register written every minute", 1440, 0),
)


def saves_per_day(persistent: int, volatile: int, every_write: bool) -> int:
    if every_write:
        return persistent + volatile
    return persistent + math.ceil(volatile / RESERVE)


def years(saves: int, endurance: int) -> str:
    """A page's life: in years, or in days when under one."""
    if saves == 0:
        return "∞"
    days = endurance * PAGES / saves
    return f"{days / 365.25:,.1f} years" if days >= 365.25 else f"{days:,.0f} days"


def table() -> str:
    head = ["| writes a day | saves a day: every write saved | saves a day: this policy | "
            + " | ".join(f"life at {e:,} cycles: every write / this policy" for e in ENDURANCES)
            + " |", "|---|---|---|" + "---|" * len(ENDURANCES)]
    rows = []
    for what, p, v in SCENARIOS:
        before, after = saves_per_day(p, v, True), saves_per_day(p, v, False)
        cells = [f"{years(before, e)} / {years(after, e)}" for e in ENDURANCES]
        rows.append(f"| {what} | {before:,} | {after:,} | " + " | ".join(cells) + " |")
    return "\n".join(head + rows) + "\n"


def replace(doc: Path, body: str) -> None:
    replace_between(doc, BEGIN, END, body)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: flash_wear.py PORTING.md", file=sys.stderr)
        sys.exit(2)
    replace(Path(sys.argv[1]), table())
