"""The host's bus handle (issue 22 item 3; host/bus.py): per-address handles on one line, one
transaction on the wire at a time, and a circuit breaker that makes a dead device cost only its
own time."""

from __future__ import annotations

import threading

import pytest

from idemlink.device_sim.bus import MASTER, Bus, BusConfig, BusTransport
from idemlink.device_sim.device import BROADCAST_EPOCH, SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.host.bus import Bus as HostBus
from idemlink.host.errors import NoDevice
from idemlink.protocol import device_session
from idemlink.protocol.bus_rules import Breaker, BreakerPolicy, BreakerState
from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status

BAUD = 115200


def line(n: int, dead: tuple[int, ...] = ()) -> tuple[Bus, BusTransport]:
    sim = Bus([SimulatedDevice(seed=200 + a, address=a) for a in range(1, n + 1)],
              BusConfig(baud=BAUD, turnaround=0.001))
    for a in dead:
        sim.set_dead(a)
    return sim, BusTransport(sim)


def test_handles_per_address_with_the_device_api() -> None:
    sim, t = line(4)
    bus = HostBus(t, timeout=0.05)
    assert bus.device(3) is bus.device(3)
    for a in range(1, 5):
        dev = bus.device(a)
        dev.connect()
        assert dev.write({"mode": a % 3}).outcome is Outcome.OK
    assert [bus.device(a).read("mode").values for a in range(1, 5)] == [(1,), (2,), (0,), (1,)]
    assert sim.stats.collisions == 0


