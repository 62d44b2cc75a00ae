"""``apply --resolve KEY --executed|--not-executed``: resolving a key the way the journal already
has it is a harmless retry (``already resolved``, exit 0, nothing changes); the other way than
recorded stays an error (exit 1). Resolving sends nothing: no device is opened."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.host.journal import DeviceJournal
from idemlink.host.journal_format import StepState

KEY = str(uuid.UUID(int=0x1234))
DEVICE = "dev-1"


def _in_flight(tmp: Path) -> Path:
    plan = tmp / "plan.json"
    plan.write_text("{}")
    j = DeviceJournal.open(f"{plan}.journal")
    j.begin(DEVICE, KEY)
    return plan


@pytest.mark.parametrize("verdict", ["--executed", "--not-executed"])
def test_resolving_twice_the_same_way_is_a_harmless_retry(
        tmp_path: Path, verdict: str, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _in_flight(tmp_path)
    assert main(["apply", str(plan), "--resolve", KEY, verdict]) == 0
    assert "resolved as" in capsys.readouterr().out
    assert main(["apply", str(plan), "--resolve", KEY, verdict]) == 0
    assert "already resolved as" in capsys.readouterr().out
    assert main(["apply", str(plan), "--resolve", KEY, verdict, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["already"] is True and doc["as"] == verdict[2:].replace("-", "_")
    expected = StepState.DONE if verdict == "--executed" else StepState.ABSENT
    assert DeviceJournal.open(f"{plan}.journal").state(DEVICE, KEY) is expected


def test_resolving_the_other_way_than_recorded_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _in_flight(tmp_path)
    assert main(["apply", str(plan), "--resolve", KEY, "--executed"]) == 0
    capsys.readouterr()
    assert main(["apply", str(plan), "--resolve", KEY, "--not-executed"]) == 1
    assert "receipted as executed" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    plan2 = _in_flight(tmp_path / "other")
    assert main(["apply", str(plan2), "--resolve", KEY, "--not-executed"]) == 0
    capsys.readouterr()
    assert main(["apply", str(plan2), "--resolve", KEY, "--executed"]) == 1
    assert "not in flight" in capsys.readouterr().err
    assert DeviceJournal.open(f"{plan}.journal").state(DEVICE, KEY) is StepState.DONE
    assert DeviceJournal.open(f"{plan2}.journal").state(DEVICE, KEY) is StepState.ABSENT
