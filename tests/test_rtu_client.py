"""The Modbus RTU client (``--modbus-rtu``): the sans-I/O ``RtuMaster`` rules on a simulated
clock, ``RtuDevice`` over an in-process slave whose answers a test can lose, and the command line
against ``idemlink sim --modbus-rtu`` and a pymodbus RTU server over real ptys (plain, and behind
the link proxy losing answers). Ground truth: the simulator's effect log, the pymodbus server's
write log, the requests counted at the link."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.pymodbus_serial import BackgroundSerialServer
from support.rtu import (
    FAULTS,
    GEN,
    MODE,
    TH,
    TRIG,
    LossyWire,
    rtu_on_pty,
    start_sim,
    stop_sim,
    writes_to,
)
from support.timing import scaled

from idemlink.cli import main
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.link_proxy import LinkProxy
from idemlink.host.command import Command, CommandKind
from idemlink.host.errors import LinkLost, NoDevice, UnknownOutstanding
from idemlink.host.rtu_device import RtuDevice
from idemlink.protocol.device_core import DeviceCore, EffectKind
from idemlink.protocol.modbus import (
    FunctionCode,
    ReadRegisters,
    TriggerRequest,
    WriteIfGeneration,
    WriteMultipleRegisters,
    WriteSingleRegister,
    encode_request,
    exception_pdu,
)
from idemlink.protocol.modbus_rtu import decode_rtu, encode_rtu
from idemlink.protocol.outcome import LocalProtocolError, ModbusException, Outcome, Status
from idemlink.protocol.registers import TriggerStatus
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.protocol.rtu_master import RtuMaster, retry_allowed


def pdu(req: Any) -> bytes:
    return encode_request(req)


# ---------------------------------------------------------------------- the rules (sans-I/O)


def test_the_map_decides_what_may_be_retried() -> None:
    m = DEFAULT_MAP
    assert retry_allowed(pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, 0, 9)), m)
    assert retry_allowed(pdu(ReadRegisters(FunctionCode.READ_INPUT_REGISTERS, 0, 3)), m)
    assert retry_allowed(pdu(WriteSingleRegister(TH, 1)), m)
    assert retry_allowed(pdu(WriteMultipleRegisters(TH, (1, 1, 1))), m)
    for once in (WriteSingleRegister(FAULTS, 1), WriteSingleRegister(TRIG, 1),
                 WriteSingleRegister(GEN, 1), WriteSingleRegister(0x200, 1),
                 WriteMultipleRegisters(MODE, (1, 1, 1)),  # runs into the fault word
                 WriteIfGeneration(0, TH, (1,)), TriggerRequest(TRIG, 1)):
        assert not retry_allowed(pdu(once), m), once


class Line:
    """A simulated clock and what the master put on the line."""

    def __init__(self, **kw: Any) -> None:
        self.t = 0.0
        self.m = RtuMaster(DEFAULT_MAP, **kw)
        self.frames: list[bytes] = []

    def step(self, dt: float) -> None:
        self.t += dt
        self.m.tick(self.t)
        self.collect()

    def collect(self) -> None:
        out = self.m.data_to_send()
        if out:
            self.frames.append(out)

    def run_silent(self, seconds: float) -> list[Any]:
        for _ in range(int(seconds / 0.01)):
            self.step(0.01)
        return list(iter(self.m.next_event, None))

    def answer(self, pdu_: bytes, unit: int = 1) -> None:
        self.t += 0.001
        self.m.receive_data(encode_rtu(unit, pdu_), self.t)
        self.collect()

    def submit(self, pdu_: bytes, tag: Any) -> None:
        """Queue a request and run the shell's round: it leaves on the tick (no stale input)."""
        self.m.submit(pdu_, self.t, tag=tag)
        self.m.tick(self.t)
        self.collect()


def test_unanswered_read_and_holding_write_are_retried_trigger_and_clear_sent_once() -> None:
    line = Line(timeout=0.1, attempts=3)
    for tag, req in (("read", ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TH, 1)),
                     ("write", WriteSingleRegister(TH, 400)),
                     ("trigger", WriteSingleRegister(TRIG, 1)),
                     ("clear", WriteSingleRegister(FAULTS, 1))):
        line.frames.clear()
        line.submit(pdu(req), tag)
        (done,) = line.run_silent(1.0)
        sends = 3 if tag in ("read", "write") else 1
        assert (done.tag, done.outcome, done.status, done.attempts) == (
            tag, Outcome.UNKNOWN, Status.NO_ANSWER, sends)
        assert line.frames == [encode_rtu(1, pdu(req))] * sends


