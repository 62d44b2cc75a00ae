"""Written as a user would: an application that drives a third-party dryer (a plain Modbus RTU
slave with a command register that returns to 0), tested against a simulated one of the same map
with the ``idemlink_plain_slave_factory`` fixture and a map of the user's own (in ``tmp_path``).
The fixture's ground truth (what the slave executed) catches a mutant of the application that
re-sends the command blindly after a lost answer: the command started twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from idemlink.host.rtu_device import RtuDevice
from idemlink.protocol.outcome import Outcome, Status

DRYER = """\
name = "acme-dryer"

[[registers]]
address = 0
name = "temperature"
kind = "input"
type = "i16"
scale = 0.1
unit = "°C"

[[registers]]
address = 1
name = "setpoint"
kind = "holding"
min = 0
max = 900
default = 400

[[registers]]
address = 2
name = "command"
kind = "command"
max = 2
labels = { purge = 1, dry = 2 }

[[registers]]
address = 3
name = "alarms"
kind = "fault"
bits = [{ bit = 0, name = "overheat" }]
"""


# ------------------------------------------------------------------ the user's "application"

def start_purge(dev: RtuDevice) -> str:
    """Start the purge once (the register is read first; 1 written only when it reads 0). A lost
    answer is reported, never re-sent."""
    r = dev.trigger("command")
    if r.outcome is Outcome.UNKNOWN:
        return "unknown"
    if not r.ok:
        return "refused"
    return "started" if r.code == 0 else "already running"


def start_purge_blindly(dev: RtuDevice) -> str:
    """The mutant: writes the command register and, when no answer comes, writes it again."""
    for _ in range(3):
        r = dev.write({"command": 1})
        if r.ok:
            return "started"
        dev.acknowledge_unknown()  # "it was only a timeout"
    return "failed"


def assert_started_once(slave: object, name: str) -> None:
    starts = slave.starts(name)  # type: ignore[attr-defined]
    assert starts == 1, f"{name} started {starts} times"


# ------------------------------------------------------------------ the user's tests

@pytest.fixture
def dryer(tmp_path: Path, idemlink_plain_slave_factory: Callable[..., object]) -> object:
    path = tmp_path / "dryer.toml"
    path.write_text(DRYER, encoding="utf-8")
    return idemlink_plain_slave_factory(regmap=str(path), unit=7)


def test_a_purge_started_twice_from_python_starts_once(dryer: object) -> None:
    dev = dryer.open()  # type: ignore[attr-defined]
    assert start_purge(dev) == "started"
    assert start_purge(dev) == "already running"  # read first: nothing written
    assert_started_once(dryer, "command")
    assert dryer.value("command") == 1  # type: ignore[attr-defined]
    assert len(dryer.writes("command")) == 1  # type: ignore[attr-defined]
    dryer.finish("command")  # type: ignore[attr-defined]
    assert start_purge(dev) == "started"
    assert dryer.starts("command") == 2  # type: ignore[attr-defined]


def test_a_lost_answer_is_unknown_and_the_purge_ran_once(dryer: object) -> None:
    dev = dryer.open()  # type: ignore[attr-defined]
    dryer.drop_answer()  # type: ignore[attr-defined]
    assert start_purge(dev) == "unknown"
    assert_started_once(dryer, "command")
    (write,) = dryer.writes("command")  # type: ignore[attr-defined]
    assert write.fault is not None and write.fault.value == "drop"
    assert [e.kind.name for e in write.effects] == ["TRIGGER_STARTED"]


def test_the_setpoint_is_set_and_a_retried_holding_write_is_harmless(dryer: object) -> None:
    dev = dryer.open()  # type: ignore[attr-defined]
    dryer.drop_answer()  # type: ignore[attr-defined]
    r = dev.write({"setpoint": 450})
    assert r.ok and r.attempts == 2  # retried: a set-only value, twice is once
    assert dryer.value("setpoint") == 450  # type: ignore[attr-defined]
    assert len(dryer.writes("setpoint")) == 2  # type: ignore[attr-defined]


def test_the_alarm_word_is_read_and_cleared(dryer: object) -> None:
    dev = dryer.open()  # type: ignore[attr-defined]
    dryer.set_condition("overheat", True)  # type: ignore[attr-defined]
    assert dev.read("alarms").values == (1,)
    dryer.set_condition("overheat", False)  # type: ignore[attr-defined]
    assert dev.clear_faults(0x0001, "alarms").ok
    assert dev.read("alarms").values == (0,)


@pytest.mark.parametrize("app", [start_purge, start_purge_blindly])
def test_the_ground_truth_catches_an_application_that_resends_a_command(
        tmp_path: Path, idemlink_plain_slave_factory: Callable[..., object],
        app: Callable[[RtuDevice], str]) -> None:
    """A short command (done before any retry could come) whose first answer is lost: the right
    application says UNKNOWN and the purge ran once; the mutant writes again, the dryer purges
    twice, and the ground truth says so."""
    path = tmp_path / "dryer.toml"
    path.write_text(DRYER, encoding="utf-8")
    dryer = idemlink_plain_slave_factory(regmap=str(path), unit=7, command_seconds=0.0)
    dev = dryer.open()  # type: ignore[attr-defined]
    dryer.drop_answer()  # type: ignore[attr-defined]
    said = app(dev)
    if app is start_purge:
        assert said == "unknown"
        assert_started_once(dryer, "command")
    else:
        assert said == "started"  # the mutant believes all went well
        with pytest.raises(AssertionError, match="started 2 times"):
            assert_started_once(dryer, "command")


def test_a_differing_echo_is_said_as_such(dryer: object) -> None:
    dev = dryer.open()  # type: ignore[attr-defined]
    dryer.echo_differs()  # type: ignore[attr-defined]
    r = dev.write({"command": 2})
    assert r.outcome is Outcome.UNKNOWN and r.status is Status.ANSWER_MISMATCH
    assert "wrote 0x0002, echo 0x0006" in r.describe()
    assert dryer.starts("command") == 1  # type: ignore[attr-defined]
