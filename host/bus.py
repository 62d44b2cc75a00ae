"""The host's handle on a shared line of idemlink devices (issue 22 item 3; docs/BUS.md).

Contract:

- ``Bus(transport)`` / ``Bus.open(url)`` owns one transport; ``bus.device(address)`` gives that
  device's handle, a ``Device`` (the whole blocking API and its outcomes) whose frames go
  ADDRESSED to it, created once per address.
- **One transaction on the wire at a time** (half-duplex, the default): every handle sends at most
  one request at a time (``max_inflight=1``) and every byte a handle writes or reads is under the
  line's turn (``FairTurn``, through the handle's ``TurnTransport``), so no handle's request meets
  another's answer on the medium. **Fair**: the turn passes per transaction (a request from its
  first send to its settling, retries included), round-robin among the handles with work queued
  (``idemlink.protocol.bus_rules.next_in_turn``): a handle with a deep queue gets one
  transaction, then every other waiting handle one. ``half_duplex=False`` lets handles pipeline
  as a point-to-point ``Device`` does (the turn then passes per operation, as before: another
  handle's reads would take this one's answers still in flight).
- **A dead device costs only its own time**: each handle has a ``Breaker``
  (``idemlink.protocol.bus_rules``, time passed in). After ``BreakerPolicy.failures``
  operations in a row that ended with a request unanswered (status NO_ANSWER) or a HELLO
  unanswered, the breaker opens: until its probe time the handle's commands end NOT_EXECUTED /
  BREAKER_OPEN at once and nothing is sent. **Probed on a schedule**: at the probe time the
  bus probes it (``Bus.probe_due``, which every handle's command runs first, so a busy bus
  keeps the schedule by itself; ``Bus.next_probe`` says when for an idle program), or a command
  to it goes out as the probe: answered, the breaker closes; unanswered, it opens again for
  ``cooldown × backoff`` (per-device backoff, up to ``max_cooldown``).
- **Plain Modbus RTU units** (``modbus_rtu=True``): ``bus.device(unit)`` is a ``BusRtuDevice``
  (an ``RtuDevice`` at that unit) with the same turn, fairness and breaker; no broadcast, no
  key (plain Modbus has no authentication: a keyed ``modbus_rtu`` bus is refused).
- **Broadcast** (issue 22 item 4): ``bus.broadcast({"mode": 1})`` sends one set-only write
  (HOLDING registers only: ``broadcast_allowed``, else ``LocalProtocolError`` and nothing sent)
  to address 0 under a broadcast number (above every connected device's HELLO ``broadcast_next``
  and every number this bus used), waits the frame's time and the turnaround — no timeout, nobody
  answers — and returns UNKNOWN / BROADCAST_SENT for each connected handle. ``bus.verify(results)``
  reads each device back: OK where the values hold, NOT_EXECUTED where they do not (a set-only
  write: sending it again is harmless), UNKNOWN where the read-back cannot tell.
- A handle's ``close`` leaves the shared transport open; ``Bus.close`` closes it.
- **Keys** (docs/SECURITY.md): ``key=`` one key (bytes, a rotation's tuple, or a private key
  file's path) for every device, or a mapping ``{address: key}`` — one key per device, as the
  key life cycle asks; an address missing from the mapping is refused when its handle is made
  (``LocalProtocolError``), never driven unkeyed. A keyed handle refuses a device that does not
  sign with its key (no downgrade). Broadcasts stay unauthenticated (nobody answers, no session
  key is shared by the devices): a keyed device does not run them, so a keyed bus's
  ``broadcast`` is refused (``LocalProtocolError``, nothing sent; docs/BUS.md).

The rules (turn order, breaker and its schedule) are ``idemlink.protocol.bus_rules``; the
handles only consult them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Self

from idemlink.host.command import Command, CommandBuilder, Result
from idemlink.host.device import BlockingDriver, Device
from idemlink.host.errors import NoDevice
from idemlink.host.half_duplex import HalfDuplexTransport
from idemlink.host.operations import Job
from idemlink.host.rtu_device import RtuDevice, line_rate
from idemlink.host.rtu_operations import probe_command
from idemlink.host.transport import SerialTransport, Transport
from idemlink.protocol.bus_rules import Breaker, BreakerPolicy, next_in_turn
from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.device_core import broadcast_allowed
from idemlink.protocol.frame import BROADCAST_ADDRESS, FrameType, check_address, encode_frame
from idemlink.protocol.host_session import SessionState, oversize
from idemlink.protocol.key_file import HostKey, host_keys
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

KEYED_RTU_BUS = ("a key is for idemlink devices: plain Modbus RTU units have no authentication "
                 "(docs/SECURITY.md), so a keyed modbus_rtu bus is refused; nothing was sent")

BROADCAST_UNSIGNED = ("a broadcast is unsigned (nobody answers it and the devices share no "
                      "session key): a keyed device does not run one (docs/BUS.md, docs/"
                      "SECURITY.md); nothing was sent")

BusKeys = tuple[bytes, ...] | dict[int, tuple[bytes, ...]] | None
"""A bus's keys, read: one device key for all, or per address."""


