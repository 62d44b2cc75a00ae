"""How the host driver and the CLI fail: ports that die, interrupts, bad options, UNKNOWN read-backs.

- a transport error mid-command settles the request as UNKNOWN/LINK_LOST and blocks the handle;
- an interrupted command (Ctrl-C, asyncio cancellation) leaves nothing in the session;
- ``run()`` before ``connect()`` raises instead of polling forever;
- ``--timeout nan|inf|1e300`` and ``monitor --seconds nan`` are user errors;
- ``apply`` names a one-shot step's pending journal key that the edited plan no longer has, and
  ``--resolve`` settles it;
- every UNKNOWN command of a ``write`` is read back, and ``apply`` reads back its UNKNOWN step.

The simulated device's execution log is the ground truth throughout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from idemlink.cli import UserError, build_parser
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.errors import LinkLost, PortError, UnknownOutstanding
from idemlink.host.journal import DeviceJournal
from idemlink.host.plan import load_plan
from idemlink.protocol.device_core import EffectKind
from idemlink.protocol.frame import Frame, FrameDecoder, FrameType
from idemlink.protocol.modbus import FunctionCode
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.pytest_plugin import start_pty_sim


class Bounded:
    """A SimTransport that fails the test (instead of hanging) after too many reads."""

    def __init__(self, t: SimTransport, limit: int = 2000) -> None:
        self.t = t
        self.reads = 0
        self.limit = limit

    def write(self, data: bytes) -> None:
        self.t.write(data)

    def read(self, timeout: float) -> bytes:
        self.reads += 1
        if self.reads > self.limit:
            raise AssertionError(f"still polling after {self.limit} reads")
        return self.t.read(timeout)

    def now(self) -> float:
        return self.t.now()

    def close(self) -> None:
        self.t.close()


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


# --------------------------------------------------------------------------- not connected


def test_run_before_connect_raises_instead_of_polling_forever() -> None:
    sim = SimTransport(SimulatedDevice(seed=1))
    dev = Device(Bounded(sim))  # connect() forgotten
    with pytest.raises(LocalProtocolError, match="not connected"):
        dev.read("threshold")
    with pytest.raises(LocalProtocolError, match="not connected"):
        dev.write({"threshold": 300})
    assert len(sim.device.executions) == 0
    dev.connect()  # the handle is still usable once connected
    assert dev.read("threshold").ok


# --------------------------------------------------------------------------- float options


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e300", "0", "-1", "61"])
def test_bad_timeout_is_a_user_error_before_opening(text: str) -> None:
    args = parse(["read", "threshold", f"--timeout={text}"])

    def opener() -> Device:
        raise AssertionError("the port was opened with --timeout " + text)

    args.open_device = opener
    with pytest.raises(UserError, match="--timeout"):
        args.handler(args)


def test_good_timeout_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    sim = SimTransport(SimulatedDevice(seed=1))
    args = parse(["read", "threshold", "--timeout", "60", "--json"])

    def opener() -> Device:
        dev = Device(sim, timeout=60.0)
        dev.connect()
        return dev

    args.open_device = opener
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "OK"


@pytest.mark.parametrize("text", ["nan", "inf", "0", "1e300"])
def test_bad_monitor_seconds_is_a_user_error(text: str, tmp_path: Path) -> None:
    args = parse(["monitor", "--port", str(tmp_path / "no-such-port"), "--seconds", text])
    with pytest.raises(UserError, match="--seconds"):
        args.handler(args)


# --------------------------------------------------------------------------- UNKNOWN read-backs


class WritesUnanswered(SimTransport):
    """Every answer to a request that is not a read is lost (the device still runs it); reads
    are answered — so a read-back after an UNKNOWN write succeeds."""

    def write(self, data: bytes) -> None:
        self._decoder.receive_data(data)
        for frame in iter(self._decoder.next_event, None):
            if isinstance(frame, Frame):
                self.drop_answers = frame.type is FrameType.REQUEST and frame.payload[:1] != bytes(
                    [FunctionCode.READ_HOLDING_REGISTERS])
        super().write(data)

    def __init__(self, device: SimulatedDevice) -> None:
        super().__init__(device)
        self._decoder = FrameDecoder()


def inproc(argv: list[str], t: SimTransport, capsys: pytest.CaptureFixture[str],
           *, drop_after_connect: bool = False) -> tuple[int, str]:
    args = parse(argv)

    def opener() -> Device:
        dev = Device(t, attempts=3)
        t.drop_answers = False
        dev.connect()
        t.drop_answers = drop_after_connect
        return dev

    args.open_device = opener
    rc = args.handler(args)
    return rc, capsys.readouterr().out


def reads_at(device: SimulatedDevice, address: int, after: int = 0) -> int:
    pdu = bytes([FunctionCode.READ_HOLDING_REGISTERS]) + address.to_bytes(2, "big")
    return sum(1 for e in device.executions[after:] if e.request[:3] == pdu)


def test_write_reads_back_every_unknown_group(capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=1)
    t = WritesUnanswered(device)
    th, fan = DEFAULT_MAP.named("threshold").address, DEFAULT_MAP.named("fan_setpoint").address
    rc, out = inproc(["write", "threshold=40.0", "fan_setpoint=80", "--json"], t, capsys)
    doc = json.loads(out)
    assert rc == 5 and [w["outcome"] for w in doc["writes"]] == ["UNKNOWN", "UNKNOWN"]
    assert reads_at(device, th) >= 1 and reads_at(device, fan) >= 1  # both were read back
    assert [r["observed"] for r in doc["reconciles"]] == [
        {"threshold": 400, "generation": 2}, {"fan_setpoint": 80, "generation": 2}]
    assert all(r["intended_state_holds"] is True for r in doc["reconciles"])
    assert doc["reconcile"] == doc["reconciles"][0]
    rc, out = inproc(["write", "threshold=40.1", "fan_setpoint=81"], t, capsys)
    assert rc == 5 and out.count("read back: the registers hold the intended values") == 2


def write_plan(path: Path, steps: list[dict[str, object]]) -> None:
    path.write_text(json.dumps({"name": "p", "steps": steps}))


def test_apply_reads_back_its_unknown_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=1)
    t = WritesUnanswered(device)
    plan = tmp_path / "plan.json"
    write_plan(plan, [{"write": {"threshold": "40.0", "mode": 2}}, {"write": {"fan_setpoint": 80}}])
    rc, out = inproc(["apply", str(plan), "--json"], t, capsys)
    doc = json.loads(out)
    assert rc == 5
    step1 = doc["steps"][0]
    assert step1["state"] == "unknown"
    assert step1["reconciles"][0]["observed"] == {"threshold": 400, "mode": 2, "generation": 1}
    assert step1["reconciles"][0]["intended_state_holds"] is True
    assert reads_at(device, DEFAULT_MAP.named("threshold").address) >= 1


def test_apply_names_and_resolves_a_step_orphaned_by_a_plan_edit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=1)
    t = WritesUnanswered(device)
    plan = tmp_path / "plan.json"
    write_plan(plan, [{"trigger": "self_clean"}, {"write": {"fan_setpoint": 80}}])
    old = load_plan(plan, DEFAULT_MAP).steps[0].key
    # The trigger runs, its answer is lost: UNKNOWN, left in flight for this device.
    rc, _ = inproc(["apply", str(plan)], t, capsys)
    assert rc == 5 and device.core.count(EffectKind.TRIGGER_STARTED) == 1
    write_plan(plan, [{"write": {"fan_setpoint": 80}}, {"trigger": "self_clean"}])  # edited
    t = SimTransport(device)
    before = len(device.executions)
    rc, out = inproc(["apply", str(plan), "--json"], t, capsys)
    doc = json.loads(out)
    assert rc == 5 and doc["in_flight"] == [str(old)]
    assert all(e.request[0] == FunctionCode.READ_HOLDING_REGISTERS
               for e in device.executions[before:])  # nothing ran
    rc, out = inproc(["apply", str(plan)], t, capsys)
    assert rc == 5 and f"--resolve {old}" in out
    # The key may only be settled with a verdict, and only while it is in flight.
    with pytest.raises(UserError, match="--executed or --not-executed"):
        inproc(["apply", str(plan), "--resolve", str(old)], t, capsys)
    new = load_plan(plan, DEFAULT_MAP).steps[1].key
    with pytest.raises(UserError, match="not in flight"):
        inproc(["apply", str(plan), "--resolve", str(new), "--executed"], t, capsys)
    with pytest.raises(UserError, match="journal"):
        inproc(["apply", str(plan), "--resolve", "not-a-key", "--executed"], t, capsys)
    before = len(device.executions)
    rc, out = inproc(["apply", str(plan), "--resolve", str(old), "--executed"], t, capsys)
    assert rc == 0 and f"resolved as executed on device {device.device_id}" in out
    assert len(device.executions) == before  # resolving sends nothing
    assert old in DeviceJournal.open(f"{plan}.journal").done(device.device_id)
    dev = Device(t)
    dev.connect()
    assert dev.trigger_reset().ok  # re-arm: the edited plan's trigger is a new step
    rc, out = inproc(["apply", str(plan), "--json"], t, capsys)
    assert rc == 0 and [s["state"] for s in json.loads(out)["steps"]] == ["written", "executed"]
    assert device.core.value("fan_setpoint") == 80
    assert device.core.count(EffectKind.TRIGGER_STARTED) == 2


# --------------------------------------------------------------------------- a port that fails


class FailsAfterRequest(SimTransport):
    """Fails (``error``) on the first read after ``arm()`` once a request has gone out."""

    def __init__(self, device: SimulatedDevice, error: BaseException) -> None:
        super().__init__(device)
        self.error = error
        self.armed = False
        self.requests_written = 0

    def arm(self) -> None:
        self.armed = True

    def write(self, data: bytes) -> None:
        if self.armed:
            self.requests_written += 1
        super().write(data)

    def read(self, timeout: float) -> bytes:
        if self.armed and self.requests_written:
            raise self.error
        return super().read(timeout)


def test_port_error_mid_command_is_link_lost_unknown_and_blocks() -> None:
    t = FailsAfterRequest(SimulatedDevice(seed=1), OSError(5, "Input/output error"))
    dev = Device(t, max_inflight=1)
    dev.connect()
    t.arm()
    cmds = [dev.write_command({"threshold": 300}), dev.write_command({"mode": 1}),
            dev.write_command({"fan_setpoint": 70})]
    with pytest.raises(LinkLost) as info:
        dev.run(cmds)
    got = [(r.command, r.outcome, r.status) for r in info.value.results]
    assert got == [(cmds[0], Outcome.UNKNOWN, Status.LINK_LOST),  # it went out: may have run
                   (cmds[1], Outcome.NOT_EXECUTED, None), (cmds[2], Outcome.NOT_EXECUTED, None)]
    assert info.value.unknown and isinstance(info.value, PortError)
    assert dev.session.outstanding == 0 and not dev.ops.completions  # nothing left to run later
    assert dev.unknown is info.value.results[0]
    with pytest.raises(UnknownOutstanding):
        dev.read("threshold")


def test_keyboard_interrupt_mid_command_settles_and_blocks() -> None:
    t = FailsAfterRequest(SimulatedDevice(seed=1), KeyboardInterrupt())
    dev = Device(t)
    dev.connect()
    t.arm()
    with pytest.raises(KeyboardInterrupt):
        dev.write({"threshold": 300})
    assert dev.session.outstanding == 0 and not dev.ops.completions
    assert dev.unknown is not None and dev.unknown.status is Status.CANCELLED
    with pytest.raises(UnknownOutstanding):
        dev.write({"mode": 1})
    t.armed = False
    rec = dev.reconcile()
    assert rec is not None and rec.observed["threshold"] in (300, DEFAULT_MAP.named(
        "threshold").default)
    dev.acknowledge_unknown()
    assert dev.write({"mode": 1}).ok  # the handle works again, no stray completion around
    assert not dev.ops.completions


def test_cli_port_failure_mid_command_exits_5_without_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    t = FailsAfterRequest(SimulatedDevice(seed=1), OSError(5, "Input/output error"))
    args = parse(["write", "threshold=30.0", "--json"])

    def opener() -> Device:
        dev = Device(t)
        dev.connect()
        t.arm()
        return dev

    args.open_device = opener
    rc = args.handler(args)
    out, err = capsys.readouterr()
    assert rc == 5
    assert "the port failed" in err and "Traceback" not in err and len(err.splitlines()) == 1
    doc = json.loads(out)
    assert doc["outcome"] == "UNKNOWN" and doc["results"][0]["status"] == "LINK_LOST"


def test_real_pty_whose_device_goes_away() -> None:
    """A real serial port (a pty) whose other end closes: LinkLost, not a raw OSError."""
    sim = start_pty_sim(SimulatedDevice(seed=4))
    try:
        dev = Device.open(sim.path, timeout=0.5, attempts=3)
    except BaseException:
        sim.close()
        raise
    try:
        assert dev.write({"threshold": 310}).ok
        sim.close()  # the device side disappears
        with pytest.raises(LinkLost) as info:
            dev.write({"threshold": 320})
        assert [r.outcome for r in info.value.results] == [Outcome.UNKNOWN]
        assert dev.unknown is info.value.results[0] and dev.session.outstanding == 0
    finally:
        dev.close()


def test_cli_port_failure_before_any_request_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    t = FailsAfterRequest(SimulatedDevice(seed=1), OSError(5, "Input/output error"))
    t.arm()  # fails during the HELLO handshake: no request was ever out
    args = parse(["read", "threshold"])

    def opener() -> Device:
        dev = Device(t)
        dev.connect()
        return dev

    args.open_device = opener
    rc = args.handler(args)
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert "nothing was out" in err and len(err.splitlines()) == 1
    assert len(t.device.executions) == 0


def test_sim_serving_a_port_that_fails_exits_1_without_a_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`idemlink sim --port P` whose port dies: one line, exit 1 (before: a PortError traceback)."""
    import argparse
    import contextlib
    from collections.abc import Iterator

    import idemlink.commands.sim_cmd as sim_cmd
    from idemlink.cli import UserError
    from idemlink.host.errors import PortError

    class DyingTransport:
        def read(self, timeout: float) -> bytes:
            raise PortError("read failed: [Errno 5] Input/output error")

        def write(self, data: bytes) -> None:
            raise AssertionError("nothing to answer")

    @contextlib.contextmanager
    def serving_end(args: argparse.Namespace) -> Iterator[tuple[DyingTransport, str]]:
        yield DyingTransport(), "/dev/fake"

    monkeypatch.setattr(sim_cmd, "_serving_end", serving_end)
    args = argparse.Namespace(seed=1, trigger_duration=1.0, flash_dir=None, modbus_rtu=False)
    with pytest.raises(UserError, match="the port failed while serving"):
        sim_cmd.run(args)


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_ctrl_c_with_a_request_out_says_it_may_have_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool) -> None:
    """Ctrl-C after the trigger reached the device: exit 130 as documented, but no longer silent —
    one line (and the results with --json) says a request may have run."""
    from idemlink.cli import main
    from idemlink.protocol.device_core import EffectKind

    sim = SimTransport(SimulatedDevice(seed=3))

    class Interrupting:
        armed = False

        def write(self, data: bytes) -> None:
            sim.write(data)

        def read(self, timeout: float) -> bytes:
            data = sim.read(timeout)
            if self.armed:
                raise KeyboardInterrupt  # the answer is here, the user hits Ctrl-C
            return data

        def now(self) -> float:
            return sim.now()

        def close(self) -> None:
            pass

    tr = Interrupting()

    def fake_open(url: str, **kw: float) -> Device:
        dev = Device(tr, timeout=0.2, attempts=5)
        dev.connect()
        tr.armed = True
        return dev

    monkeypatch.setattr(Device, "open", staticmethod(fake_open))
    rc = main(["trigger", "--port", "sim://x", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert rc == 130
    assert "may have run (UNKNOWN, CANCELLED)" in err
    if as_json:
        doc = json.loads(out)
        assert doc["outcome"] == "UNKNOWN" and doc["results"][0]["status"] == "CANCELLED"
    assert sim.device.core.count(EffectKind.TRIGGER_STARTED) == 1


def test_output_into_a_closed_pipe_exits_141_without_a_traceback() -> None:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "regmap", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first byte (`| head -c 0`)
    err = proc.stderr.read()
    assert proc.wait() == 141 and err == b""
