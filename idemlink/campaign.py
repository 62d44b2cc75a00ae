"""The fault campaign: mixed commands through a lossy link with device reboots and host-process
crashes, judged by an oracle that trusts nothing of the code under test (``idemlink.oracle``).

``run_campaign(CampaignConfig)`` drives a ``idemlink.host.device.Device`` against a
``SimulatedDevice`` through the link emulator on a simulated clock (``SimTransport``), so a run is
reproducible from its seed and 20,000 commands take seconds. ``idemlink.soak_device`` runs the
same campaign against a device given as a command (a real port, real time).

What the campaign does, besides sending commands:

- the command mix covers every outcome class: absolute writes (one register, the whole block, or
  the block with one register changed), conditional writes (right and wrong generation), W1C
  clears (with an undeclared bit now and then), triggers by 0x42 and by FC06, trigger values other
  than 0/1, reads of the map (of a map with gaps, mostly of one contiguous run of its registers:
  the whole span is exception 02) and of an unmapped address;
- the device reboots (``reboot_every``); the environment moves: an input changes, the external
  condition of one declared fault bit of the map comes or goes (``conditions``, per batch), a
  trigger is forced into an abnormal state and back (in-process only). Inputs and conditions are
  control lines (``input ADDRESS VALUE``, ``condition ADDRESS BITS``, ``device_sim.control``),
  the one rule of both devices: in-process applied to the simulator's core, with
  ``--device-cmd`` written to the device's control FIFO (``{control}``). Each condition is also
  the campaign's own record (``oracle.Condition``), fed to the oracle between the device's
  records, so the oracle judges latching and W1C clears (while the condition holds and after it
  went) from the device's record and the environment's, whatever the map;
- the host process crashes (``restart_every``): the frames it had just written stay on the line
  and arrive after a new process's HELLO (as from a serial adapter's buffer), and the new process
  reconciles what the dead one may have run (as its journal would);
- the line goes dead (``outage_every``): one direction or both lose everything for
  ``outage_length`` seconds (by default 1.5 times the host's whole retry span), so every attempt
  of the batch sent into it is lost — requests that never reach the device, or requests that run
  and whose every answer is lost;
- frames come back late (``late``): a clean copy of a frame arrives again after about
  ``late_frames`` further frames, by then mostly after its answer left the device's replay cache
  (ANSWER_EVICTED), behind the window (TOO_OLD) or in another boot (EPOCH_MISMATCH); a request
  that never ran runs then; a late answer reaches a host waiting for something else;
- every UNKNOWN is reconciled.

The oracle is fed the device's own record (boots and executions, in order), the line's record of
every unit it delivered each way (the link emulator's ``DeliveryLog``, decoded by the oracle
itself) and the host's results as claims; the campaign turns each ``Result`` into a ``Claim`` with
the request PDU encoded *here* from the fields of the command the campaign asked for (never the
command the result names, never by the host's encoder), and the moment the result was settled.
In-process, the device's registers are also compared with the oracle's model after every batch.

Why one module of this size: it is the campaign's one reason to change, the soak scenario (the
command mix, host crashes, reboots, outages, reconciliation, the report); the pieces it drives live
elsewhere (the device and link in ``idemlink.device_sim``, the host in ``idemlink.host``, the
judge in ``idemlink.oracle``).
"""

from __future__ import annotations

