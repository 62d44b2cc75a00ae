"""``faulty://<inner-url>?loss=0.1&seed=1&latency_ms=2&baud=115200``: a seeded faulty link in
front of any other pyserial URL (``loop://``, ``socket://``, a device or pty path).

Contract:

- The options are ``idemlink.device_sim.link.PARAM_NAMES`` (``baud``, ``latency_ms``, ``loss``, ``dup``,
  ``corrupt``, ``frame_loss``, ``frame_dup``, ``frame_corrupt``, ``reorder``, ``noise_rate``,
  ``seed``...). Other query options are handed on to the inner URL, so
  ``faulty://socket://host:7000?logging=debug&loss=0.1`` opens ``socket://host:7000?logging=debug``.
  Without ``baud`` the link is unpaced.
- What this port writes goes through the link's a→b direction to the inner port; what the inner
  port receives comes back through b→a. Both directions run in real time on a monotonic clock:
  one thread delivers a→b bytes to the inner port when they are due, one thread reads the inner
  port and stamps what it reads with its arrival time. ``read`` waits on a condition variable
  until the next b→a delivery or its timeout (pyserial semantics: ``timeout=None`` blocks until
  ``size`` bytes, ``0`` never blocks).
- ``port.link`` is the ``Link``: its counters (``link.stats()``) say which faults were injected;
  the run is reproducible from ``seed`` (up to the timing of noise bursts, which is real time).
- Memory is bounded: each direction of the link and the receive buffer hold at most
  ``MAX_QUEUED_BYTES``; what a reader that never reads (or a writer faster than ``baud``) would
  pile up beyond that is dropped and counted as ``bytes_overflow``.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any

import serial
from serial.serialutil import PortNotOpenError, SerialBase, SerialException

from idemlink.device_sim.link import (
    MAX_QUEUED_BYTES,
    PARAM_NAMES,
    Link,
    LinkConfigError,
    bounded_append,
    config_from_params,
)

SCHEME = "faulty://"
_INNER_READ_TIMEOUT = 0.02  # the reader thread's poll period for stop requests


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """``faulty://inner?opts`` -> (inner URL with its own options, link parameters)."""
    if not url.lower().startswith(SCHEME):
        raise SerialException(f"expected faulty://<inner-url>[?option=value...], got {url!r}")
    rest = url[len(SCHEME) :]
    inner, _, query = rest.rpartition("?") if "?" in rest else (rest, "", "")
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name in PARAM_NAMES:
            ours[name] = value
        else:
            theirs.append((name, value))
    if not inner:
        raise SerialException(f"faulty:// needs an inner URL or path, got {url!r}")
    if theirs:
        inner += "?" + "&".join(f"{n}={v}" if v else n for n, v in theirs)
    return inner, ours


