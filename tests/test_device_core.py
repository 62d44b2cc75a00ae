"""The device core against a plain model (hypothesis RuleBasedStateMachine), and unit tests of
each rule: absolute writes, atomic FC16, W1C faults, the trigger table, the generation counter,
the conditional write, the ground-truth log, snapshot/restore and reboot."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from idemlink.protocol.device_core import (
    GENERATION_RESERVE,
    TRIGGER_TABLE,
    ConfigSnapshot,
    DeviceCore,
    EffectKind,
    RegisterAccessError,
    SnapshotError,
    TriggerEvent,
)
from idemlink.protocol.outcome import ModbusException
from idemlink.protocol.registers import TriggerState, TriggerStatus

# The model knows the default map by heart (written out here, not read from the code under test).
INPUT, HOLDING, FAULT, TRIGGER, GEN = "input", "holding", "fault", "trigger", "generation"
MAP = {
    0: ("temperature", INPUT), 1: ("humidity", INPUT), 2: ("fan_speed", INPUT),
    3: ("generation", GEN), 4: ("threshold", HOLDING), 5: ("mode", HOLDING),
    6: ("fan_setpoint", HOLDING), 7: ("faults", FAULT), 8: ("self_clean", TRIGGER),
}
LIMITS = {4: (0, 1000), 5: (0, 2), 6: (0, 100)}
FAULT_MASK = 0b111
DURATION = 3.0


class Reject(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class Model:
    """The register semantics written as plainly as possible."""

    def __init__(self) -> None:
        self.now = 0.0
        self.inputs = {0: 250, 1: 450, 2: 1200}
        self.holdings = {4: 350, 5: 1, 6: 50}
        self.generation = 0
        self.ceiling = 0  # the generation flash holds: every holding of this map persists
        self.external = 0
        self.latched = 0
        self.trigger = 0  # 0 IDLE 1 RUNNING 2 DONE
        self.started_at = 0.0
        self.starts = 0
        self.sets = 0

    def cond(self) -> int:
        return self.external | (1 if self.inputs[0] > self.holdings[4] else 0)

    def tick(self) -> None:
        if self.trigger == 1 and self.now >= self.started_at + DURATION:
            self.trigger = 2
        self.latched |= self.cond()

    def value(self, a: int) -> int:
        kind = MAP[a][1]
        return {INPUT: lambda: self.inputs[a], HOLDING: lambda: self.holdings[a],
                FAULT: lambda: self.latched, TRIGGER: lambda: self.trigger,
                GEN: lambda: self.generation}[kind]()

    def read(self, a: int, n: int) -> list[int]:
        if any(x not in MAP for x in range(a, a + n)):
            raise Reject(2)
        return [self.value(x) for x in range(a, a + n)]

    def check(self, a: int, values: list[int], holdings_only: bool = False) -> None:
        for x in range(a, a + len(values)):
            if x not in MAP or MAP[x][1] in (INPUT, GEN) or (holdings_only
                                                             and MAP[x][1] != HOLDING):
                raise Reject(2)
        for x, v in zip(range(a, a + len(values)), values, strict=True):
            kind = MAP[x][1]
            if kind == HOLDING and not LIMITS[x][0] <= v <= LIMITS[x][1]:
                raise Reject(3)
            if kind == FAULT and v & ~FAULT_MASK:
                raise Reject(3)
            if kind == TRIGGER and v not in (0, 1):
                raise Reject(3)

    def apply(self, a: int, values: list[int]) -> None:
        changed = False
        clear = None
        for x, v in zip(range(a, a + len(values)), values, strict=True):
            kind = MAP[x][1]
            if kind == HOLDING and self.holdings[x] != v:
                self.holdings[x] = v
                self.sets += 1
                changed = True
            elif kind == TRIGGER:
                if v == 1 and self.trigger == 0:
                    self.trigger, self.started_at = 1, self.now
                    self.starts += 1
                elif v == 0:
                    self.trigger = 0
            elif kind == FAULT:
                clear = v
        if changed:
            self.generation = (self.generation + 1) % 0x10000
            if not 1 <= (self.ceiling - self.generation) % 0x10000 <= 64:
                self.ceiling = (self.generation + 64) % 0x10000  # reached: a new reserve
        if clear is not None:
            self.latched &= ~(clear & ~self.cond())
        self.latched |= self.cond()

    def trigger_code(self, v: int) -> int:
        if v not in (0, 1):
            return 0xFF01
        if v == 0:
            return 0
        return {0: 0, 1: 0x0101, 2: 0x0102}[self.trigger]


def exc(fc: int, code: int) -> bytes:
    return bytes([fc | 0x80, code])


addresses = st.one_of(st.integers(0, 10), st.integers(0, 0xFFFF))
u16 = st.one_of(st.integers(0, 3), st.integers(0, 1100), st.integers(0, 0xFFFF))


class CoreVersusModel(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.core = DeviceCore(trigger_duration=DURATION)
        self.model = Model()

    def run(self, pdu: bytes) -> bytes:
        self.model.tick()
        return self.core.execute(pdu, self.model.now)

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.5, 3.0, 10.0]))
    def advance(self, dt: float) -> None:
        self.model.now += dt
        self.core.tick(self.model.now)
        self.model.tick()

    @rule(fc=st.sampled_from([3, 4]), a=addresses, n=st.integers(1, 125))
    def read(self, fc: int, a: int, n: int) -> None:
        n = min(n, 0x10000 - a)
        before = self.core.values(), len(self.core.log)
        got = self.run(struct.pack(">BHH", fc, a, n))
        try:
            vals = self.model.read(a, n)
            assert got == bytes([fc, 2 * n]) + struct.pack(f">{n}H", *vals)
        except Reject as r:
            assert got == exc(fc, r.code)
        assert (self.core.values(), len(self.core.log)) == before  # reads change nothing

    @rule(a=addresses, v=u16)
    def write_single(self, a: int, v: int) -> None:
        pdu = struct.pack(">BHH", 6, a, v)
        got = self.run(pdu)
        try:
            self.model.check(a, [v])
            self.model.apply(a, [v])
            assert got == pdu  # FC06 echoes
        except Reject as r:
            assert got == exc(6, r.code)

    @rule(a=st.one_of(st.integers(2, 8), addresses), vals=st.lists(u16, min_size=1, max_size=7))
    def write_multiple(self, a: int, vals: list[int]) -> None:
        vals = vals[: 0x10000 - a]
        pdu = struct.pack(f">BHHB{len(vals)}H", 16, a, len(vals), 2 * len(vals), *vals)
        got = self.run(pdu)
        try:
            self.model.check(a, vals)
            self.model.apply(a, vals)
            assert got == struct.pack(">BHH", 16, a, len(vals))
        except Reject as r:
            assert got == exc(16, r.code)

    @rule(stale=st.booleans(), a=st.integers(3, 8), vals=st.lists(u16, min_size=1, max_size=3))
    def write_if_generation(self, stale: bool, a: int, vals: list[int]) -> None:
        g = (self.model.generation + (7 if stale else 0)) % 0x10000
        pdu = struct.pack(f">BHHHB{len(vals)}H", 0x41, g, a, len(vals), 2 * len(vals), *vals)
        before = self.core.values()
        got = self.run(pdu)
        try:
            self.model.check(a, vals, holdings_only=True)
            if stale:
                assert got == struct.pack(">BBH", 0x41, 0x12, self.model.generation)
                assert self.core.values() == before
            else:
                self.model.apply(a, vals)
                assert got == struct.pack(">BBH", 0x41, 0, self.model.generation)
        except Reject as r:
            assert got == exc(0x41, r.code)

    @rule(v=st.sampled_from([0, 1, 1, 1, 2, 0xFFFF]))
    def trigger(self, v: int) -> None:
        got = self.run(struct.pack(">BHH", 0x42, 8, v))
        code = self.model.trigger_code(v)
        if code != 0xFF01:
            self.model.apply(8, [v])
        assert got == struct.pack(">BHH", 0x42, 8, code)

    @rule(t=st.one_of(st.integers(0, 1100), st.integers(-1, 1)))
    def temperature(self, t: int) -> None:
        if t in (-1, 0, 1):  # right at the threshold, where > and >= differ
            t = self.model.holdings[4] + t if self.model.holdings[4] + t >= 0 else 0
        self.model.tick()
        self.core.set_input("temperature", t, self.model.now)
        self.model.inputs[0] = t
        self.model.latched |= self.model.cond()

    @rule(bit=st.sampled_from([(1, "sensor_fault"), (2, "fan_stall")]), on=st.booleans())
    def condition(self, bit: tuple[int, str], on: bool) -> None:
        self.model.tick()
        self.core.set_condition(bit[1], on, self.model.now)
        self.model.external = (self.model.external | 1 << bit[0] if on
                               else self.model.external & ~(1 << bit[0]))
        self.model.latched |= self.model.cond()

    @rule(pdu=st.sampled_from([
        ("", 0x80, 3), ("03", 0x83, 3), ("0300000000", 0x83, 3), ("030000007e", 0x83, 3),
        ("03fffe0003", 0x83, 2), ("04ffff0002", 0x84, 2), ("060004", 0x86, 3),
        ("06000400010000", 0x86, 3), ("10000400000000", 0x90, 3),
        ("1000040001030001", 0x90, 3), ("10000400020400c8", 0x90, 3),
        ("100004007cf8" + "00" * 248, 0x90, 3), ("10ffff00020400c80001", 0x90, 2),
        ("4100000004000102", 0xC1, 3), ("42000800", 0xC2, 3), ("0100000001", 0x81, 1),
        ("2b0e0100", 0xAB, 1), ("ff", 0xFF, 1),
    ]))
    def malformed(self, pdu: tuple[str, int, int]) -> None:
        """Every bad request gets the right exception and changes nothing, not even the log."""
        self.core.tick(self.model.now)
        self.model.tick()
        before = self.core.values(), len(self.core.log)
        got = self.run(bytes.fromhex(pdu[0]))
        assert got == bytes([pdu[1], pdu[2]])
        assert (self.core.values(), len(self.core.log)) == before

    @rule()
    def reboot(self) -> None:
        """Volatile state goes; configuration, live inputs and conditions stay."""
        self.model.tick()
        self.core.reset_volatile(self.model.now)
        self.model.trigger = 0
        self.model.generation = self.model.ceiling  # boots at the saved ceiling
        self.model.latched = self.model.cond()

    @rule()
    def power_cycle_through_flash(self) -> None:
        """A new core built from the old one's snapshot (JSON, as in the flash file)."""
        self.model.tick()
        self.core.tick(self.model.now)
        snap = ConfigSnapshot.from_json(self.core.snapshot().to_json())
        self.core = DeviceCore(trigger_duration=DURATION, config=snap, now=self.model.now,
                               inputs={"temperature": self.model.inputs[0]})
        for bit, name in ((1, "sensor_fault"), (2, "fan_stall")):
            if self.model.external & (1 << bit):
                self.core.set_condition(name, True, self.model.now)
        self.model.trigger = 0
        self.model.generation = self.model.ceiling
        self.model.latched = self.model.cond()
        self.model.starts = self.model.sets = 0

    @invariant()
    def agrees(self) -> None:
        m = self.model
        self.core.tick(m.now)
        m.tick()
        want = {MAP[a][0]: m.value(a) for a in MAP}
        assert self.core.values() == want
        assert self.core.count(EffectKind.TRIGGER_STARTED) == m.starts
        assert self.core.count(EffectKind.SET) == m.sets


