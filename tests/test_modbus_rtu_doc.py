"""The marked examples of docs/MODBUS_RTU.md run as written (tests/support/doc_runner.py): the
"Test your application against your device's map" section's map, application and pytest file,
run with the plain-slave fixture of the installed plugin."""

from __future__ import annotations

from pathlib import Path

from support.doc_runner import Session

DOC = Path(__file__).resolve().parent.parent / "docs" / "MODBUS_RTU.md"


def test_modbus_rtu_md_examples_run_as_written(tmp_path: Path) -> None:
    session = Session(tmp_path)
    session.run_document(DOC.read_text("utf-8"))
    assert session.counts["file"] >= 3 and session.counts["run"] >= 1
    assert session.counts["python"] >= 1  # the character format on a wire
    assert (tmp_path / "test_dryer_app.py").is_file()
