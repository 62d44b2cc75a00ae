"""The promise under fault injection: zero duplicated effects, zero lost acknowledged writes,
zero misclassified outcomes — and the oracle that says so is shown to catch each kind of bug."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from idemlink.campaign import CampaignConfig, run_campaign
from idemlink.host.device import Command, CommandKind
from idemlink.protocol import host_session
from idemlink.protocol.modbus import FunctionCode
from idemlink.protocol.outcome import Outcome, Status
from idemlink.protocol.window import ReplayWindow, Verdict


def test_two_thousand_commands_at_ten_percent_loss() -> None:
    """The 20,000-command campaign below (slow) in small, the same line and seed."""
    rep = run_campaign(CampaignConfig(commands=2_000, loss=0.1, dup=0.02, corrupt=0.02,
                                      reboot_every=500, seed=1))
    assert rep.commands == 2_000
    assert (rep.duplicated_effects, rep.lost_acknowledged_writes, rep.misclassified) == (0, 0, 0), \
        rep.problems[:5]
    assert rep.retries > 100 and rep.replays > 50 and rep.reboots > 1
    assert set(rep.outcomes) == {"OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN"}
    assert rep.unknown_reconciled == rep.outcomes["UNKNOWN"]


@pytest.mark.slow
def test_twenty_thousand_commands_at_ten_percent_loss() -> None:
    rep = run_campaign(CampaignConfig(commands=20_000, loss=0.1, dup=0.02, corrupt=0.02,
                                      reboot_every=500, seed=1))
    assert rep.commands == 20_000
    assert (rep.duplicated_effects, rep.lost_acknowledged_writes, rep.misclassified) == (0, 0, 0), \
        rep.problems[:5]
    # The faults really happened and were absorbed: retries, replays, reboots and UNKNOWNs occurred.
    assert rep.retries > 1000 and rep.replays > 500 and rep.reboots > 10
    assert set(rep.outcomes) == {"OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN"}
    assert rep.unknown_reconciled == rep.outcomes["UNKNOWN"]


@pytest.mark.parametrize("seed", [2, pytest.param(3, marks=pytest.mark.slow),
                                  pytest.param(4, marks=pytest.mark.slow)])
def test_other_seeds_with_reordering_and_noise(seed: int) -> None:
    rep = run_campaign(CampaignConfig(commands=3000, loss=0.15, dup=0.05, corrupt=0.05,
                                      reorder=0.05, noise_rate=2.0, reboot_every=200, seed=seed))
    assert rep.passed, rep.problems[:5]


def test_cli_soak_json_reports_zero_faults() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "idemlink", "soak", "--commands", "1500", "--loss", "0.1",
         "--seed", "5", "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["commands"] == 1500 and d["passed"] is True
    assert d["duplicated_effects"] == d["lost_acknowledged_writes"] == d["misclassified"] == 0



def test_cli_soak_bad_probability_is_one_line_not_a_traceback() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "idemlink", "soak", "--commands", "10", "--loss", "2"],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("idemlink soak: ") and r.stderr.count("\n") == 1, r.stderr

# ---- the oracle can fail: each mutant below must be caught -------------------------------------

SMALL = CampaignConfig(commands=2500, loss=0.15, dup=0.05, corrupt=0.02, reboot_every=150, seed=9)


def test_mutant_device_without_replay_duplicates_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    real_check = ReplayWindow.check

    def forgetful(self: ReplayWindow, seq: int) -> Verdict:
        v = real_check(self, seq)
        return Verdict.ACCEPT_OLD if v is Verdict.DUPLICATE else v

    monkeypatch.setattr(ReplayWindow, "check", forgetful)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.duplicated_effects > 0


def test_mutant_retry_with_fresh_seq_duplicates_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    real = host_session.HostSession._transmit

    def fresh_seq(self: host_session.HostSession, p: host_session._Pending, now: float, *,
                  retransmit: bool) -> None:
        if retransmit:  # the pymavlink anti-pattern: a retry stamped with a new number
            del self._inflight[p.seq]
            p.seq = self._next_seq
            self._next_seq += 1
            p.sent_as.append((p.epoch, p.seq))
            self._inflight[p.seq] = p
        real(self, p, now, retransmit=retransmit)

    monkeypatch.setattr(host_session.HostSession, "_transmit", fresh_seq)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.duplicated_effects > 0


def test_mutant_no_answer_reported_as_not_executed_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = host_session.HostSession._finish

    def optimistic(self: host_session.HostSession, p: host_session._Pending, outcome: object,
                   status: object, **kw: object) -> None:
        if status is Status.NO_ANSWER:
            outcome = Outcome.NOT_EXECUTED
        real(self, p, outcome, status, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(host_session.HostSession, "_finish", optimistic)
    rep = run_campaign(CampaignConfig(commands=4000, loss=0.35, dup=0.0, corrupt=0.0,
                                      reboot_every=0, attempts=2, seed=11), fail_fast=True)
    assert rep.misclassified > 0


def test_mutant_reboot_that_loses_configuration_loses_acknowledged_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemlink.device_sim.device import SimulatedDevice

    real = SimulatedDevice.reboot

    def amnesiac(self: SimulatedDevice, now: float) -> None:
        real(self, now)
        for spec in self.core.regmap:
            if spec.kind.name == "HOLDING":
                self.core._holdings[spec.address] = spec.default

    monkeypatch.setattr(SimulatedDevice, "reboot", amnesiac)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.lost_acknowledged_writes > 0


def test_mutant_replay_of_another_answer_is_misclassified(monkeypatch: pytest.MonkeyPatch) -> None:
    from idemlink.protocol.replay import ReplayCache, ReplayVerdict

    real = ReplayCache.lookup

    def stale(self: ReplayCache, seq: int, digest: int) -> tuple[ReplayVerdict, bytes]:
        verdict, answer = real(self, seq, digest)
        if verdict is ReplayVerdict.REPLAY and len(answer) > 5:
            answer = answer[:-1] + bytes([answer[-1] ^ 1])  # a stored answer gone wrong
        return verdict, answer

    monkeypatch.setattr(ReplayCache, "lookup", stale)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.misclassified > 0
    assert any("another answer" in p for p in rep.problems)


def test_mutant_rejected_reported_as_not_executed_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = host_session.classify_answer

    def softened(request_pdu: bytes, pdu: bytes) -> tuple[Outcome, Status | None, object]:
        outcome, status, exc = real(request_pdu, pdu)
        return (Outcome.NOT_EXECUTED if outcome is Outcome.REJECTED else outcome), status, exc

    monkeypatch.setattr(host_session, "classify_answer", softened)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.misclassified > 0
    assert any("reported NOT_EXECUTED, device answered REJECTED" in p for p in rep.problems)


def test_mutant_input_registers_decoded_little_endian_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    import idemlink.host.operations as operations

    real = operations.answer_of

    def little_endian(cmd: Command, pdu: bytes) -> tuple[tuple[int, ...], int | None]:
        values, code = real(cmd, pdu)
        if cmd.kind is CommandKind.READ and cmd.input_registers and values:
            return struct.unpack_from(f"<{cmd.count}H", pdu, 2), code
        return values, code

    monkeypatch.setattr(operations, "answer_of", little_endian)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.misclassified > 0
    assert any(p.startswith("read ") and "device answered" in p for p in rep.problems)


def test_mutant_trigger_retry_renumbered_and_forgotten_duplicates_effects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = host_session.HostSession._transmit

    def renumber(self: host_session.HostSession, p: host_session._Pending, now: float, *,
                 retransmit: bool) -> None:
        if retransmit and not p.set_only and p.pdu[0] in (0x06, FunctionCode.TRIGGER):
            del self._inflight[p.seq]  # retried under a new number, and the old one forgotten
            p.seq = self._next_seq
            self._next_seq = (self._next_seq + 1) & host_session.SEQ_MASK
            p.sent_as[:] = [(p.epoch, p.seq)]
            self._inflight[p.seq] = p
        real(self, p, now, retransmit=retransmit)

    monkeypatch.setattr(host_session.HostSession, "_transmit", renumber)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.duplicated_effects > 0
    assert any("claimed by 0 results" in p for p in rep.problems)


def test_mutant_set_only_retry_renumbered_in_one_epoch_duplicates_effects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = host_session.HostSession._transmit

    def renumber(self: host_session.HostSession, p: host_session._Pending, now: float, *,
                 retransmit: bool) -> None:
        if retransmit and p.set_only:  # the epoch rule stretched to every retry
            del self._inflight[p.seq]
            p.seq = self._next_seq
            self._next_seq = (self._next_seq + 1) & host_session.SEQ_MASK
            p.sent_as.append((p.epoch, p.seq))
            self._inflight[p.seq] = p
        real(self, p, now, retransmit=retransmit)

    monkeypatch.setattr(host_session.HostSession, "_transmit", renumber)
    rep = run_campaign(SMALL, fail_fast=True)
    assert rep.duplicated_effects > 0
    assert any("set-only ran twice in one epoch" in p for p in rep.problems)


LONG_SOAK = int(os.environ.get("IDEMLINK_LONG_SOAK_COMMANDS", "200000"))
"""The long in-process soak of the slow set: 200,000 commands (about a tenth of CI's time budget
on 2 cores); ``IDEMLINK_LONG_SOAK_COMMANDS=1000000`` runs the million-command campaign."""


@pytest.mark.slow
def test_a_long_campaign() -> None:
    rep = run_campaign(CampaignConfig(commands=LONG_SOAK, seed=1000))
    assert rep.commands == LONG_SOAK
    assert rep.passed, rep.problems[:5]


# ----------------------------------------------------------- the oracle under harsh but legal links


def test_an_unknown_whose_read_back_was_lost_is_unresolved_not_misclassified(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from idemlink.campaign import _Campaign
    from idemlink.host.device import Reconciliation, Result

    campaign = _Campaign(CampaignConfig(commands=1, seed=3))
    cmd = Command(CommandKind.WRITE, 4, values=(400,))
    res = Result(cmd, Outcome.UNKNOWN, Status.NO_ANSWER)
    monkeypatch.setattr(campaign.dev, "reconcile", lambda r: Reconciliation(
        cmd, {}, None, "read-back failed; still unknown"))
    campaign._reconcile(res)
    assert campaign.report.misclassified == 0 and campaign.report.unknown_unresolved == 1
    # a read-back that arrived and disagrees with the device is still caught
    monkeypatch.setattr(campaign.dev, "reconcile", lambda r: Reconciliation(
        cmd, {"threshold": 999, "generation": 0}, False, "the registers do not hold"))
    campaign._reconcile(res)
    assert campaign.report.misclassified == 1


def test_soak_without_any_handshake_is_one_line_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.cli import EXIT_LOCAL_ERROR, main

    assert main(["soak", "--commands", "100", "--loss", "1.0"]) == EXIT_LOCAL_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HELLO" in err and "Traceback" not in err


# ---- the independent oracle: deliberate bugs that break the promise must fail the default soak

DEFAULT_SOAK = CampaignConfig(commands=5000, reboot_every=5, seed=2)
"""``idemlink soak --commands 5000 --reboot-every 5 --seed 2``"""


def test_half_the_default_soak_passes_and_exercises_every_outcome_class() -> None:
    """The first 2,500 commands of the default soak (all 5,000: below, slow)."""
    rep = run_campaign(replace(DEFAULT_SOAK, commands=2500))
    assert rep.passed, rep.problems[:5]
    assert set(rep.outcomes) == {"OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN"}
    assert rep.host_restarts > 5 and rep.dead_reconciled > 5 and rep.late_executions > 0
    assert rep.reconcile_reads > 0 and rep.reissued_set_only > 0
    assert rep.executions > rep.commands  # retries after reboots, read-backs


@pytest.mark.slow
def test_the_default_soak_passes_and_exercises_every_outcome_class() -> None:
    rep = run_campaign(DEFAULT_SOAK)
    assert rep.passed, rep.problems[:5]
    assert set(rep.outcomes) == {"OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN"}
    assert rep.host_restarts > 5 and rep.dead_reconciled > 5 and rep.late_executions > 0
    assert rep.reconcile_reads > 0 and rep.reissued_set_only > 0
    assert rep.executions > rep.commands  # retries after reboots, read-backs


def test_mutant_reconcile_comparing_only_the_first_register_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import idemlink.host.operations as operations
    from idemlink.host.device import Reconciliation

    real = operations.judge_read_back

    def first_only(c: Command, values: tuple[int, ...], generation: int,
                   spec: object) -> Reconciliation:
        rec = real(c, values, generation, spec)  # type: ignore[arg-type]
        if c.kind in (CommandKind.WRITE, CommandKind.WRITE_IF_GENERATION):
            return Reconciliation(c, rec.observed, values[0] == c.values[0], rec.summary)
        return rec

    monkeypatch.setattr(operations, "judge_read_back", first_only)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.misclassified > 0
    assert any(p.startswith("reconcile said the intended state holds") for p in rep.problems)


def test_mutant_trigger_restarted_while_running_breaks_register_semantics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemlink.protocol import device_core
    from idemlink.protocol.device_core import TriggerAction, TriggerEvent
    from idemlink.protocol.registers import TriggerState, TriggerStatus

    monkeypatch.setitem(device_core.TRIGGER_TABLE, (TriggerState.RUNNING, TriggerEvent.WRITE_1),
                        (TriggerState.RUNNING, TriggerAction.START, TriggerStatus.RUNNING))
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.register_semantics > 0


def test_mutant_new_host_process_handed_the_dead_ones_numbers_duplicates_effects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemlink.protocol.device_session import DeviceSession

    def no_gap(self: DeviceSession) -> int:
        highest = self.window.highest
        return 1 if highest is None else (highest + 1) & 0xFFFFFFFF

    monkeypatch.setattr(DeviceSession, "first_seq", no_gap)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.duplicated_effects > 0
    assert any("claimed by two results" in p for p in rep.problems)


def test_mutant_reconcile_resending_an_idle_trigger_duplicates_effects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemlink.host.device import Reconciliation, Result
    from idemlink.host.operations import Operations

    real = Operations.reconcile_steps

    def resend(self: Operations, result: Result | None) -> Any:
        rec: Reconciliation | None = yield from real(self, result)
        if (rec is not None and result is not None and result.command.kind is CommandKind.TRIGGER
                and rec.observed.get("self_clean") == 0):
            yield from self.wave_steps([result.command])  # "it did not run: run it again"
        return rec

    monkeypatch.setattr(Operations, "reconcile_steps", resend)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.duplicated_effects > 0
    assert any(p.startswith("reconcile() sent a trigger") for p in rep.problems)


def test_mutant_triggers_reissued_in_a_new_epoch_duplicate_effects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import idemlink.host.operations as operations
    from idemlink.protocol.registers import RegisterMap

    real = operations.reissuable

    def triggers_too(c: Command, regmap: RegisterMap) -> bool:
        return c.kind in (CommandKind.TRIGGER, CommandKind.TRIGGER_RESET) or real(c, regmap)

    monkeypatch.setattr(operations, "reissuable", triggers_too)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.duplicated_effects > 0
    assert any("not idempotent by the map" in p for p in rep.problems)


def test_mutant_generation_moving_on_a_no_op_write_breaks_register_semantics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemlink.protocol.device_core import DeviceCore

    real = DeviceCore._apply

    def restless(self: DeviceCore, plan: Any, now: float, request: int, tag: Any) -> None:
        before = self._generation
        real(self, plan, now, request, tag)
        if plan.holdings and self._generation == before:
            self._generation = (before + 1) & 0xFFFF

    monkeypatch.setattr(DeviceCore, "_apply", restless)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.register_semantics > 0


def test_mutant_w1c_clearing_bits_it_was_not_given_breaks_register_semantics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemlink.protocol.device_core import DeviceCore

    real = DeviceCore._apply

    def greedy(self: DeviceCore, plan: Any, now: float, request: int, tag: Any) -> None:
        real(self, plan, now, request, tag)
        for a in plan.clears:  # every latched bit whose condition has gone, written or not
            self._latched[a] &= self._conditions(a)

    monkeypatch.setattr(DeviceCore, "_apply", greedy)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.register_semantics > 0


HOLDINGS_ONLY = """
name = "holdings-only"
[[registers]]
name = "speed"
address = 10
kind = "holding"
min = 0
max = 100
default = 5
[[registers]]
name = "generation"
address = 11
kind = "generation"
"""


@pytest.mark.parametrize("regmap", ["pump-controller", "holdings-only.toml", "pump.json"])
def test_the_campaign_runs_any_map(regmap: str, tmp_path: Any) -> None:
    """A built-in map with address gaps, two fault words and two triggers; a map file with no
    fault word and no trigger (those commands become reads); a JSON map file: each PASSes."""
    from idemlink.protocol.regmap_file import builtin_map, map_document

    if regmap == "holdings-only.toml":
        (tmp_path / regmap).write_text(HOLDINGS_ONLY, encoding="utf-8")
        regmap = str(tmp_path / regmap)
    elif regmap == "pump.json":
        (tmp_path / regmap).write_text(json.dumps(map_document(builtin_map("pump-controller"))),
                                       encoding="utf-8")
        regmap = str(tmp_path / regmap)
    rep = run_campaign(CampaignConfig(commands=1500, regmap=regmap, seed=5), fail_fast=True)
    assert rep.passed, rep.problems[:3]
    assert rep.commands == 1500 and rep.executions > 1000
