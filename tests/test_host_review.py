"""Regression tests for the host-driver review (/tmp/review_host): each reproduces a finding.

- a transport error mid-command settles the request as UNKNOWN/LINK_LOST and blocks the handle;
- an interrupted command (Ctrl-C, asyncio cancellation) leaves nothing in the session;
- ``run()`` before ``connect()`` raises instead of polling forever;
- ``--timeout nan|inf|1e300`` and ``monitor --seconds nan`` are user errors;
- ``apply`` names a pending journal key that the edited plan no longer has, and ``--resolve``
  settles it;
- every UNKNOWN command of a ``write`` is read back, and ``apply`` reads back its UNKNOWN step.

The simulated device's execution log is the ground truth throughout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from device_sim.device import SimulatedDevice
from device_sim.simlink import SimTransport
from host.cli import UserError, build_parser
from host.device import Device
from protocol.outcome import LocalProtocolError


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
    assert sim.device.executions == []
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
