"""Every buffer of the simulator and the link emulator is bounded.

- ``SimulatedDevice.executions`` keeps the last ``keep_executions`` records (absolute indices keep
  working; a dropped one raises ``ExecutionsEvicted``), ``keep_executions=None`` keeps all.
- A link direction holds at most ``MAX_QUEUED_BYTES`` undelivered; ``idemlink link``'s output queues
  and a ``faulty://`` port's receive buffer too; the excess is counted as ``bytes_overflow``.
"""

from __future__ import annotations

import os
import select
import termios
import time
import tty

import pytest
import serial
from support.timing import wait_until

from idemlink.device_sim.device import ExecutionsEvicted, SimulatedDevice
from idemlink.device_sim.link import MAX_QUEUED_BYTES, Link, LinkConfig
from idemlink.device_sim.link_proxy import LinkProxy
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device


def test_executions_are_a_bounded_ring_with_absolute_indices() -> None:
    sim = SimulatedDevice(seed=1, keep_executions=50)
    dev = Device(SimTransport(sim))
    dev.connect()
    for value in range(200):
        assert dev.write({"threshold": 300 + value % 50}).ok
    assert len(sim.executions) == 200 and len(list(sim.executions)) == 50
    assert [e.request for e in sim.executions[190:]] == [e.request for e in list(sim.executions)[-10:]]
    assert sim.executions[-1] is list(sim.executions)[-1]
    with pytest.raises(ExecutionsEvicted):
        sim.executions.since(100)
    with pytest.raises(ExecutionsEvicted):
        sim.executions[0]


def test_keep_everything_on_request() -> None:
    sim = SimulatedDevice(seed=1, keep_executions=None)
    dev = Device(SimTransport(sim))
    dev.connect()
    for _ in range(30):
        dev.read("threshold")
    assert len(list(sim.executions)) == len(sim.executions) == 30
    assert len(sim.executions[0:]) == 30


def test_a_flood_faster_than_the_baud_rate_stays_within_the_bound() -> None:
    link = Link(LinkConfig(baud=9600))
    link.start(0.0)
    chunk = bytes(range(256)) * 64
    for i in range(64):  # 1 MiB in 1.6 s of line time that carries ~1.5 KiB
        link.a_to_b.receive_data(chunk, i * 0.025)
        assert link.a_to_b.in_flight <= MAX_QUEUED_BYTES
    stats = link.a_to_b.stats
    assert stats.bytes_overflow > 900_000
    assert stats.bytes_sent == 64 * len(chunk)


def _drain_nothing_flood(fd: int, total: int) -> None:
    data = b"\x55" * 4096
    sent = 0
    deadline = time.monotonic() + 20
    while sent < total and time.monotonic() < deadline:
        _, w, _ = select.select([], [fd], [], 0.2)
        if w:
            sent += os.write(fd, data)


def test_link_proxy_output_queue_is_bounded_when_the_reader_stops() -> None:
    with LinkProxy(None, None, LinkConfig()).start() as proxy:
        a = os.open(proxy.a_path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        b = os.open(proxy.b_path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            for fd in (a, b):
                tty.setraw(fd, termios.TCSANOW)
            _drain_nothing_flood(a, 4 * MAX_QUEUED_BYTES)  # b never reads
            wait_until(lambda: proxy.link.stats()["a_to_b"]["bytes_overflow"] > 0,
                       what="the proxy to drop what b's queue cannot hold")
            assert proxy.b.pending <= MAX_QUEUED_BYTES
        finally:
            os.close(a)
            os.close(b)


def test_faulty_receive_buffer_is_bounded() -> None:
    port = serial.serial_for_url("faulty://loop://", timeout=0)
    try:
        for _ in range(4 * MAX_QUEUED_BYTES // 4096):
            port.write(b"\xaa" * 4096)
            time.sleep(0.001)
            assert port.in_waiting >= 0  # looks, never reads
        wait_until(lambda: not port.link.a_to_b.in_flight, what="everything written delivered")
        wait_until(lambda: port.link.stats()["b_to_a"]["bytes_overflow"] > 0,
                   what="the receive buffer to drop what it cannot hold")
        assert port.in_waiting <= MAX_QUEUED_BYTES
    finally:
        port.close()
