"""The continuous pipeline (``Device.stream`` / ``Device.run``): requests keep leaving while answers
arrive, ordering is kept only where commands do not commute, results come back in submission order.

Throughput is measured on the simulated clock (``SimTransport`` paces bytes at 115200 baud and adds
the one-way latency), so the figures are deterministic and the tests take milliseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.command import Command, CommandKind
from idemlink.host.device import Device
from idemlink.host.errors import UnknownOutstanding
from idemlink.protocol.frame import Frame, FrameDecoder, FrameType, encode_frame
from idemlink.protocol.outcome import Outcome, Status

BAUD = 115200
COUNT = 9


def full_duplex_bound() -> float:
    """Reads per second a full-duplex line carries when it never idles (the larger frame rules)."""
    req = encode_frame(FrameType.REQUEST, 0x01020304, 0x0A0B0C0D, bytes([3, 0, 0, 0, COUNT]))
    resp = encode_frame(FrameType.RESPONSE, 0x01020304, 0x0A0B0C0D,
                        bytes([0, 3, 2 * COUNT]) + bytes(range(1, 2 * COUNT + 1)))
    return BAUD / (10 * max(len(req), len(resp)))


class Recording(SimTransport):
    """Remembers the request PDUs of every ``write`` call (one call per I/O round)."""

    def __init__(self, device: SimulatedDevice, link: LinkConfig | None = None) -> None:
        super().__init__(device, link)
        self._decoder = FrameDecoder()
        self.rounds: list[list[bytes]] = []

    def write(self, data: bytes) -> None:
        self._decoder.receive_data(data)
        self.rounds.append([f.payload for f in iter(self._decoder.next_event, None)
                            if isinstance(f, Frame) and f.type is FrameType.REQUEST])
        super().write(data)


def paced(latency: float) -> Device:
    t = SimTransport(SimulatedDevice(seed=1), LinkConfig(baud=BAUD, latency=latency))
    dev = Device(t, max_inflight=32, timeout=0.5)
    dev.connect()
    return dev


@pytest.mark.parametrize("latency", [0.0, 0.002, 0.010, 0.020])
def test_the_stream_keeps_the_line_busy(latency: float) -> None:
    """At least 95 % of the full-duplex bound at every latency (waves of 16 gave 71 % at 10 ms:
    each wave waited for its last answer before the next one left)."""
    dev = paced(latency)
    cmd = dev.read_command(0, COUNT)
    n = 600
    t0 = dev.transport.now()
    results = list(dev.stream(itertools.repeat(cmd, n)))
    elapsed = dev.transport.now() - t0
    assert len(results) == n and all(r.ok for r in results)
    assert n / elapsed >= 0.95 * full_duplex_bound(), f"{n / elapsed:.1f}/s"


def test_run_is_the_same_pipeline() -> None:
    dev = paced(0.010)
    cmd = dev.read_command(0, COUNT)
    t0 = dev.transport.now()
    assert all(r.ok for r in dev.run([cmd] * 400))
    assert 400 / (dev.transport.now() - t0) >= 0.95 * full_duplex_bound()


def test_only_commands_that_do_not_commute_wait() -> None:
    """A read of the register a write changes waits for the write's answer; reads of other
    registers overtake it (no barrier); results come back in submission order."""
    t = Recording(SimulatedDevice(seed=2), LinkConfig(baud=BAUD, latency=0.005))
    dev = Device(t, max_inflight=16)
    dev.connect()
    write1 = dev.write_command({"threshold": 301})
    read_th = dev.read_command("threshold")
    read_mode = dev.read_command("mode")
    write2 = dev.write_command({"threshold": 302})
    cmds = [write1, read_th, read_mode, read_mode, write2, read_th]
    t.rounds.clear()
    results = dev.run(cmds)
    assert [r.command for r in results] == cmds
    assert [r.outcome for r in results] == [Outcome.OK] * 6
    assert results[1].values == (301,) and results[5].values == (302,)
    first = t.rounds[0]
    assert first == [write1.pdu(), read_mode.pdu(), read_mode.pdu()], \
        "the mode reads leave with the write; the threshold read and the second write wait"
    sent = [p for r in t.rounds for p in r]
    assert sent.index(read_th.pdu()) < sent.index(write2.pdu())  # read 301 before writing 302


def test_the_stream_reads_its_source_lazily() -> None:
    dev = paced(0.002)
    taken = 0

    def endless() -> Iterator[Command]:
        nonlocal taken
        cmd = dev.read_command("threshold")
        while True:
            taken += 1
            yield cmd

    got = []
    for r in dev.stream(endless()):
        got.append(r)
        if len(got) == 100:
            break
    assert all(r.ok for r in got)
    assert taken <= 100 + 2 * dev.session.max_inflight
    assert dev.session.outstanding == 0 and not dev.ops.awaiting  # leaving settled what was out
    assert dev.unknown is None  # only reads were out: nothing to reconcile
    assert dev.read("threshold").ok


def test_leaving_a_stream_with_a_write_out_blocks_the_handle() -> None:
    dev = paced(0.010)
    stream = dev.stream([dev.read_command("mode"), dev.write_command({"threshold": 310})])
    assert next(stream).ok  # the write left with the read and is still out
    stream.close()
    assert dev.unknown is not None and dev.unknown.outcome is Outcome.UNKNOWN
    assert dev.unknown.status is Status.CANCELLED
    with pytest.raises(UnknownOutstanding):
        dev.read("mode")


def test_a_blocked_stream_stops_taking_commands() -> None:
    """A trigger whose answers are lost ends UNKNOWN: the commands taken but not sent are
    NOT_EXECUTED, and the stream ends instead of draining an endless source."""
    t = SimTransport(SimulatedDevice(seed=3, trigger_duration=1.0))
    dev = Device(t, timeout=0.02, attempts=3)
    dev.connect()
    addr = dev.spec("self_clean").address
    t.drop_answers = True

    def source() -> Iterator[Command]:
        yield Command(CommandKind.TRIGGER, addr)
        while True:
            yield Command(CommandKind.TRIGGER_RESET, addr)

    results = list(dev.stream(source()))
    assert results[0].outcome is Outcome.UNKNOWN and dev.unknown is results[0]
    assert results[1:] and all(r.outcome is Outcome.NOT_EXECUTED and not r.sent_as
                               for r in results[1:])


def test_the_sessions_next_deadline_is_the_earliest_of_what_is_in_flight() -> None:
    """``HostSession`` caches the earliest deadline (the shell asks every I/O round); the cache
    follows new requests, retries and answers."""
    dev = paced(0.0)
    s = dev.session
    s.timeout = 1.0
    s.submit(dev.read_command("mode").pdu(), 10.0, set_only=True, tag="a")
    s.submit(dev.read_command("mode").pdu(), 10.5, set_only=True, tag="b")
    assert s.next_deadline() == 11.0
    s.tick(11.0)  # "a" is retried: its deadline moves past "b"'s
    assert s.counters.retries == 1 and s.next_deadline() == 11.5
    s.tick(11.5)  # now "b"
    assert s.counters.retries == 2 and s.next_deadline() == 12.0
    s.abandon(Status.CANCELLED)
    assert s.next_deadline() is None


def test_another_operation_inside_a_stream_is_refused_and_the_stream_goes_on() -> None:
    """Without the guard the inner read took the stream's answers and the stream hung."""
    from idemlink.protocol.outcome import LocalProtocolError

    dev = paced(0.002)
    got = []
    for r in dev.stream([dev.read_command("mode")] * 40):
        got.append(r)
        if len(got) == 1:
            with pytest.raises(LocalProtocolError, match="one operation at a time"):
                dev.read("threshold")
    assert len(got) == 40 and all(r.ok for r in got)
    assert dev.read("threshold").ok