def bus_keys(key: HostKey | Mapping[int, HostKey] | None) -> BusKeys:
    """``key`` read (key files opened, lengths checked): see the module docstring."""
    if key is None or isinstance(key, bytes | tuple | str | os.PathLike):
        return host_keys(key)
    out: dict[int, tuple[bytes, ...]] = {}
    for address, k in key.items():
        keys = host_keys(k)
        if keys is None:
            raise LocalProtocolError(f"address {address}: no key in the bus's key mapping")
        out[check_address(address)] = keys
    return out


def key_of(keys: BusKeys, address: int) -> tuple[bytes, ...] | None:
    """The keys of ``address`` from a bus's keys; an address missing from a mapping is refused
    (never driven unkeyed)."""
    if not isinstance(keys, dict):
        return keys
    found = keys.get(address)
    if found is None:
        raise LocalProtocolError(f"address {address} has no key in the bus's key mapping: a "
                                 "keyed bus drives no device unkeyed; nothing was sent")
    return found


def unanswered(results: Iterable[Result]) -> bool:
    """Whether an operation's results show the device did not answer (a request given up
    after its attempts)."""
    return any(r.status is Status.NO_ANSWER for r in results)


def refused(breaker: Breaker, address: int, commands: list[Command], why: str) -> list[Result]:
    """NOT_EXECUTED / BREAKER_OPEN for each command: none of them left (counted in
    ``breaker.refused``)."""
    breaker.refused += len(commands)
    return [Result(c, Outcome.NOT_EXECUTED, Status.BREAKER_OPEN,
                   detail=f"address {address} {why}") for c in commands]


def out_of_range(regmap: RegisterMap, command: Command) -> str | None:
    """What of a register write lies outside the map's min..max (``RegisterSpec.in_range``),
    or None. A device refuses such a write (ILLEGAL_DATA_VALUE); addressed, that answer is a
    REJECTED, but nobody answers a broadcast, so its read-back would say only "does not hold"."""
    for i, _ in enumerate(command.values):
        spec = regmap.at(command.address + i)
        if spec is None or spec.address != command.address + i or spec.field is not None:
            continue
        raw = spec.raw_from_words(command.values[i:i + spec.words])
        if not spec.in_range(raw):
            return f"{spec.name}={raw} outside {spec.limits_text()}"
    return None


