"""The link emulator: properties of the sans-I/O core, the simulated pair, the faulty:// URL
handler and the real-time pty proxy (pacing measured against a monotonic clock)."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
import tty
from collections import Counter
from pathlib import Path

import pytest
import serial
from hypothesis import given, settings
from hypothesis import strategies as st
from support.timing import load_factor, scaled

from idemlink.device_sim import urlhandler
from idemlink.device_sim.link import (
    MAX_LATE_COPIES,
    MAX_RECORDED_UNIT,
    PARAM_NAMES,
    Delivery,
    DeliveryLog,
    FrameFault,
    Link,
    LinkConfig,
    LinkConfigError,
    LinkDirection,
    RebootEvent,
    config_from_params,
)
from idemlink.device_sim.link_proxy import LinkProxy
from idemlink.device_sim.pair import SimClock, SimClockError, SimPair
from idemlink.protocol import cobs

BAUDS = st.sampled_from([None, 1200, 9600, 115200, 1_000_000])
LATENCIES = st.sampled_from([0.0, 0.0005, 0.002, 0.010])
# (gap before the write in seconds, bytes written)
WRITES = st.lists(
    st.tuples(st.floats(0.0, 0.02, allow_nan=False), st.binary(min_size=0, max_size=64)),
    min_size=1,
    max_size=20,
)


def delivered(d: LinkDirection, now: float) -> bytes:
    """Every byte ``d`` delivers by ``now``."""
    d.tick(now)
    return d.data_to_send()


def reboots_due(link: Link, now: float) -> list[RebootEvent]:
    """The reboots ``link`` finds due by ``now``."""
    link.tick(now)
    return list(iter(link.next_event, None))


def drive(
    d: LinkDirection, writes: list[tuple[float, bytes]], end: float = math.inf
) -> tuple[list[float], list[tuple[float, int]]]:
    """Send ``writes`` (gap, data) and walk the delivery events in time order.

    Returns the send time of every byte and (delivery time, byte) for every delivered byte. The
    delivery time is the earliest tick that delivered the byte: the walk ticks at every
    ``next_event_time`` and also checks that a tick just before it delivers nothing.
    """
    t = 0.0
    sent_at: list[float] = []
    got: list[tuple[float, int]] = []

    last = 0.0  # the latest time handed to the link (its clock never runs back)

    def drain(until: float) -> None:
        nonlocal last
        while True:
            nxt = d.next_event_time()
            if nxt is None or nxt > until:
                return
            before = math.nextafter(nxt, -math.inf)
            if before >= last:
                assert delivered(d, before) == b"", "delivered before next_event_time said"
            got.extend((nxt, b) for b in delivered(d, nxt))
            last = max(last, nxt)

    for gap, data in writes:
        t += gap
        drain(t)
        d.receive_data(data, t)
        last = max(last, t)
        sent_at.extend([t] * len(data))
    drain(end)
    return sent_at, got


def frames_of(payloads: list[bytes]) -> list[bytes]:
    return [b"\x00" + cobs.encode(p) + b"\x00" for p in payloads]


def segments(stream: bytes) -> list[bytes]:
    return [s for s in stream.split(b"\x00") if s]


def unique_payloads(draw_bytes: list[bytes]) -> list[bytes]:
    # An index prefix makes every frame distinct, so positions can be followed.
    return [i.to_bytes(2, "big") + p for i, p in enumerate(draw_bytes)]


# -- the faultless line --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(writes=WRITES, baud=BAUDS, latency=LATENCIES)
def test_faultless_line_is_exact_paced_and_late_by_latency(
    writes: list[tuple[float, bytes]], baud: int | None, latency: float
) -> None:
    d = LinkDirection(LinkConfig(baud=baud, latency=latency, seed=1))
    sent_at, got = drive(d, writes)
    sent = b"".join(data for _, data in writes)
    assert bytes(b for _, b in got) == sent
    byte_time = 0.0 if baud is None else 10.0 / baud
    eps = 1e-9
    end_prev = -math.inf  # the stop bit of the previous byte, per the 8N1 model
    for k, (t, _) in enumerate(got):
        # never before the byte could have been clocked out and travelled
        assert t >= sent_at[k] + byte_time + latency - eps
        if k:
            assert t - got[k - 1][0] >= byte_time - eps  # at most one byte per 10 bit times
        # and not later than the line allows: back to back once it is busy
        end = max(sent_at[k], end_prev) + byte_time
        assert t <= end + latency + eps
        end_prev = end
    assert d.stats.bytes_delivered == len(sent) and d.stats.faults == 0


def test_throughput_of_a_busy_line_is_the_baud_rate() -> None:
    d = LinkDirection(LinkConfig(baud=115200, latency=0.002))
    d.receive_data(bytes(11520), 0.0)
    half = len(delivered(d, 0.002 + 0.5))
    assert abs(half - 5760) <= 1
    assert half + len(delivered(d, 0.002 + 1.0 - 1e-5)) == 11519 and d.in_flight == 1
    assert len(delivered(d, 0.002 + 1.0 + 1e-5)) == 1


def test_full_duplex_directions_do_not_share_the_line() -> None:
    link = Link(LinkConfig(baud=9600))
    link.a_to_b.receive_data(bytes(96), 0.0)
    link.b_to_a.receive_data(bytes(96), 0.0)
    # 96 bytes at 9600 baud take 0.1 s in each direction, at the same time
    assert len(delivered(link.a_to_b, 0.1 + 1e-9)) == 96
    assert len(delivered(link.b_to_a, 0.1 + 1e-9)) == 96


# -- reproducibility -----------------------------------------------------------------------------

FAULTY = LinkConfig(
    loss=0.05, dup=0.05, corrupt=0.05, frame_loss=0.1, frame_dup=0.1, frame_corrupt=0.1,
    reorder=0.1, noise_rate=50.0, baud=115200, latency=0.001, seed=0,
)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), payloads=st.lists(st.binary(max_size=40), max_size=30),
       cuts=st.lists(st.integers(0, 2000), max_size=10))
def test_same_seed_same_faults_whatever_the_chunking(
    seed: int, payloads: list[bytes], cuts: list[int]
) -> None:
    from dataclasses import replace

    cfg = replace(FAULTY, seed=seed, noise_rate=0.0, baud=None)
    stream = b"".join(frames_of(payloads))
    one = LinkDirection(cfg)
    one.receive_data(stream, 0.0)
    two = LinkDirection(cfg)
    edges = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    for lo, hi in itertools.pairwise(edges):
        two.receive_data(stream[lo:hi], 0.0)
    assert delivered(one, 1.0) == delivered(two, 1.0)
    assert one.stats == two.stats


def test_same_seed_same_run_including_noise_and_timing() -> None:
    def run(seed: int) -> tuple[list[tuple[float, int]], dict[str, int]]:
        from dataclasses import replace

        d = LinkDirection(replace(FAULTY, seed=seed))
        rng = random.Random(99)
        writes = [(rng.random() * 0.01, rng.randbytes(rng.randrange(60))) for _ in range(200)]
        return drive(d, writes, end=3.0)[1], d.stats.as_dict()

    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a != c
    assert a[1]["noise_bursts"] > 0 and a[1]["frames_seen"] > 0


# -- byte faults ---------------------------------------------------------------------------------


def within(observed: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    sd = math.sqrt(n * p * (1 - p))
    return abs(observed - n * p) <= sigmas * sd + 1


@settings(max_examples=15, deadline=None)
@given(p=st.floats(0.005, 0.5), seed=st.integers(0, 2**32))
def test_byte_loss_rate_is_near_the_configured_probability(p: float, seed: int) -> None:
    n = 20_000
    d = LinkDirection(LinkConfig(loss=p, seed=seed))
    d.receive_data(bytes(range(256)) * (n // 256) + bytes(n % 256), 0.0)
    out = delivered(d, 0.0)
    lost = n - len(out)
    assert within(lost, n, p)
    assert d.stats.bytes_lost == lost


@settings(max_examples=15, deadline=None)
@given(p=st.floats(0.005, 0.5), seed=st.integers(0, 2**32))
def test_corruption_flips_exactly_one_bit(p: float, seed: int) -> None:
    n = 10_000
    data = random.Random(seed).randbytes(n)
    d = LinkDirection(LinkConfig(corrupt=p, seed=seed))
    d.receive_data(data, 0.0)
    out = delivered(d, 0.0)
    assert len(out) == n
    flips = [bin(x ^ y).count("1") for x, y in zip(data, out, strict=True)]
    assert set(flips) <= {0, 1}
    assert within(sum(flips), n, p)
    assert d.stats.bytes_corrupted == sum(flips)


@settings(max_examples=15, deadline=None)
@given(p=st.floats(0.005, 0.5), seed=st.integers(0, 2**32))
def test_duplication_repeats_a_byte_right_after_itself(p: float, seed: int) -> None:
    n = 10_000
    data = bytes((i % 255) + 1 for i in range(n))  # no two neighbours equal
    d = LinkDirection(LinkConfig(dup=p, seed=seed))
    d.receive_data(data, 0.0)
    out = delivered(d, 0.0)
    dups = len(out) - n
    assert bytes(k for k, _ in itertools.groupby(out)) == data
    assert within(dups, n, p)
    assert d.stats.bytes_duplicated == dups


def test_noise_adds_random_bursts_at_the_configured_rate() -> None:
    d = LinkDirection(LinkConfig(noise_rate=100.0, noise_max_len=4, seed=3))
    d.start(0.0)
    out = delivered(d, 10.0)
    bursts = d.stats.noise_bursts
    assert abs(bursts - 1000) < 5 * math.sqrt(1000)
    assert d.stats.noise_bytes == len(out)
    assert 1.0 * bursts <= len(out) <= 4 * bursts
    assert d.next_event_time() is not None  # a noisy line is never idle


# -- frame faults --------------------------------------------------------------------------------

PAYLOADS = st.lists(st.binary(max_size=30), min_size=1, max_size=60).map(unique_payloads)


@settings(max_examples=100, deadline=None)
@given(payloads=PAYLOADS, p=st.floats(0.0, 1.0), seed=st.integers(0, 2**32))
def test_frame_loss_drops_whole_frames_only(payloads: list[bytes], p: float, seed: int) -> None:
    d = LinkDirection(LinkConfig(frame_loss=p, seed=seed, baud=115200))
    for f in frames_of(payloads):
        d.receive_data(f, 0.0)
    got = segments(delivered(d, 10.0))
    sent = [cobs.encode(x) for x in payloads]
    it = iter(sent)
    assert all(any(g == s for s in it) for g in got), "not an in-order subsequence of frames"
    assert d.stats.frames_seen == (len(sent) if p > 0 else 0)  # frame mode only when enabled
    assert d.stats.frames_lost == len(sent) - len(got)


@settings(max_examples=100, deadline=None)
@given(payloads=PAYLOADS, p=st.floats(0.0, 1.0), seed=st.integers(0, 2**32))
def test_reorder_only_swaps_whole_neighbouring_frames(
    payloads: list[bytes], p: float, seed: int
) -> None:
    d = LinkDirection(LinkConfig(reorder=p, seed=seed))
    for f in frames_of(payloads):
        d.receive_data(f, 0.0)
    got = segments(delivered(d, 0.0))
    sent = [cobs.encode(x) for x in payloads]
    held = d.in_flight  # the last frame may still be held, waiting for a successor
    assert Counter(got) <= Counter(sent)
    assert len(got) == len(sent) - (1 if held else 0)
    for i, g in enumerate(got):
        assert g in sent[max(0, i - 1) : i + 2], "a frame moved further than one place"
    swapped = sum(1 for a, b in zip(got, sent, strict=False) if a != b)
    assert swapped <= 2 * d.stats.frames_reordered


def test_held_frame_is_released_after_max_hold() -> None:
    d = LinkDirection(LinkConfig(reorder=1.0, reorder_max_hold=0.05, seed=1))
    d.receive_data(b"\x00\x02A\x00", 0.0)
    assert delivered(d, 0.049) == b"\x00" and d.next_event_time() == pytest.approx(0.05)
    assert delivered(d, 0.05) == b"\x02A\x00"


@settings(max_examples=50, deadline=None)
@given(payloads=PAYLOADS, p=st.floats(0.0, 1.0), seed=st.integers(0, 2**32))
def test_frame_dup_and_corrupt_keep_frame_boundaries(
    payloads: list[bytes], p: float, seed: int
) -> None:
    d = LinkDirection(LinkConfig(frame_dup=p, frame_corrupt=p, seed=seed))
    for f in frames_of(payloads):
        d.receive_data(f, 0.0)
    got = [g for g in delivered(d, 0.0).split(b"\x00")]
    sent = [cobs.encode(x) for x in payloads]
    # a corrupted frame may have gained a 0x00 (splitting it); otherwise frames stay whole
    corrupted = d.stats.frames_corrupted
    whole = [g for g in got if g]
    intact = sum(1 for g in whole if g in sent)
    assert len(whole) >= len(sent) + d.stats.frames_duplicated - corrupted * 2
    assert intact >= len(sent) - corrupted
    assert d.stats.frames_seen == (len(sent) if p > 0 else 0)


def test_frame_mode_waits_for_the_delimiter() -> None:
    d = LinkDirection(LinkConfig(frame_dup=1.0))
    d.receive_data(b"\x00\x03ab", 0.0)
    assert delivered(d, 1.0) == b"\x00" and d.in_flight == 3
    d.receive_data(b"\x00", 2.0)
    assert delivered(d, 2.0) == b"\x03ab\x00\x03ab\x00"


# -- reboots, config -----------------------------------------------------------------------------


def test_fixed_and_random_reboots_are_scheduled_and_reproducible() -> None:
    seen: list[RebootEvent] = []
    cfg = LinkConfig(reboot_at=(2.5, 0.5), reboot_every=1.0, seed=5)
    link = Link(cfg, on_reboot=seen.append)
    link.start(0.0)
    events = []
    while (t := link.next_event_time()) is not None and t < 1000.0:
        events += reboots_due(link, t)
    assert seen == events
    assert [e.index for e in events] == list(range(len(events)))
    times = [e.time for e in events]
    assert times == sorted(times) and 0.5 in times and 2.5 in times
    assert abs(len(times) - 2 - 1000) < 5 * math.sqrt(1000)
    again = Link(cfg)
    again.start(0.0)
    assert reboots_due(again, 1000.0) == [e for e in events if e.time <= 1000.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss": 1.5}, {"dup": -0.1}, {"baud": 0}, {"baud": True}, {"latency": -1.0},
        {"latency": math.inf}, {"noise_rate": -1.0}, {"noise_max_len": 0}, {"delimiter": 256},
        {"reboot_every": 0.0}, {"reorder_max_hold": 0.0}, {"reorder": math.nan},
    ],
)
def test_bad_config_is_a_typed_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(LinkConfigError):
        LinkConfig(**kwargs)  # type: ignore[arg-type]


def test_params_by_name() -> None:
    cfg = config_from_params({"loss": "0.1", "latency_ms": "2", "baud": "115200", "seed": "9"})
    assert (cfg.loss, cfg.latency, cfg.baud, cfg.seed) == (0.1, 0.002, 115200, 9)
    with pytest.raises(LinkConfigError, match="unknown link parameter 'los'"):
        config_from_params({"los": "0.1"})
    with pytest.raises(LinkConfigError, match="loss"):
        config_from_params({"loss": "lots"})
    with pytest.raises(LinkConfigError, match="loss"):
        config_from_params({"loss": "2"})
    assert {"loss", "dup", "corrupt", "seed", "latency_ms", "baud"} <= PARAM_NAMES


@given(
    st.builds(
        LinkConfig,
        baud=BAUDS, latency=st.sampled_from([0.0, 0.002, 0.0125]),
        loss=st.sampled_from([0.0, 0.1, 0.25]), frame_dup=st.sampled_from([0.0, 0.5]),
        reorder_max_hold=st.sampled_from([None, 0.02]), reboot_at=st.sampled_from([(), (1.5, 3.0)]),
        late=st.sampled_from([0.0, 0.01]), late_frames=st.sampled_from([300, 7]),
        reboot_every=st.sampled_from([None, 2.5]), delimiter=st.integers(0, 255),
        seed=st.integers(0, 2**40),
    )
)
def test_params_round_trip(cfg: LinkConfig) -> None:
    assert config_from_params(cfg.to_params()) == cfg


# -- the simulated pair --------------------------------------------------------------------------


def test_sim_pair_delivers_on_the_simulated_clock() -> None:
    pair = SimPair(Link(LinkConfig(baud=115200, latency=0.002)))
    assert pair.a.write(b"ping") == 4
    assert pair.b.in_waiting == 0 and pair.b.read(10) == b""
    t = pair.step()
    assert t is not None and pair.b.read(10) == b"p"
    while pair.step() is not None:
        pass
    assert pair.b.read_available() == b"ing"
    assert pair.clock.now == pytest.approx(4 * 10 / 115200 + 0.002)
    pair.b.write(b"pong")
    pair.advance(1.0)
    assert pair.a.read(2) == b"po" and pair.a.in_waiting == 2
    pair.a.reset_input_buffer()
    assert pair.a.in_waiting == 0


def test_sim_pair_reports_reboots_before_reads() -> None:
    order: list[str] = []
    pair = SimPair(
        Link(LinkConfig(reboot_at=(1.0,), latency=2.0)),
        on_reboot=lambda e: order.append(f"reboot@{e.time}"),
    )
    pair.a.write(b"x")
    assert pair.step() == 1.0 and order == ["reboot@1.0"]
    assert pair.step() == 2.0 and pair.b.read() == b"x"
    assert pair.step(limit=5.0) is None and pair.clock.now == 5.0


def test_sim_clock_never_runs_backwards() -> None:
    clock = SimClock(1.0)
    with pytest.raises(SimClockError):
        clock.advance_to(0.5)
    with pytest.raises(SimClockError):
        clock.advance(-1.0)
    assert clock.advance(0.5) == clock() == 1.5


def test_unpaced_pair_is_a_plain_wire() -> None:
    pair = SimPair()
    pair.a.write(b"abc")
    assert pair.b.read(3) == b"abc"


# -- faulty:// URL handler ------------------------------------------------------------------------


def read_exactly(port: serial.SerialBase, n: int, deadline: float) -> bytes:
    out = b""
    while len(out) < n and time.monotonic() < deadline:
        out += port.read(n - len(out))
    return out


def test_faulty_url_round_trip_through_loop_is_exact_and_paced() -> None:
    urlhandler.register()
    port = serial.serial_for_url("faulty://loop://?baud=115200&latency_ms=2", timeout=0.5)
    try:
        data = bytes(range(256)) * 2
        t0 = time.monotonic()
        port.write(data)
        got = read_exactly(port, len(data), t0 + 5.0)
        elapsed = time.monotonic() - t0
    finally:
        port.close()
    assert got == data
    # a->b paces 512 bytes (44.4 ms), b->a follows back to back, plus 2 ms each way; a busy
    # machine only makes it later (never earlier), by up to 50 ms when idle
    floor = len(data) * 10 / 115200 + 2 * 0.002
    assert floor <= elapsed < floor + scaled(0.05), (floor, elapsed)


def test_faulty_url_counts_every_lost_byte() -> None:
    port = serial.serial_for_url("faulty://loop://?loss=0.2&seed=4", timeout=0.2)
    try:
        port.write(bytes(5000))
        got = read_exactly(port, 5000, time.monotonic() + 0.3)
        stats = port.link.stats()  # type: ignore[attr-defined]
    finally:
        port.close()
    lost = stats["a_to_b"]["bytes_lost"] + stats["b_to_a"]["bytes_lost"]
    assert len(got) == 5000 - lost
    assert within(stats["a_to_b"]["bytes_lost"], 5000, 0.2)


def test_faulty_url_options_and_errors() -> None:
    from idemlink.device_sim.urlhandler.protocol_faulty import split_url

    assert split_url("faulty://loop://?loss=0.1&seed=2") == ("loop://", {"loss": "0.1", "seed": "2"})
    assert split_url("faulty://socket://h:1?logging=debug&loss=0.1") == (
        "socket://h:1?logging=debug",
        {"loss": "0.1"},
    )
    assert split_url("faulty:///dev/ttyUSB0") == ("/dev/ttyUSB0", {})
    with pytest.raises(serial.SerialException, match="loss"):
        serial.serial_for_url("faulty://loop://?loss=7")
    port = serial.serial_for_url("faulty://loop://?logging=warning&seed=3")
    try:
        assert port.inner_url == "loop://?logging=warning"  # type: ignore[attr-defined]
        assert port.link.config.seed == 3  # type: ignore[attr-defined]
    finally:
        port.close()


# -- the real-time pty proxy ----------------------------------------------------------------------


def _have_pty() -> bool:
    try:
        m, s = os.openpty()
    except (AttributeError, OSError):
        return False
    os.close(m)
    os.close(s)
    return True


needs_pty = pytest.mark.skipif(not _have_pty(), reason="no pseudo-terminals here")


def open_raw(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    tty.setraw(fd)
    return fd


def paced_rate(got: list[tuple[float, int]], nominal: float) -> float:
    """Bytes per second of a paced stream, from the least late read of its first and of its last
    third. A stalled process only delays reads (the proxy then catches up on its schedule), so
    the least late reads lie on the schedule; the first and last reads alone need not."""
    cum: list[int] = []
    total = 0
    for _, count in got:
        total += count
        cum.append(total)
    lateness = [t - c / nominal for (t, _), c in zip(got, cum, strict=True)]
    third = max(1, len(got) // 3)
    first = min(range(third), key=lateness.__getitem__)
    last = min(range(len(got) - third, len(got)), key=lateness.__getitem__)
    return (cum[last] - cum[first]) / (got[last][0] - got[first][0])


def read_until(fd: int, n: int, deadline: float) -> list[tuple[float, int]]:
    """(arrival time, byte count) of each read, until ``n`` bytes or the deadline."""
    got: list[tuple[float, int]] = []
    total = 0
    while total < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            got.append((time.monotonic(), len(chunk)))
            total += len(chunk)
    return got


@needs_pty
def test_pty_proxy_paces_at_the_baud_rate_and_honours_latency() -> None:
    baud, latency = 115200, 0.002
    byte_time = 10 / baud
    with LinkProxy(None, None, LinkConfig(baud=baud, latency=latency)).start() as proxy:
        fa, fb = open_raw(proxy.a_path), open_raw(proxy.b_path)
        try:
            # latency: one byte on an idle line, many times
            delays = []
            for _ in range(15):
                t0 = time.monotonic()
                os.write(fa, b"x")
                got = read_until(fb, 1, t0 + 1.0)
                assert got, "byte never arrived"
                delays.append(got[0][0] - t0)
                idle = select.select([fb], [], [], 0.005)  # wait for nothing: the line is idle
                assert idle[0] == []
            # A busy machine only ever makes a byte later: the earliest delivery is the proxy's
            # own delay, and it is the configured one (never early, at most 1.5 ms late on an
            # idle machine).
            assert latency + byte_time <= min(delays) < latency + byte_time + scaled(0.0015), delays
            # throughput: one second of back-to-back bytes
            n = 11520
            writer = threading.Thread(target=os.write, args=(fa, bytes(n)))
            writer.start()
            got = read_until(fb, n, time.monotonic() + 5.0)
            writer.join()
        finally:
            os.close(fa)
            os.close(fb)
        a_path = proxy.a_path
    assert sum(c for _, c in got) == n
    rate = paced_rate(got, baud / 10)
    # Never faster than the line; as fast within 3 % on an idle machine. (Starved of CPU for a
    # whole second, the proxy's thread cannot keep the schedule: the least late reads fall
    # behind it too, so the lower bound divides by the load per core.)
    assert rate < 1.03 * baud / 10, f"{rate:.0f} B/s"
    assert rate > 0.97 * baud / 10 / load_factor(), f"{rate:.0f} B/s, load {load_factor():.1f}"
    assert not os.path.exists(a_path)  # the pty went away with the proxy


@needs_pty
def test_pty_proxy_applies_faults_both_ways() -> None:
    cfg = LinkConfig(loss=0.25, seed=11)
    with LinkProxy(None, None, cfg).start() as proxy:
        fa, fb = open_raw(proxy.a_path), open_raw(proxy.b_path)
        try:
            os.write(fa, bytes(2000))
            os.write(fb, bytes(2000))
            # lost bytes never come: read each side until a deadline
            at_b = sum(c for _, c in read_until(fb, 2000, time.monotonic() + 0.3))
            at_a = sum(c for _, c in read_until(fa, 2000, time.monotonic() + 0.3))
        finally:
            os.close(fa)
            os.close(fb)
        stats = proxy.link.stats()
    assert at_b == 2000 - stats["a_to_b"]["bytes_lost"]
    assert at_a == 2000 - stats["b_to_a"]["bytes_lost"]
    assert within(stats["a_to_b"]["bytes_lost"], 2000, 0.25)


@needs_pty
def test_link_command_prints_paths_serves_and_exits_cleanly_on_sigterm() -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemlink", "link", "--baud", "115200", "--latency-ms", "1",
         "--stats"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 20.0
        buf = b""
        while len(lines) < 2 and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                chunk = os.read(proc.stdout.fileno(), 1024)
                if not chunk:
                    break
                buf += chunk
                lines = buf.decode().splitlines()
        assert len(lines) == 2, f"no paths printed: {buf!r}"
        fa, fb = open_raw(lines[0]), open_raw(lines[1])
        try:
            os.write(fa, b"hello")
            got = read_until(fb, 5, time.monotonic() + 2.0)
            assert sum(c for _, c in got) == 5 and os.read(fb, 0) == b""
        finally:
            os.close(fa)
            os.close(fb)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        stats = json.loads(proc.stderr.read().decode().strip().splitlines()[-1])
        assert stats["a_to_b"]["bytes_delivered"] == 5
        assert not os.path.exists(lines[0]) and not os.path.exists(lines[1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- scripted faults (for stateful tests) ---------------------------------------------------------


def test_forced_frame_faults_hit_exactly_the_next_frames() -> None:
    d = LinkDirection(LinkConfig())
    a, b, c, e = frames_of([b"A", b"B", b"C", b"E"])
    d.force_frame_fault(FrameFault.DROP)
    d.force_frame_fault(FrameFault.DUPLICATE)
    d.receive_data(a + b + c, 0.0)
    assert segments(delivered(d, 0.0)) == [b"\x02B", b"\x02B", b"\x02C"]
    d.force_frame_fault(FrameFault.REORDER)
    d.receive_data(a + b, 1.0)
    assert segments(delivered(d, 1.0)) == [b"\x02B", b"\x02A"]
    d.force_frame_fault(FrameFault.CORRUPT)
    d.receive_data(e, 2.0)
    (got,) = segments(delivered(d, 2.0)) or [b""]
    assert got != b"\x02E" and bin(int.from_bytes(got, "big") ^ 0x0245).count("1") == 1
    assert (d.stats.frames_lost, d.stats.frames_duplicated) == (1, 1)
    assert (d.stats.frames_reordered, d.stats.frames_corrupted) == (1, 1)
    d.receive_data(a, 3.0)  # nothing forced any more, no frame faults configured: plain bytes
    assert delivered(d, 3.0) == a and d.stats.frames_seen == 5  # only frames under a fault regime


def test_reconfigure_mid_run_keeps_pacing_and_hands_on_held_frames() -> None:
    from dataclasses import replace

    cfg = LinkConfig(baud=9600, reorder=1.0)
    d = LinkDirection(cfg)
    (a,) = frames_of([b"A"])
    d.receive_data(a, 0.0)  # held: waits for a successor
    assert delivered(d, 1.0) == b"\x00"
    d.reconfigure(replace(cfg, reorder=0.0, loss=1.0))
    assert delivered(d, 1.0) == b"\x02A\x00"  # handed on when frame faults went off
    d.receive_data(b"xyz", 1.0)
    assert delivered(d, 2.0) == b"" and d.stats.bytes_lost == 3
    d.reconfigure(cfg.__class__(baud=9600))
    d.receive_data(b"k", 2.0)
    assert d.next_event_time() == pytest.approx(2.0 + 10 / 9600)


@needs_pty
def test_pty_proxy_connects_an_existing_pty_and_a_url() -> None:
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        with LinkProxy(os.ttyname(slave), "loop://", LinkConfig(latency=0.001)).start():
            # device side writes into its pty; the proxy carries it to loop://, which echoes it
            os.write(master, b"round trip")
            got = b""
            deadline = time.monotonic() + 2.0
            while len(got) < 10:
                left = max(0.0, deadline - time.monotonic())
                if not select.select([master], [], [], left)[0]:
                    break
                got += os.read(master, 100)
            assert got == b"round trip"
    finally:
        os.close(master)
        os.close(slave)


# ---- frame mode on traffic without delimiters: an idle line ends a frame ------------------------


def test_without_a_gap_an_unterminated_unit_waits() -> None:
    d = LinkDirection(LinkConfig(frame_loss=0.01, seed=1))
    d.receive_data(b"C", 0.0)
    assert delivered(d, 10.0) == b"" and d.next_event_time() is None


def test_frame_gap_hands_on_an_unterminated_unit_after_silence() -> None:
    d = LinkDirection(LinkConfig(baud=115200, frame_loss=1e-9, frame_gap=0.005, seed=1))
    d.receive_data(b"\x06C", 0.0)
    due = d.next_event_time()
    assert due is not None and 0.005 < due < 0.006  # last byte's arrival + the gap
    assert delivered(d, due - 1e-4) == b""
    assert delivered(d, due) == b"\x06C"


def test_frame_gap_cuts_undelimited_traffic_into_frames_that_can_be_lost() -> None:
    cfg = LinkConfig(baud=115200, frame_loss=0.5, frame_gap=0.002, seed=7)
    d = LinkDirection(cfg)
    for i in range(200):  # 200 bursts of 3 bytes, 10 ms apart: 200 frames by silence alone
        d.receive_data(bytes([0x41 + i % 20]) * 3, i * 0.01)
    out = delivered(d, 10.0)
    assert d.stats.frames_seen == 200
    assert len(out) == 3 * (200 - d.stats.frames_lost)
    assert 60 < d.stats.frames_lost < 140
    # Whole frames only: every surviving burst is intact.
    assert all(out[k] == out[k + 1] == out[k + 2] for k in range(0, len(out), 3))


def test_frame_gap_must_be_positive() -> None:
    with pytest.raises(LinkConfigError):
        LinkConfig(frame_gap=0.0)


def test_link_monitor_decodes_the_frames_crossing_the_line() -> None:
    """``idemlink link --monitor`` between a host and the pty simulator: a spy on the wire."""
    from idemlink.device_sim.device import SimulatedDevice
    from idemlink.host.device import Device
    from idemlink.pytest_plugin import start_pty_sim

    sim = start_pty_sim(SimulatedDevice(seed=4))
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())",
         "link", "--b", sim.path, "--monitor"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,  # unbuffered: select works
    )
    try:
        assert proc.stdout is not None
        a_path = proc.stdout.readline().decode().strip()
        proc.stdout.readline()  # b path
        with Device.open(a_path) as dev:
            assert dev.write({"threshold": 321}).ok
        lines: list[str] = []
        deadline = time.monotonic() + 20
        while not any("RESPONSE" in ln for ln in lines):
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no RESPONSE decoded within 20 s: {lines}"
            lines.append(proc.stdout.readline().decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        sim.close()
    text = "".join(lines)
    assert "a->b HELLO" in text and "b->a HELLO_REPLY" in text
    assert "a->b REQUEST" in text and "threshold" in text
    assert "b->a RESPONSE" in text


def test_link_refuses_a_bad_regmap_even_without_monitor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--regmap`` is read whether or not ``--monitor`` is given: a file that is no map is one
    line and exit 1 before any pty is opened, not silently ignored."""
    from idemlink.cli import main

    bad = tmp_path / "map.json"
    bad.write_text("{bad")
    assert main(["link", "--regmap", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "not valid JSON" in err


# -- the delivery record, late copies, outages ----------------------------------------------------


def test_the_delivery_record_is_what_the_receiving_end_got_unit_by_unit() -> None:
    """Lost frames are not in it, a duplicate is there twice, a corrupted frame as corrupted,
    however the bytes were chunked and whenever the shell ticked."""
    payloads = [bytes([i]) * 5 for i in range(1, 40)]
    stream = b"".join(frames_of(payloads))
    cfg = LinkConfig(baud=9600, frame_loss=0.2, frame_dup=0.2, frame_corrupt=0.2, seed=5)
    records: list[list[bytes]] = []

    def run(chunk: int) -> LinkDirection:
        d = LinkDirection(cfg)
        got: list[bytes] = []
        d.record_deliveries(lambda t, unit: got.append(unit))
        out = b""
        for i in range(0, len(stream), chunk):
            d.receive_data(stream[i:i + chunk], i * 0.001)
            out += delivered(d, i * 0.001)
        out += delivered(d, 100.0)
        assert got == segments(out)  # exactly the receiving end's units
        records.append(got)
        return d

    d = [run(chunk) for chunk in (1, 7, len(stream))][-1]
    assert records[0] == records[1] == records[2]
    assert d.stats.frames_lost and d.stats.frames_duplicated and d.stats.frames_corrupted


def test_the_delivery_record_skips_a_unit_longer_than_any_frame() -> None:
    d = LinkDirection(LinkConfig())
    got: list[bytes] = []
    d.record_deliveries(lambda t, unit: got.append(unit))
    d.receive_data(b"\x00" + b"x" * (MAX_RECORDED_UNIT + 1) + b"\x00ok\x00", 0.0)
    d.tick(1.0)
    assert got == [b"ok"]


def test_a_delivery_log_records_both_ways_bounded_and_drains() -> None:
    link = Link(LinkConfig(latency=0.001))
    log = DeliveryLog(limit=3)
    link.record_deliveries(log)
    link.a_to_b.receive_data(b"\x00req\x00", 0.0)
    link.b_to_a.receive_data(b"\x00ans\x00", 0.0005)
    link.a_to_b.tick(0.0015)
    link.b_to_a.tick(0.0015)
    assert log.take() == [Delivery(0.0015, "a->b", b"req"), Delivery(0.0015, "b->a", b"ans")]
    assert log.take() == []
    link.a_to_b.receive_data(b"\x00a\x00b\x00c\x00d\x00", 1.0)
    link.a_to_b.tick(2.0)
    assert [d.unit for d in log.take()] == [b"b", b"c", b"d"] and log.dropped == 1
    link.record_deliveries(None)
    link.a_to_b.receive_data(b"\x00e\x00", 3.0)
    link.a_to_b.tick(4.0)
    assert log.take() == []


def test_a_late_copy_arrives_again_after_about_late_frames_more_frames() -> None:
    d = LinkDirection(LinkConfig(late_frames=10))
    a, *rest = frames_of([b"A"] + [bytes([0x41 + i]) for i in range(1, 30)])
    d.force_frame_fault(FrameFault.LATE)
    d.receive_data(a, 0.0)
    assert segments(delivered(d, 0.0)) == [b"\x02A"]  # the frame itself goes through
    out: list[bytes] = []
    for i, f in enumerate(rest):
        d.receive_data(f, 1.0 + i)
        out += segments(delivered(d, 1.0 + i))
    assert out.count(b"\x02A") == 1 and d.stats.frames_late == 1
    assert 5 <= out.index(b"\x02A") <= 16  # after 5..15 further frames


def test_late_copies_draw_their_own_stream_and_are_bounded() -> None:
    """Turning late copies on changes no other fault: the same frames are lost as without."""
    stream = b"".join(frames_of([i.to_bytes(2, "big") for i in range(1, 2000)]))
    lost = []
    for late in (0.0, 0.5):
        d = LinkDirection(LinkConfig(frame_loss=0.3, late=late, late_frames=100_000, seed=3))
        d.receive_data(stream, 0.0)
        lost.append(d.stats.frames_lost)
        if late:
            assert d.stats.frames_late == MAX_LATE_COPIES  # then no more are kept
    assert lost[0] == lost[1]


def test_an_outage_loses_what_is_sent_into_it_and_only_that() -> None:
    d = LinkDirection(LinkConfig(baud=9600, latency=0.01))
    d.receive_data(b"\x00before\x00", 0.0)
    d.outage(0.005, 0.5)  # the bytes already on the line still arrive
    d.receive_data(b"\x00during\x00", 0.1)
    d.receive_data(b"\x00after\x00", 0.5)
    assert segments(delivered(d, 10.0)) == [b"before", b"after"]
    assert d.stats.outage_bytes == 8 and d.stats.faults == 8
    with pytest.raises(LinkConfigError):
        d.outage(1.0, 1.0)


def test_the_proxy_sees_a_stop_that_did_not_wake_its_select() -> None:
    """A signal landing between serve's stop check and its select() runs the Python handler
    (which wakes the loop) only after select returns: with no traffic, serve must still return
    soon. Simulated by setting the stop flag without the wake-up byte."""
    from idemlink.device_sim.link_proxy import SIGNAL_LATENCY, LinkProxy

    with LinkProxy(None, None, LinkConfig()) as proxy:
        done = threading.Event()

        def serve() -> None:
            proxy.serve()
            done.set()

        threading.Thread(target=serve, daemon=True).start()
        proxy._stop.set()  # the flag only, as a deferred handler leaves it
        assert done.wait(scaled(SIGNAL_LATENCY * 10)), "serve blocked with the stop flag set"
