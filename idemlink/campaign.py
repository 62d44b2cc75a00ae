"""The fault campaign: mixed commands through a lossy link with reboots, judged by an oracle.

``run_campaign(CampaignConfig)`` drives a ``idemlink.host.device.Device`` against a ``SimulatedDevice``
through the link emulator on a simulated clock (``SimTransport``), so a run is reproducible from its
seed and 20,000 commands take seconds. The oracle compares every host outcome with the device's
ground truth (its execution log and the register core's effect log) and counts:

- ``duplicated_effects`` — a request that ran more than once under one (epoch, seq), or a command
  that is not set-only (trigger, fault clear, conditional write) that ran more than once at all.
  A set-only write re-issued after a reboot (the documented epoch rule) may run once per epoch; that
  is counted separately as ``reissued_set_only`` and is harmless by its semantics; twice in one
  epoch is a duplicate. Also every execution of a batch must be claimed, via ``sent_as``, by
  exactly one result whose request PDU is the one executed (an unclaimed run is a duplicate).
- ``lost_acknowledged_writes`` — a holding register whose value on the device differs from what the
  acknowledged (OK) writes, in order, say it must be.
- ``misclassified`` — OK that did not run exactly as answered (no execution, or another answer than
  the one executed); an outcome other than the executed response PDU means, decoded here from the
  bytes and not by host code (exception: REJECTED, 04: UNKNOWN; guard failure: NOT_EXECUTED; else
  OK), unless UNKNOWN; an OK read whose values are not the big-endian decode of the executed
  answer; NOT_EXECUTED or REJECTED whose request caused any side effect; an UNKNOWN that
  ``reconcile()`` could not resolve, or resolved against the truth.
"""

from __future__ import annotations

import random
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Command, CommandKind, Device, Result, answer_of
from idemlink.protocol.device_core import EffectKind
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import RegisterKind, RegisterSpec, TriggerStatus

#: The device's own answer, read without host code: what a host must report for it.
_GUARD_FUNCTION = 0x41
_GUARD_FAILED = 0x12
_SERVER_DEVICE_FAILURE = 0x04
_TRIGGER_FUNCTION = 0x42
_TRIGGER_VERDICT: dict[int, Outcome] = {int(TriggerStatus.ABNORMAL_STATE): Outcome.UNKNOWN,
                                         int(TriggerStatus.ILLEGAL_VALUE): Outcome.REJECTED}


def _truth_outcome(request: bytes, response: bytes) -> Outcome:
    """The outcome an execution's response PDU means, decoded here from the bytes alone."""
    if response[:1] and response[0] & 0x80:
        exc = response[1] if len(response) > 1 else _SERVER_DEVICE_FAILURE
        return Outcome.UNKNOWN if exc == _SERVER_DEVICE_FAILURE else Outcome.REJECTED
    if request[:1] == bytes([_GUARD_FUNCTION]) and len(response) > 1 and response[1] == _GUARD_FAILED:
        return Outcome.NOT_EXECUTED
    if request[:1] == bytes([_TRIGGER_FUNCTION]) and len(response) == 5:
        code = int.from_bytes(response[3:5], "big")
        return _TRIGGER_VERDICT.get(code, Outcome.OK)
    return Outcome.OK


@dataclass(frozen=True, slots=True)
class CampaignConfig:
    commands: int = 20_000
    loss: float = 0.1  #: per-frame loss, each direction
    dup: float = 0.02  #: per-frame duplication, each direction
    corrupt: float = 0.02  #: per-frame corruption (one bit flipped), each direction
    reorder: float = 0.0  #: per-frame reordering
    byte_loss: float = 0.0
    noise_rate: float = 0.0  #: noise bursts per simulated second
    reboot_every: int = 500  #: mean commands between device reboots (0: never)
    seed: int = 1
    baud: int | None = 115200
    latency: float = 0.001
    timeout: float = 0.03
    attempts: int = 6
    max_batch: int = 4  #: commands pipelined together (1..max_batch)


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """The campaign's running counts after one batch (``run_campaign(..., timeline=[])``; plotted
    by ``idemlink.soak_plot``)."""

    commands: int
    seconds: float  #: simulated
    retries: int
    replays: int
    unknown: int
    reboots: int


