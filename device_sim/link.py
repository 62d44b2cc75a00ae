"""The link emulator's sans-I/O core: a seeded, paced, faulty serial line.

Contract:

- ``LinkDirection`` is one direction of a line, in the project's sans-I/O shape
  (docs/ARCHITECTURE.md): ``receive_data(data, now)`` puts bytes on the line at time ``now``
  (seconds, any monotonic origin); ``tick(now)`` delivers, in order, every byte whose delivery
  time is ``<= now`` (and runs the gap, hold and noise timers due by then); ``data_to_send()``
  drains the bytes delivered so far; ``next_event_time()`` says when the next delivery (or noise
  burst, or held frame release) is due, so a shell can sleep exactly until then and a simulation
  can jump its clock there. Time only moves forward: an earlier ``now`` than one already seen is
  taken as the latest one seen.
- Pacing: with ``baud`` set, every byte occupies the line for 10 bits (start, 8 data, stop), one
  after the other; a byte is delivered ``latency`` seconds after its stop bit ends. Each direction
  has its own line-busy-until time (full duplex). With all faults at zero the output is exactly
  the input, and the k-th byte arrives at ``max(send time, previous end) + 10/baud + latency``.
- Faults, each drawn from its own ``random.Random`` stream derived from ``(seed, direction,
  kind)``, so the faults applied to the n-th byte or frame depend only on the seed and on the bytes
  (not on how a shell interleaves ``receive_data`` and ``tick``):

  * byte faults (any protocol): loss, duplication (the copy follows the original), corruption
    (one bit flipped);
  * frame faults (frame mode, active when any frame probability is non-zero): the stream is cut
    into units ending at the ``delimiter`` byte (0x00 for COBS); a unit that is only the delimiter
    passes untouched; any other unit is one frame, which may be lost, corrupted (one bit flipped
    in one non-delimiter byte), duplicated, or held back and delivered after the next delivered
    frame (reordering; at most one frame is held at a time). A unit is handed on when its
    delimiter has been sent; an unterminated unit waits for its delimiter — or, with
    ``frame_gap`` set, until the line has been silent that long (an idle line ends a frame, so
    frame faults also work on traffic without delimiters: YMODEM, Modbus RTU);
  * late copies (frame mode): a frame may also leave a clean copy behind (``late``, its own random
    stream), delivered again after about ``late_frames`` further frames (uniformly 50..150 %), as a
    frame stuck in a buffer comes out long after; at most ``MAX_LATE_COPIES`` wait at a time;
  * noise: bursts of 1..``noise_max_len`` random bytes at Poisson times (``noise_rate`` bursts per
    second), inserted into the delivered stream. With noise on, the line is never idle;
  * outages (scripted, ``outage(start, end)``): every byte put on the line in that time is lost,
    as a pulled cable loses it.

  Every fault is counted in ``LinkStats``.
- The delivery record: ``record_deliveries(sink)`` hands ``sink(time, unit)`` every unit ``tick``
  delivers — the bytes between two ``delimiter`` bytes, exactly as the receiving end gets them
  (faults and noise included, the delimiters left out) — so a judge can read what really reached
  each end without trusting either end. ``DeliveryLog`` is a bounded, thread-safe sink for both
  directions (``Link.record_deliveries``), drained with ``take()``.
- ``Link`` holds both directions (a→b and b→a) and a reboot schedule (fixed times and/or Poisson
  times with a mean interval). The link only *schedules* reboots: after ``tick(now)``,
  ``next_event()`` returns the due ``RebootEvent`` objects one by one (each is also handed to the
  ``on_reboot`` callback); the simulated device does the rebooting.

Bad parameters raise ``LinkConfigError`` (a ``ValueError``) and build nothing.
No I/O and no clock here: time is passed in.

Why one module of this size: it is one machine, the faulty line; its configuration
(``LinkConfig``), the named parameters that spell it in a URL or on the command line
(``config_from_params``, rendered back by ``LinkConfig``) and the two directions change together
whenever a fault is added.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from idemlink.protocol.outcome import LocalProtocolError

if TYPE_CHECKING:
    from idemlink.device_sim.adversary import Adversary

BITS_PER_BYTE = 10  #: start bit, 8 data bits, stop bit (8N1)
COBS_DELIMITER = 0x00  #: the frame delimiter of idemlink's COBS framing


class LinkConfigError(LocalProtocolError, ValueError):
    """A link parameter is out of range or unknown. Nothing was built."""


def _check_probability(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
        raise LinkConfigError(f"{name} must be a probability in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """Parameters of one direction of the line (a ``Link`` may use one for both directions).

    Times are in seconds; probabilities are per byte (``loss``, ``dup``, ``corrupt``) or per frame
    (``frame_*``, ``reorder``).
    """

    baud: int | None = None  #: line rate; 10 bits per byte. ``None``: unpaced
    latency: float = 0.0  #: one-way latency added after a byte's stop bit
    loss: float = 0.0  #: per-byte loss probability
    dup: float = 0.0  #: per-byte duplication probability
    corrupt: float = 0.0  #: per-byte probability of one flipped bit
    frame_loss: float = 0.0  #: per-frame loss probability (frame mode)
    frame_dup: float = 0.0  #: per-frame duplication probability (frame mode)
    frame_corrupt: float = 0.0  #: per-frame probability of one flipped bit (frame mode)
    reorder: float = 0.0  #: per-frame probability of being delivered after the next frame
    reorder_max_hold: float | None = None  #: release a held frame after this long anyway
    frame_gap: float | None = None  #: frame mode: silence that also ends a unit (None: only 0x00)
    late: float = 0.0  #: per-frame probability that a clean copy arrives again much later
    late_frames: int = 300  #: a late copy arrives after this many further frames (50..150 %)
    noise_rate: float = 0.0  #: noise bursts per second (Poisson)
    noise_max_len: int = 4  #: a burst is 1..noise_max_len random bytes
    delimiter: int = COBS_DELIMITER  #: the byte that ends a frame in frame mode
    reboot_at: tuple[float, ...] = ()  #: fixed reboot times (same clock as ``now``); Link only
    reboot_every: float | None = None  #: mean interval of random reboots (Poisson); Link only
    seed: int = 0  #: the whole run is reproducible from this
    #: an attacker in the line (``idemlink.device_sim.adversary``): per host frame, the
    #: probability of one forged, replayed, reflected, stripped, truncated or flipped frame
    adversary: float = 0.0

    def __post_init__(self) -> None:
        if self.baud is not None and (
            isinstance(self.baud, bool) or not isinstance(self.baud, int) or self.baud <= 0
        ):
            raise LinkConfigError(f"baud must be a positive integer or None, got {self.baud!r}")
        if not (math.isfinite(self.latency) and self.latency >= 0.0):
            raise LinkConfigError(f"latency must be >= 0 seconds, got {self.latency!r}")
        for name in ("loss", "dup", "corrupt", "frame_loss", "frame_dup", "frame_corrupt"):
            _check_probability(name, getattr(self, name))
        _check_probability("reorder", self.reorder)
        _check_probability("late", self.late)
        _check_probability("adversary", self.adversary)
        if isinstance(self.late_frames, bool) or not (
                isinstance(self.late_frames, int) and 1 <= self.late_frames <= 1_000_000):
            raise LinkConfigError(f"late_frames must be in 1..1000000, got {self.late_frames!r}")
        if self.frame_gap is not None and not self.frame_gap > 0.0:
            raise LinkConfigError(f"frame_gap must be > 0 seconds, got {self.frame_gap!r}")
        if self.reorder_max_hold is not None and not self.reorder_max_hold > 0.0:
            raise LinkConfigError(f"reorder_max_hold must be > 0, got {self.reorder_max_hold!r}")
        if not (math.isfinite(self.noise_rate) and self.noise_rate >= 0.0):
            raise LinkConfigError(f"noise_rate must be >= 0, got {self.noise_rate!r}")
        if not 1 <= self.noise_max_len <= 4096:
            raise LinkConfigError(f"noise_max_len must be in 1..4096, got {self.noise_max_len!r}")
        if not 0 <= self.delimiter <= 0xFF:
            raise LinkConfigError(f"delimiter must be a byte value, got {self.delimiter!r}")
        if any(not math.isfinite(t) for t in self.reboot_at):
            raise LinkConfigError(f"reboot_at must be finite times, got {self.reboot_at!r}")
        if self.reboot_every is not None and not self.reboot_every > 0.0:
            raise LinkConfigError(f"reboot_every must be > 0 seconds, got {self.reboot_every!r}")

    @property
    def byte_time(self) -> float:
        """Seconds one byte occupies the line (0.0 when unpaced)."""
        return 0.0 if self.baud is None else BITS_PER_BYTE / self.baud

    @property
    def frame_mode(self) -> bool:
        """True when any whole-frame fault is enabled (the stream is then cut on delimiters)."""
        return (self.frame_loss > 0 or self.frame_dup > 0 or self.frame_corrupt > 0
                or self.reorder > 0 or self.late > 0)

    def to_params(self) -> dict[str, str]:
        """The non-default parameters, named as ``config_from_params`` (and URLs, CLI) take them."""
        default = LinkConfig()
        out: dict[str, str] = {}
        for name, spec in _PARAMS.items():
            value = getattr(self, spec.attr)
            if value != getattr(default, spec.attr):
                out[name] = spec.render(value)
        return out


MAX_QUEUED_BYTES = 1 << 16
"""Most bytes one direction (or a buffer behind it) holds undelivered; more are dropped and
counted as ``bytes_overflow``, like a UART whose FIFO is full."""


MAX_LATE_COPIES = 64
"""Most late copies one direction holds at a time; a frame drawn for one beyond that leaves none."""
MAX_RECORDED_UNIT = 4096
"""The longest unit the delivery record hands on (an idemlink frame is at most ~550 bytes on the
wire); a longer run of bytes without a delimiter is not recorded, up to the next delimiter."""


def bounded_append(buf: bytearray, data: bytes, limit: int = MAX_QUEUED_BYTES) -> int:
    """Append what fits of ``data`` to ``buf`` (at most ``limit`` bytes held); returns how many
    bytes were dropped (the newest, as a full FIFO drops them)."""
    room = max(0, limit - len(buf))
    buf += data[:room]
    return max(0, len(data) - room)


@dataclass(slots=True)
class LinkStats:
    """Counters of one direction: what went in, what came out, and every fault injected."""

    bytes_sent: int = 0
    bytes_delivered: int = 0
    bytes_lost: int = 0
    bytes_duplicated: int = 0
    bytes_corrupted: int = 0
    frames_seen: int = 0
    frames_lost: int = 0
    frames_duplicated: int = 0
    frames_corrupted: int = 0
    frames_reordered: int = 0
    frames_late: int = 0  #: clean copies kept for a late delivery
    noise_bursts: int = 0
    noise_bytes: int = 0
    bytes_overflow: int = 0  #: dropped because ``MAX_QUEUED_BYTES`` were already queued
    outage_bytes: int = 0  #: put on the line during an outage (``LinkDirection.outage``): lost

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def faults(self) -> int:
        """Total number of faults injected (noise bursts count once each)."""
        return (
            self.bytes_lost
            + self.bytes_duplicated
            + self.bytes_corrupted
            + self.frames_lost
            + self.frames_duplicated
            + self.frames_corrupted
            + self.frames_reordered
            + self.frames_late
            + self.noise_bursts
            + self.outage_bytes
        )


class FrameFault(Enum):
    """A whole-frame fault that a test can force on the next frame (``force_frame_fault``)."""

    DROP = "drop"
    DUPLICATE = "duplicate"
    CORRUPT = "corrupt"
    REORDER = "reorder"  #: hold it and deliver it after the next frame
    LATE = "late"  #: deliver it, and a clean copy again after about ``late_frames`` frames


@dataclass(frozen=True, slots=True)
class RebootEvent:
    """The device at the end of the link should reboot now (``time``); ``index`` counts from 0."""

    time: float
    index: int


def _stream(seed: int, name: str, kind: str) -> random.Random:
    # String seeds are hashed with SHA-512 by ``random``: stable across runs and processes.
    return random.Random(f"idemlink-link/{seed}/{name}/{kind}")


class LinkDirection:
    """One direction of the emulated line. See the module docstring for the contract."""

    def __init__(self, config: LinkConfig, name: str = "a->b") -> None:
        #: the adversary's view of this direction: it sees the bytes put on the line and returns
        #: frames of its own to put after them (``Link`` sets it when ``adversary`` > 0)
        self.tap: Callable[[bytes, float], list[bytes]] | None = None
        self.config = config
        self.name = name
        self.stats = LinkStats()
        self._byte_rng = _stream(config.seed, name, "byte")
        self._frame_rng = _stream(config.seed, name, "frame")
        self._noise_rng = _stream(config.seed, name, "noise")
        self._late_rng = _stream(config.seed, name, "late")
        self._byte_time = config.byte_time
        self._frame_mode = config.frame_mode
        self._now = -math.inf  # latest time seen
        self._busy_until = -math.inf  # end of the stop bit of the last byte on the line
        self._heap: list[tuple[float, int, int]] = []  # (delivery time, sequence, byte)
        self.max_queued = MAX_QUEUED_BYTES  #: bytes held undelivered before more are dropped
        self._seq = 0
        self._last_push = -math.inf  # data deliveries are kept in order
        self._unit: list[tuple[float, int]] = []  # frame mode: the unit being assembled
        self._held: list[tuple[float, int]] | None = None  # frame mode: a frame held back
        self._held_deadline: float | None = None
        self._next_noise: float | None = None
        self._forced: deque[FrameFault] = deque()
        self._delivered = bytearray()  # delivered by the last ticks, not yet drained
        self._late: list[tuple[int, bytes]] = []  # (frames_seen that releases it, its bytes)
        self._outages: tuple[tuple[float, float], ...] = ()  # [start, end): the line is dead
        self._sink: Callable[[float, bytes], None] | None = None  # the delivery record
        self._rx_unit = bytearray()  # the delivered unit being recorded
        self._rx_skip = False  # that unit grew past MAX_RECORDED_UNIT: not recorded

    # -- time ---------------------------------------------------------------------------------

    def _tick(self, now: float) -> float:
        if now > self._now:
            if self._now == -math.inf and self.config.noise_rate > 0:
                self._next_noise = now + self._noise_rng.expovariate(self.config.noise_rate)
            self._now = now
        return self._now

    # -- the public surface -------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Set the origin of the noise schedule (otherwise the first ``receive_data``/``tick``
        time)."""
        self._tick(now)

    def reconfigure(self, config: LinkConfig) -> None:
        """Change the parameters from now on (a test turning faults up or down mid-run).

        The random streams, the line-busy time and what is in flight are kept; turning frame
        faults off hands on an assembling or held frame as it is.
        """
        self.config = config
        self._byte_time = config.byte_time
        self._frame_mode = config.frame_mode
        if config.noise_rate > 0 and self._next_noise is None and self._now > -math.inf:
            self._next_noise = self._now + self._noise_rng.expovariate(config.noise_rate)
        elif config.noise_rate == 0:
            self._next_noise = None
        if not self._frame_mode and not self._forced:
            unit, self._unit = self._unit, []
            self._push_unit(unit)
            self._release_held()
            late, self._late = self._late, []
            for _, data in late:
                self._push_unit([(self._now, b) for b in data])

    def force_frame_fault(self, fault: FrameFault, count: int = 1) -> None:
        """Apply ``fault`` to the next ``count`` frames instead of drawing (frame mode is on while
        forced faults are pending). Counted in the stats like drawn faults."""
        self._forced.extend([fault] * count)

    def outage(self, start: float, end: float) -> None:
        """A scripted outage, the cable pulled from ``start`` to ``end``: every byte put on the
        line at a time in ``[start, end)`` is lost (``outage_bytes``; it still takes its line
        time). Bytes already on the line are delivered. Safe to call from another thread than
        the one driving the direction (a real-time proxy)."""
        if not (math.isfinite(start) and math.isfinite(end) and end > start):
            raise LinkConfigError(f"an outage needs finite start < end, got {start!r}, {end!r}")
        self._outages = (*(o for o in self._outages if o[1] > self._now), (start, end))

    def _dead(self, now: float) -> bool:
        return any(start <= now < end for start, end in self._outages)

    def record_deliveries(self, sink: Callable[[float, bytes], None] | None) -> None:
        """From now on hand ``sink(time, unit)`` every unit ``tick`` delivers: the bytes between
        two ``delimiter`` bytes as the receiving end gets them (delimiters left out, empty units
        skipped, ``time`` the one the shell passed to ``tick``: when the bytes were handed on);
        None stops recording."""
        self._sink = sink
        self._rx_unit.clear()
        self._rx_skip = False

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Put ``data`` on the line at time ``now`` (then what the adversary adds, if any)."""
        self._receive(data, now)
        tap = self.tap
        if tap is not None:
            for forged in tap(bytes(data), now):
                self._receive(forged, now)

    def _receive(self, data: bytes | bytearray | memoryview, now: float) -> None:
        now = self._tick(now)
        cfg = self.config
        rng = self._byte_rng
        bt = self._byte_time
        stats = self.stats
        if self._outages and self._dead(now):
            n = len(data)
            stats.bytes_sent += n
            stats.outage_bytes += n
            if bt:
                self._busy_until = max(self._busy_until, now) + n * bt
            return
        for b in bytes(data):
            stats.bytes_sent += 1
            if self.in_flight >= self.max_queued:  # the line's buffer is full: dropped
                stats.bytes_overflow += 1
                continue
            if bt:
                start = self._busy_until if self._busy_until > now else now
                self._busy_until = start + bt
                t = self._busy_until + cfg.latency
            else:
                t = now + cfg.latency
            if cfg.loss and rng.random() < cfg.loss:
                stats.bytes_lost += 1
                continue
            if cfg.corrupt and rng.random() < cfg.corrupt:
                b ^= 1 << rng.randrange(8)
                stats.bytes_corrupted += 1
            copies = 1
            if cfg.dup and rng.random() < cfg.dup:
                stats.bytes_duplicated += 1
                copies = 2
            for _ in range(copies):
                if (self._frame_mode or self._forced or self._unit or self._held is not None
                        or self._late):
                    self._frame_byte(t, b)
                else:
                    self._push(t, b)

    def tick(self, now: float) -> None:
        """Deliver every byte due by time ``now``, in delivery order (``data_to_send`` takes
        them)."""
        asked = now  # the delivery record's time: when the shell hands the bytes on
        now = self._tick(now)
        self._run_timers(now)
        heap = self._heap
        out = self._delivered
        before = len(out)
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        self.stats.bytes_delivered += len(out) - before
        if self._sink is not None and len(out) > before:
            self._record(bytes(out[before:]), min(asked, now))

    def data_to_send(self) -> bytes:
        """The bytes delivered by the ticks so far, in order (drains them)."""
        out = bytes(self._delivered)
        self._delivered.clear()
        return out

    def next_event_time(self) -> float | None:
        """When ``tick`` next has something to do, or ``None`` if nothing is scheduled."""
        times = [t for t in (self._next_noise, self._held_deadline, self._gap_deadline())
                 if t is not None]
        if self._heap:
            times.append(self._heap[0][0])
        return min(times) if times else None

    @property
    def in_flight(self) -> int:
        """Bytes on the line not yet delivered (including an unterminated or held frame)."""
        held = len(self._held) if self._held is not None else 0
        return len(self._heap) + len(self._unit) + held

    @property
    def busy_until(self) -> float:
        """When the line finishes transmitting what was sent so far (-inf: never used)."""
        return self._busy_until

    def discard_in_flight(self) -> int:
        """Drop everything on the line (a receiver that lost its input, for instance); returns
        how many bytes were dropped. Pacing state (line busy time) is kept."""
        n = self.in_flight
        self._heap.clear()
        self._unit.clear()
        self._held = None
        self._held_deadline = None
        self._late.clear()
        return n

    # -- internals ----------------------------------------------------------------------------

    def _record(self, data: bytes, now: float) -> None:
        """Cut what was just delivered into units for the delivery record."""
        sink = self._sink
        assert sink is not None
        unit = self._rx_unit
        delimiter = bytes((self.config.delimiter,))
        if delimiter not in data:  # the middle of a unit (a paced line delivers byte by byte)
            if not self._rx_skip:
                unit += data
                if len(unit) > MAX_RECORDED_UNIT:
                    unit.clear()
                    self._rx_skip = True
            return
        for i, piece in enumerate(data.split(delimiter)):
            if i:  # a delimiter ended the unit before this piece
                if unit and not self._rx_skip:
                    sink(now, bytes(unit))
                unit.clear()
                self._rx_skip = False
            if not self._rx_skip:
                unit += piece
                if len(unit) > MAX_RECORDED_UNIT:
                    unit.clear()
                    self._rx_skip = True

    def _push(self, t: float, b: int) -> None:
        if t < self._last_push:
            t = self._last_push
        self._last_push = t
        heapq.heappush(self._heap, (t, self._seq, b))
        self._seq += 1

    def _push_unit(self, unit: list[tuple[float, int]]) -> None:
        for t, b in unit:
            self._push(t, b)

    def _frame_byte(self, t: float, b: int) -> None:
        gap = self.config.frame_gap
        if gap is not None and self._unit and t - self._unit[-1][0] > gap:
            unit, self._unit = self._unit, []  # silence ended the previous unit
            self._frame_done(unit)
        self._unit.append((t, b))
        if b == self.config.delimiter:
            unit, self._unit = self._unit, []
            self._frame_done(unit)

    def _frame_done(self, unit: list[tuple[float, int]]) -> None:
        delimited = unit[-1][1] == self.config.delimiter
        if len(unit) == 1 and delimited:  # a bare delimiter is not a frame
            self._push_unit(unit)
            return
        cfg = self.config
        rng = self._frame_rng
        stats = self.stats
        stats.frames_seen += 1
        forced = self._forced.popleft() if self._forced else None
        if forced is not None:
            drop = forced is FrameFault.DROP
            corrupt = forced is FrameFault.CORRUPT
            dup = forced is FrameFault.DUPLICATE
            hold = forced is FrameFault.REORDER and self._held is None
            late = forced is FrameFault.LATE
        else:
            drop = bool(cfg.frame_loss and rng.random() < cfg.frame_loss)
            corrupt = not drop and bool(cfg.frame_corrupt and rng.random() < cfg.frame_corrupt)
            dup = not drop and bool(cfg.frame_dup and rng.random() < cfg.frame_dup)
            hold = (
                not drop and self._held is None and bool(cfg.reorder) and rng.random() < cfg.reorder
            )
            late = bool(cfg.late and self._late_rng.random() < cfg.late)
        if late and len(self._late) < MAX_LATE_COPIES:
            after = self._late_rng.randint(max(1, cfg.late_frames // 2),
                                           max(1, cfg.late_frames * 3 // 2))
            copy = bytes(b for _, b in unit)
            if delimited:  # its own unit, whatever the line delivered before it
                copy = bytes((cfg.delimiter,)) + copy
            self._late.append((stats.frames_seen + after, copy))
            stats.frames_late += 1
        self._deliver_unit(unit, delimited, drop=drop, corrupt=corrupt, dup=dup, hold=hold)
        if self._late:
            self._release_late(unit[-1][0])

    def _release_late(self, t: float) -> None:
        """Deliver the late copies whose number of frames has passed, right after ``t``."""
        seen = self.stats.frames_seen
        due = [data for at, data in self._late if at <= seen]
        if due:
            self._late = [(at, data) for at, data in self._late if at > seen]
            for data in due:
                self._push_unit([(t, b) for b in data])

    def _deliver_unit(self, unit: list[tuple[float, int]], delimited: bool, *, drop: bool,
                      corrupt: bool, dup: bool, hold: bool) -> None:
        cfg = self.config
        rng = self._frame_rng
        stats = self.stats
        if drop:
            stats.frames_lost += 1
            return
        if corrupt:
            i = rng.randrange(len(unit) - 1 if delimited else len(unit))
            t, b = unit[i]
            unit[i] = (t, b ^ (1 << rng.randrange(8)))
            stats.frames_corrupted += 1
        if hold:
            stats.frames_reordered += 1
            self._held = unit + unit if dup else unit
            if dup:
                stats.frames_duplicated += 1
            if cfg.reorder_max_hold is not None:
                self._held_deadline = unit[-1][0] + cfg.reorder_max_hold
            return
        self._push_unit(unit)
        if dup:
            stats.frames_duplicated += 1
            self._push_unit(unit)
        if self._held is not None:
            self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held, None
        self._held_deadline = None
        if held is not None:
            self._push_unit(held)

    def _gap_deadline(self) -> float | None:
        gap = self.config.frame_gap
        if gap is None or not self._unit or not self._frame_mode:
            return None
        return self._unit[-1][0] + gap

    def _run_timers(self, now: float) -> None:
        gap_end = self._gap_deadline()
        if gap_end is not None and gap_end <= now:
            # The line went quiet inside a unit: traffic without delimiters (YMODEM, Modbus RTU
            # after a hand-over) is cut into frames by silence, as a UART idle line would.
            unit, self._unit = self._unit, []
            self._frame_done(unit)
        if self._held_deadline is not None and self._held_deadline <= now:
            deadline = self._held_deadline
            held, self._held = self._held, None
            self._held_deadline = None
            for t, b in held or ():
                self._push(max(t, deadline), b)
        cfg = self.config
        while self._next_noise is not None and self._next_noise <= now:
            rng = self._noise_rng
            t = self._next_noise
            n = rng.randint(1, cfg.noise_max_len)
            for i in range(n):
                heapq.heappush(self._heap, (t + i * self._byte_time, self._seq, rng.randrange(256)))
                self._seq += 1
            self.stats.noise_bursts += 1
            self.stats.noise_bytes += n
            self._next_noise = t + rng.expovariate(cfg.noise_rate)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One unit a direction delivered (``LinkDirection.record_deliveries``)."""

    time: float  #: the link's clock when it was delivered
    direction: str  #: ``"a->b"`` or ``"b->a"``
    unit: bytes  #: the bytes between two delimiters, as the receiving end got them