def test_exceptions_map_to_outcomes_and_are_never_retried() -> None:
    expected = {ModbusException.ILLEGAL_FUNCTION: Outcome.REJECTED,
                ModbusException.ILLEGAL_DATA_ADDRESS: Outcome.REJECTED,
                ModbusException.ILLEGAL_DATA_VALUE: Outcome.REJECTED,
                ModbusException.SERVER_DEVICE_FAILURE: Outcome.UNKNOWN}
    for exc, outcome in expected.items():
        line = Line(timeout=0.1, attempts=5)
        line.submit(pdu(WriteSingleRegister(TH, 1)), exc)
        line.answer(exception_pdu(FunctionCode.WRITE_SINGLE_REGISTER, exc))
        (done,) = list(iter(line.m.next_event, None))
        assert (done.outcome, done.exception, done.attempts) == (outcome, exc, 1)
        assert line.run_silent(0.5) == [] and len(line.frames) == 1


def test_exception_codes_beyond_04_keep_their_code_and_name_on_rtu_too() -> None:
    """Issue 21 (review): every code outside 01-04 was shown as SERVER_DEVICE_FAILURE. Each
    keeps its code and name now, with its outcome from the Modbus spec, on RTU as on TCP (an RTU
    gateway can sit in front of a line): 06 busy and 0x0A no path did nothing (NOT_EXECUTED,
    sent once); 0x0B is no answer (a retried write is sent again, then UNKNOWN); 05 accepted
    and still processing, and codes the spec does not define, are UNKNOWN by their number."""
    cases = [(0x06, Outcome.NOT_EXECUTED, None, 1, "0x06 SERVER_DEVICE_BUSY"),
             (0x0A, Outcome.NOT_EXECUTED, None, 1, "0x0A GATEWAY_PATH_UNAVAILABLE"),
             (0x0B, Outcome.UNKNOWN, Status.NO_ANSWER, 3, "0x0B GATEWAY_TARGET_FAILED_TO_RESPOND"),
             (0x05, Outcome.UNKNOWN, None, 1, "0x05 ACKNOWLEDGE"),
             (0x42, Outcome.UNKNOWN, None, 1, "0x42 (a code the Modbus spec does not define)")]
    for code, outcome, status, sends, said in cases:
        line = Line(timeout=0.1, attempts=3)
        line.submit(pdu(WriteSingleRegister(TH, 1)), code)
        for _ in range(sends):
            for byte in encode_rtu(1, bytes([0x86, code])):  # byte by byte
                line.m.receive_data(bytes([byte]), line.t)
            line.step(0.001)
        (done,) = list(iter(line.m.next_event, None))
        assert (done.outcome, done.status, done.exception, done.exception_code, done.attempts) == (
            outcome, status, None, code, sends), code
        assert said in done.detail and done.detail.endswith(("exception " + said, )) is False
        assert done.detail.startswith(("Modbus exception " + said, "gateway exception " + said))
        assert "SERVER_DEVICE_FAILURE" not in done.detail
        assert line.run_silent(0.5) == [] and len(line.frames) == sends
    line = Line(timeout=0.1, attempts=3)  # a trigger start's state read answered busy: nothing written
    line.submit(pdu(TriggerRequest(TRIG, 1)), "t")
    line.answer(bytes([0x83, 0x06]))
    (done,) = list(iter(line.m.next_event, None))
    assert done.outcome is Outcome.NOT_EXECUTED and "SERVER_DEVICE_BUSY; nothing written" in done.detail


def test_only_a_fitting_answer_from_the_unit_settles_a_request() -> None:
    line = Line(timeout=0.1, attempts=2, unit=5)
    req = pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TH, 2))
    line.submit(req, "r")
    line.answer(bytes([3, 4, 0, 1, 0, 2]), unit=6)  # another slave
    line.answer(bytes([3, 2, 0, 1]))  # wrong unit and count
    line.answer(bytes([3, 2, 0, 1]), unit=5)  # right unit, wrong count
    line.answer(bytes([6, 0, TH, 0, 1]), unit=5)  # another function
    assert list(iter(line.m.next_event, None)) == [] and line.m.ignored == 4
    line.answer(bytes([3, 4, 0, 1, 0, 2]), unit=5)
    (done,) = list(iter(line.m.next_event, None))
    assert done.outcome is Outcome.OK and done.pdu == bytes([3, 4, 0, 1, 0, 2])


def test_one_request_at_a_time_with_t35_between() -> None:
    line = Line(timeout=0.1, baudrate=9600)
    gap = line.m.frame_gap
    assert gap == pytest.approx(3.5 * 11 / 9600)
    line.m.submit(pdu(WriteSingleRegister(TH, 1)), line.t, tag=1)
    line.submit(pdu(WriteSingleRegister(MODE, 1)), 2)
    assert len(line.frames) == 1  # the second waits for the first
    line.answer(pdu(WriteSingleRegister(TH, 1))[0:1] + bytes([0, TH, 0, 1]))
    assert [e.tag for e in list(iter(line.m.next_event, None))] == [1] and len(line.frames) == 1
    answered = line.t
    assert line.m.next_deadline() == pytest.approx(answered + gap)
    line.step(gap / 2)
    assert len(line.frames) == 1  # the line must stay silent for t3.5
    line.step(gap)
    assert len(line.frames) == 2 and line.frames[1] == encode_rtu(1, pdu(WriteSingleRegister(MODE, 1)))


