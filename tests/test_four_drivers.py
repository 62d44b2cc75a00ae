"""One table of operations through the four drivers: ``Device``, ``AsyncDevice`` (an idemlink
device), ``RtuDevice``, ``AsyncRtuDevice`` (a plain Modbus RTU slave) — and ``TcpDevice``,
``AsyncTcpDevice``, the same slave over Modbus TCP, whose rows are RTU's. Every rule above the
session is written once (``idemlink.host.operations``) and driven by one loop
(``idemlink.host.drive``), so it is tested once, here, through all four:

- a trigger reads its state first and never restarts a RUNNING one (code RUNNING, the device's
  action started once);
- an UNKNOWN after a possible effect blocks the handle until reconciled and acknowledged; the
  reconcile says whether it ran by the device's evidence (a framed device re-sent under its
  number: True; a plain slave keeps no record: None);
- what may be retried: a set-only write on both; a trigger reset or a fault clear only where
  the device de-duplicates (framed), never on a plain slave;
- a port failing while a write is out is ``LinkLost`` carrying the UNKNOWN, which blocks;
- what a plain slave cannot carry is refused before anything is sent;
- typed values (an i16 below zero, an f32 in little-word order and a u32 in one FC16 each), a
  bit field by FC22 mask write beside its neighbour, a coil by FC05 — set-only, so retried when
  the first answer is lost — on every driver alike: the framed device serves the same typed map
  (with its generation register), so no row is the framed protocol's to refuse.

Each row gives the expected summary for the framed protocol and for RTU (``SAME``: the same);
the blocking and the asyncio driver of one protocol must give exactly the same. Ground truth:
the devices' cores (triggers started).

The lines are in-process and on simulated clocks: ``FramedWire`` feeds a ``SimulatedDevice``,
``RtuWire`` an ``RtuServer`` (``AsyncSimTransport`` puts either behind the asyncio transport's
methods); ``lose(fc)`` decides per answer whether it is lost (by its function), ``fail`` makes
the next read after a write fail as a dying port does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
from support.rtu import rtu_reply

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.device_sim.simlink import AsyncSimTransport
from idemlink.host.aio import AsyncDevice, AsyncRtuDevice, AsyncTcpDevice
from idemlink.host.command import CommandBuilder, Reconciliation, Result, SentRequest
from idemlink.host.device import Device
from idemlink.host.errors import LinkLost, UnknownOutstanding
from idemlink.host.operations import OPERATIONS
from idemlink.host.rtu_device import RtuDevice
from idemlink.host.tcp_device import TcpDevice
from idemlink.protocol.device_core import DeviceCore, EffectKind
from idemlink.protocol.frame import Frame, FrameType, decode_frames
from idemlink.protocol.modbus import FunctionCode, StandardFunction
from idemlink.protocol.modbus_rtu import decode_rtu, encode_rtu
from idemlink.protocol.modbus_tcp import MbapDecoder, encode_mbap
from idemlink.protocol.outcome import LocalProtocolError
from idemlink.protocol.payloads import decode_response_payload
from idemlink.protocol.registers import Space
from idemlink.protocol.regmap_file import DEFAULT_MAP_NAME, parse_regmap

_BUILTIN = resources.files("idemlink.protocol").joinpath(
    "maps", f"{DEFAULT_MAP_NAME}.toml").read_text("utf-8")
#: the built-in thermal controller and, after its registers, typed ones: an i16 with a scale,
#: an f32 in little-word order and a u32 (two registers each), a packed word of bit fields
#: (FC22: ``mask_write``) and a coil
MAP = parse_regmap(_BUILTIN.replace("\n[[registers]]", """mask_write = true

[[registers]]""", 1) + """
[[registers]]
address = 16
name = "trim"
kind = "holding"
type = "i16"
scale = 0.1
min = -500
max = 500

[[registers]]
address = 17
name = "energy_limit"
kind = "holding"
type = "f32"
word_order = "little"

[[registers]]
address = 19
name = "run_limit"
kind = "holding"
type = "u32"
word_order = "big"

