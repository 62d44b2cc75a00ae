"""Benchmark tables live in the docs between markers, written by the benchmarks, never typed.

``replace_between_markers(doc, name, text)`` replaces what stands between
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in ``doc`` with ``text`` (the markers stay);
``SystemExit`` with one line if the markers are missing. ``markdown_table`` formats rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def replace_between_markers(doc: Path, name: str, text: str) -> None:
    begin, end = markers(name)
    old = doc.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(old):
        raise SystemExit(f"{doc}: no {begin} ... {end} markers")
    body = text if text.endswith("\n") else text + "\n"
    doc.write_text(pattern.sub(lambda _: f"{begin}\n{body}{end}", old, count=1), encoding="utf-8")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