import hashlib
import random
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from idemlink.device_sim.adversary import Adversary
from idemlink.device_sim.control import apply, parse_control_line
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import Delivery, DeliveryLog, LinkConfig
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.command import Command, CommandKind, Result
from idemlink.host.device import Device
from idemlink.host.errors import NoDevice
from idemlink.host.transport import Transport
from idemlink.oracle import (
    Boot,
    Claim,
    Condition,
    Delivered,
    MapTruth,
    Oracle,
    Record,
    Reg,
    Run,
    Tally,
)
from idemlink.oracle_wire import REQUEST, SIGNED_FLAGS, read_frame
from idemlink.protocol.outcome import FIRST_LOCAL_STATUS, IdemlinkError, Outcome
from idemlink.protocol.regmap_file import resolve_regmap


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
    restart_every: int = 250  #: mean commands between host-process crashes (0: never)
    seed: int = 1
    baud: int | None = 115200
    latency: float = 0.001
    timeout: float = 0.03
    attempts: int = 6
    max_batch: int = 4  #: commands pipelined together (1..max_batch)
    trigger_duration: float = 0.05  #: seconds a trigger stays RUNNING on the device
    regmap: str = "thermal-controller"  #: a built-in map's name or a map file's path
    outage_every: int = 250  #: mean commands between outages of the line (0: never)
    outage_length: float | None = None  #: seconds; None: 1.5 × attempts × timeout
    late: float = 0.01  #: per-frame probability (each way) that a copy arrives again much later
    late_frames: int = 300  #: ... after about this many further frames (50..150 %)
    #: a keyed device and host (issue 23): every frame signed with a key drawn from the seed
    authenticated: bool = False
    #: an attacker in the line (``idemlink.device_sim.adversary``): per host request, the
    #: probability of one forged, replayed, reflected, stripped, truncated or flipped frame
    adversary: float = 0.0
    conditions: float = 0.02  #: per batch: the probability that one fault condition comes or goes

    @property
    def key(self) -> bytes | None:
        """The campaign's device key (``authenticated``), drawn from the seed: a test key."""
        if not self.authenticated:
            return None
        return hashlib.blake2s(f"idemlink soak key/{self.seed}".encode()).digest()

    def link_config(self, *, back: bool = False) -> LinkConfig:
        """The line each way (``back``: device to host, with its own seed; the adversary rides
        the host-to-device direction and watches both)."""
        return LinkConfig(
            adversary=0.0 if back else self.adversary,
            baud=self.baud, latency=self.latency, loss=self.byte_loss, frame_loss=self.loss,
            frame_dup=self.dup, frame_corrupt=self.corrupt, reorder=self.reorder,
            reorder_max_hold=0.01 if self.reorder else None, noise_rate=self.noise_rate,
            late=self.late, late_frames=self.late_frames,
            seed=self.seed + 7919 if back else self.seed,
        )

    @property
    def outage_seconds(self) -> float:
        """How long an outage lasts: ``outage_length``, by default 1.5 times the host's whole
        retry span, so that every attempt of a command sent into its first third is lost."""
        if self.outage_length is not None:
            return self.outage_length
        return 1.5 * self.attempts * self.timeout


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """The campaign's running counts after one batch (``run_campaign(..., timeline=[])``; plotted
    by ``idemlink.soak_plot``)."""

    commands: int
    seconds: float  #: on the device's clock (simulated in-process)
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
    host_restarts: int = 0
    outages: int = 0
    executions: int = 0
    late_executions: int = 0  #: executions that landed after their result was settled
    reconcile_reads: int = 0
    reconcile_resends: int = 0  #: UNKNOWNs asked again under their own number (evidence)
    unknown_reconciled: int = 0
    unknown_unresolved: int = 0  #: UNKNOWN whose read-back was lost too (honest, not a failure)
    dead_reconciled: int = 0  #: requests of a crashed host process, reconciled by the next one
    ran_unanswered: int = 0  #: commands with an effect that ran and whose every answer was lost
    never_delivered: int = 0  #: commands with an effect none of whose requests reached the device
    answers: Counter[str] = field(default_factory=Counter)  #: delivered to the host, by status
    late_answers: Counter[str] = field(default_factory=Counter)  #: ... after their result
    duplicated_effects: int = 0
    lost_acknowledged_writes: int = 0
    misclassified: int = 0
    register_semantics: int = 0  #: device answers the register map's semantics do not give
    conditions_set: int = 0  #: fault conditions the environment changed (its own record)
    faults_latched: int = 0  #: fault bits the oracle's model latched (boots included)
    faults_cleared: int = 0  #: latched bits a W1C clear cleared, their condition gone
    clears_while_held: int = 0  #: latched bits a W1C clear left latched, their condition held
    problems: list[str] = field(default_factory=list)
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    interrupted: bool = False
    link: dict[str, dict[str, int]] = field(default_factory=dict)
    attacks_sent: Counter[str] = field(default_factory=Counter)  #: injected, by kind
    attacks_delivered: Counter[str] = field(default_factory=Counter)  #: reached the device
    #: executions of a request the host never wrote under that number (an attack that ran):
    #: judged from the device's record and the host's own writes, read by ``oracle_wire``
    attacks_executed: int = 0
    refused: dict[str, int] = field(default_factory=dict)  #: the device's refusal counters

    @property
    def passed(self) -> bool:
        return not (self.duplicated_effects or self.lost_acknowledged_writes or self.misclassified
                    or self.register_semantics or self.attacks_executed)

    def take(self, tally: Tally) -> None:
        for name in ("duplicated_effects", "lost_acknowledged_writes", "misclassified",
                     "register_semantics", "executions", "late_executions",
                     "reissued_set_only", "ran_unanswered", "never_delivered"):
            setattr(self, name, getattr(tally, name))
        self.conditions_set = tally.conditions
        self.answers = Counter(tally.answers)
        self.late_answers = Counter(tally.late_answers)
        self.problems = list(tally.problems)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcomes"] = dict(self.outcomes)
        d["answers"] = dict(self.answers)
        d["late_answers"] = dict(self.late_answers)
        d["attacks_sent"] = dict(self.attacks_sent)
        d["attacks_delivered"] = dict(self.attacks_delivered)
        d["problems"] = self.problems[:20]
        d["passed"] = self.passed
        d["commands_per_second"] = round(self.commands / self.wall_seconds, 1) if self.wall_seconds else 0
        return d

    def verdict(self) -> str:
        """One line: PASS or FAIL with the four counts. An interrupted run that found nothing
        wrong gets no verdict (``interrupted: no verdict``, with the counts so far): it is not a
        PASS; one that already found a problem is a FAIL."""
        counts = (f"{self.commands} commands, {self.duplicated_effects} duplicated effects, "
                  f"{self.lost_acknowledged_writes} lost acknowledged writes, "
                  f"{self.misclassified} misclassified, {self.register_semantics} "
                  "register-semantics violations")
        if self.attacks_sent:
            counts += (f", {sum(self.attacks_sent.values())} attacks "
                       f"({sum(self.attacks_delivered.values())} delivered), "
                       f"{self.attacks_executed} executed")
        if self.passed and self.interrupted:
            return f"interrupted: no verdict ({counts} so far)"
        return f"{'PASS' if self.passed else 'FAIL'}: {counts}"


