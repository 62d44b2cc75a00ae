"""The device commands of the ``idemlink`` CLI, against the framed simulator.

Two ways: (1) ``idemlink sim`` as a real subprocess on a pty, driven by ``idemlink
write/read/faults/clear/trigger/apply/monitor`` subprocesses (outputs, ``--json`` shapes, exit
statuses; the ground truth is the simulator's flash file, written by the simulator, not the CLI);
(2) the same handlers in-process over ``SimTransport`` (the device injected through
``args.open_device``), where the device's execution log is the ground truth — including a link
that drops answers (UNKNOWN, exit 5) and a lossy, duplicating link (each write runs once).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idemlink.cli import UserError, build_parser
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import Link, LinkConfig
from idemlink.device_sim.pty import open_pty
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.journal import DeviceJournal
from idemlink.host.journal_format import SentRecord
from idemlink.protocol.frame import Flags, FrameType, encode_frame
from idemlink.protocol.modbus import FunctionCode, WriteSingleRegister, encode_request
from idemlink.protocol.regmap_file import DEFAULT_MAP

# Not ``-m idemlink.cli``: that runs cli.py as ``__main__``, a second copy whose ``UserError`` is not
# the one the command modules raise (so the one-line error handling would not apply).
CLI = [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())"]


# ----------------------------------------------------------------------------------- helpers


def read_line(fd: int, proc: subprocess.Popen[bytes], deadline: float) -> str:
    """One line from a child's pipe, waiting on readiness (never sleeping) until the deadline."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line from child in time (got {buf!r})")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            if not chunk:
                raise AssertionError(f"child closed its pipe (got {buf!r}, rc={proc.poll()})")
            buf += chunk
    return buf.decode().strip()


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
    return out