[[registers]]
address = 21
name = "control"
kind = "holding"
fields = [{ name = "heating", bit = 0 }, { name = "stage", bit = 4, width = 2 }]

[[registers]]
address = 0
name = "pump"
kind = "coil"
""", source="four-drivers.toml")

EFFECTFUL = {FunctionCode.WRITE_SINGLE_REGISTER, FunctionCode.WRITE_MULTIPLE_REGISTERS,
             FunctionCode.TRIGGER}
NEVER: Callable[[int], bool] = lambda fc: False  # noqa: E731


class Wire:
    """A line on a simulated clock: ``answer(request bytes)`` is the device's side."""

    def __init__(self) -> None:
        self.t = 0.0
        self.inbox = b""
        self.lose = NEVER
        self.lost: list[int] = []  #: the function of each answer lost
        self.fail = False  #: the next read after a write fails (the port dies with it out)
        self._armed = False

    def answer(self, data: bytes) -> list[tuple[int | None, bytes]]:
        """The device's answers to ``data``: (function of each, its bytes)."""
        raise NotImplementedError

    def idle(self) -> None:
        """Time passed without bytes."""

    def write(self, data: bytes) -> None:
        self.t += 0.001
        self._armed = self.fail
        for fc, raw in self.answer(data):
            if fc is not None and self.lose(fc):
                self.lost.append(fc)
            else:
                self.inbox += raw

    def read(self, timeout: float) -> bytes:
        if self._armed:
            self._armed = self.fail = False
            raise OSError(5, "Input/output error")
        data, self.inbox = self.inbox, b""
        if not data:
            self.t += timeout
            self.idle()
        return data

    def now(self) -> float:
        return self.t

    def close(self) -> None:
        pass


class FramedWire(Wire):
    def __init__(self) -> None:
        super().__init__()
        self.device = SimulatedDevice(seed=1, regmap=MAP, trigger_duration=1000.0)
        self.core = self.device.core

    def answer(self, data: bytes) -> list[tuple[int | None, bytes]]:
        self.device.receive_data(data, self.t)
        out: list[tuple[int | None, bytes]] = []
        for ev in decode_frames(self.device.data_to_send()):
            assert isinstance(ev, Frame)
            fc = None
            if ev.type is FrameType.RESPONSE:
                decoded = decode_response_payload(ev.payload)
                if decoded is not None and decoded[1]:
                    fc = decoded[1][0] & 0x7F
            out.append((fc, ev.encode()))
        return out

    def idle(self) -> None:
        self.device.tick(self.t)


class TcpWire(Wire):
    """Modbus TCP in front of the same RTU server: a gateway in process (MBAP in, the RTU frame
    to the server, its answer back under the request's transaction id)."""

    def __init__(self) -> None:
        super().__init__()
        self.core = DeviceCore(MAP, trigger_duration=1000.0)
        self.server = RtuServer(self.core, unit=1)
        self.mbap = MbapDecoder()

    def answer(self, data: bytes) -> list[tuple[int | None, bytes]]:
        self.mbap.receive_data(data)
        out: list[tuple[int | None, bytes]] = []
        while (f := self.mbap.next_event()) is not None:
            answer = rtu_reply(self.server, encode_rtu(f.unit, f.pdu), self.t)
            if answer:
                pdu = decode_rtu(answer).pdu
                out.append((pdu[0] & 0x7F, encode_mbap(f.tid, f.unit, pdu)))
        return out

    def idle(self) -> None:
        rtu_reply(self.server, b"", self.t)


class RtuWire(Wire):
    def __init__(self) -> None:
        super().__init__()
        self.core = DeviceCore(MAP, trigger_duration=1000.0)
        self.server = RtuServer(self.core, unit=1)

    def answer(self, data: bytes) -> list[tuple[int | None, bytes]]:
        answer = rtu_reply(self.server, data, self.t)
        return [(decode_rtu(answer).pdu[0] & 0x7F, answer)] if answer else []

    def idle(self) -> None:
        rtu_reply(self.server, b"", self.t)