def test_broadcast_is_sent_once_never_awaited_and_cannot_read() -> None:
    line = Line(timeout=0.1, attempts=5, unit=0, turnaround=0.05)
    line.submit(pdu(WriteSingleRegister(TH, 1)), "b")
    (done,) = line.run_silent(0.2)
    assert (done.outcome, done.status, done.attempts) == (Outcome.UNKNOWN, Status.NO_ANSWER, 1)
    assert line.frames == [encode_rtu(0, pdu(WriteSingleRegister(TH, 1)))]
    with pytest.raises(LocalProtocolError, match="broadcast"):
        line.m.submit(pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, 0, 1)), line.t)


def test_an_answer_that_does_not_fit_is_answer_mismatch_not_no_answer() -> None:
    """A slave whose own logic changed the register echoes the value it stored: the answer came,
    it does not fit, and the write (a trigger register: sent once) ends UNKNOWN saying so."""
    line = Line(timeout=0.1, attempts=5)
    line.submit(pdu(WriteSingleRegister(TRIG, 1)), "w")
    line.answer(pdu(WriteSingleRegister(TRIG, 4)))  # the echo of another value
    assert list(iter(line.m.next_event, None)) == [] and line.m.ignored == 1
    (done,) = line.run_silent(0.5)
    assert (done.outcome, done.status, done.attempts) == (
        Outcome.UNKNOWN, Status.ANSWER_MISMATCH, 1)
    assert done.detail == "wrote 0x0001, echo 0x0004" and len(line.frames) == 1


def test_input_before_a_request_is_read_and_dropped_before_it_leaves() -> None:
    """Bytes that came while nothing was out (a late answer) answer nothing: the request leaves
    only after a round with no input (the shell reads, feeds, ticks)."""
    line = Line(timeout=0.1)
    line.m.submit(pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TH, 1)), line.t, tag=1)
    assert line.m.next_deadline() == line.t  # read now: what is buffered goes first
    line.m.receive_data(encode_rtu(1, bytes([3, 2, 1, 0xA4])), line.t)  # late, same shape
    line.step(0.0)
    assert line.frames == [] and line.m.ignored == 1
    line.step(0.0)  # a round with nothing in it: now it leaves
    assert line.frames == [encode_rtu(1, pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS,
                                                            TH, 1)))]


def test_a_late_answer_after_no_answer_lands_in_the_guard_window_not_in_the_next_request() -> None:
    """Issue 21 (review, ``api_rtu_late.py``): read A of one register gets no answer within its
    wait (one attempt: UNKNOWN); read B of the same shape follows. A's answer comes late —
    after A's wait ran out — and used to be taken as B's (another register's value, OK).
    After no answer the master leaves the line as long again before B: the late answer lands
    with no request out, is dropped and counted (``late``), and B takes its own answer."""
    read_a = pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TH, 1))
    read_b = pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, MODE, 1))
    line = Line(timeout=0.2, attempts=1, baudrate=19200)
    line.submit(read_a, "A")
    sent_a = line.t
    while line.m.next_deadline() is not None and not line.frames[1:] and line.t < 0.3:
        line.step(0.005)
    assert [e.outcome for e in iter(line.m.next_event, None)] == [Outcome.UNKNOWN]
    line.m.submit(read_b, line.t, tag="B")
    while line.t < sent_a + 0.35:  # A's answer is 0.35 s late, after A's 0.21 s wait
        line.step(0.005)
    assert line.frames == [encode_rtu(1, read_a)]  # B waits: the guard window
    for byte in encode_rtu(1, bytes([3, 2, 0x00, 0x28])):  # A's late answer, byte by byte
        line.m.receive_data(bytes([byte]), line.t)
    assert line.m.late == 1
    for _ in range(100):
        line.step(0.005)
        if line.frames[1:]:
            break
    assert line.frames == [encode_rtu(1, read_a), encode_rtu(1, read_b)]
    line.answer(bytes([3, 2, 0x00, 0x03]))  # B's own answer
    (b,) = iter(line.m.next_event, None)
    assert (b.tag, b.outcome, b.pdu) == ("B", Outcome.OK, bytes([3, 2, 0x00, 0x03]))


