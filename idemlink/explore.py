"""Bounded exhaustive exploration of the two handshakes, driving the real sans-I/O machines.

Contract: ``explore_ymodem(depth)`` and ``explore_sessions(depth)`` enumerate *every* schedule
of the line's faults with at most ``depth`` faults, depth-first, merging states already seen
(a state is the machines' own attributes, the messages in flight, the faults left and what has
been observed so far), and return an ``Exploration``: distinct states, complete schedules, the
longest schedule, and every property violation with the schedule that produced it.

The line carries *messages* — what one machine wrote at once (the sessions' output is cut into
frames). In every state the explorer may: deliver the oldest message (no fault); and, while
faults are left, drop any message (loss), deliver a copy of any message and keep it in flight
(duplication), deliver a message other than the oldest (reorder), let time run to the next
deadline while messages are in flight (delay) — and, for the sessions, reboot the device. With
nothing in flight time runs to the next deadline (no fault). Nothing is modelled: the machines
are ``idemlink.protocol.ymodem.Sender``/``Receiver`` and ``HostSession``/``DeviceSession``
over a ``DeviceCore``, copied at each branch.

Properties checked at the end of every schedule (nothing in flight, no deadline left):

- YMODEM (two files; faults only from the first EOT on: the EOT handshake and the next header):
  every committed file has exactly the sent bytes and is committed once; the transfer ended (no
  hang) with every file committed or cleanly aborted; a file the sender reports committed was
  committed, and a committed file is not reported failed by the sender.
- Sessions (a set-only write and a trigger, pipelined, from the HELLO on): every request settled
  exactly once (no hang); the trigger ran at most once and the write at most once per boot epoch;
  an OK ran exactly once with the answer it carries; NOT_EXECUTED/REJECTED never ran.
"""

from __future__ import annotations

import copy
import pickle
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import BROADCAST_ADDRESS, FrameType, encode_frame
from idemlink.protocol.host_session import Completion, HostSession, SessionOpened
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.ymodem_events import Aborted, FileCommitted, FileData, FileStarted, drain_events
from idemlink.protocol.ymodem_receiver import Receiver
from idemlink.protocol.ymodem_sender import Sender, SenderConfig, SendFile
from idemlink.protocol.ymodem_tables import RxState, TxState
from idemlink.protocol.ymodem_wire import EOT

MAX_STEPS = 400
"""A schedule longer than this is reported (a livelock the bounded faults cannot explain)."""


@dataclass(slots=True)
class Exploration:
    depth: int
    states: int = 0  #: distinct states
    schedules: int = 0  #: complete schedules (distinct end states reached)
    longest: int = 0  #: steps in the longest schedule
    violations: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def kinds(self) -> Counter[str]:
        return Counter(v.split(":")[0] for v, _ in self.violations)


class _World:
    """One state of an exploration; subclasses give the machines."""

    net: list[tuple[str, bytes]]
    now: float
    faults: int
    path: tuple[str, ...]

    def fingerprint(self) -> bytes:
        raise NotImplementedError

    def deliver(self, direction: str, data: bytes) -> None:
        raise NotImplementedError

    def deadline(self) -> float | None:
        raise NotImplementedError

    def tick(self, now: float) -> None:
        raise NotImplementedError

    def collect(self) -> None:
        raise NotImplementedError

    def faults_allowed(self) -> bool:
        return True

    def shared(self) -> tuple[object, ...]:
        """What no machine changes (a register map): every copy of a state shares it instead
        of copying it."""
        return ()

    def extra_faults(self) -> list[tuple[str, Callable[[_World], None]]]:
        return []

    def finished(self) -> bool:
        raise NotImplementedError

    def check(self) -> list[str]:
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------
    def actions(self, depth: int) -> Iterator[tuple[str, Callable[[_World], None], bool]]:
        """(label, apply, is a fault)."""
        name = [self.describe(d, data) for d, data in self.net]
        if self.net:
            yield name[0], lambda w: w._deliver(0), False
        elif self.deadline() is not None:
            yield "timeout", lambda w: w._wait(), False
        if self.faults >= depth or not self.faults_allowed():
            return
        for i in range(len(self.net)):
            yield f"LOSE {name[i]}", partial(_World._lose, i=i), True
            yield f"DUP {name[i]}", partial(_World._deliver, i=i, keep=True), True
            if i:
                yield f"REORDER {name[i]}", partial(_World._deliver, i=i), True
        if self.net and self.deadline() is not None:
            yield "DELAY (timeout first)", lambda w: w._wait(), True
        for label, apply in self.extra_faults():
            yield label, apply, True

    def describe(self, direction: str, data: bytes) -> str:
        return f"{direction} {data.hex()}"

    def _lose(self, i: int) -> None:
        self.net.pop(i)

    def _deliver(self, i: int, keep: bool = False) -> None:
        direction, data = self.net[i] if keep else self.net.pop(i)
        self.deliver(direction, data)

    def _wait(self) -> None:
        t = self.deadline()
        assert t is not None
        self.now = max(self.now, t)
        self.tick(self.now)


