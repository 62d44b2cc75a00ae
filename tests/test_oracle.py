"""The soak oracle's own parts: its model of a map file agrees with the register core on every
request (so a disagreement in a soak is the device's, not the model's), the effects file the
simulator writes reads back, and ``reconcile()`` judges a read-back by register kind."""

from __future__ import annotations

import random
import struct
from pathlib import Path

from idemlink.campaign import ENVIRONMENT_RULES, map_text
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Command, CommandKind, Device
from idemlink.oracle import (
    TRIGGER_RULES,
    Boot,
    Claim,
    Oracle,
    Run,
    effects_line,
    parse_effects_line,
)
from idemlink.protocol.device_core import TRIGGER_TABLE, DeviceCore, TriggerAction, TriggerEvent
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import TriggerState
from idemlink.protocol.regmap_file import builtin_map


def test_the_oracles_trigger_rules_are_the_register_cores_table() -> None:
    event = {1: TriggerEvent.WRITE_1, 0: TriggerEvent.WRITE_0}
    for (state, value), (nxt, starts, code) in TRIGGER_RULES.items():
        core_next, action, status = TRIGGER_TABLE[(TriggerState(state), event[value])]
        assert (int(core_next), action is TriggerAction.START, int(status)) == (nxt, starts, code)


def _random_pdu(rng: random.Random) -> bytes:
    a = rng.choice([0, 3, 4, 5, 6, 7, 8, 9, rng.randrange(12)])
    v = rng.choice([0, 1, 2, 3, 7, 8, 50, 400, 1001, 0xFFFF, rng.randrange(0x10000)])
    match rng.randrange(6):
        case 0:
            return struct.pack(">BHH", rng.choice([3, 4]), a, rng.choice([1, 2, 9, 10, 0]))
        case 1:
            return struct.pack(">BHH", 6, a, v)
        case 2:
            vals = [rng.choice([0, 1, 2, 50, 400, 1001]) for _ in range(rng.randint(1, 4))]
            return struct.pack(f">BHHB{len(vals)}H", 0x10, a, len(vals), 2 * len(vals), *vals)
        case 3:
            vals = [rng.choice([0, 1, 2, 50, 400]) for _ in range(rng.randint(1, 3))]
            return struct.pack(f">BHHHB{len(vals)}H", 0x41, rng.randrange(4), a, len(vals),
                               2 * len(vals), *vals)
        case _:
            return struct.pack(">BHH", 0x42, rng.choice([8, 8, 8, a]), rng.choice([0, 1, 1, 2]))


def test_the_oracles_model_answers_every_request_as_the_register_core_does() -> None:
    """A differential run: 4000 random requests, reboots, temperature changes, external
    conditions and abnormal trigger states; the model must never disagree with the core."""
    rng = random.Random(7)
    core = DeviceCore(builtin_map("thermal-controller"), trigger_duration=0.5)
    oracle = Oracle(map_text("thermal-controller"), trigger_duration=0.5,
                    conditions=ENVIRONMENT_RULES["thermal-controller"])
    oracle.feed([Boot(1, 0.0)])
    now, epoch = 0.0, 1
    for seq in range(4000):
        now += rng.choice([0.0, 0.01, 0.1, 0.3])
        r = rng.random()
        if r < 0.02:
            epoch += 1
            core.reset_volatile(now)
            oracle.feed([Boot(epoch, now)])
        elif r < 0.05:
            t = rng.randint(0, 1100)
            core.set_input("temperature", t, now)
            oracle.set_input("temperature", t, now)
        elif r < 0.07:
            bit, on = rng.choice(["sensor_fault", "fan_stall"]), rng.random() < 0.5
            core.set_condition(bit, on, now)
            oracle.set_condition(bit, on, now)
        elif r < 0.08:
            raw = rng.choice([0, 2, 7])
            core.tick(now)
            core.force_trigger_state("self_clean", raw)
            oracle.force_trigger("self_clean", raw, now)
        pdu = _random_pdu(rng)
        answer = core.execute(pdu, now)
        oracle.claim(Claim(pdu, ((epoch, seq),), "UNKNOWN"))
        oracle.feed([Run(epoch, seq, pdu, answer, now)])
    assert oracle.tally.passed, oracle.tally.problems[:5]
    assert oracle.tally.executions == 4000


def test_a_wrong_answer_is_a_register_semantics_violation() -> None:
    oracle = Oracle(map_text("thermal-controller"), trigger_duration=1.0)
    oracle.feed([Boot(1, 0.0)])
    start = struct.pack(">BHH", 0x42, 8, 1)
    for seq, (pdu, answer) in enumerate([(start, struct.pack(">BHH", 0x42, 8, 0)),
                                         (start, struct.pack(">BHH", 0x42, 8, 0))]):
        oracle.claim(Claim(pdu, ((1, seq),), "UNKNOWN"))
        oracle.feed([Run(1, seq, pdu, answer, 0.1 * seq)])
    # the second start answered ACCEPTED while RUNNING: the action started twice
    assert oracle.tally.register_semantics == 1


