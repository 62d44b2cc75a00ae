"""The soak with authentication on (issue 23's proof): a keyed simulator and host over a lossy
line with reboots, host crashes, outages and the link's adversary, judged by the independent
oracle from the simulator's own record and the line's delivery record — 0 duplicated effects,
0 lost acknowledged writes, 0 misclassified, and no request run that the host did not send.
The default suite runs a short representative; ``--run-slow`` the long one."""

from __future__ import annotations

import pytest

from idemlink.campaign import CampaignConfig, CampaignReport, run_campaign
from idemlink.cli import main
from idemlink.device_sim.adversary import Attack
from idemlink.protocol.auth import HostAuth


def attacked(commands: int, *, keyed: bool = True, seed: int = 3) -> CampaignReport:
    return run_campaign(CampaignConfig(commands=commands, seed=seed, authenticated=keyed,
                                       adversary=0.3, reboot_every=25, restart_every=80,
                                       outage_every=120))


def check_held(rep: CampaignReport) -> None:
    assert rep.passed, rep.problems[:5]
    assert (rep.duplicated_effects, rep.lost_acknowledged_writes, rep.misclassified,
            rep.register_semantics, rep.attacks_executed) == (0, 0, 0, 0, 0)
    assert set(rep.attacks_sent) == {a.value for a in Attack}
    refusable = sum(n for kind, n in rep.attacks_delivered.items()
                    if kind != Attack.REPLAY_SAME.value)
    # every delivered attack but an exact replay (answered by de-duplication) is refused and
    # counted: a wrong or cut tag, or no tag at all (noise adds to decode_errors, never to these)
    assert refusable > 0
    assert (rep.refused["bad_mac"] + rep.refused["unauthenticated"]
            + rep.refused["decode_errors"]) >= refusable
    assert rep.reboots >= 2 and rep.host_restarts >= 1
    assert rep.outcomes["OK"] > rep.commands // 2 and rep.outcomes["UNKNOWN"] >= 1


def test_a_short_authenticated_soak_under_attack_keeps_its_figures() -> None:
    check_held(attacked(200))


def test_without_keys_the_same_attacks_run_and_the_soak_fails() -> None:
    rep = attacked(120, keyed=False)
    assert not rep.passed and rep.attacks_executed > 0


def test_a_host_that_took_unsigned_answers_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle's rule that an unsigned answer is no evidence: a keyed host that believed the
    unsigned AUTHENTICATION_REQUIRED a stripped copy of its request earns is misclassified."""
    monkeypatch.setattr(HostAuth, "verify", lambda self, frame: True)
    rep = attacked(200, seed=5)
    assert rep.misclassified > 0
    assert any("AUTHENTICATION_REQUIRED) without an answer on the line" in p
               for p in rep.problems), rep.problems[:3]


def test_the_cli_soak_takes_authenticated_and_adversary(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["soak", "--commands", "60", "--authenticated", "--adversary", "0.3",
               "--no-progress", "--seed", "5"])
    out = capsys.readouterr()[0]
    assert rc == 0, out
    assert "authenticated: attacks" in out and ", 0 executed" in out.splitlines()[-1]


@pytest.mark.slow
def test_a_long_authenticated_soak_under_attack_keeps_its_figures() -> None:
    check_held(attacked(5000, seed=11))