def _explore(start: _World, depth: int) -> Exploration:
    result = Exploration(depth)
    start.collect()
    seen = {start.fingerprint()}
    stack = [start]
    while stack:
        w = stack.pop()
        result.states += 1
        moves = list(w.actions(depth))
        if not moves or len(w.path) >= MAX_STEPS:
            result.schedules += 1
            result.longest = max(result.longest, len(w.path))
            problems = w.check()
            if not moves and not w.finished():
                problems.append("HANG: nothing in flight, no deadline, not finished")
            if moves:
                problems.append(f"LIVELOCK: {MAX_STEPS} steps")
            result.violations += [(p, w.path) for p in problems]
            continue
        for label, apply, fault in moves:
            nxt = copy.deepcopy(w, {id(x): x for x in w.shared()})
            apply(nxt)
            nxt.faults += fault
            nxt.path = (*w.path, label)
            nxt.collect()
            fp = nxt.fingerprint()
            if fp not in seen:
                seen.add(fp)
                stack.append(nxt)
    return result


def _state(obj: object, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in sorted(vars(obj).items()) if k not in skip and not callable(v)}


# ------------------------------------------------------------------------------------- YMODEM

YMODEM_FILES = {"a.bin": b"hello", "b.bin": b"!"}


class _YmodemWorld(_World):
    def __init__(self, files: dict[str, bytes]) -> None:
        self.spec = files
        self.tx = Sender([SendFile.from_bytes(n, d) for n, d in files.items()],
                         SenderConfig(block_size=128, turnaround=0.0))
        self.rx = Receiver()
        self.net = []
        self.now = 0.0
        self.faults = 0
        self.path = ()
        self.eots = 0
        self.current: tuple[str, bytes] | None = None
        self.committed: dict[str, bytes] = {}
        self.errors: list[str] = []
        self.tx.start(0.0)
        self.rx.start(0.0)

    def fingerprint(self) -> bytes:
        return pickle.dumps((_state(self.tx, ("files", "config")), _state(self.rx, ("config",)),
                             self.net, self.now, self.faults, self.eots > 0, self.current,
                             sorted(self.committed.items()), self.errors))

    def describe(self, direction: str, data: bytes) -> str:
        names = {0x04: "EOT", 0x06: "ACK", 0x15: "NAK", 0x18: "CAN", 0x43: "C"}
        if data[:1] in (b"\x01", b"\x02") and len(data) > 3:
            what = f"block{data[1]}"
            if data[1] == 0:
                what += "(" + data[3:].split(b"\0")[0].decode(errors="replace") + ")"
        else:
            what = " ".join(names.get(b, f"{b:02x}") for b in data)
        return f"{direction} {what}"

    def deliver(self, direction: str, data: bytes) -> None:
        if direction == "tx>rx":
            self.rx.receive_data(data, self.now)
        else:
            self.tx.receive_data(data, self.now)

    def deadline(self) -> float | None:
        times = [t for t in (self.tx.next_deadline(), self.rx.next_deadline()) if t is not None]
        return min(times) if times else None

    def tick(self, now: float) -> None:
        self.tx.tick(now)
        self.rx.tick(now)

    def faults_allowed(self) -> bool:
        return self.eots > 0

    def collect(self) -> None:
        out = self.tx.data_to_send()
        if out:
            self.net.append(("tx>rx", out))
            self.eots += out == bytes([EOT])
        back = self.rx.data_to_send()
        if back:
            self.net.append(("rx>tx", back))
        drain_events(self.tx)
        for ev in drain_events(self.rx):
            if isinstance(ev, FileStarted):
                self.current = (ev.name, b"")
            elif isinstance(ev, FileData) and self.current is not None:
                name, body = self.current
                if ev.offset != len(body):
                    self.errors.append(f"GAP: {name} data at {ev.offset}, have {len(body)}")
                self.current = (name, body + ev.data)
            elif isinstance(ev, FileCommitted):
                body = self.current[1] if self.current is not None else b""
                if ev.name in self.committed:
                    self.errors.append(f"COMMITTED-TWICE: {ev.name}")
                self.committed[ev.name] = body
                self.current = None
            elif isinstance(ev, Aborted):
                self.current = None

    def finished(self) -> bool:
        return (self.tx.state in (TxState.DONE, TxState.ABORTED)
                and self.rx.state in (RxState.DONE, RxState.ABORTED))

    def check(self) -> list[str]:
        v = list(self.errors)
        for name, body in self.committed.items():
            if body != self.spec[name]:
                v.append(f"COMMITTED-WRONG-BYTES: {name}")
            if name not in self.tx.committed and name not in self.tx.unconfirmed:
                v.append(f"RX-COMMITTED-SENDER-FAILED: {name}")
        for name in self.tx.committed:
            if name not in self.committed:
                v.append(f"SENDER-OK-NOT-COMMITTED: {name}")
        if self.tx.state is TxState.DONE and self.committed != self.spec:
            v.append("SENDER-DONE-BUT-MISSING: " + ",".join(sorted(set(self.spec) -
                                                                 set(self.committed))))
        return v


