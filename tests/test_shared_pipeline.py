"""Concurrent callers share one pipeline: tasks of one ``AsyncDevice`` (threads of one ``Device``)
have their requests on the line together, up to the window, with ``stream``'s ordering rule and
the outcome rules of a single ``run`` per caller; a cancelled caller settles only its own commands.

What ran is judged from the simulator's own record (``SimulatedDevice.executions``: one record per
command it really ran), never from the results. Throughput is measured on the simulated clock
(``SimTransport`` paces the bytes), so the figures are deterministic; nothing here waits on a
wall clock but protocol timeouts, which go through ``support.timing.scaled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections import Counter
from typing import Any

import pytest
from support.aio import DropsSomeAnswers
from support.muted import MutedFor
from support.rtu import LossyWire
from support.timing import scaled, wait_until

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import AsyncSimTransport, SimTransport
from idemlink.host.aio import AsyncDevice
from idemlink.host.command import Command, Result
from idemlink.host.device import Device
from idemlink.host.errors import LinkLost, UnknownOutstanding
from idemlink.host.rtu_device import RtuDevice
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.host_session import Completion, HostSession, SessionState
from idemlink.protocol.modbus import FunctionCode
from idemlink.protocol.modbus_rtu import decode_rtu, encode_rtu
from idemlink.protocol.outcome import Outcome, Status
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.protocol.rtu_master import RtuMaster
from idemlink.pytest_plugin import start_pty_sim

BAUD = 115200
COUNT = 9
TASKS = 32


def full_duplex_bound() -> float:
    """Reads per second a full-duplex line carries when it never idles (the larger frame rules)."""
    req = encode_frame(FrameType.REQUEST, 0x01020304, 0x0A0B0C0D, bytes([3, 0, 0, 0, COUNT]))
    resp = encode_frame(FrameType.RESPONSE, 0x01020304, 0x0A0B0C0D,
                        bytes([0, 3, 2 * COUNT]) + bytes(range(1, 2 * COUNT + 1)))
    return BAUD / (10 * max(len(req), len(resp)))


def ran(sim: SimulatedDevice, pdu: bytes) -> int:
    """How many times the device really ran the request ``pdu`` (its own record)."""
    return sum(e.request == pdu for e in sim.executions)


def writes_of(sim: SimulatedDevice, address: int) -> list[int]:
    """The values the device wrote to ``address`` with FC06, in the order it ran them."""
    head = bytes([FunctionCode.WRITE_SINGLE_REGISTER]) + address.to_bytes(2, "big")
    return [int.from_bytes(e.request[3:5], "big") for e in sim.executions
            if e.request[:3] == head]


def is_write_to(address: int) -> Any:
    head = bytes([FunctionCode.WRITE_SINGLE_REGISTER]) + address.to_bytes(2, "big")
    return lambda pdu: pdu[:3] == head


def is_read_of(address: int) -> Any:
    head = bytes([FunctionCode.READ_HOLDING_REGISTERS]) + address.to_bytes(2, "big")
    return lambda pdu: pdu[:3] == head


# ---------------------------------------------------------------------------- throughput


@pytest.mark.parametrize("latency", [0.0, 0.002, 0.010, 0.020])
def test_32_tasks_each_awaiting_execute_keep_the_line_busy(latency: float) -> None:
    """The issue's figure on the simulated clock: 32 tasks each awaiting ``execute()`` of a
    9-register read reach 95 % of the full-duplex bound, as one ``stream()`` does (behind the old
    per-device lock they reached 33 % at 2 ms: one request on the line at a time)."""
    sim = SimTransport(SimulatedDevice(seed=1), LinkConfig(baud=BAUD, latency=latency))
    per_task = 12

    async def session() -> float:
        dev = AsyncDevice(AsyncSimTransport(sim), max_inflight=32, timeout=0.5)
        await dev.connect()
        cmd = dev.read_command(0, COUNT)
        assert (await dev.execute(cmd)).ok

        async def poll() -> None:
            for _ in range(per_task):
                r = await dev.execute(cmd)
                assert r.ok and len(r.values) == COUNT

        t0 = sim.now()
        await asyncio.gather(*(poll() for _ in range(TASKS)))
        return TASKS * per_task / (sim.now() - t0)

    rate = asyncio.run(session())
    assert rate >= 0.95 * full_duplex_bound(), f"{rate:.1f}/s of {full_duplex_bound():.1f}/s"


# ---------------------------------------------------------------------------- correctness


def test_many_tasks_get_their_own_results_and_nothing_runs_twice() -> None:
    """32 tasks writing and reading at once over a lossy line (lost and duplicated frames, so
    retries and replays): every result is OK and right, every write ran exactly once by the
    device's own record, and the tasks' requests really were on the line together."""
    sim = SimTransport(SimulatedDevice(seed=11),
                       LinkConfig(frame_loss=0.15, frame_dup=0.1, seed=11))
    deepest = [0]
    writes: list[Command] = []

    async def session() -> None:
        dev = AsyncDevice(AsyncSimTransport(sim), max_inflight=8, timeout=0.02, attempts=20)
        await dev.connect()
        session_ = dev.ops.session

        def seen(_: Result) -> None:
            deepest[0] = max(deepest[0], session_.outstanding + 1)

        dev.ops.on_result = seen

        async def worker(i: int) -> None:
            for k in range(6):
                register = ("threshold", "fan_setpoint")[i % 2]
                value = (10 * i + k) if register == "threshold" else (3 * i + k) % 101
                w = dev.write_command({register: value})
                writes.append(w)
                r = await dev.execute(w)
                assert r.outcome is Outcome.OK, r.describe()
                got = await dev.read("temperature", 3)
                assert got.ok and len(got.values) == 3

        await asyncio.gather(*(worker(i) for i in range(TASKS)))
        await dev.close()

    asyncio.run(session())
    assert deepest[0] > 1, "the tasks' requests were never on the line together"
    counts = Counter(w.pdu() for w in writes)
    for pdu, n in counts.items():
        assert ran(sim.device, pdu) == n, f"{pdu.hex()} asked {n}x, ran {ran(sim.device, pdu)}x"


def test_non_commuting_writes_keep_the_order_they_were_submitted_in() -> None:
    """Writes to the same register from different tasks run in the order the tasks submitted
    them (reads of other registers overtake them); the last submitted value is what stays."""
    device = SimulatedDevice(seed=12)
    submitted: list[int] = []

    async def session() -> None:
        t = DropsSomeAnswers(device, lambda pdu: False)
        dev = AsyncDevice(t, max_inflight=8, timeout=scaled(1.0))
        await dev.connect()

        async def writer(v: int) -> None:
            submitted.append(v)  # the submission happens before the task's first await
            assert (await dev.write({"threshold": v})).ok

        async def reader() -> None:
            for _ in range(5):
                assert (await dev.read("humidity")).ok

        await asyncio.gather(*(writer(100 + 7 * i) for i in range(20)),
                             *(reader() for _ in range(4)))
        assert t.deepest > 1
        assert (await dev.read("threshold")).values == (submitted[-1],)

    asyncio.run(session())
    assert writes_of(device, 4) == submitted


def test_a_cancelled_task_settles_its_own_read_and_the_others_go_on() -> None:
    """A task whose read is out (its answer lost) is cancelled: its read is UNKNOWN (CANCELLED)
    and blocks nothing; the other tasks finished meanwhile, each write exactly once. Behind the
    old lock they waited for the stuck read."""
    device = SimulatedDevice(seed=13)

    async def session() -> None:
        t = DropsSomeAnswers(device, is_read_of(6))
        dev = AsyncDevice(t, max_inflight=8, timeout=scaled(30.0), attempts=2)
        await dev.connect()
        stuck = asyncio.create_task(dev.read("fan_setpoint"))
        await t.out.wait()  # the read is out; its answer will never come

        async def worker(i: int) -> list[Result]:
            return [await dev.write({"threshold": 500 + 10 * i + k}) for k in range(5)]

        async with asyncio.timeout(scaled(10.0)):
            others = await asyncio.gather(*(worker(i) for i in range(8)))
        assert not stuck.done()
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError) as caught:
            await stuck
        settled = caught.value.settled_results  # type: ignore[attr-defined]
        assert [(r.outcome, r.status) for r in settled] == [(Outcome.UNKNOWN, Status.CANCELLED)]
        assert dev.unknown is None  # a read changed nothing
        assert dev.ops.session.outstanding == 0 and not dev.ops.awaiting
        assert all(r.ok for rs in others for r in rs)
        assert (await dev.read("threshold")).ok

    asyncio.run(session())
    for i in range(8):
        for k in range(5):
            assert writes_of(device, 4).count(500 + 10 * i + k) == 1


def test_a_cancelled_write_blocks_the_handle_for_everyone_as_any_unknown_does() -> None:
    """A task whose write is out (its answer lost) is cancelled: UNKNOWN (CANCELLED), it may have
    run, so the handle is blocked: a command waiting behind it (a read of the same register) is
    never sent (NOT_EXECUTED), new calls are refused, and reconcile finds that it ran — once."""
    device = SimulatedDevice(seed=14)

    async def session() -> None:
        t = DropsSomeAnswers(device, is_write_to(6))
        dev = AsyncDevice(t, max_inflight=8, timeout=scaled(30.0), attempts=2)
        await dev.connect()
        writer = asyncio.create_task(dev.write({"fan_setpoint": 77}))
        await t.out.wait()
        behind = asyncio.create_task(dev.read("fan_setpoint"))  # conflicts: held
        fine = await dev.read("humidity")  # commutes: overtakes the stuck write
        assert fine.ok
        assert not behind.done()
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        assert dev.unknown is not None and dev.unknown.status is Status.CANCELLED
        r = await behind
        assert r.outcome is Outcome.NOT_EXECUTED and r.status is None
        assert not [e for e in device.executions if is_read_of(6)(e.request)]  # never left
        with pytest.raises(UnknownOutstanding):
            await dev.read("humidity")
        t.drop = lambda pdu: False
        t.dropped.clear()
        rec = await dev.reconcile()
        assert rec is not None and rec.executed is True
        dev.acknowledge_unknown()
        assert (await dev.read("fan_setpoint")).values == (77,)

    asyncio.run(session())
    assert writes_of(device, 6) == [77]  # ran once: never re-sent behind the caller's back


def test_an_unknown_write_from_the_line_blocks_the_others_as_documented() -> None:
    """A write whose answers are all lost ends UNKNOWN (NO_ANSWER) and blocks the handle: the other
    tasks' commands already on the line complete with their own outcomes, one waiting behind it is
    NOT_EXECUTED (never sent), and a caller arriving afterwards is refused."""
    device = SimulatedDevice(seed=15)

    async def session() -> None:
        t = DropsSomeAnswers(device, is_write_to(5))
        dev = AsyncDevice(t, max_inflight=8, timeout=scaled(0.2), attempts=2)
        await dev.connect()

        async def reads() -> list[Result]:
            return await dev.run([dev.read_command("temperature", 3)] * 4)

        w = asyncio.create_task(dev.write({"mode": 2}))
        await t.out.wait()
        behind = asyncio.create_task(dev.write({"mode": 0}))  # conflicts: waits for the first
        others = await asyncio.gather(*(reads() for _ in range(6)))
        r = await w
        assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
        assert (await behind).outcome is Outcome.NOT_EXECUTED
        assert all(x.ok for rs in others for x in rs)
        assert dev.unknown is r
        with pytest.raises(UnknownOutstanding):
            await dev.read("temperature")

    asyncio.run(session())
    assert writes_of(device, 5) == [2]  # ran once (its retries were replayed); the other never


def test_operations_that_need_the_device_alone_wait_for_the_shared_pipeline() -> None:
    """A stream (and reconcile, send_files...) has the device alone: started while other tasks
    share the pipeline, it waits for what is out, runs, and the tasks go on after it."""
    sim = SimTransport(SimulatedDevice(seed=16), LinkConfig(frame_loss=0.1, seed=16))

    async def session() -> None:
        dev = AsyncDevice(AsyncSimTransport(sim), max_inflight=8, timeout=0.02, attempts=20)
        await dev.connect()

        async def worker(i: int) -> None:
            for k in range(8):
                assert (await dev.write({"threshold": 20 * i + k})).ok

        async def streamer() -> list[Result]:
            async with contextlib.aclosing(
                    dev.stream([dev.read_command("mode")] * 30)) as results:
                return [r async for r in results]

        *_, streamed = await asyncio.gather(*(worker(i) for i in range(10)), streamer())
        assert len(streamed) == 30 and all(r.ok for r in streamed)

    asyncio.run(session())
    for i in range(10):
        assert [v for v in writes_of(sim.device, 4) if 20 * i <= v < 20 * i + 8] == \
            [20 * i + k for k in range(8)]


def test_closing_the_device_under_waiting_tasks_settles_them() -> None:
    """``close()`` while tasks wait: each gets ``LinkLost`` with its own settled results (UNKNOWN
    if it was out), never a hang."""
    device = SimulatedDevice(seed=17)

    async def session() -> None:
        t = DropsSomeAnswers(device, is_read_of(6))
        dev = AsyncDevice(t, max_inflight=8, timeout=scaled(30.0), attempts=2)
        await dev.connect()
        task = asyncio.create_task(dev.read("fan_setpoint"))
        await t.out.wait()
        await dev.close()
        with pytest.raises(LinkLost) as caught:
            await task
        assert [r.outcome for r in caught.value.results] == [Outcome.UNKNOWN]

    asyncio.run(session())


# ---------------------------------------------------------------------------- threads


class Deepest(SimTransport):
    """Records the most requests the host session had out at once, at each write."""

    dev: Device | None = None
    deepest = 0

    def write(self, data: bytes) -> None:
        if self.dev is not None:
            self.deepest = max(self.deepest, self.dev.ops.session.outstanding)
        super().write(data)


def test_threads_sharing_one_device_share_its_pipeline_exactly_once() -> None:
    """Eight threads calling one blocking ``Device`` over a lossy line: every result right, every
    write run exactly once by the device's record, requests of several threads on the line at
    once; a thread streaming meanwhile has the device alone and waits its turn (before, a second
    thread was refused: one operation at a time)."""
    sim = Deepest(SimulatedDevice(seed=21), LinkConfig(frame_loss=0.15, frame_dup=0.1, seed=21))
    dev = Device(sim, max_inflight=8, timeout=0.02, attempts=20)
    dev.connect()
    sim.dev = dev
    errors: list[BaseException] = []
    start = threading.Barrier(9)

    def worker(i: int) -> None:
        try:
            start.wait(scaled(10.0))
            for k in range(10):
                r = dev.write({"threshold": 10 * i + k})
                assert r.outcome is Outcome.OK, r.describe()
                assert dev.read("temperature", 2).ok
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def streamer() -> None:
        try:
            start.wait(scaled(10.0))
            got = list(dev.stream([dev.read_command("mode")] * 20))
            assert len(got) == 20 and all(r.ok for r in got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=streamer))
    for th in threads:
        th.start()
    for th in threads:
        th.join(scaled(60.0))
        assert not th.is_alive()
    assert not errors, errors
    assert sim.deepest > 1, "the threads' requests were never on the line together"
    for i in range(8):
        assert [v for v in writes_of(sim.device, 4) if 10 * i <= v < 10 * i + 10] == \
            [10 * i + k for k in range(10)]


def test_threads_sharing_a_plain_modbus_slave_are_served_one_request_at_a_time() -> None:
    """``RtuDevice`` (depth one) shared by threads: every caller served, in its own order."""
    wire = LossyWire(lambda pdu, n: n == 1)  # every first answer lost: each request retried
    dev = RtuDevice(wire, timeout=0.05, attempts=5)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for k in range(5):
                assert dev.write({"threshold": 100 * i + k}).ok
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(scaled(60.0))
        assert not th.is_alive()
    assert not errors, errors
    written = [decode_rtu(r).pdu for r in wire.requests]
    for i in range(4):
        mine = [int.from_bytes(p[3:5], "big") for p in written
                if p[:3] == bytes([6, 0, 4]) and 100 * i <= int.from_bytes(p[3:5], "big") < 100 * i + 5]
        assert sorted(set(mine), key=mine.index) == [100 * i + k for k in range(5)]


# ---------------------------------------------------------------------------- the sessions


def test_a_host_session_abandons_the_requests_of_some_tags_only() -> None:
    device = SimulatedDevice(seed=31)
    host = HostSession(contract_hash=contract_hash(), timeout=1.0, max_inflight=2)
    host.open(0.0)
    device.receive_data(host.data_to_send(), 0.0)
    host.receive_data(device.data_to_send(), 0.0)
    assert host.state is SessionState.OPEN
    for tag, v in (("a", 1), ("b", 2), ("c", 0)):
        host.submit(bytes([6, 0, 5, 0, v]), 0.0, set_only=True, tag=tag)
    wire = host.data_to_send()  # a and b are out, c waits for room
    host.abandon(Status.CANCELLED, ["b", "c"])
    assert [(e.tag, e.outcome, e.status) for e in iter(host.next_event, None)
            if isinstance(e, Completion)] == [("b", Outcome.UNKNOWN, Status.CANCELLED),
                                               ("c", Outcome.NOT_EXECUTED, None)]
    assert host.outstanding == 1
    device.receive_data(wire, 0.1)
    host.receive_data(device.data_to_send(), 0.1)  # a's answer, and b's: now a late answer
    (a,) = [e for e in iter(host.next_event, None) if isinstance(e, Completion)]
    assert (a.tag, a.outcome) == ("a", Outcome.OK)
    assert host.outstanding == 0 and host.counters.late_answers == 1


def test_an_rtu_master_abandons_the_request_out_and_waits_out_its_deadline() -> None:
    """The request out is abandoned (its caller was cancelled): the next one does not leave
    before the abandoned one's deadline, so a late answer to it is not taken for the next."""
    m = RtuMaster(DEFAULT_MAP, timeout=0.1)
    m.submit(bytes([6, 0, 4, 0, 9]), 0.0, tag="out")
    m.tick(0.0)
    assert m.data_to_send()
    m.submit(bytes([3, 0, 4, 0, 1]), 0.0, tag="next")
    m.abandon(Status.CANCELLED, ["out"])
    assert [(e.tag, e.outcome, e.status) for e in iter(m.next_event, None)] == [
        ("out", Outcome.UNKNOWN, Status.CANCELLED)]
    m.tick(0.05)
    assert m.data_to_send() == b"" and m.outstanding == 1
    m.tick(0.11)
    assert m.data_to_send() == encode_rtu(1, bytes([3, 0, 4, 0, 1]))


