"""The soak on a bus (issue 22 item 7): the fault campaign run on N simulated devices sharing one
half-duplex medium, each judged by its own independent oracle (docs/SOAK.md, "On a bus").

``run_bus_campaign(BusCampaignConfig)`` builds N ``SimulatedDevice`` s at addresses 1..N on one
``idemlink.device_sim.bus.Bus`` (simulated time, collisions, turnaround), each hearing and
speaking through its own lossy ``LinkDirection`` (loss, duplication and corruption each way). The
host is one ``idemlink.host.bus.Bus``: a handle per address, one transaction on the wire at a
time, a breaker per device. On it the campaign:

- runs the single-device campaign's command mix per device (``Campaign.step``), the devices
  taking turns at random, each device's batches drawing its own reboots (a reboot of that device
  alone, at a random moment with requests in flight) and environment;
- broadcasts now and then a set-only write (one holding register or the whole block, sent once
  or repeated under the same number) and verifies it on every device (``Bus.verify``);
- takes one device off the bus (deaf and mute) for a stretch of the run and brings it back: its
  commands end UNKNOWN, then NOT_EXECUTED / BREAKER_OPEN while its breaker is open, and the
  others go on.

Each device's oracle (``idemlink.oracle.Oracle(address=N)``) is fed that device's own record
(boots, executions, broadcast executions under epoch 0) and the line's record — what the
device's ears delivered to it and every frame the master heard; the oracle itself reads the
address byte of each frame and keeps only that device's — and judges that device's results as
claims. A broadcast's claim per device is its verified outcome (UNKNOWN, OK: the values hold,
NOT_EXECUTED: it never ran). The verdict is per device: every device must pass.

Mixed buses (``c_devices``, ``qemu_devices``: the last addresses; issue 22 item 7): those devices
are processes on the same medium (``idemlink.device_sim.bus_station.ProcessStation``), each judged
from its own effects file (``EffectsReader``, as ``idemlink soak --device-cmd`` judges one) and
the line's record; a reboot of one is its process restarted on the same flash directory. The run
is then on the real clock (``LiveBusTransport``), the host's retry timeout ``live_timeout`` and
the breaker's cooldown ``live_cooldown`` real seconds; the environment (inputs, fault conditions)
moves for the simulated devices only, and the C devices' registers are judged from their answers
(no look inside).

Not done here (stated in docs/SOAK.md): host-process crashes (one crash would end every
handle's process at once: ``restart_every`` is 0 on a bus), late copies (a broadcast copy that
arrives after ``verify`` said NOT_EXECUTED would run then), outages.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from idemlink.campaign import (
    Campaign,
    CampaignConfig,
    CampaignReport,
    CrashingTransport,
    _Campaign,
    _Host,
    delivered,
    intended_pdu,
)
from idemlink.device_sim.bus import Bus as Medium
from idemlink.device_sim.bus import BusConfig, BusTransport, LiveBusTransport, Station
from idemlink.device_sim.bus_station import (
    ProcessStation,
    c_device_command,
    qemu_device_command,
    start_stations,
)
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import Delivery, DeliveryLog, LinkConfig
from idemlink.host.bus import Bus, BusDevice
from idemlink.host.command import Command, CommandKind, Result
from idemlink.oracle import Claim, Delivered, Record, Run
from idemlink.protocol.bus_rules import BreakerPolicy
from idemlink.protocol.outcome import LocalProtocolError
from idemlink.protocol.regmap_file import resolve_regmap
from idemlink.soak_device import CLOCK_TOLERANCE, EffectsReader


@dataclass(frozen=True, slots=True)
class BusCampaignConfig:
    devices: int = 8
    commands: int = 400  #: over the whole bus
    loss: float = 0.1  #: per-frame loss, each direction, per device
    dup: float = 0.02
    corrupt: float = 0.02
    reboot_every: int = 60  #: mean commands of one device between its reboots (0: never)
    broadcast_every: int = 25  #: mean commands on the bus between broadcasts (0: never)
    dead: int | None = -1  #: the address taken off the bus for a stretch (-1: the last; None: none)
    dead_from: float = 0.3  #: ... from this share of the commands
    dead_until: float = 0.55  #: ... to this one
    seed: int = 1
    baud: int | None = 115200
    turnaround: float = 0.001
    timeout: float = 0.03
    attempts: int = 6
    max_batch: int = 4
    trigger_duration: float = 0.05
    regmap: str = "thermal-controller"
    breaker_failures: int = 2
    breaker_cooldown: float = 5.0  #: simulated seconds (a dead device is refused a while)
    c_devices: int = 0  #: the last addresses are the posix C device (processes; real time)
    c_binary: str | None = None  #: its binary (built with IDL_BUS=1)
    qemu_devices: int = 0  #: ... then the C device on QEMU (tools/qemu-device)
    qemu_board: str = "mps2"
    qemu_tool: str | None = None
    qemu_elf: str | None = None  #: an image built with IDL_OPTS=-DIDL_BUS=1
    live_timeout: float = 0.03  #: real seconds before a retry on a mixed bus
    live_cooldown: float = 2.0  #: real seconds a breaker stays open on a mixed bus

    def __post_init__(self) -> None:
        if not 1 <= self.devices <= 247:
            raise LocalProtocolError(f"a bus has 1..247 devices, not {self.devices}")
        if not 0 <= self.c_devices + self.qemu_devices <= self.devices or \
                min(self.c_devices, self.qemu_devices) < 0:
            raise LocalProtocolError(f"{self.c_devices} C and {self.qemu_devices} QEMU devices "
                                     f"do not fit a bus of {self.devices}")
        if self.c_devices and self.c_binary is None:
            raise LocalProtocolError("C devices on the bus need the posix device's binary")
        if self.qemu_devices and (self.qemu_tool is None or self.qemu_elf is None):
            raise LocalProtocolError("QEMU devices on the bus need tools/qemu-device and an image")
        if not 0.0 <= self.dead_from <= self.dead_until <= 1.0:
            raise LocalProtocolError("the dead stretch is 0 <= dead_from <= dead_until <= 1")

    @property
    def live(self) -> bool:
        """Devices in other processes: the run is on the real clock."""
        return self.c_devices + self.qemu_devices > 0

    @property
    def python_devices(self) -> int:
        return self.devices - self.c_devices - self.qemu_devices

    def commands_of_processes(self) -> list[tuple[int, str]]:
        """(address, command) of the devices in other processes."""
        first = self.python_devices + 1
        cmds = [c_device_command(self.c_binary or "", self.trigger_duration)] * self.c_devices
        cmds += [qemu_device_command(self.qemu_tool or "", self.qemu_board, self.qemu_elf or "",
                                     self.trigger_duration)] * self.qemu_devices
        return list(zip(range(first, first + len(cmds)), cmds, strict=True))

    @property
    def dead_address(self) -> int | None:
        if self.dead is None:
            return None
        return self.devices if self.dead == -1 else self.dead

    def device_config(self, address: int) -> CampaignConfig:
        """One device's campaign: its own seed; no host crashes, outages or late copies."""
        return CampaignConfig(
            commands=self.commands, loss=self.loss, dup=self.dup, corrupt=self.corrupt,
            reboot_every=self.reboot_every, restart_every=0, outage_every=0, late=0.0,
            seed=self.seed * 1000 + address, baud=self.baud,
            timeout=self.live_timeout if self.live else self.timeout,
            attempts=self.attempts, max_batch=self.max_batch,
            trigger_duration=self.trigger_duration, regmap=self.regmap)

    def link(self, address: int) -> LinkConfig:
        """What one device hears and says passes through (unpaced: the medium times it)."""
        return LinkConfig(baud=None, latency=0.0, frame_loss=self.loss, frame_dup=self.dup,
                          frame_corrupt=self.corrupt, seed=self.seed * 7919 + address)


