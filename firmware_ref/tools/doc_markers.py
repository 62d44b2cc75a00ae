"""Rewrite the text between a pair of markers in a document: the one rule the firmware's doc
tools (bench_device_docs, board_docs, flash_wear) share. Markers missing: one line on stderr,
exit 1, the document untouched."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def replace_between(doc: Path, begin: str, end: str, body: str) -> None:
    """Put ``body`` between the first ``begin`` ... ``end`` pair of ``doc`` (markers kept)."""
    old = doc.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(old):
        print(f"{doc}: no {begin} ... {end} markers", file=sys.stderr)
        sys.exit(1)
    doc.write_text(pattern.sub(lambda _: f"{begin}\n{body}{end}", old, count=1),
                   encoding="utf-8")