class Sim:
    def __init__(self, flash: Path, *extra: str) -> None:
        self.flash = flash
        self.proc = subprocess.Popen(
            [*CLI, "sim", "--seed", "7", "--trigger-seconds", "0.3", "--flash-dir", str(flash),
             *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.path = read_line(self.proc.stdout.fileno(), self.proc, time.monotonic() + 20)

    def holdings(self) -> dict[str, int]:
        """The configuration the simulator persisted (its own file, not CLI output); nothing
        before its first persistent write (a fresh flash directory has no file yet)."""
        path = self.flash / "config.json"
        if not path.exists():
            return {}
        doc = json.loads(path.read_text())
        return {DEFAULT_MAP.at(a).name: v for a, v in doc["holdings"]}  # type: ignore[union-attr]

    def stop(self) -> tuple[int, bytes]:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(10)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc, err


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    s = Sim(tmp_path_factory.mktemp("flash"))
    yield s
    if s.proc.poll() is None:
        s.stop()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30)


def cli_json(*args: str) -> tuple[int, Any]:
    r = cli(*args, "--json")
    return r.returncode, json.loads(r.stdout)


# ----------------------------------------------------------------------- over a real pty


def test_write_read_roundtrip(sim: Sim) -> None:
    r = cli("write", "--port", sim.path, "threshold=42.0", "mode=2")
    assert r.returncode == 0, r.stderr
    assert sim.holdings()["threshold"] == 420 and sim.holdings()["mode"] == 2
    rc, doc = cli_json("read", "--port", sim.path, "threshold", "mode", "4")
    assert rc == 0
    assert doc["outcome"] == "OK"
    assert doc["values"] == {"threshold": 420, "mode": 2}
    assert doc["results"]["threshold"]["address"] == 4
    r = cli("read", "--port", sim.path, "mode", "threshold", "fan_setpoint")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["mode         = manual (2)",
                                     "threshold    = 42.0 °C (raw 420)",
                                     "fan_setpoint = 50 %"]
    assert doc["results"]["threshold"]["shown"] == "42.0 °C"


def test_values_typed_as_people_read_them(sim: Sim) -> None:
    # a label, a number with a decimal point in the register's unit, an integer is raw
    r = cli("write", "--port", sim.path, "threshold=42.5", "mode=auto", "fan_setpoint=70")
    assert r.returncode == 0, r.stderr
    assert (sim.holdings()["threshold"], sim.holdings()["mode"]) == (425, 1)
    assert sim.holdings()["fan_setpoint"] == 70
    before = sim.holdings()
    for bad, why in [("threshold=42.55", "not a multiple of the scale 0.1"),
                     ("mode=fast", "off, auto, manual"),
                     ("threshold=100.1", "outside 0..1000 (0.0..100.0 °C)")]:
        r = cli("write", "--port", sim.path, bad)
        assert r.returncode in (1, 4) and why in r.stderr + r.stdout, (bad, r.stderr, r.stdout)
    assert sim.holdings() == before


def test_out_of_range_is_rejected_exit_4(sim: Sim) -> None:
    before = sim.holdings()
    r = cli("write", "--port", sim.path, "threshold=100.1")
    assert r.returncode == 4
    assert "0..1000" in r.stdout and "nothing sent" in r.stdout
    rc, doc = cli_json("write", "--no-check", "--port", sim.path, "threshold=100.1")
    assert rc == 4
    assert doc["writes"][0]["exception"] == "ILLEGAL_DATA_VALUE"  # the device's own answer
    assert sim.holdings() == before


def test_user_mistakes_exit_1_one_line(sim: Sim, tmp_path: Path) -> None:
    cases = [
        ("write", "--port", sim.path, "nosuch=1"),
        ("write", "--port", sim.path, "threshold=twelve"),
        ("write", "--port", sim.path, "threshold=7000"),
        ("read", "--port", sim.path, "nosuch"),
        ("read", "--port", str(tmp_path / "no-such-port"), "threshold"),
        ("read", "threshold"),
        ("clear", "--port", sim.path, "no_such_bit"),
    ]
    for args in cases:
        r = cli(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == ""


def test_conditional_write(sim: Sim) -> None:
    rc, doc = cli_json("read", "--port", sim.path, "generation")
    gen = doc["values"]["generation"]
    rc, doc = cli_json("write", "--port", sim.path, "fan_setpoint=61",
                       "--if-generation", str(gen + 5))
    assert rc == 3 and doc["writes"][0]["status"] == "GUARD_FAILED"
    assert sim.holdings().get("fan_setpoint") != 61
    rc, doc = cli_json("write", "--port", sim.path, "fan_setpoint=61",
                       "--if-generation", str(gen))
    assert rc == 0 and doc["writes"][0]["generation"] == gen + 1
    assert sim.holdings()["fan_setpoint"] == 61


def test_faults_and_clear(sim: Sim) -> None:
    # temperature 250 (0.1 degC) over a threshold of 200 latches over_temperature.
    assert cli("write", "--port", sim.path, "threshold=20.0").returncode == 0
    rc, doc = cli_json("faults", "--port", sim.path)
    assert rc == 0
    assert doc["faults"]["faults"]["latched"] == ["over_temperature"]
    assert doc["faults"]["faults"]["bits"]["over_temperature"] is True
    # Reading does not clear; clearing while the condition holds re-latches at once.
    rc, doc = cli_json("clear", "--port", sim.path, "over_temperature")
    assert rc == 0 and doc["mask"] == 1 and doc["after"]["latched"] == ["over_temperature"]
    assert cli("write", "--port", sim.path, "threshold=40.0").returncode == 0
    rc, doc = cli_json("faults", "--port", sim.path)
    assert doc["faults"]["faults"]["value"] == 1  # still latched: never cleared by reading
    rc, doc = cli_json("clear", "--port", sim.path, "--mask", "0x1")
    assert rc == 0 and doc["after"]["value"] == 0
    r = cli("faults", "--port", sim.path)
    assert "none latched" in r.stdout


def test_trigger_cycle(sim: Sim) -> None:
    assert cli("trigger", "--port", sim.path, "--reset").returncode == 0
    rc, doc = cli_json("trigger", "--port", sim.path)
    assert rc == 0 and doc["code_name"] == "ACCEPTED"
    rc, doc = cli_json("trigger", "--port", sim.path)
    # RUNNING for 0.3 s, then DONE: either way it did not start again.
    assert rc == 0 and doc["code_name"] in ("RUNNING", "DONE")
    rc, doc = cli_json("trigger", "--port", sim.path, "--status")
    assert rc == 0 and doc["state"] in ("RUNNING", "DONE")
    rc, doc = cli_json("trigger", "--port", sim.path, "--reset")
    assert rc == 0 and doc["code"] == 0
    rc, doc = cli_json("trigger", "--port", sim.path, "--status")
    assert doc["state"] == "IDLE"


def test_apply_plan_converges(sim: Sim, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"name": "t", "steps": [
        {"write": {"threshold": "raw:333", "mode": 0}}, {"write": {"fan_setpoint": 12}}]}))
    rc, doc = cli_json("apply", "--port", sim.path, str(plan))
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["written", "written"]
    h = sim.holdings()
    assert (h["threshold"], h["mode"], h["fan_setpoint"]) == (333, 0, 12)
    assert not Path(str(plan) + ".journal").exists()  # set-only writes need no journal
    rc, doc = cli_json("apply", "--port", sim.path, str(plan))
    assert rc == 0 and [s["state"] for s in doc["steps"]] == ["in_place", "in_place"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"steps": [{"write": {"threshold": "500.0"}}]}))
    assert cli("apply", "--port", sim.path, str(bad)).returncode == 4
    # a bare number for a scaled register: it was the raw value in plans, it is the unit on the
    # command line; refused with the hint, nothing sent
    bad.write_text(json.dumps({"steps": [{"write": {"threshold": 5000}}]}))
    r = cli("apply", "--port", sim.path, str(bad))
    assert r.returncode == 1 and '"500.0" for 500.0 °C or "raw:5000"' in r.stderr
    bad.write_text("{not json")
    assert cli("apply", "--port", sim.path, str(bad)).returncode == 1


