"""docs/YOUR_DEVICE.md is executed block by block (tests/support/doc_runner.py), so every command and
program in it stays true; the simulator's own flash is the ground truth of what it did."""

from __future__ import annotations

import json
from pathlib import Path

from support.doc_runner import Session

DOC = Path(__file__).resolve().parent.parent / "docs" / "YOUR_DEVICE.md"


def test_every_command_of_your_device_walkthrough(tmp_path: Path) -> None:
    session = Session(tmp_path)
    session.run_document(DOC.read_text("utf-8"))
    assert session.counts["file"] == 3 and session.counts["python"] == 1
    assert session.counts["run"] == 5 and session.counts["command"] >= 10
    config = json.loads((tmp_path / "doser-flash" / "config.json").read_text())
    holdings = dict(map(tuple, config["holdings"]))
    assert holdings[0x21] == 200  # dose_volume, set by the Python block
    assert (tmp_path / "generated" / "idemlink_regmap.h").is_file()
