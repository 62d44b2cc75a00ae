"""The soak campaign's judge: it trusts nothing of the code under test.

Contract: an ``Oracle`` is built from a register map *file's text* (TOML or JSON, read here with
``tomllib``/``json``: the kinds, limits, defaults, persistence and fault bits it declares) and the
device's trigger duration (which a boot record that declares its own replaces). It is fed, in
order, the device's own record of what happened — ``Boot(epoch, time[, trigger_duration])`` and
``Run(epoch, seq, request, response, time)`` records (the effects-file format of docs/SOAK.md) —
with ``delivery_record``, the line's own record of every unit it delivered each way —
``Delivered(to, time, unit)``, the link emulator's ``DeliveryLog``, decoded here by
``idemlink.oracle_wire`` (authenticated frames too: with ``authenticated``, a keyed host and
device, an answer without a MAC tag is never evidence, but for the unsigned EPOCH_MISMATCH hint
of a just-rebooted device) — the environment's changes (``set_input``, ``set_condition``,
``force_trigger``), and the host's results as *claims* (a command, every (epoch, seq) it travelled
under, what the host reported and when it settled). From these alone it judges:

- register semantics: it replays every execution through its own model of the map (decoding and
  encoding PDUs with its own few lines of ``struct``) and the device's answer must be the one the
  model gives — a read must show exactly the modelled values (holdings, generation, latched fault
  bits, trigger state), a trigger starts at most once per IDLE→RUNNING and finishes after its
  duration, a command register (``kind = "command"``) starts only while it reads 0, reads the
  command while it runs and 0 after the duration (a write while it runs starts nothing; above its
  ``max`` is exception 03), a W1C clear clears exactly the written bits whose condition has gone,
  the generation moves by one on an effective change and only then, a reboot keeps persistent
  holdings and resets the volatile state. Across a reboot the generation may jump (a device saves
  a reserved ceiling, not every generation, so that a volatile write costs no flash write, and
  boots at it): after a boot it is unknown until an answer shows it (a read of it, a conditional
  write's answer), and that value must not go back nor repeat one shown since an effective change
  (serial order modulo 2^16, within 2^15); it may equal the last one only when nothing changed
  since the previous boot (the same state, the same number). A wrong answer is
  ``register_semantics``; a holding register read back with another value than the acknowledged
  one is ``lost_acknowledged_writes``.
- accounting: every execution is claimed by exactly one result whose request is the one executed,
  wherever it lands (during its batch, during ``reconcile()``, or after its result was settled);
  a command runs at most once, except that a write touching only HOLDING registers (by the map's
  declarations, not by any host flag) may run once per boot epoch; with the line's record, the
  device ran only requests the line delivered to it under that (epoch, seq). Anything else is
  ``duplicated_effects``. ``reconcile()``'s read-backs are results like any other.
- outcomes: a reported outcome other than UNKNOWN must be what the executed answer means
  (exception 04: UNKNOWN, other exceptions: REJECTED, failed guard: NOT_EXECUTED, trigger codes
  0xFF00/0xFF01: UNKNOWN/REJECTED, else OK); an OK must carry the executed answer's values or
  code (big-endian, decoded here); NOT_EXECUTED/REJECTED must have no execution that took effect,
  also one that lands later. With the line's record an outcome also needs evidence
  (``ANSWER_NEEDED``): an OK — and a NOT_EXECUTED or REJECTED whose request went out — must match
  an answer the line delivered to the host under the result's (epoch, seq) *before* the result
  was settled, meaning that outcome (``oracle_wire.answer_outcome``: status byte, then the PDU),
  an OK with the values, code and replay flag it reports; an answer that arrived later, under
  another number or from another boot proves nothing. A ``reconcile()`` verdict must agree with
  the modelled state, judged per register kind: holding = the value, trigger 1 = RUNNING or DONE,
  trigger 0 = IDLE, fault = the written bits clear, command N = it reads N (0: nothing can be
  said, it ran and ended or never started); its evidence (``check_evidence``: "it ran" /
  "it never ran", from the request re-sent under its own number) must agree with the device's
  record of that number, and (``check_verdict_evidence``) rest on an answer the line delivered
  under one of its numbers during the reconciliation that says so — never on a read-back. These
  are ``misclassified``.

Alongside, it counts what the line showed (``Tally``): every answer delivered to the host by
status, those that came after their result (late copies; ANSWER_EVICTED and TOO_OLD answers to
requests delivered late), commands with an effect that ran with every answer lost, and commands
with an effect none of whose requests reached the device — so a campaign can show it reached
those situations.

Memory is bounded whatever the length of the run: claims (and their executions) for the last
``MAX_CLAIMS`` numbers, delivered requests for the last ``MAX_GIVEN``, a claim's delivered answers
only until it is judged, ``MAX_PROBLEMS`` problem texts.

The model can be given a timing tolerance for devices on a real clock: a trigger within
``tolerance`` of its finish may be either RUNNING or DONE, and the first answer decides.

Why one module of this size: the oracle is the campaign's independent second reading of the
protocol: it decodes PDUs and models the device by itself, on purpose importing neither the host's
decoders nor the device core (docs/ARCHITECTURE.md); besides the standard library it imports only
its own reading of the wire (``idemlink.oracle_wire``, which changes with the frame format), the
file parsers that name a too-long integer (``idemlink.protocol.long_integers``) and the errors'
base class (``IdemlinkError``) — no decoder, no table. Its parts
(the map, the record, the PDU reading, the model, the judge) change together whenever the
semantics they check do.
"""

from __future__ import annotations

import copy
import json
import math
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from idemlink.oracle_wire import (
    ANSWER_EVICTED,
    BROADCAST,
    EPOCH_MISMATCH,
    IDEMPOTENCY_CONFLICT,
    REPLAY,
    REQUEST,
    RESPONSE,
    SIGNED_FLAGS,
    STATUS_OK,
    answer_outcome,
    carried_status,
    pdu_outcome,
    read_frame,
    status_name,
)
from idemlink.protocol.long_integers import load_json, load_toml  # parsing only: no decoder
from idemlink.protocol.outcome import IdemlinkError  # the errors' base only: no table

# ------------------------------------------------------------------------------- the map file

KINDS = ("input", "holding", "fault", "trigger", "generation", "command")
IDLE, RUNNING, DONE = 0, 1, 2
CODE_ACCEPTED, CODE_RUNNING, CODE_DONE = 0x0000, 0x0101, 0x0102
CODE_ABNORMAL, CODE_ILLEGAL = 0xFF00, 0xFF01
EXC_ADDRESS, EXC_VALUE, EXC_FAILURE = 0x02, 0x03, 0x04
FC_READ_HOLDING, FC_READ_INPUT, FC_WRITE_ONE, FC_WRITE_MANY = 0x03, 0x04, 0x06, 0x10
FC_WRITE_IF_GENERATION, FC_TRIGGER = 0x41, 0x42
GUARD_FAILED = 0x12
MAX_READ, MAX_WRITE = 125, 123