def explore_ymodem(depth: int, files: dict[str, bytes] | None = None) -> Exploration:
    """Every schedule with at most ``depth`` faults from the first EOT on (see the module doc)."""
    return _explore(_YmodemWorld(dict(files or YMODEM_FILES)), depth)


# ----------------------------------------------------------------------------------- sessions

HASH = contract_hash()
WRITE = struct.pack(">BHH", 0x06, 4, 400)  #: threshold = 400: set-only
TRIGGER = struct.pack(">BHH", 0x42, 8, 1)  #: start self_clean: once only


class _Executor:
    """The register core behind the device session; keeps the device's own record."""

    def __init__(self) -> None:
        self.core = DeviceCore(trigger_duration=1000.0)
        self.epoch = 1
        self.runs: list[tuple[int, int, bytes, bytes]] = []

    def __call__(self, pdu: bytes, now: float, seq: int) -> bytes:
        answer = self.core.execute(pdu, now)
        self.runs.append((self.epoch, seq, pdu, answer))
        return answer

    def broadcast(self, pdu: bytes, now: float, seq: int) -> bytes:
        """A broadcast run, recorded under its number negated (a bound method, not a closure:
        the explorer's copies of a state must each reach their own executor)."""
        return self(pdu, now, -seq)


class _SessionWorld(_World):
    def __init__(self, reboots: int) -> None:
        self.exe = _Executor()
        self.dev = DeviceSession(self.exe, self.exe.epoch, contract_hash=HASH)
        self.host = HostSession(contract_hash=HASH, timeout=1.0, attempts=3, max_inflight=2,
                                hello_attempts=3, hello_nonce=77)
        self.reboots_left = reboots
        self.net = []
        self.now = 0.0
        self.faults = 0
        self.path = ()
        self.submitted = False
        self.done: dict[str, Completion] = {}
        self.errors: list[str] = []
        self.hello_failed = False
        self.host.open(0.0)

    def fingerprint(self) -> bytes:
        return pickle.dumps((_state(self.host), _state(self.dev, ("executor",)),
                             self.exe.core.values(), self.exe.runs, self.exe.epoch, self.net,
                             self.now, self.faults, self.reboots_left, self.submitted,
                             sorted((k, repr(c)) for k, c in self.done.items()), self.errors))

    def shared(self) -> tuple[object, ...]:
        return (self.exe.core.regmap,)

    def deliver(self, direction: str, data: bytes) -> None:
        if direction == "host>dev":
            self.dev.receive_data(data, self.now)
            self._frames("dev>host", self.dev.data_to_send())
        else:
            self.host.receive_data(data, self.now)

    def _frames(self, direction: str, data: bytes) -> None:
        for part in data.split(b"\x00"):
            if part:
                self.net.append((direction, part + b"\x00"))

    def deadline(self) -> float | None:
        return self.host.next_deadline()

    def tick(self, now: float) -> None:
        self.host.tick(now)

    def extra_faults(self) -> list[tuple[str, Callable[[_World], None]]]:
        if self.reboots_left <= 0:
            return []
        return [("reboot", _reboot)]

    def collect(self) -> None:
        while (ev := self.host.next_event()) is not None:
            if isinstance(ev, Completion):
                if ev.tag in self.done:
                    self.errors.append(f"SETTLED-TWICE: {ev.tag}")
                self.done[ev.tag] = ev
            elif type(ev).__name__ == "HelloFailed":
                self.hello_failed = True
        if self.host.state.name == "OPEN" and not self.submitted:
            self.submitted = True
            self.host.submit(WRITE, self.now, set_only=True, tag="write")
            self.host.submit(TRIGGER, self.now, set_only=False, tag="trigger")
        self._frames("host>dev", self.host.data_to_send())

    def finished(self) -> bool:
        return self.hello_failed or (self.submitted and len(self.done) == 2)

    def check(self) -> list[str]:
        v = list(self.errors)
        for tag, pdu in (("write", WRITE), ("trigger", TRIGGER)):
            runs = [r for r in self.exe.runs if r[2] == pdu]
            epochs = Counter(r[0] for r in runs)
            if tag == "trigger" and len(runs) > 1:
                v.append(f"DUPLICATED-EFFECT: the trigger ran {len(runs)} times")
            if any(n > 1 for n in epochs.values()):
                v.append(f"DUPLICATED-EFFECT: {tag} ran twice in one epoch")
            v += _judge(tag, runs, self.done.get(tag))
        return v


