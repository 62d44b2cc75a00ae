"""``idemlink apply`` is right for every device: writes converge, one-shot steps run once per device.

Ground truth throughout is the simulated device itself (its register core's values, its effect log
with TRIGGER_STARTED / FAULT_CLEARED, its execution log, its flash), never the CLI's output:

- one plan applied to two devices (different ids) leaves both holding it; applied again it is a
  no-op ("already in place", no write sent); after a reset or a change by hand it converges;
- a trigger step runs once per device, even when the plan is applied twice, and on the second
  device too; a device without an id is refused one-shot steps before anything is sent;
- a second ``apply`` on a journal whose lock another process holds refuses at once (real
  subprocesses against a pty simulator); two racing applies never run a step twice;
- a conditional step fails (exit 3, released) when another host changed the configuration
  during the run; its guard counts this run's own writes;
- a receipt that cannot be written after the step ran: the step line, a journal line, exit 5; the
  next run reads the step back instead of running it again;
- the journal keyed by device: an old (version 1) file loads, its ids kept apart.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import idemlink.host.journal as J
import idemlink.protocol.regular_file as regular_file
from idemlink.cli import UserError, build_parser
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host import journal_file as JL
from idemlink.host import journal_format as JF
from idemlink.host.command import SentRequest
from idemlink.host.device import Device
from idemlink.host.plan import load_plan
from idemlink.protocol.device_core import GENERATION_RESERVE, EffectKind
from idemlink.protocol.frame import Frame, FrameDecoder, FrameType
from idemlink.protocol.modbus import FunctionCode
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.pytest_plugin import start_pty_sim

CLI = [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())"]

PLAN = {"name": "summer", "steps": [
    {"write": {"threshold": "40.0", "mode": 2}},
    {"write": {"fan_setpoint": 80}},
    {"trigger": "self_clean"},
]}


def write_plan(path: Path, doc: dict[str, Any] = PLAN) -> Path:
    path.write_text(json.dumps(doc))
    return path


def apply(argv: list[str], device: SimulatedDevice, capsys: pytest.CaptureFixture[str],
          *, no_id: bool = False) -> tuple[int, dict[str, Any]]:
    """Run ``idemlink apply ... --json`` in-process against ``device``."""
    args = build_parser().parse_args(["apply", *argv, "--json"])

    def opener() -> Device:
        dev = Device(SimTransport(device), attempts=3)
        dev.connect()
        if no_id:  # an older firmware: HELLO without the identity extension
            assert dev.session.info is not None
            dev.session.info = dataclasses.replace(dev.session.info, device_id=None)
        return dev

    args.open_device = opener
    rc = args.handler(args)
    out = capsys.readouterr().out
    return rc, json.loads(out)


def held(device: SimulatedDevice) -> tuple[int, int, int]:
    c = device.core
    return c.value("threshold"), c.value("mode"), c.value("fan_setpoint")


def writes(device: SimulatedDevice, after: int = 0) -> list[bytes]:
    """Every request that changes registers (FC06/FC16/conditional/trigger) since ``after``."""
    reads = {FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS}
    return [e.request for e in device.executions[after:] if e.request[0] not in reads]


def started(device: SimulatedDevice) -> int:
    return device.core.count(EffectKind.TRIGGER_STARTED, "self_clean")


# ------------------------------------------------------------------ convergence, per device


def test_one_plan_two_devices_both_end_holding_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path / "plan.json")
    a, b = SimulatedDevice(seed=1), SimulatedDevice(seed=2)
    assert a.device_id != b.device_id
    rc, doc = apply([str(plan)], a, capsys)
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["written", "written", "executed"]
    assert held(a) == (400, 2, 80) and started(a) == 1
    # The second board: before, the journal kept per plan said "skipped" and left its defaults.
    rc, doc = apply([str(plan)], b, capsys)
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["written", "written", "executed"]
    assert held(b) == (400, 2, 80) and started(b) == 1
    # Again on each: nothing is sent but reads; the trigger does not start twice.
    for device in (a, b):
        before = len(device.executions)
        rc, doc = apply([str(plan)], device, capsys)
        assert rc == 0 and [s["state"] for s in doc["steps"]] == ["in_place", "in_place",
                                                                   "skipped"]
        assert writes(device, before) == [] and started(device) == 1
    assert JL.load_keyed(f"{plan}.journal").devices.keys() == {a.device_id, b.device_id}


def test_a_device_changed_by_hand_converges_writing_only_what_differs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path / "plan.json")
    device = SimulatedDevice(seed=3)
    assert apply([str(plan)], device, capsys)[0] == 0
    dev = Device(SimTransport(device))
    dev.connect()
    assert dev.write({"mode": 0}).ok and dev.write({"fan_setpoint": 10}).ok  # by hand
    before = len(device.executions)
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["written", "written", "skipped"]
    assert doc["steps"][0]["written"] == {"mode": 2}  # threshold already held 400: not written
    assert held(device) == (400, 2, 80) and started(device) == 1
    assert len(writes(device, before)) == 2


def test_a_reset_device_converges_and_its_trigger_stays_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path / "plan.json")
    flash = tmp_path / "flash"
    first = SimulatedDevice(seed=4, flash_dir=flash)
    assert apply([str(plan)], first, capsys)[0] == 0
    assert json.loads((flash / "config.json").read_text())["holdings"]
    (flash / "config.json").unlink()  # restore defaults: same board (same id), config wiped
    board = SimulatedDevice(seed=5, flash_dir=flash)
    assert board.device_id == first.device_id
    assert held(board) != (400, 2, 80)
    rc, doc = apply([str(plan)], board, capsys)
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["written", "written", "skipped"]
    assert held(board) == (400, 2, 80) and started(board) == 0  # once per device: it ran before
    holdings = dict(json.loads((flash / "config.json").read_text())["holdings"])
    assert (holdings[4], holdings[5], holdings[6]) == (400, 2, 80)


def test_a_device_without_id_is_refused_one_shot_steps_before_anything_is_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path / "plan.json")
    device = SimulatedDevice(seed=6)
    with pytest.raises(UserError, match="no device id"):
        apply([str(plan)], device, capsys, no_id=True)
    assert device.executions == [] and not Path(f"{plan}.journal").exists()
    writes_only = write_plan(tmp_path / "w.json", {"steps": PLAN["steps"][:2]})
    rc, _ = apply([str(writes_only)], device, capsys, no_id=True)  # set-only: no id needed
    assert rc == 0 and held(device) == (400, 2, 80)
    assert not Path(f"{writes_only}.journal").exists()  # nor a journal


def test_clear_and_conditional_write_run_once_per_device(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path / "plan.json", {"steps": [
        {"write": {"threshold": "50.0"}},
        {"write_if_generation": {"fan_setpoint": 77}},
        {"clear": {"faults": ["fan_stall"]}},
    ]})
    device = SimulatedDevice(seed=7)
    device.core.set_condition("fan_stall", True, 0.0)
    device.core.set_condition("fan_stall", False, 0.0)  # latched, condition gone
    rc, doc = apply([str(plan)], device, capsys)
    # The guard is the generation read at the start, advanced by this run's own write.
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["written", "executed", "executed"]
    assert device.core.value("fan_setpoint") == 77 and device.core.value("faults") == 0
    assert device.core.count(EffectKind.FAULT_CLEARED, "faults") == 1
    device.core.set_condition("fan_stall", True, 1.0)  # latches again
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["in_place", "skipped", "skipped"]
    assert device.core.count(EffectKind.FAULT_CLEARED, "faults") == 1  # not cleared behind our back


def test_plan_errors_are_one_line_and_send_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=8)
    for steps, match in (([{"trigger": "threshold"}], "not TRIGGER"),
                         ([{"clear": {"faults": ["nope"]}}], "no fault bit 'nope'"),
                         ([{"write": {"faults": 1}}], "use a \"clear\" step"),
                         ([{"reboot": 1}], "unknown step 'reboot'")):
        plan = write_plan(tmp_path / "bad.json", {"steps": steps})
        with pytest.raises(UserError, match=match):
            apply([str(plan)], device, capsys)
    assert device.executions == []


# ------------------------------------------------------------------ receipts that cannot be written


def test_receipt_write_failure_after_the_step_ran_is_exit_5_with_the_step_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan = write_plan(tmp_path / "plan.json", {"steps": [{"trigger": "self_clean"}]})
    device = SimulatedDevice(seed=9)
    real = regular_file._write_all
    calls: list[int] = []

    def disk_full_after_begin(fd: int, data: bytes) -> None:
        calls.append(fd)
        if len(calls) > 1:  # BEGIN was written; the receipt hits a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(regular_file, "_write_all", disk_full_after_begin)
    args = build_parser().parse_args(["apply", str(plan)])

    def opener() -> Device:
        dev = Device(SimTransport(device))
        dev.connect()
        return dev

    args.open_device = opener
    rc = args.handler(args)
    out, err = capsys.readouterr()
    assert started(device) == 1  # the device changed
    assert rc == 5
    assert "step 1/1 trigger self_clean: executed: OK (ACCEPTED: started)" in out
    assert err.count("\n") == 1 and "cannot record step 1" in err and "No space left" in err
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # temp removed
    monkeypatch.setattr(regular_file, "_write_all", real)
    # The journal still holds the step in flight: the next run reads it back (RUNNING: it ran).
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 0 and [(r["key"], r["executed"]) for r in doc["reconciled"]] == [
        (doc["steps"][0]["key"], True)]
    assert doc["steps"][0]["state"] == "skipped" and started(device) == 1


def test_old_format_journal_loads_and_keeps_its_ids_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path / "plan.json")
    journal = Path(f"{plan}.journal")
    old = load_plan(plan, DEFAULT_MAP).one_shot[0].key
    assert old is not None
    JL.save(journal, JF.Snapshot(frozenset({old})))  # a version-1 file holding the same key
    device = SimulatedDevice(seed=10)
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 0 and doc["steps"][2]["state"] == "executed" and started(device) == 1
    snap = JL.load_keyed(journal)
    assert snap.unscoped.done == {old} and snap.scope(device.device_id).done == {old}
    assert json.loads(journal.read_text())["version"] == 2
    assert journal.stat().st_mode & 0o777 == 0o600


# ------------------------------------------------------------------ one writer per journal


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60)


def test_a_second_apply_on_a_locked_journal_refuses_and_nothing_runs_twice(
        tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.json")
    journal = f"{plan}.journal"
    sim = start_pty_sim(SimulatedDevice(seed=11, trigger_duration=60.0))
    try:
        fd = os.open(JL.lock_path(journal), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another apply is running
            os.write(fd, f"{os.getpid()}\n".encode())
            with sim._shared.lock:
                before = len(sim.device.executions)
            r = run_cli("apply", "--port", sim.path, str(plan))
            assert r.returncode == 1 and r.stdout == ""
            assert r.stderr.count("\n") == 1 and f"in use by another process (pid {os.getpid()})" \
                in r.stderr
            with sim._shared.lock:
                assert len(sim.device.executions) == before  # not even opened
        finally:
            os.close(fd)  # the holder exits: its lock goes with it
        # Two real applies at once: one may refuse, one runs; nothing runs twice.
        procs = [subprocess.Popen([*CLI, "apply", "--port", sim.path, str(plan), "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        results = [(p.wait(60), p.communicate()) for p in procs]
        assert sorted(rc for rc, _ in results) in ([0, 0], [0, 1])
        with sim._shared.lock:
            assert started(sim.device) == 1
            assert (sim.device.core.value("threshold"), sim.device.core.value("fan_setpoint")) \
                == (400, 80)
        assert Path(JL.lock_path(journal)).exists()  # never deleted
    finally:
        sim.close()


def test_a_symlink_at_the_lock_path_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    journal = tmp_path / "j"
    Path(JL.lock_path(journal)).symlink_to(victim)
    with pytest.raises(JF.JournalUnsafeFileError):
        JL.lock_journal(journal)
    assert victim.read_text() == "keep"
    Path(JL.lock_path(journal)).unlink()
    with JL.lock_journal(journal), pytest.raises(JF.JournalBusyError):
        JL.lock_journal(journal)  # one writer, even within a process
    JL.lock_journal(journal).release()  # released on exit


class ChangedByOtherHost(SimTransport):
    """Before the ``n``-th request after HELLO reaches the device, another host sets
    threshold=123."""

    def __init__(self, device: SimulatedDevice, n: int) -> None:
        super().__init__(device)
        self._decoder = FrameDecoder()
        self._left = n

    def write(self, data: bytes) -> None:
        self._decoder.receive_data(data)
        for frame in iter(self._decoder.next_event, None):
            if isinstance(frame, Frame) and frame.type is FrameType.REQUEST:
                self._left -= 1
                if self._left == 0:
                    self.device.core.write(DEFAULT_MAP.named("threshold").address, (123,),
                                           self.now())
        super().write(data)


def test_conditional_step_fails_when_another_host_changed_the_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path / "plan.json", {"steps": [
        {"write_if_generation": {"fan_setpoint": 90}}]})
    device = SimulatedDevice(seed=12)
    t = ChangedByOtherHost(device, 2)  # request 1 reads the generation, request 2 is the write
    args = build_parser().parse_args(["apply", str(plan), "--json"])

    def opener() -> Device:
        dev = Device(t)
        dev.connect()
        return dev

    args.open_device = opener
    rc = args.handler(args)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 and doc["steps"][0]["state"] == "not_executed"
    assert device.core.value("fan_setpoint") != 90 and device.core.value("threshold") == 123
    key = doc["steps"][0]["key"]
    assert J.DeviceJournal.open(f"{plan}.journal").state(device.device_id, key) is \
        JF.StepState.ABSENT  # released: it may run again
    rc, doc = apply([str(plan)], device, capsys)  # a fresh run reads the new generation
    assert rc == 0 and device.core.value("fan_setpoint") == 90


def test_clear_step_cut_off_while_reading_the_word_first_leaves_nothing_in_flight(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C (or a port failing) during the read that precedes a fault clear: the clear was
    never sent, so the journal holds nothing in flight and the next run simply clears."""
    plan = write_plan(tmp_path / "plan.json", {"steps": [{"clear": {"faults": ["fan_stall"]}}]})
    device = SimulatedDevice(seed=12)
    device.core.set_condition("fan_stall", True, 0.0)
    device.core.set_condition("fan_stall", False, 0.0)  # latched, condition gone
    args = build_parser().parse_args(["apply", str(plan)])

    def opener() -> Device:
        dev = Device(SimTransport(device))
        dev.connect()

        def interrupted(*names: str, **kw: Any) -> Any:
            raise KeyboardInterrupt

        dev.read = interrupted  # type: ignore[method-assign]
        return dev

    args.open_device = opener
    with pytest.raises(KeyboardInterrupt):
        args.handler(args)
    capsys.readouterr()
    assert device.core.count(EffectKind.FAULT_CLEARED, "faults") == 0
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["executed"]
    assert "reconciled" not in doc and "in_flight" not in doc
    assert device.core.count(EffectKind.FAULT_CLEARED, "faults") == 1


