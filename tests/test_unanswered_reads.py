"""An unanswered read is UNKNOWN for itself only: it changed nothing, so it never blocks the handle.

The rule is ``idemlink.protocol.modbus.may_have_effect`` (by function code), applied once in
``Device._result``; every path that settles a request goes through it: no answer after every
attempt, the port failing (``LinkLost``), the caller interrupting (KeyboardInterrupt, asyncio
cancellation), the blocking and the asyncio shells, and the CLI's read-back after UNKNOWN.
A command that may have had an effect still blocks until reconciled.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from idemlink.cli import build_parser
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import AsyncSimTransport, SimTransport
from idemlink.host.aio import AsyncDevice
from idemlink.host.command import Command, CommandKind
from idemlink.host.device import Device
from idemlink.host.errors import LinkLost, UnknownOutstanding
from idemlink.protocol.frame import Frame, FrameDecoder, FrameType
from idemlink.protocol.modbus import (
    READ_ONLY_FUNCTIONS,
    FunctionCode,
    StandardFunction,
    may_have_effect,
)
from idemlink.protocol.outcome import Outcome, Status

READS = (FunctionCode.READ_HOLDING_REGISTERS, FunctionCode.READ_INPUT_REGISTERS,
         FunctionCode.FILE_INFO)


class ReadsUnanswered(SimTransport):
    """Every answer to a read is lost (the device still runs it); other requests are answered."""

    def __init__(self, device: SimulatedDevice) -> None:
        super().__init__(device)
        self._decoder = FrameDecoder()
        self.requests: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._decoder.receive_data(data)
        for frame in iter(self._decoder.next_event, None):
            if isinstance(frame, Frame) and frame.type is FrameType.REQUEST:
                self.requests.append(frame.payload)
                self.drop_answers = frame.payload[0] in READS
        super().write(data)


class FailsOnReadRequest(SimTransport):
    """Raises ``error`` on the first read of the transport once a register read went out."""

    def __init__(self, device: SimulatedDevice, error: BaseException) -> None:
        super().__init__(device)
        self.error = error
        self.armed = False
        self._decoder = FrameDecoder()
        self._read_out = False

    def write(self, data: bytes) -> None:
        self._decoder.receive_data(data)
        for frame in iter(self._decoder.next_event, None):
            if isinstance(frame, Frame) and frame.type is FrameType.REQUEST:
                self._read_out = frame.payload[0] in READS
        super().write(data)

    def read(self, timeout: float) -> bytes:
        if self.armed and self._read_out:
            self.armed = False
            raise self.error
        return super().read(timeout)


def connected(t: SimTransport) -> Device:
    dev = Device(t, attempts=3)
    dev.connect()
    return dev


# ------------------------------------------------------------------------------ the rule


def test_only_the_read_only_functions_have_no_effect() -> None:
    bit_reads = {StandardFunction.READ_COILS, StandardFunction.READ_DISCRETE_INPUTS}
    assert set(READ_ONLY_FUNCTIONS) == set(READS) | bit_reads
    for fc in FunctionCode:
        assert may_have_effect(fc) is (fc not in READS), fc
    for sf in StandardFunction:  # coil writes and the mask write act
        assert may_have_effect(sf) is (sf not in bit_reads), sf
    assert may_have_effect(0x2B)  # a function this stack does not know is assumed to act


def test_every_command_kind_maps_to_its_function() -> None:
    dev = Device(SimTransport())
    kinds = {c.kind: c for c in (
        dev.read_command("threshold"), dev.read_command("temperature"),
        Command(CommandKind.FILE_INFO, 0, name="a.bin"),
        dev.write_command({"threshold": 1}), Command(CommandKind.WRITE_IF_GENERATION, 0, 1, (1,)),
        Command(CommandKind.CLEAR_FAULTS, 0, 1, (1,)), Command(CommandKind.TRIGGER, 0),
        Command(CommandKind.TRIGGER_RESET, 0), Command(CommandKind.FILE_RECEIVE, 0),
        Command(CommandKind.MASK_WRITE, 4, 1, (1,), and_mask=0xFFFE))}
    assert set(kinds) == set(CommandKind)
    for c in kinds.values():
        assert c.function == c.pdu()[0]
        assert c.may_have_effect is (c.kind not in (CommandKind.READ, CommandKind.FILE_INFO))


# ------------------------------------------------------------------------------ blocking Device


def test_unanswered_read_is_unknown_and_the_next_write_proceeds() -> None:
    t = SimTransport(SimulatedDevice(seed=2))
    dev = connected(t)
    t.drop_answers = True
    r = dev.read("threshold")
    assert r.outcome is Outcome.UNKNOWN and r.status is Status.NO_ANSWER and r.values == ()
    assert dev.unknown is None
    t.drop_answers = False
    w = dev.write({"threshold": 321})
    assert w.outcome is Outcome.OK and t.device.core.value("threshold") == 321


def test_unanswered_read_does_not_stop_the_later_waves_of_its_batch() -> None:
    t = ReadsUnanswered(SimulatedDevice(seed=2))
    dev = connected(t)
    # The write conflicts with the read (same register): it is sent in a second wave.
    res = dev.run([dev.read_command("threshold"), dev.write_command({"threshold": 333})])
    assert [r.outcome for r in res] == [Outcome.UNKNOWN, Outcome.OK]
    assert dev.unknown is None and t.device.core.value("threshold") == 333


def test_unanswered_write_still_blocks() -> None:
    t = SimTransport(SimulatedDevice(seed=2))
    dev = connected(t)
    t.drop_answers = True
    w = dev.write({"threshold": 300})
    assert w.outcome is Outcome.UNKNOWN and dev.unknown is w
    t.drop_answers = False
    with pytest.raises(UnknownOutstanding):
        dev.read("threshold")
    rec = dev.reconcile()
    assert rec is not None and rec.intended_state_holds is True
    dev.acknowledge_unknown()
    assert dev.read("threshold").values == (300,)


def test_reconcile_of_a_read_sends_nothing() -> None:
    t = ReadsUnanswered(SimulatedDevice(seed=2))
    dev = connected(t)
    r = dev.read("threshold")
    sent = len(t.requests)
    rec = dev.reconcile(r)
    assert rec is not None and rec.intended_state_holds is True and rec.observed == {}
    assert len(t.requests) == sent
    assert dev.reconcile() is None  # nothing blocks the handle


def test_read_out_when_the_port_fails_does_not_block() -> None:
    t = FailsOnReadRequest(SimulatedDevice(seed=2), OSError(5, "Input/output error"))
    dev = connected(t)
    t.armed = True
    with pytest.raises(LinkLost) as info:
        dev.read("threshold")
    (r,) = info.value.results
    assert r.outcome is Outcome.UNKNOWN and r.status is Status.LINK_LOST and info.value.unknown
    assert dev.unknown is None and dev.session.outstanding == 0
    assert dev.write({"mode": 1}).ok


def test_interrupted_read_does_not_block() -> None:
    t = FailsOnReadRequest(SimulatedDevice(seed=2), KeyboardInterrupt())
    dev = connected(t)
    t.armed = True
    with pytest.raises(KeyboardInterrupt) as info:
        dev.read("threshold")
    (r,) = info.value.settled_results  # type: ignore[attr-defined]
    assert r.outcome is Outcome.UNKNOWN and r.status is Status.CANCELLED
    assert dev.unknown is None and dev.session.outstanding == 0
    assert dev.write({"mode": 1}).ok


# ------------------------------------------------------------------------------ asyncio




class NeverAnswers:
    """An asyncio transport whose device never answers after the handshake: ``read`` really
    waits (on the event loop's clock); ``out`` is set once a request has been written."""

    def __init__(self, device: SimulatedDevice) -> None:
        self.sim = SimTransport(device)
        self.silent = False
        self.out = asyncio.Event()

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def write(self, data: bytes) -> None:
        if self.silent:
            self.out.set()
        else:
            self.sim.write(data)

    async def read(self, timeout: float) -> bytes:
        if self.silent:
            await asyncio.sleep(timeout)
            return b""
        return self.sim.read(timeout)

    async def close(self) -> None:
        pass


def test_async_unanswered_read_is_unknown_and_the_next_write_proceeds() -> None:
    t = ReadsUnanswered(SimulatedDevice(seed=2))

    async def session() -> None:
        dev = AsyncDevice(AsyncSimTransport(t), attempts=3)
        await dev.connect()
        r = await dev.read("threshold")
        assert r.outcome is Outcome.UNKNOWN and r.status is Status.NO_ANSWER and r.values == ()
        assert dev.unknown is None
        rec = await dev.reconcile(r)
        assert rec is not None and rec.observed == {}
        assert (await dev.write({"threshold": 345})).ok

    asyncio.run(session())
    assert t.device.core.value("threshold") == 345


def test_async_cancelled_read_does_not_block() -> None:
    async def session() -> None:
        t = NeverAnswers(SimulatedDevice(seed=2))
        dev = AsyncDevice(t, timeout=30.0, attempts=5)
        await dev.connect()
        t.silent = True
        task = asyncio.create_task(dev.read("threshold"))
        await t.out.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert dev.unknown is None and dev.ops.session.outstanding == 0
        t.silent = False
        assert (await dev.write({"mode": 1})).ok

    asyncio.run(session())


# ------------------------------------------------------------------------------ CLI


def test_cli_unanswered_read_exits_5_without_a_read_back(capsys: pytest.CaptureFixture[str]) -> None:
    t = ReadsUnanswered(SimulatedDevice(seed=2))
    args = build_parser().parse_args(["read", "threshold", "mode", "--json"])
    args.open_device = lambda: connected(t)
    rc = args.handler(args)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 5 and doc["outcome"] == "UNKNOWN" and doc["values"] == {}
    assert {r["status"] for r in doc["results"].values()} == {"NO_ANSWER"}
    assert "reconcile" not in doc and "reconciles" not in doc
    assert sum(p[0] in READS for p in t.requests) == 2 * 3  # the two reads' attempts, nothing more


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), KeyboardInterrupt()])
def test_cli_read_cut_short_asks_for_no_read_back(
        error: BaseException, capsys: pytest.CaptureFixture[str]) -> None:
    t = FailsOnReadRequest(SimulatedDevice(seed=2), error)

    def opener() -> Device:
        dev = connected(t)
        t.armed = True
        return dev

    args = build_parser().parse_args(["read", "threshold"])
    args.open_device = opener
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            args.handler(args)
        assert capsys.readouterr().err == ""  # nothing that may have run was out
    else:
        assert args.handler(args) == 5  # the read itself is UNKNOWN
        err = capsys.readouterr().err
        assert "port failed" in err and "read back" not in err