DELIVERY_LOG_LIMIT = 1 << 16
"""Deliveries a ``DeliveryLog`` holds before it drops the oldest (counted in ``dropped``)."""


class DeliveryLog:
    """A bounded record of what a ``Link`` delivered both ways, for a judge that trusts neither
    end: ``Link.record_deliveries(log)`` fills it as the directions tick, ``take()`` drains it
    (thread-safe: a real-time proxy fills it from its own thread). Memory is bounded by
    ``limit`` deliveries; beyond that the oldest are dropped and counted in ``dropped`` (a reader
    draining after every exchange never gets there)."""

    def __init__(self, limit: int = DELIVERY_LOG_LIMIT) -> None:
        if limit < 1:
            raise ValueError("a delivery log holds at least one delivery")
        self._items: deque[Delivery] = deque()
        self._limit = limit
        self._lock = threading.Lock()
        self.dropped = 0

    def sink(self, direction: str) -> Callable[[float, bytes], None]:
        """The ``record_deliveries`` sink of one direction."""

        def add(time: float, unit: bytes) -> None:
            with self._lock:
                if len(self._items) >= self._limit:
                    self._items.popleft()
                    self.dropped += 1
                self._items.append(Delivery(time, direction, unit))

        return add

    def take(self) -> list[Delivery]:
        """Every delivery recorded since the last call, in order (drains them)."""
        with self._lock:
            out = list(self._items)
            self._items.clear()
        return out