def map_text(name: str) -> str:
    """A built-in map file's text, or a map file's (a path), read as a file: the oracle parses
    it itself."""
    builtin = resources.files("idemlink.protocol").joinpath("maps", f"{name}.toml")
    if builtin.is_file() and not Path(name).exists():
        return builtin.read_text("utf-8")
    return Path(name).read_text("utf-8")


def map_format(name: str) -> str:
    """``json`` for a ``.json`` map file, else ``toml`` (the built-in maps are TOML)."""
    return "json" if name.lower().endswith(".json") else "toml"


def _over_temperature(v: Mapping[str, int]) -> Mapping[str, int]:
    return {"faults": 1 if v["temperature"] > v["threshold"] else 0}


#: What the campaign's environment knows of a map's fault conditions (the map file declares the
#: bits, not what raises them): the thermal controller latches over_temperature while
#: temperature > threshold.
ENVIRONMENT_RULES: dict[str, Callable[[Mapping[str, int]], Mapping[str, int]]] = {
    "thermal-controller": _over_temperature,
}


def _runs(addresses: list[int], most: int = 125) -> list[tuple[int, int]]:
    """Sorted addresses as (first, count) runs of consecutive ones, at most ``most`` long."""
    runs: list[tuple[int, int]] = []
    for a in addresses:
        if runs and runs[-1][0] + runs[-1][1] == a and runs[-1][1] < most:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((a, 1))
    return runs


def intended_pdu(cmd: Command) -> bytes:
    """The request PDU the campaign means by ``cmd``, encoded here (not by the host)."""
    k = cmd.kind
    if k is CommandKind.READ:
        return struct.pack(">BHH", 4 if cmd.input_registers else 3, cmd.address, cmd.count)
    if k in (CommandKind.WRITE, CommandKind.CLEAR_FAULTS):
        if len(cmd.values) == 1:
            return struct.pack(">BHH", 6, cmd.address, cmd.values[0])
        n = len(cmd.values)
        return struct.pack(f">BHHB{n}H", 0x10, cmd.address, n, 2 * n, *cmd.values)
    if k is CommandKind.WRITE_IF_GENERATION:
        n = len(cmd.values)
        return struct.pack(f">BHHHB{n}H", 0x41, cmd.generation, cmd.address, n, 2 * n,
                           *cmd.values)
    value = cmd.values[0] if cmd.values else (1 if k is CommandKind.TRIGGER else 0)
    return struct.pack(">BHH", 0x42, cmd.address, value)


def claim_of(res: Result, *, dead: bool = False, readback: bool = False,
             at: float | None = None, command: Command | None = None) -> Claim:
    """The oracle's claim of a result: the request PDU encoded here — of ``command``, the one
    the campaign asked for, when given (not the command the result says it ran) — what the host
    reports, and when it settled (``at``, the host's clock)."""
    status = None if res.status is None or res.status >= FIRST_LOCAL_STATUS else int(res.status)
    return Claim(intended_pdu(res.command if command is None else command), tuple(res.sent_as),
                 None if dead else res.outcome.name, (res.epoch, res.seq), tuple(res.values),
                 res.code, readback, res.replay, at, status)


class HostCrash(IdemlinkError):
    """The host process died (raised by ``CrashingTransport`` in the middle of an operation)."""