class Serial(SerialBase):
    """A pyserial port that runs its traffic through an emulated ``Link``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inner: serial.Serial | None = None
        self.link = Link()
        self._cond = threading.Condition()
        self._rx = bytearray()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._failure: BaseException | None = None  # the inner port's error, seen by a pump thread
        self._cancel = False
        self._t0 = 0.0
        self.inner_url = ""
        super().__init__(*args, **kwargs)

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def open(self) -> None:
        if self.is_open:
            raise SerialException("Port is already open.")
        if self.port is None:
            raise SerialException("Port must be configured before it can be used.")
        inner_url, params = split_url(str(self.port))
        try:
            config = config_from_params(params)
        except LinkConfigError as exc:
            raise SerialException(f"faulty://: {exc}") from None
        inner = serial.serial_for_url(
            inner_url, do_not_open=True, baudrate=self.baudrate, bytesize=self.bytesize,
            parity=self.parity, stopbits=self.stopbits, timeout=_INNER_READ_TIMEOUT
        )
        # The inner port is held exclusively when ours is (a faulty:// wrapper must not be a way
        # around "one program per port").
        inner.exclusive = bool(self.exclusive)
        inner.open()
        self._inner = inner
        self.inner_url = inner_url
        self.link = Link(config)
        self._rx.clear()
        self._stopping = False
        self._failure = None
        self._t0 = time.monotonic()
        self.link.start(0.0)
        self.is_open = True
        self._threads = [
            threading.Thread(target=self._deliver_out, name="faulty-a->b", daemon=True),
            threading.Thread(target=self._receive_in, name="faulty-b->a", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        if self.is_open:
            with self._cond:
                self._stopping = True
                self.is_open = False
                self._cond.notify_all()
            for t in self._threads:
                t.join(timeout=2.0)
            self._threads = []
            if self._inner is not None:
                self._inner.close()
                self._inner = None

    # -- the two pump threads -------------------------------------------------------------------

    def _deliver_out(self) -> None:
        inner = self._inner
        assert inner is not None
        direction = self.link.a_to_b
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = self._now()
                    direction.tick(now)
                    out = direction.data_to_send()
                    if out:
                        break
                    nxt = direction.next_event_time()
                    self._cond.wait(None if nxt is None else max(0.0, nxt - now))
            try:
                inner.write(out)
            except (SerialException, OSError) as exc:
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        """A pump thread lost the inner port: remember it for the caller's next read or write
        (raised there, in the caller's thread) instead of dying with a traceback of its own."""
        with self._cond:
            if not self._stopping and self._failure is None:
                self._failure = exc
            self._cond.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise SerialException(f"the port behind the faulty link failed: {self._failure}")

    def _receive_in(self) -> None:
        inner = self._inner
        assert inner is not None
        while not self._stopping:
            try:
                data = inner.read(max(1, inner.in_waiting))
            except (SerialException, OSError, TypeError, AttributeError) as exc:
                if not self._stopping:
                    self._fail(exc)
                return
            if data:
                with self._cond:
                    self.link.b_to_a.receive_data(data, self._now())
                    self._cond.notify_all()

    # -- pyserial surface ---------------------------------------------------------------------

    def _reconfigure_port(self) -> None:
        if self._inner is not None:  # the line's settings are the inner port's
            self._inner.baudrate = self.baudrate
            self._inner.bytesize = self.bytesize
            self._inner.parity = self.parity
            self._inner.stopbits = self.stopbits

    @property
    def in_waiting(self) -> int:
        if not self.is_open:
            raise PortNotOpenError()
        with self._cond:
            self._take(self._arrived(self._now()), 0)
            if not self._rx:
                self._raise_failure()
            return len(self._rx)

    def _arrived(self, now: float) -> bytes:
        """The bytes the b→a direction delivered by ``now``."""
        self.link.b_to_a.tick(now)
        return self.link.b_to_a.data_to_send()

    def _take(self, data: bytes, size: int) -> None:
        """Move delivered bytes into the receive buffer, which holds at most
        ``MAX_QUEUED_BYTES`` (or the ``size`` being read); the rest counts as b→a overflow."""
        if data:
            limit = max(MAX_QUEUED_BYTES, size)
            self.link.b_to_a.stats.bytes_overflow += bounded_append(self._rx, data, limit)

    def read(self, size: int = 1) -> bytes:
        if not self.is_open:
            raise PortNotOpenError()
        timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._cancel = False
            while True:
                now = self._now()
                self._take(self._arrived(now), size)
                if len(self._rx) >= size or not self.is_open or self._cancel:
                    break
                if self._failure is not None:
                    if self._rx:
                        break  # hand over what arrived before the failure first
                    self._raise_failure()
                wait: float | None = None
                if deadline is not None:
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        break
                nxt = self.link.b_to_a.next_event_time()
                if nxt is not None:
                    until = max(0.0, nxt - now)
                    wait = until if wait is None else min(wait, until)
                self._cond.wait(wait)
            out = bytes(self._rx[:size])
            del self._rx[:size]
            return out

    def write(self, b: Any, /) -> int:
        if not self.is_open:
            raise PortNotOpenError()
        data = bytes(b)
        with self._cond:
            self._raise_failure()
            self.link.a_to_b.receive_data(data, self._now())
            self._cond.notify_all()
        return len(data)

    def cancel_read(self) -> None:
        with self._cond:
            self._cancel = True
            self._cond.notify_all()

    def reset_input_buffer(self) -> None:
        if not self.is_open:
            raise PortNotOpenError()
        with self._cond:
            self._rx.clear()

    def reset_output_buffer(self) -> None:
        if not self.is_open:
            raise PortNotOpenError()
        if self._inner is not None:
            self._inner.reset_output_buffer()

    @property
    def out_waiting(self) -> int:
        with self._cond:
            return self.link.a_to_b.in_flight

    def _update_break_state(self) -> None:
        if self._inner is not None:
            self._inner.break_condition = self.break_condition

    def _update_rts_state(self) -> None:
        if self._inner is not None:
            self._inner.rts = self.rts

    def _update_dtr_state(self) -> None:
        if self._inner is not None:
            self._inner.dtr = self.dtr