def test_sim_exits_0_on_sigterm_leaving_nothing(tmp_path: Path) -> None:
    s = Sim(tmp_path / "flash")
    assert os.path.exists(s.path)
    assert cli("write", "--port", s.path, "mode=0").returncode == 0
    assert children_of(s.proc.pid) == []
    rc, err = s.stop()
    assert rc == 0, err
    assert b"Traceback" not in err
    # The process is gone, so is its pty (the kernel may hand its number to another process's
    # new pty at once, so the path itself proves nothing on a shared machine).
    assert s.proc.poll() == 0
    # The configuration survives in the flash directory: a new simulator starts with it.
    s2 = Sim(tmp_path / "flash")
    try:
        rc2, doc = cli_json("read", "--port", s2.path, "mode")
        assert rc2 == 0
        assert doc["values"]["mode"] == 0
    finally:
        assert s2.stop()[0] == 0


def test_sim_bad_port_exit_1(tmp_path: Path) -> None:
    r = cli("sim", "--port", str(tmp_path / "missing"))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr


def test_monitor_decodes_frames() -> None:
    pair = open_pty()
    proc = subprocess.Popen([*CLI, "monitor", "--port", pair.slave_path, "--count", "3",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        assert "listening" in read_line(proc.stderr.fileno(), proc, time.monotonic() + 20)
        pdu = encode_request(WriteSingleRegister(4, 400))
        bad = bytearray(encode_frame(FrameType.REQUEST, 9, 0xABCD, pdu))
        bad[5] ^= 0x01
        data = (encode_frame(FrameType.REQUEST, 8, 0xABCD, pdu, Flags.RETRANSMIT)
                + encode_frame(FrameType.RESPONSE, 8, 0xABCD, b"\x00" + pdu, Flags.REPLAY)
                + bytes(bad))
        os.write(pair.master_fd, data)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pair.close()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [d["type"] for d in lines] == ["REQUEST", "RESPONSE", "ERROR"]
    assert lines[0]["seq"] == 8 and lines[0]["flags"] == ["RETRANSMIT"]
    assert "FC06 write threshold=400 (40.0 °C)" in lines[0]["text"]
    assert lines[0]["function"] == 6
    assert lines[0]["registers"] == [{"name": "threshold", "address": 4, "raw": 400,
                                      "value": 40.0, "label": None, "unit": "°C"}]
    assert lines[1]["flags"] == ["REPLAY"] and "wrote threshold=400" in lines[1]["text"]
    assert lines[1]["status"] == "OK"
    assert lines[2]["error"] == "BAD_CRC"


# -------------------------------------------------------------------- in-process, SimTransport


def run_inproc(argv: list[str], transport: SimTransport, capsys: pytest.CaptureFixture[str],
               attempts: int = 5) -> tuple[int, str]:
    args = build_parser().parse_args(argv)

    def opener() -> Device:
        dev = Device(transport, attempts=attempts)
        dev.connect()
        return dev

    args.open_device = opener
    rc = args.handler(args)
    return rc, capsys.readouterr().out


def writes_of(device: SimulatedDevice, address: int) -> int:
    pdu = FunctionCode.WRITE_SINGLE_REGISTER.to_bytes(1, "big") + address.to_bytes(2, "big")
    return sum(1 for e in device.executions if e.request[:3] == pdu)


def test_inproc_lost_answers_are_unknown_exit_5(capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=3)
    t = SimTransport(device)
    args = build_parser().parse_args(["write", "mode=2", "--json"])
    dev = Device(t, attempts=3)
    dev.connect()
    # From now on every answer is lost: the device runs the write, the host cannot know.
    t.link = Link(LinkConfig(), LinkConfig(frame_loss=1.0))
    t.link.start(t.now())
    args.open_device = lambda: dev
    rc = args.handler(args)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 5 and doc["outcome"] == "UNKNOWN"
    assert writes_of(device, 5) == 1  # it did run, once: UNKNOWN was the honest answer
    assert doc["reconcile"]["intended_state_holds"] is None  # the read-back was lost too


def test_inproc_lossy_duplicating_link_each_write_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=5)
    lossy = LinkConfig(frame_loss=0.25, frame_dup=0.3, seed=11)
    t = SimTransport(device, lossy, LinkConfig(frame_loss=0.25, frame_dup=0.3, seed=12))
    values = (10, 20, 30, 40, 50, 60, 70, 80)
    for value in values:
        rc, out = run_inproc(["write", f"fan_setpoint={value}"], t, capsys, attempts=30)
        assert rc == 0, out
        assert dict(device.core.snapshot().holdings)[6] == value
    assert writes_of(device, 6) == len(values)  # retried and duplicated on the wire, executed once each
    stats = (t.link.a_to_b.stats, t.link.b_to_a.stats)  # the link really lost and duplicated
    assert sum(s.frames_lost for s in stats) > 0 and sum(s.frames_duplicated for s in stats) > 0


def test_inproc_read_all_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=1)
    t = SimTransport(device)
    rc, out = run_inproc(["read", "--json"], t, capsys)
    doc = json.loads(out)
    assert rc == 0 and set(doc["values"]) == {r.name for r in DEFAULT_MAP}
    assert doc["values"]["threshold"] == DEFAULT_MAP.named("threshold").default
    with pytest.raises(UserError):
        run_inproc(["write", "faults=1"], t, capsys)
    with pytest.raises(UserError):
        run_inproc(["trigger", "threshold"], t, capsys)


