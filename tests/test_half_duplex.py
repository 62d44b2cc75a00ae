"""The master's side of a half-duplex line (issue 22 item 3): its own echo recognised and
removed, a clear error when the echo is wrong, and a turnaround guard — for the framed bus and
for Modbus RTU."""

from __future__ import annotations

import pytest

from idemlink.device_sim.bus import Bus as Medium
from idemlink.device_sim.bus import BusConfig, BusTransport
from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.bus import Bus
from idemlink.host.errors import LinkLost
from idemlink.host.half_duplex import EchoMismatch, HalfDuplexTransport
from idemlink.host.rtu_device import RtuDevice
from idemlink.protocol.outcome import Outcome


class _Line:
    """A transport on a simulated clock whose reads return what the test queued."""

    def __init__(self) -> None:
        self.t = 0.0
        self.queued: list[bytes] = []
        self.writes: list[tuple[float, bytes]] = []

    def now(self) -> float:
        return self.t

    def write(self, data: bytes) -> None:
        self.writes.append((self.t, data))

    def read(self, timeout: float) -> bytes:
        self.t += timeout if not self.queued else 0.0001
        return self.queued.pop(0) if self.queued else b""

    def close(self) -> None:
        pass


def test_the_echo_is_removed_byte_for_byte_across_reads_and_a_wrong_one_is_a_clear_error() -> None:
    line = _Line()
    hd = HalfDuplexTransport(line, echo=True)
    hd.write(b"\x01\x02\x03")
    line.queued += [b"\x01\x02", b"\x03ANSWER"]
    assert hd.read(0.1) == b"" and hd.echo_pending == 1
    assert hd.read(0.1) == b"ANSWER" and hd.echo_pending == 0 and hd.echoed == 3
    hd.write(b"\x05\x06")
    line.queued.append(b"\x05\x07")
    with pytest.raises(EchoMismatch, match="sent 0506, heard 0507"):
        hd.read(0.1)


def test_the_guard_waits_after_the_last_byte_heard_reading_not_sleeping() -> None:
    line = _Line()
    hd = HalfDuplexTransport(line, guard=0.005)
    hd.write(b"a")
    line.queued.append(b"answer")
    assert hd.read(0.1) == b"answer"
    heard = line.t
    line.queued.append(b"late")  # heard during the guard: kept for the next read
    hd.write(b"b")
    assert line.writes[-1][0] >= heard + 0.005 and hd.guarded == 1
    assert hd.read(0.1) == b"late"


def test_a_framed_bus_with_echo_and_guard_keeps_its_answers_and_a_wrong_echo_stops_the_line(
        ) -> None:
    devs = [SimulatedDevice(seed=a, address=a) for a in (1, 2)]
    wire = BusTransport(Medium(devs, BusConfig(echo=True)))
    hd = HalfDuplexTransport(wire, echo=True, guard=0.002)
    with Bus(hd) as bus:
        for a in (1, 2):
            assert bus.device(a).write({"mode": a}).outcome is Outcome.OK
            assert bus.device(a).read("mode").values == (a,)
        assert bus.device(1).session.counters.late_answers == 0  # no echo reached the session
        assert hd.echoed > 0 and hd.echo_pending == 0 and hd.guarded > 0

    # an adapter that does not echo: the device's answer arrives where the echo was expected
    wire = BusTransport(Medium([SimulatedDevice(seed=1, address=1)], BusConfig(echo=False)))
    with Bus(HalfDuplexTransport(wire, echo=True)) as bus, pytest.raises(
            LinkLost, match="echo differs"):
        bus.device(1).connect()


def test_modbus_rtu_with_echo_on_a_loopback_line() -> None:
    """pyserial's ``loop://`` returns every byte written: an adapter's echo and nobody else.
    With ``echo=True`` the RTU master hears nothing of its own request (no slave: no answer);
    without it, it hears its own request back, which is no answer either."""
    with RtuDevice.open("loop://", echo=True, guard=0.001, probe=False, timeout=0.02,
                        attempts=1) as dev:
        res = dev.read("mode")
        assert res.outcome is Outcome.UNKNOWN or res.outcome is Outcome.NOT_EXECUTED
        assert isinstance(dev.transport, HalfDuplexTransport)
        assert dev.transport.echoed == 8 and dev.transport.echo_pending == 0


def test_asyncio_bus_with_echo_keeps_its_answers_and_a_wrong_echo_stops_the_line() -> None:
    """``AsyncHalfDuplexTransport`` (``AsyncBus.open(url, echo=True)``): two tasks on two devices
    of a medium that echoes the master's bytes; on one that does not, the clear error."""
    import asyncio

    from idemlink.device_sim.simlink import AsyncSimTransport
    from idemlink.host.aio_bus import AsyncBus
    from idemlink.host.half_duplex import AsyncHalfDuplexTransport

    def bus(echo: bool) -> tuple[Medium, AsyncBus, AsyncHalfDuplexTransport]:
        m = Medium([SimulatedDevice(seed=a, address=a) for a in (1, 2)],
                   BusConfig(echo=echo, turnaround=0.001))
        line = AsyncHalfDuplexTransport(AsyncSimTransport(BusTransport(m)),  # type: ignore[arg-type]
                                        echo=True, guard=0.002)
        return m, AsyncBus(line, timeout=0.05), line

    async def main() -> None:
        m, b, line = bus(echo=True)

        async def work(a: int) -> list[Outcome]:
            d = b.device(a)
            return [(await d.write({"mode": a})).outcome, (await d.read("mode")).outcome]

        assert await asyncio.gather(work(1), work(2)) == [[Outcome.OK] * 2] * 2
        assert line.echo_pending == 0 and m.stats.collisions == 0
        _, b2, _ = bus(echo=False)
        with pytest.raises(LinkLost, match="an adapter that does not echo"):
            await b2.device(1).read("mode")

    asyncio.run(main())
