"""``idemlink soak --plot``: the campaign's timeline (retries, replays, UNKNOWN, reboots after every
batch) and its picture; a missing matplotlib or an unwritable path is one line, before the run."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import pytest

from idemlink.campaign import CampaignConfig, TimelinePoint, run_campaign
from idemlink.cli import main


def test_the_timeline_records_the_running_counts_after_every_batch() -> None:
    timeline: list[TimelinePoint] = []
    rep = run_campaign(CampaignConfig(commands=600, reboot_every=100, seed=3), timeline=timeline)
    assert timeline[-1].commands == rep.commands == 600
    last = timeline[-1]
    assert (last.retries, last.replays, last.reboots) == (rep.retries, rep.replays, rep.reboots)
    assert last.unknown == rep.outcomes["UNKNOWN"] and last.seconds == rep.simulated_seconds
    for a, b in pairwise(timeline):  # running counts never go back
        assert b.commands > a.commands and b.seconds >= a.seconds
        assert all(getattr(b, n) >= getattr(a, n) for n in ("retries", "replays", "unknown",
                                                              "reboots"))
    assert rep.reboots > 0 and rep.retries > 0


def test_soak_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "soak.png"
    assert main(["soak", "--commands", "300", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {out}" in capsys.readouterr().err


def test_soak_plot_without_matplotlib_is_one_line_before_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "soak.png"
    assert main(["soak", "--commands", "300", "--plot", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # the campaign did not run
    assert captured.err == ("idemlink soak: --plot needs matplotlib: pip install matplotlib (in "
                            "a checkout: pip install -e '.[bench]')\n")
    assert not out.exists()


@pytest.mark.parametrize(("name", "reason"), [("soak.nope", "the extension must be one of"),
                                              ("missing/soak.png", "no such directory")])
def test_soak_plot_to_a_path_it_cannot_write_is_one_line_before_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, reason: str) -> None:
    pytest.importorskip("matplotlib")
    assert main(["soak", "--commands", "300", "--plot", str(tmp_path / name)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and reason in captured.err and captured.err.count("\n") == 1