def test_a_threads_command_leaves_at_once_while_another_threads_request_waits() -> None:
    """On a real pty: thread A's write is out and its answer lost (A waits for its retry); the
    main thread's read does not wait for A's deadline: it cuts the driving thread's wait short
    (``SerialTransport.wake``) and is answered while A still waits; then A's retry is answered
    (replayed: the write ran once)."""
    device = MutedFor(is_write_to(6), seed=41)
    pty = start_pty_sim(device)
    try:
        with Device.open(pty.path, max_inflight=8, timeout=scaled(1.0), attempts=3) as dev:
            got: list[Result] = []
            a = threading.Thread(target=lambda: got.append(dev.write({"fan_setpoint": 66})))
            a.start()
            assert device.out.wait(scaled(10.0))
            r = dev.read("humidity")
            assert r.ok and not got
            assert dev.ops.session.counters.retries == 0, \
                "the read waited for the other thread's deadline (and its retry)"
            device.muted.clear()
            a.join(scaled(20.0))
            assert got and got[0].ok and got[0].replay
    finally:
        pty.close()
    assert writes_of(device, 6) == [66]


def test_tasks_on_a_real_pty_over_a_lossy_line_run_every_write_once() -> None:
    """``AsyncDevice.open`` on a pty behind the link emulator losing and duplicating frames, in
    real time: 16 tasks, every write OK and run exactly once by the device's record."""
    pty = start_pty_sim(SimulatedDevice(seed=51), LinkConfig(frame_loss=0.1, frame_dup=0.05,
                                                             seed=51))

    async def session() -> list[Command]:
        sent: list[Command] = []
        async with AsyncDevice.open(pty.path, max_inflight=8, timeout=scaled(0.1),
                                    attempts=30) as dev:
            async def worker(i: int) -> None:
                for k in range(4):
                    w = dev.write_command({"threshold": 40 * i + k})
                    sent.append(w)
                    r = await dev.execute(w)
                    assert r.outcome is Outcome.OK, r.describe()
                    assert (await dev.read("mode")).ok

            await asyncio.gather(*(worker(i) for i in range(16)))
        return sent

    try:
        sent = asyncio.run(session())
    finally:
        pty.close()
    for w in sent:
        assert ran(pty.device, w.pdu()) == 1, w.pdu().hex()