class CrashingTransport:
    """Wraps the host's transport; ``crash_after(n)`` makes the n-th following write the last
    one of this process: its bytes are held (still on the line) and ``HostCrash`` is raised.
    ``release()`` lets the held bytes arrive (after the next process's HELLO)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self._left: int | None = None
        self.held = b""
        #: when the host's last read returned (its clock): every unit the line delivered to the
        #: host until then was handed to it; one delivered later is still unread
        self.read_until: float | None = None

    def crash_after(self, writes: int) -> None:
        self._left = writes

    def disarm(self) -> int | None:
        """No crash from now on; returns the writes the armed crash still had to wait (None:
        none was armed, or it landed)."""
        left, self._left = self._left, None
        return left

    def write(self, data: bytes) -> None:
        if self._left is not None:
            self._left -= 1
            if self._left <= 0:
                self._left = None
                self.held = data
                raise HostCrash("the host process died")
        self.inner.write(data)

    def read(self, timeout: float) -> bytes:
        data = self.inner.read(timeout)
        self.read_until = self.inner.now()
        return data

    def now(self) -> float:
        return self.inner.now()

    def close(self) -> None:
        self.inner.close()

    def release(self) -> None:
        if self.held:
            self.inner.write(self.held)
            self.held = b""


class _Host(Device):
    """A host process whose every Result is also kept (``made``), with the moment it was
    settled (``settled``, by ``id``): when it dies mid-batch, the results of its completed waves
    are lost with it, but the oracle must still know which (epoch, seq) each request travelled
    under; and an answer that reached the host after a result was settled cannot have been its
    evidence."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.made: list[Result] = []
        self.settled: dict[int, float] = {}
        self.ops.on_result = self._made

    def _made(self, r: Result) -> None:
        self.made.append(r)
        self.settled[id(r)] = self.transport.now()

    def forget_made(self) -> None:
        self.made.clear()
        self.settled.clear()

    def claim(self, r: Result, **kw: Any) -> Claim:
        """``claim_of`` the result, with the moment it was settled."""
        return claim_of(r, at=self.settled.get(id(r)), **kw)


