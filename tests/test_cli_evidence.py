"""A command line's UNKNOWN settled by the device's own evidence, in every place a user sees it.

When every attempt of a command that may have had an effect went unanswered, the command asks
the device by re-sending the same request under its own number (docs/DESIGN.md, "Reconcile by
evidence"). Ground truth is the simulated device's execution log: the exit code, the JSON
``outcome`` and the text line follow the device's answer, and nothing ever runs twice.
"""

from __future__ import annotations

import json

import pytest

from idemlink.cli import build_parser
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.protocol.frame import Frame, decode_frames


class AnswersLostForFirstSends(SimTransport):
    """Loses the device's answers while the first ``lost`` copies of requests of function
    ``fc`` are on the line; later copies (the re-send under the same number) are answered."""

    def __init__(self, device: SimulatedDevice, fc: int, lost: int) -> None:
        super().__init__(device)
        self.fc, self.lost, self.seen = fc, lost, 0

    def write(self, data: bytes) -> None:
        for f in decode_frames(data):
            if isinstance(f, Frame) and f.payload[:1] == bytes([self.fc]):
                self.seen += 1
                self.drop_answers = self.seen <= self.lost
        super().write(data)


def run(argv: list[str], t: SimTransport, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    args = build_parser().parse_args([*argv, "--json"])

    def opener() -> Device:
        dev = Device(t, attempts=3, timeout=0.05)
        dev.connect()
        return dev

    args.open_device = opener
    rc = args.handler(args)
    return rc, json.loads(capsys.readouterr().out)


def starts(device: SimulatedDevice) -> int:
    return sum(e.request[:1] == b"\x42" and e.request[-1:] == b"\x01" for e in device.executions)


def test_a_trigger_whose_answers_were_lost_is_settled_ok_by_the_replayed_answer(
        capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=31, trigger_duration=5.0)
    t = AnswersLostForFirstSends(device, 0x42, lost=3)  # every attempt of the command
    rc, doc = run(["trigger"], t, capsys)
    assert starts(device) == 1  # it ran once, the first time
    assert doc["reconcile"]["executed"] is True
    assert "replayed its answer" in doc["reconcile"]["evidence"]
    assert doc["outcome"] == "OK" and doc["settled_by"] == "evidence" and rc == 0


class RequestsLostForFirstSends(SimTransport):
    """Loses the first ``lost`` copies of requests of function ``fc`` on their way to the
    device; later copies (the re-send under the same number) arrive."""

    def __init__(self, device: SimulatedDevice, fc: int, lost: int) -> None:
        super().__init__(device)
        self.fc, self.lost, self.seen = fc, lost, 0

    def write(self, data: bytes) -> None:
        if any(isinstance(f, Frame) and f.payload[:1] == bytes([self.fc])
               for f in decode_frames(data)):
            self.seen += 1
            if self.seen <= self.lost:
                return
        super().write(data)


def test_a_trigger_that_never_arrived_runs_once_on_the_re_send_and_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=32, trigger_duration=5.0)
    t = RequestsLostForFirstSends(device, 0x42, lost=3)  # none of the command's attempts
    rc, doc = run(["trigger"], t, capsys)
    assert starts(device) == 1
    assert doc["reconcile"]["executed"] is True and "ran now, once" in doc["reconcile"]["evidence"]
    assert rc == 0 and doc["outcome"] == "OK"


def test_without_evidence_the_exit_stays_5(capsys: pytest.CaptureFixture[str]) -> None:
    device = SimulatedDevice(seed=33, trigger_duration=5.0)
    t = AnswersLostForFirstSends(device, 0x42, lost=10**6)  # the re-send's answers lost too
    rc, doc = run(["trigger"], t, capsys)
    assert rc == 5 and doc["outcome"] == "UNKNOWN" and "settled_by" not in doc
    assert doc["reconcile"]["executed"] is None
    assert starts(device) == 1