# ------------------------------------------------------------------ in flight: verdicts by evidence
#
# A run killed between recording a one-shot step and hearing its answer leaves it in flight with
# the number it travels under. The next run may call it "ran" only on the device's evidence (its
# answer to the same request re-sent under that number); what a read-back shows (a fault bit a
# reboot cleared, values already set) is never taken for "it ran".

CLEAR_STALL = {"steps": [{"clear": {"faults": ["fan_stall"]}}]}
SET_80 = {"steps": [{"write_if_generation": {"fan_setpoint": 80}}]}


def left_in_flight(plan: Path, device: SimulatedDevice, *, send: bool) -> bytes:
    """What a run killed after recording the plan's only step leaves: the step pending in the
    journal with its request and number; the request never sent (``send=False``, a kill before
    it left) or run with its answer lost (``send=True``, a kill before the receipt)."""
    dev = Device(SimTransport(device), attempts=3)
    dev.connect()
    assert dev.info is not None and dev.info.device_id is not None
    step = load_plan(str(plan), DEFAULT_MAP).steps[0]
    if step.kind.value == "clear":
        cmd = dev.clear_faults_command(step.mask, "faults")
    else:
        generation = dev.read("generation").values[0]
        cmd = dev.write_if_generation_command(generation, step.values)
    journal = J.DeviceJournal.open(f"{plan}.journal")
    device_id = dev.info.device_id

    def record(sent: SentRequest) -> None:
        journal.begin(device_id, step.key, JF.SentRecord(sent.pdu, sent.number))

    if send:
        assert dev.execute_recorded(cmd, record).ok
    else:
        number = dev.ops.session.next_number()
        assert number is not None
        record(SentRequest(cmd.pdu(), number))
    return cmd.pdu()