TestCoreVersusModel = CoreVersusModel.TestCase
TestCoreVersusModel.settings = settings(max_examples=120, stateful_step_count=40, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------- unit tests


def fc06(a: int, v: int) -> bytes:
    return struct.pack(">BHH", 6, a, v)


def test_fc16_is_atomic_when_the_last_value_is_out_of_range() -> None:
    core = DeviceCore()
    pdu = struct.pack(">BHHB3H", 16, 4, 3, 6, 400, 2, 101)  # fan_setpoint 101 > 100
    assert core.execute(pdu, 1.0) == b"\x90\x03"
    assert (core.value("threshold"), core.value("mode"), core.generation) == (350, 1, 0)
    assert core.log == []


def test_fc16_unknown_address_wins_over_bad_value() -> None:
    core = DeviceCore()
    pdu = struct.pack(">BHHB6H", 16, 4, 6, 12, 5000, 0, 0, 0, 0, 0)  # 4..9; 9 unmapped
    assert core.execute(pdu, 0.0) == b"\x90\x02"


def test_write_to_input_and_generation_is_exception_02() -> None:
    core = DeviceCore()
    assert core.execute(fc06(0, 100), 0.0) == b"\x86\x02"
    assert core.execute(fc06(3, 100), 0.0) == b"\x86\x02"
    assert core.value("temperature") == 250 and core.generation == 0


def test_generation_counts_effective_changes_only() -> None:
    core = DeviceCore()
    assert core.execute(fc06(4, 350), 0.0) == fc06(4, 350)  # same value: no-op
    assert core.generation == 0
    core.execute(fc06(4, 351), 0.0)
    core.execute(fc06(4, 351), 0.0)  # retry of the same write: no second change
    assert core.generation == 1
    core.execute(struct.pack(">BHHB3H", 16, 4, 3, 6, 351, 2, 50), 0.0)  # one request, 1 change
    assert core.generation == 2
    assert core.count(EffectKind.SET, "threshold") == 1
    assert core.count(EffectKind.GENERATION) == 2


def test_generation_wraps_modulo_2_16() -> None:
    core = DeviceCore(config=ConfigSnapshot(((4, 350), (5, 1), (6, 50)), 0xFFFF))
    core.execute(fc06(5, 2), 0.0)
    assert core.generation == 0


def test_faults_latch_survive_reads_and_clear_only_when_gone() -> None:
    core = DeviceCore()
    core.set_input("temperature", 400, 1.0)  # > threshold 350
    assert core.value("faults") == 0b001
    core.set_input("temperature", 300, 2.0)  # condition gone, still latched
    for _ in range(3):
        assert core.execute(bytes.fromhex("0300070001"), 3.0) == bytes.fromhex("03020001")
    assert core.execute(fc06(7, 0), 3.0) == fc06(7, 0)  # writing 0 does nothing
    assert core.value("faults") == 0b001
    core.set_condition("fan_stall", True, 3.5)
    assert core.value("faults") == 0b101
    assert core.execute(fc06(7, 0b101), 4.0) == fc06(7, 0b101)  # clear both; stall persists
    assert core.value("faults") == 0b100
    core.set_condition("fan_stall", False, 5.0)
    core.execute(fc06(7, 0b100), 6.0)
    assert core.value("faults") == 0
    assert core.execute(fc06(7, 0b1000), 6.0) == b"\x86\x03"  # undeclared bit
    assert core.count(EffectKind.FAULT_CLEARED) == 2


def test_trigger_runs_once_for_any_number_of_retries() -> None:
    core = DeviceCore(trigger_duration=2.0)
    codes = [core.trigger(8, 1, t) for t in (0.0, 0.1, 1.0, 1.9)]
    assert codes == [0, 0x0101, 0x0101, 0x0101]
    assert core.trigger(8, 1, 2.0) == 0x0102
    assert core.trigger(8, 1, 50.0) == 0x0102
    assert core.count(EffectKind.TRIGGER_STARTED) == 1
    finished = core.effects(EffectKind.TRIGGER_FINISHED)
    assert [e.time for e in finished] == [2.0]
    assert core.trigger(8, 2, 50.0) == 0xFF01
    assert core.trigger(8, 0, 51.0) == 0 and core.value("self_clean") == TriggerState.IDLE
    assert core.trigger(8, 1, 52.0) == 0
    assert core.count(EffectKind.TRIGGER_STARTED) == 2


def test_trigger_over_fc06_maps_codes_to_exceptions() -> None:
    core = DeviceCore()
    assert core.execute(fc06(8, 1), 0.0) == fc06(8, 1)
    assert core.execute(fc06(8, 1), 0.1) == fc06(8, 1)  # RUNNING: echo, nothing started
    assert core.execute(fc06(8, 7), 0.2) == b"\x86\x03"
    core.force_trigger_state("self_clean", 9)
    assert core.execute(fc06(8, 1), 0.3) == b"\x86\x04"
    assert core.trigger(8, 1, 0.3) == TriggerStatus.ABNORMAL_STATE
    assert core.execute(struct.pack(">BHH", 0x42, 8, 0), 0.3) == struct.pack(">BHH", 0x42, 8,
                                                                               0xFF00)
    assert core.count(EffectKind.TRIGGER_STARTED) == 1
    with pytest.raises(RegisterAccessError) as info:
        core.trigger(4, 1, 0.4)
    assert info.value.exception is ModbusException.ILLEGAL_DATA_ADDRESS


def test_trigger_table_is_complete_for_writes() -> None:
    for state in TriggerState:
        for event in (TriggerEvent.WRITE_0, TriggerEvent.WRITE_1):
            assert (state, event) in TRIGGER_TABLE
    assert TRIGGER_TABLE[(TriggerState.IDLE, TriggerEvent.WRITE_1)][0] is TriggerState.RUNNING


def test_conditional_write_guard() -> None:
    core = DeviceCore()
    ok = struct.pack(">BHHHB1H", 0x41, 0, 4, 1, 2, 500)
    assert core.execute(ok, 0.0) == struct.pack(">BBH", 0x41, 0, 1)
    assert core.execute(ok, 0.1) == struct.pack(">BBH", 0x41, 0x12, 1)  # retry: NOT_EXECUTED
    assert core.value("threshold") == 500 and core.count(EffectKind.SET) == 1
    assert core.write_if_generation(1, 4, [600], 0.2, tag="seq-9") == (True, 2)
    assert core.effects(EffectKind.SET)[-1].tag == "seq-9"
    bad = struct.pack(">BHHHB1H", 0x41, 2, 7, 1, 2, 1)  # fault register: holdings only
    assert core.execute(bad, 0.3) == b"\xc1\x02"


def test_log_records_are_typed_and_attributed() -> None:
    core = DeviceCore()
    core.execute(fc06(5, 2), 4.5, tag=17)
    e = core.log[0]
    assert (e.kind, e.register, e.address, e.old, e.new, e.time, e.request, e.tag) == (
        EffectKind.SET, "mode", 5, 1, 2, 4.5, 1, 17)
    assert [x.index for x in core.log] == list(range(1, len(core.log) + 1))


def test_snapshot_restore_and_reboot() -> None:
    core = DeviceCore(trigger_duration=10.0)
    core.execute(fc06(4, 500), 0.0)
    core.execute(fc06(8, 1), 1.0)
    core.set_condition("sensor_fault", True, 1.5)
    snap = ConfigSnapshot.from_json(core.snapshot().to_json())
    assert snap == core.snapshot()
    core.reset_volatile(2.0)
    assert core.value("self_clean") == TriggerState.IDLE
    assert core.value("faults") == 0b010  # still-present condition re-latched
    assert core.value("threshold") == 500 and core.generation == 1 + GENERATION_RESERVE
    core.tick(20.0)
    assert core.count(EffectKind.TRIGGER_FINISHED) == 0  # the lost run never finishes
    fresh = DeviceCore()
    fresh.restore(snap, 0.0)
    assert fresh.value("threshold") == 500 and fresh.generation == 1 + GENERATION_RESERVE
    with pytest.raises(SnapshotError):
        fresh.restore(ConfigSnapshot(((4, 5000), (5, 1), (6, 50)), 3), 0.0)
    with pytest.raises(SnapshotError):
        fresh.restore(ConfigSnapshot(((4, 1),), 3), 0.0)
    with pytest.raises(SnapshotError):
        ConfigSnapshot.from_json("{not json")
    assert fresh.value("threshold") == 500  # a bad snapshot changed nothing


# ---- flash like an MCU's: volatile writes save nothing, the generation never repeats ------------


def _pump_core(config: ConfigSnapshot | None = None) -> DeviceCore:
    from idemlink.protocol.regmap_file import builtin_map

    return DeviceCore(builtin_map("pump-controller"), config=config)


def test_a_volatile_write_saves_nothing_until_the_generation_reaches_its_ceiling() -> None:
    """``test_speed`` (0x0204) is ``persist = false``: writing it moves the generation but never
    calls the persist hook, except once per GENERATION_RESERVE changes, when the generation
    reaches the saved ceiling; a persistent write always saves. What is saved holds the volatile
    register at its default and the ceiling as the generation."""
    saves: list[ConfigSnapshot] = []
    core = _pump_core()
    speed, control = 0x0204, 0x0203
    core.write(control, [1], 0.0, persist=saves.append)  # persistent: saved, ceiling 1 + 64
    assert [s.generation for s in saves] == [1 + GENERATION_RESERVE]
    for i in range(GENERATION_RESERVE - 1):  # generations 2..64: under the ceiling (65)
        core.write(speed, [100 + i % 2], 1.0, persist=saves.append)
    assert len(saves) == 1 and core.generation == GENERATION_RESERVE
    core.write(speed, [7], 2.0, persist=saves.append)  # generation 65 reaches the ceiling
    assert [s.generation for s in saves] == [65, 65 + GENERATION_RESERVE]
    assert dict(saves[-1].holdings)[speed] == 0 and dict(saves[-1].holdings)[control] == 1
    core.write(speed, [7], 3.0, persist=saves.append)  # no effective change: nothing at all
    core.write(control, [2], 4.0, persist=saves.append)  # persistent, under the ceiling
    assert [s.generation for s in saves] == [65, 129, 129] and core.generation == 66


def test_the_generation_never_repeats_nor_goes_back_across_reboots() -> None:
    """Volatile writes, reboots through what flash keeps and in place (``reset_volatile``): every
    generation a host could have seen before a reboot stays below every one after it (serial
    order within 2^15), and a reboot's generation is the saved ceiling. (A boot with no change
    keeps its generation across the next reboot: the same state, the same number.)"""
    saves: list[ConfigSnapshot] = []
    core = _pump_core()
    seen: list[int] = []
    for boot in range(6):
        shown: list[int] = [core.generation]
        for i in range(boot * 13 % 70 + 1):
            core.write(0x0204, [i % 3 + 1], float(i), persist=saves.append)
            shown.append(core.generation)
        for old in seen:
            assert all(0 < (g - old) % 0x10000 < 0x8000 for g in shown), (old, shown)
        seen.extend(shown)
        if boot % 2:
            core.reset_volatile(100.0)
        else:
            core = _pump_core(config=saves[-1] if saves else None)
        assert core.generation == (saves[-1].generation if saves else 0)
        assert core.value("test_speed") == 0
    before = core.generation
    core.reset_volatile(200.0)
    assert core.generation == before