def open_driver(kind: str) -> tuple[Any, Wire]:
    framed = kind in ("Device", "AsyncDevice")
    wire: Wire = (FramedWire() if framed else TcpWire() if "Tcp" in kind else RtuWire())
    line: Any = AsyncSimTransport(wire) if kind.startswith("Async") else wire  # duck-typed
    cls = {"Device": Device, "AsyncDevice": AsyncDevice, "RtuDevice": RtuDevice,
           "AsyncRtuDevice": AsyncRtuDevice, "TcpDevice": TcpDevice,
           "AsyncTcpDevice": AsyncTcpDevice}[kind]
    return cls(line, regmap=MAP, timeout=0.05, attempts=3), wire


def losing(fcs: set[int], times: int | None = None) -> Callable[[int], bool]:
    """Lose the answers of these functions (the next ``times`` of them; None: all)."""
    left = [times]

    def lose(fc: int) -> bool:
        if fc not in fcs or left[0] == 0:
            return False
        if left[0] is not None:
            left[0] -= 1
        return True

    return lose


SAME = object()
RECORDED: list[SentRequest] = []


def ok(code: int | None = None, values: tuple[int, ...] = ()) -> tuple[Any, ...]:
    return ("OK", "OK", code, values)


def unknown(status: str = "NO_ANSWER") -> tuple[Any, ...]:
    return ("UNKNOWN", status, None, ())


def refused(match: str) -> tuple[str, str]:
    return ("refused", match)


BLOCKED = ("blocked",)
ACCEPTED, RUNNING = 0x0000, 0x0101