def test_a_trigger_reads_its_state_then_writes_once_or_answers_like_the_device() -> None:
    """TRIGGER (0x42) to a plain slave: an FC03 of the trigger register (retried: a read), then
    by the device's TRIGGER_TABLE an FC06 of 1 in IDLE (sent once), or nothing and the code the
    device's TRIGGER function gives; a reset is an FC06 of 0."""
    start, reset = pdu(TriggerRequest(TRIG, 1)), pdu(TriggerRequest(TRIG, 0))
    read = pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TRIG, 1))
    for state, code in ((1, TriggerStatus.RUNNING), (2, TriggerStatus.DONE)):
        line = Line(timeout=0.1)
        line.submit(start, "t")
        line.answer(bytes([3, 2, 0, state]))
        (done,) = line.run_silent(0.5)
        assert (done.outcome, done.pdu[3:5], done.attempts) == (Outcome.OK, code.to_bytes(2, "big"), 0)
        assert line.frames == [encode_rtu(1, read)]
    line = Line(timeout=0.1)
    line.submit(start, "t")
    line.answer(bytes([3, 2, 0, 0]))  # IDLE
    line.step(0.01)
    assert line.frames == [encode_rtu(1, read), encode_rtu(1, pdu(WriteSingleRegister(TRIG, 1)))]
    line.answer(pdu(WriteSingleRegister(TRIG, 1)))
    (done,) = list(iter(line.m.next_event, None))
    assert (done.outcome, done.pdu, done.attempts) == (Outcome.OK, bytes([0x42, 0, TRIG, 0, 0]), 1)
    line.submit(reset, "r")
    line.step(0.01)
    assert line.frames[-1] == encode_rtu(1, pdu(WriteSingleRegister(TRIG, 0)))
    for state, detail in ((7, "trigger state 0x0007 is none of IDLE, RUNNING, DONE"),
                          (None, "the trigger's state read got no answer (5 attempt(s))")):
        line = Line(timeout=0.1, attempts=5)
        line.submit(start, "t")
        if state is not None:
            line.answer(bytes([3, 2, 0, state]))
        (done,) = line.run_silent(2.0)
        assert (done.outcome, done.status) == (Outcome.NOT_EXECUTED, None)
        assert done.detail == f"{detail}; nothing written"
        assert all(decode_rtu(f).pdu == read for f in line.frames)


def test_abandon_is_unknown_for_the_request_out_not_executed_for_the_rest() -> None:
    line = Line()
    line.submit(pdu(WriteSingleRegister(TRIG, 1)), "out")
    line.submit(pdu(WriteSingleRegister(TH, 1)), "queued")
    line.m.abandon(Status.LINK_LOST)
    assert [(e.tag, e.outcome, e.status) for e in list(iter(line.m.next_event, None))] == [
        ("out", Outcome.UNKNOWN, Status.LINK_LOST), ("queued", Outcome.NOT_EXECUTED, None)]


# -------------------------------------------------- RtuDevice over an in-process, lossy slave


def lossy(lose: Callable[[bytes, int], bool]) -> tuple[RtuDevice, LossyWire]:
    wire = LossyWire(lose)
    return RtuDevice(wire, timeout=0.1, attempts=5), wire


def test_trigger_without_answer_is_unknown_sent_once_and_ran_once() -> None:
    dev, wire = lossy(writes_to(TRIG))
    r = dev.trigger()
    assert (r.outcome, r.status, r.attempts) == (Outcome.UNKNOWN, Status.NO_ANSWER, 1)
    assert len(trigger_writes(wire)) == 1
    assert wire.core.count(EffectKind.TRIGGER_STARTED) == 1
    with pytest.raises(UnknownOutstanding):
        dev.read("threshold")
    rec = dev.reconcile()
    assert rec is not None and rec.intended_state_holds is True and rec.summary == "trigger state RUNNING"
    dev.acknowledge_unknown()
    assert dev.read("self_clean").values == (1,)


def test_fault_clear_without_answer_is_unknown_and_sent_once() -> None:
    dev, wire = lossy(writes_to(FAULTS))
    r = dev.clear_faults(1)
    assert (r.outcome, r.attempts, len(wire.requests)) == (Outcome.UNKNOWN, 1, 1)


def test_set_only_write_is_retried_until_answered_and_holds() -> None:
    dev, wire = lossy(lambda p, n: p[0] == FunctionCode.WRITE_SINGLE_REGISTER and n <= 2)
    r = dev.write({"threshold": 420})
    assert (r.outcome, r.attempts) == (Outcome.OK, 3)
    assert wire.core.read(TH, 1) == (420,)
    # no de-duplication on Modbus RTU: it ran three times, to the same absolute value
    assert sum(e.kind is EffectKind.SET for e in wire.core.log) == 1


def test_a_run_stops_sending_after_an_unknown_with_effect() -> None:
    dev, wire = lossy(writes_to(TRIG))
    results = dev.run([Command(CommandKind.TRIGGER, TRIG), dev.write_command({"mode": 2})])
    assert [r.outcome for r in results] == [Outcome.UNKNOWN, Outcome.NOT_EXECUTED]
    assert len(trigger_writes(wire)) == 1 and wire.core.read(MODE, 1) != (2,)
    assert decode_rtu(wire.requests[-1]).pdu == pdu(WriteSingleRegister(TRIG, 1))