@dataclass(slots=True)
class CampaignReport:
    config: dict[str, Any]
    commands: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    replays: int = 0
    reissued_set_only: int = 0
    reboots: int = 0
    unknown_reconciled: int = 0
    unknown_unresolved: int = 0  #: UNKNOWN whose read-back was lost too (honest, not a failure)
    duplicated_effects: int = 0
    lost_acknowledged_writes: int = 0
    misclassified: int = 0
    problems: list[str] = field(default_factory=list)
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    link: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not (self.duplicated_effects or self.lost_acknowledged_writes or self.misclassified)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcomes"] = dict(self.outcomes)
        d["problems"] = self.problems[:20]
        d["passed"] = self.passed
        d["commands_per_second"] = round(self.commands / self.wall_seconds, 1) if self.wall_seconds else 0
        return d


class _Campaign:
    def __init__(self, cfg: CampaignConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        link = LinkConfig(
            baud=cfg.baud, latency=cfg.latency, loss=cfg.byte_loss, frame_loss=cfg.loss,
            frame_dup=cfg.dup, frame_corrupt=cfg.corrupt, reorder=cfg.reorder,
            reorder_max_hold=0.01 if cfg.reorder else None, noise_rate=cfg.noise_rate,
            seed=cfg.seed,
        )
        link_back = LinkConfig(**{**asdict(link), "seed": cfg.seed + 7919})
        self.sim = SimulatedDevice(seed=cfg.seed, trigger_duration=0.05)
        self.transport = SimTransport(self.sim, link, link_back)
        self.dev = Device(self.transport, timeout=cfg.timeout, attempts=cfg.attempts,
                          max_inflight=cfg.max_batch)
        self.report = CampaignReport(config=asdict(cfg))
        rm = self.sim.core.regmap
        self.holdings = rm.of_kind(RegisterKind.HOLDING)
        self.fault = rm.of_kind(RegisterKind.FAULT)[0]
        self.trigger = rm.of_kind(RegisterKind.TRIGGER)[0]
        self.model = {s.address: s.default for s in self.holdings}
        self.known_generation = 0

    # -------------------------------------------------------------- command mix
    def _value(self, spec: RegisterSpec) -> int:
        if self.rng.random() < 0.05:
            return min(0xFFFF, spec.maximum + 1 + self.rng.randrange(100))  # out of range
        return self.rng.randint(spec.minimum, spec.maximum)

    def _command(self) -> Command:
        r = self.rng.random()
        first = self.holdings[0].address
        if r < 0.25:
            spec = self.rng.choice(self.holdings)
            return Command(CommandKind.WRITE, spec.address, 1, (self._value(spec),))
        if r < 0.40:
            vals = tuple(self._value(s) for s in self.holdings)
            return Command(CommandKind.WRITE, first, len(vals), vals)
        if r < 0.50:
            gen = self.known_generation if self.rng.random() < 0.6 else self.rng.randrange(0x10000)
            spec = self.rng.choice(self.holdings)
            return Command(CommandKind.WRITE_IF_GENERATION, spec.address, 1,
                           (self._value(spec),), generation=gen)
        if r < 0.60:
            return Command(CommandKind.CLEAR_FAULTS, self.fault.address, 1,
                           (self.rng.choice([1, 2, 4, 7, self.fault.fault_mask]),))
        if r < 0.68:
            return Command(CommandKind.TRIGGER, self.trigger.address)
        if r < 0.74:
            return Command(CommandKind.TRIGGER_RESET, self.trigger.address)
        return Command(CommandKind.READ, 0, len(self.sim.core.regmap), input_registers=True)

    # -------------------------------------------------------------- the oracle
    def _judge(self, res: Result, effects_before: int) -> None:
        rep = self.report
        sim = self.sim
        keys = set(res.sent_as)
        tags = {f"{e:08x}:{s}" for e, s in keys}
        execs = [x for x in sim.executions.since(self._exec_mark) if (x.epoch, x.seq) in keys]
        per_key = Counter((x.epoch, x.seq) for x in execs)
        effects = [e for e in sim.core.log[effects_before:] if e.tag in tags
                   and e.kind not in (EffectKind.TRIGGER_FINISHED,)]
        cmd = res.command
        if any(n > 1 for n in per_key.values()):
            rep.duplicated_effects += 1
            rep.problems.append(f"ran twice under one seq: {res}")
        elif len(execs) > 1:
            if cmd.set_only and len({x.epoch for x in execs}) < len(execs):
                rep.duplicated_effects += 1  # the epoch rule allows one run per epoch, no more
                rep.problems.append(f"set-only ran twice in one epoch: {res}")
            elif cmd.set_only:
                rep.reissued_set_only += 1
            else:
                rep.duplicated_effects += 1
                rep.problems.append(f"non-set-only ran {len(execs)} times: {res}")
        final = [x for x in execs if (x.epoch, x.seq) == (res.epoch, res.seq)]
        if len(final) == 1 and res.outcome is not Outcome.UNKNOWN:  # UNKNOWN: answer never seen
            truth = _truth_outcome(final[0].request, final[0].response)
            if truth is not res.outcome:
                rep.misclassified += 1
                rep.problems.append(f"reported {res.outcome.name}, device answered {truth.name} "
                                    f"({final[0].response.hex()}): {res}")
        if res.outcome is Outcome.OK and cmd.kind is CommandKind.READ and len(final) == 1:
            pdu = final[0].response  # decoded here, big-endian, independently of the host
            want = (struct.unpack_from(f">{cmd.count}H", pdu, 2)
                    if len(pdu) == 2 + 2 * cmd.count else None)
            if res.values != want:
                rep.misclassified += 1
                rep.problems.append(f"read {res.values}, device answered {want}: {res}")
        if res.outcome is Outcome.OK:
            if len(final) != 1:
                rep.misclassified += 1
                rep.problems.append(f"OK without exactly one execution: {res}")
            elif answer_of(cmd, final[0].response) != (res.values, res.code):
                # The host must report the answer of the one execution (a replay included).
                rep.misclassified += 1
                rep.problems.append(f"OK with another answer than the execution's: {res}")
        elif res.outcome in (Outcome.NOT_EXECUTED, Outcome.REJECTED) and effects:
            rep.misclassified += 1
            rep.problems.append(f"{res.outcome.name} but had effects {effects}: {res}")
        # Model of acknowledged configuration.
        if cmd.kind in (CommandKind.WRITE, CommandKind.WRITE_IF_GENERATION):
            applied = any(e.kind is EffectKind.SET for e in effects) or (
                res.outcome is Outcome.OK and not effects
            )
            if res.outcome is Outcome.OK or (res.outcome is Outcome.UNKNOWN and execs and applied):
                for i, v in enumerate(cmd.values):
                    self.model[cmd.address + i] = v

    def _account(self, results: list[Result], end: int) -> None:
        """Every execution of the batch is claimed, through ``sent_as``, by exactly one result
        whose request is the one executed; anything else is an effect nobody accounts for."""
        rep = self.report
        claims: Counter[tuple[int, int]] = Counter()
        owner: dict[tuple[int, int], bytes] = {}
        for res in results:
            pdu = res.command.pdu()
            for key in set(res.sent_as):
                claims[key] += 1
                owner[key] = pdu
        for x in self.sim.executions.since(self._exec_mark, end):
            key = (x.epoch, x.seq)
            if claims[key] != 1:
                rep.duplicated_effects += 1
                rep.problems.append(f"execution {x.epoch:08x}:{x.seq} claimed by {claims[key]} "
                                    f"results: {x.request.hex()}")
            elif owner[key] != x.request:
                rep.duplicated_effects += 1
                rep.problems.append(f"execution {x.epoch:08x}:{x.seq} ran {x.request.hex()}, "
                                    f"its result sent {owner[key].hex()}")

    def _reconcile(self, res: Result) -> None:
        rep = self.report
        rec = self.dev.reconcile(res)
        if rec is None:
            rep.misclassified += 1
            rep.problems.append(f"reconcile() refused an UNKNOWN result: {res}")
        elif rec.intended_state_holds is None:
            # the read-back itself was lost (harsh link): the host honestly still does not know;
            # only a read-back that arrived can be checked against the device's truth
            rep.unknown_unresolved += 1
        else:
            # The read-back must match the device's true state.
            truth = {n: self.sim.core.value(n) for n in rec.observed if n != "generation"}
            seen = {n: v for n, v in rec.observed.items() if n != "generation"}
            if truth != seen and self.trigger.name not in truth:
                rep.misclassified += 1
                rep.problems.append(f"reconcile read {seen}, device holds {truth}")
            rep.unknown_reconciled += 1

    def _check_config(self) -> None:
        for addr in list(self.model):
            actual = self.sim.core.value(self.sim.core.regmap.at(addr).name)  # type: ignore[union-attr]
            if actual != self.model[addr]:
                self.report.lost_acknowledged_writes += 1
                self.report.problems.append(
                    f"register {addr}: acknowledged {self.model[addr]}, device holds {actual}")
                self.model[addr] = actual

    # -------------------------------------------------------------- main loop
    def run(self, progress: Callable[[int], None] | None = None,
            timeline: list[TimelinePoint] | None = None) -> CampaignReport:
        cfg = self.cfg
        rep = self.report
        t0 = time.perf_counter()
        self.dev.connect()
        done = 0
        while done < cfg.commands:
            n = min(self.rng.randint(1, cfg.max_batch), cfg.commands - done)
            batch = [self._command() for _ in range(n)]
            if cfg.reboot_every and self.rng.random() < n / cfg.reboot_every:
                self.transport.schedule_reboot(self.transport.now() + self.rng.uniform(0, 0.01))
                rep.reboots += 1
            if self.rng.random() < 0.05:  # the environment: temperature drifts over/under threshold
                self.sim.core.set_input("temperature", self.rng.randint(200, 600),
                                        self.transport.now())
            self._exec_mark = len(self.sim.executions)
            effects_before = len(self.sim.core.log)
            results = self.dev.run(batch)
            self._account(results, len(self.sim.executions))
            for res in results:
                self._judge(res, effects_before)
                rep.outcomes[res.outcome.name] += 1
                if res.replay:
                    rep.replays += 1
                if res.command.kind is CommandKind.WRITE_IF_GENERATION and res.code is not None:
                    self.known_generation = res.code
            for res in results:
                if res.outcome is Outcome.UNKNOWN:
                    self._reconcile(res)
            self.dev.acknowledge_unknown()
            self._check_config()
            done += n
            if timeline is not None:
                timeline.append(TimelinePoint(done, self.transport.now(),
                                              self.dev.session.counters.retries, rep.replays,
                                              rep.outcomes["UNKNOWN"], rep.reboots))
            if progress is not None:
                progress(n)
        rep.commands = done
        rep.retries = self.dev.session.counters.retries
        rep.simulated_seconds = self.transport.now()
        rep.wall_seconds = time.perf_counter() - t0
        rep.link = self.transport.link.stats()
        return rep


def run_campaign(cfg: CampaignConfig, progress: Callable[[int], None] | None = None,
                 timeline: list[TimelinePoint] | None = None) -> CampaignReport:
    """Run the campaign; ``timeline``, if given, receives a ``TimelinePoint`` after every batch."""
    return _Campaign(cfg).run(progress, timeline)