def test_the_simulator_writes_its_record_as_an_effects_file(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    sim = SimulatedDevice(seed=4, effects=path, trigger_duration=0.05)
    dev = Device(SimTransport(sim))
    dev.connect()
    dev.write({"threshold": 420})
    sim.reboot(1.0)
    sim.close()
    records = [parse_effects_line(line) for line in path.read_text().splitlines()]
    assert [type(r).__name__ for r in records] == ["Boot", "Run", "Boot"]
    run = records[1]
    assert isinstance(run, Run) and run.request == struct.pack(">BHH", 6, 4, 420)
    assert [effects_line(r) for r in records] == path.read_text().splitlines()


def test_reconcile_of_a_trigger_in_an_abnormal_state_says_the_intent_does_not_hold() -> None:
    sim = SimulatedDevice(seed=5)
    dev = Device(SimTransport(sim))
    dev.connect()
    sim.core.force_trigger_state("self_clean", 7)
    res = dev.execute(Command(CommandKind.TRIGGER, 8))
    assert res.outcome is Outcome.UNKNOWN  # 0xFF00: an impossible state
    rec = dev.reconcile(res)
    assert rec is not None and rec.intended_state_holds is False  # state 7 is not "started"
    sim.core.force_trigger_state("self_clean", 2)
    rec = dev.reconcile(res)
    assert rec is not None and rec.intended_state_holds is True  # DONE: it ran


def test_reconcile_of_a_trigger_written_by_fc06_judges_the_state_not_the_value() -> None:
    sim = SimulatedDevice(seed=6)
    dev = Device(SimTransport(sim))
    dev.connect()
    sim.core.force_trigger_state("self_clean", 2)  # DONE
    rec = dev.reconcile(dev.execute(Command(CommandKind.WRITE, 8, 1, (1,))))
    assert rec is not None and rec.intended_state_holds is True


def test_a_reconcile_is_judged_on_the_state_its_read_back_saw() -> None:
    """The trigger may finish, or a reboot reset it, after the read-back: the verdict and the
    values reconcile() reports are those of the moment its read ran."""
    oracle = Oracle(map_text("thermal-controller"), trigger_duration=1.0)
    oracle.feed([Boot(1, 0.0)])
    start, read = struct.pack(">BHH", 0x42, 8, 1), struct.pack(">BHH", 3, 8, 1)
    reset = struct.pack(">BHH", 6, 8, 0)
    oracle.claim(Claim(start, ((1, 0),), "UNKNOWN"))
    oracle.feed([Run(1, 0, start, struct.pack(">BHH", 0x42, 8, 0), 0.0)])
    oracle.claim(Claim(read, ((1, 1),), "OK", (1, 1), (1,), readback=True))
    oracle.feed([Run(1, 1, read, b"\x03\x02\x00\x01", 0.5), Boot(2, 0.6)])  # then a reboot
    oracle.check_reconcile(start, True, {"self_clean": 1})  # RUNNING when read; IDLE by now
    oracle.claim(Claim(read, ((2, 1),), "OK", (2, 1), (0,), readback=True))
    oracle.feed([Run(2, 1, read, b"\x03\x02\x00\x00", 0.7)])
    oracle.check_reconcile(reset, True, {"self_clean": 0})
    assert oracle.tally.passed, oracle.tally.problems
    oracle.claim(Claim(read, ((2, 2),), "OK", (2, 2), (0,), readback=True))
    oracle.feed([Run(2, 2, read, b"\x03\x02\x00\x00", 0.8)])
    oracle.check_reconcile(start, True, {"self_clean": 0})  # IDLE does not hold a start
    assert oracle.tally.misclassified == 1


def test_each_read_back_value_is_judged_when_its_own_read_ran() -> None:
    """reconcile() reads the registers and the generation apart; a write landing between the two
    reads moves the generation: each value is the one its own read saw."""
    oracle = Oracle(map_text("thermal-controller"), trigger_duration=1.0)
    oracle.feed([Boot(1, 0.0)])
    write = struct.pack(">BHH", 6, 4, 500)
    span, gen = struct.pack(">BHH", 3, 4, 1), struct.pack(">BHH", 3, 3, 1)
    oracle.claim(Claim(span, ((1, 1),), "OK", (1, 1), (350,), readback=True))
    oracle.claim(Claim(write, ((1, 2),), "UNKNOWN"))
    oracle.claim(Claim(gen, ((1, 3),), "OK", (1, 3), (1,), readback=True))
    oracle.feed([Run(1, 1, span, b"\x03\x02\x01\x5e", 0.1), Run(1, 2, write, write, 0.2),
                 Run(1, 3, gen, b"\x03\x02\x00\x01", 0.3)])
    oracle.check_reconcile(write, False, {"threshold": 350, "generation": 1})
    assert oracle.tally.passed, oracle.tally.problems
