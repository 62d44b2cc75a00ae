"""A real-time proxy that runs the link emulator between two ports, so external programs (lrzsz,
pymodbus, mbpoll, the simulator) talk through exactly the same paced, faulty line as the tests.

Contract:

- ``LinkProxy(a, b, config)``: each end is a pyserial URL (``socket://...``, ``loop://``), a path
  (a pty slave or a serial device, opened raw with pyserial), or ``None``: the proxy then creates
  a pseudo-terminal and the program connects to ``a_path`` / ``b_path``. Bytes read from end a
  go through ``link.a_to_b`` and are written to end b when due; b to a likewise.
- Pacing is real: deliveries are timed on ``time.monotonic`` with ``select`` waiting on the file
  descriptors until the next due delivery; a byte is written at most ``quantum`` seconds after it
  is due (the loop never wakes more often than that, which bounds the CPU cost at high baud).
- ``serve()`` runs until ``stop()`` (any thread, or a signal handler); ``start()`` runs it in a
  thread. ``close()`` releases everything: a created pty disappears with it. The proxy is a
  context manager (``with LinkProxy(None, None, cfg).start() as proxy: ...``).
- ``tap(direction, data, t)``, when given, sees every delivery as the receiving end gets it (after
  the emulated faults): ``idemlink link --monitor`` decodes the frames crossing the line with it.
- Memory is bounded: each direction of the link holds at most ``MAX_QUEUED_BYTES`` undelivered
  (input faster than the emulated baud rate), and so does each end's output queue (a program
  that stopped reading); beyond that bytes are dropped and counted in the direction's
  ``bytes_overflow`` (``link.stats()``), as a UART FIFO overflows.
- Reboot events are not acted on here (there is no device to reboot); ``link`` is exposed for
  its counters (``link.stats()``).
- ``port_options(spec)``, when given, returns further pyserial keywords for an existing end
  (``bytesize``, ``parity``, ``stopbits``: its character format; ``idemlink link`` decides them).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
import time
import tty
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import serial

from idemlink.device_sim.link import Link, LinkConfig, LinkDirection, bounded_append

log = logging.getLogger(__name__)

DEFAULT_QUANTUM = 0.0002  #: at most this late; the loop wakes at most every quantum seconds
_READ_CHUNK = 4096


class _End:
    """One end of the proxy: a readable fd for ``select`` and a non-blocking output queue."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.path = ""
        self._out = bytearray()

    def fileno(self) -> int:
        raise NotImplementedError

    def read_ready(self) -> bytes:
        raise NotImplementedError

    def _write_some(self, data: bytes) -> int:
        raise NotImplementedError

    def write_fd(self) -> int | None:
        """The fd to wait on for writability, when output is queued."""
        return None

    def send(self, data: bytes) -> int:
        """Queue ``data`` and write what the end takes now; returns the bytes dropped because
        ``MAX_QUEUED_BYTES`` were already waiting (a reader that stopped reading)."""
        dropped = bounded_append(self._out, data)
        self.flush()
        return dropped

    def flush(self) -> None:
        while self._out:
            n = self._write_some(bytes(self._out))
            if n <= 0:
                return
            del self._out[:n]

    @property
    def pending(self) -> int:
        return len(self._out)

    def close(self) -> None:
        raise NotImplementedError


class _FdEnd(_End):
    """A non-blocking tty fd: a pty master the proxy created, or a device/pty path."""

    def __init__(self, label: str, path: str | None, baud: int,
                 options: Mapping[str, Any] | None = None) -> None:
        super().__init__(label)
        self._port: serial.Serial | None = None
        self._slave: int | None = None
        if path is None:
            master, slave = os.openpty()
            tty.setraw(slave)
            self._fd = master
            self._slave = slave  # held open: the pty survives clients coming and going
            self.path = os.ttyname(slave)
        else:
            self._port = serial.Serial(path, baudrate=baud, timeout=0, **(options or {}))
            self._fd = self._port.fileno()
            self.path = path
        os.set_blocking(self._fd, False)

    def fileno(self) -> int:
        return self._fd

    def read_ready(self) -> bytes:
        try:
            return os.read(self._fd, _READ_CHUNK)
        except BlockingIOError:
            return b""
        except OSError as exc:
            if exc.errno == errno.EIO:  # no one on the other side of the pty right now
                return b""
            raise

    def _write_some(self, data: bytes) -> int:
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0

    def write_fd(self) -> int | None:
        return self._fd if self._out else None

    def close(self) -> None:
        if self._port is not None:
            self._port.close()
            self._port = None
        else:
            for fd in (self._fd, self._slave):
                if fd is not None:
                    os.close(fd)
            self._slave = None


SIGNAL_LATENCY = 0.5
"""The longest ``LinkProxy.serve`` blocks in one select(): how late it may see ``stop()`` from a
signal handler whose signal arrived just before select() began."""


