"""Host + simulator + emulated link against a plain model, with the link's faults as rules.

Hypothesis chooses commands and faults (lossy/duplicating/corrupting lines, answers lost, reboots
in flight). After every step the device's true state must equal the model built only from the
outcomes the host reported (OK applied, NOT_EXECUTED/REJECTED not applied, UNKNOWN settled by
``reconcile()``), and no request may ever have run twice under one sequence number.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.command import Result
from idemlink.host.device import Device
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import RegisterKind, TriggerState
from idemlink.protocol.regmap_file import DEFAULT_MAP

HOLDINGS = DEFAULT_MAP.of_kind(RegisterKind.HOLDING)
TRIGGER = DEFAULT_MAP.of_kind(RegisterKind.TRIGGER)[0]
probabilities = st.sampled_from([0.0, 0.05, 0.2, 0.4])


class LinkMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.t = SimTransport(SimulatedDevice(seed=42, trigger_duration=1e6))
        self.dev = Device(self.t, timeout=0.02, attempts=6, max_inflight=4)
        self.dev.connect()
        self.holdings = {s.name: s.default for s in HOLDINGS}
        self.generation = 0
        self.trigger = TriggerState.IDLE
        self.starts = 0
        self.seed = 0

    # ---- faults ---------------------------------------------------------------------------
    @rule(loss=probabilities, dup=probabilities, corrupt=probabilities, reorder=probabilities)
    def change_line(self, loss: float, dup: float, corrupt: float, reorder: float) -> None:
        self.seed += 1
        cfg = LinkConfig(baud=115200, latency=0.001, frame_loss=loss, frame_dup=dup,
                         frame_corrupt=corrupt, reorder=reorder, reorder_max_hold=0.005,
                         seed=self.seed)
        self.t.set_link(cfg, LinkConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                                           "seed": self.seed + 1000}))

    @rule(delay=st.floats(0.0, 0.05))
    def reboot_soon(self, delay: float) -> None:
        self.t.schedule_reboot(self.t.now() + delay)

    @rule()
    def lose_next_answers(self) -> None:
        self.t.drop_answers = True

    # ---- commands -------------------------------------------------------------------------
    def _settle(self, res: Result) -> bool:
        """True when the command's effect must be applied to the model."""
        self.t.drop_answers = False
        if res.outcome is Outcome.OK:
            return True
        if res.outcome is Outcome.UNKNOWN:
            rec = self.dev.reconcile(res)
            while rec is None or rec.intended_state_holds is None:  # read-back lost: try again
                rec = self.dev.reconcile(res)
            self.dev.acknowledge_unknown()
            return bool(rec.intended_state_holds)
        return False

    def _sync_reboots(self) -> None:
        if len(self.t.device.epochs) != self._epochs_seen:
            self._epochs_seen = len(self.t.device.epochs)
            self.trigger = TriggerState.IDLE  # volatile: a reboot resets the trigger
            self._rebooted = True  # the generation boots at the saved ceiling: see the invariant

    def _still_this_boot(self, res: Result) -> bool:
        """An OK command ran in ``res.epoch``; a later reboot has undone volatile effects."""
        return res.outcome is not Outcome.OK or res.epoch == self.t.device.epoch

    _epochs_seen = 1
    _rebooted = False

    @rule(i=st.integers(0, len(HOLDINGS) - 1), value=st.integers(0, 1100))
    def write_one(self, i: int, value: int) -> None:
        spec = HOLDINGS[i]
        res = self.dev.write({spec.name: value})
        self._sync_reboots()
        in_range = spec.minimum <= value <= spec.maximum
        if res.outcome is not Outcome.UNKNOWN:
            assert (res.outcome is Outcome.OK) == in_range, res
        if self._settle(res) and in_range:
            if self.holdings[spec.name] != value:
                self.generation = (self.generation + 1) & 0xFFFF
            self.holdings[spec.name] = value

    @rule(stale=st.booleans(), value=st.integers(0, 100))
    def conditional_write(self, stale: bool, value: int) -> None:
        gen = (self.generation + 1) & 0xFFFF if stale else self.generation
        res = self.dev.write_if_generation(gen, {"fan_setpoint": value})
        self._sync_reboots()
        if res.outcome is Outcome.UNKNOWN:
            self._settle(res)
            self.holdings["fan_setpoint"] = self.t.device.core.value("fan_setpoint")
            self.generation = self.t.device.core.generation
            return
        if self._rebooted and res.outcome is Outcome.NOT_EXECUTED:
            # a reboot during the call: the generation jumped to the saved ceiling, so a guard
            # from before it fails (the point of the ceiling); nothing ran
            assert self.t.device.core.value("fan_setpoint") == self.holdings["fan_setpoint"]
            return
        assert res.outcome is (Outcome.NOT_EXECUTED if stale else Outcome.OK), res
        if not stale:
            if self.holdings["fan_setpoint"] != value:
                self.generation = (self.generation + 1) & 0xFFFF
            self.holdings["fan_setpoint"] = value

    @rule()
    def trigger(self) -> None:
        before, boots = self.trigger, len(self.t.device.epochs)
        res = self.dev.trigger()
        self._sync_reboots()
        if res.outcome is Outcome.OK and len(self.t.device.epochs) == boots:
            expected = {TriggerState.IDLE: 0, TriggerState.RUNNING: 0x0101}[before]
            assert res.code == expected, (res, before)
        if self._settle(res) and self._still_this_boot(res):
            self.trigger = TriggerState.RUNNING

    @rule()
    @precondition(lambda self: self.trigger is not TriggerState.IDLE)
    def trigger_reset(self) -> None:
        res = self.dev.trigger_reset()
        self._sync_reboots()
        if self._settle(res):
            self.trigger = TriggerState.IDLE

    @rule()
    def read_all(self) -> None:
        res = self.dev.read(HOLDINGS[0].name, len(HOLDINGS))
        self._sync_reboots()
        if res.outcome is Outcome.OK:
            assert dict(zip(self.holdings, res.values, strict=True)) == self.holdings
        else:
            self._settle(res)

    # ---- invariants -----------------------------------------------------------------------
    @invariant()
    def device_matches_model(self) -> None:
        core = self.t.device.core
        assert {n: core.value(n) for n in self.holdings} == self.holdings
        if self._rebooted:  # it boots at the saved ceiling: it may jump, never go back
            assert 0 <= (core.generation - self.generation) & 0xFFFF < 0x8000
            self.generation, self._rebooted = core.generation, False
        assert core.generation == self.generation
        assert TriggerState(core.value(TRIGGER.name)) == self.trigger

    @invariant()
    def nothing_ran_twice_under_one_number(self) -> None:
        per_key = Counter((e.epoch, e.seq) for e in self.t.device.executions)
        assert not per_key or max(per_key.values()) == 1


TestLinkMachine = LinkMachine.TestCase
TestLinkMachine.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