class Link:
    """A full-duplex line: ``a_to_b`` and ``b_to_a`` directions plus a reboot schedule.

    ``config_ba`` defaults to ``config`` (each direction still draws its own faults). Reboots are
    taken from ``config`` (``reboot_at``, ``reboot_every``); they mean "the device at end b should
    reboot now".
    """

    def __init__(
        self,
        config: LinkConfig | None = None,
        config_ba: LinkConfig | None = None,
        *,
        on_reboot: Callable[[RebootEvent], None] | None = None,
    ) -> None:
        self.config = config if config is not None else LinkConfig()
        self.a_to_b = LinkDirection(self.config, "a->b")
        self.b_to_a = LinkDirection(config_ba if config_ba is not None else self.config, "b->a")
        #: the attacker in the line (None: an honest line)
        self.adversary: Adversary | None = None
        if self.config.adversary > 0:
            from idemlink.device_sim.adversary import Adversary

            self.adversary = Adversary(self.config.adversary, self.config.seed)
            self.a_to_b.tap = self.adversary.to_device
            self.b_to_a.tap = self.adversary.to_host
        self.on_reboot = on_reboot
        self.reboots = 0
        self._fixed = sorted(self.config.reboot_at)
        self._reboot_rng = _stream(self.config.seed, "link", "reboot")
        self._next_random: float | None = None
        self._due: deque[RebootEvent] = deque()
        self._now = -math.inf

    def _tick(self, now: float) -> float:
        if now > self._now:
            if self._now == -math.inf and self.config.reboot_every is not None:
                self._next_random = now + self._reboot_rng.expovariate(1 / self.config.reboot_every)
            self._now = now
        return self._now

    def start(self, now: float) -> None:
        """Set the origin of the random schedules (reboots, noise); otherwise the first time
        each part sees."""
        self._tick(now)
        self.a_to_b.start(now)
        self.b_to_a.start(now)

    def next_reboot_time(self) -> float | None:
        times = [t for t in (self._fixed[0] if self._fixed else None, self._next_random) if t is not None]
        return min(times) if times else None

    def tick(self, now: float) -> None:
        """Run the reboot schedule up to ``now``: the reboots due wait in ``next_event``, in time
        order (each is also handed to ``on_reboot`` here). The directions are ticked on their
        own."""
        now = self._tick(now)
        due: list[RebootEvent] = []
        while True:
            t = self.next_reboot_time()
            if t is None or t > now:
                break
            if self._fixed and self._fixed[0] == t:
                self._fixed.pop(0)
            else:
                assert self.config.reboot_every is not None
                self._next_random = t + self._reboot_rng.expovariate(1 / self.config.reboot_every)
            due.append(RebootEvent(t, self.reboots))
            self.reboots += 1
        self._due.extend(due)
        if self.on_reboot is not None:
            for event in due:
                self.on_reboot(event)

    def next_event(self) -> RebootEvent | None:
        """The next reboot found due by ``tick``, or None when there is nothing more."""
        return self._due.popleft() if self._due else None

    def next_event_time(self) -> float | None:
        """The earliest of both directions' next events and the next reboot."""
        times = [
            t
            for t in (
                self.a_to_b.next_event_time(),
                self.b_to_a.next_event_time(),
                self.next_reboot_time(),
            )
            if t is not None
        ]
        return min(times) if times else None

    def record_deliveries(self, log: DeliveryLog | None) -> None:
        """Record what both directions deliver into ``log`` (None: stop recording)."""
        for d in (self.a_to_b, self.b_to_a):
            d.record_deliveries(None if log is None else log.sink(d.name))

    def stats(self) -> dict[str, dict[str, int]]:
        """Both directions' counters and the reboot count, for reports."""
        return {
            "a_to_b": self.a_to_b.stats.as_dict(),
            "b_to_a": self.b_to_a.stats.as_dict(),
            "link": {"reboots": self.reboots},
        }