class OracleError(IdemlinkError, ValueError):
    """A map file or an effects record the oracle cannot read."""


@dataclass(frozen=True, slots=True)
class Reg:
    address: int
    name: str
    kind: str
    minimum: int = 0
    maximum: int = 0xFFFF
    default: int = 0
    persist: bool = True
    mask: int = 0  #: fault: the declared bits


@dataclass(frozen=True, slots=True)
class MapTruth:
    """The registers a map file declares, by address."""

    registers: Mapping[int, Reg]
    bits: Mapping[str, tuple[int, int]]  #: fault bit name -> (fault register address, bit)

    @classmethod
    def parse(cls, text: str, *, fmt: str = "toml") -> MapTruth:
        try:
            raw = load_json(text) if fmt == "json" else load_toml(text)
        except ValueError as exc:
            raise OracleError(f"unreadable map file: {exc}") from None
        regs: dict[int, Reg] = {}
        bits: dict[str, tuple[int, int]] = {}
        for r in raw.get("registers", []):
            kind = str(r.get("kind", ""))
            if kind not in KINDS:
                raise OracleError(f"register {r.get('name')!r}: kind {kind!r}")
            mask = 0
            for b in r.get("bits", []):
                mask |= 1 << int(b["bit"])
                bits[str(b["name"])] = (int(r["address"]), int(b["bit"]))
            regs[int(r["address"])] = Reg(int(r["address"]), str(r["name"]), kind,
                                          int(r.get("min", 0)), int(r.get("max", 0xFFFF)),
                                          int(r.get("default", 0)), bool(r.get("persist", True)),
                                          mask)
        if [g.kind for g in regs.values()].count("generation") != 1:
            raise OracleError("a map declares exactly one generation register")
        return cls(regs, bits)

    def named(self, name: str) -> Reg:
        for r in self.registers.values():
            if r.name == name:
                return r
        raise OracleError(f"no register named {name!r}")

    def of_kind(self, kind: str) -> list[Reg]:
        return [r for r in self.registers.values() if r.kind == kind]



# ----------------------------------------------------------------------- the device's record


@dataclass(frozen=True, slots=True)
class Boot:
    epoch: int
    time: float
    trigger_duration: float | None = None
    """seconds a trigger stays RUNNING in this boot, when the device declares it"""


@dataclass(frozen=True, slots=True)
class Run:
    epoch: int
    seq: int
    request: bytes
    response: bytes
    time: float


@dataclass(frozen=True, slots=True)
class Delivered:
    """A unit the line delivered (the link emulator's delivery record, never either end's word):
    to ``"device"`` or to ``"host"``, at ``time`` on the host's clock, the bytes between two
    frame delimiters. The oracle decodes it itself (``idemlink.oracle_wire``)."""

    to: str
    time: float
    unit: bytes


@dataclass(frozen=True, slots=True)
class Condition:
    """The environment's record (the campaign's own word, never the device's): from ``time`` (the
    host's clock) the external fault conditions of the FAULT register at ``address`` are exactly
    ``bits`` — each set bit a declared fault bit whose condition holds. Fed in order with the
    device's record: executions fed before it ran under the old conditions, those after under
    these."""

    address: int
    bits: int
    time: float


Effect = Boot | Run
"""A line of the device's effects file."""
Record = Effect | Delivered | Condition