def table(dev: CommandBuilder, files: list[str]) -> list[tuple[str, Any, tuple[Any, ...],
                                                               Callable[[int], bool] | None,
                                                               Any, Any]]:
    """(what, operation, arguments, answers lost from now on (None: as before), framed, RTU)."""
    return [
        ("read", "read", ("threshold",), NEVER, ok(values=(350,)), SAME),
        ("set-only write", "write", ({"threshold": 333},), None, ok(), SAME),
        ("read it back", "read", ("threshold",), None, ok(values=(333,)), SAME),
        ("trigger starts it", "trigger", (), None, ok(ACCEPTED), SAME),
        ("a second trigger starts nothing", "trigger", (), None, ok(RUNNING), SAME),
        ("its state", "trigger_status", (), None, ok(values=(1,)), SAME),
        ("reset", "trigger_reset", (), None, ok(ACCEPTED), SAME),
        ("reset state", "trigger_status", (), None, ok(values=(0,)), SAME),
        ("fault clear", "clear_faults", (1,), None, ok(), SAME),
        ("conditional write", "write_if_generation", (1, {"mode": 1}), None, ok(1),
         refused("0x41")),
        ("file info", "file_info", ("absent.bin",), None, ok(), refused("0x45")),
        ("file batch", "send_files", (files,), None, refused("serial transport"),
         refused("0x44")),
        ("run", "run", ([dev.read_command("threshold"), dev.write_command({"mode": 0}),
                         dev.read_command("mode")],), None,
         [ok(values=(333,)), ok(), ok(values=(0,))], SAME),
        ("stream", "stream", ([dev.read_command("threshold")] * 3,), None,
         [ok(values=(333,))] * 3, SAME),
        ("recorded before it leaves", "execute_recorded",
         (dev.write_command({"fan_setpoint": 70}), RECORDED.append), None, ok(), SAME),
        # an UNKNOWN after a possible effect blocks the handle, on every driver
        ("trigger, every answer lost", "trigger", (), losing(EFFECTFUL), unknown(), SAME),
        ("blocked", "read", ("threshold",), NEVER, BLOCKED, SAME),
        ("reconciled by evidence", "reconcile", (), None, ("reconciled", True, True),
         ("reconciled", True, None)),
        ("acknowledged", "acknowledge_unknown", (), None, None, SAME),
        ("free again", "read", ("threshold",), None, ok(values=(333,)), SAME),
        # what may be retried: a set-only write everywhere, a one-shot only where de-duplicated
        ("write, first answer lost", "write", ({"threshold": 334},), losing(EFFECTFUL, 1), ok(),
         SAME),
        ("reset, first answer lost", "trigger_reset", (), losing(EFFECTFUL, 1), ok(ACCEPTED),
         unknown()),
        ("reconcile what is blocking", "reconcile", (), NEVER, None, ("reconciled", True, None)),
        ("acknowledged", "acknowledge_unknown", (), None, None, SAME),
        ("clear, first answer lost", "clear_faults", (1,), losing(EFFECTFUL, 1), ok(),
         unknown()),
        ("acknowledged", "acknowledge_unknown", (), NEVER, None, SAME),
        # a port dying with a write out
        ("the port fails, a write out", "write", ({"mode": 2},), "fail",
         ("link lost", [unknown("LINK_LOST")]), SAME),
        ("blocked", "read", ("mode",), None, BLOCKED, SAME),
        ("reconciled", "reconcile", (), None, ("reconciled", True, True),
         ("reconciled", True, None)),
        ("acknowledged", "acknowledge_unknown", (), None, None, SAME),
        ("unsupported before anything is sent", "run",
         ([dev.read_command("mode"), dev.file_info_command("a.bin")],), None,
         [ok(values=(2,)), ok()], refused("0x45")),
        # typed values: one register signed, two registers in one FC16 in the map's word order
        ("i16 negative", "write", ({"trim": "-7.5"},), NEVER, ok(), SAME),
        ("its word", "read", ("trim",), None, ok(values=(0xFFB5,)), SAME),
        ("f32, little word first", "write", ({"energy_limit": "1234.5"},), None, ok(), SAME),
        ("both words", "read", ("energy_limit",), None, ok(values=(0x5000, 0x449A)), SAME),
        ("u32, first answer lost: set-only, retried", "write", ({"run_limit": "70000"},),
         losing({FunctionCode.WRITE_MULTIPLE_REGISTERS}, 1), ok(), SAME),
        ("both words", "read", ("run_limit",), NEVER, ok(values=(0x0001, 0x1170)), SAME),
        # a bit field: FC22 sets its bits alone; absolute bits, so set-only and retried
        ("the whole word", "write", ({"control": 0x0001},), None, ok(), SAME),
        ("a field by mask write, first answer lost", "write", ({"stage": 2},),
         losing({StandardFunction.MASK_WRITE_REGISTER}, 1), ok(), SAME),
        ("its neighbour kept", "read", ("control",), NEVER, ok(values=(0x0021,)), SAME),
        # a coil: FC05 writes an absolute value, set-only too
        ("a coil, first answer lost", "write", ({"pump": 1},),
         losing({StandardFunction.WRITE_SINGLE_COIL}, 1), ok(), SAME),
        ("the coil", "read", ("pump",), NEVER, ok(values=(1,)), SAME),
    ]


def summary(value: Any) -> Any:
    if isinstance(value, list):
        return [summary(v) for v in value]
    if isinstance(value, Result):
        return (value.outcome.name, value.status.name if value.status is not None else None,
                value.code, value.values)
    if isinstance(value, Reconciliation):
        return ("reconciled", value.intended_state_holds, value.executed)
    return value


async def outcome_of(dev: Any, name: str, args: tuple[Any, ...]) -> Any:
    try:
        out = getattr(dev, name)(*args)
        if name == "stream":
            out = [r async for r in out] if hasattr(out, "__aiter__") else list(out)
        elif inspect.isawaitable(out):
            out = await out
    except UnknownOutstanding:
        return BLOCKED
    except LinkLost as exc:
        return ("link lost", summary(list(exc.results)))
    except LocalProtocolError as exc:
        return ("refused", str(exc))
    if name == "file_info" and isinstance(out, Result) and out.ok:
        assert out.file is not None  # absent: read back all the same
    return summary(out)