class FairTurn:
    """Whose turn the line is, between a bus's handles on threads: ``acquire(key)`` waits for
    it, ``release(key)`` hands it on by the round-robin rule
    (``idemlink.protocol.bus_rules.next_in_turn``). The turn belongs to a key (an address; 0
    for a broadcast), not to a thread: the thread driving a handle's loop may change. A thread
    that holds the turn and asks it for another key (a command to device B while it iterates a
    ``stream`` of device A) has it at once, nested, and gives it back to the first key when it
    releases it: waiting would wait for itself."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.holder: int | None = None
        self.waiting: set[int] = set()
        self.last: int | None = None
        self.grants = 0  #: turns handed out (each transaction is one, or several in a row)
        self._thread: int | None = None  #: the thread that last acquired the turn
        self._lent: list[tuple[int, int | None]] = []  #: (nested key, the key it was lent from)

    def acquire(self, key: int) -> None:
        me = threading.get_ident()
        with self._cond:
            if self.holder == key:
                return
            if self.holder is not None and self._thread == me:
                self._lent.append((key, self.holder))
                self.holder = key
                return
            self.waiting.add(key)
            try:
                while self.holder != key:
                    if self.holder is None:
                        self._grant()
                    else:
                        self._cond.wait()
            except BaseException:
                self.waiting.discard(key)
                if self.holder == key:
                    self._hand_on(key)
                raise
            self._thread = me

    def release(self, key: int) -> None:
        with self._cond:
            if self.holder != key:
                return
            if self._lent and self._lent[-1][0] == key:
                self.holder = self._lent.pop()[1]
                return
            self._hand_on(key)

    def pass_on(self, key: int) -> None:
        """Hand the turn to the next key waiting and queue for it again, in one step (no key
        that waited less can slip in ahead while this thread comes back to wait)."""
        with self._cond:
            if self.holder == key and not self._lent:
                self.waiting.add(key)
                self._hand_on(key)
        self.acquire(key)

    def contended(self, key: int) -> bool:
        """Whether another key waits for the line."""
        with self._cond:
            return bool(self.waiting - {key}) and not self._lent

    @contextmanager
    def hold(self, key: int) -> Iterator[None]:
        self.acquire(key)
        try:
            yield
        finally:
            self.release(key)

    def _hand_on(self, key: int) -> None:
        self.holder, self.last, self._thread = None, key, None
        self._grant()

    def _grant(self) -> None:
        nxt = next_in_turn(self.waiting, self.last)
        if nxt is not None:
            self.waiting.discard(nxt)
            self.holder = nxt
            self.grants += 1
            self._cond.notify_all()


class Holding:
    """A handle's hold on the line, blocking or awaited alike (``TurnTransport``,
    ``idemlink.host.aio_bus.AsyncTurnTransport``): whether it holds the turn, and whether it
    gives it up before its next send (``gives_up``: a transaction of its settled during this
    turn and another key waits; never for a pipelining handle, ``per_transaction=False``)."""

    def __init__(self, turn: Any, key: int, *, per_transaction: bool = True) -> None:
        self.turn = turn  #: a ``FairTurn`` or an ``AsyncFairTurn`` (``release``, ``contended``)
        self.key = key
        self.per_transaction = per_transaction
        self.holding = False
        self.settled: Callable[[], int] = lambda: 0  #: requests settled so far (the handle's)
        self._mark = 0

    def gives_up(self) -> bool:
        return (self.per_transaction and self.settled() != self._mark
                and bool(self.turn.contended(self.key)))

    def took(self) -> None:
        self.holding = True
        self._mark = self.settled()

    def release(self) -> None:
        if self.holding:
            self.holding = False
            self.turn.release(self.key)


class TurnTransport(Holding):
    """One handle's view of the bus's transport: every ``write`` and ``read`` first has the
    line's turn (``FairTurn``). A transaction is a request from its first send to its
    settling (retries included): once one settled during this turn (``settled()`` moved) and
    another key waits, the handle gives the turn up before it sends again, so every waiting
    handle gets one transaction before its next. ``release()`` ends its turn (the end of an
    operation). ``per_transaction=False`` (a pipelining handle, ``half_duplex=False``): the turn
    passes per operation only, as another handle's reads would take this one's answers still in
    flight."""

    def __init__(self, inner: Transport, turn: FairTurn, key: int, *,
                 per_transaction: bool = True) -> None:
        super().__init__(turn, key, per_transaction=per_transaction)
        self.inner = inner

    def take(self) -> None:
        if not self.holding:
            self.turn.acquire(self.key)
        elif self.gives_up():  # a transaction ended: the others' turn first, then this one's
            self.holding = False
            self.turn.pass_on(self.key)
        else:
            return
        self.took()

    def write(self, data: bytes) -> None:
        self.take()
        self.inner.write(data)

    def read(self, timeout: float) -> bytes:
        self.take()
        return self.inner.read(timeout)

    def now(self) -> float:
        return self.inner.now()

    def close(self) -> None:
        """The bus's transport stays open (``Bus.close`` closes it)."""
        self.release()

    def __getattr__(self, name: str) -> Any:  # ``port`` (YMODEM jobs), ``wake``
        return getattr(self.inner, name)


