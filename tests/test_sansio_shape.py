"""Every sans-I/O machine has the one shape of docs/ARCHITECTURE.md ("The sans-I/O shape").

- bytes in: ``receive_data(data[, now]) -> None``; time: ``tick(now) -> None``;
- events out: ``next_event() -> Event | None``; bytes out: ``data_to_send() -> bytes`` (drains);
- no other way in or out: none of the older names (``feed``, ``poll``, ``send``, ``next_frame``,
  ``idle``, ``receive``, ``poll_reboots``, ``events``), and no other public method that takes
  ``data``.

The machines are found, not only listed: any class of ``idemlink.protocol`` or
``idemlink.device_sim`` with a method of the shape or one of the older names is checked, so a new
machine with another surface fails here. ``PENDING`` names the machines still being converted
elsewhere; an entry that has the shape must leave the list.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import idemlink.device_sim
import idemlink.protocol
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import Link, LinkConfig, LinkDirection
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import (
    DecodeError,
    Frame,
    FrameDecoder,
    FrameType,
    decode_frames,
    encode_frame,
)
from idemlink.protocol.host_session import HostSession, SessionOpened
from idemlink.protocol.modbus_rtu import RtuDecoder, RtuFrame, encode_rtu
from idemlink.protocol.outcome import Outcome, Status
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.protocol.rtu_master import RtuMaster

SHAPE = ("receive_data", "tick", "next_event", "data_to_send")
OLD_NAMES = frozenset({"feed", "poll", "send", "next_frame", "idle", "receive", "poll_reboots",
                       "events"})
MARKERS = frozenset(SHAPE[:1] + SHAPE[2:]) | OLD_NAMES
"""A class with any of these methods is a machine (``tick`` alone is not: the register core
ticks, but it is called, not fed)."""

MACHINES: dict[str, frozenset[str]] = {
    "idemlink.protocol.frame.FrameDecoder": frozenset({"receive_data", "next_event"}),
    "idemlink.protocol.modbus_rtu.RtuDecoder": frozenset({"receive_data", "tick", "next_event"}),
    "idemlink.protocol.device_session.DeviceSession": frozenset({"receive_data", "data_to_send"}),
    "idemlink.device_sim.device.SimulatedDevice":
        frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.serve.Servable": frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.serve.LockedDevice": frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.rtu_server.RtuServer":
        frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.plain_slave.PlainRtuServer":
        frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.link.LinkDirection": frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.link.Link": frozenset({"tick", "next_event"}),
    "idemlink.device_sim.bus.Bus": frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.bus.Station": frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.device_sim.bus_station.ProcessStation":
        frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.protocol.ymodem_events.MachineQueues": frozenset({"next_event", "data_to_send"}),
    "idemlink.protocol.ymodem_receiver.Receiver": frozenset(SHAPE),
    "idemlink.protocol.ymodem_sender.Sender": frozenset(SHAPE),
    "idemlink.protocol.ymodem_files.ReceiverDriver":
        frozenset({"receive_data", "tick", "data_to_send"}),
    "idemlink.protocol.host_session.HostSession": frozenset(SHAPE),
    "idemlink.protocol.rtu_master.RtuMaster": frozenset(SHAPE),
    "idemlink.protocol.modbus_tcp.TcpMaster": frozenset(SHAPE),
    "idemlink.protocol.modbus_tcp.MbapDecoder": frozenset({"receive_data", "next_event"}),
    "idemlink.protocol.rtu_scan.BusScan": frozenset(SHAPE),
    "idemlink.protocol.framed_scan.FramedScan": frozenset(SHAPE),
    "idemlink.protocol.uart_line.UartReceiver": frozenset({"receive_data", "next_event"}),
    "idemlink.device_sim.tcp_server.TcpConnection": frozenset({"receive_data", "data_to_send"}),
}
"""Each machine and the parts of the shape it has (the rest it must not need)."""

PENDING: dict[str, str] = {}
"""Machines whose conversion lands with other work (name -> what still differs); none now."""

SHELLS = frozenset({"idemlink.device_sim.link_proxy._End", "idemlink.device_sim.link_proxy._FdEnd",
                    "idemlink.device_sim.link_proxy._UrlEnd"})
"""I/O ends, not machines: their ``send`` writes to a file descriptor or a port."""


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _own_methods(cls: type) -> set[str]:
    """Method names of ``cls`` and its bases (``object`` and ``typing.Protocol`` left out)."""
    skip = {object, typing.Protocol, typing.Generic}
    return {n for c in cls.__mro__ if c not in skip for n, v in vars(c).items() if callable(v)}


def machines_in(packages: tuple[types.ModuleType, ...]) -> Iterator[type]:
    """Every class defined in ``packages`` with a method named in ``MARKERS``."""
    for pkg in packages:
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if (inspect.isclass(obj) and obj.__module__ == module.__name__
                        and MARKERS & _own_methods(obj)):
                    yield obj


def _returns(method: Callable[..., object]) -> object:
    return typing.get_type_hints(method).get("return", inspect.Signature.empty)


def _required(method: Callable[..., object]) -> list[str]:
    """Names of the parameters a caller must pass (``self`` left out)."""
    params = list(inspect.signature(method).parameters.values())[1:]
    return [p.name for p in params if p.default is inspect.Parameter.empty]


def shape_problems(cls: type, parts: frozenset[str]) -> list[str]:
    """What ``cls`` does differently from the shape, given the ``parts`` it should have."""
    name = cls.__name__
    methods = _own_methods(cls)
    problems = [f"{name}.{m} is an older name" for m in sorted(OLD_NAMES & methods)]
    problems += [f"{name} lacks {p}" for p in parts if p not in methods]
    problems += [f"{name}.{p} is not in its declared parts" for p in SHAPE
                 if p in methods and p not in parts]
    for m in sorted(methods - set(SHAPE)):
        if not m.startswith("_") and "data" in inspect.signature(getattr(cls, m)).parameters:
            problems.append(f"{name}.{m} takes data: bytes come in through receive_data only")
    if "receive_data" in parts & methods:
        rd = cls.receive_data  # type: ignore[attr-defined]
        if _required(rd)[:1] != ["data"] or len(_required(rd)) > 2:
            problems.append(f"{name}.receive_data must take (data[, now])")
        if _returns(rd) is not type(None):
            problems.append(f"{name}.receive_data must return None")
    if "tick" in parts & methods:
        tick = cls.tick  # type: ignore[attr-defined]
        if _required(tick) != ["now"] or _returns(tick) is not type(None):
            problems.append(f"{name}.tick must be tick(now) -> None")
    if "next_event" in parts & methods:
        nxt = cls.next_event  # type: ignore[attr-defined]
        if _required(nxt) or type(None) not in typing.get_args(_returns(nxt)):
            problems.append(f"{name}.next_event must be next_event() -> Event | None")
    if "data_to_send" in parts & methods:
        out = cls.data_to_send  # type: ignore[attr-defined]
        if _required(out) or _returns(out) is not bytes:
            problems.append(f"{name}.data_to_send must be data_to_send() -> bytes")
    return problems


# ----------------------------------------------------------------------------------- the rule


def test_every_machine_is_listed_and_has_the_shape() -> None:
    found = {_qualname(c): c for c in machines_in((idemlink.protocol, idemlink.device_sim))}
    unlisted = sorted(set(found) - set(MACHINES) - set(PENDING) - SHELLS)
    assert unlisted == [], "machines missing from MACHINES (give them the shape and list them)"
    assert sorted(set(MACHINES) - set(found)) == [], "listed machines that no longer exist"
    problems = [p for name, parts in MACHINES.items() for p in shape_problems(found[name], parts)]
    assert problems == []


def test_pending_machines_still_differ() -> None:
    """A machine that has been converted leaves ``PENDING`` for ``MACHINES``."""
    found = {_qualname(c): c for c in machines_in((idemlink.protocol, idemlink.device_sim))}
    assert sorted(set(PENDING) - set(found)) == []
    converted = [name for name in PENDING
                 if not shape_problems(found[name], frozenset(SHAPE) & _own_methods(found[name]))]
    assert converted == []


def test_the_architecture_names_every_machine() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md").read_text("utf-8")
    section = text.split("## The sans-I/O shape", 1)[1].split("\n## ", 1)[0]
    assert [m for m in MACHINES if "Servable" not in m and f"`{m}`" not in section] == []


def test_a_machine_with_another_shape_is_caught() -> None:
    class Answering:
        """Returns its answer from the input call, the shape this project left behind."""

        def receive_data(self, data: bytes, now: float) -> bytes:
            return data

        def feed(self, data: bytes) -> list[bytes]:
            return [data]

        def handle(self, data: bytes) -> None:
            pass

        def data_to_send(self, n: int) -> bytes:
            return b""

    assert shape_problems(Answering, frozenset({"receive_data", "next_event", "data_to_send"})) == [
        "Answering.feed is an older name",
        "Answering lacks next_event",
        "Answering.feed takes data: bytes come in through receive_data only",
        "Answering.handle takes data: bytes come in through receive_data only",
        "Answering.receive_data must return None",
        "Answering.data_to_send must be data_to_send() -> bytes",
    ]


# ------------------------------------------------------------------- the shape's behaviour


def test_decoder_events_wait_until_taken_in_wire_order() -> None:
    dec = FrameDecoder()
    one, two = (encode_frame(FrameType.REQUEST, s, 7, b"p") for s in (1, 2))
    assert dec.receive_data(one[:5]) is None and dec.next_event() is None
    dec.receive_data(one[5:] + b"\x01\x00" + two)
    first, bad, second = dec.next_event(), dec.next_event(), dec.next_event()
    assert isinstance(first, Frame) and first.seq == 1 and isinstance(bad, DecodeError)
    assert isinstance(second, Frame) and second.seq == 2 and dec.next_event() is None
    dec.receive_data(one)
    dec.reset()  # a port reopen forgets what was not taken
    assert dec.next_event() is None
    assert decode_frames(one + two) == [first, second]


def test_device_answers_wait_in_data_to_send_and_drain_once() -> None:
    session = DeviceSession(lambda pdu, now, seq: b"\x03\x02\x00\x01", 5,
                            contract_hash=contract_hash())
    request = encode_frame(FrameType.REQUEST, 1, 5, b"\x03\x00\x00\x00\x01")
    assert session.receive_data(request[:4], 0.0) is None and session.data_to_send() == b""
    session.receive_data(request[4:] + request, 0.0)  # the rest, then a retry
    answers = decode_frames(session.data_to_send())
    assert [type(f) for f in answers] == [Frame, Frame] and session.data_to_send() == b""
    device = SimulatedDevice(seed=1)
    device.receive_data(encode_frame(FrameType.HELLO, 9, 0, b"\x01" + contract_hash()), 0.0)
    (hello,) = decode_frames(device.data_to_send())
    assert isinstance(hello, Frame) and hello.type is FrameType.HELLO_REPLY


def test_link_direction_ticks_deliver_what_poll_did() -> None:
    """Delivery times are those of the line: nothing before its time, everything at it."""
    d = LinkDirection(LinkConfig(baud=9600, latency=0.01))
    d.receive_data(b"ab", 0.0)
    due = 2 * 10 / 9600 + 0.01
    d.tick(due - 10 / 9600 - 1e-9)
    assert d.data_to_send() == b""
    d.tick(due - 10 / 9600)
    d.tick(due)  # two ticks before one drain: both bytes, once, in order
    assert d.data_to_send() == b"ab" and d.data_to_send() == b""
    assert d.stats.bytes_delivered == 2 and d.next_event_time() is None


def test_link_reboots_come_out_of_next_event() -> None:
    link = Link(LinkConfig(reboot_at=(1.0, 2.0)))
    link.start(0.0)
    link.tick(0.5)
    assert link.next_event() is None
    link.tick(2.5)
    assert [e.time for e in iter(link.next_event, None)] == [1.0, 2.0]


@pytest.mark.parametrize("split", [1, 3, 8])
def test_rtu_decoder_and_server_take_bytes_then_time(split: int) -> None:
    read = encode_rtu(1, bytes.fromhex("0300000001"))
    dec = RtuDecoder()
    for i in range(0, len(read), split):
        dec.receive_data(read[i:i + split], 1.0)
    assert dec.next_event() == RtuFrame(1, bytes.fromhex("0300000001"))
    assert dec.next_event() is None
    server = RtuServer(DeviceCore(), unit=1)
    server.receive_data(read[:4], 1.0)
    server.tick(1.2)  # the rest never came: a pause drops the half frame
    server.receive_data(read, 1.3)
    assert server.data_to_send()[:3] == bytes.fromhex("010302") and server.data_to_send() == b""


READ_ONE = bytes.fromhex("0300000001")


def test_host_session_events_wait_until_taken_one_at_a_time() -> None:
    """The handshake, two answers and an abandoned request: each event once, in the order it
    happened, then None until more bytes or time come in."""
    host = HostSession(contract_hash=contract_hash(), timeout=1.0, max_inflight=4)
    device = DeviceSession(lambda pdu, now, seq: b"\x03\x02\x00\x01", 5,
                           contract_hash=contract_hash())
    host.open(0.0)
    device.receive_data(host.data_to_send(), 0.0)
    assert host.next_event() is None
    host.receive_data(device.data_to_send(), 0.0)
    assert isinstance(host.next_event(), SessionOpened) and host.next_event() is None
    for tag in ("a", "b", "c"):
        host.submit(READ_ONE, 0.0, set_only=False, tag=tag)
    requests = host.data_to_send()
    device.receive_data(requests[:len(requests) * 2 // 3], 0.0)
    host.receive_data(device.data_to_send(), 0.0)
    host.abandon(Status.CANCELLED)
    assert [(e.tag, e.outcome) for e in iter(host.next_event, None)] == [
        ("a", Outcome.OK), ("b", Outcome.OK), ("c", Outcome.UNKNOWN)]
    assert host.next_event() is None


def test_rtu_master_completions_wait_until_taken_one_at_a_time() -> None:
    master = RtuMaster(DEFAULT_MAP, timeout=0.05, attempts=1)
    server = RtuServer(DeviceCore(), unit=1)
    now = 0.0
    for tag in (1, 2, 3):
        master.submit(READ_ONE, now, tag=tag)
    master.tick(now)  # a request leaves on a tick (after a round with no stale input)
    for _ in range(2):  # two answered requests, one after the other
        server.receive_data(master.data_to_send(), now)
        server.tick(now + 0.01)
        master.receive_data(server.data_to_send(), now + 0.01)
        now += 0.1
        master.tick(now)
    master.abandon(Status.LINK_LOST)
    assert [(e.tag, e.outcome) for e in iter(master.next_event, None)] == [
        (1, Outcome.OK), (2, Outcome.OK), (3, Outcome.UNKNOWN)]
    assert master.next_event() is None
