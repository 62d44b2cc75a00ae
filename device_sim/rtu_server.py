"""Plain Modbus RTU slave around ``idemlink.protocol.device_core`` (the I/O shell).

Contract:

- ``RtuServer`` is the whole behaviour and does no I/O, in the project's sans-I/O shape
  (docs/ARCHITECTURE.md): ``receive_data(data, now)`` takes the bytes a read returned,
  ``tick(now)`` says a read returned nothing (the line was silent), ``data_to_send()`` drains the
  answers. Frames for another unit id and frames with a bad CRC get silence; another slave's
  answer (shared bus) is skipped whole; after a bad CRC, an implausible head or a frame cut by a
  pause, parsing restarts only at a real pause of t3.5 (``RtuDecoder`` with
  ``rtu_timing(baudrate, char_format)``: 3.5 characters of the line's format, 8E1 by default, up
  to 19200 Bd, 1.75 ms above; ``baudrate=None``, e.g. a pty, times characters at the
  simulator's default 115200 Bd); a frame whose function code tells no length (answered with
  exception 01) ends t3.5 after its last byte, as the C device's does; broadcast (unit 0) writes
  execute without an answer; FC06 answers echo the request.
- ``RtuServer.serve(stop)`` moves bytes between a transport and the server until ``stop`` is set;
  an answer the peer does not read in time (the write raises ``TimeoutError``) is dropped and
  counted in ``answers_dropped``, and serving goes on;
  the simulated clock is ``time.monotonic`` here only. When a ``ConfigFlash`` is given, the
  configuration is loaded at start (a boot: ``persist = false`` holdings are back at their
  default, the generation moving if one was not) and saved (atomically) BEFORE a write changes it: a write
  whose configuration cannot be saved answers exception 04 and changes nothing (logged; the
  server keeps serving).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from idemlink.device_sim.flash import ConfigFlash
from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.device_core import ConfigSnapshot, DeviceCore, PersistError
from idemlink.protocol.modbus_rtu import (
    BROADCAST_UNIT,
    DEFAULT_BAUDRATE,
    RtuDecoder,
    encode_rtu,
    rtu_timing,
)

__all__ = [
    "RtuServer",
    "Transport",
]

log = logging.getLogger(__name__)

CONFIRM_READ = 0.0002
"""The read that confirms a pause t3.5 after the last bytes (seconds): it begins after t3.5, so
finding nothing proves the silence (``RtuDecoder.tick``)."""


class Transport(Protocol):
    def read(self, timeout: float) -> bytes: ...

    def write(self, data: bytes) -> None: ...


class RtuServer:
    """A Modbus RTU slave serving ``core`` as unit ``unit``."""

    def __init__(self, core: DeviceCore, unit: int = 1, flash: ConfigFlash | None = None,
                 baudrate: int | None = None,
                 char_format: CharFormat = MODBUS_CHAR_FORMAT) -> None:
        if not 1 <= unit <= 247:
            raise ValueError(f"unit id {unit} outside 1..247")
        self.core = core
        self.unit = unit
        self.flash = flash
        # pauses are measured in character times of the line; a pty (``None``) has no baud
        # rate: the simulator's default
        self.decoder = RtuDecoder(
            baudrate=DEFAULT_BAUDRATE if baudrate is None else baudrate, unit=unit,
            timing=rtu_timing(baudrate, char_format))
        self.answered = 0
        self.ignored = 0
        self.answers_dropped = 0  #: answers the peer did not read in time (dropped, not fatal)
        self._outgoing = bytearray()
        if flash is not None:
            snap = flash.load()
            if snap is not None:
                with flash.naming_config():
                    core.restore(snap, core.now)
                core.reset_volatile(core.now)  # a start is a boot: volatile holdings revert

    def receive_data(self, data: bytes, now: float) -> None:
        """Take the bytes a read returned at ``now``; the answers wait in ``data_to_send``. A real
        pause of t3.5 (seen at the next read, or 0.1 s without bytes) ends an incomplete frame:
        it is dropped."""
        if not data:
            return
        self.decoder.receive_data(data, now)
        self._answer(now)

    def tick(self, now: float) -> None:
        """A read that began at ``now`` returned nothing: the silence may end a frame (a frame
        of unknown length at t3.5, as the C device does; ``RtuDecoder.tick``); the core's timers
        run."""
        self.decoder.tick(now)
        self._answer(now)
        self.core.tick(now)

    def data_to_send(self) -> bytes:
        """The answers produced so far, in order (drains them)."""
        out = bytes(self._outgoing)
        self._outgoing.clear()
        return out

    def _answer(self, now: float) -> None:
        out = self._outgoing
        while (frame := self.decoder.next_event()) is not None:
            if frame.unit not in (self.unit, BROADCAST_UNIT):
                self.ignored += 1
                continue
            response = self.execute(frame.pdu, now)
            if frame.unit == BROADCAST_UNIT:
                continue
            self.answered += 1
            out += encode_rtu(self.unit, response)

    def execute(self, pdu: bytes, now: float) -> bytes:
        """The core's answer PDU to one request PDU, the configuration saved first when a flash
        is given (a Modbus TCP face serves the same slave: ``idemlink.device_sim.tcp_server``)."""
        return self.core.execute(pdu, now,
                                 persist=self._persist if self.flash is not None else None)

    def _persist(self, snap: ConfigSnapshot) -> None:
        assert self.flash is not None
        try:
            self.flash.save(snap)
        except OSError as exc:
            log.error("configuration not saved (%s): the write is refused (exception 04)", exc)
            raise PersistError(str(exc)) from None

    def serve(self, transport: Transport, stop: threading.Event,
              clock: Callable[[], float] = time.monotonic, poll: float = 0.02,
              between: Callable[[float], None] | None = None) -> None:
        """Serve until ``stop`` is set. A read with bytes is stamped when it returns (the
        decoder takes their transmission time off), an empty one when it began (the line was
        silent since then, ``tick``). A frame that only a pause ends (``awaits_pause``) is
        waited for until t3.5 after its last bytes, then one short read confirms the silence:
        it is answered t3.5 after its end, as the C device answers it (its port checks every
        2 ms), not at the next ``poll``."""
        log.info("Modbus RTU unit %d serving", self.unit)
        last_rx = 0.0
        while not stop.is_set():
            began = clock()
            timeout = poll
            if self.decoder.awaits_pause:
                timeout = min(poll, max(last_rx + self.decoder.frame_gap - began, CONFIRM_READ))
            data = transport.read(timeout)
            if data:
                last_rx = clock()
                self.receive_data(data, last_rx)
            else:
                self.tick(began)
            if between is not None:  # the control FIFO: the world changed
                between(clock())
            reply = self.data_to_send()
            if reply:
                try:
                    transport.write(reply)
                except TimeoutError as exc:  # the peer stopped reading: drop, keep serving
                    self.answers_dropped += 1
                    if self.answers_dropped == 1 or self.answers_dropped % 1000 == 0:
                        log.warning("answer dropped (%s); %d so far", exc, self.answers_dropped)