class Campaign:
    """The campaign loop, over a device given by hooks (in-process or a spawned command)."""

    def __init__(self, cfg: CampaignConfig, transport: Transport, *, tolerance: float = 0.0,
                 environment: bool = True) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        #: outages draw from their own stream: a seed's commands, crashes and reboots stay the same
        self.outage_rng = random.Random(f"idemlink-outage/{cfg.seed}")
        self.report = CampaignReport(config=asdict(cfg))
        text, fmt = map_text(cfg.regmap), map_format(cfg.regmap)
        self.oracle = Oracle(text, trigger_duration=cfg.trigger_duration, tolerance=tolerance,
                             conditions=ENVIRONMENT_RULES.get(cfg.regmap), fmt=fmt,
                             delivery_record=True, authenticated=cfg.authenticated)
        self.regmap = resolve_regmap(cfg.regmap)
        regs = MapTruth.parse(text, fmt=fmt)
        self.holdings = sorted(regs.of_kind("holding"), key=lambda r: r.address)
        #: a map without a fault word, a trigger or a holding: those commands become reads
        self.faults = regs.of_kind("fault")
        self.triggers = regs.of_kind("trigger")
        self.inputs = regs.of_kind("input")
        self.span = (min(regs.registers), max(regs.registers) - min(regs.registers) + 1)
        self.unmapped = next(a for a in range(0x10000) if a not in regs.registers)
        #: a map with gaps: its contiguous runs of registers (the span read is exception 02), so
        #: that reads show its registers — its latched faults — too; None: no gaps
        self.runs = _runs(sorted(regs.registers)) if len(regs.registers) < self.span[1] else None
        self.environment = environment
        #: the external conditions the environment set, by fault register address
        self.conditions: dict[int, int] = {}
        #: the device is in-process: its clock is the host's, a trigger can be put into an
        #: abnormal state
        self.in_process = True
        self.transport = CrashingTransport(transport)
        self._crash_due: int | None = None  #: writes until the drawn host crash lands
        self.dev = self._new_host()
        self.known_generation = 0
        self.retries = 0

    # -------------------------------------------------------------- hooks for the device
    def records(self) -> list[Record]:
        """The device's record since the last call (boots and executions, in order)."""
        raise NotImplementedError

    def deliveries(self) -> list[Delivered]:
        """The line's record since the last call: every unit it delivered each way, on the
        host's clock (called after ``records``: it covers every request they ran)."""
        raise NotImplementedError

    def schedule_reboot(self) -> None:
        raise NotImplementedError

    def schedule_outage(self, directions: tuple[str, ...], delay: float, length: float) -> None:
        """The line dies in ``directions`` (``"a->b"``: host to device, ``"b->a"``) from
        ``delay`` seconds from now, for ``length`` seconds."""
        raise NotImplementedError

    def truth(self) -> Mapping[str, int] | None:
        """The device's registers by name, when it can show them (in-process)."""
        return None

    def control(self, line: str) -> None:
        """A control line to the device (``input ADDRESS VALUE``, ``condition ADDRESS BITS``)."""
        raise NotImplementedError

    def force_trigger(self, name: str, raw: int) -> None:
        raise NotImplementedError

    def link_stats(self) -> dict[str, dict[str, int]]:
        return {}

    # -------------------------------------------------------------- command mix
    def _value(self, spec: Reg) -> int:
        if self.rng.random() < 0.05:
            return min(0xFFFF, spec.maximum + 1 + self.rng.randrange(100))  # out of range
        return self.rng.randint(spec.minimum, spec.maximum)

    def _block(self) -> tuple[int, ...]:
        """The whole holding block: fresh values, or the current ones with one changed."""
        if self.rng.random() < 0.5:
            return tuple(self._value(s) for s in self.holdings)
        vals = [self.oracle.model.values[s.address] for s in self.holdings]
        i = self.rng.randrange(len(vals))
        vals[i] = self._value(self.holdings[i])
        return tuple(vals)

    def _command(self) -> Command:
        r = self.rng.random()
        if (r < 0.42 and not self.holdings) or (0.42 <= r < 0.51 and not self.faults) or (
                0.51 <= r < 0.69 and not self.triggers):
            r = 0.75  # this map has no register of that kind: a read instead
        first = self.holdings[0].address if self.holdings else 0
        trig = self.rng.choice(self.triggers).address if self.triggers else 0
        if r < 0.20:
            spec = self.rng.choice(self.holdings)
            return Command(CommandKind.WRITE, spec.address, 1, (self._value(spec),))
        if r < 0.32:
            vals = self._block()
            return Command(CommandKind.WRITE, first, len(vals), vals)
        if r < 0.42:
            gen = self.known_generation if self.rng.random() < 0.6 else self.rng.randrange(0x10000)
            if self.rng.random() < 0.5:
                vals = self._block()
                return Command(CommandKind.WRITE_IF_GENERATION, first, len(vals), vals,
                               generation=gen)
            spec = self.rng.choice(self.holdings)
            return Command(CommandKind.WRITE_IF_GENERATION, spec.address, 1,
                           (self._value(spec),), generation=gen)
        if r < 0.51:
            fault = self.rng.choice(self.faults)
            bits = self.rng.choice([1, 2, 4, 7, fault.mask, fault.mask, (fault.mask + 1) | 1])
            return Command(CommandKind.CLEAR_FAULTS, fault.address, 1, (bits,))
        if r < 0.58:
            return Command(CommandKind.TRIGGER, trig)
        if r < 0.63:
            return Command(CommandKind.TRIGGER_RESET, trig)
        if r < 0.65:
            return Command(CommandKind.TRIGGER, trig, values=(self.rng.choice([2, 5, 0xFFFF]),))
        if r < 0.69:
            return Command(CommandKind.WRITE, trig, 1, (self.rng.choice([0, 1, 1, 3]),))
        if r < 0.70:
            return Command(CommandKind.READ, self.unmapped, 1)
        if self.runs is not None and self.rng.random() < 0.8:
            first, count = self.rng.choice(self.runs)
            return Command(CommandKind.READ, first, count,
                           input_registers=self.rng.random() < 0.7)
        return Command(CommandKind.READ, self.span[0], self.span[1],
                       input_registers=self.rng.random() < 0.7)

    # -------------------------------------------------------------- environment
    def _environment(self) -> None:
        if not self.environment:
            return
        now = self.transport.now()
        rng = self.rng
        if rng.random() < 0.05 and self.inputs:  # temperature drifts over/under threshold
            spec = self.inputs[0]
            value = rng.randint(200, 600)
            self.control(f"input {spec.address} {value}")
            self.oracle.set_input(spec.name, value, now if self.in_process else None)
        if rng.random() < self.cfg.conditions and self.oracle.regs.bits:
            bit = rng.choice(sorted(self.oracle.regs.bits))
            active = rng.random() < 0.5
            address, b = self.oracle.regs.bits[bit]
            old = self.conditions.get(address, 0)
            bits = old | (1 << b) if active else old & ~(1 << b)
            self.conditions[address] = bits
            self.control(f"condition {address} {bits}")
            self.oracle.feed([Condition(address, bits, now)])
        if rng.random() < 0.01 and self.triggers:  # an abnormal trigger state, or back
            raw = rng.choice([7, 0x00FF, 0, 0, 2])
            name = rng.choice(self.triggers).name
            if self.in_process:
                self.force_trigger(name, raw)
                self.oracle.force_trigger(name, raw, now)

    # -------------------------------------------------------------- host processes
    def _new_host(self) -> _Host:
        cfg = self.cfg
        return _Host(self.transport, regmap=self.regmap, timeout=cfg.timeout, attempts=cfg.attempts,
                      max_inflight=cfg.max_batch, key=cfg.key)

    def _connect(self) -> None:
        for _ in range(20):
            try:
                self.dev.connect()
                return
            except NoDevice:
                continue
        self.dev.connect()

    def _restart_host(self, crash: HostCrash) -> list[Result]:
        """A new process after a crash: the dead one's requests are claimed (they report
        nothing), the held frames arrive after the new HELLO, and the new process reconciles
        what the dead one may have run."""
        self.retries += self.dev.session.counters.retries
        dead = list(self.dev.made)
        self.dev.forget_made()
        handles = [self.oracle.claim(claim_of(r, dead=True)) for r in dead]
        self.report.host_restarts += 1
        self.dev = self._new_host()
        self._connect()
        self.transport.release()
        self._sync()
        for h in handles:
            self.oracle.judge(h)
        return [r for r in dead if r.sent_as and r.command.may_have_effect]

    # -------------------------------------------------------------- feeding the oracle
    def _sync(self) -> None:
        records = self.records()
        self.oracle.feed([*self.deliveries(), *records])

    def _check_truth(self) -> None:
        truth = self.truth()
        if truth is not None:
            self.oracle.check_state(truth)

    def _reconcile(self, res: Result, *, dead: bool = False) -> None:
        """``reconcile()`` the result; its read-backs are claimed like any result (a command
        with an effect among them is a duplicated effect), its verdict checked against the
        oracle's model."""
        rep = self.report
        self._sync()
        self.dev.forget_made()
        unread_after = self.transport.read_until  # an answer delivered later may still be read
        rec = self.dev.reconcile(res)
        # The re-send of ``res`` under its own last number is ``res`` asked again, not a new
        # request: its key is already claimed by ``res``, and what it proves is checked below.
        resent = rec.resent if rec is not None else None
        at = self.transport.now()
        made = [r for r in self.dev.made if r is not resent]
        handles = [self.oracle.claim(self.dev.claim(r, readback=True)) for r in made]
        rep.reconcile_reads += len(handles)
        self._sync()
        if rec is not None:  # "ran" / "never ran" only on the device's word, whatever was re-sent
            self.oracle.check_verdict_evidence(res.sent_as, intended_pdu(res.command),
                                               rec.executed, unread_after, at)
        for r, h in zip(made, handles, strict=True):
            self.oracle.judge(h)
            if r.command.may_have_effect or r.command.kind is not CommandKind.READ:
                self.oracle.problem("duplicated_effects", f"reconcile() sent a "
                                    f"{r.command.kind.value}: {intended_pdu(r.command).hex()}")
        if resent is not None:
            if resent.sent_as != res.sent_as[-1:] or resent.command != res.command:
                self.oracle.problem("duplicated_effects", "reconcile() re-sent another request "
                                    f"or under a new number: {resent.sent_as}")
            rep.reconcile_resends += 1
            assert rec is not None
            self.oracle.check_evidence(resent.sent_as[-1], intended_pdu(res.command),
                                       rec.executed)
            self.oracle.judge_resend(self.dev.claim(resent))
        self.dev.forget_made()
        if rec is None:
            self.oracle.problem("misclassified", f"reconcile() refused an UNKNOWN result: {res}")
        else:
            self.oracle.check_reconcile(intended_pdu(res.command), rec.intended_state_holds,
                                        rec.observed)
            if dead:
                rep.dead_reconciled += 1
            elif rec.intended_state_holds is None:
                rep.unknown_unresolved += 1  # the read-back itself was lost: still unknown
            else:
                rep.unknown_reconciled += 1
        rep.take(self.oracle.tally)

    # -------------------------------------------------------------- main loop
    def _batch(self, batch: list[Command]) -> list[Result]:
        cfg = self.cfg
        # A crash drawn for a batch that made fewer writes than the draw is carried over to the
        # next batches until it lands: the crashes then average one per ``restart_every``
        # commands (the operations between batches, read-backs, are never crashed).
        if (cfg.restart_every and self._crash_due is None
                and self.rng.random() < len(batch) / cfg.restart_every):
            self._crash_due = self.rng.randint(1, 2 * len(batch))
        if self._crash_due is not None:
            self.transport.crash_after(self._crash_due)
        if cfg.outage_every and self.outage_rng.random() < len(batch) / cfg.outage_every:
            self._outage()
        self.dev.forget_made()
        try:
            return self.dev.run(batch)
        except HostCrash as crash:
            self.transport.disarm()
            for r in self._restart_host(crash):
                self._reconcile(r, dead=True)
            self.dev.acknowledge_unknown()
            return []
        finally:
            self._crash_due = self.transport.disarm()

    def _asked(self, batch: list[Command], results: list[Result]) -> list[Command]:
        """The commands the campaign asked for, one per result (a batch's results come in its
        order; a crashed batch has none): a result for another command than the one asked — a
        value changed on the way, by the host's own word or not — is misclassified, and its
        claim is the asked command's, so what the device ran is judged against what was asked."""
        if not results:
            return []
        if len(results) != len(batch):
            self.oracle.problem("misclassified", f"{len(batch)} commands asked, {len(results)} "
                                "results")
            return [r.command for r in results]
        for c, r in zip(batch, results, strict=True):
            if r.command != c:
                self.oracle.problem("misclassified", f"the result of {intended_pdu(c).hex()} "
                                    f"reports another command: {intended_pdu(r.command).hex()}")
        return batch

    def _outage(self) -> None:
        """The line dies for ``outage_seconds`` as the batch goes out: the requests (they never
        run), the answers (they ran: every answer lost) or both."""
        rng = self.outage_rng
        directions = rng.choice([("a->b",), ("b->a",), ("a->b", "b->a")])
        self.schedule_outage(directions, rng.uniform(0.0, 0.002), self.cfg.outage_seconds)
        self.report.outages += 1

    def run(self, progress: Callable[[int], None] | None = None,
            stop: Callable[[], bool] | None = None, *, fail_fast: bool = False,
            timeline: list[TimelinePoint] | None = None) -> CampaignReport:
        """Run the commands (until ``stop()`` says so between two batches, or Ctrl-C: the report
        then has ``interrupted`` and the counts so far; with ``fail_fast``, until the first
        problem). ``timeline``, if given, receives a ``TimelinePoint`` after every batch."""
        cfg = self.cfg
        self.begin()
        try:
            while self.done < cfg.commands:
                if stop is not None and stop():
                    self.report.interrupted = True
                    break
                if fail_fast and not self.oracle.tally.passed:
                    break
                n = self.step(min(self.rng.randint(1, cfg.max_batch), cfg.commands - self.done))
                if timeline is not None:
                    timeline.append(TimelinePoint(
                        self.done, self.transport.now() - self._started_at,
                        self.retries + self.dev.session.counters.retries, self.report.replays,
                        self.report.outcomes["UNKNOWN"], self.report.reboots))
                if progress is not None:
                    progress(n)
        except KeyboardInterrupt:
            self.interrupted()
        return self.conclude()

    def begin(self) -> None:
        """Connect the first host process; the clocks start."""
        self._t0 = time.perf_counter()
        self._started_at = self.transport.now()
        self.done = 0
        self._connect()

    def step(self, n: int) -> int:
        """One batch of ``n`` commands, judged (a reboot, the environment, outages and crashes
        drawn for it, its UNKNOWNs reconciled); returns ``n``."""
        rep = self.report
        batch = [self._command() for _ in range(n)]
        if self.cfg.reboot_every and self.rng.random() < n / self.cfg.reboot_every:
            self.schedule_reboot()
            rep.reboots += 1
        self._sync()
        self._environment()
        results = self._batch(batch)
        asked = self._asked(batch, results)
        handles = [self.oracle.claim(self.dev.claim(r, command=c))
                   for r, c in zip(results, asked, strict=True)]
        self._sync()
        for res, h in zip(results, handles, strict=True):
            self.oracle.judge(h)
            rep.outcomes[res.outcome.name] += 1
            rep.replays += res.replay
            if res.command.kind is CommandKind.WRITE_IF_GENERATION and res.code is not None:
                self.known_generation = res.code
        for res in results:
            if res.outcome is Outcome.UNKNOWN:
                self._reconcile(res)
        self.dev.acknowledge_unknown()
        self._check_truth()
        self.done += n
        return n

    def interrupted(self) -> None:
        """Ctrl-C: the interrupted batch's requests are claimed as a dead process's (they may
        still land)."""
        self.report.interrupted = True
        for r in self.dev.made:
            self.oracle.judge(self.oracle.claim(claim_of(r, dead=True)))

    def conclude(self) -> CampaignReport:
        """The report: the counts so far, the oracle's tally."""
        rep = self.report
        self._sync()
        rep.commands = self.done
        rep.take(self.oracle.tally)
        model = self.oracle.model
        rep.faults_latched, rep.faults_cleared = model.latches, model.clears
        rep.clears_while_held = model.clears_held
        rep.retries = self.retries + self.dev.session.counters.retries
        rep.simulated_seconds = self.transport.now() - self._started_at
        rep.wall_seconds = time.perf_counter() - self._t0
        rep.link = self.link_stats()
        return rep