class BusHandle(BlockingDriver):
    """What every handle on a ``Bus`` adds to its driver: the bus's turn per transaction
    (``TurnTransport``), the breaker, the scheduled probe. ``BusDevice`` (framed) and
    ``BusRtuDevice`` (a plain Modbus RTU unit) are it over their drivers."""

    bus: Bus
    address: int
    breaker: Breaker
    line: TurnTransport

    def _join(self, bus: Bus, address: int, line: TurnTransport) -> None:
        self.bus, self.address, self.line = bus, address, line
        self.breaker = Breaker(bus.breaker_policy)
        stats = self.ops.stats
        line.settled = lambda: stats.commands

    def _needs_connect(self) -> bool:
        """Whether the first command must connect first (a HELLO; a plain slave has none)."""
        return False

    def _release(self) -> None:
        self.line.release()  # the operation's end: the line is the others' again
        super()._release()

    def _run_job(self, job: Job[Any]) -> None:
        self.line.take()  # a job on the port (YMODEM) is a transaction too
        super()._run_job(job)

    def connect(self) -> None:
        now = self.transport.now()
        if not self.breaker.allows(now):
            raise NoDevice(f"address {self.address}: its breaker is open (it did not answer); "
                           "nothing was sent")
        try:
            super().connect()
        except NoDevice:
            self.breaker.record(False, self.transport.now())
            raise
        self.breaker.record(True, self.transport.now())

    def _share(self, commands: list[Command]) -> list[Result]:
        self.bus.probe_due(skip=self.address)  # the breakers' schedule rides on the traffic
        if not self.breaker.allows(self.transport.now()):
            return self._refused(commands, "did not answer; nothing was sent")
        if self._needs_connect():
            try:
                BlockingDriver.connect(self)  # the first command, or the probe of a silent one
            except NoDevice:
                self.breaker.record(False, self.transport.now())
                return self._refused(commands, "did not answer its HELLO; nothing else "
                                               "was sent")
        results = super()._share(commands)
        self.breaker.record(not unanswered(results), self.transport.now())
        return results

    def probe(self) -> bool | None:
        """One scheduled probe (the breaker allowing): a HELLO for a device never connected,
        else a read of the map's first register. True: it answered (the breaker closes);
        False: it did not (it opens again, for longer); None: nothing was sent (not due, or the
        handle waits for its user to settle an UNKNOWN)."""
        if self.ops.unknown is not None or not self.breaker.probe_due(self.transport.now()):
            return None
        self.breaker.allows(self.transport.now())
        try:
            if self._needs_connect():
                BlockingDriver.connect(self)
                answered = True
            else:
                answered = not unanswered(BlockingDriver._share(
                    self, [probe_command(self.regmap)]))
        except NoDevice:
            answered = False
        self.breaker.record(answered, self.transport.now())
        return answered

    def _refused(self, commands: list[Command], why: str) -> list[Result]:
        return refused(self.breaker, self.address, commands, why)

    def close(self) -> None:
        """Stop this handle (the bus's transport stays open: ``Bus.close`` closes it)."""
        self._stop_sharing()
        self.line.release()


class BusDevice(BusHandle, Device):
    """One address's idemlink device on a ``Bus``: a ``Device`` whose frames go ADDRESSED to
    it, on the bus's turn, behind its breaker."""

    def __init__(self, bus: Bus, address: int, *, max_inflight: int) -> None:
        line = TurnTransport(bus.transport, bus.turn, address, per_transaction=max_inflight == 1)
        Device.__init__(self, line, regmap=bus.regmap, timeout=bus.timeout,
                        attempts=bus.attempts, max_inflight=max_inflight,
                        check_map=bus.check_map, address=address,
                        key=bus.key_for(address))
        self._join(bus, address, line)

    def _needs_connect(self) -> bool:
        return self.session.state is SessionState.CLOSED


class BusRtuDevice(BusHandle, RtuDevice):
    """One unit of a plain Modbus RTU line on a ``Bus`` (``modbus_rtu=True``): an ``RtuDevice``
    at that unit, on the bus's turn, behind its breaker. A plain slave has no handshake: its
    first command is its probe."""

    def __init__(self, bus: Bus, unit: int) -> None:
        line = TurnTransport(bus.transport, bus.turn, unit)
        RtuDevice.__init__(self, line, regmap=bus.regmap, unit=unit, baudrate=bus.line_rate,
                           timeout=bus.timeout, attempts=bus.attempts,
                           char_format=bus.char_format)
        self._join(bus, unit, line)