def parse_effects_line(line: str) -> Effect:
    """One line of an effects file (docs/SOAK.md): ``{"boot": epoch, "time": t}`` (optionally
    with ``"trigger_duration": seconds``) or ``{"epoch", "seq", "request": hex, "response": hex,
    "time"}``."""
    try:
        d = load_json(line)
        if "boot" in d:
            duration = d.get("trigger_duration")
            if duration is not None:
                duration = float(duration)
                if not (math.isfinite(duration) and duration >= 0):
                    raise ValueError(f"trigger_duration {duration} is not a duration")
            return Boot(int(d["boot"]), float(d.get("time", 0.0)), duration)
        return Run(int(d["epoch"]), int(d["seq"]), bytes.fromhex(d["request"]),
                   bytes.fromhex(d["response"]), float(d["time"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise OracleError(f"effects line {line[:80]!r}: {exc}") from None


def effects_line(record: Effect) -> str:
    """The effects-file line of a record (no newline)."""
    if isinstance(record, Boot):
        if record.trigger_duration is None:
            return json.dumps({"boot": record.epoch, "time": record.time})
        return json.dumps({"boot": record.epoch, "time": record.time,
                           "trigger_duration": record.trigger_duration})
    return json.dumps({"epoch": record.epoch, "seq": record.seq,
                       "request": record.request.hex(), "response": record.response.hex(),
                       "time": record.time})


# ----------------------------------------------------------------------------- PDU reading


def _exception(fc: int, code: int) -> bytes:
    return bytes([(fc | 0x80) & 0xFF, code])


truth_outcome = pdu_outcome
"""The outcome (by name) an executed answer means, read from its bytes alone."""


def answer_values(request: bytes, response: bytes) -> tuple[tuple[int, ...], int | None]:
    """(read values, code) an answer carries: code is the trigger code or the generation after
    a conditional write. Big-endian, decoded here."""
    if not response or response[0] & 0x80:
        return (), None
    fc = request[0]
    if fc in (FC_READ_HOLDING, FC_READ_INPUT):
        n = int.from_bytes(request[3:5], "big")
        if len(response) != 2 + 2 * n or response[1] != 2 * n:
            return (), None
        return struct.unpack_from(f">{n}H", response, 2), None
    if fc == FC_TRIGGER and len(response) >= 5:
        return (), int.from_bytes(response[3:5], "big")
    if fc == FC_WRITE_IF_GENERATION and len(response) >= 4:
        return (), int.from_bytes(response[2:4], "big")
    return (), None


@dataclass(frozen=True, slots=True)
class Decoded:
    fc: int
    address: int
    values: tuple[int, ...] = ()
    count: int = 0
    generation: int = 0


def decode_request(pdu: bytes) -> Decoded | None:
    """The requests a soak sends; anything else is None (the model then expects an exception)."""
    if not pdu:
        return None
    fc = pdu[0]
    try:
        if fc in (FC_READ_HOLDING, FC_READ_INPUT) and len(pdu) == 5:
            a, n = struct.unpack_from(">HH", pdu, 1)
            return Decoded(fc, a, count=n)
        if fc in (FC_WRITE_ONE, FC_TRIGGER) and len(pdu) == 5:
            a, v = struct.unpack_from(">HH", pdu, 1)
            return Decoded(fc, a, (v,))
        if fc == FC_WRITE_MANY and len(pdu) >= 6:
            a, n, nb = struct.unpack_from(">HHB", pdu, 1)
            if nb == 2 * n == len(pdu) - 6 and 1 <= n <= MAX_WRITE:
                return Decoded(fc, a, struct.unpack_from(f">{n}H", pdu, 6))
        if fc == FC_WRITE_IF_GENERATION and len(pdu) >= 8:
            g, a, n, nb = struct.unpack_from(">HHHB", pdu, 1)
            if nb == 2 * n == len(pdu) - 8 and 1 <= n <= MAX_WRITE:
                return Decoded(fc, a, struct.unpack_from(f">{n}H", pdu, 8), generation=g)
    except struct.error:
        return None
    return None


# --------------------------------------------------------------------------------- the model

#: The trigger semantics the map format declares ("1 starts once, 0 resets"): (state, value) ->
#: (next state, starts the action, answer code).
TRIGGER_RULES: dict[tuple[int, int], tuple[int, bool, int]] = {
    (IDLE, 1): (RUNNING, True, CODE_ACCEPTED),
    (RUNNING, 1): (RUNNING, False, CODE_RUNNING),
    (DONE, 1): (DONE, False, CODE_DONE),
    (IDLE, 0): (IDLE, False, CODE_ACCEPTED),
    (RUNNING, 0): (IDLE, False, CODE_ACCEPTED),
    (DONE, 0): (IDLE, False, CODE_ACCEPTED),
}

Conditions = Callable[[Mapping[str, int]], Mapping[str, int]]
"""Fault conditions the environment knows: register values by name -> condition bits by fault
register name (e.g. over-temperature: temperature > threshold)."""


class _Refused(IdemlinkError):
    def __init__(self, code: int) -> None:
        super().__init__(f"refused with exception {code}")
        self.code = code


@dataclass(slots=True)
class Model:
    """The state a device of this map must be in, replayed from its own record."""

    regs: MapTruth
    duration: float
    conditions: Conditions | None = None
    values: dict[int, int] = field(default_factory=dict)  #: inputs, holdings, generation
    latched: dict[int, int] = field(default_factory=dict)
    external: dict[int, int] = field(default_factory=dict)
    trigger: dict[int, int] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    command: dict[int, int] = field(default_factory=dict)  #: 0, or the command that runs
    command_started: dict[int, float] = field(default_factory=dict)
    gen_addr: int = 0
    #: since a boot, until an answer shows it: (floor, strict) — the generation is at least
    #: ``floor`` (more than it, when ``strict``); None: known (``values[gen_addr]``)
    gen_unknown: tuple[int, bool] | None = None
    changed: bool = False  #: an effective change since the last boot
    latches: int = 0  #: fault bits latched (a bit going from clear to latched), boots included
    clears: int = 0  #: latched fault bits a W1C clear cleared (their condition had gone)
    clears_held: int = 0  #: latched fault bits a W1C clear left latched (their condition held)

    @classmethod
    def fresh(cls, regs: MapTruth, duration: float, conditions: Conditions | None) -> Model:
        m = cls(regs, duration, conditions)
        for r in regs.registers.values():
            if r.kind in ("input", "holding"):
                m.values[r.address] = r.default
            elif r.kind == "generation":
                m.values[r.address] = 0
                m.gen_addr = r.address
            elif r.kind == "fault":
                m.latched[r.address] = m.external[r.address] = 0
            elif r.kind == "command":
                m.command[r.address] = 0
            else:
                m.trigger[r.address] = IDLE
        m.latch()
        return m

    # -- state ------------------------------------------------------------------------------
    def read_one(self, r: Reg) -> int:
        if r.kind == "fault":
            return self.latched[r.address]
        if r.kind == "trigger":
            return self.trigger[r.address]
        if r.kind == "command":
            return self.command[r.address]
        return self.values[r.address]

    def names(self) -> dict[str, int]:
        return {r.name: self.read_one(r) for r in self.regs.registers.values()}

    def cond(self, address: int) -> int:
        bits = self.external.get(address, 0)
        if self.conditions is not None:
            bits |= self.conditions(self.names()).get(self.regs.registers[address].name, 0)
        return bits

    def latch(self) -> None:
        for a in self.latched:
            new = self.cond(a) & ~self.latched[a]
            if new:
                self.latches += bin(new).count("1")
                self.latched[a] |= new

    def finish_due(self, now: float, tolerance: float) -> list[int]:
        """Finish triggers and commands whose duration has surely elapsed; the addresses still
        ambiguous (``finish`` each in a candidate model)."""
        ambiguous = []
        for a, s in [*self.started.items(), *self.command_started.items()]:
            if a in self.trigger and self.trigger[a] != RUNNING:
                continue
            if now >= s + self.duration + tolerance:
                self.finish(a)
            elif tolerance and now >= s + self.duration - tolerance:
                ambiguous.append(a)
        return ambiguous

    def finish(self, address: int) -> None:
        """The action of the trigger (DONE) or command register (it reads 0) at ``address``
        completed."""
        if address in self.command:
            self.command[address] = 0
            self.command_started.pop(address, None)
        else:
            self.trigger[address] = DONE
            self.started.pop(address, None)

    def boot(self) -> None:
        for a in self.trigger:
            self.trigger[a] = IDLE
        self.started.clear()
        for a in self.command:  # a reboot loses a running command
            self.command[a] = 0
        self.command_started.clear()
        for a in self.latched:
            self.latched[a] = 0
        for r in self.regs.of_kind("holding"):
            if not r.persist:
                self.values[r.address] = r.default
        if self.gen_unknown is None:
            self.gen_unknown = (self.values[self.gen_addr], self.changed)
        else:
            self.gen_unknown = (self.gen_unknown[0], self.gen_unknown[1] or self.changed)
        self.changed = False
        self.latch()

    def bump(self) -> None:
        self.values[self.gen_addr] = (self.values[self.gen_addr] + 1) & 0xFFFF
        self.changed = True
        if self.gen_unknown is not None:  # whatever it is, it moved by one
            self.gen_unknown = ((self.gen_unknown[0] + 1) & 0xFFFF, self.gen_unknown[1])

    def learn_generation(self, request: bytes, response: bytes) -> str | None:
        """After a boot, the generation the device shows in this answer (before the request
        acts on it), if it shows one: adopted; a problem text when it goes back or repeats."""
        if self.gen_unknown is None or not response or response[0] & 0x80:
            return None
        d = decode_request(request)
        if d is None:
            return None
        seen = None
        if d.fc in (FC_READ_HOLDING, FC_READ_INPUT) and d.address <= self.gen_addr < (
                d.address + d.count):
            got, _ = answer_values(request, response)
            if got:
                seen = got[self.gen_addr - d.address]
        elif d.fc == FC_WRITE_IF_GENERATION and len(response) >= 4:
            # a failed guard shows the generation; a passed one proves it was the guard's
            seen = (int.from_bytes(response[2:4], "big") if response[1] == GUARD_FAILED
                    else d.generation)
        if seen is None:
            return None
        return self.settle_generation(seen)

    def settle_generation(self, seen: int) -> str | None:
        """The generation, unknown since a boot, seen to be ``seen``: adopted; a problem text
        when it goes back or repeats."""
        if self.gen_unknown is None:
            return None
        floor, strict = self.gen_unknown
        self.gen_unknown = None
        self.values[self.gen_addr] = seen
        ahead = (seen - floor) & 0xFFFF
        if ahead >= 0x8000 or (strict and ahead == 0):
            return (f"generation {seen} after a reboot {'repeats' if ahead == 0 else 'goes back'}"
                    f": it must be {'above' if strict else 'at least'} {floor}")
        return None

    # -- requests ---------------------------------------------------------------------------
    def execute(self, request: bytes, now: float) -> bytes:
        """The answer this map's semantics give, applying the request's effect."""
        self.latch()
        d = decode_request(request)
        fc = request[0] if request else 0
        if d is None:
            return _exception(fc, EXC_VALUE)
        try:
            if d.fc in (FC_READ_HOLDING, FC_READ_INPUT):
                return self._read(d)
            if d.fc == FC_TRIGGER:
                return self._trigger_request(d, now)
            return self._write(d, now)
        except _Refused as r:
            return _exception(fc, r.code)

    def _read(self, d: Decoded) -> bytes:
        if not 1 <= d.count <= MAX_READ:
            raise _Refused(EXC_VALUE)
        out = []
        for a in range(d.address, d.address + d.count):
            r = self.regs.registers.get(a)
            if r is None:
                raise _Refused(EXC_ADDRESS)
            out.append(self.read_one(r))
        return struct.pack(f">BB{len(out)}H", d.fc, 2 * len(out), *out)

    def _plan(self, d: Decoded, holdings_only: bool) -> list[tuple[Reg, int]]:
        if d.address + len(d.values) > 0x10000:
            raise _Refused(EXC_ADDRESS)
        regs = []
        for a in range(d.address, d.address + len(d.values)):
            r = self.regs.registers.get(a)
            if r is None or r.kind in ("input", "generation") or (
                    holdings_only and r.kind != "holding"):
                raise _Refused(EXC_ADDRESS)
            regs.append(r)
        plan = list(zip(regs, d.values, strict=True))
        for r, v in plan:
            if (r.kind == "holding" and not r.minimum <= v <= r.maximum) or (
                    r.kind == "fault" and v & ~r.mask) or (r.kind == "trigger" and v not in (0, 1)
                                                           ) or (r.kind == "command"
                                                                 and v > r.maximum):
                raise _Refused(EXC_VALUE)
        for r, _ in plan:
            if r.kind == "trigger" and self.trigger[r.address] not in (IDLE, RUNNING, DONE):
                raise _Refused(EXC_FAILURE)
        return plan

    def _apply(self, plan: list[tuple[Reg, int]], now: float) -> None:
        changed = False
        for r, v in plan:
            if r.kind == "holding" and self.values[r.address] != v:
                self.values[r.address] = v
                changed = True
        if changed:
            self.bump()
        for r, v in plan:
            if r.kind == "trigger":
                self._step(r.address, v, now)
        for r, v in plan:  # a command starts only from 0; while one runs a write starts nothing
            if r.kind == "command" and v and not self.command[r.address]:
                self.command[r.address] = v
                self.command_started[r.address] = now
        for r, v in plan:
            if r.kind == "fault":
                cond = self.cond(r.address)
                self.clears += bin(self.latched[r.address] & v & ~cond).count("1")
                self.clears_held += bin(self.latched[r.address] & v & cond).count("1")
                self.latched[r.address] &= ~(v & ~cond)
        self.latch()

    def _step(self, address: int, value: int, now: float) -> int:
        nxt, starts, code = TRIGGER_RULES[(self.trigger[address], value)]
        self.trigger[address] = nxt
        if starts:
            self.started[address] = now
        elif nxt != RUNNING:
            self.started.pop(address, None)
        return code

    def _write(self, d: Decoded, now: float) -> bytes:
        guarded = d.fc == FC_WRITE_IF_GENERATION
        plan = self._plan(d, holdings_only=guarded)
        if guarded:
            if d.generation != self.values[self.gen_addr]:
                return struct.pack(">BBH", d.fc, GUARD_FAILED, self.values[self.gen_addr])
            self._apply(plan, now)
            return struct.pack(">BBH", d.fc, 0, self.values[self.gen_addr])
        self._apply(plan, now)
        if d.fc == FC_WRITE_ONE:
            return struct.pack(">BHH", d.fc, d.address, d.values[0])
        return struct.pack(">BHH", d.fc, d.address, len(d.values))

    def _trigger_request(self, d: Decoded, now: float) -> bytes:
        r = self.regs.registers.get(d.address)
        if r is None or r.kind != "trigger":
            raise _Refused(EXC_ADDRESS)
        value = d.values[0]
        if value not in (0, 1):
            code = CODE_ILLEGAL
        elif self.trigger[d.address] not in (IDLE, RUNNING, DONE):
            code = CODE_ABNORMAL
        else:
            code = self._step(d.address, value, now)
            self.latch()
        return struct.pack(">BHH", d.fc, d.address, code)

    # -- intent -----------------------------------------------------------------------------
    def snapshot(self) -> dict[int, int]:
        """Every register's value now, by address."""
        return {a: self.read_one(r) for a, r in self.regs.registers.items()}

    def intent_holds(self, request: bytes, state: Mapping[int, int] | None = None) -> bool | None:
        """Does the state a write intended hold (per register kind) — now, or in ``state``
        (values by address)? None: a read."""
        d = decode_request(request)
        if d is None or d.fc in (FC_READ_HOLDING, FC_READ_INPUT):
            return None
        for i, v in enumerate(d.values):
            r = self.regs.registers.get(d.address + i)
            if r is None or r.kind in ("input", "generation"):
                return False
            now = self.read_one(r) if state is None else state[r.address]
            if r.kind == "holding" and now != v:
                return False
            if r.kind == "fault" and now & v:
                return False
            if r.kind == "trigger" and not ((v == 1 and now in (RUNNING, DONE))
                                            or (v == 0 and now == IDLE)):
                return False
            if r.kind == "command" and v and now != v:
                return None  # 0: it ran and ended, or never started; another: not this one
        return True


# ------------------------------------------------------------------------------- the judge


@dataclass(slots=True)
class Tally:
    duplicated_effects: int = 0
    lost_acknowledged_writes: int = 0
    misclassified: int = 0
    register_semantics: int = 0
    executions: int = 0
    late_executions: int = 0  #: landed after their result was settled
    reissued_set_only: int = 0
    boots: int = 0
    conditions: int = 0  #: the environment's condition records fed
    answers: Counter[str] = field(default_factory=Counter)
    """every answer the line delivered to the host, by status (``REPLAYED``: status OK, replayed)"""
    late_answers: Counter[str] = field(default_factory=Counter)
    """those delivered after their result was settled (late copies, answers to late requests)"""
    ran_unanswered: int = 0
    """commands that may have an effect, ran, and had no answer delivered before their result"""
    never_delivered: int = 0
    """commands that may have an effect, sent, none of whose requests reached the device before
    their result"""
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.duplicated_effects or self.lost_acknowledged_writes or self.misclassified
                    or self.register_semantics)


@dataclass(frozen=True, slots=True)
class Claim:
    """What the host says it sent: the request PDU and every (epoch, seq) it went under, with
    the outcome it reported (None: the process died before it could report)."""

    request: bytes
    sent_as: tuple[tuple[int, int], ...]
    outcome: str | None
    final: tuple[int, int] = (0, 0)  #: the (epoch, seq) whose answer the result carries
    values: tuple[int, ...] = ()
    code: int | None = None
    readback: bool = False  #: a ``reconcile()`` read-back: its state is what the verdict saw
    replay: bool = False  #: the result says its answer was a replay
    at: float | None = None  #: when the result was settled (the host's clock; None: unknown)
    status: int | None = None
    """the device status the result cites (a wire code: OK, GUARD_FAILED, ANSWER_EVICTED...);
    None: none, or one the host concluded itself (NO_ANSWER...)"""


@dataclass(slots=True)
class Claimed:
    """A claim as the oracle tracks it: the executions of its request so far."""

    claim: Claim
    runs: list[tuple[tuple[int, int], str, bytes]] = field(default_factory=list)
    """(epoch, seq), truth, response of every execution of its request"""
    answers: list[Answer] = field(default_factory=list)
    """the answers the line delivered to the host under its keys, until it is judged"""
    first_request: float | None = None
    """when the line first delivered one of its requests to the device"""
    judged: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer the line delivered to the host (decoded by ``idemlink.oracle_wire``)."""

    key: tuple[int, int]  #: the (epoch, seq) of the request it answers
    time: float
    status: int
    pdu: bytes
    replay: bool


#: What a reported outcome needs from the line's delivery record: an answer delivered to the
#: host under the result's (epoch, seq) before the result was settled, meaning that outcome (an
#: OK also carrying the reported values, code and replay flag) — ``always``, ``if sent`` (when
#: the request went out at all; never sent, nothing can answer), or ``never`` (UNKNOWN claims
#: nothing). Whatever the outcome, a device status the result cites (``Claim.status``) must have
#: been carried by such an answer. The device's record adds its own rules (``Oracle.judge``).
ANSWER_NEEDED: dict[str, str] = {
    "OK": "always",
    "NOT_EXECUTED": "if sent",
    "REJECTED": "if sent",
    "UNKNOWN": "never",
}


BROADCAST_EPOCH = 0
"""The epoch field of a broadcast: a device records its executions under it with the broadcast
number (no boot has epoch 0), and the frame carries it."""
MAX_CLAIMS = 200_000
"""Claims kept for executions still to come (a frame delayed by more is taken as unclaimed)."""
MAX_GIVEN = 16_384
"""Requests delivered to the device kept until their execution is fed (the record of one
exchange, with room to spare)."""
MAX_LATE_HEARD = 16
"""Answers kept per number after its claim was judged (for a re-send of it to cite)."""
MAX_PROBLEMS = 200
EFFECTFUL = frozenset({FC_WRITE_ONE, FC_WRITE_MANY, FC_WRITE_IF_GENERATION, FC_TRIGGER})
"""Function codes that may change the device's state."""


class Oracle:
    """See the module docstring."""

    def __init__(self, map_text: str, *, trigger_duration: float, fmt: str = "toml",
                 conditions: Conditions | None = None, tolerance: float = 0.0,
                 delivery_record: bool = False, address: int | None = None,
                 authenticated: bool = False) -> None:
        self.regs = MapTruth.parse(map_text, fmt=fmt)
        #: a keyed host and device (issue 23): an answer without a MAC tag is no evidence of an
        #: outcome — a keyed host takes only signed answers — but for the EPOCH_MISMATCH hint a
        #: rebooted device cannot sign (it never decides an outcome but UNKNOWN)
        self.authenticated = authenticated
        self.model = Model.fresh(self.regs, trigger_duration, conditions)
        self.tolerance = tolerance
        #: the line's delivery record is fed (``Delivered``): outcomes need its evidence
        self.delivery_record = delivery_record
        #: the device's bus address: on a shared line, frames addressed to another device are
        #: not this device's (its requests: its address or broadcast; its answers: its address)
        self.address = address
        #: broadcast numbers this device ran in its current boot (at most once each)
        self._broadcast_ran: OrderedDict[int, None] = OrderedDict()
        self.tally = Tally()
        self.epoch: int | None = None
        self.acked: set[int] = set()
        self._claims: OrderedDict[tuple[int, int], Claimed] = OrderedDict()
        self._executed: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._given: OrderedDict[tuple[int, int], set[bytes]] = OrderedDict()
        self._late_heard: OrderedDict[tuple[int, int], list[Answer]] = OrderedDict()
        self._readbacks: list[tuple[range, dict[int, int]]] = []

    # -- problems ---------------------------------------------------------------------------
    def problem(self, counter: str, text: str) -> None:
        setattr(self.tally, counter, getattr(self.tally, counter) + 1)
        if len(self.tally.problems) < MAX_PROBLEMS:
            self.tally.problems.append(text)

    # -- the environment --------------------------------------------------------------------
    def set_input(self, name: str, value: int, now: float | None) -> None:
        """The environment changed an input at ``now`` on the device's clock (None: a device on
        another clock — nothing finishes by it)."""
        if now is not None:
            self.model.finish_due(now, 0.0)
        self.model.values[self.regs.named(name).address] = value
        self.model.latch()

    def set_condition(self, bit_name: str, active: bool, now: float) -> None:
        address, bit = self.regs.bits[bit_name]
        old = self.model.external[address]
        self.model.external[address] = old | (1 << bit) if active else old & ~(1 << bit)
        self.model.latch()

    def _condition(self, c: Condition) -> None:
        """The environment's record: the fault word's external conditions are now ``c.bits``."""
        r = self.regs.registers.get(c.address)
        if r is None or r.kind != "fault" or c.bits & ~r.mask:
            raise OracleError(f"condition {c.address} {c.bits}: not declared fault bits of a "
                              "fault register")
        self.tally.conditions += 1
        self.model.external[c.address] = c.bits
        self.model.latch()

    def force_trigger(self, name: str, raw: int, now: float) -> None:
        a = self.regs.named(name).address
        self.model.finish_due(now, 0.0)
        self.model.trigger[a] = raw
        if raw == RUNNING:
            self.model.started[a] = now
        else:
            self.model.started.pop(a, None)

    # -- claims -----------------------------------------------------------------------------
    def claim(self, c: Claim) -> Claimed:
        """A result (or a dead process's request): its keys now belong to it. The handle is
        what ``judge`` takes once the result's batch was fed."""
        entry = Claimed(c)
        for key in set(c.sent_as):
            if key in self._claims and self._claims[key].claim is not c:
                self.problem("duplicated_effects", f"{key[0]:08x}:{key[1]} claimed by two "
                              f"results: {self._claims[key].claim.request.hex()} and "
                              f"{c.request.hex()}")
            self._claims[key] = entry
            self._claims.move_to_end(key)
        while len(self._claims) > MAX_CLAIMS:
            self._claims.popitem(last=False)
        return entry

    def check_reconcile(self, request: bytes, verdict: bool | None,
                        observed: Mapping[str, int]) -> None:
        """``reconcile()`` said ``verdict`` for a command of PDU ``request``, having read
        ``observed``: both are checked against the device's state when its read-back ran (a
        trigger may finish, a reboot may reset it, after the read)."""
        d = decode_request(request)
        state = None
        readbacks, self._readbacks = self._readbacks, []
        for span, snap in reversed(readbacks):
            if d is not None and d.address in span:
                state = snap
                break
        if state is None:
            state = self.model.snapshot()
        names = {self.regs.registers[a].name: v for a, v in state.items()}
        truth = self.model.intent_holds(request, state)
        if verdict is not None and truth is not None and verdict is not truth:
            self.problem("misclassified", f"reconcile said the intended state "
                         f"{'holds' if verdict else 'does not hold'} for {request.hex()}, "
                         f"the device held {names}")
        held = {n: self._held_when_read(n, readbacks, state) for n in observed if n in names}
        wrong = {n: v for n, v in observed.items() if n in held and held[n] != v
                 and not self._finished_since(n, v, held[n])}
        if verdict is not None and wrong:
            self.problem("misclassified", f"reconcile read {wrong}, device held "
                         f"{ {n: held[n] for n in wrong} }")

    def check_evidence(self, key: tuple[int, int], request: bytes, executed: bool | None) -> None:
        """``reconcile()`` said, from the device's answer to ``request`` re-sent under ``key``,
        that it ran (True) or never ran (False): the device's record must agree by now."""
        if executed is None:
            return
        entry = self._claims.get(key)
        ran = key in self._executed and (entry is None or any(
            run_key == key for run_key, _, _ in entry.runs))
        if executed and not ran:
            self.problem("misclassified", f"reconcile() said {request.hex()} ran under "
                         f"{key[0]:08x}:{key[1]}; the device never ran it")
        elif not executed and ran:
            self.problem("misclassified", f"reconcile() said {request.hex()} never ran under "
                         f"{key[0]:08x}:{key[1]}; the device ran it")

    def check_verdict_evidence(self, keys: Iterable[tuple[int, int]], request: bytes,
                               executed: bool | None, unread_after: float | None,
                               at: float | None) -> None:
        """``reconcile()`` said ``executed`` (True: it ran, False: it never ran) for ``request``,
        sent under ``keys``: with the line's record, that verdict needs the device's word on the
        line — an answer delivered to the host under one of those numbers that it could read
        during the reconciliation (after ``unread_after``, when its last read before the
        reconciliation returned: an answer it had already read and dropped cannot answer the
        re-send; and before ``at``, the reconciliation's end) that proves it: status OK (a
        replayed or a first answer) or
        ANSWER_EVICTED for "ran", IDEMPOTENCY_CONFLICT for "never ran". No such answer (a re-send
        answered TOO_OLD, EPOCH_MISMATCH or nothing; no re-send at all, after a reboot): the
        verdict must stay None, whatever the read-back shows."""
        if executed is None or not self.delivery_record:
            return
        proving = (STATUS_OK, ANSWER_EVICTED) if executed else (IDEMPOTENCY_CONFLICT,)
        heard = [a for k in set(keys) for a in self._late_heard.get(k, ())
                 if (unread_after is None or a.time > unread_after)
                 and (at is None or a.time <= at)]
        if any(a.status in proving for a in heard):
            return
        said = ", ".join(sorted({status_name(a.status, a.replay) for a in heard})) or "nothing"
        self.problem("misclassified", f"reconcile() said {request.hex()} "
                     f"{'ran' if executed else 'never ran'} without the device's word on the "
                     f"line: the host was answered {said} under its numbers")

    def _held_when_read(self, name: str, readbacks: list[tuple[range, dict[int, int]]],
                        fallback: Mapping[int, int]) -> int:
        """A register's value when the last read-back covering it ran (the read-backs of one
        reconciliation run apart: another request may land between them)."""
        a = self.regs.named(name).address
        for span, snap in reversed(readbacks):
            if a in span:
                return snap[a]
        return fallback[a]

    def _finished_since(self, name: str, seen: int, now: int) -> bool:
        """On a real clock a trigger within the tolerance of its end may read either way."""
        return (bool(self.tolerance) and self.regs.named(name).kind == "trigger"
                and {seen, now} == {RUNNING, DONE})

    # -- the device's record ----------------------------------------------------------------
    def feed(self, records: Iterable[Record]) -> None:
        """The device's record and the line's, in order (a request's delivery before its
        execution; everything of an exchange before its results are judged)."""
        for r in records:
            if isinstance(r, Delivered):
                self._delivered(r)
            elif isinstance(r, Condition):
                self._condition(r)
            elif isinstance(r, Boot):
                self.tally.boots += 1
                self.epoch = r.epoch
                self._broadcast_ran.clear()  # its broadcast window lives for one boot
                self.model.finish_due(r.time, 0.0)
                self.model.boot()
                if r.trigger_duration is not None:  # the device's own word beats the soak's
                    self.model.duration = r.trigger_duration
            else:
                self._run(r)

    def _delivered(self, d: Delivered) -> None:
        """A unit the line delivered: a request reaching the device or an answer reaching the
        host is kept with the claim of its (epoch, seq) (an EPOCH_MISMATCH answer names the
        epoch of the request it refuses); anything a receiver drops is nothing."""
        f = read_frame(d.unit, SIGNED_FLAGS)
        if f is None or not self._mine(f.address, d.to):
            return
        if d.to == "device" and f.type == REQUEST:
            key = (f.epoch, f.seq)
            given = self._given.setdefault(key, set())
            given.add(f.payload)
            self._given.move_to_end(key)
            while len(self._given) > MAX_GIVEN:
                self._given.popitem(last=False)
            entry = self._claims.get(key)
            if entry is not None and entry.first_request is None:
                entry.first_request = d.time
        elif d.to == "host" and f.type == RESPONSE and f.payload:
            status, pdu = f.payload[0], f.payload[1:]
            key = (f.epoch, f.seq)
            if status == EPOCH_MISMATCH and len(pdu) >= 4:
                key = (int.from_bytes(pdu[:4], "little"), f.seq)
            name = status_name(status, bool(f.flags & REPLAY))
            if self.authenticated and f.tag is None and status != EPOCH_MISMATCH:
                self.tally.answers[f"unsigned {name}"] += 1  # refused by a keyed host
                return
            self.tally.answers[name] += 1
            answer = Answer(key, d.time, status, pdu, bool(f.flags & REPLAY))
            entry = self._claims.get(key)
            if entry is not None and not entry.judged:
                entry.answers.append(answer)
                return
            self.tally.late_answers[name] += 1
            self._heard_late(answer)

    def _mine(self, address: int | None, to: str) -> bool:
        """Is a frame with this address byte (None: unaddressed) this device's business? On a
        bus the device takes requests to its address and broadcasts; its answers carry its
        address. Off a bus (``self.address`` None) every frame on the line is."""
        if self.address is None or address is None:
            return True
        return address == self.address or (to == "device" and address == BROADCAST)

    def _heard_late(self, answer: Answer) -> None:
        """Keep an answer that came after its result, for a re-send of that number to cite."""
        late = self._late_heard.setdefault(answer.key, [])
        if len(late) < MAX_LATE_HEARD:
            late.append(answer)
        self._late_heard.move_to_end(answer.key)
        while len(self._late_heard) > MAX_GIVEN:
            self._late_heard.popitem(last=False)

    def _run(self, x: Run) -> None:
        if x.epoch == BROADCAST_EPOCH:
            self._broadcast_run(x)
            return
        self.tally.executions += 1
        if self.epoch is not None and x.epoch != self.epoch:
            self.problem("register_semantics", f"execution in epoch {x.epoch:08x} without a "
                          f"boot record (the device is in {self.epoch:08x})")
        self.epoch = x.epoch
        self._check_answer(x)
        key = (x.epoch, x.seq)
        if self.delivery_record and x.request not in self._given.get(key, ()):
            self.problem("duplicated_effects", f"{x.epoch:08x}:{x.seq} ran {x.request.hex()}, "
                         "which the line never delivered to the device")
        n = self._executed.get(key, 0) + 1
        self._executed[key] = n
        self._executed.move_to_end(key)
        while len(self._executed) > MAX_CLAIMS:
            self._executed.popitem(last=False)
        if n > 1:
            self.problem("duplicated_effects", f"ran twice under one seq {x.epoch:08x}:{x.seq}: "
                          f"{x.request.hex()}")
        entry = self._claims.get(key)
        if entry is None:
            self.problem("duplicated_effects", f"execution {x.epoch:08x}:{x.seq} claimed by "
                         f"0 results: {x.request.hex()}")
            return
        if entry.claim.request != x.request:
            self.problem("duplicated_effects", f"execution {x.epoch:08x}:{x.seq} ran "
                          f"{x.request.hex()}, its result sent {entry.claim.request.hex()}")
            return
        entry.runs.append((key, truth_outcome(x.request, x.response), x.response))
        d = decode_request(x.request)
        if entry.claim.readback and d is not None:
            self._readbacks.append((range(d.address, d.address + d.count),
                                    self.model.snapshot()))
        self._check_runs(entry)
        if entry.judged:
            self.tally.late_executions += 1
            self._check_no_effect(entry)

    def _broadcast_run(self, x: Run) -> None:
        """A broadcast the device ran (recorded under epoch 0 and its broadcast number): a
        set-only write of HOLDING registers by the map, delivered to the device, claimed by the
        broadcast's result, at most once per number in one boot."""
        self.tally.executions += 1
        self._check_answer(x)
        key = (x.epoch, x.seq)
        if self.delivery_record and x.request not in self._given.get(key, ()):
            self.problem("duplicated_effects", f"broadcast {x.seq} ran {x.request.hex()}, which "
                         "the line never delivered to the device")
        d = decode_request(x.request)
        if d is None or d.fc not in (FC_WRITE_ONE, FC_WRITE_MANY) or not self._idempotent(
                x.request):
            self.problem("duplicated_effects", f"broadcast {x.seq} ran {x.request.hex()}: not a "
                         "set-only write of holding registers")
        if x.seq in self._broadcast_ran:
            self.problem("duplicated_effects", f"broadcast {x.seq} ran twice in one boot: "
                         f"{x.request.hex()}")
        self._broadcast_ran[x.seq] = None
        while len(self._broadcast_ran) > MAX_CLAIMS:
            self._broadcast_ran.popitem(last=False)
        entry = self._claims.get(key)
        if entry is None or entry.claim.request != x.request:
            self.problem("duplicated_effects", f"broadcast {x.seq} ran {x.request.hex()}, "
                         f"claimed by {'another request' if entry else '0 results'}")
            return
        entry.runs.append((key, truth_outcome(x.request, x.response), x.response))
        if entry.judged:
            self.tally.late_executions += 1
            self._check_no_effect(entry)

    def _judge_broadcast(self, entry: Claimed) -> None:
        """A broadcast's outcome for this device (nobody answers one; ``Bus.verify`` reads each
        device back): UNKNOWN claims nothing; NOT_EXECUTED, that it never ran (``_check_no_effect``,
        later runs included); OK, that the values hold on the device now — they are then
        acknowledged."""
        c = entry.claim
        self._check_no_effect(entry)
        if c.outcome != "OK":
            return
        if self.model.intent_holds(c.request) is False:
            self.problem("misclassified", f"broadcast {c.final[1]} verified OK, the device holds "
                         f"{self.model.names()}: {c.request.hex()}")
        d = decode_request(c.request)
        for i in range(len(d.values) if d is not None else 0):
            r = self.regs.registers.get(d.address + i) if d is not None else None
            if r is not None and r.kind == "holding":
                self.acked.add(r.address)

    def _check_answer(self, x: Run) -> None:
        wrong = self.model.learn_generation(x.request, x.response)
        if wrong is not None:
            self.problem("register_semantics", f"{x.epoch:08x}:{x.seq} {wrong}")
        candidates = [self.model]
        for a in self.model.finish_due(x.time, self.tolerance):
            done = copy.deepcopy(self.model)
            done.finish(a)
            candidates.append(done)
        answers = []
        for m in candidates:
            answers.append(m.execute(x.request, x.time))
            if answers[-1] == x.response:
                self.model = m
                return
        self._report_answer(x, answers[0])

    def _report_answer(self, x: Run, want: bytes) -> None:
        """The device answered other than the map's semantics; resynchronise from a read."""
        d = decode_request(x.request)
        lost = []
        if d is not None and d.fc in (FC_READ_HOLDING, FC_READ_INPUT):
            got, _ = answer_values(x.request, x.response)
            for i, v in enumerate(got):
                r = self.regs.registers.get(d.address + i)
                if r is None or self.model.read_one(r) == v:
                    continue
                if r.kind == "holding" and r.address in self.acked:
                    lost.append(f"{r.name}: acknowledged {self.model.read_one(r)}, device holds {v}")
                self._adopt(r, v)
        if lost:
            self.problem("lost_acknowledged_writes", "; ".join(lost))
        else:
            self.problem("register_semantics", f"{x.epoch:08x}:{x.seq} {x.request.hex()} "
                          f"answered {x.response.hex()}, the map's semantics say {want.hex()}")

    def _adopt(self, r: Reg, v: int) -> None:
        if r.kind == "fault":
            self.model.latched[r.address] = v
        elif r.kind == "trigger":
            self.model.trigger[r.address] = v
            if v != RUNNING:
                self.model.started.pop(r.address, None)
        elif r.kind == "command":
            self.model.command[r.address] = v
            if not v:
                self.model.command_started.pop(r.address, None)
        else:
            self.model.values[r.address] = v

    def _idempotent(self, request: bytes) -> bool:
        """Harmless to run once per boot epoch, by the map: a read, or an absolute write to
        HOLDING registers only."""
        d = decode_request(request)
        if d is None:
            return False
        if d.fc in (FC_READ_HOLDING, FC_READ_INPUT):
            return True
        if d.fc not in (FC_WRITE_ONE, FC_WRITE_MANY):
            return False
        return all((r := self.regs.registers.get(d.address + i)) is not None
                   and r.kind == "holding" for i in range(len(d.values)))

    def _check_runs(self, entry: Claimed) -> None:
        runs = entry.runs
        if len(runs) < 2:
            return
        req = entry.claim.request.hex()
        if not self._idempotent(entry.claim.request):
            self.problem("duplicated_effects", f"ran {len(runs)} times, not idempotent by the "
                          f"map: {req}")
        elif len({k[0] for k, _, _ in runs}) < len(runs):
            self.problem("duplicated_effects", f"set-only ran twice in one epoch: {req}")
        else:
            self.tally.reissued_set_only += 1

    def _check_no_effect(self, entry: Claimed) -> None:
        c = entry.claim
        if c.outcome in ("NOT_EXECUTED", "REJECTED") and any(
                t in ("OK", "UNKNOWN") for _, t, _ in entry.runs):
            self.problem("misclassified", f"{c.outcome} but it ran with effect: "
                          f"{c.request.hex()} -> {entry.runs[-1][2].hex()}")

    # -- results ----------------------------------------------------------------------------
    def judge(self, entry: Claimed) -> None:
        """After the executions and deliveries of its batch were fed: the result's outcome
        against the device's record and (``delivery_record``) the line's."""
        c = entry.claim
        entry.judged = True
        answers, entry.answers = entry.answers, []  # judged once: memory stays flat
        if c.outcome in (None, "UNKNOWN"):  # may be re-sent: what the re-send may cite
            for a in answers:
                self._heard_late(a)
        if c.outcome is None:
            return
        if c.final[0] == BROADCAST_EPOCH and c.sent_as:
            self._judge_broadcast(entry)
            return
        self._check_no_effect(entry)
        if self.delivery_record:
            self._check_answers(entry, answers)
        final = [(t, resp) for k, t, resp in entry.runs if k == c.final]
        if final and c.outcome != "UNKNOWN":
            truth, resp = final[-1]
            if truth != c.outcome:
                self.problem("misclassified", f"reported {c.outcome}, device answered {truth} "
                              f"({resp.hex()}): {c.request.hex()}")
        if c.outcome != "OK":
            return
        if len(final) != 1:
            self.problem("misclassified", f"OK without exactly one execution: {c.request.hex()}")
            return
        values, code = answer_values(c.request, final[0][1])
        is_read = c.request[:1] in (bytes([FC_READ_HOLDING]), bytes([FC_READ_INPUT]))
        if is_read and c.values != values:
            self.problem("misclassified", f"read {c.values}, device answered {values}: "
                         f"{c.request.hex()}")
        if (c.values, c.code) != (values, code):
            self.problem("misclassified", f"OK with another answer than the execution's: "
                          f"{c.request.hex()} carried {c.values}/{c.code}, ran {final[0][1].hex()}")
        d = decode_request(c.request)
        if d is not None and d.fc in (FC_WRITE_ONE, FC_WRITE_MANY, FC_WRITE_IF_GENERATION):
            for i in range(len(d.values)):
                r = self.regs.registers.get(d.address + i)
                if r is not None and r.kind == "holding":
                    self.acked.add(r.address)

    def _check_answers(self, entry: Claimed, answers: list[Answer]) -> None:
        """``ANSWER_NEEDED``: the outcome against the answers the line delivered to the host
        before the result; and the situations the campaign means to reach, counted."""
        c = entry.claim
        heard = [a for a in answers if c.at is None or a.time <= c.at]
        if c.request[:1] and c.request[0] in EFFECTFUL and c.sent_as:
            if entry.first_request is None or (c.at is not None and entry.first_request > c.at):
                self.tally.never_delivered += 1
            elif entry.runs and not heard:
                self.tally.ran_unanswered += 1
        self._check_heard(c, heard)

    def judge_resend(self, c: Claim) -> None:
        """``reconcile()`` asked the device whether a request ran by sending it again under its
        own last number (``c.final``, already claimed and judged with the request): the result
        of that re-send needs the same evidence as any (``ANSWER_NEEDED``, and the status it
        cites), from the answers delivered under that number before this result. An answer that
        came before the re-send went out counts, even one that came before the request's own
        (UNKNOWN) result: it may have waited unread in the host's input (every answer of an
        outage's end arriving just after the host gave up; a dead process's held frame answered
        just after the new one's HELLO), and it is the device's word about that number all the
        same."""
        late = self._late_heard.pop(c.final, [])
        self._check_heard(c, [a for a in late if c.at is None or a.time <= c.at])

    def _check_heard(self, c: Claim, heard: list[Answer]) -> None:
        """Claim ``c`` against the answers ``heard`` (delivered to the host before its result):
        its outcome needs one that means it (``ANSWER_NEEDED``), and a device status it cites
        (ANSWER_EVICTED, IDEMPOTENCY_CONFLICT, TOO_OLD...) one that carries it."""
        assert c.outcome is not None
        need = ANSWER_NEEDED[c.outcome]
        if c.status is None and (need == "never" or (need == "if sent" and not c.sent_as)):
            return
        final = [a for a in heard if a.key == c.final]
        if any(self._backs(c, a) for a in final):
            return
        said = ", ".join(" ".join(filter(None, (status_name(a.status, a.replay), a.pdu.hex())))
                         for a in final)
        cites = f" ({status_name(c.status)})" if c.status else ""  # an OK cites no news
        self.problem("misclassified", f"{c.outcome}{cites} without an answer on the line that "
                     f"says so: {c.request.hex()} as {c.final[0]:08x}:{c.final[1]}, the host was "
                     f"answered {said or 'nothing'}")

    @staticmethod
    def _backs(c: Claim, a: Answer) -> bool:
        """Does answer ``a`` say what claim ``c`` reports: the status it cites, the outcome it
        reports (UNKNOWN claims none), an OK with its values, code and replay flag?"""
        if c.status is not None and carried_status(c.request, a.status, a.pdu) != c.status:
            return False
        if c.outcome == "UNKNOWN":
            return True
        if answer_outcome(c.request, a.status, a.pdu) != c.outcome:
            return False
        return c.outcome != "OK" or (answer_values(c.request, a.pdu) == (c.values, c.code)
                                     and a.replay == c.replay)

    def check_state(self, truth: Mapping[str, int]) -> None:
        """Compare the model with the device's own registers (an in-process device shows them):
        acknowledged configuration after every result."""
        for r in self.regs.registers.values():
            got = truth.get(r.name)
            if r.kind == "generation" and got is not None:
                wrong = self.model.settle_generation(got)
                if wrong is not None:
                    self.problem("register_semantics", wrong)
            want = self.model.read_one(r)
            if got is None or got == want or (self.tolerance and r.kind == "trigger"):
                continue
            if r.kind == "holding":
                self.problem("lost_acknowledged_writes",
                              f"register {r.address} ({r.name}): acknowledged {want}, device "
                              f"holds {got}")
            else:
                self.problem("register_semantics", f"{r.name}: the map's semantics say {want}, "
                              f"device holds {got}")
            self._adopt(r, got)