def _judge(tag: str, runs: list[tuple[int, int, bytes, bytes]], c: Completion | None) -> list[str]:
    """A request's outcome against the device's own record of its runs: every run under a number
    it was sent as; OK ran exactly once with the answer it carries; NOT_EXECUTED/REJECTED never
    ran."""
    if c is None:
        return []
    v: list[str] = []
    keys = set(c.sent_as)
    mine = [r for r in runs if (r[0], r[1]) in keys]
    if len(mine) != len(runs):
        v.append(f"UNCLAIMED: {tag} ran under a number it was not sent as")
    if c.outcome is Outcome.OK:
        final = [r for r in mine if (r[0], r[1]) == (c.epoch, c.seq)]
        if len(final) != 1 or final[0][3] != c.pdu:
            v.append(f"MISCLASSIFIED: {tag} OK without its one execution")
    elif c.outcome in (Outcome.NOT_EXECUTED, Outcome.REJECTED) and mine:
        v.append(f"MISCLASSIFIED: {tag} {c.outcome.name} but it ran")
    return v


def _reboot(w: _World) -> None:
    assert isinstance(w, _SessionWorld)
    w.reboots_left -= 1
    w.exe.epoch += 1
    w.exe.core.reset_volatile(w.now)
    w.dev = DeviceSession(w.exe, w.exe.epoch, contract_hash=HASH)


def explore_sessions(depth: int, reboots: int = 1) -> Exploration:
    """Every schedule with at most ``depth`` faults (a reboot counts as one; at most
    ``reboots`` of them) from the HELLO on (see the module doc)."""
    return _explore(_SessionWorld(reboots), depth)


# ------------------------------------------------------------------------------------ the bus

BROADCAST = struct.pack(">BHH", 0x06, 5, 2)  #: mode = 2, to every device: set-only
VERIFY = struct.pack(">BHH", 0x03, 5, 1)  #: the read-back of the broadcast's register
BUS_JOBS = {1: ("write", WRITE), 2: ("trigger", TRIGGER)}  #: what each address is asked


