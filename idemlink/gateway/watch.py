"""The gateway's ports as they change: register values read every ``interval`` seconds and
announced when they change, each port's state and bus load — for the page (``/v1/events``) and
the MQTT bridge (values published on change).

Contract (docs/GATEWAY.md, "The fleet"):

- Every ``interval`` seconds (and at once after a call with an effect: ``poke``, hooked to
  ``Gateway.after_call``) each port that is up
  is read — every register of its map, by ``Gateway.read`` on the shared pipeline like any
  caller's read, ``MAX_NAMES`` a request. A register whose reading differs from the last one
  seen (or is the first) is a change: every listener gets ``{"type": "value", "port", "register":
  ENTRY}`` (ENTRY: ``output.register_entry``'s name, address, raw, value, label, unit; and
  ``text``, the value as the map writes it: ``35.0``). A reading that failed changes nothing.
- A port's state (up/down) or its device's boot epoch (a reboot the port's driver saw) that
  changed since the last look is ``{"type": "port", "port", "state", "epoch"}``: the page
  shows the device's identity anew, never an old boot's.
- **Bus load**: the bits the port's line carried (bytes written and read by the driver, times
  the bits of one character: start, data, parity, stop) over the last ``LOAD_WINDOW`` seconds,
  divided by what the line's baud rate carries in that time: the share of the line in use
  (``{"type": "load", "port", "load", "bytes"}`` every look). On a pty the rate is nominal.
- Listeners are callbacks; ``snapshot`` is the current picture (for a listener that starts late).
  Memory is bounded: one entry per register of each map, ``LOAD_WINDOW / interval`` samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from idemlink.gateway.service import MAX_NAMES, Gateway, Port
from idemlink.protocol.datatypes import DataType
from idemlink.protocol.registers import RegisterSpec

log = logging.getLogger(__name__)

LOAD_WINDOW = 5.0
"""Seconds of line traffic the bus-load figure averages over."""

Event = dict[str, Any]
Listener = Callable[[Event], None]


def bits_per_char(port: Port) -> float:
    s = port.spec
    return 1 + s.bytesize + (0 if s.parity == "N" else 1) + s.stopbits


def line_bytes(port: Port) -> int | None:
    """Bytes the port's driver has written and read so far (None: the port is down)."""
    counted = getattr(port.device, "line_bytes", None)
    if counted is None:
        return None
    return int(counted.sent + counted.received)


def value_text(spec: RegisterSpec, raw: int) -> str:
    """The value as the map writes it: ``35.0`` (scaled), ``1200``, a string's text."""
    value = spec.value(raw) if spec.dtype is DataType.STRING else spec.scaled(raw)
    return str(value)


class Watcher:
    """Reads the ports' registers every ``interval`` seconds and tells listeners what changed
    (see the module docstring)."""

    def __init__(self, gateway: Gateway, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.gateway = gateway
        self.interval = interval
        self.clock = clock
        self.values: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in gateway.ports}
        self.loads: dict[str, float] = dict.fromkeys(gateway.ports, 0.0)
        self.states: dict[str, str] = {}
        self._epochs: dict[str, int | None] = {}
        self._samples: dict[str, deque[tuple[float, int]]] = {p: deque() for p in gateway.ports}
        self._base: dict[str, int] = dict.fromkeys(gateway.ports, 0)  #: bytes of closed drivers
        self._last: dict[str, tuple[int, int]] = {}  #: (driver id, its count) at the last look
        self._listeners: list[Listener] = []
        self._wake: dict[str, asyncio.Event] = {p: asyncio.Event() for p in gateway.ports}
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ listeners
    def listen(self, listener: Listener) -> Callable[[], None]:
        """Add ``listener``; returns the function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _emit(self, event: Event) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener's fault is its own
                log.exception("a watcher listener failed")

    def snapshot(self) -> dict[str, Any]:
        return {name: {"state": self.states.get(name, "unknown"), "load": self.loads[name],
                       "registers": dict(self.values[name])} for name in self.gateway.ports}

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        if self.interval > 0:
            self._tasks = [asyncio.ensure_future(self._run(name)) for name in self.gateway.ports]
            self.gateway.after_call.append(self.poke)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    def poke(self, name: str) -> None:
        """Look at port ``name`` now (a call with an effect just ended on it)."""
        wake = self._wake.get(name)
        if wake is not None:
            wake.set()

    async def _run(self, name: str) -> None:
        wake = self._wake[name]
        while True:
            try:
                await self.look(name)
            except asyncio.CancelledError:
                raise
            except Exception:  # the next look tries again
                log.exception("port %s: a look failed", name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.interval)
            wake.clear()

    async def look(self, name: str) -> None:
        """One look at port ``name``: its state, its load, its registers."""
        port = self.gateway.ports[name]
        self._port_changes(name, port)
        self._measure(name, port)
        if not port.up:
            return
        specs = {s.name: s for s in port.spec.regmap.registers if s.field is None}
        names = list(specs)
        for i in range(0, len(names), MAX_NAMES):
            answer = await self.gateway.read(name, names[i:i + MAX_NAMES])
            for reg, entry in answer.body.get("registers", {}).items():
                if entry.get("outcome") != "OK" or entry.get("raw") is None:
                    continue
                shown = {k: v for k, v in entry.items() if k != "outcome"}
                shown["text"] = value_text(specs[reg], entry["raw"])
                if self.values[name].get(reg) != shown:
                    self.values[name][reg] = shown
                    self._emit({"type": "value", "port": name, "register": shown})
        self._port_changes(name, port)  # a reboot these reads found: said now

    def _port_changes(self, name: str, port: Port) -> None:
        state = "up" if port.up else "down"
        ops = getattr(port.device, "ops", None) if port.up else None
        open_epoch = getattr(ops, "open_epoch", None)
        epoch = open_epoch() if callable(open_epoch) else None
        if self.states.get(name) != state or (state == "up" and name in self._epochs
                                              and self._epochs[name] != epoch):
            self._emit({"type": "port", "port": name, "state": state, "epoch": epoch})
        self.states[name] = state
        if state == "up":
            self._epochs[name] = epoch

    def _measure(self, name: str, port: Port) -> None:
        now = self.clock()
        count = line_bytes(port)
        ident = id(port.device)
        last = self._last.get(name)
        if count is not None:
            if last is not None and last[0] != ident:  # a re-opened driver counts from zero
                self._base[name] += last[1]
            self._last[name] = (ident, count)
        total = self._base[name] + (count if count is not None else
                                    (last[1] if last is not None else 0))
        samples = self._samples[name]
        samples.append((now, total))
        while len(samples) > 2 and now - samples[1][0] >= LOAD_WINDOW:
            samples.popleft()
        (t0, b0) = samples[0]
        span = now - t0
        load = 0.0
        if span > 0:
            load = (total - b0) * bits_per_char(port) / (port.spec.baudrate * span)
        self.loads[name] = load
        self._emit({"type": "load", "port": name, "load": round(load, 6), "bytes": total})


__all__ = ["LOAD_WINDOW", "Event", "Listener", "Watcher", "bits_per_char", "line_bytes",
           "value_text"]
