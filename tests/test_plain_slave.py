"""The plain Modbus RTU slave (``idemlink.device_sim.plain_slave``, the ``idemlink_plain_slave``
fixture, ``idemlink sim --modbus-rtu --plain``): no idemlink functions, COMMAND registers that
return to 0, and each controllable fault seen through ``RtuDevice`` — a dropped answer (UNKNOWN,
executed once), a late one, a differing echo (ANSWER_MISMATCH), a mute slave (NO_ANSWER, nothing
executed), an answer as the wrong unit (ignored)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.timing import read_line, wait_until

from idemlink.device_sim.plain_slave import PlainFault, PlainRtuServer
from idemlink.protocol.device_core import DeviceCore, EffectKind, start_row
from idemlink.protocol.modbus_rtu import encode_rtu
from idemlink.protocol.outcome import LocalProtocolError, ModbusException, Outcome, Status
from idemlink.protocol.registers import RegisterKind, TriggerStatus
from idemlink.protocol.regmap_file import DEFAULT_MAP, parse_regmap

MAP = """\
name = "plain-test"

[[registers]]
address = 0
name = "level"
kind = "input"

[[registers]]
address = 1
name = "speed"
kind = "holding"
max = 3000
default = 1000

[[registers]]
address = 2
name = "command"
kind = "command"
max = 3

[[registers]]
address = 3
name = "faults"
kind = "fault"
bits = [{ bit = 0, name = "stall" }]
"""
RM = parse_regmap(MAP)
CMD = 2


def answer(server: PlainRtuServer, pdu: bytes, now: float, unit: int = 1) -> bytes:
    server.receive_data(encode_rtu(unit, pdu), now)
    server.tick(now + 1.0)  # a frame of unknown length ends at a pause
    return server.data_to_send()


# ----------------------------------------------------------------------------- sans I/O

@pytest.mark.parametrize("pdu", [bytes([0x41, 0, 0, 0, 1, 0, 1, 2, 0, 5]),  # conditional write
                                 bytes([0x42, 0, 8, 0, 1])])                 # trigger
def test_idemlink_functions_answer_illegal_function_and_change_nothing(pdu: bytes) -> None:
    core = DeviceCore(DEFAULT_MAP)  # a map with a trigger and a generation: still plain
    server = PlainRtuServer(core)
    assert answer(server, pdu, 1.0) == encode_rtu(1, bytes([pdu[0] | 0x80, 0x01]))
    assert [e for e in core.log if e.request] == []
    (done,) = server.executed
    assert done.exception is ModbusException.ILLEGAL_FUNCTION and done.effects == ()


def test_a_command_register_returns_to_0_and_a_write_while_it_runs_restarts_nothing() -> None:
    core = DeviceCore(RM, trigger_duration=2.0)
    core.write(CMD, (2,), 1.0)
    assert core.value("command") == 2
    core.write(CMD, (1,), 1.5)  # while it runs: accepted, nothing restarts, value kept
    assert core.value("command") == 2
    core.tick(3.0)
    assert core.value("command") == 0
    assert [(e.kind, e.old, e.new, e.time) for e in core.log if e.register == "command"] == [
        (EffectKind.TRIGGER_STARTED, 0, 2, 1.0), (EffectKind.TRIGGER_FINISHED, 2, 0, 3.0)]
    core.write(CMD, (0,), 4.0)  # 0: nothing
    assert core.count(EffectKind.TRIGGER_STARTED, "command") == 1
    server = PlainRtuServer(core)
    assert answer(server, bytes([6, 0, CMD, 0, 4]), 5.0) == encode_rtu(1, bytes([0x86, 3]))
    core.write(CMD, (3,), 6.0)
    core.reset_volatile(6.5)  # a reboot loses the running command
    assert core.value("command") == 0


def test_the_start_rule_is_one_for_triggers_and_command_registers() -> None:
    assert start_row(RegisterKind.COMMAND, 0) is not None
    assert start_row(RegisterKind.COMMAND, 0)[2] is TriggerStatus.ACCEPTED  # type: ignore[index]
    assert start_row(RegisterKind.COMMAND, 7)[2] is TriggerStatus.RUNNING  # type: ignore[index]
    assert start_row(RegisterKind.TRIGGER, 2)[2] is TriggerStatus.DONE  # type: ignore[index]
    assert start_row(RegisterKind.TRIGGER, 9) is None


def test_the_ground_truth_keeps_the_answer_the_line_carried() -> None:
    """Issue 21 (review, usertest/test_echo16.py): with ``echo_differs`` an FC16 write's
    record showed the device's correct answer only, not the one actually sent (its count
    changed). ``Executed.sent`` is the answer as it went on the line, byte for byte;
    ``answer`` stays the device's own; a dropped answer sent nothing."""
    from idemlink.protocol.modbus_rtu import decode_rtu

    server = PlainRtuServer(DeviceCore(RM))
    fc16 = bytes([0x10, 0, 1, 0, 1, 2, 0x01, 0xF4])
    server.inject(PlainFault.ECHO_DIFFERS)
    on_line = answer(server, fc16, 0.0)
    (done,) = server.executed
    assert done.answer == bytes([0x10, 0, 1, 0, 1])
    assert done.sent == bytes([0x10, 0, 1, 0, 5]) == decode_rtu(on_line).pdu
    assert done.to_json()["sent"] == "1000010005"
    server.inject(PlainFault.DROP_ANSWER)
    assert answer(server, fc16, 2.0) == b"" and server.executed[-1].sent == b""
    assert server.executed[-1].answer == bytes([0x10, 0, 1, 0, 1])
    answer(server, fc16, 4.0)
    assert server.executed[-1].sent == server.executed[-1].answer


