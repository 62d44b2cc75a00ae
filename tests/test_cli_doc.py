"""The marked examples of docs/CLI.md run as written (tests/support/doc_runner.py): commands, outputs,
exit statuses."""

from __future__ import annotations

from pathlib import Path

from support.doc_runner import Session

DOC = Path(__file__).resolve().parent.parent / "docs" / "CLI.md"


def test_cli_md_examples_run_as_written(tmp_path: Path) -> None:
    session = Session(tmp_path)
    session.run_document(DOC.read_text("utf-8"))
    assert session.counts["run"] >= 1 and session.counts["command"] >= 15
