"""The marked examples of docs/REGMAP.md run as written (tests/support/doc_runner.py): a third-party
device's map, read, written, watched and applied through the Modbus RTU simulator."""

from __future__ import annotations

from pathlib import Path

from support.doc_runner import Session

DOC = Path(__file__).resolve().parent.parent / "docs" / "REGMAP.md"


def test_regmap_md_examples_run_as_written(tmp_path: Path) -> None:
    session = Session(tmp_path)
    session.run_document(DOC.read_text("utf-8"))
    assert session.counts["file"] >= 2 and session.counts["run"] >= 1
    assert session.counts["command"] >= 10