def test_idemlink_only_functions_are_refused_before_sending() -> None:
    dev, wire = lossy(lambda p, n: False)
    with pytest.raises(LocalProtocolError, match="0x41"):
        dev.write_if_generation(0, {"threshold": 1})
    with pytest.raises(LocalProtocolError, match="0x45"):
        dev.run([Command(CommandKind.READ, TH), Command(CommandKind.FILE_INFO, 0, name="a")])
    with pytest.raises(LocalProtocolError, match="function 0x08 is not one this master carries"):
        dev.ops.session.check(bytes([8, 0, 0, 0, 0]))  # diagnostics (FC05 is a coil write)
    with pytest.raises(LocalProtocolError, match=r"writes 1 \(start\) or 0"):
        dev.execute(Command(CommandKind.TRIGGER, TRIG, values=(5,)))
    with pytest.raises(LocalProtocolError, match="numbers nothing"):
        dev.ops.session.submit(pdu(WriteSingleRegister(TH, 1)), 0.0, number=(1, 1))
    with pytest.raises(LocalProtocolError, match=r"FILE_RECEIVE \(0x44\)"):
        dev.send_files([__file__])
    assert wire.requests == []


def test_trigger_is_state_read_fc06_of_one_and_reset_of_zero() -> None:
    dev, wire = lossy(lambda p, n: False)
    assert dev.trigger().code == TriggerStatus.ACCEPTED
    assert dev.trigger_reset().code == TriggerStatus.ACCEPTED
    assert [decode_rtu(f).pdu for f in wire.requests] == [
        pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TRIG, 1)),
        pdu(WriteSingleRegister(TRIG, 1)), pdu(WriteSingleRegister(TRIG, 0))]
    assert dev.trigger().code == TriggerStatus.ACCEPTED  # IDLE again: started again


def trigger_writes(wire: LossyWire) -> list[bytes]:
    """The FC06 frames of 1 to the trigger register the slave received: a plain slave starts its
    action on each (a PLC's edge, pymodbus's write action), whatever state it is in."""
    return [f for f in wire.requests if decode_rtu(f).pdu == pdu(WriteSingleRegister(TRIG, 1))]


def test_a_second_trigger_while_running_starts_nothing_and_says_so() -> None:
    """``trigger()`` reads the state first: called again while the action runs, it writes
    nothing and answers like the framed device's TRIGGER function: code RUNNING, not a second
    OK that started it again (``code None`` told the two apart by nothing)."""
    dev, wire = lossy(lambda p, n: False)
    first, second = dev.trigger(), dev.trigger()
    assert (first.outcome, first.code) == (Outcome.OK, TriggerStatus.ACCEPTED)
    assert (second.outcome, second.code) == (Outcome.OK, TriggerStatus.RUNNING)
    assert len(trigger_writes(wire)) == 1


# ------------------------------------------------------------------ over real ptys (CLI)