@dataclass(slots=True)
class BusCampaignReport:
    config: dict[str, Any]
    devices: dict[int, CampaignReport] = field(default_factory=dict)
    commands: int = 0
    broadcasts: int = 0
    broadcast_outcomes: Counter[str] = field(default_factory=Counter)
    broadcast_executions: int = 0
    dead_stretch: tuple[int, int] | None = None  #: (first, last) command the dead device missed
    breaker_refused: int = 0  #: commands of the dead device ended BREAKER_OPEN, nothing sent
    medium: dict[str, Any] = field(default_factory=dict)
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    interrupted: bool = False

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.devices.values())

    def total(self, name: str) -> int:
        return sum(int(getattr(r, name)) for r in self.devices.values())

    def verdict(self) -> str:
        """One line: PASS or FAIL, the four counts summed over the devices (each device is
        judged alone: a FAIL names the devices)."""
        counts = (f"{self.commands} commands on {len(self.devices)} devices, "
                  f"{self.total('duplicated_effects')} duplicated effects, "
                  f"{self.total('lost_acknowledged_writes')} lost acknowledged writes, "
                  f"{self.total('misclassified')} misclassified, "
                  f"{self.total('register_semantics')} register-semantics violations")
        if self.passed and self.interrupted:
            return f"interrupted: no verdict ({counts} so far)"
        failed = [a for a, r in self.devices.items() if not r.passed]
        tail = f" (devices {', '.join(map(str, failed))})" if failed else ""
        return f"{'PASS' if self.passed else 'FAIL'}: {counts}{tail}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["devices"] = {str(a): r.as_dict() for a, r in self.devices.items()}
        d["broadcast_outcomes"] = dict(self.broadcast_outcomes)
        d["passed"] = self.passed
        d["verdict"] = self.verdict()
        return d