class _BusWorld(_World):
    """Two devices (addresses 1 and 2) on one bus, each with its own session and register core;
    the host has one session per address. Every frame the host sends is heard by each device
    separately (a bus: one receiver may miss a frame the other hears), so a message is
    ``host>1``, ``host>2`` or ``N>host``; a device ignores the other's answers
    (``address_verdict``, tested on its own), so they are not delivered to it."""

    def __init__(self, reboots: int) -> None:
        self.exe: dict[int, _Executor] = {}
        self.dev: dict[int, DeviceSession] = {}
        self.host: dict[int, HostSession] = {}
        for a in (1, 2):
            self.exe[a] = _Executor()
            self.exe[a].epoch = a  # distinct boots
            self.dev[a] = self._boot(a)
            self.host[a] = HostSession(contract_hash=HASH, timeout=1.0, attempts=3,
                                       max_inflight=1, hello_attempts=3, hello_nonce=70 + a,
                                       address=a)
        self.reboots_left = reboots
        self.net = []
        self.now = 0.0
        self.faults = 0
        self.path = ()
        self.broadcast_next: dict[int, int] = {}
        self.broadcast_seq: int | None = None
        self.submitted: set[int] = set()
        self.done: dict[tuple[int, str], Completion] = {}
        self.errors: list[str] = []
        self.hello_failed: set[int] = set()
        for a in (1, 2):
            self.host[a].open(0.0)

    def _boot(self, a: int) -> DeviceSession:
        exe = self.exe[a]
        return DeviceSession(exe, exe.epoch, contract_hash=HASH, address=a,
                             broadcast_ok=exe.core.broadcast_ok,
                             broadcast_executor=exe.broadcast)

    def fingerprint(self) -> bytes:
        return pickle.dumps((
            [(_state(self.host[a]), _state(self.dev[a], ("executor", "broadcast_ok",
                                                          "broadcast_executor")),
              self.exe[a].core.values(), self.exe[a].runs, self.exe[a].epoch) for a in (1, 2)],
            self.net, self.now, self.faults, self.reboots_left, sorted(self.submitted),
            self.broadcast_seq, sorted((k, repr(c)) for k, c in self.done.items()),
            self.errors, sorted(self.hello_failed)))

    def shared(self) -> tuple[object, ...]:
        return tuple(e.core.regmap for e in self.exe.values())

    def deliver(self, direction: str, data: bytes) -> None:
        src, _, dst = direction.partition(">")
        if src == "host":
            a = int(dst)
            self.dev[a].receive_data(data, self.now)
            self._frames(f"{a}>host", self.dev[a].data_to_send())
        else:
            a = int(src)
            self.host[a].receive_data(data, self.now)
            other = self.host[3 - a]  # the other session hears it too: another address
            other.receive_data(data, self.now)

    def _frames(self, direction: str, data: bytes) -> None:
        for part in data.split(b"\x00"):
            if part:
                self.net.append((direction, part + b"\x00"))

    def deadline(self) -> float | None:
        times = [t for h in self.host.values() if (t := h.next_deadline()) is not None]
        return min(times) if times else None

    def tick(self, now: float) -> None:
        for h in self.host.values():
            h.tick(now)

    def extra_faults(self) -> list[tuple[str, Callable[[_World], None]]]:
        if self.reboots_left <= 0:
            return []
        return [(f"reboot {a}", partial(_bus_reboot, a=a)) for a in (1, 2)]

    def collect(self) -> None:
        for a, h in self.host.items():
            while (ev := h.next_event()) is not None:
                if isinstance(ev, Completion):
                    if (a, ev.tag) in self.done:
                        self.errors.append(f"SETTLED-TWICE: {a} {ev.tag}")
                    self.done[(a, ev.tag)] = ev
                elif isinstance(ev, SessionOpened):
                    nxt = ev.info.broadcast_next
                    if nxt is not None:
                        self.broadcast_next.setdefault(a, nxt)
                elif type(ev).__name__ == "HelloFailed":
                    self.hello_failed.add(a)
            if h.state.name == "OPEN" and a not in self.submitted:
                self.submitted.add(a)
                tag, pdu = BUS_JOBS[a]
                h.submit(pdu, self.now, set_only=tag == "write", tag=tag)
        if self.broadcast_seq is None and len(self.submitted) == 2:
            # both sessions open: the broadcast, above both devices' broadcast_next, then the
            # read-backs that verify it (the host's ``Bus.broadcast`` and ``Bus.verify``)
            self.broadcast_seq = max(self.broadcast_next.values(), default=1)
            frame = encode_frame(FrameType.REQUEST, self.broadcast_seq, 0, BROADCAST,
                                 address=BROADCAST_ADDRESS)
            for a in (1, 2):
                self.net.append((f"host>{a}", frame))
            for a in (1, 2):
                self.host[a].submit(VERIFY, self.now, set_only=False, tag="verify")
        for a, h in self.host.items():
            self._frames(f"host>{a}", h.data_to_send())

    def finished(self) -> bool:
        return bool(self.hello_failed) or (self.broadcast_seq is not None
                                           and len(self.done) == 4)

    def check(self) -> list[str]:
        v = list(self.errors)
        for a, (tag, pdu) in BUS_JOBS.items():
            runs = [r for r in self.exe[a].runs if r[2] == pdu and r[1] > 0]
            epochs = Counter(r[0] for r in runs)
            if tag == "trigger" and len(runs) > 1:
                v.append(f"DUPLICATED-EFFECT: the trigger ran {len(runs)} times on {a}")
            if any(n > 1 for n in epochs.values()):
                v.append(f"DUPLICATED-EFFECT: {tag} ran twice in one epoch on {a}")
            v += _judge(f"{tag} on {a}", runs, self.done.get((a, tag)))
            v += self._check_broadcast(a)
        return v

    def _check_broadcast(self, a: int) -> list[str]:
        """At most once per device and boot; the read-back's verdict is honest: OK only if it
        ran before the read ran, NOT_EXECUTED only if it had not."""
        v: list[str] = []
        runs = self.exe[a].runs
        casts = [i for i, r in enumerate(runs) if r[1] < 0]
        if any(n > 1 for n in Counter(runs[i][0] for i in casts).values()):
            v.append(f"DUPLICATED-EFFECT: the broadcast ran twice in one boot on {a}")
        if len(casts) > 1:
            v.append(f"BROADCAST-ACROSS-REBOOT: {a}")  # the documented limit (docs/BUS.md)
        c = self.done.get((a, "verify"))
        if c is None or c.outcome is not Outcome.OK:
            return v  # an unanswered read-back says UNKNOWN: nothing claimed
        reads = [i for i, r in enumerate(runs) if r[2] == VERIFY and (r[0], r[1]) == (c.epoch,
                                                                                       c.seq)]
        if len(reads) != 1:
            return [*v, f"MISCLASSIFIED: the read-back on {a} OK without its one execution"]
        before = [i for i in casts if i < reads[0]]
        holds = c.pdu[2:4] == BROADCAST[3:5]
        if holds and not before:
            v.append(f"MISCLASSIFIED: verify on {a} says OK but the broadcast had not run")
        if not holds and before:
            v.append(f"MISCLASSIFIED: verify on {a} says NOT_EXECUTED but the broadcast ran")
        return v


def _bus_reboot(w: _World, a: int) -> None:
    assert isinstance(w, _BusWorld)
    w.reboots_left -= 1
    exe = w.exe[a]
    exe.epoch += 10
    exe.core.reset_volatile(w.now)
    w.dev[a] = w._boot(a)


#: What a bus of read-back-verified broadcasts cannot rule out, stated in docs/BUS.md: a copy of
#: a broadcast delivered again after the device rebooted runs again (its window lives for one
#: boot); set-only, it writes the value it wrote before.
BUS_RESIDUAL = {"BROADCAST-ACROSS-REBOOT"}


def explore_bus(depth: int, reboots: int = 1) -> Exploration:
    """Every schedule with at most ``depth`` faults (a reboot of either device counts as one; at
    most ``reboots``) on a two-device bus: HELLOs, a write to device 1 and a trigger to device 2,
    one broadcast to both and the read-backs that verify it."""
    return _explore(_BusWorld(reboots), depth)
