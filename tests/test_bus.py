"""The simulated half-duplex bus (issue 22 item 2; device_sim/bus.py, docs/BUS.md).

A host talks to devices 1..N through one medium; only the addressed device answers; a
collision loses both frames and the outcomes stay honest; a broadcast reaches every device once;
the master's echo and the turnaround are what the configuration says; faults are per device.
"""

from __future__ import annotations

import pytest

from idemlink.device_sim.bus import MASTER, Bus, BusConfig, BusError, BusTransport
from idemlink.device_sim.device import BROADCAST_EPOCH, SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.host.device import Device
from idemlink.host.errors import NoDevice
from idemlink.protocol.frame import Frame, FrameType, decode_frames, encode_frame
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.payloads import DeviceInfo

MODE = 0x0005
BAUD = 115200
BYTE = 10 / BAUD


def devices(n: int, first: int = 1) -> list[SimulatedDevice]:
    return [SimulatedDevice(seed=100 + a, address=a) for a in range(first, first + n)]


def hosts(t: BusTransport, addresses: range, **kw: float) -> dict[int, Device]:
    out = {a: Device(t, timeout=kw.get("timeout", 0.05), attempts=int(kw.get("attempts", 5)),
                     max_inflight=1, address=a) for a in addresses}
    for h in out.values():
        h.connect()
    return out


def test_a_host_talks_to_eight_devices_through_one_medium() -> None:
    devs = devices(8)
    bus = Bus(devs, BusConfig(baud=BAUD, turnaround=0.001))
    t = BusTransport(bus)
    hs = hosts(t, range(1, 9))
    epochs = {h.session.epoch for h in hs.values()}
    assert len(epochs) == 8  # eight boots, eight sessions
    for a, h in hs.items():
        assert h.write({"mode": a % 3}).outcome is Outcome.OK
    for a, h in hs.items():
        assert h.read("mode").values == (a % 3,)
    for d in devs:  # every device heard every frame, answered only its own
        assert d.core.read(MODE, 1) == ((d.address or 0) % 3,)
        assert d.session.counters["executed"] == 2 and d.session.counters["hello"] == 1
        assert d.session.counters["other_address"] > 0
    assert bus.stats.collisions == 0
    assert bus.stats.by_sender[MASTER] == sum(bus.stats.by_sender[a] for a in range(1, 9))


def test_the_turnaround_and_the_frame_times_are_the_configured_ones() -> None:
    bus = Bus(devices(1, 7), BusConfig(baud=BAUD, turnaround=0.003))
    hello = encode_frame(FrameType.HELLO, 1, 0, b"", address=7)
    bus.receive_data(hello, 0.0)
    req_end = len(hello) * BYTE
    bus.tick(req_end + 0.003 - 1e-9)
    assert bus.data_to_send() == b""  # the device waits out its turnaround
    nxt = bus.next_event_time()
    assert nxt == pytest.approx(req_end + 0.003)
    bus.tick(nxt)  # its answer starts; it is heard after its last byte
    assert bus.data_to_send() == b""
    end = bus.next_event_time()
    assert end is not None
    bus.tick(end)
    reply = bus.data_to_send()
    assert end == pytest.approx(req_end + 0.003 + len(reply) * BYTE)
    (f,) = decode_frames(reply)
    assert isinstance(f, Frame) and f.address == 7 and f.type is FrameType.HELLO_REPLY


def test_a_collision_loses_both_frames() -> None:
    """The master starts a second frame while the device is answering the first: neither is
    heard by anyone, both are counted; the device did not see the second frame."""
    dev = SimulatedDevice(seed=1, address=3)
    bus = Bus([dev], BusConfig(baud=BAUD, turnaround=0.001))
    bus.receive_data(encode_frame(FrameType.HELLO, 1, 0, b"", address=3), 0.0)
    answer_start = bus.next_event_time()
    assert answer_start is not None
    bus.tick(answer_start)  # the request ended; the device's answer is about to start
    answer_start = bus.next_event_time()
    assert answer_start is not None
    bus.tick(answer_start)  # the answer is on the medium now
    bus.receive_data(encode_frame(FrameType.HELLO, 2, 0, b"", address=3), answer_start + BYTE)
    bus.tick(1.0)
    assert bus.data_to_send() == b""
    assert bus.stats.collisions == 2 and bus.stats.delivered == 1
    assert dev.session.counters["hello"] == 1


def test_collisions_from_pipelining_on_half_duplex_stay_honest() -> None:
    """A host that pipelines on a half-duplex bus makes its requests collide with answers:
    frames are lost, never misread. Every read ends OK with the value the device holds, or
    UNKNOWN after its attempts; the device ran each number at most once."""
    dev = SimulatedDevice(seed=2, address=4)
    bus = Bus([dev], BusConfig(baud=BAUD, turnaround=0.0005))
    t = BusTransport(bus)
    h = Device(t, timeout=0.02, attempts=8, max_inflight=4, address=4)
    h.connect()
    assert h.write({"mode": 2}).outcome is Outcome.OK
    results = h.run([h.read_command("mode") for _ in range(12)])
    assert bus.stats.collisions > 0
    assert {r.outcome for r in results} <= {Outcome.OK, Outcome.UNKNOWN}
    assert all(r.values == (2,) for r in results if r.outcome is Outcome.OK)
    assert any(r.outcome is Outcome.OK for r in results)
    seqs = [e.seq for e in dev.executions]
    assert len(seqs) == len(set(seqs))