# -- parameters by name (URL query, CLI) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Param:
    attr: str
    parse: Callable[[str], object]
    render: Callable[[object], str] = field(default=str)
    help: str = ""


def _parse_baud(text: str) -> int | None:
    return None if text.lower() in ("", "none", "0") else int(text)


def _parse_ms(text: str) -> float:
    return float(text) / 1000.0


def _render_ms(value: object) -> str:
    assert isinstance(value, float | int)
    return f"{value * 1000.0:g}"


def _parse_hold(text: str) -> float | None:
    return None if text.lower() in ("", "none") else float(text) / 1000.0


def _render_hold(value: object) -> str:
    return "none" if value is None else _render_ms(value)


def _parse_times(text: str) -> tuple[float, ...]:
    return tuple(float(t) for t in text.replace(";", ",").split(",") if t.strip())


def _render_times(value: object) -> str:
    assert isinstance(value, tuple)
    return ",".join(f"{t:g}" for t in value)


def _parse_opt_float(text: str) -> float | None:
    return None if text.lower() in ("", "none") else float(text)


_PARAMS: dict[str, _Param] = {
    "baud": _Param("baud", _parse_baud, lambda v: "none" if v is None else str(v), "line rate"),
    "latency_ms": _Param("latency", _parse_ms, _render_ms, "one-way latency in ms"),
    "loss": _Param("loss", float, help="per-byte loss probability"),
    "dup": _Param("dup", float, help="per-byte duplication probability"),
    "corrupt": _Param("corrupt", float, help="per-byte bit-flip probability"),
    "frame_loss": _Param("frame_loss", float, help="per-frame loss probability"),
    "frame_dup": _Param("frame_dup", float, help="per-frame duplication probability"),
    "frame_corrupt": _Param("frame_corrupt", float, help="per-frame bit-flip probability"),
    "reorder": _Param("reorder", float, help="per-frame probability of swapping with the next"),
    "reorder_hold_ms": _Param("reorder_max_hold", _parse_hold, _render_hold, "max hold, ms"),
    "frame_gap_ms": _Param("frame_gap", _parse_hold, _render_hold, "silence ending a frame, ms"),
    "late": _Param("late", float, help="per-frame probability of a copy delivered much later"),
    "late_frames": _Param("late_frames", int, help="frames after which a late copy arrives"),
    "noise_rate": _Param("noise_rate", float, help="noise bursts per second"),
    "noise_len": _Param("noise_max_len", int, help="max bytes per noise burst"),
    "delimiter": _Param("delimiter", lambda s: int(s, 0), lambda v: f"0x{v:02x}", "frame end"),
    "reboot_at": _Param("reboot_at", _parse_times, _render_times, "reboot times, s"),
    "reboot_every": _Param("reboot_every", _parse_opt_float, str, "mean reboot interval, s"),
    "seed": _Param("seed", int, help="seed of every random draw"),
    "adversary": _Param("adversary", float,
                        help="per host frame, probability of one attack frame (docs/SECURITY.md)"),
}

PARAM_NAMES: frozenset[str] = frozenset(_PARAMS)


def config_from_params(params: Mapping[str, str], base: LinkConfig | None = None) -> LinkConfig:
    """Build a ``LinkConfig`` from named string parameters (``PARAM_NAMES``), on top of ``base``.

    Raises ``LinkConfigError`` naming the parameter for an unknown name or an unparsable value.
    """
    values: dict[str, object] = {}
    for name, text in params.items():
        spec = _PARAMS.get(name)
        if spec is None:
            raise LinkConfigError(
                f"unknown link parameter {name!r} (known: {', '.join(sorted(_PARAMS))})"
            )
        try:
            values[spec.attr] = spec.parse(text)
        except ValueError as exc:
            raise LinkConfigError(f"bad value for {name}: {text!r} ({exc})") from None
    start = asdict(base if base is not None else LinkConfig())
    start["reboot_at"] = tuple(start["reboot_at"])
    start.update(values)
    try:
        return LinkConfig(**start)
    except TypeError as exc:  # a value of the wrong type slipped through
        raise LinkConfigError(str(exc)) from None