def test_inproc_apply_reconciles_a_step_left_in_flight(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.host.plan import load_plan

    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"name": "r", "steps": [
        {"trigger": "self_clean"}, {"clear": {"faults": ["fan_stall"]}}]}))
    steps = load_plan(plan, DEFAULT_MAP).steps
    journal = tmp_path / "j"
    device = SimulatedDevice(seed=2)
    # A crash left the trigger in flight for this device after it had started: the journal
    # holds its request and number, recorded before it left.
    j = DeviceJournal.open(journal)
    dev = Device(SimTransport(device))
    dev.connect()
    assert dev.execute_recorded(dev.trigger_command(), lambda sent: j.begin(
        device.device_id, steps[0].key, SentRecord(sent.pdu, sent.number))).ok
    before = len(device.executions)
    t = SimTransport(device)
    rc, out = run_inproc(["apply", str(plan), "--journal", str(journal), "--json"], t, capsys)
    doc = json.loads(out)
    assert rc == 0
    assert [s["state"] for s in doc["steps"]] == ["skipped", "executed"]
    assert [(r["key"], r["executed"]) for r in doc["reconciled"]] == [(str(steps[0].key), True)]
    assert "replayed its answer" in doc["reconciled"][0]["evidence"]  # the device said so
    ran = [e.request[0] for e in device.executions[before:] if e.request[0] != 0x03]
    assert ran == [FunctionCode.WRITE_SINGLE_REGISTER]  # the clear; the trigger did not run again
    assert DeviceJournal.open(journal).done(device.device_id) == {s.key for s in steps}