class _UrlEnd(_End):
    """A pyserial URL without a usable fd: a reader thread feeds a pipe that ``select`` watches."""

    def __init__(self, label: str, url: str, baud: int,
                 options: Mapping[str, Any] | None = None) -> None:
        super().__init__(label)
        self.path = url
        self._port = serial.serial_for_url(url, baudrate=baud, timeout=0.02, **(options or {}))
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._running = True
        self._thread = threading.Thread(target=self._pump, name=f"link-proxy-{label}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while self._running:
            try:
                data = self._port.read(max(1, self._port.in_waiting))
            except (serial.SerialException, OSError):
                if not self._running:
                    return
                raise
            if data:
                os.write(self._w, data)

    def fileno(self) -> int:
        return self._r

    def read_ready(self) -> bytes:
        try:
            return os.read(self._r, _READ_CHUNK)
        except BlockingIOError:
            return b""

    def _write_some(self, data: bytes) -> int:
        return self._port.write(data) or 0

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=2.0)
        self._port.close()
        os.close(self._r)
        os.close(self._w)


def _open_end(label: str, spec: str | None, baud: int,
              port_options: Callable[[str], Mapping[str, Any]] | None) -> _End:
    options = port_options(spec) if port_options is not None and spec is not None else None
    if spec is not None and "://" in spec:
        return _UrlEnd(label, spec, baud, options)
    return _FdEnd(label, spec, baud, options)


class LinkProxy:
    """Move bytes between two ends through an emulated ``Link`` in real time."""

    def __init__(
        self,
        a: str | None,
        b: str | None,
        config: LinkConfig,
        config_ba: LinkConfig | None = None,
        *,
        quantum: float = DEFAULT_QUANTUM,
        tap: Callable[[str, bytes, float], None] | None = None,
        port_options: Callable[[str], Mapping[str, Any]] | None = None,
    ) -> None:
        self.link = Link(config, config_ba)
        self.tap = tap  #: sees every delivery: (direction name, bytes, link time)
        self.quantum = quantum
        port_baud = config.baud if config.baud is not None else 115200
        self._ends: list[_End] = []
        try:
            self.a = _open_end("a", a, port_baud, port_options)
            self._ends.append(self.a)
            self.b = _open_end("b", b, port_baud, port_options)
            self._ends.append(self.b)
        except BaseException:
            self.close()
            raise
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._t0 = time.monotonic()
        self.link.start(0.0)

    @property
    def a_path(self) -> str:
        return self.a.path

    @property
    def b_path(self) -> str:
        return self.b.path

    def now(self) -> float:
        """The link's clock: seconds since the proxy was built (monotonic)."""
        return time.monotonic() - self._t0

    @property
    def origin(self) -> float:
        """The ``time.monotonic()`` of the link's clock's 0: a link time plus this is on the
        clock of a program on the same machine (the delivery record, to a host's)."""
        return self._t0

    def serve(self) -> None:
        """Run until ``stop()``."""
        routes: list[tuple[_End, LinkDirection, _End]] = [
            (self.a, self.link.a_to_b, self.b),
            (self.b, self.link.b_to_a, self.a),
        ]
        by_fd = {src.fileno(): (direction, dst) for src, direction, dst in routes}
        ends = {e.fileno(): e for e in self._ends}
        while not self._stop.is_set():
            now = self.now()
            for _, direction, dst in routes:
                direction.tick(now)
                out = direction.data_to_send()
                if out:
                    direction.stats.bytes_overflow += dst.send(out)
                    if self.tap is not None:
                        self.tap(direction.name, out, now)
            times = [
                t for t in (d.next_event_time() for _, d, _ in routes) if t is not None
            ]
            # never block for ever: a signal that lands between the stop check and select()
            # runs its Python handler (which wakes this loop) only once select returns; with no
            # traffic and no timeout, `idemlink link` once sat out a SIGTERM until killed
            timeout = SIGNAL_LATENCY if not times else min(max(min(times) - now, self.quantum),
                                                            SIGNAL_LATENCY)
            wfds = [fd for fd in (e.write_fd() for e in self._ends) if fd is not None]
            rfds = [*by_fd, self._wake_r]
            readable, writable, _ = select.select(rfds, wfds, [], timeout)
            now = self.now()
            for fd in readable:
                if fd == self._wake_r:
                    self._drain_wake()
                    continue
                data = ends[fd].read_ready()
                if data:
                    direction, _ = by_fd[fd]
                    direction.receive_data(data, now)
            for e in self._ends:
                if e.write_fd() in writable:
                    e.flush()

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 512):
                pass

    def stop(self) -> None:
        """Ask ``serve`` to return (safe from any thread or a signal handler)."""
        self._stop.set()
        with contextlib.suppress(OSError):  # a full pipe already wakes the loop
            os.write(self._wake_w, b"x")

    def start(self) -> LinkProxy:
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(target=self.serve, name="link-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the ends (a created pty disappears)."""
        if getattr(self, "_closed", False):
            return
        if hasattr(self, "_stop"):
            self.stop()
            if self._thread is not None:
                self._thread.join(timeout=5.0)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._closed = True
        for e in self._ends:
            try:
                e.close()
            except OSError as exc:  # pragma: no cover - best effort on the way out
                log.warning("closing %s: %s", e.path, exc)
        self._ends = []

    def __enter__(self) -> LinkProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