class _BusHost(_Host, BusDevice):
    """One address's handle on the host's ``Bus`` whose every Result is also kept (``_Host``);
    a scheduled probe (run while another device's batch goes out) is claimed by its member's
    oracle as a read-back."""

    member: _Member | None = None

    def probe(self) -> bool | None:
        before = len(self.made)
        found = super().probe()
        probes, self.made[before:] = self.made[before:], []
        if self.member is not None and probes:
            self.member.claim_readbacks(probes)
        return found


class _Member(_Campaign):
    """One device's campaign on the bus: the single-device campaign's hooks over one member of
    the medium and its own oracle."""

    def __init__(self, owner: BusCampaign, address: int) -> None:
        self.owner = owner
        self.address = address
        self._attach()
        self.sim_transport = owner.wire  # type: ignore[assignment]  # now(), like SimTransport
        self.line = DeliveryLog()
        owner.medium.members[address].ears.record_deliveries(self.line.sink("a->b"))
        self.heard: list[Delivery] = []  #: frames the master heard, not yet fed
        self._exec_mark = 0
        self._boot_mark = 0
        self.broadcast_runs = 0  #: broadcast executions in its record
        Campaign.__init__(self, owner.cfg.device_config(address), owner.transport,
                          tolerance=CLOCK_TOLERANCE if owner.cfg.live else 0.0,
                          environment=self._environment_moves)
        self.transport = owner.transport  # one host process, one line
        self.oracle.address = address

    _environment_moves = True

    def _attach(self) -> None:
        self.sim = self.owner.medium.device(self.address)
        self.sim.core.max_log = 1000

    def count_broadcasts(self) -> int:
        return sum(1 for x in self.sim.executions.since(self.sim.executions.first_kept)
                   if x.epoch == 0)

    def _new_host(self) -> _Host:
        host = self.owner.host  # the bus's timeout and attempts are the device campaign's
        dev = _BusHost(host, self.address, max_inflight=1)
        dev.member = self
        host._devices[self.address] = dev
        return dev

    def claim_readbacks(self, results: list[Result]) -> None:
        """Read-backs made outside this device's batches (a scheduled probe): claimed and
        judged like a reconcile's."""
        handles = [self.oracle.claim(self.dev.claim(r, readback=True)) for r in results]
        self._sync()
        for h in handles:
            self.oracle.judge(h)

    def deliveries(self) -> list[Delivered]:
        self.owner.share_heard()
        heard, self.heard = self.heard, []
        units = sorted([*self.line.take(), *heard], key=lambda d: d.time)
        return delivered(units)

    def schedule_reboot(self) -> None:
        wire = self.owner.wire
        self.owner.medium.schedule_reboot(self.address, wire.now() + self.rng.uniform(0, 0.01))

    def schedule_outage(self, directions: tuple[str, ...], delay: float, length: float) -> None:
        raise NotImplementedError("no outages on the bus campaign")

    def link_stats(self) -> dict[str, dict[str, int]]:
        m = self.owner.medium.members[self.address]
        return {"ears": m.ears.stats.as_dict(), "mouth": m.mouth.stats.as_dict()}


