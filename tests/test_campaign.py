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
from idemlink.host.command import Command, CommandKind, Result
from idemlink.oracle import Claimed, Oracle
from idemlink.protocol import host_session
from idemlink.protocol.device_core import DeviceCore
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
    # outages hit writes that ran and writes that never got through; late copies came back as
    # ANSWER_EVICTED and TOO_OLD (10, 8, 3, 7 and 22 in this run)
    assert rep.outages > 3 and rep.ran_unanswered > 0 and rep.never_delivered > 0
    assert rep.late_answers["ANSWER_EVICTED"] > 0 and rep.late_answers["TOO_OLD"] > 0


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
    # the line went dead under writes that ran (every answer lost) and under writes that never
    # reached the device; late copies drew ANSWER_EVICTED and TOO_OLD answers, and ran late
    assert rep.outages > 20 and rep.ran_unanswered > 10 and rep.never_delivered > 10
    assert rep.late_answers["ANSWER_EVICTED"] > 10 and rep.late_answers["TOO_OLD"] > 10
    assert rep.late_executions > 10


@pytest.mark.parametrize(("seed", "commands"), [
    (2, 1000), pytest.param(2, 3000, marks=pytest.mark.slow),
    pytest.param(3, 3000, marks=pytest.mark.slow), pytest.param(4, 3000, marks=pytest.mark.slow)])
def test_other_seeds_with_reordering_and_noise(seed: int, commands: int) -> None:
    """Reordering and line noise on top of loss, duplication and corruption: seed 2's first
    1,000 commands by default, 3,000 of each seed slow."""
    rep = run_campaign(CampaignConfig(commands=commands, loss=0.15, dup=0.05, corrupt=0.05,
                                      reorder=0.05, noise_rate=2.0, reboot_every=200, seed=seed))
    assert rep.passed, rep.problems[:5]
    assert rep.reboots > 0 and rep.retries > 0


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
    assert rep.misclassified > 0  # the host reports the replay's values, or its other outcome
    assert any("another answer" in p or "device answered" in p for p in rep.problems)


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


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "extra"), [
    (1, {}),
    (2, {"reboot_every": 5, "reorder": 0.05, "noise_rate": 2.0, "late_frames": 20}),
    (3, {"loss": 0.3, "attempts": 3, "restart_every": 30}),
])
def test_dense_outages_and_late_copies_find_nothing_wrong(seed: int, extra: dict[str, Any]) -> None:
    """An outage every 20 commands and a late copy of one frame in ten: the line's evidence
    agrees with every outcome the real host reports, however the answers were lost or late."""
    cfg = CampaignConfig(**{"commands": 10_000, "outage_every": 20, "late": 0.1,
                            "late_frames": 50, "seed": seed, **extra})
    rep = run_campaign(cfg)
    assert rep.passed, rep.problems[:5]
    assert rep.ran_unanswered > 100 and rep.never_delivered > 50
    assert rep.late_answers["TOO_OLD"] + rep.late_answers["EPOCH_MISMATCH"] > 50


# ----------------------------------------------------------- the oracle under harsh but legal links