def runs_of(device: SimulatedDevice, pdu: bytes) -> int:
    """Ground truth: how many times the device executed exactly ``pdu``."""
    return sum(e.request == pdu for e in device.executions)


def latched_stall() -> SimulatedDevice:
    device = SimulatedDevice(seed=21)
    device.core.set_condition("fan_stall", True, 0.0)
    device.core.set_condition("fan_stall", False, 0.0)  # latched, condition gone
    return device


def test_a_clear_in_flight_across_a_reboot_is_unknown_never_ran(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20's reproduction: the reboot cleared the bit, the clear never ran. Before the fix
    this said "read back: it ran (receipted)", exit 0, with 0 executions on the device."""
    plan = write_plan(tmp_path / "plan.json", CLEAR_STALL)
    device = latched_stall()
    pdu = left_in_flight(plan, device, send=False)
    device.reboot(1.0)
    assert device.core.value("faults") == 0  # what a read-back sees: the bit is clear
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 5 and doc["outcome"] == "UNKNOWN" and doc["in_flight"]
    assert "reconciled" not in doc
    assert runs_of(device, pdu) == 0
    args = build_parser().parse_args(["apply", str(plan)])
    args.open_device = lambda: _connected(device)
    assert args.handler(args) == 5
    out = capsys.readouterr().out
    assert "read back: the bits are clear; whether this step ran is unknown (the device " \
           "restarted since" in out, out
    assert "it ran" not in out.split("whether this step ran")[0]
    assert "--resolve" in out
    assert runs_of(device, pdu) == 0
    assert J.DeviceJournal.open(f"{plan}.journal").pending(device.device_id)  # still in flight


def _connected(device: SimulatedDevice) -> Device:
    dev = Device(SimTransport(device), attempts=3)
    dev.connect()
    return dev


def test_a_clear_in_flight_in_the_same_boot_is_settled_by_the_device(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Epoch unchanged: the journaled request is re-sent under its number. Never sent: it runs
    now, once. Sent and run (answer lost): the device replays its answer; nothing runs again."""
    for send, evidence in ((False, "it ran now, once"), (True, "it replayed its answer")):
        plan = write_plan(tmp_path / f"plan-{send}.json", CLEAR_STALL)
        device = latched_stall()
        pdu = left_in_flight(plan, device, send=send)
        rc, doc = apply([str(plan)], device, capsys)
        assert rc == 0, doc
        (rec,) = doc["reconciled"]
        assert rec["executed"] is True and evidence in rec["evidence"], rec
        assert doc["steps"][0]["state"] == "skipped"
        assert runs_of(device, pdu) == 1  # exactly once, whichever way it went
        assert device.core.count(EffectKind.FAULT_CLEARED, "faults") == 1
        rc, doc = apply([str(plan)], device, capsys)
        assert rc == 0 and doc["steps"][0]["state"] == "skipped" and runs_of(device, pdu) == 1


def test_a_conditional_write_in_flight_on_a_device_already_holding_its_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 20's second reproduction: the values were already there, so a read-back cannot
    tell; the generation the write would have produced is what matters. Same boot: the device
    settles it (it runs now, once, and its answer names the generation). After a reboot:
    UNKNOWN."""
    for reboot in (False, True):
        plan = write_plan(tmp_path / f"plan-{reboot}.json", SET_80)
        device = SimulatedDevice(seed=22)
        _connected(device).write({"fan_setpoint": 80})
        generation = device.core.value("generation")
        pdu = left_in_flight(plan, device, send=False)
        if reboot:
            device.reboot(1.0)
        rc, doc = apply([str(plan)], device, capsys)
        if reboot:
            assert rc == 5 and "reconciled" not in doc and runs_of(device, pdu) == 0
            # nothing ran: the generation is the boot's, the ceiling the write saved
            assert device.core.value("generation") == generation + GENERATION_RESERVE
        else:
            assert rc == 0 and doc["reconciled"][0]["executed"] is True
            assert runs_of(device, pdu) == 1
            # the generation it produced comes from the device's answer, not from appearance
            assert f"generation now {device.core.value('generation')}" in \
                doc["reconciled"][0]["evidence"]


def test_the_journal_records_the_number_before_the_request_leaves(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The step's (epoch, seq) and request are on disk when the device runs it: a kill at any
    moment after that leaves evidence a later run can ask about."""
    plan = write_plan(tmp_path / "plan.json", CLEAR_STALL)
    device = latched_stall()
    seen: list[JF.SentRecord | None] = []
    real = device.receive_data

    def spy(data: bytes, now: float | None = None) -> None:
        journal = J.DeviceJournal.open(f"{plan}.journal")
        for key in journal.pending(device.device_id):
            seen.append(journal.sent_record(device.device_id, key))
        real(data, now) if now is not None else real(data)

    device.receive_data = spy  # type: ignore[method-assign]
    rc, _ = apply([str(plan)], device, capsys)
    assert rc == 0
    (record,) = {r for r in seen if r is not None}
    (run,) = [e for e in device.executions if e.request == record.request]
    assert record.number == (run.epoch, run.seq)


def _appearance_ask(self: Any, step: Any, sent: Any) -> tuple[bool | None, Any, str]:
    """The verdict before issue 20, a mutant: the effect is present, so "it ran"."""
    from idemlink.protocol.outcome import Outcome
    rec = self.dev.reconcile_sent(self.read_back_command(step), ())
    if rec.intended_state_holds:
        return True, Outcome.OK, "read back: it ran (receipted)"
    return None, None, ""


def test_a_verdict_taken_from_appearance_is_caught(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutant: apply judging an in-flight step by what a read-back shows (the code before issue
    20). The ground-truth check these tests use — every "ran" needs an execution on the device —
    must catch it."""
    from idemlink.commands.apply_cmd import ApplyRun
    monkeypatch.setattr(ApplyRun, "ask", _appearance_ask)
    plan = write_plan(tmp_path / "plan.json", CLEAR_STALL)
    device = latched_stall()
    pdu = left_in_flight(plan, device, send=False)
    device.reboot(1.0)
    rc, doc = apply([str(plan)], device, capsys)
    with pytest.raises(AssertionError):
        assert_every_ran_ran(doc, device, pdu)
    assert rc == 0  # the mutant's false "it ran"


def test_a_reconcile_that_takes_the_state_for_evidence_is_caught(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutant: the evidence rule itself taking a state that holds for "it ran" when no re-send
    can ask (``with_evidence``): caught by the same ground-truth check."""
    import dataclasses as dc

    import idemlink.host.operations as operations

    def appearance(read_back: Any, resent: Any, why: str) -> Any:
        return dc.replace(read_back, executed=read_back.intended_state_holds or None,
                          evidence="read back")

    monkeypatch.setattr(operations, "with_evidence", appearance)
    plan = write_plan(tmp_path / "plan.json", CLEAR_STALL)
    device = latched_stall()
    pdu = left_in_flight(plan, device, send=False)
    device.reboot(1.0)
    _, doc = apply([str(plan)], device, capsys)
    with pytest.raises(AssertionError):
        assert_every_ran_ran(doc, device, pdu)


def assert_every_ran_ran(doc: dict[str, Any], device: SimulatedDevice, pdu: bytes) -> None:
    """Every step apply says ran (reconciled executed, executed, skipped) ran on the device."""
    said = any(r["executed"] for r in doc.get("reconciled", [])) or any(
        s["state"] in ("executed", "skipped") for s in doc["steps"])
    assert not said or runs_of(device, pdu) >= 1, "apply said a step ran that never ran"


def test_a_journaled_request_that_is_not_the_steps_is_never_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The journal is a file: a record whose request is not the step's own (tampered, or left by
    another plan under the same key) is never re-sent — no evidence, the step stays UNKNOWN."""
    plan = write_plan(tmp_path / "plan.json", CLEAR_STALL)
    device = latched_stall()
    dev = _connected(device)
    step = load_plan(str(plan), DEFAULT_MAP).steps[0]
    number = dev.ops.session.next_number()
    assert number is not None
    forged = dev.trigger_command().pdu()  # not a clear
    J.DeviceJournal.open(f"{plan}.journal").begin(device.device_id, step.key,
                                                   JF.SentRecord(forged, number))
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 5 and runs_of(device, forged) == 0 and "reconciled" not in doc


def evicted_in_flight(plan: Path, device: SimulatedDevice, *, stale_guard: bool = False) -> bytes:
    """The plan's first step run by a process killed before its receipt, and its answer since
    evicted from the device's replay cache by that process's later reads (same boot): a re-send
    under its number is answered ANSWER_EVICTED. ``stale_guard``: a conditional write sent with
    a guard the generation had already left (it ran: GUARD_FAILED, nothing written)."""
    dev = _connected(device)
    step = load_plan(str(plan), DEFAULT_MAP).steps[0]
    if step.kind.value == "clear":
        cmd = dev.clear_faults_command(step.mask, "faults")
    else:
        generation = dev.read("generation").values[0]
        cmd = dev.write_if_generation_command((generation + stale_guard) & 0xFFFF, step.values)
    journal = J.DeviceJournal.open(f"{plan}.journal")

    def record(sent: SentRequest) -> None:
        journal.begin(device.device_id, step.key, JF.SentRecord(sent.pdu, sent.number))

    assert dev.execute_recorded(cmd, record).answered
    for _ in range(3):
        dev.read("generation")
    return cmd.pdu()


def test_a_step_settled_by_answer_evicted_lets_the_run_go_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the re-send's ANSWER_EVICTED settled the step, left the handle blocked, and the
    next step's read raised UnknownOutstanding (a traceback) after the journal was changed."""
    plan = write_plan(tmp_path / "plan.json", {"steps": [
        {"clear": {"faults": ["fan_stall"]}}, {"write": {"fan_setpoint": 80}}]})
    device = SimulatedDevice(seed=21, replay_slots=2)
    device.core.set_condition("fan_stall", True, 0.0)
    device.core.set_condition("fan_stall", False, 0.0)
    pdu = evicted_in_flight(plan, device)
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 0, doc
    (rec,) = doc["reconciled"]
    assert rec["executed"] is True and "ANSWER_EVICTED" in rec["evidence"], rec
    assert [s["state"] for s in doc["steps"]] == ["skipped", "written"]
    assert runs_of(device, pdu) == 1 and device.core.value("fan_setpoint") == 80


def test_a_conditional_write_whose_answer_was_evicted_is_not_reported_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ANSWER_EVICTED says the request ran, not that its guard held: this one failed its guard
    and wrote nothing. Before: "executed … (the device says it ran)" — exit 0, receipted, and
    every later run "skipped (ran before)" with the plan's value never written."""
    plan = write_plan(tmp_path / "plan.json", SET_80)
    device = SimulatedDevice(seed=22, replay_slots=2)
    generation = device.core.value("generation")
    pdu = evicted_in_flight(plan, device, stale_guard=True)
    rc, doc = apply([str(plan)], device, capsys)
    assert rc == 5 and doc["outcome"] == "UNKNOWN" and doc["in_flight"], doc
    assert "reconciled" not in doc
    assert runs_of(device, pdu) == 1  # ran once (guard failed), never again
    assert device.core.value("fan_setpoint") != 80
    assert device.core.value("generation") == generation
    assert J.DeviceJournal.open(f"{plan}.journal").pending(device.device_id)
    args = build_parser().parse_args(["apply", str(plan)])
    args.open_device = lambda: _connected(device)
    assert args.handler(args) == 5
    out = capsys.readouterr().out
    assert "skipped" not in out and "--resolve" in out and runs_of(device, pdu) == 1


def test_a_step_whose_answers_were_lost_and_the_device_settles_lets_the_run_go_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A clear's every answer lost in this run: UNKNOWN, re-sent under its number, the device
    replays its answer (it ran) and the run goes on to the next step. Before: the handle stayed
    blocked and the next step raised UnknownOutstanding (a traceback), the clear receipted."""
    from idemlink.device_sim.link import FrameFault

    plan = write_plan(tmp_path / "plan.json", {"steps": [
        {"clear": {"faults": ["fan_stall"]}}, {"write": {"fan_setpoint": 80}}]})
    device = latched_stall()
    args = build_parser().parse_args(["apply", str(plan), "--json"])

    def opener() -> Device:
        t = SimTransport(device)
        dev = Device(t, attempts=3)
        dev.connect()
        t.link.b_to_a.force_frame_fault(FrameFault.DUPLICATE)  # the fault word's read: answered
        t.link.b_to_a.force_frame_fault(FrameFault.DROP, 3)  # every answer of the clear: lost
        return dev

    args.open_device = opener
    rc = args.handler(args)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert [s["state"] for s in doc["steps"]] == ["executed", "written"], doc
    assert "replayed" in doc["steps"][0]["reconcile"]["evidence"]
    assert device.core.count(EffectKind.FAULT_CLEARED, "faults") == 1
    assert device.core.value("fan_setpoint") == 80


def test_a_journaled_request_is_re_sent_byte_for_byte_or_not_at_all(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A journal whose in-flight clear was sent as FC16 with one register (another host's
    encoding of the same write): re-encoded, the re-send went out as FC06 under that number, the
    device refused it as another request's (IDEMPOTENCY_CONFLICT), apply took that for "it never
    ran", released the step and ran the clear a second time."""
    from idemlink.host.command import Command, CommandKind

    plan = write_plan(tmp_path / "plan.json", CLEAR_STALL)
    device = latched_stall()
    real_pdu = Command.pdu

    def fc16(self: Command) -> bytes:
        if self.kind is CommandKind.CLEAR_FAULTS:
            return bytes([0x10, 0, self.address, 0, 1, 2]) + self.values[0].to_bytes(2, "big")
        return real_pdu(self)

    monkeypatch.setattr(Command, "pdu", fc16)
    pdu = evicted_in_flight(plan, device)
    monkeypatch.setattr(Command, "pdu", real_pdu)
    assert pdu[0] == 0x10 and runs_of(device, pdu) == 1
    rc, doc = apply([str(plan)], device, capsys)
    clears = [e for e in device.executions if e.request[:1] in (b"\x06", b"\x10")
              and e.request[1:3] == pdu[1:3]]
    assert len(clears) == 1  # the step ran once, never again
    assert rc == 5 and doc["in_flight"], doc