#: The delivery record's direction names -> who received the unit.
RECEIVER = {"a->b": "device", "b->a": "host"}


def attacks_ran(campaign: Campaign, writes: HostWrites | None, records: list[Record]) -> None:
    """An attack that ran: an execution of a request the host never wrote under that number
    (``writes``' record), counted ``attacks_executed`` and a duplicated effect."""
    if writes is None:
        return
    for x in records:
        if isinstance(x, Run) and x.epoch != 0 and not writes.wrote(x.epoch, x.seq, x.request):
            campaign.report.attacks_executed += 1
            campaign.oracle.problem("duplicated_effects", f"{x.epoch:08x}:{x.seq} ran "
                                    f"{x.request.hex()}, which the host never sent")


class HostWrites:
    """The host's transport, noting every REQUEST the host itself writes — (epoch, seq) and
    request PDU, read by the oracle's own reader (``oracle_wire``) — so an execution of
    anything else is an attack that ran. Bounded: the last ``MAX_NOTED`` numbers."""

    MAX_NOTED = 100_000

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self._sent: OrderedDict[tuple[int, int], set[bytes]] = OrderedDict()

    def write(self, data: bytes) -> None:
        for unit in data.split(b"\x00"):
            f = read_frame(unit, SIGNED_FLAGS) if unit else None
            if f is not None and f.type == REQUEST:
                self._sent.setdefault((f.epoch, f.seq), set()).add(f.payload)
                self._sent.move_to_end((f.epoch, f.seq))
                while len(self._sent) > self.MAX_NOTED:
                    self._sent.popitem(last=False)
        self.inner.write(data)

    def wrote(self, epoch: int, seq: int, request: bytes) -> bool:
        return request in self._sent.get((epoch, seq), ())

    def read(self, timeout: float) -> bytes:
        return self.inner.read(timeout)

    def now(self) -> float:
        return self.inner.now()

    def close(self) -> None:
        self.inner.close()