def test_faults_refuse_bad_arguments() -> None:
    server = PlainRtuServer(DeviceCore(RM))
    for options in ({"times": 0}, {"delay": -1.0}, {"unit": 300}, {"echo": 70000}):
        with pytest.raises(LocalProtocolError):
            server.inject(PlainFault.LATE, **options)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- through RtuDevice

@pytest.fixture
def slave(idemlink_plain_slave_factory):  # type: ignore[no-untyped-def]
    return idemlink_plain_slave_factory(regmap=RM)


def test_a_trigger_twice_from_python_starts_once(slave) -> None:  # type: ignore[no-untyped-def]
    dev = slave.open()
    first, second = dev.trigger("command"), dev.trigger("command")
    assert (first.outcome, first.code) == (Outcome.OK, TriggerStatus.ACCEPTED)
    assert (second.outcome, second.code) == (Outcome.OK, TriggerStatus.RUNNING)
    assert slave.starts("command") == 1 and len(slave.writes("command")) == 1


def test_dropped_answer_is_unknown_with_the_write_executed_once(slave) -> None:  # type: ignore[no-untyped-def]
    dev = slave.open()
    slave.drop_answer()
    r = dev.write({"command": 3})
    assert (r.outcome, r.status, r.attempts) == (Outcome.UNKNOWN, Status.NO_ANSWER, 1)
    assert len(slave.writes("command")) == 1 and slave.starts("command") == 1
    rec = dev.reconcile()
    assert rec is not None and rec.intended_state_holds is True  # it reads 3: it runs
    slave.finish("command")
    rec = dev.reconcile()
    assert rec is not None and rec.intended_state_holds is None  # 0: ran and ended, or never


def test_a_late_answer_within_the_wait_is_taken_one_after_it_is_not(slave) -> None:  # type: ignore[no-untyped-def]
    dev = slave.open(timeout=0.3)
    slave.answer_late(0.05)
    assert dev.write({"speed": 1200}).ok
    slave.answer_late(1.0)
    r = dev.clear_faults(1, "faults")  # a W1C clear: sent once
    assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
    dev.acknowledge_unknown()
    # the late echo arrives while nothing is out: it answers nothing, the read gets its own
    wait_until(lambda: not slave.server._late, what="the late answer sent")
    r = dev.read("speed")
    assert r.ok and r.values == (1200,)


def test_a_differing_echo_is_answer_mismatch(slave) -> None:  # type: ignore[no-untyped-def]
    dev = slave.open()
    slave.echo_differs(echo=0x0004)
    r = dev.write({"command": 1})
    assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.ANSWER_MISMATCH)
    assert "wrote 0x0001, echo 0x0004" in r.describe()
    assert slave.starts("command") == 1


def test_a_mute_slave_executes_nothing_and_answers_nothing(slave) -> None:  # type: ignore[no-untyped-def]
    dev = slave.open()
    before = len(slave.executed)
    slave.mute()
    r = dev.write({"command": 1})
    assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
    dev.acknowledge_unknown()
    assert dev.read("speed").status is Status.NO_ANSWER
    assert len(slave.executed) == before and slave.starts("command") == 0
    assert slave.server.unheard >= 2
    slave.unmute()
    assert dev.read("speed").ok


def test_an_answer_as_the_wrong_unit_is_ignored(slave) -> None:  # type: ignore[no-untyped-def]
    dev = slave.open()
    slave.wrong_unit(unit=9)
    r = dev.read("speed")
    assert not r.ok and r.status is Status.NO_ANSWER
    assert dev.master.ignored >= 1
    assert slave.executed[-1].function == 3  # it did execute: it answered under another id
    slave.clear_faults()
    assert dev.read("speed").ok


# ----------------------------------------------------------------------------- the CLI