@pytest.fixture
def sim_core() -> Iterator[tuple[str, DeviceCore]]:
    """The RTU simulator in process on a pty: (client path, its core)."""
    core = DeviceCore(DEFAULT_MAP, trigger_duration=0.3)
    with rtu_on_pty(core) as path:
        yield path, core


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_against_the_rtu_simulator(sim_core: tuple[str, DeviceCore],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    port, core = sim_core
    rtu = ("--port", port, "--modbus-rtu")
    rc, out, _ = cli(capsys, "read", "threshold", *rtu, "--json")
    assert rc == 0 and json.loads(out)["values"] == {"threshold": 350}
    assert cli(capsys, "write", "threshold=41", *rtu)[0] == 0
    assert core.read(TH, 1) == (410,)
    rc, out, _ = cli(capsys, "write", "threshold=41", "mode=7", "--no-check", *rtu)
    assert rc == 4 and "ILLEGAL_DATA_VALUE" in out
    rc, out, _ = cli(capsys, "faults", *rtu)
    assert rc == 0 and "none latched" in out
    rc, out, _ = cli(capsys, "clear", *rtu)
    assert rc == 0 and "clear faults mask 0x0007: OK" in out
    rc, out, _ = cli(capsys, "trigger", *rtu)
    assert rc == 0 and out == "self_clean: ACCEPTED (0x0000): started\n"
    rc, out, _ = cli(capsys, "trigger", *rtu)  # the state is read first: nothing written
    assert rc == 0 and out == "self_clean: RUNNING (0x0101): already running: nothing started\n"
    assert core.count(EffectKind.TRIGGER_STARTED) == 1
    rc, _, err = cli(capsys, "write", "threshold=41", "--if-generation", "0", *rtu)
    assert rc == 1 and "0x41" in err
    rc, _, err = cli(capsys, "read", *rtu, "--unit", "9", "--attempts", "1", "--timeout", "0.05")
    assert rc == 1 and "no Modbus RTU slave answered at unit 9" in err
    for bad, why in ((("--unit", "0"), "outside 1..247"), (("--trace", "t.jsonl"), "--trace")):
        rc, _, err = cli(capsys, "read", *rtu, *bad)
        assert rc == 1 and why in err and len(err.splitlines()) == 1
    rc, _, err = cli(capsys, "read", "--port", port, "--unit", "2")
    assert rc == 1 and "needs --modbus-rtu" in err


def test_framed_command_meeting_rtu_says_add_modbus_rtu(
        sim_core: tuple[str, DeviceCore], capsys: pytest.CaptureFixture[str]) -> None:
    port, _ = sim_core
    rc, out, err = cli(capsys, "read", "--port", port, "--attempts", "1", "--timeout", "0.1")
    assert rc == 1 and out == ""
    assert err.strip() == (f"idemlink read: {port}: this port answers Modbus RTU, not idemlink: "
                           "add --modbus-rtu")


@pytest.fixture
def long_trigger() -> Iterator[tuple[str, DeviceCore]]:
    """``sim_core`` with a trigger that runs for a minute: RUNNING for the whole test."""
    core = DeviceCore(DEFAULT_MAP, trigger_duration=60.0)
    with rtu_on_pty(core) as path:
        yield path, core


def test_async_rtu_device_over_a_real_pty(long_trigger: tuple[str, DeviceCore]) -> None:
    """``AsyncRtuDevice.open`` (the event loop's port, the probe), the same operations awaited:
    the second trigger while RUNNING writes nothing and says RUNNING."""
    from idemlink.host.aio import AsyncRtuDevice

    port, core = long_trigger

    async def session() -> list[Any]:
        async with AsyncRtuDevice.open(port, timeout=0.5) as dev:
            assert (await dev.write({"threshold": 410})).ok
            first, second = await dev.trigger(), await dev.trigger()
            reads = [r.values async for r in dev.stream([dev.read_command("threshold")] * 3)]
            return [first.code, second.code, reads]

    assert asyncio.run(session()) == [TriggerStatus.ACCEPTED, TriggerStatus.RUNNING,
                                      [(410,)] * 3]
    assert core.count(EffectKind.TRIGGER_STARTED) == 1

    async def nobody() -> None:
        await AsyncRtuDevice.open(port, unit=9, timeout=0.05, attempts=1)

    with pytest.raises(NoDevice, match="no Modbus RTU slave answered at unit 9"):
        asyncio.run(nobody())


def test_vv_logs_rtu_frames_both_ways(long_trigger: tuple[str, DeviceCore]) -> None:
    """``-vv`` shows the RTU bytes both ways on ``idemlink.frames``, and what became of an
    incoming frame."""
    import subprocess
    import sys

    port, _ = long_trigger
    r = subprocess.run([sys.executable, "-m", "idemlink", "read", "threshold", "--port", port,
                        "--modbus-rtu", "-vv"], capture_output=True, text=True, check=False,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    read = encode_rtu(1, pdu(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TH, 1)))
    assert f"idemlink.frames DEBUG tx RTU unit=1 fc=0x03 attempt=1: {read.hex(' ')}" in r.stderr
    assert "idemlink.frames DEBUG rx RTU bytes 01" in r.stderr  # a pty may cut the answer
    assert "rx RTU unit=1 fc=0x03: the answer" in r.stderr


def test_watch_polls_a_modbus_rtu_slave(sim_core: tuple[str, DeviceCore],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    port, _ = sim_core
    rc, out, _ = cli(capsys, "watch", "threshold", "mode", "--port", port, "--modbus-rtu",
                     "--count", "2", "--interval", "0.05", "--csv")
    assert rc == 0 and "threshold,4,350" in out and "mode,5,1" in out


def test_answers_lost_on_a_real_line(sim_core: tuple[str, DeviceCore]) -> None:
    """Behind the link proxy losing bytes of the answers only: every trigger request reaches the
    simulator exactly once (triggers sent == triggers started == trigger frames at the link),
    an unanswered one is UNKNOWN; set-only writes are retried and the value holds."""
    port, core = sim_core
    answers = LinkConfig(loss=0.08, seed=7)
    requests = bytearray()

    def tap(direction: str, data: bytes, t: float) -> None:
        if direction == "b->a":
            requests.extend(data)

    with LinkProxy(port, None, answers, LinkConfig(), tap=tap).start() as proxy:
        dev = RtuDevice.open(proxy.b_path, timeout=0.05, attempts=20, probe=False)
        with dev:
            outcomes = []
            for value in range(400, 410):
                assert dev.write({"threshold": value}).outcome is Outcome.OK
                assert core.read(TH, 1) == (value,)
            for _ in range(12):
                r = dev.trigger()
                assert r.attempts == 1 and r.outcome in (Outcome.OK, Outcome.UNKNOWN)
                outcomes.append(r.outcome)
                dev.acknowledge_unknown()
                dev.trigger_reset()  # may itself go unanswered: the state says
                dev.acknowledge_unknown()
                while core.read(TRIG, 1) != (0,):
                    dev.trigger_reset()
                    dev.acknowledge_unknown()
    assert Outcome.UNKNOWN in outcomes and Outcome.OK in outcomes
    assert bytes(requests).count(encode_rtu(1, pdu(WriteSingleRegister(TRIG, 1)))) == 12
    assert core.count(EffectKind.TRIGGER_STARTED) == 12


# ------------------------------------------------------------------------ pymodbus's server


class PymodbusSlave:
    """A pymodbus RTU server (unit 1, the default map's nine registers) on ``path``, in a thread;
    ``writes`` logs every write it executed, ``fail`` maps an address to the exception code its
    writes answer, ``stores`` maps an address to the value the slave's own logic stores when it
    is written (what a PLC's action does), ``lost`` is how many answers the server's tracer
    dropped."""

    def __init__(self, path: str, drop: Callable[[bytes], bool] = lambda frame: False) -> None:
        from pymodbus.simulator import DataType, SimData, SimDevice

        self.writes: list[tuple[int, list[int]]] = []
        self.fail: dict[int, Any] = {}
        self.stores: dict[int, int] = {}
        self.values = [s.default for s in DEFAULT_MAP]
        self.drop = drop
        self.lost = 0

        async def action(fc: int, start: int, address: int, count: int, regs: list[int],
                         set_values: list[int] | None) -> Any:
            if set_values is not None:
                if address in self.fail:
                    return self.fail[address]
                self.writes.append((address, list(set_values)))
                self.values[address:address + len(set_values)] = list(set_values)
                if address in self.stores:  # the action stores its own value: it is echoed
                    set_values[0] = self.stores[address]
            return None

        def trace(sending: bool, frame: bytes) -> bytes:
            if sending and self.drop(frame):
                self.lost += 1
                return b""
            return frame

        device = SimDevice(1, simdata=[SimData(0, values=list(self.values),
                                               datatype=DataType.REGISTERS)], action=action)
        self.background = BackgroundSerialServer(device, path, trace)

    def close(self) -> None:
        self.background.close()


@pytest.fixture
def proxy_pair() -> Iterator[LinkProxy]:
    with LinkProxy(None, None, LinkConfig()).start() as proxy:
        yield proxy


def _open_when_ready(path: str) -> RtuDevice:
    """pymodbus opens its port asynchronously: retry the first probe a few times."""
    for _ in range(20):
        try:
            return RtuDevice.open(path, timeout=scaled(0.1), attempts=2)
        except NoDevice:  # until the server listens
            continue
    return RtuDevice.open(path, timeout=scaled(0.1), attempts=2)


def test_pymodbus_server_read_write_clear_trigger_and_exceptions(
        proxy_pair: LinkProxy, capsys: pytest.CaptureFixture[str]) -> None:
    from pymodbus.constants import ExcCodes

    slave = PymodbusSlave(proxy_pair.a_path)
    try:
        _open_when_ready(proxy_pair.b_path).close()
        rtu = ("--port", proxy_pair.b_path, "--modbus-rtu")
        rc, out, _ = cli(capsys, "read", *rtu, "--json")
        assert rc == 0 and json.loads(out)["values"]["fan_speed"] == 1200
        assert cli(capsys, "write", "threshold=40", "mode=2", *rtu)[0] == 0
        assert cli(capsys, "clear", "--mask", "1", *rtu)[0] == 0
        rc, out, _ = cli(capsys, "trigger", *rtu)
        assert rc == 0 and "ACCEPTED (0x0000): started" in out
        rc, out, _ = cli(capsys, "trigger", *rtu)  # pymodbus stores the 1 written: RUNNING
        assert rc == 0 and "RUNNING (0x0101): already running: nothing started" in out
        assert slave.writes == [(TH, [400, 2]), (FAULTS, [1]), (TRIG, [1])]  # written once
        slave.fail[MODE] = ExcCodes.ILLEGAL_VALUE
        rc, out, _ = cli(capsys, "write", "mode=1", *rtu)
        assert rc == 4 and "REJECTED (Modbus exception ILLEGAL_DATA_VALUE)" in out
        slave.fail[TH] = ExcCodes.DEVICE_FAILURE
        rc, out, _ = cli(capsys, "write", "threshold=30", *rtu, "--json")
        doc = json.loads(out)
        assert rc == 5 and doc["writes"][0]["exception"] == "SERVER_DEVICE_FAILURE"
        assert doc["reconcile"]["intended_state_holds"] is False  # read back: still 400
    finally:
        slave.close()


def test_pymodbus_action_storing_its_own_value_is_answer_mismatch_not_no_answer(
        proxy_pair: LinkProxy, capsys: pytest.CaptureFixture[str]) -> None:
    """pymodbus answers FC06 with the value stored once an action changed it: the answer came
    and does not fit; the trigger is UNKNOWN saying so (it was written once), and the next one
    reads a state outside IDLE/RUNNING/DONE and writes nothing."""
    slave = PymodbusSlave(proxy_pair.a_path)
    slave.stores[TRIG] = 4
    try:
        _open_when_ready(proxy_pair.b_path).close()
        rtu = ("--port", proxy_pair.b_path, "--modbus-rtu", "--timeout", f"{scaled(0.1):.3f}")
        rc, out, _ = cli(capsys, "trigger", *rtu)
        assert rc == 5 and "UNKNOWN (ANSWER_MISMATCH: wrote 0x0001, echo 0x0004)" in out
        assert "trigger state 0x0004" in out  # the read-back
        rc, out, _ = cli(capsys, "trigger", *rtu)
        assert rc == 3 and ("NOT_EXECUTED (trigger state 0x0004 is none of IDLE, RUNNING, DONE; "
                            "nothing written)") in out
        assert slave.writes == [(TRIG, [1])]  # written once
    finally:
        slave.close()


def test_pymodbus_server_losing_answers(proxy_pair: LinkProxy,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The server executes but its answers to writes are lost: the trigger and the fault clear
    are UNKNOWN and were written once; the set-only write is retried (several executions, same
    value) and, answered at last, holds."""
    lost_writes = {"n": 0}

    def drop(frame: bytes) -> bool:
        if frame[1] != FunctionCode.WRITE_SINGLE_REGISTER:
            return False
        address = int.from_bytes(frame[2:4], "big")
        if address in (TRIG, FAULTS):
            return True
        lost_writes["n"] += 1
        return lost_writes["n"] <= 2

    slave = PymodbusSlave(proxy_pair.a_path, drop)
    try:
        _open_when_ready(proxy_pair.b_path).close()
        rtu = ("--port", proxy_pair.b_path, "--modbus-rtu", "--timeout", f"{scaled(0.1):.3f}")
        rc, out, _ = cli(capsys, "trigger", *rtu, "--json")
        doc = json.loads(out)
        assert rc == 5 and doc["attempts"] == 1 and doc["outcome"] == "UNKNOWN"
        assert doc["reconcile"]["intended_state_holds"] is True
        rc, out, _ = cli(capsys, "clear", "--mask", "1", *rtu, "--json")
        assert rc == 5 and json.loads(out)["clear"]["attempts"] == 1
        rc, out, _ = cli(capsys, "write", "threshold=44", *rtu, "--json")
        assert rc == 0 and json.loads(out)["writes"][0]["attempts"] == 3
        assert slave.writes == [(TRIG, [1]), (FAULTS, [1])] + [(TH, [440])] * 3
        assert slave.values[TH] == 440
    finally:
        slave.close()


def test_sim_subprocess_serves_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """``idemlink sim --modbus-rtu`` as its own process, as a user runs it."""
    proc, path = start_sim("--trigger-duration", "0.2")
    try:
        rtu = ("--port", path, "--modbus-rtu")
        assert cli(capsys, "write", "fan_setpoint=70", *rtu)[0] == 0
        rc, out, _ = cli(capsys, "read", "fan_setpoint", "generation", *rtu, "--json")
        assert rc == 0 and json.loads(out)["values"] == {"fan_setpoint": 70, "generation": 1}
        rc, out, _ = cli(capsys, "trigger", "--status", *rtu)
        assert rc == 0 and "IDLE" in out
    finally:
        assert stop_sim(proc, signal.SIGTERM) == 0


class FailingWire(LossyWire):
    """The port fails at the first read after a request that may have an effect went out (a
    trigger's state read is answered)."""

    def read(self, timeout: float) -> bytes:
        if not any(decode_rtu(f).pdu[0] != FunctionCode.READ_HOLDING_REGISTERS
                   for f in self.requests):
            return super().read(timeout)
        raise OSError(5, "Input/output error")


def test_port_failing_while_a_trigger_is_out_is_link_lost_unknown_and_blocks() -> None:
    wire = FailingWire(lambda p, n: False)
    dev = RtuDevice(wire, timeout=0.1)
    with pytest.raises(LinkLost) as caught:
        dev.trigger()
    (r,) = caught.value.results
    assert (r.outcome, r.status, caught.value.unknown) == (Outcome.UNKNOWN, Status.LINK_LOST, True)
    assert len(trigger_writes(wire)) == 1 and dev.unknown is r


@pytest.mark.parametrize("baudrate", [0, -9600, 10**9])
def test_the_api_refuses_a_baud_rate_the_cli_refuses(baudrate: int) -> None:
    """Issue 21 (review): ``RtuDevice.open(baudrate=0 or 10**9)`` was accepted (0 hangs a real
    line up). The API refuses it as ``--baudrate`` does, before anything is opened."""
    from idemlink.host.errors import BaudrateError

    with pytest.raises(BaudrateError, match=r"baud rate .* outside 1\.\.20000000"):
        RtuDevice.open("loop://", baudrate=baudrate, probe=False)