def test_an_unknown_whose_read_back_was_lost_is_unresolved_not_misclassified(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from idemlink.campaign import _Campaign
    from idemlink.host.command import Reconciliation, Result

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
    from idemlink.host.command import Reconciliation

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
    from idemlink.host.command import Reconciliation
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


# ---- an outcome needs evidence from the line: mutants that passed main's oracle ---------------
# Each passed `idemlink soak` (20,000 commands, seed 1) before the oracle read the line's delivery
# record and the campaign had outages and late copies; each fails the default soak now.

EFFECT = (0x06, 0x10, 0x41, 0x42)  # function codes that may change the device's state


def test_mutant_write_reported_ok_on_timeout_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(a) OK without any delivered answer. Main's oracle caught this only for a write that never
    ran at all; one that ran and lost every answer carried no values to compare and passed."""
    real = host_session.HostSession._finish

    def optimistic(self: host_session.HostSession, p: host_session._Pending, outcome: Outcome,
                   status: Status | None, **kw: Any) -> None:
        if status is Status.NO_ANSWER and p.pdu[0] in EFFECT:
            outcome, status = Outcome.OK, Status.OK
        real(self, p, outcome, status, **kw)

    monkeypatch.setattr(host_session.HostSession, "_finish", optimistic)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert any(p.startswith("OK without an answer on the line") for p in rep.problems)


def test_mutant_write_reported_not_executed_after_an_outage_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(b) NOT_EXECUTED for a write that ran: every answer lost in an outage. And one that did
    not run (every request lost) has no answer that says so: a late copy may still run it."""
    real = host_session.HostSession._finish

    def pessimistic(self: host_session.HostSession, p: host_session._Pending, outcome: Outcome,
                    status: Status | None, **kw: Any) -> None:
        if status is Status.NO_ANSWER and p.pdu[0] in EFFECT:
            outcome = Outcome.NOT_EXECUTED
        real(self, p, outcome, status, **kw)

    monkeypatch.setattr(host_session.HostSession, "_finish", pessimistic)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert rep.misclassified > 0
    assert any(p.startswith(("NOT_EXECUTED but it ran with effect",
                             "NOT_EXECUTED without an answer on the line")) for p in rep.problems)


def test_mutant_late_answer_of_another_boot_taken_as_ok_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(c) A late answer taken as OK: the host matches an answer by its number alone, so a late
    copy of an answer from an earlier boot settles the request now outstanding under that
    number (numbers restart at every boot)."""
    from idemlink.protocol.frame import Frame

    real = host_session.HostSession._on_response

    def epoch_blind(self: host_session.HostSession, frame: Frame, now: float) -> None:
        p = self._inflight.get(frame.seq)
        if p is not None and frame.epoch != p.epoch and frame.payload[:1] != b"\x10":
            frame = Frame(frame.type, frame.flags, p.epoch, frame.seq, frame.payload)
        real(self, frame, now)

    monkeypatch.setattr(host_session.HostSession, "_on_response", epoch_blind)
    rep = run_campaign(replace(DEFAULT_SOAK, late=0.05), fail_fast=True)
    assert any(p.startswith("OK without an answer on the line") for p in rep.problems)


def _evicted_while_waiting(answer: str) -> tuple[Result, list[Claimed], Oracle, Oracle]:
    """Host A's write runs and its answer is lost; before A's retry, host B (another process on
    the same device, whose replay cache keeps one answer) runs two reads. If B said HELLO first,
    A's numbers start a window beyond B's: B's first read is TOO_OLD, its second runs and evicts
    A's answer, and A's retry is answered ANSWER_EVICTED; if A did, B's numbers start a window
    beyond A's and A's retry is TOO_OLD.
    Returns A's result, the claims, and two oracles fed the same records: one with the line's
    delivery record, one (as before) with the device's record alone."""
    from idemlink.campaign import RECEIVER, _Host, map_text
    from idemlink.device_sim.device import SimulatedDevice
    from idemlink.device_sim.link import DeliveryLog, FrameFault
    from idemlink.device_sim.simlink import SimTransport
    from idemlink.oracle import Boot, Delivered, Run

    sim = SimulatedDevice(seed=4, replay_slots=1)
    t = SimTransport(sim)
    line = DeliveryLog()
    t.link.record_deliveries(line)
    a = _Host(t, timeout=0.02, attempts=3, max_inflight=1)
    b = _Host(t, timeout=0.02, attempts=3, max_inflight=1)
    for h in (b, a) if answer == "ANSWER_EVICTED" else (a, b):
        h.connect()
    t.link.b_to_a.force_frame_fault(FrameFault.DROP)  # the answer to A's write
    rounds = a._rounds(a.ops.run_steps([Command(CommandKind.WRITE, 4, 1, (420,))]))
    next(rounds)  # sent, ran, answer lost: the retry waits
    b.run([Command(CommandKind.READ, 0, 9, input_registers=True)] * 2)
    with pytest.raises(StopIteration) as done:
        while True:
            next(rounds)
    (res,) = done.value.value
    records = [Boot(*sim.boots[0]), *(Delivered(RECEIVER[d.direction], d.time, d.unit)
                                      for d in line.take()),
               *(Run(x.epoch, x.seq, x.request, x.response, x.time) for x in sim.executions)]
    oracles = []
    for evidence in (True, False):
        oracle = Oracle(map_text("thermal-controller"), trigger_duration=2.0,
                        delivery_record=evidence)
        claims = [oracle.claim(h.claim(r)) for h in (a, b) for r in h.made]
        oracle.feed(records)
        for c in claims:
            oracle.judge(c)
        oracles.append(oracle)
    assert oracles[0].tally.answers[answer] == 1
    return res, claims, oracles[0], oracles[1]


@pytest.mark.parametrize("answer", ["ANSWER_EVICTED", "TOO_OLD"])
def test_an_answer_gone_while_its_host_waits_is_reported_unknown(answer: str) -> None:
    res, _, with_line, _ = _evicted_while_waiting(answer)
    assert res.outcome is Outcome.UNKNOWN and res.status is Status[answer]
    assert with_line.tally.passed, with_line.tally.problems


@pytest.mark.parametrize("answer", ["ANSWER_EVICTED", "TOO_OLD"])
def test_mutant_answer_evicted_taken_as_ok_is_misclassified(
    monkeypatch: pytest.MonkeyPatch, answer: str,
) -> None:
    """(c) ANSWER_EVICTED (or TOO_OLD) read as "it ran": OK, where the device's record alone
    cannot tell (the write ran once and carries no values) and the line's record can. The
    campaign reaches TOO_OLD through reconcile()'s re-send (next test), not ANSWER_EVICTED: a
    host's pipeline never runs more numbers ahead than the device keeps answers, and the re-send
    follows its batch, so only another process on the device evicts an answer a host still waits
    for. Scripted here, both ways."""
    from idemlink.protocol.outcome import StatusInfo

    real = host_session.status_info

    def ran(code: int) -> StatusInfo:
        info = real(code)
        if code == Status[answer]:
            return StatusInfo(Outcome.OK, info.action, info.meaning)
        return info

    monkeypatch.setattr(host_session, "status_info", ran)
    res, _, with_line, without = _evicted_while_waiting(answer)
    assert res.outcome is Outcome.OK
    assert without.tally.passed  # the oracle before the line's record
    assert with_line.tally.misclassified == 1
    assert with_line.tally.problems[0].endswith(f"the host was answered {answer}")


def test_mutant_too_old_taken_as_ok_by_a_resend_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(c) reconcile() re-sends a request under its own number to ask the device whether it ran;
    a host that reads the answer TOO_OLD or ANSWER_EVICTED as OK reports a re-send the line never
    answered so. The campaign reaches it when a new host process reconciles a dead one's
    requests (their numbers fall behind the window once the first read-back ran)."""
    from idemlink.protocol.outcome import StatusInfo

    real = host_session.status_info

    def ran(code: int) -> StatusInfo:
        info = real(code)
        if code in (Status.ANSWER_EVICTED, Status.TOO_OLD):
            return StatusInfo(Outcome.OK, info.action, info.meaning)
        return info

    monkeypatch.setattr(host_session, "status_info", ran)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert any(p.startswith(("OK (TOO_OLD) without an answer on the line",
                             "OK (ANSWER_EVICTED) without an answer on the line"))
               for p in rep.problems)


def test_mutant_read_answered_from_a_cache_on_timeout_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(d) OK without any delivered answer, for a read: a poller that, when the device does not
    answer, returns what the last answered read of the same registers carried."""
    real = host_session.HostSession._finish
    cache: dict[bytes, bytes] = {}

    def cached(self: host_session.HostSession, p: host_session._Pending, outcome: Outcome,
               status: Status | None, **kw: Any) -> None:
        if p.pdu[0] in (3, 4):
            if outcome is Outcome.OK and kw.get("pdu"):
                cache[p.pdu] = kw["pdu"]
            elif status is Status.NO_ANSWER and p.pdu in cache:
                outcome, status, kw = Outcome.OK, Status.OK, {**kw, "pdu": cache[p.pdu]}
        real(self, p, outcome, status, **kw)

    monkeypatch.setattr(host_session.HostSession, "_finish", cached)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert any(p.startswith("OK without an answer on the line") for p in rep.problems)


def test_mutant_replayed_answer_reported_as_a_first_answer_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(d) An OK whose content is not what the line delivered: the replayed answer reported as
    a first one (``Result.replay`` says whether the command ran just now or before)."""
    real = host_session.HostSession._finish

    def fresh(self: host_session.HostSession, p: host_session._Pending, outcome: Outcome,
              status: Status | None, **kw: Any) -> None:
        kw.pop("replay", None)
        real(self, p, outcome, status, **kw)

    monkeypatch.setattr(host_session.HostSession, "_finish", fresh)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert any(p.startswith("OK without an answer on the line") and "REPLAYED" in p
               for p in rep.problems)


# ---- reconcile()'s verdict needs the device's word: mutants that passed the soak's oracle ------
# Each passed the default soak before the oracle asked the line for the answer behind a
# reconcile() verdict (it compared "it ran" with the device's record only when a re-send was made,
# so a verdict taken from appearance, or from an answer that proves nothing, passed when true).


def test_mutant_reconcile_ran_from_appearance_without_a_resend_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a reboot no re-send can ask the device; a host that takes a read-back whose state
    holds for "it ran" reports a verdict with no evidence at all."""
    import dataclasses

    import idemlink.host.operations as operations
    from idemlink.host.command import Reconciliation

    real = operations.with_evidence

    def looks(read_back: Reconciliation, resent: Result | None, why: str) -> Reconciliation:
        rec = real(read_back, resent, why)
        if resent is None and read_back.intended_state_holds:
            return dataclasses.replace(rec, executed=True, evidence="the state holds")
        return rec

    monkeypatch.setattr(operations, "with_evidence", looks)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert any(p.startswith("reconcile() said") and "without the device's word" in p
               for p in rep.problems), rep.problems[:3]


@pytest.mark.parametrize("statuses", [("TOO_OLD",),
                                      ("EPOCH_MISMATCH", "EPOCH_CHANGED_IN_FLIGHT", "NO_ANSWER")])
def test_mutant_resend_without_proof_taken_as_ran_is_misclassified(
    monkeypatch: pytest.MonkeyPatch, statuses: tuple[str, ...],
) -> None:
    """A re-send answered TOO_OLD (the number is behind the window: it may or may not have run),
    or not answered at all, read as "it ran". The campaign's TOO_OLD re-sends are a dead
    process's requests whose first answer the new process read and dropped before its re-send:
    that answer is on the line, but it cannot be what the verdict rests on."""
    import idemlink.host.evidence as evidence

    real = evidence.proof_of

    def proves(resent: Result) -> evidence.Proof:
        if resent.status is not None and resent.status.name in statuses:
            return evidence.Proof.EVICTED
        return real(resent)

    monkeypatch.setattr(evidence, "proof_of", proves)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert any(p.startswith("reconcile() said") and "ran without the device's word" in p
               for p in rep.problems), rep.problems[:3]


def test_mutant_host_that_sends_another_value_and_says_so_is_misclassified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host writes another value than asked (an off-by-one), and its Result faithfully names
    the command it really sent. Before, claims were built from ``Result.command``: the device ran
    what the claim said, and the soak passed. Now a claim is the command the campaign asked for."""
    import dataclasses

    from idemlink.host.device import Device

    real = Device.run

    def off_by_one(self: Device, cmds: list[Command], *a: Any, **kw: Any) -> list[Result]:
        cmds = [dataclasses.replace(c, values=(c.values[0] - 1,))
                if c.kind is CommandKind.WRITE and len(c.values) == 1 and c.values[0] > 0 else c
                for c in cmds]
        return real(self, cmds, *a, **kw)

    monkeypatch.setattr(Device, "run", off_by_one)
    rep = run_campaign(DEFAULT_SOAK, fail_fast=True)
    assert any("reports another command" in p for p in rep.problems), rep.problems[:3]


def test_in_process_the_soak_latches_and_clears_a_user_maps_faults() -> None:
    """The pump controller (no thermal rule: faults only from outside): the campaign's control
    lines, applied to the simulator's core, latch faults; clears are tried while the condition
    holds and after it went; the oracle judges from the record and the conditions' record."""
    rep = run_campaign(CampaignConfig(commands=200, regmap="pump-controller", conditions=0.5,
                                      seed=6))
    assert rep.passed, rep.problems[:5]
    assert rep.conditions_set >= 20 and rep.faults_latched >= 3, rep.as_dict()
    assert rep.faults_cleared >= 1 and rep.clears_while_held >= 1, rep.as_dict()


def test_mutant_simulator_that_never_latches_a_condition_fails_the_soak(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DeviceCore, "set_condition", lambda self, bit, active, now: None)
    rep = run_campaign(CampaignConfig(commands=200, regmap="pump-controller", conditions=0.5,
                                      seed=6), fail_fast=True)
    assert rep.conditions_set >= 1 and rep.register_semantics > 0, rep.as_dict()