def test_sim_plain_serves_the_map_with_faults_from_its_control_fifo(tmp_path: Path) -> None:
    from idemlink.host.rtu_device import RtuDevice

    (tmp_path / "plain.toml").write_text(MAP, encoding="utf-8")
    fifo, effects = tmp_path / "control", tmp_path / "executed.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemlink", "sim", "--modbus-rtu", "--plain", "--regmap",
         str(tmp_path / "plain.toml"), "--control", str(fifo), "--effects", str(effects),
         "--trigger-duration", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        path = read_line(proc.stdout, proc).strip()
        dev = RtuDevice.open(path, regmap=RM, timeout=0.2)
        fd = os.open(fifo, os.O_WRONLY)

        def control(line: str) -> None:
            os.write(fd, (line + "\n").encode())
            assert dev.read("speed").ok  # the serve loop applies the line before answering

        control("fault drop")
        r = dev.trigger("command")
        assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
        dev.acknowledge_unknown()
        assert dev.trigger("command").code == TriggerStatus.RUNNING  # started once, running
        control("finish 2")
        control("fault echo")
        r = dev.write({"command": 1})
        assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.ANSWER_MISMATCH)
        dev.acknowledge_unknown()
        os.write(fd, b"fault unit 5\n")
        wait_until(lambda: not dev.read("speed").ok, what="answers as unit 5")
        os.write(fd, b"fault clear\n")
        wait_until(lambda: dev.read("speed").ok, what="answers as unit 1 again")
        os.write(fd, b"fault mute\n")
        wait_until(lambda: dev.read("speed").status is Status.NO_ANSWER, what="mute")
        os.write(fd, b"fault clear\n")  # a mute slave still reads its control pipe
        wait_until(lambda: dev.read("speed").ok, what="heard again")
        os.close(fd)
        dev.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lines = [json.loads(x) for x in effects.read_text("utf-8").splitlines()]
    writes = [x for x in lines if x["function"] == 6 and x["address"] == CMD]
    assert [w["fault"] for w in writes] == ["drop", "echo"]
    assert [[e["kind"] for e in w["effects"]] for w in writes] == [["TRIGGER_STARTED"],
                                                                   ["TRIGGER_STARTED"]]


def test_plain_needs_modbus_rtu() -> None:
    r = subprocess.run([sys.executable, "-m", "idemlink", "sim", "--plain"],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 1 and "--plain is a plain Modbus RTU slave" in r.stderr


def test_cli_trigger_starts_a_command_register_once(
        slave, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from idemlink.cli import main

    (tmp_path / "plain.toml").write_text(MAP, encoding="utf-8")
    base = ["--modbus-rtu", "--port", slave.path, "--regmap", str(tmp_path / "plain.toml")]
    assert main(["trigger", *base]) == 0  # the map's only command register: no trigger
    assert main(["trigger", *base, "command"]) == 0
    out = capsys.readouterr().out
    assert "command: ACCEPTED (0x0000): started" in out
    assert "command: RUNNING (0x0101): already running: nothing started" in out
    assert slave.starts("command") == 1
    assert main(["trigger", *base, "--status"]) == 0
    assert "command: running command 1" in capsys.readouterr().out
    sent = len(slave.executed)
    assert main(["trigger", *base, "--reset"]) == 1
    assert "returns to 0 by itself" in capsys.readouterr().err
    assert len(slave.executed) == sent


def test_async_rtu_device_starts_a_command_once_too(slave) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from idemlink.host.aio import AsyncRtuDevice

    async def twice() -> tuple[int | None, int | None]:
        async with AsyncRtuDevice.open(slave.path, regmap=RM) as dev:
            first = await dev.trigger("command")
            second = await dev.trigger("command")
            return first.code, second.code

    assert asyncio.run(twice()) == (TriggerStatus.ACCEPTED, TriggerStatus.RUNNING)
    assert slave.starts("command") == 1


def test_a_map_with_a_command_register_renders_a_header_naming_its_kind() -> None:
    from idemlink.protocol.contract import render_map_header

    header = render_map_header(RM)
    assert header.index("#define IDL_REG_KIND_COMMAND 7u") < header.index(
        "(uint8_t)IDL_REG_KIND_COMMAND")
    assert "KIND_COMMAND" not in render_map_header(DEFAULT_MAP)  # earlier maps: unchanged


def test_a_plan_starts_a_command_register_with_a_trigger_step_once_and_refuses_a_write_step(
        slave, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from idemlink.cli import main

    (tmp_path / "plain.toml").write_text(MAP, encoding="utf-8")
    base = ["--modbus-rtu", "--port", slave.path, "--regmap", str(tmp_path / "plain.toml"),
            "--device-id", "dryer-1"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "steps": [{"write": {"command": 1}}]}))
    assert main(["apply", str(bad), *base]) == 1
    assert "command register" in capsys.readouterr().err and slave.executed == []
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"name": "purge", "steps": [{"trigger": "command"}]}))
    assert main(["apply", str(plan), *base]) == 0
    assert slave.starts("command") == 1
    assert main(["apply", str(plan), *base]) == 0  # receipted: skipped, not started again
    assert "skipped" in capsys.readouterr().out
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"name": "again", "steps": [{"trigger": "command"}]}))
    assert main(["apply", str(other), *base]) == 3  # NOT_EXECUTED: it runs, nothing started
    assert "not started: the trigger is running command 1 (it returns to 0 when done)" in (
        capsys.readouterr().out)
    assert slave.starts("command") == 1