def test_an_interrupted_waiting_thread_settles_its_own_command_only() -> None:
    """Ctrl-C (SIGINT) reaches the main thread while it waits for its read, held behind another
    thread's write whose answer is lost: the read is settled NOT_EXECUTED (never sent) on the
    KeyboardInterrupt, and the other thread's write goes on to its own result (replayed: once)."""
    device = MutedFor(is_write_to(6), seed=52)
    pty = start_pty_sim(device)
    try:
        with Device.open(pty.path, max_inflight=8, timeout=scaled(1.0), attempts=5) as dev:
            got: list[Result] = []
            a = threading.Thread(target=lambda: got.append(dev.write({"fan_setpoint": 55})))
            a.start()
            assert device.out.wait(scaled(10.0))

            def interrupt() -> None:
                wait_until(lambda: dev._shared.pipe is not None and dev._shared.pipe.held,
                           what="the main thread's read held behind the write")
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

            helper = threading.Thread(target=interrupt)
            helper.start()
            with pytest.raises(KeyboardInterrupt) as caught:
                dev.read("fan_setpoint")  # conflicts with the write out: held
            helper.join(scaled(10.0))
            settled = caught.value.settled_results  # type: ignore[attr-defined]
            assert [(r.outcome, r.status) for r in settled] == [(Outcome.NOT_EXECUTED, None)]
            assert dev.unknown is None
            device.muted.clear()
            a.join(scaled(30.0))
            assert got and got[0].ok
            assert (dev.read("fan_setpoint")).values == (55,)
    finally:
        pty.close()
    assert writes_of(device, 6) == [55]
    assert sum(is_read_of(6)(e.request) for e in device.executions) == 1  # only the last one