class _ProcessMember(_Member):
    """A device in another process: its record is its effects file, its registers are judged
    from its answers, the environment does not move for it."""

    _environment_moves = False

    def _attach(self) -> None:
        station = self.owner.medium.station(self.address)
        assert isinstance(station, ProcessStation)
        self.station = station
        self.reader = EffectsReader(station.effects)

    def records(self) -> list[Record]:
        self.station.check()
        got = self.reader.read()
        self.broadcast_runs += sum(1 for r in got if isinstance(r, Run) and r.epoch == 0)
        return got

    def _check_truth(self) -> None:
        pass  # no look inside another process: its answers and record are judged

    def count_broadcasts(self) -> int:
        return self.broadcast_runs


class BusCampaign:
    """See the module docstring."""

    def __init__(self, cfg: BusCampaignConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"idemlink-bus/{cfg.seed}")
        regmap = resolve_regmap(cfg.regmap)
        addresses = range(1, cfg.devices + 1)
        start = time.monotonic() if cfg.live else 0.0
        stations: list[Station] = [
            SimulatedDevice(seed=cfg.seed * 1000 + a, trigger_duration=cfg.trigger_duration,
                            regmap=regmap, address=a, now=start)
            for a in range(1, cfg.python_devices + 1)]
        self._work: tempfile.TemporaryDirectory[str] | None = None
        self.processes: list[ProcessStation] = []
        if cfg.live:
            self._work = tempfile.TemporaryDirectory(prefix="idemlink-bus-soak-")
            self.processes = start_stations(cfg.commands_of_processes(), Path(self._work.name))
            stations += self.processes
        self.medium = Medium(stations, BusConfig(baud=cfg.baud, turnaround=cfg.turnaround),
                             faults={a: cfg.link(a) for a in addresses}, start=start)
        self._start = start
        self.master_line = DeliveryLog()
        self.medium.record_deliveries(self.master_line.sink("b->a"))
        self.wire: BusTransport | LiveBusTransport = (
            LiveBusTransport(self.medium) if cfg.live else BusTransport(self.medium))
        self.transport = CrashingTransport(self.wire)
        self.host = Bus(self.transport, regmap=regmap,
                        timeout=cfg.live_timeout if cfg.live else cfg.timeout,
                        attempts=cfg.attempts, baud=cfg.baud, turnaround=cfg.turnaround,
                        breaker=BreakerPolicy(cfg.breaker_failures, cfg.live_cooldown
                                              if cfg.live else cfg.breaker_cooldown))
        self.members = {a: (_Member if a <= cfg.python_devices else _ProcessMember)(self, a)
                        for a in addresses}
        self.report = BusCampaignReport(config=asdict(cfg))

    def close(self) -> None:
        """Stop the devices in other processes (their temporary flash directories go)."""
        for p in self.processes:
            p.close()
        self.processes = []
        if self._work is not None:
            self._work.cleanup()
            self._work = None

    def share_heard(self) -> None:
        """Every frame the master heard goes to every device's oracle (each keeps its own)."""
        units = self.master_line.take()
        for m in self.members.values():
            m.heard += units

    # ------------------------------------------------------------------ broadcast
    def broadcast(self) -> None:
        """A set-only write to every device, verified on each; each device's oracle claims its
        outcome and judges it with the read-back's."""
        rng = self.rng
        some = next(iter(self.members.values()))
        holdings = some.holdings
        if not holdings:
            return
        if rng.random() < 0.5:
            spec = rng.choice(holdings)
            cmd = Command(CommandKind.WRITE, spec.address, 1,
                          (rng.randint(spec.minimum, spec.maximum),))
            values: dict[str | int, int | str] = {spec.name: cmd.values[0]}
        else:
            vals = tuple(rng.randint(s.minimum, s.maximum) for s in holdings)
            cmd = Command(CommandKind.WRITE, holdings[0].address, len(vals), vals)
            values = {s.name: v for s, v in zip(holdings, vals, strict=True)}
        for m in self.members.values():
            m._sync()
        results = self.host.broadcast(values, repeat=rng.choice([1, 1, 2]))
        self.report.broadcasts += 1
        pdu = intended_pdu(cmd)
        for a, r in results.items():
            m = self.members[a]
            m.dev.forget_made()
            verified = self.host.verify({a: r})[a]
            at = self.transport.now()
            readbacks = [m.oracle.claim(m.dev.claim(x, readback=True)) for x in m.dev.made]
            claim = m.oracle.claim(Claim(pdu, ((0, r.seq),), verified.outcome.name,
                                         (0, r.seq), at=at))
            m._sync()
            for h in readbacks:
                m.oracle.judge(h)
            m.oracle.judge(claim)
            holds = {"OK": True, "NOT_EXECUTED": False}.get(verified.outcome.name)
            m.oracle.check_reconcile(pdu, holds, {})
            m.dev.forget_made()
            self.report.broadcast_outcomes[verified.outcome.name] += 1

    # ------------------------------------------------------------------ the run
    def run(self, progress: Callable[[int], None] | None = None,
            stop: Callable[[], bool] | None = None, *,
            fail_fast: bool = False) -> BusCampaignReport:
        cfg = self.cfg
        rep = self.report
        t0 = time.perf_counter()
        for m in self.members.values():
            m.begin()
        dead = cfg.dead_address
        dead_at = (int(cfg.dead_from * cfg.commands), int(cfg.dead_until * cfg.commands))
        done = 0
        order = list(self.members)
        try:
            while done < cfg.commands:
                if stop is not None and stop():
                    rep.interrupted = True
                    break
                if fail_fast and not all(m.oracle.tally.passed for m in self.members.values()):
                    break
                if dead is not None and dead_at[0] <= done and rep.dead_stretch is None:
                    self.medium.set_dead(dead)
                    rep.dead_stretch = (done, done)
                if dead is not None and rep.dead_stretch and done >= dead_at[1] and \
                        self.medium.members[dead].dead:
                    self.medium.set_dead(dead, False)
                    rep.dead_stretch = (rep.dead_stretch[0], done)
                n = min(self.rng.randint(1, cfg.max_batch), cfg.commands - done)
                if cfg.broadcast_every and self.rng.random() < n / cfg.broadcast_every:
                    self.broadcast()
                m = self.members[self.rng.choice(order)]
                m.step(n)
                done += n
                if progress is not None:
                    progress(n)
        except KeyboardInterrupt:
            rep.interrupted = True
        rep.commands = done
        for p in self.processes:  # a reboot in progress comes back before the last records
            p.wait_up()
        for a, m in self.members.items():
            rep.devices[a] = m.conclude()
            rep.devices[a].interrupted = rep.interrupted
            rep.breaker_refused += m.dev.breaker.refused if isinstance(m.dev, BusDevice) else 0
        rep.broadcast_executions = sum(m.count_broadcasts() for m in self.members.values())
        s = self.medium.stats
        rep.medium = {"transmissions": s.transmissions, "collisions": s.collisions,
                      "delivered": s.delivered, "dropped": s.dropped, "overflow": s.overflow}
        rep.simulated_seconds = self.wire.now() - self._start
        rep.wall_seconds = time.perf_counter() - t0
        return rep


def run_bus_campaign(cfg: BusCampaignConfig, progress: Callable[[int], None] | None = None,
                     stop: Callable[[], bool] | None = None, *,
                     fail_fast: bool = False) -> BusCampaignReport:
    """Run the campaign on a simulated bus in process (simulated time, reproducible from the
    seed; with devices in other processes, on the real clock)."""
    campaign = BusCampaign(cfg)
    try:
        return campaign.run(progress, stop, fail_fast=fail_fast)
    finally:
        campaign.close()
