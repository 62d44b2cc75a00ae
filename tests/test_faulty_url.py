"""The host driver through the ``faulty://`` pyserial URL handler, to the simulator on a pty."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import serial
from serial import SerialException

import idemlink.device_sim  # noqa: F401  (registers the faulty:// handler with pyserial)
from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.device import Device
from idemlink.protocol.outcome import Outcome
from idemlink.pytest_plugin import start_pty_sim


def test_every_command_acts_once_through_a_faulty_url() -> None:
    sim = start_pty_sim(SimulatedDevice(seed=5))
    url = (f"faulty://{sim.path}?frame_loss=0.2&frame_dup=0.1&frame_corrupt=0.05"
           "&baud=115200&latency_ms=1&seed=11")
    try:
        with Device.open(url, timeout=0.05, attempts=12) as dev:
            results = [dev.write({"threshold": 300 + i}) for i in range(20)]
            results += dev.run([dev.read_command("threshold")] * 10)
            results.append(dev.trigger())
            assert [r.outcome for r in results] == [Outcome.OK] * len(results)
            assert results[-2].values == (319,)
            stats = dev.transport.port.link.stats()  # type: ignore[attr-defined]
        injected = sum(v for d in stats.values() if isinstance(d, dict)
                       for k, v in d.items() if k.startswith("frames_") and k != "frames_seen")
        assert injected > 5  # the faults were real...
        assert dev.session.counters.retries > 0
        per_seq = Counter((e.epoch, e.seq) for e in sim.device.executions)
        assert max(per_seq.values()) == 1  # ...and nothing ran twice
        assert sum(1 for e in sim.device.executions if e.request[0] == 0x42) == 1
    finally:
        sim.close()


def test_a_port_failing_behind_the_faulty_link_reaches_the_caller_not_a_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's end goes away: the caller's next read raises SerialException (the host turns
    that into LinkLost); the pump thread does not die with a traceback of its own."""
    uncaught: list[object] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    sim = start_pty_sim(SimulatedDevice(seed=5))
    port = serial.serial_for_url(f"faulty://{sim.path}?seed=1", timeout=0.2)
    try:
        sim.close()
        with pytest.raises(SerialException, match="behind the faulty link failed"):
            for _ in range(25):
                port.read(1)
    finally:
        port.close()
    assert uncaught == []


def test_the_character_format_reaches_the_port_behind_the_faulty_link() -> None:
    """``faulty://`` is a wrapper, not a line of its own: the format a caller opens it with (8E1
    for a Modbus slave) is the inner port's, at open and when changed later."""
    port = serial.serial_for_url("faulty://loop://?seed=1", baudrate=9600, bytesize=7,
                                 parity="E", stopbits=2, timeout=0.2)
    try:
        inner = port._inner  # type: ignore[attr-defined]
        assert (inner.baudrate, inner.bytesize, inner.parity, inner.stopbits) == (9600, 7, "E", 2)
        port.parity, port.bytesize, port.stopbits = "O", 8, 1
        assert (inner.bytesize, inner.parity, inner.stopbits) == (8, "O", 1)
    finally:
        port.close()
