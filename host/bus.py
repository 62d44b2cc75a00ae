"""The host's handle on a shared line of idemlink devices (issue 22 item 3; docs/BUS.md).

Contract:

- ``Bus(transport)`` / ``Bus.open(url)`` owns one transport; ``bus.device(address)`` gives that
  device's handle, a ``Device`` (the whole blocking API and its outcomes) whose frames go
  ADDRESSED to it, created once per address.
- **One transaction on the wire at a time** (half-duplex, the default): every handle sends at most
  one request at a time (``max_inflight=1``) and an operation of one handle holds the line
  (``Bus.turn``, a lock) until it ends, so no handle's request meets another's answer on the
  medium. ``half_duplex=False`` lets handles pipeline as a point-to-point ``Device`` does (the
  line still carries one handle's operation at a time: they share one transport).
- **A dead device costs only its own time**: each handle has a ``Breaker``. After
  ``BreakerPolicy.failures`` operations in a row that ended with a request unanswered (status
  NO_ANSWER) or a HELLO unanswered, the breaker opens: for ``cooldown`` seconds the handle's
  commands end NOT_EXECUTED / BREAKER_OPEN at once and nothing is sent. After the cooldown the
  next command goes out as a probe: answered, the breaker closes; unanswered, it opens again.
- **Broadcast** (issue 22 item 4): ``bus.broadcast({"mode": 1})`` sends one set-only write
  (HOLDING registers only: ``broadcast_allowed``, else ``LocalProtocolError`` and nothing sent)
  to address 0 under a broadcast number (above every connected device's HELLO ``broadcast_next``
  and every number this bus used), waits the frame's time and the turnaround — no timeout, nobody
  answers — and returns UNKNOWN / BROADCAST_SENT for each connected handle. ``bus.verify(results)``
  reads each device back: OK where the values hold, NOT_EXECUTED where they do not (a set-only
  write: sending it again is harmless), UNKNOWN where the read-back cannot tell.
- A handle's ``close`` leaves the shared transport open; ``Bus.close`` closes it.

The breaker's rule is ``Breaker`` (time passed in); the handles only consult it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Self, TypeVar

from idemlink.host.command import Command, CommandBuilder, Result
from idemlink.host.device import Device
from idemlink.host.errors import NoDevice
from idemlink.host.half_duplex import HalfDuplexTransport
from idemlink.host.operations import Steps
from idemlink.host.transport import SerialTransport, Transport
from idemlink.protocol.device_core import broadcast_allowed
from idemlink.protocol.frame import BROADCAST_ADDRESS, FrameType, check_address, encode_frame
from idemlink.protocol.host_session import SessionState
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

T = TypeVar("T")


class BreakerState(Enum):
    CLOSED = "closed"  #: commands are sent
    OPEN = "open"  #: nothing is sent until the cooldown ends
    PROBING = "probing"  #: one operation goes out to see whether the device is back


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failures: int = 2  #: unanswered operations in a row that open the breaker
    cooldown: float = 2.0  #: seconds it stays open before the next command probes

    def __post_init__(self) -> None:
        if self.failures < 1 or not 0 <= self.cooldown < 3600:
            raise LocalProtocolError("a breaker opens after >= 1 failures and cools down for "
                                     "0..3600 s")


class Breaker:
    """One device's circuit breaker (time passed in). See the module docstring."""

    def __init__(self, policy: BreakerPolicy | None = None) -> None:
        self.policy = policy or BreakerPolicy()
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.open_until = 0.0
        self.refused = 0  #: commands ended BREAKER_OPEN without being sent

    def allows(self, now: float) -> bool:
        """Whether an operation may go out now (after the cooldown: as a probe)."""
        if self.state is BreakerState.OPEN:
            if now < self.open_until:
                return False
            self.state = BreakerState.PROBING
        return True

    def record(self, answered: bool, now: float) -> None:
        """What the operation that went out found: the device answered, or not."""
        if answered:
            self.state, self.failures = BreakerState.CLOSED, 0
            return
        self.failures += 1
        if self.state is BreakerState.PROBING or self.failures >= self.policy.failures:
            self.state = BreakerState.OPEN
            self.open_until = now + self.policy.cooldown


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