def test_an_addressed_device_keeps_one_request_in_flight_by_default() -> None:
    """The same twelve reads with ``max_inflight`` left to its default: an addressed handle sends
    one at a time, so nothing collides and every read is OK."""
    dev = SimulatedDevice(seed=2, address=4)
    bus = Bus([dev], BusConfig(baud=BAUD, turnaround=0.0005))
    h = Device(BusTransport(bus), timeout=0.02, attempts=8, address=4)
    h.connect()
    results = h.run([h.read_command("mode") for _ in range(12)])
    assert [r.outcome for r in results] == [Outcome.OK] * 12
    assert bus.stats.collisions == 0


def test_broadcast_reaches_every_device_once_and_nobody_answers() -> None:
    devs = devices(5)
    bus = Bus(devs, BusConfig(baud=BAUD, turnaround=0.001))
    frame = encode_frame(FrameType.REQUEST, 77, 0, bytes.fromhex("0600050002"), address=0)
    for i in range(4):  # repeated, as a master re-sends a broadcast it cannot see acknowledged
        bus.receive_data(frame, i * 0.01)
    bus.tick(1.0)
    assert bus.data_to_send() == b""
    assert bus.stats.by_sender == {MASTER: 4}
    for d in devs:
        assert [(e.epoch, e.seq) for e in d.executions] == [(BROADCAST_EPOCH, 77)]
        assert d.core.read(MODE, 1) == (2,)


def test_the_masters_echo_is_heard_and_the_host_skips_it() -> None:
    bus = Bus(devices(2), BusConfig(baud=BAUD, echo=True))
    hello = encode_frame(FrameType.HELLO, 9, 0, b"", address=2)
    bus.receive_data(hello, 0.0)
    bus.tick(1.0)
    echo_and_reply = bus.data_to_send()
    assert echo_and_reply.startswith(hello)
    (reply,) = decode_frames(echo_and_reply[len(hello):])
    assert isinstance(reply, Frame) and DeviceInfo.decode(reply.payload).address == 2
    t = BusTransport(bus, start=1.0)
    h = Device(t, timeout=0.05, max_inflight=1, address=1)
    h.connect()
    assert h.write({"mode": 1}).outcome is Outcome.OK and h.read("mode").values == (1,)


def test_faults_are_per_device() -> None:
    """Device 2 hears and speaks through a lossy link, device 3 is dead: device 1 is served as
    on a clean bus, device 2 with retries, device 3 not at all."""
    devs = devices(3)
    lossy = LinkConfig(frame_loss=0.3, frame_corrupt=0.1, seed=4)
    bus = Bus(devs, BusConfig(baud=BAUD), faults={2: lossy})
    bus.set_dead(3)
    t = BusTransport(bus)
    hs = hosts(t, range(1, 3), attempts=10)
    for i in range(10):
        assert hs[1].write({"threshold": 300 + i}).outcome is Outcome.OK
        assert hs[2].write({"threshold": 300 + i}).outcome is Outcome.OK
    assert hs[1].session.counters.retries == 0 and hs[2].session.counters.retries > 0
    with pytest.raises(NoDevice, match="no HELLO_REPLY"):
        Device(t, timeout=0.02, attempts=2, address=3).connect()
    assert devs[2].session.counters["hello"] == 0


def test_one_device_reboots_the_others_keep_their_sessions() -> None:
    devs = devices(3)
    bus = Bus(devs, BusConfig(baud=BAUD))
    t = BusTransport(bus)
    hs = hosts(t, range(1, 4))
    before = {a: h.session.epoch for a, h in hs.items()}
    bus.reboot(2, t.now())
    for h in hs.values():
        assert h.write({"mode": 1}).outcome is Outcome.OK
    after = {a: h.session.epoch for a, h in hs.items()}
    assert after[1] == before[1] and after[3] == before[3] and after[2] != before[2]


def test_a_bus_is_refused_when_it_cannot_be_one() -> None:
    with pytest.raises(BusError, match="no bus address"):
        Bus([SimulatedDevice(seed=1)])
    with pytest.raises(BusError, match="two devices at address 5"):
        Bus([SimulatedDevice(seed=1, address=5), SimulatedDevice(seed=2, address=5)])
    with pytest.raises(BusError, match="no device"):
        Bus(devices(1), faults={9: LinkConfig()})
    with pytest.raises(BusError, match="unpaced"):
        Bus(devices(1), faults={1: LinkConfig(baud=9600)})