def reads_of(device: SimulatedDevice) -> list[bytes]:
    return [e.request for e in device.executions
            if e.request[0] in (FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS)]


def test_inproc_read_a_range_and_all_in_contiguous_runs(capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=1)
    t = SimTransport(device)
    before = len(reads_of(device))
    rc, out = run_inproc(["read", "4:6"], t, capsys)
    assert rc == 0
    assert [line.split()[0] for line in out.splitlines()] == ["threshold", "mode", "fan_setpoint"]
    assert len(reads_of(device)) - before == 1  # one run, one request
    before = len(reads_of(device))
    rc, out = run_inproc(["read", "--all", "--json"], t, capsys)
    doc = json.loads(out)
    assert rc == 0 and [r["address"] for r in doc["registers"]] == [s.address for s in DEFAULT_MAP]
    assert doc["values"]["threshold"] == DEFAULT_MAP.named("threshold").default
    # input registers (FC04) and the others (FC03): two runs, two requests
    assert len(reads_of(device)) - before == 2
    rc, out = run_inproc(["read", "0x0:0x2", "threshold", "1"], t, capsys)
    assert [line.split()[0] for line in out.splitlines()] == [
        "temperature", "humidity", "fan_speed", "threshold"]


@pytest.mark.parametrize("refs", [["0x100:0x10F"], ["6:4"], ["a:b"], ["--all", "mode"]])
def test_inproc_read_range_mistakes_are_one_line(refs: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=1)
    with pytest.raises(UserError):
        run_inproc(["read", *refs], SimTransport(device), capsys)
    assert reads_of(device) == []


@pytest.mark.parametrize("mode", [[], ["--modbus-rtu"]])
def test_a_second_sim_on_the_same_flash_dir_is_refused(tmp_path: Path, mode: list[str]) -> None:
    """Two simulators on one flash directory would overwrite each other's configuration and
    count each other's boots: the second is refused, one line, nothing in the directory changed."""
    first = Sim(tmp_path, *mode)
    try:
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        try:
            r = subprocess.run([*CLI, "sim", "--flash-dir", str(tmp_path), *mode],
                               capture_output=True, text=True, timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("the second simulator started serving")
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and "in use by another simulator" in r.stderr, r.stderr
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    finally:
        assert first.stop()[0] == 0
    again = Sim(tmp_path, *mode)  # the lock died with its holder
    assert again.stop()[0] == 0


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe binary", b"[]"])
def test_a_bad_journal_is_one_line_naming_its_path_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    from idemlink.cli import UserError

    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"name": "r", "steps": [{"clear": {"faults": ["fan_stall"]}}]}))
    journal = tmp_path / "j"
    journal.write_bytes(content)
    journal.chmod(0o600)
    device = SimulatedDevice(seed=2)
    with pytest.raises(UserError) as exc:
        run_inproc(["apply", str(plan), "--journal", str(journal)], SimTransport(device), capsys)
    message = str(exc.value)
    assert message.startswith(f"journal {journal}: ") and message.count(str(journal)) == 1, message
    assert "\n" not in message
    assert [e for e in device.executions if e.request[0] != 0x03] == []