def test_an_interrupted_driving_thread_stops_the_loop_under_every_thread() -> None:
    """Ctrl-C (SIGINT) reaches the main thread while it drives the shared loop for its own write
    (answer lost) and another thread's read waits behind that write: the write settles UNKNOWN
    (CANCELLED) and blocks the handle, the waiting thread gets ``LinkLost`` carrying its own read
    settled NOT_EXECUTED (never sent), and the device's record shows the write ran once and the
    read never did (docs/API.md, "Concurrent callers")."""
    device = MutedFor(is_write_to(6), seed=53)
    pty = start_pty_sim(device)
    try:
        with Device.open(pty.path, max_inflight=8, timeout=scaled(1.0), attempts=50) as dev:
            other: list[BaseException] = []

            def reader() -> None:
                try:
                    dev.read("fan_setpoint")  # conflicts with the write out: held
                except BaseException as exc:  # reported by the main thread
                    other.append(exc)

            def interrupt() -> None:
                assert device.out.wait(scaled(10.0))
                b.start()
                wait_until(lambda: dev._shared.pipe is not None and dev._shared.pipe.held,
                           what="the other thread's read held behind the write")
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

            b = threading.Thread(target=reader)
            helper = threading.Thread(target=interrupt)
            helper.start()
            with pytest.raises(KeyboardInterrupt) as caught:
                dev.write({"fan_setpoint": 56})  # the main thread drives: its answer is lost
            helper.join(scaled(10.0))
            b.join(scaled(10.0))
            assert not b.is_alive()
            mine = caught.value.settled_results  # type: ignore[attr-defined]
            assert [(r.outcome, r.status) for r in mine] == [(Outcome.UNKNOWN, Status.CANCELLED)]
            assert len(other) == 1 and isinstance(other[0], LinkLost), other
            assert [(r.outcome, r.status) for r in other[0].results] == \
                [(Outcome.NOT_EXECUTED, None)]
            with pytest.raises(UnknownOutstanding):
                dev.read("fan_setpoint")
    finally:
        pty.close()
    assert writes_of(device, 6) == [56]
    assert not any(is_read_of(6)(e.request) for e in device.executions)