def delivered(deliveries: list[Delivery], offset: float = 0.0) -> list[Delivered]:
    """The link's deliveries as the oracle's records; ``offset`` takes the link's clock to the
    host's."""
    return [Delivered(RECEIVER[d.direction], d.time + offset, d.unit) for d in deliveries]


class _Campaign(Campaign):
    """The campaign against an in-process ``SimulatedDevice`` on a simulated clock."""

    #: the host's own writes, when this campaign wraps the host's line (the bus campaign's
    #: members share the bus's: None)
    host_writes: HostWrites | None = None

    def __init__(self, cfg: CampaignConfig) -> None:
        self.sim = SimulatedDevice(seed=cfg.seed, trigger_duration=cfg.trigger_duration,
                                   regmap=resolve_regmap(cfg.regmap),
                                   keys=None if cfg.key is None else (cfg.key,))
        self.sim.core.max_log = 1000  # the oracle reads executions, not the core's effect log
        self.sim_transport = SimTransport(self.sim, cfg.link_config(),
                                          cfg.link_config(back=True))
        self.line = DeliveryLog()
        self.sim_transport.link.record_deliveries(self.line)
        self._exec_mark = 0
        self._boot_mark = 0
        self.host_writes = HostWrites(self.sim_transport)
        super().__init__(cfg, self.host_writes)

    def records(self) -> list[Record]:
        sim = self.sim
        execs = sim.executions.since(self._exec_mark)
        self._exec_mark = len(sim.executions)
        boots = sim.boots[self._boot_mark:]
        self._boot_mark = len(sim.boots)
        out: list[Record] = []
        epoch = self.oracle.epoch
        b = 0
        for x in execs:
            while b < len(boots) and epoch != x.epoch:
                out.append(Boot(*boots[b]))
                epoch = boots[b][0]
                b += 1
            out.append(Run(x.epoch, x.seq, x.request, x.response, x.time))
        out += [Boot(*bt) for bt in boots[b:]]
        attacks_ran(self, self.host_writes, out)
        return out

    def _adversary(self) -> Adversary | None:
        link = getattr(self.sim_transport, "link", None)
        return None if link is None else link.adversary

    def deliveries(self) -> list[Delivered]:
        units = self.line.take()
        adversary = self._adversary()
        if adversary is not None:
            for d in units:
                kind = adversary.delivered(d.unit) if d.direction == "a->b" else None
                if kind is not None:
                    self.report.attacks_delivered[kind] += 1
        return delivered(units)

    def conclude(self) -> CampaignReport:
        rep = super().conclude()
        adversary = self._adversary()
        if adversary is not None:
            rep.attacks_sent = Counter(adversary.sent)
        sim: SimulatedDevice | None = getattr(self, "sim", None)
        if sim is not None:  # a device in another process (the bus campaign's): its own stats
            counters = sim.counters_total()
            rep.refused = {k: counters[k] for k in ("bad_mac", "unauthenticated",
                                                    "decode_errors")}
        return rep

    def schedule_reboot(self) -> None:
        t = self.sim_transport
        t.schedule_reboot(t.now() + self.rng.uniform(0, 0.01))

    def schedule_outage(self, directions: tuple[str, ...], delay: float, length: float) -> None:
        link = self.sim_transport.link
        start = self.sim_transport.now() + delay
        for d in (link.a_to_b, link.b_to_a):
            if d.name in directions:
                d.outage(start, start + length)

    def truth(self) -> Mapping[str, int]:
        now = self.sim_transport.now()
        self.sim.tick(now)
        self.oracle.model.finish_due(now, 0.0)
        return self.sim.core.values()

    def control(self, line: str) -> None:
        command = parse_control_line(line, self.sim.core.regmap)
        if command is not None:
            apply(self.sim.core, command, self.sim_transport.now())

    def force_trigger(self, name: str, raw: int) -> None:
        self.sim.core.tick(self.sim_transport.now())
        self.sim.core.force_trigger_state(name, raw)

    def link_stats(self) -> dict[str, dict[str, int]]:
        return self.sim_transport.link.stats()


def run_campaign(cfg: CampaignConfig, progress: Callable[[int], None] | None = None,
                 stop: Callable[[], bool] | None = None, *, fail_fast: bool = False,
                 timeline: list[TimelinePoint] | None = None) -> CampaignReport:
    """Run the campaign in-process; ``timeline``, if given, receives a ``TimelinePoint`` after
    every batch."""
    return _Campaign(cfg).run(progress, stop, fail_fast=fail_fast, timeline=timeline)