def matches(got: Any, want: Any) -> bool:
    if isinstance(want, tuple) and want[:1] == ("refused",):
        return isinstance(got, tuple) and got[:1] == ("refused",) and want[1] in got[1]
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(matches(g, w) for g, w in zip(got, want, strict=True))
    return bool(got == want)


def drive(kind: str, files: list[str]) -> tuple[list[Any], Wire]:
    """The whole table through one driver: each row's summary."""
    dev, wire = open_driver(kind)

    async def script() -> list[Any]:
        connected = dev.connect()
        if inspect.isawaitable(connected):
            await connected
        got = []
        for _what, name, args, lose, _framed, _rtu in table(dev, files):
            if lose == "fail":
                wire.fail = True
            elif lose is not None:
                wire.lose = lose
            got.append(await outcome_of(dev, name, args))
        return got

    return asyncio.run(script()), wire


@pytest.mark.parametrize("protocol", ["framed", "rtu", "tcp"])
def test_one_table_of_operations_through_the_blocking_and_the_asyncio_driver(
        protocol: str, tmp_path: Any) -> None:
    f = tmp_path / "config.bin"
    f.write_bytes(b"x" * 64)
    files = [str(f)]
    kinds = {"framed": ("Device", "AsyncDevice"), "rtu": ("RtuDevice", "AsyncRtuDevice"),
             "tcp": ("TcpDevice", "AsyncTcpDevice")}[protocol]
    RECORDED.clear()
    runs = {kind: drive(kind, files) for kind in kinds}
    rows = table(CommandBuilder(MAP), files)
    blocking, awaited = (runs[k][0] for k in kinds)
    assert blocking == awaited  # the same loop, the same operations: the same outcomes
    for (what, name, _args, _lose, framed, rtu), got in zip(rows, blocking, strict=True):
        want = framed if protocol == "framed" or rtu is SAME else rtu
        assert matches(got, want), f"{what} ({name}): {got} != {want}"
    for _, wire in runs.values():
        # started twice in all: the first trigger and the one whose answers were lost; the
        # second trigger while RUNNING started nothing
        assert wire.core.count(EffectKind.TRIGGER_STARTED) == 2
        # the typed rows, on the device: the words, the field beside its neighbour, the coil;
        # and the three answers lost (u32, mask write, coil) were lost, then retried
        assert wire.core.read(16, 6) == (0xFFB5, 0x5000, 0x449A, 0x0001, 0x1170, 0x0021)
        assert wire.core.read_bits(Space.COILS, 0, 1) == (1,)
        assert [wire.lost.count(fc) for fc in (0x10, 0x16, 0x05)] == [1, 1, 1]
    numbers = [r.number for r in RECORDED]
    assert len(numbers) == 2
    assert all((n is None) == (protocol != "framed") for n in numbers)  # a plain slave: none


SYNC_ONLY = {"open", "session", "stats", "transport", "check_map", "ops"}
ASYNC_ONLY = {"open", "transport", "ops", "line_bytes"}
RTU_ONLY = {"open", "transport", "ops", "master"}


def _operations_of(cls: type, instance: object, driver_only: set[str]) -> set[str]:
    public = {n for n in dir(cls) if not n.startswith("_")}
    public |= {n for n in vars(instance) if not n.startswith("_")}
    builder = {n for n in dir(CommandBuilder) if not n.startswith("_")} | {"regmap"}
    return public - builder - driver_only


@pytest.mark.parametrize(("cls", "driver_only"), [
    (Device, SYNC_ONLY), (AsyncDevice, ASYNC_ONLY), (RtuDevice, RTU_ONLY),
    (AsyncRtuDevice, ASYNC_ONLY), (TcpDevice, RTU_ONLY), (AsyncTcpDevice, ASYNC_ONLY)])
def test_every_driver_offers_exactly_the_listed_operations(cls: type,
                                                           driver_only: set[str]) -> None:
    assert _operations_of(cls, cls(transport=None), driver_only) == set(OPERATIONS)
