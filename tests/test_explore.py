"""Bounded exhaustive exploration (``idemlink.explore``): every schedule of loss, duplication,
delay and reorder (and a device reboot) up to a depth, through the real sans-I/O machines.
The default suite explores two faults; ``--run-slow`` three (docs/SOAK.md gives the counts)."""

from __future__ import annotations

import pytest

from idemlink.explore import BUS_RESIDUAL, explore_bus, explore_sessions, explore_ymodem
from idemlink.protocol.frame import Frame
from idemlink.protocol.window import ReplayWindow, Verdict
from idemlink.protocol.ymodem_tables import RX_TRANSITIONS, RxAction, RxIn, RxState

#: What YMODEM cannot tell apart (docs/YMODEM.md, "residual limit"): a late copy of an ACK 'C'
#: that is byte for byte the commit's proof. It may make a false ok, never anything else.
RESIDUAL = {"SENDER-OK-NOT-COMMITTED", "SENDER-DONE-BUT-MISSING"}


def test_ymodem_every_schedule_of_two_faults_around_eot_commits_once_or_aborts_cleanly() -> None:
    r = explore_ymodem(2)
    assert r.violations == []
    assert r.states > 4000 and r.schedules > 100


def test_sessions_every_schedule_of_two_faults_or_a_reboot_keeps_the_promise() -> None:
    r = explore_sessions(2)
    assert r.violations == []
    assert r.states > 1500 and r.schedules > 150


def test_the_explorer_finds_a_receiver_that_commits_a_repeated_eot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(RX_TRANSITIONS, (RxState.WAIT_NEXT_HEADER, RxIn.EOT),
                        (RxState.WAIT_NEXT_HEADER, RxAction.COMMIT))
    r = explore_ymodem(1)
    assert "COMMITTED-TWICE" in r.kinds()
    _, schedule = next(v for v in r.violations if v[0].startswith("COMMITTED-TWICE"))
    assert any(step.startswith(("DUP", "DELAY")) for step in schedule)


def test_the_explorer_finds_a_device_that_forgets_its_replay_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = ReplayWindow.check

    def forgetful(self: ReplayWindow, seq: int) -> Verdict:
        v = real(self, seq)
        return Verdict.ACCEPT_OLD if v is Verdict.DUPLICATE else v

    monkeypatch.setattr(ReplayWindow, "check", forgetful)
    r = explore_sessions(1, reboots=0)
    assert "DUPLICATED-EFFECT" in r.kinds()


def test_a_bus_of_two_devices_with_a_broadcast_and_a_reboot_keeps_the_promise() -> None:
    """Two devices, a write to one and a trigger to the other, one broadcast verified by a
    read-back on each, every schedule of one fault (loss, duplication, reorder, delay, or a
    reboot of either device)."""
    r = explore_bus(1)
    assert r.violations == []
    assert r.states > 700 and r.schedules > 40


def test_the_bus_explorer_finds_a_device_that_runs_every_copy_of_a_broadcast(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from idemlink.protocol.device_session import DeviceSession

    real = DeviceSession._broadcast

    def forgetful(self: DeviceSession, frame: Frame, now: float) -> str:
        self.broadcast_window = ReplayWindow(self.broadcast_window.ring_bits)
        return real(self, frame, now)

    monkeypatch.setattr(DeviceSession, "_broadcast", forgetful)
    r = explore_bus(1, reboots=0)
    assert "DUPLICATED-EFFECT" in r.kinds()
    _, schedule = next(v for v in r.violations if v[0].startswith("DUPLICATED-EFFECT"))
    assert any(step.startswith("DUP host>") for step in schedule)


@pytest.mark.slow
def test_a_bus_with_two_faults_leaves_only_the_documented_residual() -> None:
    r = explore_bus(2)
    assert set(r.kinds()) <= BUS_RESIDUAL, r.violations[:3]
    assert r.states > 20_000


@pytest.mark.slow
def test_ymodem_three_faults_leave_only_the_documented_residual() -> None:
    r = explore_ymodem(3)
    assert set(r.kinds()) <= RESIDUAL, r.violations[:3]
    assert r.states > 40_000


@pytest.mark.slow
def test_sessions_three_faults_keep_the_promise() -> None:
    r = explore_sessions(3)
    assert r.violations == []