class Bus:
    """A shared line of idemlink devices. See the module docstring."""

    def __init__(self, transport: Transport, *, regmap: RegisterMap = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, half_duplex: bool = True,
                 max_inflight: int = 8, check_map: bool = True,
                 breaker: BreakerPolicy | None = None, baud: int | None = 115200,
                 turnaround: float = 0.001, modbus_rtu: bool = False,
                 char_format: CharFormat = MODBUS_CHAR_FORMAT,
                 line_rate: int | None = None,
                 key: HostKey | Mapping[int, HostKey] | None = None) -> None:
        if modbus_rtu and key is not None:
            raise LocalProtocolError(KEYED_RTU_BUS)
        self._keys = bus_keys(key)  # read (and refused) before anything is sent
        self.transport = transport
        self.baud = baud  #: the line's rate: how long a broadcast occupies it
        self.turnaround = turnaround  #: the devices' turnaround: a broadcast's wait after it
        self.regmap = regmap
        self.timeout = timeout
        self.attempts = attempts
        self.half_duplex = half_duplex
        self.max_inflight = 1 if half_duplex else max_inflight
        self.check_map = check_map
        self.breaker_policy = breaker or BreakerPolicy()
        #: plain Modbus RTU units (``BusRtuDevice``) instead of idemlink devices
        self.modbus_rtu = modbus_rtu
        self.char_format = char_format  #: with ``modbus_rtu``: the RTU timing's character
        self.line_rate = line_rate  #: with ``modbus_rtu``: the rate that paces t3.5 (None: pty)
        #: whose turn the line is: one transaction at a time, round-robin among the handles
        #: with work queued (``FairTurn``)
        self.turn = FairTurn()
        self._devices: dict[int, BusDevice | BusRtuDevice] = {}
        self._broadcast_next: int | None = None  #: the next broadcast number this bus uses
        self._probing = threading.Lock()  #: one thread runs the scheduled probes at a time

    @classmethod
    def open(cls, url: str, *, baudrate: int = 115200, bytesize: int = 8,
             parity: str | None = None, stopbits: float = 1, keep_lines: bool = True,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, echo: bool = False,
             guard: float = 0.0, modbus_rtu: bool = False, **kw: Any) -> Bus:
        """Open ``url`` (any pyserial URL) for a bus; no device is contacted until a handle's
        first operation (``device(address).connect()`` or a command). ``echo``: the adapter
        echoes what the master sends (recognised and removed; a wrong echo is ``EchoMismatch``);
        ``guard``: seconds the master waits after the last byte heard before it sends
        (``idemlink.host.half_duplex``). ``modbus_rtu``: the line's devices are plain Modbus RTU
        slaves (``device(unit)`` is a ``BusRtuDevice``; the character format defaults to 8E1
        as ``RtuDevice.open``'s); ``parity`` defaults to N for idemlink devices."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        if kw.get("key") is not None:  # a refused key: before the port is opened
            if modbus_rtu:
                raise LocalProtocolError(KEYED_RTU_BUS)
            kw["key"] = bus_keys(kw["key"])
        fmt = CharFormat(bytesize, parity or ("E" if modbus_rtu else "N"), stopbits)
        serial = SerialTransport(url, baudrate=baudrate, bytesize=fmt.bytesize,
                                 parity=fmt.parity, stopbits=fmt.stopbits, keep_lines=keep_lines)
        transport: Transport = serial
        if echo or guard:
            transport = HalfDuplexTransport(serial, echo=echo, guard=guard)
        if modbus_rtu:
            kw.setdefault("char_format", fmt)
            kw.setdefault("line_rate", line_rate(serial.port, baudrate))
        return cls(transport, regmap=rm, baud=baudrate, modbus_rtu=modbus_rtu, **kw)

    def key_for(self, address: int) -> tuple[bytes, ...] | None:
        """The keys of the device at ``address`` (None: an unkeyed bus). See the module
        docstring."""
        return key_of(self._keys, address)

    def device(self, address: int) -> BusDevice | BusRtuDevice:
        """The handle of the device at ``address`` (1..247; with ``modbus_rtu`` the unit id),
        the same one each time."""
        check_address(address)
        dev = self._devices.get(address)
        if dev is None:
            dev = self._devices[address] = (
                BusRtuDevice(self, address) if self.modbus_rtu
                else BusDevice(self, address, max_inflight=self.max_inflight))
        return dev

    def framed(self, address: int) -> BusDevice:
        """``device(address)`` of a bus of idemlink devices (``LocalProtocolError`` with
        ``modbus_rtu``)."""
        dev = self.device(address)
        if not isinstance(dev, BusDevice):
            raise LocalProtocolError("a Modbus RTU bus's units are not idemlink devices")
        return dev

    def probe_due(self, *, skip: int | None = None) -> dict[int, bool]:
        """Probe every handle whose breaker's schedule says so now (``Breaker.probe_due``): a
        HELLO or a read of the map's first register each, on its own turn; what each found
        (True: it answered, its breaker closed). Every handle's commands call it first, so a
        busy bus follows the schedule on its own; a program that sends nothing calls it at
        ``next_probe()``. Another thread probing already: nothing here."""
        if not self._probing.acquire(blocking=False):
            return {}
        try:
            now = self.transport.now()
            due = [d for a, d in sorted(self._devices.items())
                   if a != skip and d.breaker.probe_due(now)]
            found = {d.address: d.probe() for d in due}
            return {a: f for a, f in found.items() if f is not None}
        finally:
            self._probing.release()

    def next_probe(self) -> float | None:
        """When the next scheduled probe is due (the transport's clock), None if no breaker is
        open."""
        times = [t for d in self._devices.values() if (t := d.breaker.next_probe) is not None]
        return min(times) if times else None

    def broadcast(self, values: Mapping[str | int, int | str], *,
                  repeat: int = 1) -> dict[int, Result]:
        """Send ``values`` (HOLDING registers) to every device at once. See the module
        docstring. ``repeat`` sends the same frame (the same broadcast number) that many times,
        one after the other, against loss: a device runs it once however often it hears it."""
        if not 1 <= repeat <= 100:
            raise LocalProtocolError(f"a broadcast is sent 1..100 times, not {repeat}")
        if self._keys is not None:
            raise LocalProtocolError(BROADCAST_UNSIGNED)
        if self.modbus_rtu:
            raise LocalProtocolError("a broadcast here is the idemlink broadcast (numbered, run "
                                     "once); a plain Modbus RTU line has none; nothing was sent")
        command = CommandBuilder(self.regmap).write_command(values)
        if not broadcast_allowed(self.regmap, command.pdu()):
            raise LocalProtocolError("a broadcast carries a set-only write of HOLDING registers "
                                     "only (nobody answers it); nothing was sent")
        outside = out_of_range(self.regmap, command)
        if outside:
            raise LocalProtocolError(f"{outside}: every device would refuse it, silently (nobody "
                                     "answers a broadcast); nothing was sent")
        handles = {a: d for a, d in self._devices.items()
                   if isinstance(d, BusDevice) and d.info is not None}
        if not handles:
            raise LocalProtocolError("connect the devices first: broadcast numbers start above "
                                     "what their HELLO replies say; nothing was sent")
        for a, d in sorted(handles.items()):  # each device said how large a request it takes
            too_large = oversize(command.pdu(), d.info)
            if too_large is not None:
                raise LocalProtocolError(f"device {a}: {too_large.removesuffix(': not sent')}; "
                                         "a broadcast reaches every device: nothing was sent")
        seq = self._broadcast_number(handles.values())
        frame = encode_frame(FrameType.REQUEST, seq, 0, command.pdu(), address=BROADCAST_ADDRESS)
        wait = self.turnaround + (0.0 if self.baud is None
                                  else repeat * len(frame) * 10 / self.baud)
        with self.turn.hold(BROADCAST_ADDRESS):
            self.transport.write(frame * repeat)
            deadline = self.transport.now() + wait
            while (left := deadline - self.transport.now()) > 0:
                self.transport.read(left)  # nobody answers: what comes is stray, dropped
        self._broadcast_next = (seq + 1) & 0xFFFFFFFF
        return {a: Result(command, Outcome.UNKNOWN, Status.BROADCAST_SENT, seq=seq,
                          detail="a broadcast; read back (verify) to know")
                for a in sorted(handles)}

    def _broadcast_number(self, handles: Iterable[BusDevice]) -> int:
        """The highest of the devices' ``broadcast_next`` and this bus's next (RFC 1982)."""
        best = self._broadcast_next
        for d in handles:
            n = d.info.broadcast_next if d.info is not None else None
            if n is not None and (best is None or 0 < (n - best) & 0xFFFFFFFF < 0x80000000):
                best = n
        return 1 if best is None else best

    def verify(self, results: Mapping[int, Result]) -> dict[int, Result]:
        """Each device read back after ``broadcast``: OK where the values hold, NOT_EXECUTED
        where they do not, UNKNOWN where the read cannot tell (or the device did not answer)."""
        out: dict[int, Result] = {}
        for a, r in results.items():
            dev = self.device(a)
            rec = dev.reconcile(r)
            holds = None if rec is None else rec.intended_state_holds
            if holds is True:
                out[a] = replace(r, outcome=Outcome.OK, status=Status.OK,
                                 detail="read back: the values hold")
            elif holds is False:
                out[a] = replace(r, outcome=Outcome.NOT_EXECUTED, status=None,
                                 detail="read back: the values do not hold (a set-only write: "
                                        "sending it again is harmless)")
            else:
                out[a] = replace(r, detail=f"read back: {rec.summary if rec else 'no answer'}")
        return out

    def close(self) -> None:
        for dev in self._devices.values():
            dev.close()
        self.transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
