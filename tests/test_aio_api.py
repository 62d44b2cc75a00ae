"""The asyncio API is the blocking API awaited: one table of operations runs through both, over real
ptys (``AsyncSerialTransport`` on the loop's fd readiness); cancellation and timeouts keep the
outcome rules; separate devices are independent."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from pathlib import Path
from typing import Any

import pytest
from support.aio import WaitingTransport
from support.timing import scaled

from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.aio import PARITY, AsyncDevice
from idemlink.host.command import CommandBuilder
from idemlink.host.device import Device
from idemlink.host.errors import UnknownOutstanding
from idemlink.host.operations import OPERATIONS
from idemlink.protocol.outcome import Outcome, Status
from idemlink.pytest_plugin import PtySim, start_pty_sim

SYNC_ONLY = {"open", "session", "stats", "transport", "check_map", "ops"}
"""Public attributes of ``Device`` that are not operations (or are the blocking constructor)."""
ASYNC_ONLY = {"open", "transport", "ops", "line_bytes"}
"""Public attributes of ``AsyncDevice`` that are not operations."""


def table(dev: Any, files: list[str]) -> list[tuple[str, tuple[Any, ...]]]:
    """(operation, arguments): the same list for both APIs."""
    return [
        ("read", ("threshold",)),
        ("write", ({"threshold": 333},)),
        ("read", ("threshold",)),
        ("write_if_generation", (0, {"mode": 1})),
        ("clear_faults", (1,)),
        ("trigger", ()),
        ("trigger_status", ()),
        ("trigger_reset", ()),
        ("file_info", ("absent.bin",)),
        ("execute", (dev.read_command("mode"),)),
        ("run", ([dev.read_command("threshold"), dev.write_command({"mode": 0}),
                  dev.read_command("mode")],)),
        ("stream", ([dev.read_command("threshold")] * 5,)),
        ("send_files", (files,)),
        ("file_info", (Path(files[0]).name,)),
        ("reconcile", ()),
        ("acknowledge_unknown", ()),
    ]


def summary(value: Any) -> Any:
    """What must be equal between the two APIs (sequence numbers and timings may differ)."""
    if isinstance(value, list):
        return [summary(v) for v in value]
    if isinstance(value, tuple) and len(value) == 2 and hasattr(value[1], "files"):
        res, report = value
        return summary(res), [(f.name, f.ok, f.verified) for f in report.files]
    if hasattr(value, "outcome"):
        file = value.file
        return (value.command, value.outcome, value.status, value.values, value.code,
                None if file is None else (file.status, file.size, file.crc32c))
    return value


def sims(tmp: Path) -> tuple[PtySim, PtySim]:
    return (start_pty_sim(SimulatedDevice(seed=1, flash_dir=tmp / "a")),
            start_pty_sim(SimulatedDevice(seed=1, flash_dir=tmp / "b")))


def test_every_operation_gives_the_same_outcome_through_both_apis(tmp_path: Path) -> None:
    payload = tmp_path / "config.bin"
    payload.write_bytes(bytes(range(256)) * 5)
    files = [str(payload)]
    a, b = sims(tmp_path)
    try:
        with Device.open(a.path) as dev:
            blocking = []
            for name, args in table(dev, files):
                out = getattr(dev, name)(*args)
                blocking.append(summary(list(out) if name == "stream" else out))

        async def through_asyncio() -> list[Any]:
            got = []
            async with AsyncDevice.open(b.path) as adev:
                for name, args in table(adev, files):
                    op = getattr(adev, name)
                    if name == "stream":
                        out: Any = [r async for r in op(*args)]
                    elif inspect.iscoroutinefunction(op):
                        out = await op(*args)
                    else:
                        out = op(*args)
                    got.append(summary(out))
            return got

        assert asyncio.run(through_asyncio()) == blocking
        assert blocking[2][3] == (333,) and blocking[13][5][1] == 1280  # read back, stored
    finally:
        a.close()
        b.close()


def _operations_of(cls: type, instance: object, driver_only: set[str]) -> set[str]:
    """The public operations of a driver class: its public names, minus what every driver
    inherits from ``CommandBuilder`` (the same code for both) and its own constructor/plumbing."""
    public = {n for n in dir(cls) if not n.startswith("_")}
    public |= {n for n in vars(instance) if not n.startswith("_")}
    builder = {n for n in dir(CommandBuilder) if not n.startswith("_")} | {"regmap"}
    return public - builder - driver_only


def test_both_drivers_offer_exactly_the_listed_operations() -> None:
    """One list (``OPERATIONS``): an operation added to one driver and not the other fails here."""
    blocking = _operations_of(Device, Device(transport=None), SYNC_ONLY)  # type: ignore[arg-type]
    awaited = _operations_of(AsyncDevice, AsyncDevice(transport=None),  # type: ignore[arg-type]
                             ASYNC_ONLY)
    assert blocking == set(OPERATIONS)
    assert awaited == set(OPERATIONS)
    assert PARITY == OPERATIONS
    assert issubclass(Device, CommandBuilder) and issubclass(AsyncDevice, CommandBuilder)


def test_the_parity_check_catches_an_operation_on_one_side_only() -> None:
    class Extended(Device):
        def nudge(self) -> None: ...

    assert _operations_of(Extended, Extended(transport=None),  # type: ignore[arg-type]
                          SYNC_ONLY) == set(OPERATIONS) | {"nudge"}


def test_awaited_open_and_many_devices_at_once(tmp_path: Path) -> None:
    """``await AsyncDevice.open`` works without ``async with``; four devices run concurrently
    from one loop, each with its own session."""
    ptys = [start_pty_sim(SimulatedDevice(seed=i)) for i in range(4)]
    try:
        async def one(p: PtySim, value: int) -> list[int]:
            dev = await AsyncDevice.open(p.path, max_inflight=16)
            try:
                assert (await dev.write({"threshold": value})).ok
                return [r.values[0] async for r in dev.stream([dev.read_command("threshold")] * 20)]
            finally:
                await dev.close()

        async def all_of_them() -> list[list[int]]:
            return await asyncio.gather(*(one(p, 300 + i) for i, p in enumerate(ptys)))

        got = asyncio.run(all_of_them())
        assert got == [[300 + i] * 20 for i in range(4)]
    finally:
        for p in ptys:
            p.close()


def lost_answers(device: SimulatedDevice) -> tuple[WaitingTransport, AsyncDevice]:
    t = WaitingTransport(device)
    return t, AsyncDevice(t, timeout=30.0, attempts=5)


def test_a_timed_out_read_does_not_block_the_handle() -> None:
    async def session() -> None:
        t, dev = lost_answers(SimulatedDevice(seed=6))
        await dev.connect()
        t.answer = False
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(dev.read("threshold"), 0.05)
        assert dev.unknown is None and dev.ops.session.outstanding == 0
        t.answer = True
        assert (await dev.read("threshold")).ok

    asyncio.run(session())


def test_a_timed_out_write_is_unknown_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    async def session() -> None:
        t, dev = lost_answers(SimulatedDevice(seed=7))
        await dev.connect()
        t.answer = False
        with caplog.at_level(logging.WARNING, logger="idemlink.host.aio"):
            async with asyncio.timeout(0.05):
                await dev.write({"threshold": 321})
        raise AssertionError("the timeout must propagate")  # pragma: no cover

    with pytest.raises(TimeoutError):
        asyncio.run(session())
    assert "may have run (UNKNOWN/CANCELLED): write" in caplog.text


def test_a_cancelled_write_blocks_until_reconciled() -> None:
    async def session() -> None:
        t, dev = lost_answers(SimulatedDevice(seed=8))
        await dev.connect()
        t.answer = False
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(dev.write({"threshold": 322}), 0.05)
        assert dev.unknown is not None and dev.unknown.status is Status.CANCELLED
        with pytest.raises(UnknownOutstanding, match=r"write ended UNKNOWN \(CANCELLED\)"):
            await dev.read("threshold")
        t.answer = True
        rec = await dev.reconcile()
        assert rec is not None and rec.intended_state_holds is True
        dev.acknowledge_unknown()
        assert (await dev.read("threshold")).values == (322,)

    asyncio.run(session())


class AnswersOnlyReads(WaitingTransport):
    """Answers register reads; the device runs every other request, but its answer is lost."""

    async def write(self, data: bytes) -> None:
        before = len(self.device.executions)
        self.device.receive_data(data, self.now())
        reply = self.device.data_to_send()
        if any(e.request[:1] != b"\x03" for e in self.device.executions[before:]):
            self.request_out.set()
        elif reply:
            asyncio.get_running_loop().call_soon(self._deliver, reply)


def test_leaving_an_async_stream_early_settles_and_releases_the_device() -> None:
    async def session() -> None:
        t = AnswersOnlyReads(SimulatedDevice(seed=9))
        dev = AsyncDevice(t, timeout=30.0)
        await dev.connect()
        # The write conflicts with the read: it leaves once the read is answered.
        cmds = [dev.read_command("threshold"), dev.write_command({"threshold": 323})]
        async with contextlib.aclosing(dev.stream(cmds)) as results:
            async for r in results:
                assert r.ok
                await t.request_out.wait()  # the write is out, its answer lost
                break
        assert dev.ops.session.outstanding == 0
        assert dev.unknown is not None and dev.unknown.outcome is Outcome.UNKNOWN
        assert dev.unknown.status is Status.CANCELLED
        assert not dev._lock.locked()
        assert (await dev.reconcile()) is not None  # the device is free for the next operation

    asyncio.run(session())


def test_awaiting_the_same_device_inside_its_stream_is_refused_not_a_deadlock() -> None:
    from idemlink.protocol.outcome import LocalProtocolError

    async def session() -> None:
        _, dev = lost_answers(SimulatedDevice(seed=10))
        await dev.connect()
        got = []
        async for r in dev.stream([dev.read_command("mode")] * 10):
            got.append(r)
            if len(got) == 1:
                with pytest.raises(LocalProtocolError, match="one operation at a time"):
                    async with asyncio.timeout(1.0):  # the same task: a deadlock would time out
                        await dev.read("threshold")
        assert len(got) == 10 and all(r.ok for r in got)
        assert (await dev.read("threshold")).ok

    asyncio.run(session())


def test_a_backlog_is_read_in_slices_that_let_the_loop_run() -> None:
    """A loop that fell behind finds many answers waiting: each read returns at most
    ROUND_BYTES, and the next one first yields, so no single callback works off the backlog."""
    import os
    import tty

    import serial

    from idemlink.host.aio_transport import ROUND_BYTES, AsyncSerialTransport

    async def session() -> None:
        master, slave = os.openpty()
        tty.setraw(slave)
        port = serial.Serial(os.ttyname(slave), timeout=0)
        t = AsyncSerialTransport(port, asyncio.get_running_loop())
        try:
            os.write(master, bytes(3 * ROUND_BYTES))
            deadline = asyncio.get_running_loop().time() + scaled(10)
            while len(t._buf) < 3 * ROUND_BYTES:  # the loop moved the backlog into the transport
                assert asyncio.get_running_loop().time() < deadline, len(t._buf)
                await asyncio.sleep(0.001)
            ran: list[int] = []
            asyncio.get_running_loop().call_soon(ran.append, 1)
            first = await t.read(1.0)
            assert len(first) == ROUND_BYTES and not ran
            second = await t.read(1.0)
            assert len(second) == ROUND_BYTES and ran == [1]
        finally:
            await t.close()
            os.close(master)
            os.close(slave)

    asyncio.run(session())
