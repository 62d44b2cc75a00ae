"""Bounded exhaustive exploration of the authenticated HELLO (``idemlink.explore_auth``, issue
23): every schedule of loss, duplication, reorder, delay, a device reboot and a stripped copy,
through the real keyed sessions — no frame of an older session accepted, nothing executed
without a valid tag, the session converges. The default suite explores one fault; ``--run-slow``
two (docs/SOAK.md gives the counts)."""

from __future__ import annotations

import dataclasses
import os
import struct

import pytest

from idemlink.explore_auth import KEY, explore_auth
from idemlink.protocol.auth import DeviceAuth, DeviceKeys, HostAuth
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import Frame
from idemlink.protocol.host_session import (
    Completion,
    HostSession,
    SessionOpened,
    SessionState,
)
from idemlink.protocol.outcome import Outcome


def test_every_schedule_of_one_fault_keeps_the_authenticated_promise() -> None:
    r = explore_auth(1)
    assert r.violations == []
    assert r.states > 150 and r.schedules > 15


def test_the_explorer_finds_a_device_that_runs_a_stripped_frame(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = DeviceSession._handle_frame

    def trusting(self: DeviceSession, frame: Frame, now: float) -> bytes:
        return real(self, dataclasses.replace(frame, verified=True), now)

    monkeypatch.setattr(DeviceSession, "_handle_frame", trusting)
    r = explore_auth(1, reboots=0)
    assert "UNSIGNED-EXECUTED" in r.kinds()
    _, schedule = next(v for v in r.violations if v[0].startswith("UNSIGNED-EXECUTED"))
    assert any(step.startswith("STRIP") for step in schedule)


def _keyed_device(epoch: int) -> DeviceSession:
    return DeviceSession(lambda pdu, now, seq: b"\x06" + pdu[1:], epoch,
                         contract_hash=contract_hash(), device_id="dev-1", map_hash=b"m" * 8,
                         auth=DeviceAuth(DeviceKeys((KEY,)), os.urandom))


def _straddled() -> tuple[HostSession, DeviceSession, bytes]:
    """The device answered two copies of one HELLO, one per boot, each with its own nonce; the
    host took the first boot's reply. Returns the host, the rebooted device and its reply."""
    host = HostSession(contract_hash=contract_hash(), timeout=1.0, attempts=2,
                       hello_attempts=3, auth=HostAuth(KEY, os.urandom))
    host.open(0.0)
    hello = host.data_to_send()
    before = _keyed_device(1)
    before.receive_data(hello, 0.0)
    after = _keyed_device(2)  # the device rebooted; the HELLO's retransmission reaches it
    after.receive_data(hello, 0.1)
    host.receive_data(before.data_to_send(), 0.2)
    assert isinstance(host.next_event(), SessionOpened) and host.epoch == 1
    return host, after, after.data_to_send()


def _write_goes_through(host: HostSession, dev: DeviceSession, now: float) -> None:
    dev.receive_data(host.data_to_send(), now)  # the probe HELLO
    host.receive_data(dev.data_to_send(), now)
    assert isinstance(host.next_event(), SessionOpened) and host.epoch == 2
    host.submit(struct.pack(">BHH", 6, 4, 400), now, set_only=True, tag="w")
    dev.receive_data(host.data_to_send(), now)
    host.receive_data(dev.data_to_send(), now)
    done = host.next_event()
    assert isinstance(done, Completion) and done.outcome is Outcome.OK


def test_a_second_reply_from_another_boot_makes_a_keyed_host_probe_with_a_fresh_hello() -> None:
    """What the explorer found: the device holds the second reply's key and drops the host's
    frames silently (no EPOCH_MISMATCH hint: it has a session key). The second reply makes the
    host send a fresh HELLO, and the write goes through."""
    host, dev, second = _straddled()
    host.receive_data(second, 0.3)
    assert host.state is SessionState.OPEN  # the session stays usable; a probe HELLO is out
    _write_goes_through(host, dev, 0.4)


def test_when_that_reply_is_lost_the_first_unanswered_request_probes() -> None:
    host, dev, _lost = _straddled()
    host.submit(struct.pack(">BHH", 6, 4, 1), 0.3, set_only=True, tag="first")
    for t in (0.3, 1.3):  # sent, then retried: both fail the device's MAC, silently
        dev.receive_data(host.data_to_send(), t)
        assert dev.data_to_send() == b""
        host.tick(t + 1.0)
    done = host.next_event()
    assert isinstance(done, Completion) and done.outcome is Outcome.UNKNOWN
    _write_goes_through(host, dev, 3.0)


@pytest.mark.slow
def test_every_schedule_of_two_faults_keeps_the_authenticated_promise() -> None:
    r = explore_auth(2)
    assert r.violations == []
    assert r.states > 2500 and r.schedules > 250


def test_a_probe_answered_by_another_board_closes_the_session() -> None:
    """The re-key probe checks who answers, as a re-handshake does: another board in this one's
    place gets nothing more, and what was in flight is UNKNOWN."""
    host = HostSession(contract_hash=contract_hash(), timeout=1.0, attempts=1,
                       hello_attempts=3, auth=HostAuth(KEY, os.urandom))
    host.open(0.0)
    first = _keyed_device(1)
    first.receive_data(host.data_to_send(), 0.0)
    host.receive_data(first.data_to_send(), 0.0)
    assert isinstance(host.next_event(), SessionOpened)
    host.submit(struct.pack(">BHH", 6, 4, 1), 0.1, set_only=True, tag="lost")
    host.data_to_send()  # lost on the line
    host.tick(1.2)  # unanswered: UNKNOWN, and the probe goes out
    assert isinstance(host.next_event(), Completion)
    other = DeviceSession(lambda pdu, now, seq: pdu, 9, contract_hash=contract_hash(),
                          device_id="dev-2", map_hash=b"m" * 8,
                          auth=DeviceAuth(DeviceKeys((KEY,)), os.urandom))
    other.receive_data(host.data_to_send(), 1.3)
    host.receive_data(other.data_to_send(), 1.3)
    assert host.state is SessionState.CLOSED and host.gone is not None
    assert "dev-2" in host.gone
