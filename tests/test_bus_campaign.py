"""The soak on a bus of 8 simulated devices (issue 22 item 7; docs/SOAK.md, "On a bus"): 10 %
frame loss each way per device, reboots of single devices, one device dead for a stretch,
broadcasts among the commands — each device judged by its own oracle — and the mutants it must
catch."""

from __future__ import annotations

import pytest

from idemlink.bus_campaign import BusCampaignConfig, BusCampaignReport, run_bus_campaign
from idemlink.host import bus as host_bus
from idemlink.host.command import Command, Result
from idemlink.protocol import device_session
from idemlink.protocol.frame import Frame
from idemlink.protocol.outcome import Outcome, Status


def _clean(rep: BusCampaignReport) -> None:
    assert rep.passed, rep.verdict() + "\n" + "\n".join(
        f"{a}: {p}" for a, r in rep.devices.items() for p in r.problems[:5])
    for r in rep.devices.values():
        assert (r.duplicated_effects, r.lost_acknowledged_writes, r.misclassified,
                r.register_semantics) == (0, 0, 0, 0)


@pytest.mark.parametrize("commands", [400, pytest.param(5000, marks=pytest.mark.slow)])
def test_the_soak_on_a_bus_of_8_devices_passes_per_device(commands: int) -> None:
    """400 commands by default (seed 1), 5,000 slow: the same code path and assertions."""
    rep = run_bus_campaign(BusCampaignConfig(commands=commands))
    _clean(rep)
    assert rep.commands == commands and len(rep.devices) == 8
    assert all(r.commands > 0 for r in rep.devices.values())
    assert sum(r.reboots for r in rep.devices.values()) >= 3  # single devices, not the bus
    assert rep.broadcasts >= 5 and rep.broadcast_outcomes["OK"] > 0
    assert rep.broadcast_executions <= rep.broadcast_outcomes["OK"] + rep.broadcast_outcomes[
        "UNKNOWN"]
    assert rep.dead_stretch is not None and rep.dead_stretch[1] > rep.dead_stretch[0]
    assert rep.breaker_refused > 0  # the dead device's commands ended at once, nothing sent
    dead = rep.devices[8]
    assert dead.outcomes["NOT_EXECUTED"] > 0
    assert sum(r.outcomes["OK"] for r in rep.devices.values()) > commands // 2
    assert "PASS: " in rep.verdict() and "on 8 devices" in rep.verdict()


def _fails(**kw: object) -> BusCampaignReport:
    rep = run_bus_campaign(BusCampaignConfig(commands=300, **kw), fail_fast=True)  # type: ignore[arg-type]
    assert not rep.passed
    return rep


def test_mutant_dead_devices_command_reported_ok_is_misclassified(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: host_bus.BusDevice, commands: list[Command], why: str) -> list[Result]:
        self.breaker.refused += len(commands)
        return [Result(c, Outcome.OK, Status.OK) for c in commands]

    monkeypatch.setattr(host_bus.BusDevice, "_refused", refused)
    rep = _fails()
    assert rep.devices[8].misclassified and not any(
        rep.devices[a].misclassified for a in range(1, 8))
    assert any("OK without an answer on the line" in p for p in rep.devices[8].problems)


def test_mutant_broadcast_run_twice_by_a_device_duplicates_effects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def every_copy(self: device_session.DeviceSession, frame: Frame, now: float) -> str:
        if self.broadcast_ok is None or not self.broadcast_ok(frame.payload):
            return "broadcast_refused"
        self.broadcast_executor(frame.payload, now, frame.seq)  # no window: every copy runs
        return "broadcast_executed"

    monkeypatch.setattr(device_session.DeviceSession, "_broadcast", every_copy)
    rep = _fails()
    assert rep.total("duplicated_effects") > 0
    assert any("ran twice in one boot" in p for r in rep.devices.values() for p in r.problems)


def test_mutant_verify_that_says_ok_without_reading_is_misclassified(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def blind(self: host_bus.Bus, results: dict[int, Result]) -> dict[int, Result]:
        return {a: Result(r.command, Outcome.OK, Status.OK, seq=r.seq)
                for a, r in results.items()}

    monkeypatch.setattr(host_bus.Bus, "verify", blind)
    rep = _fails(dead_from=0.0, dead_until=1.0)  # the dead device never holds a broadcast
    assert rep.devices[8].misclassified
    assert any("broadcast" in p and "verified OK" in p for p in rep.devices[8].problems)


def test_cli_soak_on_a_bus(capsys: pytest.CaptureFixture[str]) -> None:
    """``idemlink soak --bus 8``: a line per device and the verdict; the point-to-point soak's
    faults are refused on a bus, nothing run."""
    from idemlink.cli import main

    assert main(["soak", "--bus", "8", "--commands", "60", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("PASS: 60 commands on 8 devices, 0 duplicated effects")
    assert sum(line.startswith("  device ") for line in out) == 8
    assert main(["soak", "--bus", "8", "--late", "0.2", "--commands", "60"]) == 1
    assert "--late is not done on a bus" in capsys.readouterr().err
