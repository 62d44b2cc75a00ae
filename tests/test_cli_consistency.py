"""One representation of a reading, one format, honest counts across the CLI's commands.

Each command runs in process against the simulator on a pty; what a new user compares side by
side (text of ``read`` and ``faults``, JSON of ``read``/``watch``/``trigger``, CSV of ``watch``,
``write`` and ``apply``'s echoes) must say the same thing the same way."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from idemlink.cli import main
from idemlink.pytest_plugin import PtySim, start_pty_sim

pytestmark = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pty")


@pytest.fixture
def sim() -> Iterator[PtySim]:
    s = start_pty_sim()
    try:
        yield s
    finally:
        s.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def json_docs(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_a_trigger_state_is_its_label_in_every_json(sim: PtySim,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    p = ("--port", sim.path)
    assert cli(capsys, "trigger", *p)[0] == 0
    rc, out, _ = cli(capsys, "read", *p, "self_clean", "--json")
    assert rc == 0
    states = {0: "IDLE", 1: "RUNNING", 2: "DONE"}  # it may finish (2 s) while this runs
    [reading] = json_docs(out)[0]["registers"]
    assert reading["raw"] in (1, 2) and reading["label"] == states[reading["raw"]]
    rc, out, _ = cli(capsys, "trigger", *p, "--status", "--json")
    reading = json_docs(out)[0]["registers"][0]
    assert reading["label"] == states[reading["raw"]]
    rc, out, _ = cli(capsys, "watch", *p, "self_clean", "--count", "1", "--interval", "0.01",
                     "--json")
    reading = json_docs(out)[0]
    assert reading["label"] == states[reading["raw"]]


def test_watch_csv_has_the_json_readings_columns(sim: PtySim,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    p = ("--port", sim.path, "--count", "1", "--interval", "0.01", "mode", "threshold")
    assert cli(capsys, "write", "--port", sim.path, "mode=2")[0] == 0
    rc, out, _ = cli(capsys, "watch", *p, "--csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    rc, out, _ = cli(capsys, "watch", *p, "--json")
    docs = json_docs(out)
    assert len(rows) == len(docs) == 2
    for row, doc in zip(rows, docs, strict=True):
        assert set(row) == set(doc) - {"schema"}
        for key in ("name", "address", "raw", "value", "label", "unit", "outcome"):
            assert row[key] == ("" if doc[key] is None else str(doc[key])), key
    mode = next(r for r in rows if r["name"] == "mode")
    assert (mode["value"], mode["label"]) == ("2", "manual")


def test_watch_counts_changes_and_port_failures_truthfully(
        sim: PtySim, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    rc, _, err = cli(capsys, "watch", "--port", sim.path, "--every", "--count", "2",
                     "--interval", "0.01", "mode", "threshold", "fan_setpoint")
    assert rc == 0
    assert "2 poll(s), 0 change(s), readings: 6 OK, 0 NOT_EXECUTED, 0 REJECTED, 0 UNKNOWN;" in err
    rc, _, err = cli(capsys, "watch", "--port", str(tmp_path / "gone"), "--count", "2",
                     "--interval", "0.01", "mode")
    assert rc == 1
    assert "readings: 0 OK, 0 NOT_EXECUTED, 0 REJECTED, 0 UNKNOWN;" in err
    assert "2 poll(s) without the device" in err


def test_the_boot_epoch_is_one_json_integer_everywhere(
        sim: PtySim, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    trace = tmp_path / "trace.jsonl"
    rc, out, _ = cli(capsys, "info", "--port", sim.path, "--json")
    assert rc == 0
    assert cli(capsys, "read", "--port", sim.path, "mode", "--trace", str(trace))[0] == 0
    epoch = json_docs(out)[0]["epoch"]
    assert epoch == sim.device.epoch
    frames = [json.loads(line) for line in trace.read_text("utf-8").splitlines()]
    assert frames and all(isinstance(f["epoch"], int) for f in frames)
    assert {f["epoch"] for f in frames if f["type"] != "HELLO"} == {epoch}  # HELLO carries 0
    rc, out, _ = cli(capsys, "info", "--port", sim.path)
    assert f"0x{epoch:08x}" in out  # text shows it in hex


class PlainSlave:
    """A plain Modbus RTU slave on a pty (as a generic pymodbus one): FC03 reads and FC06 writes
    of ordinary holding registers, exception 01 for any other function (the FC04 probe of the
    map's first register, an input, included) — a fault word is not write-1-to-clear, a trigger
    is a stored word."""

    def __init__(self, words: dict[int, int]) -> None:
        import threading

        from idemlink.device_sim.pty import open_pty

        self.words = dict(words)
        self.writes: list[tuple[int, int]] = []
        self.pair = open_pty()
        self.path = self.pair.slave_path
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        from idemlink.protocol.modbus_rtu import encode_rtu

        link = self.pair.transport()
        buf = b""
        while not self.stop.is_set():
            buf += link.read(0.02)
            while len(buf) >= 8:
                frame, buf = buf[:8], buf[8:]
                fc, a, v = frame[1], int.from_bytes(frame[2:4], "big"), int.from_bytes(frame[4:6], "big")
                if fc == 3:
                    data = b"".join(self.words.get(a + i, 0).to_bytes(2, "big") for i in range(v))
                    link.write(encode_rtu(frame[0], bytes([3, len(data)]) + data))
                elif fc == 6:
                    self.words[a] = v
                    self.writes.append((a, v))
                    link.write(encode_rtu(frame[0], frame[1:6]))
                else:  # a function it lacks: exception 01, as the Modbus spec has a slave answer
                    link.write(encode_rtu(frame[0], bytes([fc | 0x80, 1])))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pair.close()


@pytest.fixture
def plain() -> Iterator[PlainSlave]:
    s = PlainSlave({7: 0x0005, 8: 1})  # faults: over_temperature + fan_stall; self_clean RUNNING
    try:
        yield s
    finally:
        s.close()


def test_clear_on_a_plain_slave_reports_what_it_holds(
        plain: PlainSlave, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "clear", "over_temperature", "--port", plain.path, "--modbus-rtu")
    assert rc == 0 and plain.words[7] == 0x0001
    assert "still latched: the condition persists" not in out
    assert "fan_stall changed 1→0: this device does not treat the word as write-1-to-clear" in out
    assert "over_temperature reads 1: the device stored the 1 written" in out


def test_clear_on_a_w1c_device_says_the_condition_persists(
        sim: PtySim, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "write", "--port", sim.path, "threshold=20.0")[0] == 0  # latches a fault
    rc, out, _ = cli(capsys, "clear", "over_temperature", "--port", sim.path, "--json")
    doc = json_docs(out)[0]
    assert rc == 0 and doc["notes"] == ["over_temperature still latched: the condition persists"]
    assert "changed" not in out


def test_clear_of_an_undeclared_bit_is_refused_locally(
        plain: PlainSlave, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, "clear", "--mask", "0x8", "--port", plain.path, "--modbus-rtu")
    assert rc == 4 and plain.writes == [] and err == ""
    assert out.splitlines() == ["REJECTED (checked against the register map, nothing sent): "
                                "faults: bits 0x0008 not declared (bits: 0 over_temperature, "
                                "1 sensor_fault, 2 fan_stall)"]


def test_rtu_trigger_reads_first_sends_nothing_when_running_and_says_it_as_a_framed_device(
        plain: PlainSlave, capsys: pytest.CaptureFixture[str]) -> None:
    rtu = ("self_clean", "--port", plain.path, "--modbus-rtu")
    rc, out, _ = cli(capsys, "trigger", *rtu)
    assert rc == 0 and plain.writes == []
    assert out == "self_clean: RUNNING (0x0101): already running: nothing started\n"
    rc, out, _ = cli(capsys, "trigger", *rtu, "--json")
    doc = json_docs(out)[0]
    assert (doc["outcome"], doc["code"], doc["code_name"]) == ("OK", 0x0101, "RUNNING")
    plain.words[8] = 0
    rc, out, _ = cli(capsys, "trigger", *rtu)
    assert rc == 0 and plain.writes == [(8, 1)] and out == "self_clean: ACCEPTED (0x0000): started\n"


def test_fault_words_show_one_way(plain: PlainSlave, capsys: pytest.CaptureFixture[str]) -> None:
    rtu = ("--port", plain.path, "--modbus-rtu")
    read = cli(capsys, "read", "faults", *rtu)[1]
    faults = cli(capsys, "faults", *rtu)[1]
    assert read == faults == "faults = 0x0005 over_temperature fan_stall\n"


def test_apply_speaks_like_write_and_lists_registers(
        sim: PtySim, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [{"write": {"threshold": "30.0", "mode": 2}},
                                          {"trigger": "self_clean"}, {"trigger": "self_clean"},
                                          {"write": {"fan_setpoint": 80}}]}))
    assert cli(capsys, "trigger", "--port", sim.path)[0] == 0  # RUNNING: the step will not start
    write_echo = cli(capsys, "write", "--port", sim.path, "threshold=30.0", "mode=2")[1]
    assert write_echo.startswith("threshold=300 (30.0 °C) mode=2 (manual)")
    assert cli(capsys, "write", "--port", sim.path, "mode=1")[0] == 0
    rc, out, _ = cli(capsys, "apply", "--port", sim.path, str(plan))
    assert rc == 3
    assert out.splitlines()[0].startswith("step 1/4 threshold=300 (30.0 °C) mode=2 (manual): ")
    rc, out, _ = cli(capsys, "apply", "--port", sim.path, str(plan), "--json")
    steps = json_docs(out)[0]["steps"]
    assert [s["state"] for s in steps] == ["in_place", "not_executed", "not_run", "not_run"]
    assert [(r["name"], r["raw"], r["label"]) for r in steps[0]["registers"]] == [
        ("threshold", 300, None), ("mode", 2, "manual")]
    trigger = steps[1]
    assert trigger["result"]["outcome"] == "NOT_EXECUTED" and trigger["result"]["attempts"] == 0
    assert trigger["registers"][0]["label"] in ("RUNNING", "DONE")


def test_apply_json_lists_what_a_write_step_wrote(
        sim: PtySim, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [{"write": {"threshold": "30.0", "mode": "Manual"}}]}))
    rc, out, _ = cli(capsys, "apply", "--port", sim.path, str(plan), "--json")
    [step] = json_docs(out)[0]["steps"]
    assert rc == 0 and step["state"] == "written" and step["written"] == {"threshold": 300,
                                                                           "mode": 2}
    assert [(r["name"], r["value"], r["label"], r["outcome"]) for r in step["registers"]] == [
        ("threshold", 30.0, None, "OK"), ("mode", 2, "manual", "OK")]


def test_labels_are_case_insensitive_when_unambiguous(sim: PtySim,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.protocol.registers import RegisterKind, RegisterSpec

    rc, out, _ = cli(capsys, "write", "--port", sim.path, "mode=MANUAL")
    assert rc == 0 and out.startswith("mode=2 (manual)")
    spec = RegisterSpec(address=1, name="m", kind=RegisterKind.HOLDING, maximum=3,
                        labels=((1, "eco"), (2, "Eco")))
    assert spec.raw_from_text("Eco") == 2 and spec.raw_from_text("eco") == 1
    with pytest.raises(ValueError, match="ambiguous"):
        spec.raw_from_text("ECO")


def test_an_unknown_trigger_reads_back_as_its_state_name() -> None:
    from idemlink.host.command import Command, CommandKind, judge_read_back
    from idemlink.protocol.registers import RegisterSpec
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    c = Command(CommandKind.TRIGGER, DEFAULT_MAP.named("self_clean").address)
    def spec(address: int) -> RegisterSpec:
        found = DEFAULT_MAP.at(address)
        assert found is not None
        return found

    rec = judge_read_back(c, (0,), 3, spec)
    assert rec.summary == "trigger state IDLE"


def receive_once(capsys: pytest.CaptureFixture[str], source: Any, out_dir: Any,
                 *extra: str) -> tuple[int, str, bool]:
    """``idemlink receive`` of ``source`` sent by the YMODEM sender over a link proxy: (exit,
    stdout, the sender's batch complete)."""
    import threading

    import serial

    from idemlink.device_sim.link import LinkConfig
    from idemlink.device_sim.link_proxy import LinkProxy
    from idemlink.host.ymodem_io import send_files

    proxy = LinkProxy(None, None, LinkConfig())
    sent: list[bool] = []
    with proxy:
        thread = threading.Thread(target=proxy.serve, daemon=True)
        thread.start()
        sender_port = serial.serial_for_url(proxy.b_path, timeout=0.002)
        t = threading.Thread(target=lambda: sent.append(send_files(sender_port,
                                                                    [str(source)]).ok),
                             daemon=True)
        t.start()
        try:
            rc, out, _ = cli(capsys, "receive", "--port", proxy.a_path, "--dir", str(out_dir),
                             "--idle-timeout", "10", "--no-progress", *extra)
        finally:
            t.join(timeout=10)
            sender_port.close()
            proxy.stop()
            thread.join(timeout=5)
    return rc, out, bool(sent and sent[0])


def test_receive_accepts_an_identical_resend(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Any) -> None:
    source = tmp_path / "fw.bin"
    source.write_bytes(bytes(range(256)) * 9)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    assert receive_once(capsys, source, inbox)[0] == 0
    rc, out, sender_ok = receive_once(capsys, source, inbox)
    assert rc == 0 and sender_ok
    assert out.splitlines()[0] == "fw.bin: already there, identical (2304 bytes): the existing file kept"
    rc, out, sender_ok = receive_once(capsys, source, inbox, "--json")
    doc = json_docs(out)[0]
    assert rc == 0 and sender_ok and doc["files"][0]["identical"] is True and doc["complete"]
    source.write_bytes(bytes(2304))  # same size, other bytes: still needs --overwrite
    rc, out, sender_ok = receive_once(capsys, source, inbox)
    assert rc == 1 and not sender_ok and "exists (use --overwrite)" in out
    assert (inbox / "fw.bin").read_bytes() == bytes(range(256)) * 9
