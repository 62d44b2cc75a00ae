"""The soak oracle's own parts: its model of a map file agrees with the register core on every
request (so a disagreement in a soak is the device's, not the model's), the effects file the
simulator writes reads back, and ``reconcile()`` judges a read-back by register kind."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from idemlink.campaign import ENVIRONMENT_RULES, map_text
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.command import Command, CommandKind
from idemlink.host.device import Device
from idemlink.oracle import (
    TRIGGER_RULES,
    Boot,
    Claim,
    Condition,
    Delivered,
    Oracle,
    OracleError,
    Record,
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


COMMAND_MAP = map_text("thermal-controller") + """
[[registers]]
address = 9
name = "purge"
kind = "command"
max = 3
"""


def _command_run(restart_mutant: bool) -> Oracle:
    """4000 random requests (a command register at 9 among them: values 0..3 start, above
    are 03, FC16 spans reach it), reboots and time for commands to finish, through the core and
    the oracle; ``restart_mutant``: a device that restarts a running command on a new write."""
    from idemlink.protocol.regmap_file import parse_regmap

    rng = random.Random(11)
    core = DeviceCore(parse_regmap(COMMAND_MAP), trigger_duration=0.5)
    oracle = Oracle(COMMAND_MAP, trigger_duration=0.5)  # no environment: the bare core
    oracle.feed([Boot(1, 0.0)])
    now, epoch = 0.0, 1
    for seq in range(4000):
        now += rng.choice([0.0, 0.01, 0.1, 0.3])
        if rng.random() < 0.02:
            epoch += 1
            core.reset_volatile(now)
            oracle.feed([Boot(epoch, now)])
        pdu = (struct.pack(">BHH", 3, 9, 1) if seq % 4 == 0  # the command register, often
               else struct.pack(">BHH", 6, 9, rng.choice([0, 1, 2, 3, 4])) if seq % 4 == 1
               else _random_pdu(rng))
        if restart_mutant and pdu[:3] == bytes([6, 0, 9]) and pdu[3:5] != b"\x00\x00":
            core.tick(now)
            core.finish_command("purge", now)  # the mutant: a new write restarts it
        answer = core.execute(pdu, now)
        oracle.claim(Claim(pdu, ((epoch, seq),), "UNKNOWN"))
        oracle.feed([Run(epoch, seq, pdu, answer, now)])
    assert oracle.tally.executions == 4000
    return oracle


def test_the_oracles_command_register_answers_as_the_register_core_does() -> None:
    """The oracle's own model of ``kind = "command"`` (written from the map file's text): a
    non-zero value starts a command only while it reads 0, it reads the command while it runs
    and 0 after the duration or a reboot, a value above ``max`` is 03 — never disagreeing with
    the core over a differential run; and a device that restarts a running command is caught."""
    oracle = _command_run(restart_mutant=False)
    assert oracle.tally.passed, oracle.tally.problems[:5]
    mutant = _command_run(restart_mutant=True)
    assert not mutant.tally.passed
    assert mutant.tally.register_semantics > 0, mutant.tally.problems[:3]


def test_reconcile_of_a_command_write_holds_while_it_runs_and_cannot_say_after() -> None:
    oracle = Oracle(COMMAND_MAP, trigger_duration=0.5)
    oracle.feed([Boot(1, 0.0)])
    start = struct.pack(">BHH", 6, 9, 2)
    oracle.feed([Run(1, 0, start, start, 0.1)])
    assert oracle.model.intent_holds(start) is True  # it reads 2: it runs
    oracle.model.finish_due(0.7, 0.0)
    assert oracle.model.intent_holds(start) is None  # 0: it ran and ended, or never started


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


# ---- the oracle's own reading of the wire, and the evidence it demands ---------------------------

ORACLE_MODULES = ("oracle.py", "oracle_wire.py")


ALLOWED_IMPORTS: dict[str, set[str] | None] = {
    "idemlink.oracle_wire": None,  # its own reading of the wire
    "idemlink.protocol.long_integers": {"load_json", "load_toml"},  # file parsing, no decoder
    "idemlink.protocol.outcome": {"IdemlinkError"},  # the errors' base class, no table
}
"""What of idemlink the oracle may import (None: anything): nothing that decodes or classifies."""


def test_the_oracle_imports_nothing_of_the_code_under_test() -> None:
    """The oracle and its wire reading import the standard library, each other, and only the
    names above of idemlink's protocol: no decoder, table or classifier of the code it checks."""
    import ast
    import sys

    root = Path(__file__).resolve().parent.parent / "idemlink"
    for name in ORACLE_MODULES:
        for node in ast.walk(ast.parse((root / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                pairs = [(node.module or "", a.name) for a in node.names]
            else:
                continue
            for mod, what in pairs:
                if mod.split(".")[0] in sys.stdlib_module_names and mod.split(".")[0] != "idemlink":
                    continue
                assert mod in ALLOWED_IMPORTS, (name, mod)
                allowed = ALLOWED_IMPORTS[mod]
                assert allowed is None or what in allowed, (name, mod, what)


def test_the_oracles_status_table_is_the_protocols() -> None:
    from idemlink.oracle_wire import WIRE_STATUS
    from idemlink.protocol.outcome import FIRST_LOCAL_STATUS, STATUS_TABLE

    wire = {int(s): (s.name, i.outcome.name) for s, i in STATUS_TABLE.items()
            if s < FIRST_LOCAL_STATUS}
    assert wire == WIRE_STATUS


def test_the_oracles_answer_reading_agrees_with_the_hosts_classifier() -> None:
    """Every answer the register core gives to 4000 random requests means the same outcome to
    the oracle's reading as to ``classify_answer``."""
    from idemlink.oracle_wire import pdu_outcome
    from idemlink.protocol.modbus import classify_answer

    rng = random.Random(11)
    core = DeviceCore(builtin_map("thermal-controller"), trigger_duration=0.5)
    for i in range(4000):
        if rng.random() < 0.02:
            core.force_trigger_state("self_clean", rng.choice([0, 1, 2, 7]))
        pdu = _random_pdu(rng)
        answer = core.execute(pdu, i * 0.1)
        assert pdu_outcome(pdu, answer) == classify_answer(pdu, answer)[0].name, (pdu, answer)
    for code in (0x0000, 0x0101, 0x0102, 0xFF00, 0xFF01, 0x0103, 0x1234):  # undefined codes too
        pdu, answer = struct.pack(">BHH", 0x42, 8, 1), struct.pack(">BHH", 0x42, 8, code)
        assert pdu_outcome(pdu, answer) == classify_answer(pdu, answer)[0].name


def test_the_oracles_frame_reader_accepts_what_the_protocols_decoder_accepts() -> None:
    """Random frames, some with a flipped bit, a cut or an unknown flag: the oracle's decoder
    and ``parse_raw`` agree on every one, the address byte of an addressed frame included (the
    oracle judges devices on a bus). A tagged frame, which ``parse_raw`` decodes and this
    revision's sessions ignore, is one the oracle does not accept either."""
    from idemlink.oracle_wire import crc32c, read_frame
    from idemlink.protocol import cobs
    from idemlink.protocol.frame import Frame, build_raw, parse_raw

    assert crc32c(b"123456789") == 0xE3069283
    rng = random.Random(5)
    accepted = extended = addressed = 0
    for _ in range(3000):
        flags = rng.choice([0, 0, 1, 2, 3, 0x10, 0x04, 0x80, 0x84])
        raw = bytearray(build_raw(rng.choice([1, 2, 3, 4, 9]), rng.getrandbits(32),
                                  rng.getrandbits(32), rng.randbytes(rng.randrange(40)),
                                  flags, address=rng.randrange(256) if flags & 0x04 else None,
                                  auth_tag=rng.randbytes(8) if flags & 0x80 else None))
        fault = rng.randrange(4)
        if fault == 1:
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif fault == 2:
            raw = raw[:rng.randrange(len(raw))]
        theirs = parse_raw(bytes(raw))
        ours = read_frame(cobs.encode(bytes(raw)))
        extended += isinstance(theirs, Frame) and theirs.tag is not None
        if isinstance(theirs, Frame) and theirs.tag is None:
            accepted += 1
            addressed += theirs.address is not None
            assert ours is not None and (ours.type, ours.flags, ours.epoch, ours.seq,
                                         ours.payload, ours.address) == (
                theirs.type, theirs.flags, theirs.epoch, theirs.seq, theirs.payload,
                theirs.address)
        else:
            assert ours is None, theirs
    assert accepted > 600 and extended > 150 and addressed > 100


def _to_device(epoch: int, seq: int, pdu: bytes, t: float) -> Delivered:
    from idemlink.protocol.frame import FrameType, encode_frame

    return Delivered("device", t, encode_frame(FrameType.REQUEST, seq, epoch, pdu).strip(b"\0"))


def _to_host(epoch: int, seq: int, payload: bytes, t: float, replay: bool = False) -> Delivered:
    from idemlink.protocol.frame import Flags, FrameType, encode_frame

    flags = Flags.REPLAY if replay else Flags.NONE
    return Delivered("host", t, encode_frame(FrameType.RESPONSE, seq, epoch, payload,
                                             flags).strip(b"\0"))


WRITE = struct.pack(">BHH", 6, 4, 420)  # threshold = 420: the answer echoes it


def _evidence_oracle() -> Oracle:
    oracle = Oracle(map_text("thermal-controller"), trigger_duration=1.0, delivery_record=True)
    oracle.feed([Boot(1, 0.0)])
    return oracle


def _judge(oracle: Oracle, claim: Claim, records: list[Record]) -> list[str]:
    entry = oracle.claim(claim)
    oracle.feed(records)
    oracle.judge(entry)
    return oracle.tally.problems


def test_an_ok_needs_an_answer_the_line_delivered_before_the_result() -> None:
    ran = [_to_device(1, 5, WRITE, 0.1), Run(1, 5, WRITE, WRITE, 0.1)]
    ok = Claim(WRITE, ((1, 5),), "OK", (1, 5), at=0.3)
    # the answer reached the host: evidence
    assert _judge(_evidence_oracle(), ok, [*ran, _to_host(1, 5, b"\0" + WRITE, 0.2)]) == []
    # it ran, but every answer was lost: the old oracle took it (one execution, no values)
    problems = _judge(_evidence_oracle(), ok, ran)
    assert problems == ["OK without an answer on the line that says so: 06000401a4 as "
                        "00000001:5, the host was answered nothing"]
    # the only answer came after the result was settled
    assert _judge(_evidence_oracle(), ok, [*ran, _to_host(1, 5, b"\0" + WRITE, 0.4)])
    # the device said ANSWER_EVICTED (it ran, its answer is gone): that is no OK
    assert _judge(_evidence_oracle(), ok, [*ran, _to_host(1, 5, b"\x21", 0.2)])
    # an answer of another boot under the same number proves nothing for this one
    assert _judge(_evidence_oracle(), ok, [*ran, _to_host(7, 5, b"\0" + WRITE, 0.2)])
    # the host said "replayed", the line delivered a first answer
    replayed = Claim(WRITE, ((1, 5),), "OK", (1, 5), replay=True, at=0.3)
    assert _judge(_evidence_oracle(), replayed, [*ran, _to_host(1, 5, b"\0" + WRITE, 0.2)])
    assert _judge(_evidence_oracle(), replayed, [*ran, _to_host(1, 5, b"\0" + WRITE, 0.2,
                                                                replay=True)]) == []


def test_a_not_executed_whose_request_went_out_needs_an_answer_that_says_so() -> None:
    guarded = struct.pack(">BHHHBH", 0x41, 9, 4, 1, 2, 420)  # generation 9: the guard fails
    failed = struct.pack(">BBH", 0x41, 0x12, 0)
    claim = Claim(guarded, ((1, 6),), "NOT_EXECUTED", (1, 6), at=0.3)
    ran = [_to_device(1, 6, guarded, 0.1), Run(1, 6, guarded, failed, 0.1)]
    assert _judge(_evidence_oracle(), claim, [*ran, _to_host(1, 6, b"\0" + failed, 0.2)]) == []
    # every request lost, nothing ran: still no evidence (a late copy may yet run it)
    oracle = _evidence_oracle()
    assert _judge(oracle, Claim(WRITE, ((1, 7),), "NOT_EXECUTED", (1, 7), at=0.3), [])
    assert oracle.tally.never_delivered == 1
    # never sent: nothing could answer, nothing is needed
    assert _judge(_evidence_oracle(), Claim(WRITE, (), "NOT_EXECUTED"), []) == []


def test_an_unknown_needs_nothing_and_the_situations_are_counted() -> None:
    oracle = _evidence_oracle()
    claim = Claim(WRITE, ((1, 5),), "UNKNOWN", (1, 5), at=0.3)
    ran = [_to_device(1, 5, WRITE, 0.1), Run(1, 5, WRITE, WRITE, 0.1)]
    assert _judge(oracle, claim, ran) == []
    assert (oracle.tally.ran_unanswered, oracle.tally.never_delivered) == (1, 0)
    # a late copy of the request, answered ANSWER_EVICTED after the result: counted as late
    oracle.feed([_to_device(1, 5, WRITE, 5.0), _to_host(1, 5, b"\x21", 5.1)])
    assert oracle.tally.late_answers == {"ANSWER_EVICTED": 1}
    assert oracle.tally.answers == {"ANSWER_EVICTED": 1} and oracle.tally.passed


def test_an_execution_the_line_never_delivered_is_a_duplicated_effect() -> None:
    oracle = _evidence_oracle()
    oracle.claim(Claim(WRITE, ((1, 5),), "UNKNOWN", (1, 5)))
    oracle.feed([_to_device(1, 5, struct.pack(">BHH", 6, 4, 421), 0.1),
                 Run(1, 5, WRITE, WRITE, 0.1)])
    assert oracle.tally.duplicated_effects == 1
    assert "which the line never delivered" in oracle.tally.problems[0]


def test_a_device_status_a_result_cites_needs_an_answer_that_carries_it() -> None:
    """An UNKNOWN claims no outcome, but one that says the device answered ANSWER_EVICTED must
    have been answered so; a GUARD_FAILED is carried inside the conditional write's answer."""
    ran = [_to_device(1, 5, WRITE, 0.1), Run(1, 5, WRITE, WRITE, 0.1)]
    evicted = Claim(WRITE, ((1, 5),), "UNKNOWN", (1, 5), at=0.3, status=0x21)
    assert _judge(_evidence_oracle(), evicted, [*ran, _to_host(1, 5, b"\x21", 0.2)]) == []
    problems = _judge(_evidence_oracle(), evicted, ran)
    assert problems[0].startswith("UNKNOWN (ANSWER_EVICTED) without an answer on the line")
    guarded = struct.pack(">BHHHBH", 0x41, 9, 4, 1, 2, 420)
    failed = struct.pack(">BBH", 0x41, 0x12, 0)
    claim = Claim(guarded, ((1, 6),), "NOT_EXECUTED", (1, 6), at=0.3, status=0x12)
    assert _judge(_evidence_oracle(), claim, [_to_device(1, 6, guarded, 0.1),
                                              Run(1, 6, guarded, failed, 0.1),
                                              _to_host(1, 6, b"\0" + failed, 0.2)]) == []


def test_a_resend_is_judged_on_every_answer_under_its_number_before_its_result() -> None:
    """reconcile() re-sends a request under its own number: its result needs an answer under
    that number delivered before it — one still waiting unread in the host's input counts, even
    one delivered before the request's own UNKNOWN result (the host gave up just before
    reading it)."""
    oracle = _evidence_oracle()
    first = Claim(WRITE, ((1, 5),), "UNKNOWN", (1, 5), at=0.3)
    _judge(oracle, first, [_to_device(1, 5, WRITE, 0.1), Run(1, 5, WRITE, WRITE, 0.1),
                           _to_host(1, 5, b"\0" + WRITE, 0.29)])  # unread when it gave up
    oracle.judge_resend(Claim(WRITE, ((1, 5),), "OK", (1, 5), at=0.5, status=0))
    assert oracle.tally.passed, oracle.tally.problems
    oracle.feed([_to_device(1, 5, WRITE, 1.0), _to_host(1, 5, b"\x21", 1.1)])
    oracle.judge_resend(Claim(WRITE, ((1, 5),), "OK", (1, 5), at=1.2, status=0))  # evicted: no OK
    assert oracle.tally.misclassified == 1
    oracle.feed([_to_host(1, 5, b"\0" + WRITE, 1.5, replay=True),  # a late copy's replay
                 _to_device(1, 5, WRITE, 2.0), _to_host(1, 5, b"\x21", 2.1)])
    oracle.judge_resend(Claim(WRITE, ((1, 5),), "OK", (1, 5), replay=True, at=2.2, status=0))
    assert oracle.tally.misclassified == 1, oracle.tally.problems  # the replay it read first
    oracle.feed([_to_device(1, 5, WRITE, 3.0), _to_host(1, 5, b"\x21", 3.1)])
    oracle.judge_resend(Claim(WRITE, ((1, 5),), "OK", (1, 5), at=3.2, status=0x21))
    assert oracle.tally.misclassified == 2  # no answer both means OK and says ANSWER_EVICTED
    assert oracle.tally.problems[1].startswith("OK (ANSWER_EVICTED) without an answer")


def _generation_run(oracle: Oracle, epoch: int, seq: int, pdu: bytes, answer: bytes) -> None:
    oracle.claim(Claim(pdu, ((epoch, seq),), "UNKNOWN"))
    oracle.feed([Run(epoch, seq, pdu, answer, 0.01 * seq)])


@pytest.mark.parametrize(("after_reboot", "violations"), [
    (1 + 64, 0),  # the saved ceiling: a jump is fine
    (2, 0),  # the next one: fine too
    (1, 1),  # repeats the generation shown after the write: caught
    (0, 1),  # goes back: caught
])
def test_a_generation_that_repeats_or_goes_back_after_a_reboot_is_a_violation(
        after_reboot: int, violations: int) -> None:
    """A device that saved the generation only on persistent writes (or not at all) and booted
    at what it saved would show a generation again for another state: the mutant the save
    policy prevents. The oracle learns the generation after a boot from the first answer that
    shows it and judges it against the last one shown since a change."""
    oracle = Oracle(map_text("thermal-controller"), trigger_duration=1.0)
    oracle.feed([Boot(1, 0.0)])
    read_gen = struct.pack(">BHH", 0x03, 3, 1)
    _generation_run(oracle, 1, 1, struct.pack(">BHH", 0x06, 4, 400), struct.pack(">BHH", 6, 4, 400))
    _generation_run(oracle, 1, 2, read_gen, struct.pack(">BBH", 3, 2, 1))
    oracle.feed([Boot(2, 1.0)])
    _generation_run(oracle, 2, 3, read_gen, struct.pack(">BBH", 3, 2, after_reboot))
    assert oracle.tally.register_semantics == violations, oracle.tally.problems
    # then known again: the next write moves it by one from what the device showed
    _generation_run(oracle, 2, 4, struct.pack(">BHH", 0x06, 4, 410), struct.pack(">BHH", 6, 4, 410))
    _generation_run(oracle, 2, 5, read_gen, struct.pack(">BBH", 3, 2, (after_reboot + 1) & 0xFFFF))
    assert oracle.tally.register_semantics == violations, oracle.tally.problems


def test_a_boot_without_a_change_may_show_its_generation_again() -> None:
    oracle = Oracle(map_text("thermal-controller"), trigger_duration=1.0)
    oracle.feed([Boot(1, 0.0)])
    read_gen = struct.pack(">BHH", 0x03, 3, 1)
    _generation_run(oracle, 1, 1, read_gen, struct.pack(">BBH", 3, 2, 65))
    oracle.feed([Boot(2, 1.0)])
    _generation_run(oracle, 2, 2, read_gen, struct.pack(">BBH", 3, 2, 65))
    assert oracle.tally.passed, oracle.tally.problems


def test_the_environments_condition_record_latches_and_a_clear_waits_for_it_to_go() -> None:
    """The pump controller's motor_faults (0x0300) bit 1 from the environment's record: read
    latched, a clear while it holds leaves it, a clear after it went clears it; a device that
    shows it clear while it holds is register semantics; an undeclared bit is refused."""
    def read(seq: int, value: int) -> Run:
        return Run(1, seq, bytes.fromhex("0303000001"), bytes([3, 2, 0, value]), 0.1 * seq)

    clear = bytes.fromhex("0603000002")
    oracle = Oracle(map_text("pump-controller"), trigger_duration=0.05)
    oracle.feed([Boot(1, 0.0), Condition(0x0300, 2, 0.05), read(1, 2), Run(1, 2, clear, clear, 0.2),
                 read(3, 2), Condition(0x0300, 0, 0.35), read(4, 2), Run(1, 5, clear, clear, 0.5),
                 read(6, 0)])
    assert oracle.tally.register_semantics == 0 and oracle.tally.conditions == 2
    assert (oracle.model.latches, oracle.model.clears, oracle.model.clears_held) == (1, 1, 1)
    oracle.feed([Condition(0x0300, 2, 0.65), read(7, 0)])  # a device that ignores it
    assert oracle.tally.register_semantics == 1, oracle.tally.problems
    with pytest.raises(OracleError):
        oracle.feed([Condition(0x0300, 0x8000, 0.8)])
