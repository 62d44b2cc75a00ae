"""``idemlink soak``'s report: an interrupted run is not a PASS (counts so far, ``interrupted: no
verdict``, exit 130; FAIL if the oracle already found something), and ``--restart-every``,
``--outage-every``, ``--late`` and ``--late-frames`` have the defaults their help and
docs/SOAK.md state."""

from __future__ import annotations

import argparse
import json

import pytest

from idemlink.campaign import CampaignConfig, CampaignReport
from idemlink.cli import build_parser
from idemlink.commands import soak_cmd


def _report(**kw: object) -> CampaignReport:
    return CampaignReport(config={}, commands=120, **kw)  # type: ignore[arg-type]


def test_an_interrupted_run_that_found_nothing_has_no_verdict(
        capsys: pytest.CaptureFixture[str]) -> None:
    rep = _report(interrupted=True)
    assert rep.verdict().startswith("interrupted: no verdict (120 commands, 0 duplicated")
    args = argparse.Namespace(json=False, command="soak")
    soak_cmd._print(args, rep, CampaignConfig(commands=1000), 130)
    out, err = capsys.readouterr()
    assert "PASS" not in out
    assert out.splitlines()[-1].startswith("interrupted: no verdict")
    assert err.splitlines() == ["idemlink soak: interrupted after 120 of 1000 commands; the "
                                "oracle found nothing wrong so far"]


def test_an_interrupted_run_as_json_carries_no_pass(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(json=True, command="soak")
    soak_cmd._print(args, _report(interrupted=True), CampaignConfig(commands=1000), 130)
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["schema"] == "idemlink.error/1" and doc["exit"] == 130
    assert doc["report"]["verdict"].startswith("interrupted: no verdict")
    assert "PASS" not in err


def test_an_interrupted_run_that_found_a_problem_is_a_fail() -> None:
    assert _report(interrupted=True, duplicated_effects=1).verdict().startswith("FAIL: ")
    assert _report().verdict().startswith("PASS: ")


def test_restart_every_default_is_the_one_the_help_states() -> None:
    args = build_parser().parse_args(["soak"])
    assert args.restart_every == CampaignConfig().restart_every == 250
    soak = build_parser()._subparsers._group_actions[0].choices["soak"]  # type: ignore[union-attr]
    assert "(default 250; 0: never)" in " ".join(soak.format_help().split())


def test_outage_and_late_copy_defaults_are_the_ones_the_help_states() -> None:
    args = build_parser().parse_args(["soak"])
    cfg = soak_cmd._config(args)
    default = CampaignConfig()
    assert (cfg.outage_every, cfg.outage_length, cfg.late, cfg.late_frames) == (
        default.outage_every, default.outage_length, default.late, default.late_frames)
    assert default.outage_seconds == 1.5 * default.attempts * default.timeout
    soak = build_parser()._subparsers._group_actions[0].choices["soak"]  # type: ignore[union-attr]
    text = " ".join(soak.format_help().split())
    assert f"(default {default.outage_every}; 0: never)" in text
    assert f"(default {default.late})" in text and f"(default {default.late_frames})" in text


@pytest.mark.parametrize("args", [["--outage-every", "-1"], ["--outage-seconds", "0"],
                                  ["--outage-seconds", "nan"]])
def test_bad_outage_options_are_refused(args: list[str]) -> None:
    from idemlink.cli import UserError

    with pytest.raises(UserError, match="outage"):
        soak_cmd._config(build_parser().parse_args(["soak", *args]))


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan"])
def test_a_bad_condition_rate_is_refused(value: str) -> None:
    from idemlink.cli import UserError

    with pytest.raises(UserError, match="--conditions"):
        soak_cmd._config(build_parser().parse_args(["soak", "--conditions", value]))
    cfg = soak_cmd._config(build_parser().parse_args(["soak", "--conditions", "0.5"]))
    assert cfg.conditions == 0.5


@pytest.mark.parametrize("seed", [1, 2])
def test_host_crashes_average_one_per_restart_every_commands(seed: int) -> None:
    from idemlink.campaign import run_campaign

    cfg = CampaignConfig(commands=600, restart_every=20, reboot_every=0, seed=seed)
    rep = run_campaign(cfg)
    assert rep.passed, rep.problems[:5]
    assert 20 <= rep.host_restarts <= 40, rep.host_restarts  # 30 expected
