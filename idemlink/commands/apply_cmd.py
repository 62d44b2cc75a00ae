"""``idemlink apply PLAN.json``: bring one device to a plan, right for every device.

Contract (the plan format is ``idemlink.host.plan``; docs/CLI.md "apply"):

- Set-only ``write`` steps converge: the step's registers are read back first and only those that
  differ are written (one atomic write per contiguous run, ``atomic_writes``: a bit field by a
  mask write of its register, coils apart); a device that
  already holds the values gets no write and the step says ``already in place``. They need no
  journal: applying the plan to another device, or to one changed by hand, ends with that device
  holding the plan; applying it again is a no-op.
- One-shot steps (``trigger``, ``clear``, ``write_if_generation``) run at most once per device:
  their receipts live in the journal (default ``PLAN.json.journal``, ``DeviceJournal``) keyed by
  (device id as advertised at HELLO, step key). A device without an id (older firmware) cannot be
  told apart: a plan with one-shot steps is refused for it (exit 1, nothing sent). A plan without
  one-shot steps never touches the journal.
- One writer per journal: a plan with one-shot steps (and ``--resolve``) first takes
  ``lock_journal`` (``fcntl.flock`` on ``JOURNAL.lock``); another process holding it makes this one
  refuse at once (one line, exit 1, nothing sent).
- Steps run in plan order; the run stops at the first step that does not end OK. Each step's line
  is printed (text mode) as soon as it settles; ``--json`` prints one document at the end.
- Exit status: the worst outcome of the steps (UNKNOWN 5 > REJECTED 4 > NOT_EXECUTED 3 > OK 0).
  Exit 1 only while nothing that may have had an effect was sent. A journal that cannot be written
  once a step was sent: the step's real line, one ``journal`` line on stderr, exit 5 (the device
  changed, our record did not); the step is left in flight and the next run reads it back.
- ``--modbus-rtu [--unit N]`` applies the plan to a standard Modbus RTU slave (``RtuDevice``):
  set-only steps converge the same way (reads and writes retried: same absolute values); a
  trigger or fault clear is sent once, UNKNOWN without an answer and never retried (read back,
  left in flight). Its receipts are keyed by ``--device-id ID`` (the slave advertises none: a plan
  with one-shot steps is refused without it), and ``write_if_generation`` is refused (no
  function 0x41); both before anything is sent.
- A one-shot step's request and number are journaled before it is sent (``execute_recorded``). A
  step found in flight (an earlier run was cut off) is settled by the device's evidence only
  (``idemlink.host.evidence``): re-sent under its number in the same boot epoch, the device
  replays (it ran), says evicted (it ran), refuses it as another request's number (it never ran)
  or runs it now, once. Without evidence (another boot epoch, a plain Modbus slave, an older
  journal) what a read-back shows is said as what holds now, and the step stays UNKNOWN (exit 5,
  nothing runs) until ``--resolve KEY --executed|--not-executed`` settles it by hand
  (``--device ID`` when several devices hold it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

from idemlink.cli import EXIT_NOT_EXECUTED, EXIT_REJECTED, UserError, regmap_from
from idemlink.commands.apply_resolve import APPLY_SCHEMA, journal_problem, journal_refused, resolve_step
from idemlink.commands.common import (
    EXIT_OF_OUTCOME,
    add_rtu_options,
    device_options,
    not_sent,
    reading_entry,
    result_json,
    rtu_unit,
    worst,
)
from idemlink.commands.device_io import (
    AnyDevice,
    link_guarded,
    open_any_device,
    reconcile_doc,
    reconcile_json,
)
from idemlink.commands.faults_cmd import clear_notes
from idemlink.commands.many import SharedJournals
from idemlink.host.command import Command, Reconciliation, Result, SentRequest, atomic_writes, raw_in
from idemlink.host.device import Device
from idemlink.host.errors import LinkLost
from idemlink.host.frame_view import trigger_code_name
from idemlink.host.journal import DeviceJournal
from idemlink.host.journal_file import JournalLock, lock_journal
from idemlink.host.journal_format import JournalError, SentRecord, StepState, check_device_id
from idemlink.host.plan import Plan, PlanError, PlanStep, StepKind, load_plan, map_refusals
from idemlink.output import add_json_option, emit, error_json, print_json, register_entry
from idemlink.protocol.outcome import LocalProtocolError, Outcome
from idemlink.protocol.registers import RegisterKind, RegisterMap, TriggerState, TriggerStatus


def register(sub: Any) -> None:
    p = sub.add_parser("apply", parents=[device_options()],
                       help="bring a device to a plan: writes converge, one-shot steps journaled")
    p.add_argument("plan", metavar="PLAN.json", help="the plan file (format below, docs/CLI.md)")
    add_rtu_options(p)
    p.add_argument("--device-id", metavar="ID",
                   help="with --modbus-rtu: the id this slave's one-shot receipts are kept under "
                        "in the journal (a standard Modbus RTU slave advertises none: name it, "
                        "e.g. by its serial number)")
    add_json_option(p, "idemlink.apply/1")
    p.add_argument("--journal", metavar="PATH",
                   help="receipt journal of the one-shot steps (default: PLAN.json.journal)")
    p.add_argument("--no-check", action="store_true",
                   help="send even what the register map shows to be invalid")
    p.add_argument("--resolve", metavar="KEY",
                   help="settle a one-shot step left in flight (UNKNOWN) by hand, after checking "
                        "the device: with --executed or --not-executed; nothing is sent")
    p.add_argument("--device", metavar="ID",
                   help="with --resolve: the device whose step it is (needed when several hold it)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--executed", action="store_true", help="with --resolve: it ran (receipt it)")
    g.add_argument("--not-executed", action="store_true",
                   help="with --resolve: it did not run (it may run again)")
    p.set_defaults(handler=link_guarded(run_apply))


def run_apply(args: argparse.Namespace) -> int:
    journal_path = args.journal or f"{args.plan}.journal"
    if args.resolve is not None:
        return resolve_step(args, journal_path)
    if args.executed or args.not_executed or args.device is not None:
        raise UserError("--executed / --not-executed / --device go with --resolve KEY")
    regmap = regmap_from(args)
    try:
        plan = load_plan(args.plan, regmap)
    except PlanError as exc:
        raise UserError(str(exc)) from None
    check_rtu_plan(args, plan)
    if not args.no_check:
        refusals = map_refusals(plan)
        if refusals:
            step, why = refusals[0]
            line = (f"step {step.index + 1}: REJECTED (checked against the register map, "
                    f"nothing sent): {why}")
            emit(args, APPLY_SCHEMA, {"outcome": Outcome.REJECTED.name, "plan": plan.name,
                        "step": step.index + 1, **not_sent(why)}, [line])
            return EXIT_REJECTED
    lock: JournalLock | None = None
    journal: DeviceJournal | None = None
    if plan.one_shot:
        shared: SharedJournals | None = getattr(args, "shared_journals", None)
        try:
            if shared is not None:  # several ports: one journal, locked once for all of them
                journal = shared.get(journal_path)
            else:
                lock = lock_journal(journal_path)
                journal = DeviceJournal.open(journal_path)
        except JournalError as exc:
            if lock is not None:
                lock.release()
            raise journal_refused(journal_path, exc) from None
    try:
        with open_any_device(args) as dev:
            run = ApplyRun(args, dev, regmap, plan, journal, journal_path)
            try:
                return run.run()
            except LinkLost as exc:
                if run.effects_sent and not exc.unknown:
                    # Earlier steps were sent and settled; the rest did not run.
                    message = f"{exc}; the steps after the last line did not run"
                    print(f"idemlink apply: {message}", file=sys.stderr)
                    error_json(args, message, EXIT_NOT_EXECUTED,
                               outcome=Outcome.NOT_EXECUTED.name, steps=run.entries,
                               device_id=run.doc.get("device_id"))
                    return EXIT_NOT_EXECUTED
                raise
    finally:
        if lock is not None:
            lock.release()


def check_rtu_plan(args: argparse.Namespace, plan: Plan) -> None:
    """With ``--modbus-rtu``: what a standard slave cannot do is refused before anything is sent
    (a conditional write; one-shot steps without ``--device-id`` to key their receipts)."""
    device_id: str | None = getattr(args, "device_id", None)
    if rtu_unit(args) is None:
        if device_id is not None:
            raise UserError("--device-id names a Modbus RTU slave: it needs --modbus-rtu (an "
                            "idemlink device advertises its own id)")
        return
    conditional = [s for s in plan.steps if s.kind is StepKind.WRITE_IF_GENERATION]
    if conditional:
        raise UserError(f"step {conditional[0].index + 1}: write_if_generation needs the idemlink "
                        "conditional write (function 0x41), which a standard Modbus RTU slave "
                        "does not have; nothing sent")
    if plan.one_shot and device_id is None:
        raise UserError("a Modbus RTU slave advertises no device id, and one-shot steps (trigger, "
                        "clear) run at most once per device: name this slave with --device-id ID; "
                        "nothing sent")


@dataclass
class Settled:
    """How one step ended: its state word, outcome, JSON entry and text line."""

    outcome: Outcome
    entry: dict[str, Any]
    lines: list[str] = field(default_factory=list)


class ApplyRun:
    """One run of a plan against one opened device."""

    def __init__(self, args: argparse.Namespace, dev: AnyDevice, regmap: RegisterMap, plan: Plan,
                 journal: DeviceJournal | None, journal_path: str) -> None:
        self.args = args
        self.dev = dev
        self.regmap = regmap
        self.plan = plan
        self.journal = journal
        self.journal_path = journal_path
        self.device_id = ""
        self.effects_sent = False
        self.generation: int | None = None
        self.entries: list[dict[str, Any]] = []
        self.readings: list[dict[str, Any]] = []  #: what the step being sent read back
        self.clear_before: Result | None = None  #: a clear step's word, read before it is in flight
        self.outcomes: list[Outcome] = []
        self.doc: dict[str, Any] = {"plan": plan.name}

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        if isinstance(self.dev, Device):
            ident = self.dev.info.device_id if self.dev.info is not None else None
        else:  # a Modbus RTU slave: the id the user gave it (check_rtu_plan)
            ident = getattr(self.args, "device_id", None)
        self.doc["device_id"] = ident
        if self.journal is not None:
            if not ident:
                raise UserError(
                    f"{self.args.port or 'the device'} advertises no device id (older firmware): "
                    "one-shot steps (trigger, clear, write_if_generation) run at most once per "
                    "device and need one; nothing sent")
            try:
                self.device_id = check_device_id(ident)
            except JournalError as exc:
                raise UserError(f"{journal_problem(self.journal_path, exc)}; nothing sent") from None
            self.doc["journal"] = self.journal_path
            if not self.settle_in_flight():
                return self.finish()
        generation = self.regmap.generation
        if any(s.kind is StepKind.WRITE_IF_GENERATION for s in self.plan.steps):
            assert generation is not None  # a plan refuses the step without one (parse_plan)
            back = self.dev.read(generation.name)
            if not back.ok:
                self.outcomes.append(back.outcome)
                self.say(f"generation: {back.describe()} (read at the start; nothing sent)")
                return self.finish()
            self.generation = back.values[0]
            self.doc["generation_at_start"] = self.generation
        for step in self.plan.steps:
            settled = self.one_shot(step) if step.one_shot else self.converge(step)
            self.outcomes.append(settled.outcome)
            self.entries.append(settled.entry)
            for line in settled.lines:
                self.say(line)
            if settled.outcome is not Outcome.OK or settled.entry.get("journal_error"):
                break
        for step in self.plan.steps[len(self.entries):]:
            self.entries.append({"index": step.index + 1, "step": step.to_json(),
                                 "state": "not_run"})
            self.say(f"{self.head(step)}: not run")
        return self.finish()

    def finish(self) -> int:
        outcome = worst(self.outcomes)
        failed = any(e.get("journal_error") for e in self.entries)
        self.doc["outcome"] = (Outcome.UNKNOWN if failed else outcome).name
        self.doc["steps"] = self.entries
        if self.args.json:
            print_json(APPLY_SCHEMA, self.doc)
        return EXIT_OF_OUTCOME[Outcome.UNKNOWN] if failed else EXIT_OF_OUTCOME[outcome]

    def say(self, line: str) -> None:
        if not self.args.json:
            print(line, flush=True)

    def head(self, step: PlanStep) -> str:
        return f"step {step.index + 1}/{len(self.plan.steps)} {step.text()}"

    def entry(self, step: PlanStep, state: str, r: Result | None = None) -> dict[str, Any]:
        e: dict[str, Any] = {"index": step.index + 1, "step": step.to_json(), "state": state}
        if step.key is not None:
            e["key"] = str(step.key)
        if r is not None:
            e["result"] = result_json(r)
        return e

    # ------------------------------------------------------------------ set-only writes
    def converge(self, step: PlanStep) -> Settled:
        back = self.dev.execute(self.dev.read_covering([s for s, _ in step.writes]))
        if not back.ok:
            return Settled(back.outcome, self.entry(step, back.outcome.name.lower(), back),
                           [f"{self.head(step)}: read-back {back.describe()} (nothing written)"])
        now = {s.name: raw_in(s, back.command, back.values) for s, _ in step.writes}
        differ = [(s, v) for s, v in step.writes if now[s.name] != v]
        if not differ:
            e = self.entry(step, "in_place")
            e["written"] = {}
            e["registers"] = [reading_entry(s, back, now[s.name]) for s, _ in step.writes]
            return Settled(Outcome.OK, e, [f"{self.head(step)}: already in place"])
        groups = atomic_writes(differ)
        commands = [self.dev.write_command({s.name: v for s, v in group}) for group in groups]
        self.effects_sent = True
        results = self.dev.run(commands)
        outcome = worst(r.outcome for r in results)
        written = {s.name: v for group, r in zip(groups, results, strict=True) if r.ok
                   for s, v in group}
        if self.generation is not None:
            self.generation += sum(1 for r in results if r.ok)
        state = "written" if outcome is Outcome.OK else outcome.name.lower()
        e = self.entry(step, state)
        e["written"] = written
        e["registers"] = [{**register_entry(s, v), "outcome": Outcome.OK.name}
                          for s, v in step.writes if s.name in written]
        e["results"] = [result_json(r) for r in results]
        names = " ".join(f"{n}={self.regmap.named(n).typed(v)}" for n, v in written.items())
        subset = f" ({names})" if names and len(written) < len(step.writes) else ""
        lines = [f"{self.head(step)}: {state}{subset}: "
                 + "; ".join(r.describe() for r in results)]
        for r in results:
            if r.outcome is Outcome.UNKNOWN:
                rec, line = reconcile_json(self.dev, r)
                e.setdefault("reconciles", []).append(rec)
                lines.append(f"step {step.index + 1}: {line}")
        if outcome is Outcome.UNKNOWN:
            lines.append(f"UNKNOWN: `idemlink apply {self.args.plan}` again reads the step back "
                         "and converges")
        return Settled(outcome, e, lines)

    # ------------------------------------------------------------------ one-shot steps
    def one_shot(self, step: PlanStep) -> Settled:
        assert self.journal is not None and step.key is not None
        if self.journal.state(self.device_id, step.key) is StepState.DONE:
            return Settled(Outcome.OK, self.entry(step, "skipped"),
                           [f"{self.head(step)}: skipped (ran on device {self.device_id} "
                            "before)"])
        if step.kind is StepKind.TRIGGER:
            assert step.register is not None
            now = self.dev.trigger_status(step.register.name)
            if not now.ok:
                return Settled(now.outcome, self.entry(step, now.outcome.name.lower(), now),
                               [f"{self.head(step)}: state read {now.describe()} "
                                "(nothing started)"])
            if now.values[0] != TriggerState.IDLE:  # a command register's idle is 0 too
                is_command = step.register.kind is RegisterKind.COMMAND
                name = (f"running command {now.values[0]}" if is_command
                        else _state_name(now.values[0]))
                e = self.entry(step, "not_executed")
                e["registers"] = [reading_entry(step.register, now)]
                e["result"] = {**not_sent(f"the trigger is {name}"),
                               "outcome": Outcome.NOT_EXECUTED.name,
                               "detail": f"NOT_EXECUTED (not sent: the trigger is {name})"}
                hint = ("it returns to 0 when done" if is_command else
                        f"`idemlink trigger {step.register.name} --reset` re-arms it")
                return Settled(Outcome.NOT_EXECUTED, e,
                               [f"{self.head(step)}: not started: the trigger is {name} "
                                f"({hint})"])
        if step.kind is StepKind.CLEAR:  # read before the step is in flight: nothing sent yet
            assert step.register is not None
            self.clear_before = self.dev.read(step.register.name)
        command = self.command_of(step)
        journal, device_id, key = self.journal, self.device_id, step.key

        def record(sent: SentRequest) -> None:  # in flight, with its number, before it leaves
            journal.begin(device_id, key, SentRecord(sent.pdu, sent.number))

        try:
            r = self.dev.execute_recorded(command, record)
        except JournalError as exc:
            if not self.effects_sent:
                raise UserError(f"{journal_problem(self.journal_path, exc)}; step {step.index + 1} "
                                "not sent") from None
            print(f"idemlink apply: journal {self.journal_path}: {exc}; step {step.index + 1} "
                  "not sent", file=sys.stderr)
            return Settled(Outcome.NOT_EXECUTED, self.entry(step, "not_run"),
                           [f"{self.head(step)}: not run (journal error)"])
        if self.journal.state(self.device_id, step.key) is not StepState.PENDING:
            # no number could be given (a handshake under way): nothing recorded, nothing sent
            return Settled(r.outcome, self.entry(step, "not_run", r),
                           [f"{self.head(step)}: not run: {r.describe()}"])
        self.effects_sent = True
        self.readings = []
        outcome, note = self.judge(step, r)
        state = {Outcome.OK: "executed", Outcome.UNKNOWN: "unknown"}.get(
            outcome, outcome.name.lower())
        e = self.entry(step, state, r)
        if self.readings:
            e["registers"] = self.readings
        lines = [f"{self.head(step)}: {state}: {r.describe()}{note}"]
        if outcome is Outcome.UNKNOWN:
            rec = self.dev.reconcile(r)
            doc, line = reconcile_doc(rec)
            e["reconcile"] = doc
            lines.append(f"step {step.index + 1}: {line}")
            if rec is not None and rec.executed is not None:  # the device's evidence settled it
                self.dev.acknowledge_unknown()  # reconciled: the handle may send again
                outcome, settled_note = self.evidence_outcome(step, rec)
                state = {Outcome.OK: "executed"}.get(outcome, outcome.name.lower())
                e["state"] = state
                lines.append(f"step {step.index + 1}: {state}{settled_note}")
                if outcome is Outcome.UNKNOWN:
                    lines.append(f"UNKNOWN: step {step.index + 1} stays in flight in journal "
                                 f"{self.journal_path}; settle it: --resolve {step.key} "
                                 "--executed|--not-executed")
            else:
                lines.append(f"UNKNOWN: step {step.index + 1} stays in flight in journal "
                             f"{self.journal_path}; `idemlink apply {self.args.plan}` again asks "
                             "the device, or settle it: "
                             f"--resolve {step.key} --executed|--not-executed")
        try:
            if outcome is Outcome.OK:
                self.journal.complete(self.device_id, step.key)
            elif outcome is not Outcome.UNKNOWN:
                self.journal.resolve(self.device_id, step.key, executed=False)
        except JournalError as exc:
            e["journal_error"] = str(exc)
            for line in lines:
                self.say(line)
            print(f"idemlink apply: journal {self.journal_path}: cannot record step "
                  f"{step.index + 1} ({state}) for device {self.device_id}: {exc}. The device "
                  "changed but the journal did not: the step stays in flight; once the journal "
                  f"is writable `idemlink apply {self.args.plan}` asks the device about it",
                  file=sys.stderr, flush=True)
            return Settled(outcome, e, [])
        return Settled(outcome, e, lines)

    def command_of(self, step: PlanStep) -> Command:
        """The request a one-shot step sends (a conditional write guarded by the generation this
        run knows)."""
        assert step.register is not None or step.writes
        if step.kind is StepKind.TRIGGER:
            assert step.register is not None
            return self.dev.trigger_command(step.register.name)
        if step.kind is StepKind.CLEAR:
            assert step.register is not None
            return self.dev.clear_faults_command(step.mask, step.register.name)
        assert self.generation is not None
        return self.dev.write_if_generation_command(self.generation, step.values)

    def judge(self, step: PlanStep, r: Result) -> tuple[Outcome, str]:
        """A one-shot step's outcome from its request's result, and a note for its line."""
        if step.kind is StepKind.TRIGGER:
            if not r.ok or r.code is None:
                return r.outcome, ""
            name = trigger_code_name(r.code)
            if r.code == TriggerStatus.ACCEPTED:
                return Outcome.OK, f" ({name}: started)"
            if r.code in (TriggerStatus.RUNNING, TriggerStatus.DONE):
                return Outcome.NOT_EXECUTED, f" ({name}: nothing started)"
            return Outcome.REJECTED, f" ({name})"
        if step.kind is StepKind.CLEAR:
            assert step.register is not None
            first = self.clear_before
            if not r.ok:
                return r.outcome, ""
            back = self.dev.read(step.register.name)
            if not back.ok:
                return r.outcome, ""
            self.readings = [reading_entry(step.register, back)]
            notes = clear_notes(step.register, step.mask,
                                first.values[0] if first is not None and first.ok else None,
                                back.values[0])
            return r.outcome, (f" ({'; '.join(notes)})" if notes else "")
        guard = r.command.generation
        if r.ok and r.code is not None:
            self.generation = r.code
            return r.outcome, f" (generation now {r.code})"
        if r.outcome is Outcome.NOT_EXECUTED and r.code is not None:
            return r.outcome, (f" (generation is {r.code}, the step expected {guard}: the "
                               "configuration changed since it was read)")
        return r.outcome, ""

    def evidence_outcome(self, step: PlanStep, rec: Reconciliation) -> tuple[Outcome, str]:
        """The step's outcome once the device's evidence (``rec.executed`` not None) settled
        whether its request ran: by the answer the re-send got when one came (replayed or run
        now, judged like a first answer), NOT_EXECUTED when it proves the request never ran.
        When the device only says it ran (its answer evicted): OK for a clear (writing the bits
        is its effect), UNKNOWN for a trigger or a conditional write — it ran, but whether the
        trigger started or the guard held was in the answer that is gone (the step stays in
        flight: it must not run again, and only ``--resolve`` settles it)."""
        resent = rec.resent
        if rec.executed is False:
            return Outcome.NOT_EXECUTED, " (the device proves it never ran)"
        if resent is not None and resent.answered:
            outcome, note = self.judge(step, resent)
            return outcome, note
        if step.kind is StepKind.CLEAR:
            return Outcome.OK, " (the device says it ran; its answer is gone)"
        what = ("whether the trigger started" if step.kind is StepKind.TRIGGER
                else "whether its generation guard held")
        return Outcome.UNKNOWN, (f" (the device says it ran, but its answer is gone: {what} "
                                 "is unknown)")

    # ------------------------------------------------------------------ steps left in flight
    def settle_in_flight(self) -> bool:
        """Ask the device about this device's one-shot steps left in flight by an earlier run;
        True when none is left UNKNOWN (the run may go on). "It ran" rests only on the device's
        evidence (``idemlink.host.evidence``): the journaled request re-sent under its number
        while the boot epoch is unchanged. Otherwise what a read-back shows is said as what
        holds now, and the step stays UNKNOWN until ``--resolve``."""
        assert self.journal is not None
        by_key = {s.key: s for s in self.plan.one_shot}
        unknown: list[str] = []
        for key in sorted(self.journal.pending(self.device_id), key=str):
            step = by_key.get(key)
            where = (f"step {step.index + 1} ({step.text()})" if step is not None
                     else f"step {key}, which is not in this plan (was the plan edited?)")
            sent = self.journal.sent_record(self.device_id, key)
            verdict, outcome, said = (None, None, "") if step is None else self.ask(step, sent)
            if verdict is None or outcome is Outcome.UNKNOWN:
                unknown.append(str(key))
                said = said if not said or said.startswith(";") else f"; {said}"
                self.say(f"UNKNOWN: journal {self.journal_path} holds {where} in flight for "
                         f"device {self.device_id}{said}: nothing runs until it is settled. "
                         f"Check the device, then `idemlink apply {self.args.plan} --resolve "
                         f"{key} --executed` (it ran) or `--not-executed` (it did not)")
                continue
            assert step is not None
            try:
                self.journal.resolve(self.device_id, key, executed=outcome is Outcome.OK)
            except JournalError as exc:
                raise UserError(f"{journal_problem(self.journal_path, exc)}") from None
            self.say(f"step {step.index + 1}: was in flight; {said}")
            self.doc.setdefault("reconciled", []).append(
                {"key": str(key), "executed": verdict, "evidence": said,
                 "outcome": outcome.name if outcome is not None else None})
        if unknown:
            self.doc["in_flight"] = unknown
            self.outcomes.append(Outcome.UNKNOWN)
            return False
        return True

    def ask(self, step: PlanStep, sent: SentRecord | None,
            ) -> tuple[bool | None, Outcome | None, str]:
        """Did the in-flight ``step`` run, by the device's evidence: (executed, the step's outcome
        when settled, the sentence saying so)."""
        command = self.read_back_command(step)
        numbers: tuple[tuple[int, int], ...] = ()
        why: str | None = None
        if sent is None:
            if isinstance(self.dev, Device):
                why = "the journal holds no number for it (written by an older idemlink)"
        elif sent.number is not None:
            try:
                recorded: Command | None = self.dev.command_of_pdu(sent.request)
            except LocalProtocolError:
                recorded = None
            if (recorded is not None and _same_request(recorded, command)
                    and recorded.pdu() == sent.request):
                command, numbers = recorded, (sent.number,)
            elif recorded is not None and _same_request(recorded, command):
                # the same write in other bytes (e.g. FC16 of one register): re-sent as this
                # host encodes it, the device would refuse it as another request's number
                # (IDEMPOTENCY_CONFLICT) — "never ran" — though the journaled bytes may have run
                why = ("the journal's record of its request is encoded otherwise than this host "
                       "sends it: it cannot be re-sent byte for byte")
            else:  # never send what the journal holds unless it is this step's own request
                why = "the journal's record of its request is not this step's request"
        rec = self.dev.reconcile_sent(command, numbers)
        if rec.executed is not None:  # reconciled by the device's word: the handle may send again
            self.dev.acknowledge_unknown()
        if why is not None and rec.executed is None:
            rec = dataclasses.replace(rec, evidence=why)
        now = f"read back: {rec.summary}"
        if rec.executed is None:
            return None, None, (f"; {now}; whether this step ran is unknown "
                                f"({rec.evidence})")
        outcome, note = self.evidence_outcome(step, rec)
        return rec.executed, outcome, f"asked the device: {rec.evidence}{note}"

    def read_back_command(self, step: PlanStep) -> Command:
        """The command whose registers a read-back of ``step`` reads (no request recorded)."""
        if step.kind is StepKind.WRITE_IF_GENERATION:
            return self.dev.write_if_generation_command(0, step.values)
        return self.command_of(step)


def _same_request(recorded: Command, step: Command) -> bool:
    """Is a journaled request the step's own (a conditional write's guard may differ)?"""
    return (recorded.kind, recorded.address, recorded.count, recorded.values) == (
        step.kind, step.address, step.count, step.values)


def _state_name(value: int) -> str:
    try:
        return TriggerState(value).name
    except ValueError:
        return f"0x{value:04X}"
