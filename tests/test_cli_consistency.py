"""One representation of a reading, one format, honest counts across the CLI's commands.

Each command runs in process against the simulator on a pty; what a new user compares side by
side (text of ``read`` and ``faults``, JSON of ``read``/``watch``/``trigger``, CSV of ``watch``,
``write`` and ``apply``'s echoes) must say the same thing the same way."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from idemlink.cli import main
from idemlink.pytest_plugin import PtySim, start_pty_sim

pytestmark = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pty")


@pytest.fixture
def sim() -> Iterator[PtySim]:
    s = start_pty_sim()
    try:
        yield s
    finally:
        s.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def json_docs(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_a_trigger_state_is_its_label_in_every_json(sim: PtySim,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    p = ("--port", sim.path)
    assert cli(capsys, "trigger", *p)[0] == 0
    rc, out, _ = cli(capsys, "read", *p, "self_clean", "--json")
    assert rc == 0
    states = {0: "IDLE", 1: "RUNNING", 2: "DONE"}  # it may finish (2 s) while this runs
    [reading] = json_docs(out)[0]["registers"]
    assert reading["raw"] in (1, 2) and reading["label"] == states[reading["raw"]]
    rc, out, _ = cli(capsys, "trigger", *p, "--status", "--json")
    reading = json_docs(out)[0]["registers"][0]
    assert reading["label"] == states[reading["raw"]]
    rc, out, _ = cli(capsys, "watch", *p, "self_clean", "--count", "1", "--interval", "0.01",
                     "--json")
    reading = json_docs(out)[0]
    assert reading["label"] == states[reading["raw"]]


def test_watch_csv_has_the_json_readings_columns(sim: PtySim,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    p = ("--port", sim.path, "--count", "1", "--interval", "0.01", "mode", "threshold")
    assert cli(capsys, "write", "--port", sim.path, "mode=2")[0] == 0
    rc, out, _ = cli(capsys, "watch", *p, "--csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    rc, out, _ = cli(capsys, "watch", *p, "--json")
    docs = json_docs(out)
    assert len(rows) == len(docs) == 2
    for row, doc in zip(rows, docs, strict=True):
        assert set(row) == set(doc) - {"schema"}
        for key in ("name", "address", "raw", "value", "label", "unit", "outcome"):
            assert row[key] == ("" if doc[key] is None else str(doc[key])), key
    mode = next(r for r in rows if r["name"] == "mode")
    assert (mode["value"], mode["label"]) == ("2", "manual")


def test_watch_counts_changes_and_port_failures_truthfully(
        sim: PtySim, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    rc, _, err = cli(capsys, "watch", "--port", sim.path, "--every", "--count", "2",
                     "--interval", "0.01", "mode", "threshold", "fan_setpoint")
    assert rc == 0 and "2 poll(s), 0 change(s), 0 poll(s) with a read that got no answer" in err
    rc, _, err = cli(capsys, "watch", "--port", str(tmp_path / "gone"), "--count", "2",
                     "--interval", "0.01", "mode")
    assert rc == 1
    assert "0 poll(s) with a read that got no answer" in err
    assert "2 poll(s) without the device" in err


def test_the_boot_epoch_is_one_json_integer_everywhere(
        sim: PtySim, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    trace = tmp_path / "trace.jsonl"
    rc, out, _ = cli(capsys, "info", "--port", sim.path, "--json")
    assert rc == 0
    assert cli(capsys, "read", "--port", sim.path, "mode", "--trace", str(trace))[0] == 0
    epoch = json_docs(out)[0]["epoch"]
    assert epoch == sim.device.epoch
    frames = [json.loads(line) for line in trace.read_text("utf-8").splitlines()]
    assert frames and all(isinstance(f["epoch"], int) for f in frames)
    assert {f["epoch"] for f in frames if f["type"] != "HELLO"} == {epoch}  # HELLO carries 0
    rc, out, _ = cli(capsys, "info", "--port", sim.path)
    assert f"0x{epoch:08x}" in out  # text shows it in hex