class BusDevice(Device):
    """One address's handle on a ``Bus``: a ``Device`` that takes the bus's turn for each
    operation and consults its breaker."""

    def __init__(self, bus: Bus, address: int, *, max_inflight: int) -> None:
        super().__init__(bus.transport, regmap=bus.regmap, timeout=bus.timeout,
                         attempts=bus.attempts, max_inflight=max_inflight,
                         check_map=bus.check_map, address=address)
        self.bus = bus
        self.address = address
        self.breaker = Breaker(bus.breaker_policy)

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

    def _rounds(self, steps: Steps[T]) -> Generator[None, None, T]:
        with self.bus.turn:
            return (yield from super()._rounds(steps))

    def _share(self, commands: list[Command]) -> list[Result]:
        now = self.transport.now()
        if not self.breaker.allows(now):
            return self._refused(commands, "did not answer; nothing was sent")
        with self.bus.turn:
            if self.session.state is SessionState.CLOSED:
                try:
                    super().connect()  # the probe of a device that never answered
                except NoDevice:
                    self.breaker.record(False, self.transport.now())
                    return self._refused(commands, "did not answer its HELLO; nothing else "
                                                   "was sent")
            results = super()._share(commands)
        self.breaker.record(not unanswered(results), self.transport.now())
        return results

    def _refused(self, commands: list[Command], why: str) -> list[Result]:
        return refused(self.breaker, self.address, commands, why)

    def close(self) -> None:
        """Stop this handle (the bus's transport stays open: ``Bus.close`` closes it)."""
        self._stop_sharing()


class Bus:
    """A shared line of idemlink devices. See the module docstring."""

    def __init__(self, transport: Transport, *, regmap: RegisterMap = DEFAULT_MAP,
                 timeout: float = 0.2, attempts: int = 5, half_duplex: bool = True,
                 max_inflight: int = 8, check_map: bool = True,
                 breaker: BreakerPolicy | None = None, baud: int | None = 115200,
                 turnaround: float = 0.001) -> None:
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
        #: held by the handle whose operation is on the line (reentrant: an operation's
        #: connect runs inside it)
        self.turn = threading.RLock()
        self._devices: dict[int, BusDevice] = {}
        self._broadcast_next: int | None = None  #: the next broadcast number this bus uses

    @classmethod
    def open(cls, url: str, *, baudrate: int = 115200, bytesize: int = 8, parity: str = "N",
             stopbits: float = 1, keep_lines: bool = True,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, echo: bool = False,
             guard: float = 0.0, **kw: Any) -> Bus:
        """Open ``url`` (any pyserial URL) for a bus; no device is contacted until a handle's
        first operation (``device(address).connect()`` or a command). ``echo``: the adapter
        echoes what the master sends (recognised and removed; a wrong echo is ``EchoMismatch``);
        ``guard``: seconds the master waits after the last byte heard before it sends
        (``idemlink.host.half_duplex``)."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        serial = SerialTransport(url, baudrate=baudrate, bytesize=bytesize, parity=parity,
                                 stopbits=stopbits, keep_lines=keep_lines)
        transport: Transport = serial
        if echo or guard:
            transport = HalfDuplexTransport(serial, echo=echo, guard=guard)
        return cls(transport, regmap=rm, baud=baudrate, **kw)

    def device(self, address: int) -> BusDevice:
        """The handle of the device at ``address`` (1..247), the same one each time."""
        check_address(address)
        dev = self._devices.get(address)
        if dev is None:
            dev = self._devices[address] = BusDevice(self, address,
                                                     max_inflight=self.max_inflight)
        return dev

    def broadcast(self, values: Mapping[str | int, int | str], *,
                  repeat: int = 1) -> dict[int, Result]:
        """Send ``values`` (HOLDING registers) to every device at once. See the module
        docstring. ``repeat`` sends the same frame (the same broadcast number) that many times,
        one after the other, against loss: a device runs it once however often it hears it."""
        if not 1 <= repeat <= 100:
            raise LocalProtocolError(f"a broadcast is sent 1..100 times, not {repeat}")
        command = CommandBuilder(self.regmap).write_command(values)
        if not broadcast_allowed(self.regmap, command.pdu()):
            raise LocalProtocolError("a broadcast carries a set-only write of HOLDING registers "
                                     "only (nobody answers it); nothing was sent")
        handles = {a: d for a, d in self._devices.items() if d.info is not None}
        if not handles:
            raise LocalProtocolError("connect the devices first: broadcast numbers start above "
                                     "what their HELLO replies say; nothing was sent")
        seq = self._broadcast_number(handles.values())
        frame = encode_frame(FrameType.REQUEST, seq, 0, command.pdu(), address=BROADCAST_ADDRESS)
        wait = self.turnaround + (0.0 if self.baud is None
                                  else repeat * len(frame) * 10 / self.baud)
        with self.turn:
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
            rec = self.device(a).reconcile(r)
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