def test_frames_written_together_are_cut_into_transmissions() -> None:
    from idemlink.device_sim.bus import frame_units

    a, b = encode_frame(FrameType.HELLO, 1, 0, b""), encode_frame(FrameType.HELLO, 2, 0, b"")
    assert frame_units(a + b) == [a, b]
    assert frame_units(b"\x01\x02" + a) == [b"\x01\x02\x00", a[1:]]  # noise ends at a delimiter
    assert frame_units(a + b"\x05\x06") == [a, b"\x05\x06"]
    assert frame_units(b"") == [] and b"".join(frame_units(a + b + a)) == a + b + a


def test_sim_bus_serves_n_devices_on_a_pty(capsys: pytest.CaptureFixture[str]) -> None:
    """``idemlink sim --bus 3 --address 5``: devices 5, 6 and 7 on one pty, each reached by its
    address in real time; another address is nobody."""
    import signal
    import subprocess
    import sys

    from support.timing import read_line, scaled

    from idemlink.cli import main

    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--bus", "3", "--address",
                             "5", "--seed", "1", "--turnaround", "0.002"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = read_line(proc.stdout, proc)
        for a in (5, 6, 7):
            with Device.open(port, address=a, timeout=0.2) as dev:
                assert dev.info is not None and dev.info.address == a
                assert dev.write({"mode": a % 3}).outcome is Outcome.OK
        assert main(["read", "--port", port, "--address", "6", "mode", "--json"]) == 0
        assert '"raw": 0' in capsys.readouterr().out
        assert main(["read", "--port", port, "--address", "8", "mode", "--timeout", "0.05",
                     "--attempts", "2"]) == 1
        assert "no idemlink device answered at address 8" in capsys.readouterr().err
        # one command on several devices of the bus, one block each, the worst exit status
        assert main(["write", "--port", port, "--address", "5-7", "threshold=32.1"]) == 0
        out = capsys.readouterr().out
        assert [f"== {port}@{a}: OK (exit 0)" in out for a in (5, 6, 7)] == [True] * 3
        assert "3 devices: 3 OK; exit 0" in out
        assert main(["read", "--port", port, "--address", "7,8", "threshold", "--timeout",
                     "0.05", "--attempts", "2"]) == 1
        out = capsys.readouterr().out
        assert f"== {port}@7: OK (exit 0)" in out and f"== {port}@8: ERROR (exit 1)" in out
        # what is on the bus (issue 22 item 5): the three devices, with their identity
        assert main(["scan", "--framed", "--port", port, "--units", "4-8", "--turnaround",
                     str(scaled(0.02))]) == 0
        out = capsys.readouterr().out
        assert [ln.split(":")[0] for ln in out.splitlines() if "PRESENT" in ln] == [
            "address   5", "address   6", "address   7"]
        assert "map=thermal-controller" in out and "0 conflict(s)" in out
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(10)) == 0
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize(("argv", "says"), [
    (["--bus", "3", "--address", "246"], "must fit in 1..247"),
    (["--bus", "0"], "must fit in 1..247"),
    (["--bus", "2", "--flash-dir", "x"], "--bus serves simulated devices without --flash-dir"),
    (["--bus", "2", "--modbus-rtu"], "--modbus-rtu"),
    (["--bus", "2", "--modbus-tcp", "127.0.0.1:0"], "--modbus-tcp"),
    (["--echo"], "give them with --bus N"),
    (["--bus", "2", "--turnaround", "-1"], "--turnaround -1.0 must be 0..10 seconds"),
])
def test_sim_bus_refuses_what_it_cannot_serve(argv: list[str], says: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.cli import main

    assert main(["sim", *argv]) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_what_the_master_does_not_take_is_bounded() -> None:
    from idemlink.device_sim.bus import MAX_TO_MASTER

    bus = Bus(devices(1), BusConfig(baud=None, echo=True))
    frame = encode_frame(FrameType.REQUEST, 1, 0, bytes(500), address=9)  # nobody answers it
    for i in range(200):
        bus.receive_data(frame, float(i))
    bus.tick(1000.0)
    assert len(bus.data_to_send()) == MAX_TO_MASTER
    assert bus.stats.overflow == 200 * len(frame) - MAX_TO_MASTER


@pytest.mark.parametrize(("text", "says"), [
    ("1,2,5-8", None), ("7", None), ("0", "must be 1..247"), ("5-3", "a range goes up"),
    ("1,1", "named twice"), ("2-4,3", "named twice"), ("x", "not an address or a list"),
    ("1-300", "must be 1..247"),
])
def test_address_lists(text: str, says: str | None) -> None:
    import argparse

    from idemlink.cli import UserError
    from idemlink.commands.common import bus_addresses

    ns = argparse.Namespace(address=text)
    if says is None:
        assert bus_addresses(ns) == {"1,2,5-8": [1, 2, 5, 6, 7, 8], "7": [7]}[text]
    else:
        with pytest.raises(UserError, match=says):
            bus_addresses(ns)