def test_one_transaction_on_the_wire_at_a_time() -> None:
    """Commands of one handle run in a list and of several handles from threads: the medium
    never carries two transmissions at once (no collision), every command is OK, and the master
    never has two requests out (sent frames alternate with answers)."""
    sim, t = line(3)
    bus = HostBus(t, timeout=0.05)
    for a in (1, 2, 3):
        bus.device(a).connect()
    dev = bus.device(2)
    results = dev.run([dev.read_command("mode") for _ in range(10)])
    assert all(r.outcome is Outcome.OK for r in results)

    errors: list[BaseException] = []

    def work(a: int) -> None:
        try:
            d = bus.device(a)
            for i in range(5):
                assert d.write({"threshold": 300 + 10 * a + i}).outcome is Outcome.OK
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(a,)) for a in (1, 2, 3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert sim.stats.collisions == 0
    sent = sim.stats.by_sender[MASTER]
    answered = sum(n for s, n in sim.stats.by_sender.items() if s != MASTER)
    assert sent == answered  # one answer per request: none was sent while another was out
    for a in (1, 2, 3):
        assert bus.device(a).read("threshold").values == (300 + 10 * a + 4,)


def test_a_dead_device_ends_not_executed_quickly_and_nothing_is_sent() -> None:
    sim, t = line(3, dead=(2,))
    bus = HostBus(t, timeout=0.02, attempts=3, breaker=BreakerPolicy(failures=1, cooldown=5.0))
    for a in (1, 3):
        bus.device(a).connect()
    with pytest.raises(NoDevice):
        bus.device(2).connect()  # unanswered HELLO: the breaker opens
    assert bus.device(2).breaker.state is BreakerState.OPEN
    sent = sim.stats.by_sender[MASTER]
    start = t.now()
    r = bus.device(2).write({"mode": 1})
    assert (r.outcome, r.status) == (Outcome.NOT_EXECUTED, Status.BREAKER_OPEN)
    assert t.now() == start and sim.stats.by_sender[MASTER] == sent  # nothing sent, no time
    assert bus.device(1).write({"mode": 1}).outcome is Outcome.OK  # the others are served
    # after the cooldown one probe goes out; the device is back: the breaker closes
    sim.set_dead(2, False)
    t.advance(5.0)
    assert bus.device(2).write({"mode": 2}).outcome is Outcome.OK
    assert bus.device(2).breaker.state is BreakerState.CLOSED


def test_a_device_that_dies_mid_session_opens_its_breaker() -> None:
    sim, t = line(2)
    bus = HostBus(t, timeout=0.02, attempts=2, breaker=BreakerPolicy(failures=2, cooldown=1.0))
    d1, d2 = bus.device(1), bus.device(2)
    d1.connect()
    d2.connect()
    sim.set_dead(1)
    outcomes = [d1.read("mode").status for _ in range(4)]
    assert outcomes == [Status.NO_ANSWER, Status.NO_ANSWER, Status.BREAKER_OPEN,
                        Status.BREAKER_OPEN]
    assert d1.breaker.refused == 2 and d2.read("mode").outcome is Outcome.OK


def test_the_breaker_rule() -> None:
    b = Breaker(BreakerPolicy(failures=2, cooldown=1.0))
    assert b.allows(0.0)
    b.record(False, 0.0)
    assert b.state is BreakerState.CLOSED and b.allows(0.1)
    b.record(False, 0.1)
    assert b.state is BreakerState.OPEN and not b.allows(1.0) and b.allows(1.1)
    assert b.state is BreakerState.PROBING
    b.record(False, 1.2)  # a failed probe opens it again at once, for twice as long
    assert b.state is BreakerState.OPEN and not b.allows(3.1) and b.allows(3.2)
    b.record(True, 3.3)
    assert b.state is BreakerState.CLOSED and b.failures == 0 and b.cooldown == 1.0


def test_broadcast_acts_once_returns_after_the_frame_time_and_verify_reads_back() -> None:
    """A broadcast repeated 100 times runs once on each device; each call returns after the
    frame's time and the turnaround (no timeout); its results are UNKNOWN until ``verify``
    reads each device back."""
    sim, t = line(8)
    bus = HostBus(t, timeout=0.05, baud=BAUD, turnaround=0.001)
    for a in range(1, 9):
        bus.device(a).connect()
    start = t.now()
    results = bus.broadcast({"mode": 2})
    took = t.now() - start
    assert {r.status for r in results.values()} == {Status.BROADCAST_SENT}
    assert set(results) == set(range(1, 9))
    assert took <= 40 * 10 / BAUD + 0.001 + 0.001  # frame time + turnaround + 1 ms
    seq = next(iter(results.values())).seq
    again = encode_frame(FrameType.REQUEST, seq, 0, bytes.fromhex("0600050002"), address=0)
    for _ in range(99):  # the same broadcast repeated, as a master re-sends it
        t.write(again)
        t.advance(0.01)
    for a in range(1, 9):
        d = sim.device(a)
        assert [(e.epoch, e.seq) for e in d.executions] == [(BROADCAST_EPOCH, seq)]
    checked = bus.verify(results)
    assert {r.outcome for r in checked.values()} == {Outcome.OK}
    # a second broadcast takes a new number, above the first
    assert next(iter(bus.broadcast({"mode": 1}).values())).seq == seq + 1


def test_verify_says_not_executed_where_the_broadcast_did_not_arrive() -> None:
    sim, t = line(3)
    bus = HostBus(t, timeout=0.02, attempts=2)
    for a in (1, 2, 3):
        bus.device(a).connect()
    sim.reconfigure(2, LinkConfig(frame_loss=1.0))
    results = bus.broadcast({"threshold": 444})
    sim.reconfigure(2, LinkConfig())
    checked = bus.verify(results)
    assert [checked[a].outcome for a in (1, 2, 3)] == [Outcome.OK, Outcome.NOT_EXECUTED,
                                                        Outcome.OK]


def test_a_broadcast_of_what_is_not_set_only_is_refused_before_sending() -> None:
    sim, t = line(2)
    bus = HostBus(t)
    with pytest.raises(LocalProtocolError, match="connect the devices first"):
        bus.broadcast({"mode": 1})
    bus.device(1).connect()
    sent = sim.stats.by_sender[MASTER]
    with pytest.raises(LocalProtocolError):
        bus.broadcast({"self_clean": 1})  # a trigger: refused by the command builder already
    assert sim.stats.by_sender[MASTER] == sent


def test_a_broadcast_outside_the_maps_range_is_refused_before_sending() -> None:
    """Each device refuses a value outside the map's range (ILLEGAL_DATA_VALUE), silently for a
    broadcast: ``mode = 9`` went out and ``verify`` called it NOT_EXECUTED, "sending it again
    is harmless" — again and again, never OK. The host knows the map's range: refused, nothing
    sent (the CLI's ``broadcast`` said REJECTED already; the API did not)."""
    sim, t = line(2)
    bus = HostBus(t)
    for a in (1, 2):
        bus.device(a).connect()
    sent = sim.stats.by_sender[MASTER]
    with pytest.raises(LocalProtocolError, match="mode=9 outside"):
        bus.broadcast({"mode": 9})
    assert sim.stats.by_sender[MASTER] == sent
    assert all(r.outcome is Outcome.OK for r in bus.verify(bus.broadcast({"mode": 2})).values())


def test_a_broadcast_larger_than_a_devices_max_payload_is_refused_before_sending(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The host never sends a request larger than a device's ``max_payload`` (HELLO_REPLY): a
    session's request settles NOT_EXECUTED unsent, and a broadcast, which every device hears, is
    refused before sending when any connected device says it takes less (it went out)."""
    monkeypatch.setattr(device_session, "MAX_PAYLOAD", 8)
    sim, t = line(2)
    bus = HostBus(t, timeout=0.05, baud=BAUD, turnaround=0.001)
    for a in (1, 2):
        bus.device(a).connect()
    sent = sim.stats.by_sender[MASTER]
    with pytest.raises(LocalProtocolError, match=r"device 1: a 12-byte request; the device "
                                                 r"takes at most 8 .*nothing was sent"):
        bus.broadcast({"threshold": 400, "mode": 1, "fan_setpoint": 40})
    assert sim.stats.by_sender[MASTER] == sent
    assert all(not sim.device(a).executions for a in (1, 2))
    results = bus.broadcast({"mode": 2})  # 5 bytes: fits
    assert {r.status for r in results.values()} == {Status.BROADCAST_SENT}
