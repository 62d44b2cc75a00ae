"""``idemlink apply --modbus-rtu``: a plan applied to a standard Modbus RTU slave. Set-only steps
converge by read-back; a trigger or fault clear is sent once, UNKNOWN without an answer, never
retried; the next run reads it back and, a plain slave keeping no record of what it ran, leaves it
UNKNOWN until settled by hand (``--resolve``); what a plain slave cannot do is refused before sending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.rtu import TRIG, LossyWire, writes_to

from idemlink.cli import UserError, build_parser, main
from idemlink.host.journal import DeviceJournal
from idemlink.host.rtu_device import RtuDevice
from idemlink.protocol.device_core import EffectKind
from idemlink.protocol.modbus import FunctionCode


def plan_file(tmp_path: Path, *steps: dict[str, object]) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"name": "rtu", "steps": list(steps)}))
    return p


def apply(wire: LossyWire, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["apply", "--modbus-rtu", *argv])
    args.open_device = lambda: RtuDevice(wire, timeout=0.1, attempts=5)
    rc = args.handler(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_set_only_steps_converge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wire = LossyWire(lambda p, n: p[0] == FunctionCode.WRITE_MULTIPLE_REGISTERS and n <= 2)
    plan = plan_file(tmp_path, {"write": {"threshold": "40.0", "mode": 2}},
                     {"write": {"fan_setpoint": 80}})
    rc, out, _ = apply(wire, capsys, str(plan))
    assert rc == 0, out
    assert wire.core.read(4, 3) == (400, 2, 80)
    rc, out, _ = apply(wire, capsys, str(plan))
    assert rc == 0 and out.count("already in place") == 2
    assert not (tmp_path / "plan.json.journal").exists()  # set-only: no journal


def test_a_trigger_without_answer_is_unknown_sent_once_then_read_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lose = writes_to(TRIG)
    wire = LossyWire(lambda p, n: lose(p, n) and not answers.get("trigger", False))
    answers: dict[str, bool] = {}
    plan = plan_file(tmp_path, {"trigger": "self_clean"})
    rc, out, _ = apply(wire, capsys, str(plan), "--device-id", "pump-7")
    assert rc == 5 and "unknown" in out
    trigger_writes = [r for r in wire.requests if r[1:2] == bytes([FunctionCode.WRITE_SINGLE_REGISTER])
                      and r[2:4] == TRIG.to_bytes(2, "big")]
    assert len(trigger_writes) == 1  # never retried
    assert wire.core.count(EffectKind.TRIGGER_STARTED) == 1
    journal = DeviceJournal.open(tmp_path / "plan.json.journal")
    assert journal.pending("pump-7")
    answers["trigger"] = True
    # A plain slave keeps no record of what it ran: a RUNNING trigger may have been started by
    # anyone, so the read-back is said as what holds now and the step stays UNKNOWN.
    rc, out, _ = apply(wire, capsys, str(plan), "--device-id", "pump-7")
    assert rc == 5, out
    assert "read back: trigger state RUNNING; whether this step ran is unknown" in out, out
    assert "was in flight; asked" not in out and "receipted" not in out
    assert wire.core.count(EffectKind.TRIGGER_STARTED) == 1  # not run again
    (key,) = DeviceJournal.open(tmp_path / "plan.json.journal").pending("pump-7")
    rc, out, _ = apply(wire, capsys, str(plan), "--resolve", str(key), "--executed")
    assert rc == 0, out
    rc, out, _ = apply(wire, capsys, str(plan), "--device-id", "pump-7")
    assert rc == 0 and "skipped" in out, out
    assert wire.core.count(EffectKind.TRIGGER_STARTED) == 1


@pytest.mark.parametrize(("steps", "extra", "why"), [
    ([{"trigger": "self_clean"}], [], "--device-id"),
    ([{"write_if_generation": {"fan_setpoint": 90}}], ["--device-id", "x"], "0x41"),
])
def test_what_a_plain_slave_cannot_do_is_refused_before_sending(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], steps: list[dict[str, object]],
        extra: list[str], why: str) -> None:
    wire = LossyWire(lambda p, n: False)
    with pytest.raises(UserError, match=why):  # one line on stderr, exit 1 (idemlink.cli.main)
        apply(wire, capsys, str(plan_file(tmp_path, *steps)), *extra)
    assert wire.requests == []


def test_device_id_needs_modbus_rtu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_file(tmp_path, {"write": {"mode": 2}})
    assert main(["apply", str(plan), "--port", "loop://", "--device-id", "x"]) == 1
    assert "needs --modbus-rtu" in capsys.readouterr().err
