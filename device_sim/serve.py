"""Serve a ``SimulatedDevice`` in real time on a pseudo-terminal, a serial port or a pyserial URL.

Contract: the thin I/O shell around the sans-I/O ``SimulatedDevice``. ``serve(device, transport,
stop)`` moves bytes between the transport and the device (``device.receive_data(data, now)``,
then ``device.data_to_send()``) with ``now`` taken from a monotonic clock, until ``stop`` is
set. The transport's ``read(timeout)`` blocks (``select``/pyserial timeout) for at most
``tick_interval`` seconds (20 ms), after which the device is ticked so RUNNING triggers finish
and fault conditions latch on time: it never busy-spins and never sleeps blindly. An answer the
peer does not read in time (the transport's write raises ``TimeoutError``) is dropped and
counted (``ServeStats.answers_dropped``); the loop keeps serving. ``install_stop_signals(stop)``
makes SIGINT and SIGTERM set the event (the loop then returns within one tick interval).

A port or pyserial URL is served through ``idemlink.host.device.SerialTransport`` (the same wrapper the
host uses: DTR/RTS low before opening, waits in ``select``); ``idemlink.device_sim.pty.open_pty()`` gives
the pty variant.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Protocol

from idemlink.device_sim.bus import Bus
from idemlink.device_sim.device import FileReceiveRequest, SimulatedDevice

log = logging.getLogger(__name__)

TICK_INTERVAL = 0.02
"""Longest time the loop waits for bytes before ticking the device (seconds)."""
ASYNC_POLL = 0.001
"""How often a bus with devices in other processes is polled on a transport that cannot be woken
(seconds)."""


class ServeTransport(Protocol):
    """What the serve loop needs: a blocking read with a timeout and a write."""

    def read(self, timeout: float) -> bytes: ...
    def write(self, data: bytes) -> None: ...


@dataclass(slots=True)
class ServeStats:
    """Counters of one serve run (for logs and tests)."""

    bytes_in: int = 0
    bytes_out: int = 0
    ticks: int = 0
    file_batches: int = 0
    answers_dropped: int = 0  #: answers (or their rest) the reader did not take in time


class Servable(Protocol):
    """What the serve loop drives: a ``SimulatedDevice`` or a ``LockedDevice`` around one."""

    name: str

    @property
    def epoch(self) -> int: ...
    @property
    def files_dir(self) -> Path: ...
    def receive_data(self, data: bytes, now: float) -> None: ...
    def data_to_send(self) -> bytes: ...
    def tick(self, now: float) -> None: ...
    def take_file_receive(self) -> FileReceiveRequest | None: ...


def serve(
    device: Servable,
    transport: ServeTransport,
    stop: threading.Event,
    *,
    clock: Callable[[], float] = time.monotonic,
    tick_interval: float = TICK_INTERVAL,
    between: Callable[[float], None] | None = None,
) -> ServeStats:
    """Serve ``device`` on ``transport`` until ``stop`` is set; return the counters.
    ``between(now)``, if given, runs after every read (the control FIFO's poll)."""
    stats = ServeStats()
    log.info("serving %s (epoch %08x)", device.name, device.epoch)
    while not stop.is_set():
        data = transport.read(tick_interval)
        now = clock()
        if data:
            stats.bytes_in += len(data)
            device.receive_data(data, now)
            answer = device.data_to_send()
            if answer:
                deliver(transport, answer, stats)
            request = device.take_file_receive()
            if request is not None:
                from idemlink.device_sim.file_receive import receive_batch

                report = receive_batch(device.files_dir, transport, clock, stop,
                                       overwrite=request.overwrite, quota=request.quota)
                stats.file_batches += 1
                log.info("YMODEM batch: %s", report)
        else:
            device.tick(now)
            stats.ticks += 1
        if between is not None:
            between(now)
    log.info("stopped: %d bytes in, %d bytes out, %d answers dropped", stats.bytes_in,
             stats.bytes_out, stats.answers_dropped)
    return stats


def serve_bus(bus: Bus, transport: ServeTransport, stop: threading.Event, *,
              clock: Callable[[], float] = time.monotonic,
              tick_interval: float = TICK_INTERVAL) -> ServeStats:
    """Serve a simulated bus (``idemlink.device_sim.bus.Bus``) on ``transport`` in real time
    until ``stop`` is set: the port's bytes are the master's transmissions, what the medium
    delivers to the master is written back. The loop waits for bytes at most until the bus's
    next event (a frame ending, a device's turnaround) or ``tick_interval``; devices in other
    processes (``idemlink.device_sim.bus_station``) end the wait through the transport's ``wake``
    when they answer (a transport without one is polled every ``ASYNC_POLL`` seconds instead)."""
    stats = ServeStats()
    log.info("serving a bus of %d devices", len(bus.members))
    if any(m.asynchronous for m in bus.members.values()):
        waker = getattr(transport, "wake", None)
        bus.set_waker(waker)
        if waker is None:
            tick_interval = min(tick_interval, ASYNC_POLL)
        else:
            waker()  # ready before the first wait (the first read returns at once)
    while not stop.is_set():
        nxt = bus.next_event_time()
        wait = tick_interval if nxt is None else min(tick_interval, max(0.0, nxt - clock()))
        data = transport.read(wait)
        now = clock()
        if data:
            stats.bytes_in += len(data)
            bus.receive_data(data, now)
        bus.tick(now)
        stats.ticks += 1
        out = bus.data_to_send()
        if out:
            deliver(transport, out, stats)
    log.info("stopped: %d bytes in, %d bytes out; %s", stats.bytes_in, stats.bytes_out,
             bus.stats)
    return stats


def deliver(transport: ServeTransport, answer: bytes, stats: ServeStats) -> None:
    """Send ``answer``; one the reader does not take in time (a ``TimeoutError`` from the
    transport, e.g. ``WriteStalled``) is dropped and counted: the device keeps serving, as a real
    one whose transmit FIFO overflowed would."""
    try:
        transport.write(answer)
    except TimeoutError as exc:
        stats.answers_dropped += 1
        if stats.answers_dropped == 1 or stats.answers_dropped % 1000 == 0:
            log.warning("answer dropped (%s); %d so far", exc, stats.answers_dropped)
        return
    stats.bytes_out += len(answer)


class LockedDevice:
    """A ``SimulatedDevice`` shared between a serving thread and a script or test (demo, pytest
    plugin): every call the serve loop makes takes ``lock``; hold it to touch ``device``."""

    def __init__(self, device: SimulatedDevice) -> None:
        self.device = device
        self.lock = threading.Lock()
        self.name = device.name

    @property
    def epoch(self) -> int:
        return self.device.epoch

    @property
    def files_dir(self) -> Path:
        return self.device.files_dir

    def receive_data(self, data: bytes, now: float) -> None:
        with self.lock:
            self.device.receive_data(data, now)

    def data_to_send(self) -> bytes:
        with self.lock:
            return self.device.data_to_send()

    def tick(self, now: float) -> None:
        with self.lock:
            self.device.tick(now)

    def take_file_receive(self) -> FileReceiveRequest | None:
        with self.lock:
            return self.device.take_file_receive()


def install_stop_signals(stop: threading.Event) -> Callable[[], None]:
    """Make SIGINT and SIGTERM set ``stop``; returns a function restoring the old handlers.

    Must be called from the main thread (a Python rule for signal handlers).
    """

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, handler in old.items():
            signal.signal(s, handler)

    return restore
