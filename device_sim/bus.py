"""A simulated half-duplex bus: one master, N simulated idemlink devices, one medium (issue 22 item 2).

Contract (docs/BUS.md, "The simulated bus"):

- ``Bus`` is the medium, sans-I/O on a clock passed in: the master's bytes go in with
  ``receive_data(data, now)``, what reaches the master comes out of ``data_to_send()``, and
  ``tick(now)`` runs every event due (``next_event_time()`` says when the next one is).
- Every transmission occupies the medium for its bytes' time (10 bits a byte at
  ``BusConfig.baud``; ``None``: no time). The master's own transmissions follow each other; a
  device starts its answer ``BusConfig.turnaround`` after the request's last byte reached it.
- Every device hears every transmission that ends clean (the master's and the other devices'),
  and the master hears every device's. Only the addressed device answers: that is the devices'
  rule (``idemlink.protocol.device_session.address_verdict``), not the bus's.
- Two transmissions that overlap in time collide: both are lost to every listener, counted in
  ``BusStats.collisions`` (each of the two); nothing of either is delivered. A real collision
  leaves garbage a receiver drops by its CRC; delivering nothing is the same to a receiver.
- ``BusConfig.echo``: the master also hears its own transmissions (an RS-485 adapter that
  does not suppress its echo), after their last byte.
- Per-device faults: each device hears through its own ``LinkDirection`` (``ears``) and speaks
  through another (``mouth``), configured by a ``LinkConfig`` per address (loss, corruption, frame
  faults, reordering... unpaced: the bus does the timing). ``set_dead(address, True)`` makes a
  device deaf and mute (powered off, cable cut); ``reboot(address, now)`` reboots one device.
- Bounded: at most ``MAX_PENDING`` transmissions wait for the medium; the master's beyond that
  are dropped and counted (``BusStats.dropped``), like a full UART FIFO; at most
  ``MAX_TO_MASTER`` bytes wait for the master to take them, the rest is dropped and counted
  (``BusStats.overflow``).
- Mixed buses: a member is any ``Station`` — a ``SimulatedDevice``, which answers at once when it
  hears a frame, or a device in another process (``idemlink.device_sim.bus_station.ProcessStation``:
  the posix C device, the QEMU device), whose answers come later: ``tick`` collects them
  (``Station.data_to_send``) and puts each on the medium through that member's faults, at the
  earliest ``turnaround`` after the last frame it heard. A station's ``waker`` (set by
  ``set_waker``) tells a real-time driver that such bytes arrived. Faults, ``set_dead`` and
  ``reboot`` (a restart of the process, keeping its flash directory) apply to every member.

``BusTransport(bus)`` is the host's ``Transport`` over it on simulated time (``read`` jumps to
the next event, as ``SimTransport`` does), for tests and benchmarks in one process;
``LiveBusTransport(bus)`` the same on the real clock, for a bus with devices in other processes.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig, LinkConfigError, LinkDirection

MASTER = 0
"""The sender id of the master's transmissions (0 is no device's address)."""
MAX_PENDING = 256
MAX_TO_MASTER = 65536
"""Bytes delivered to the master and not yet taken (``data_to_send``) kept at most."""
"""Transmissions that may wait for the medium at once (the master's beyond that are dropped)."""


@dataclass(frozen=True, slots=True)
class BusConfig:
    """The medium: its rate, the devices' turnaround, the master's echo."""

    baud: int | None = 115200  #: 10 bits a byte; None: transmissions take no time
    turnaround: float = 0.001  #: a device starts answering this long after a request ended
    echo: bool = False  #: the master hears its own transmissions

    def __post_init__(self) -> None:
        if self.baud is not None and (isinstance(self.baud, bool) or self.baud <= 0):
            raise LinkConfigError(f"bus baud rate {self.baud} must be > 0 (or None)")
        if not 0.0 <= self.turnaround < 10.0:
            raise LinkConfigError(f"bus turnaround {self.turnaround} s must be 0..10")

    @property
    def byte_time(self) -> float:
        return 0.0 if self.baud is None else 10.0 / self.baud


@dataclass(slots=True)
class BusStats:
    """What the medium did (for tests, the bench and the CLI's summary)."""

    transmissions: int = 0  #: transmissions that started (master's and devices')
    collisions: int = 0  #: transmissions lost because another overlapped them
    delivered: int = 0  #: transmissions heard clean
    dropped: int = 0  #: the master's transmissions dropped on a full queue
    overflow: int = 0  #: bytes for the master dropped because it did not take them
    by_sender: dict[int, int] = field(default_factory=dict)  #: started, by sender (0: master)


@dataclass(slots=True)
class _Transmission:
    sender: int
    start: float
    end: float
    data: bytes
    collided: bool = False


class Station(Protocol):
    """What the bus needs of a device: its address and id, bytes in and out, time, a reboot.
    ``SimulatedDevice`` is one; ``asynchronous`` stations answer later than they hear."""

    @property
    def address(self) -> int | None: ...
    @property
    def device_id(self) -> str: ...
    def receive_data(self, data: bytes, now: float) -> None: ...
    def data_to_send(self) -> bytes: ...
    def tick(self, now: float) -> None: ...
    def reboot(self, now: float) -> None: ...


@dataclass(slots=True)
class BusMember:
    """One device on the bus and its own faults."""

    device: Station
    ears: LinkDirection  #: what it hears passes here (the medium's faults for this device)
    mouth: LinkDirection  #: what it says passes here
    dead: bool = False  #: deaf and mute (powered off, unplugged)
    heard_at: float = 0.0  #: when it last heard a frame (an asynchronous answer waits turnaround)
    asynchronous: bool = False  #: answers later than it hears (a device in another process)


class BusError(LinkConfigError):
    """A bus that cannot be built (a device without an address, two on one address)."""


class Bus:
    """The half-duplex medium. See the module docstring for the contract."""

    def __init__(self, devices: Iterable[Station], config: BusConfig | None = None,
                 faults: Mapping[int, LinkConfig] | None = None, *, start: float = 0.0) -> None:
        self.config = config or BusConfig()
        self.members: dict[int, BusMember] = {}
        faults = dict(faults or {})
        for dev in devices:
            if dev.address is None:
                raise BusError(f"device {dev.device_id} has no bus address")
            if dev.address in self.members:
                raise BusError(f"two devices at address {dev.address}")
            fault = faults.pop(dev.address, None) or LinkConfig()
            if fault.baud is not None:
                raise BusError(f"address {dev.address}: a device's faults are unpaced (baud "
                               "None): the bus times the medium")
            ears, mouth = (LinkDirection(fault, f"bus->{dev.address}"),
                           LinkDirection(fault, f"{dev.address}->bus"))
            ears.start(start)
            mouth.start(start)
            self.members[dev.address] = BusMember(
                dev, ears, mouth, asynchronous=bool(getattr(dev, "asynchronous", False)))
        if faults:
            raise BusError(f"faults for addresses with no device: {sorted(faults)}")
        self.stats = BusStats()
        self._now = start
        self._free: dict[int, float] = {}  #: by sender: when its last transmission ends
        self._pending: list[tuple[float, int, _Transmission]] = []  #: (start, order, t) heap
        self._active: list[_Transmission] = []
        self._order = itertools.count()
        self._to_master = bytearray()
        self._master_sink: Callable[[float, bytes], None] | None = None
        self._reboots: list[tuple[float, int]] = []  #: (when, address) heap

    def record_deliveries(self, sink: Callable[[float, bytes], None] | None) -> None:
        """From now on hand ``sink(time, unit)`` every frame the master hears (delimiter left
        out), as a ``LinkDirection`` records what it delivers; a device's side is recorded by
        its ``ears`` (``members[a].ears.record_deliveries``). None stops recording."""
        self._master_sink = sink

    # ------------------------------------------------------------------ the master's side
    def receive_data(self, data: bytes, now: float) -> None:
        """The master transmits ``data`` from ``now`` (after its previous transmission)."""
        if not data:
            return
        self.tick(now)
        if len(self._pending) >= MAX_PENDING:
            self.stats.dropped += 1
            return
        self._schedule(MASTER, now, bytes(data))

    def data_to_send(self) -> bytes:
        """What reached the master so far (drains it)."""
        out = bytes(self._to_master)
        self._to_master.clear()
        return out

    @property
    def busy_until(self) -> float:
        """When the master's last transmission ends (its own bytes on the medium)."""
        return self._free.get(MASTER, self._now)

    # ------------------------------------------------------------------ the world
    def device(self, address: int) -> SimulatedDevice:
        """The simulated device at ``address`` (``BusError`` for a device in another process:
        ``station``)."""
        dev = self.members[address].device
        if not isinstance(dev, SimulatedDevice):
            raise BusError(f"address {address} is not a simulated device ({dev.device_id})")
        return dev

    def station(self, address: int) -> Station:
        """The device at ``address``, of whatever kind."""
        return self.members[address].device

    def set_waker(self, waker: Callable[[], None] | None) -> None:
        """``waker()`` is called (from any thread) when a device in another process has bytes
        for the medium: a real-time driver then ticks the bus."""
        for m in self.members.values():
            if m.asynchronous:
                m.device.waker = waker  # type: ignore[attr-defined]

    def set_dead(self, address: int, dead: bool = True) -> None:
        """Make a device deaf and mute (or bring it back; a device that comes back has lost
        what it was hearing)."""
        m = self.members[address]
        m.dead = dead

    def reboot(self, address: int, now: float) -> None:
        self.members[address].device.reboot(now)

    def schedule_reboot(self, address: int, at: float) -> None:
        """Reboot one device at ``at`` (simulated time), whatever is on the medium then."""
        self.members[address]
        heapq.heappush(self._reboots, (at, address))

    def reconfigure(self, address: int, fault: LinkConfig) -> None:
        """Change one device's faults from now on."""
        m = self.members[address]
        m.ears.reconfigure(fault)
        m.mouth.reconfigure(fault)

    # ------------------------------------------------------------------ time
    def next_event_time(self) -> float | None:
        times = [t.end for t in self._active]
        if self._reboots:
            times.append(self._reboots[0][0])
        if self._pending:
            times.append(self._pending[0][0])
        for m in self.members.values():
            for d in (m.ears, m.mouth):
                t = d.next_event_time()
                if t is not None:
                    times.append(t)
        return min(times) if times else None

    def tick(self, now: float) -> None:
        """Run every event due by ``now``, in time order."""
        while True:
            nxt = self.next_event_time()
            if nxt is None or nxt > now:
                break
            self._now = max(self._now, nxt)
            self._step(self._now)
        self._now = max(self._now, now)
        for address, m in self.members.items():
            m.device.tick(self._now)
            if m.asynchronous:
                said = m.device.data_to_send()  # what it answered since (a process's pace)
                if said and not m.dead:
                    m.mouth.receive_data(said, self._now)
                    m.mouth.tick(self._now)
                    out = m.mouth.data_to_send()
                    if out:
                        self._schedule(address, max(self._now,
                                                    m.heard_at + self.config.turnaround), out)

    def _step(self, t: float) -> None:
        # ends first: a transmission that ends at t does not collide with one starting at t
        for tx in [x for x in self._active if x.end <= t]:
            self._active.remove(tx)
            self._finish(tx, t)
        while self._pending and self._pending[0][0] <= t:
            _, _, tx = heapq.heappop(self._pending)
            self._begin(tx)
        while self._reboots and self._reboots[0][0] <= t:
            self.reboot(heapq.heappop(self._reboots)[1], t)
        for address, m in self.members.items():
            m.ears.tick(t)
            heard = m.ears.data_to_send()
            if heard and not m.dead:
                self._device_hears(address, m, heard, t)
            m.mouth.tick(t)
            said = m.mouth.data_to_send()
            if said and not m.dead:
                self._schedule(address, t + self.config.turnaround, said)

    def _schedule(self, sender: int, start: float, data: bytes) -> None:
        """``sender`` transmits ``data`` from ``start``, or after its own previous transmission
        (one UART: a sender never overlaps itself), one frame a transmission: frames written
        together follow each other on the medium, and a listener hears each after its last
        byte (so an answer to the first may collide with the second)."""
        for unit in frame_units(data):
            start = max(start, self._free.get(sender, start))
            end = start + len(unit) * self.config.byte_time
            self._free[sender] = end
            heapq.heappush(self._pending, (start, next(self._order),
                                           _Transmission(sender, start, end, unit)))
            start = end

    def _begin(self, tx: _Transmission) -> None:
        self.stats.transmissions += 1
        self.stats.by_sender[tx.sender] = self.stats.by_sender.get(tx.sender, 0) + 1
        for other in self._active:
            if other.end > tx.start:
                if not other.collided:
                    self.stats.collisions += 1
                other.collided = True
                if not tx.collided:
                    self.stats.collisions += 1
                tx.collided = True
        if tx.end <= tx.start:  # no time on the medium: heard at once
            self._finish(tx, tx.start)
        else:
            self._active.append(tx)

    def _finish(self, tx: _Transmission, t: float) -> None:
        if tx.collided:
            return
        self.stats.delivered += 1
        if tx.sender != MASTER or self.config.echo:
            room = MAX_TO_MASTER - len(self._to_master)
            self._to_master += tx.data[:room]
            self.stats.overflow += max(0, len(tx.data) - room)
            if self._master_sink is not None and room >= len(tx.data):
                for unit in tx.data.split(b"\x00"):
                    if unit:
                        self._master_sink(t, unit)
        for address, m in self.members.items():
            if address != tx.sender and not m.dead:
                m.ears.receive_data(tx.data, t)
                m.ears.tick(t)
                heard = m.ears.data_to_send()
                if heard:
                    self._device_hears(address, m, heard, t)

    def _device_hears(self, address: int, m: BusMember, data: bytes, t: float) -> None:
        m.device.receive_data(data, t)
        m.heard_at = t
        if m.asynchronous:
            return  # its answer comes later: tick collects it
        answer = m.device.data_to_send()
        if answer:
            m.mouth.receive_data(answer, t)
            m.mouth.tick(t)
            said = m.mouth.data_to_send()
            if said:
                self._schedule(address, t + self.config.turnaround, said)


def frame_units(data: bytes) -> list[bytes]:
    """``data`` cut after every 0x00 that ends a frame (follows a non-zero byte): the pieces
    join to ``data`` again; bytes without a closing delimiter stay one piece."""
    out: list[bytes] = []
    begin = 0
    for i in range(1, len(data)):
        if data[i] == 0 and data[i - 1] != 0:
            out.append(data[begin : i + 1])
            begin = i + 1
    if begin < len(data):
        out.append(data[begin:])
    return out


class BusTransport:
    """The master's end of a ``Bus`` on simulated time: the host's ``Transport`` in tests.
    ``read(timeout)`` jumps time to the next event instead of sleeping."""

    def __init__(self, bus: Bus, *, start: float = 0.0) -> None:
        self.bus = bus
        self._now = start
        self.closed = False

    def now(self) -> float:
        return self._now

    def write(self, data: bytes) -> None:
        self.bus.receive_data(data, self._now)

    def read(self, timeout: float) -> bytes:
        until = self._now + max(0.0, timeout)
        while True:
            got = self.bus.data_to_send()
            if got:
                return got
            nxt = self.bus.next_event_time()
            if nxt is None or nxt > until:
                self._now = max(self._now, until)
                self.bus.tick(self._now)
                return self.bus.data_to_send()
            self._now = max(self._now, nxt)
            self.bus.tick(self._now)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass (the medium's events run)."""
        self._now += seconds
        self.bus.tick(self._now)

    def close(self) -> None:
        self.closed = True


class LiveBusTransport:
    """The master's end of a ``Bus`` on the real clock (``time.monotonic``, the clock of
    ``SerialTransport`` and of the devices' records), for a bus whose devices include processes:
    ``read(timeout)`` runs the medium until it delivers something to the master or the timeout
    passes, waiting for its next event or for a process's bytes (the stations' waker), never
    spinning. One thread drives it (the stations' reader threads only fill their buffers)."""

    def __init__(self, bus: Bus, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.bus = bus
        self._clock = clock
        self._event = threading.Event()
        bus.set_waker(self._event.set)
        self.closed = False

    def now(self) -> float:
        return self._clock()

    def write(self, data: bytes) -> None:
        self.bus.receive_data(data, self._clock())

    def wake(self) -> None:
        self._event.set()

    def read(self, timeout: float) -> bytes:
        deadline = self._clock() + max(0.0, timeout)
        while True:
            self._event.clear()  # before looking: bytes arriving after the look wake the wait
            now = self._clock()
            self.bus.tick(now)
            got = self.bus.data_to_send()
            if got or now >= deadline:
                return got
            nxt = self.bus.next_event_time()
            until = deadline if nxt is None else min(deadline, nxt)
            self._event.wait(max(0.0, until - now))

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of real time pass with the medium running (what reaches the master
        meanwhile waits for the next ``read``)."""
        end = self._clock() + seconds
        while (now := self._clock()) < end:
            self._event.clear()
            self.bus.tick(now)
            nxt = self.bus.next_event_time()
            self._event.wait(max(0.0, (end if nxt is None else min(end, nxt)) - now))

    def close(self) -> None:
        self.closed = True
        self.bus.set_waker(None)
