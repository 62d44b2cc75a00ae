"""Fair scheduling and the breaker's re-probe schedule on the host's bus handle (issue 22 item 3;
docs/BUS.md, "The bus handle"). The service order is read from the medium: the addresses of the
REQUEST frames the master put on the simulated line, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from idemlink.device_sim.bus import MASTER, BusConfig, BusTransport
from idemlink.device_sim.bus import Bus as Medium
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import AsyncSimTransport
from idemlink.host import bus as host_bus
from idemlink.host.aio_bus import AsyncBus
from idemlink.host.bus import Bus
from idemlink.protocol.bus_rules import (
    TRANSITIONS,
    Breaker,
    BreakerAction,
    BreakerInput,
    BreakerPolicy,
    BreakerState,
    next_in_turn,
)
from idemlink.protocol.frame import FrameDecoder, FrameType
from idemlink.protocol.outcome import Outcome, Status


class Recording(BusTransport):
    """The master's end of the medium, noting the address of every REQUEST it sends."""

    def __init__(self, medium: Medium) -> None:
        super().__init__(medium)
        self.decoder = FrameDecoder()
        self.order: list[int] = []

    def write(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        while (f := self.decoder.next_event()) is not None:
            if getattr(f, "type", None) is FrameType.REQUEST and f.address is not None:
                self.order.append(f.address)
        super().write(data)


def medium(n: int) -> tuple[Medium, Recording]:
    m = Medium([SimulatedDevice(seed=300 + a, address=a) for a in range(1, n + 1)],
               BusConfig(baud=115200, turnaround=0.001))
    return m, Recording(m)


def wait_for(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10.0
    while not cond():
        assert time.monotonic() < deadline, "the callers never queued"
        time.sleep(0.001)


def served_in_threads(queues: dict[int, int]) -> list[int]:
    """Each device's ``run`` of ``queues[a]`` reads from its own thread, all queued before the
    line is free: the addresses in the order the master sent their requests."""
    m, t = medium(len(queues))
    bus = Bus(t, timeout=0.05)
    for a in queues:
        bus.device(a).connect()
    t.order.clear()
    bus.turn.acquire(0)  # the line is busy while the callers queue (key 0: nobody's device)
    errors: list[BaseException] = []

    def work(a: int) -> None:
        try:
            d = bus.device(a)
            assert all(r.outcome is Outcome.OK
                       for r in d.run([d.read_command("mode") for _ in range(queues[a])]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(a,)) for a in queues]
    for th in threads:
        th.start()
    wait_for(lambda: bus.turn.waiting == set(queues))
    bus.turn.release(0)
    for th in threads:
        th.join()
    assert not errors and m.stats.collisions == 0
    return t.order


def test_the_turn_rule_is_round_robin_among_the_waiting() -> None:
    assert next_in_turn([], 3) is None
    assert next_in_turn([2, 5, 9], None) == 2
    assert next_in_turn([2, 5, 9], 5) == 9
    assert next_in_turn([2, 5, 9], 9) == 2  # wraps around
    assert next_in_turn([0, 4], 3) == 4


def test_threads_on_three_devices_are_served_one_transaction_each_in_turn() -> None:
    """A deep queue (12 reads on device 1) does not starve devices 2 and 3 (3 each): they are
    served in turn from the start, each of them done within the first 9 transactions."""
    order = served_in_threads({1: 12, 2: 3, 3: 3})
    assert order == [1, 2, 3] * 3 + [1] * 9


def test_a_turn_passed_per_operation_makes_the_small_queues_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The can-fail check: the same model with the turn passed per operation (the handle before
    per-transaction fairness) serves each queue whole, the deep one first."""
    monkeypatch.setattr(host_bus.Holding, "gives_up", lambda self: False)
    assert served_in_threads({1: 12, 2: 3, 3: 3}) == [1] * 12 + [2] * 3 + [3] * 3


def test_tasks_on_three_devices_are_served_in_turn() -> None:
    m, t = medium(3)

    async def main() -> None:
        bus = AsyncBus(AsyncSimTransport(t), timeout=0.05)  # type: ignore[arg-type]
        for a in (1, 2, 3):
            await bus.device(a).connect()
        t.order.clear()
        await bus.turn.acquire(0)

        async def work(a: int, n: int) -> None:
            d = bus.device(a)
            results = await d.run([d.read_command("mode") for _ in range(n)])
            assert all(r.outcome is Outcome.OK for r in results)

        tasks = [asyncio.ensure_future(work(a, n)) for a, n in ((1, 8), (2, 2), (3, 2))]
        while set(bus.turn.waiting) != {1, 2, 3}:
            await asyncio.sleep(0)
        bus.turn.release(0)
        await asyncio.gather(*tasks)
        await bus.close()

    asyncio.run(main())
    assert t.order == [1, 2, 3, 1, 2, 3] + [1] * 6
    assert m.stats.collisions == 0


def breaker_in(state: BreakerState) -> Breaker:
    """A breaker (2 failures open it, 1 s cooldown) brought to ``state`` at t = 10 by its own
    inputs."""
    b = Breaker(BreakerPolicy(failures=2, cooldown=1.0, backoff=3.0, max_cooldown=5.0))
    if state is not BreakerState.CLOSED:
        b.record(False, 10.0)
        b.record(False, 10.0)  # OPEN until 11
    if state is BreakerState.PROBING:
        b.allows(11.0)
    assert b.state is state
    return b


@pytest.mark.parametrize(("state", "event"), sorted(TRANSITIONS, key=str))
def test_every_row_of_the_breaker_table(state: BreakerState, event: BreakerInput) -> None:
    """Each row run through the public inputs (``record``, ``allows``), its next state and what
    its action did to the counters and the probe time."""
    b = breaker_in(state)
    before = (b.failures, b.cooldown, b.open_until, b.probes)
    now = {BreakerInput.ASKED_EARLY: 10.5}.get(event, 11.0)
    if event is BreakerInput.MISSED_ENOUGH and state is BreakerState.CLOSED:
        b.record(False, 9.0)  # the first miss: the second reaches the policy's two
        before = (b.failures, b.cooldown, b.open_until, b.probes)
    if event is BreakerInput.MISSED and state is not BreakerState.CLOSED:
        b.failures = -1  # below the policy's again: the row, not the count, decides
    if event in (BreakerInput.ANSWERED, BreakerInput.MISSED, BreakerInput.MISSED_ENOUGH):
        b.record(event is BreakerInput.ANSWERED, now)
        allowed = None
    else:
        allowed = b.allows(now)
    nxt, action = TRANSITIONS[(state, event)]
    assert b.state is nxt
    failures, cooldown, open_until, probes = before
    if action is BreakerAction.RESET:
        assert (b.failures, b.cooldown) == (0, 1.0)
    elif action is BreakerAction.COUNT:
        assert b.failures == failures + 1 and b.open_until == open_until
    elif action is BreakerAction.OPEN:
        assert b.open_until == now + cooldown
    elif action is BreakerAction.BACK_OFF:
        assert (b.cooldown, b.open_until) == (3.0, now + 3.0)
    elif action is BreakerAction.PROBE:
        assert allowed is True and b.probes == probes + 1
    elif action is BreakerAction.REFUSE:
        assert allowed is False and b.open_until == open_until
    else:
        assert action is BreakerAction.PASS and allowed is True
    assert {(s, e) for s in BreakerState for e in BreakerInput} == set(TRANSITIONS)


def test_the_breaker_backs_off_and_says_when_to_probe() -> None:
    b = Breaker(BreakerPolicy(failures=1, cooldown=1.0, backoff=3.0, max_cooldown=5.0))
    assert b.next_probe is None
    b.record(False, 10.0)
    assert (b.state, b.next_probe) == (BreakerState.OPEN, 11.0)
    assert not b.probe_due(10.9) and b.probe_due(11.0)
    probe_times = []
    now = 11.0
    for _ in range(4):  # every probe fails: 3 s, 5 s (the cap), 5 s ...
        assert b.allows(now) and b.state is BreakerState.PROBING
        b.record(False, now)
        assert b.next_probe is not None
        now = b.next_probe
        probe_times.append(now)
    assert probe_times == [14.0, 19.0, 24.0, 29.0]
    assert b.allows(29.0)
    b.record(True, 29.1)
    assert (b.state, b.cooldown, b.next_probe) == (BreakerState.CLOSED, 1.0, None)


def test_a_dead_device_is_probed_on_schedule_while_the_others_work() -> None:
    """Nothing is asked of device 2 after its breaker opens; the others' traffic carries its
    probes at 1 s, then 2 s, 4 s later (backoff); once it is back, the next scheduled probe
    closes its breaker and its next command is served."""
    m, t = medium(3)
    m.set_dead(2)
    bus = Bus(t, timeout=0.02, attempts=2,
              breaker=BreakerPolicy(failures=1, cooldown=1.0, backoff=2.0, max_cooldown=8.0))
    for a in (1, 3):
        bus.device(a).connect()
    r = bus.device(2).write({"mode": 1})
    assert (r.outcome, r.status) == (Outcome.NOT_EXECUTED, Status.BREAKER_OPEN)
    opened_at = t.now()
    assert bus.next_probe() == pytest.approx(opened_at + 1.0)
    probes = []
    while t.now() < opened_at + 7.5:
        before = m.stats.by_sender[MASTER]
        t.advance(0.05)
        assert bus.device(1).read("mode").outcome is Outcome.OK
        if bus.device(2).breaker.probes > len(probes):
            probes.append(t.now() - opened_at)
            assert m.stats.by_sender[MASTER] > before + 1  # the probe's HELLOs went out
    # due at 1 s, then 2 s and 4 s after each failed probe ended (each costs its HELLOs' time
    # and is noticed at the next read: within 0.15 s)
    gaps = [b - a for a, b in zip([0.0, *probes], probes, strict=False)]
    assert len(probes) == 3
    assert all(0 <= g - want < 0.15 for g, want in zip(gaps, [1.0, 2.0, 4.0], strict=True))
    m.set_dead(2, False)
    t.advance(8.0)
    assert bus.probe_due() == {2: True}  # an idle program follows the schedule itself
    assert bus.device(2).breaker.state is BreakerState.CLOSED and bus.next_probe() is None
    assert bus.device(2).write({"mode": 2}).outcome is Outcome.OK


def test_asyncio_a_dead_device_is_probed_on_schedule() -> None:
    m, t = medium(2)
    m.set_dead(2)

    async def main() -> None:
        bus = AsyncBus(AsyncSimTransport(t), timeout=0.02, attempts=2,  # type: ignore[arg-type]
                       breaker=BreakerPolicy(failures=1, cooldown=1.0))
        r = await bus.device(2).read("mode")
        assert r.status is Status.BREAKER_OPEN and bus.next_probe() is not None
        assert await bus.probe_due() == {}  # not due yet
        t.advance(1.0)
        assert (await bus.device(1).read("mode")).outcome is Outcome.OK  # carries the probe
        assert bus.device(2).breaker.probes == 1 and bus.device(2).breaker.cooldown == 2.0
        m.set_dead(2, False)
        t.advance(2.0)
        assert await bus.probe_due() == {2: True}
        assert (await bus.device(2).read("mode")).outcome is Outcome.OK
        await bus.close()

    asyncio.run(main())


def test_a_command_to_another_device_inside_a_stream_does_not_wait_for_itself() -> None:
    """The thread iterating device 1's stream holds the line between rounds; its read of device
    2 there has the turn at once (nested), as the old per-operation lock allowed, and the line
    goes back to the stream."""
    m, t = medium(2)
    bus = Bus(t, timeout=0.05)
    d1, d2 = bus.device(1), bus.device(2)
    d1.connect()
    d2.connect()
    got: list[object] = []

    def work() -> None:
        for r in d1.stream([d1.read_command("mode") for _ in range(3)]):
            got.append((r.outcome, d2.read("mode").outcome))

    th = threading.Thread(target=work, daemon=True)
    th.start()
    th.join(30)
    assert not th.is_alive(), "the nested command waited for itself"
    assert got == [(Outcome.OK, Outcome.OK)] * 3
    assert bus.turn.holder is None and m.stats.collisions == 0
