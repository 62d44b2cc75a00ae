"""The device core: the register map's semantics, sans-I/O, driven by simulated time.

Contract:

- ``execute(pdu, now) -> response PDU``: one Modbus request PDU in, one response PDU out. Never
  raises for bad input: a bad request is answered by its exception and changes nothing.
- Every request is validated whole before anything changes (addresses first -> exception 02,
  then values -> 03, then an impossible trigger state -> 04). Reads never change state.
  HOLDING writes set absolute values within min..max; writes to INPUT or GENERATION registers are
  exception 02 (they are not writable addresses, like an unknown one).
- FAULT bits latch while their condition holds; reading never clears; writing 1s clears exactly
  those bits whose condition has gone (a persisting condition stays latched); writing 0s does
  nothing; writing a bit the register does not declare is exception 03.
- TRIGGER registers follow ``TRIGGER_TABLE``: 1 in IDLE starts the action once (0); RUNNING ->
  0x0101, DONE -> 0x0102; 0 resets to IDLE; another value 0xFF01 (exception 03); a state outside
  the table 0xFF00 (exception 04). RUNNING lasts ``trigger_duration`` simulated seconds.
- COMMAND registers (a plain device's command register, ``command_step``): a non-zero value
  written while the register reads 0 starts that command once (it reads the value while the
  action runs, ``trigger_duration`` simulated seconds, then 0); a write while it runs, and a
  write of 0, start nothing and are answered as plain writes (echoed): a plain device keeps no
  record a host could ask. A value above its ``max`` is exception 03.
- Typed registers (``idemlink.protocol.datatypes``) are held word by word; a write must cover all
  the words of a value (else 02) and is checked as the type's number (03). Coils (FC01/05/15),
  discrete inputs (FC02) and the mask write (FC22, ``RegisterMap.mask_write``) are served when
  the map has them, answered 01 otherwise, as before they existed.
- The GENERATION counter is +1 (mod 2^16) per request that effectively changed a HOLDING value
  (or a coil); a no-op write leaves it alone. A map without a generation register keeps the
  count internal and answers ``WRITE_IF_GENERATION`` with 01. ``WRITE_IF_GENERATION`` checks
  it (read-only) after validation and strictly before any change; a failed guard answers
  GUARD_FAILED and changes nothing.
- Every side effect is appended to ``log`` as an ``Effect`` (ground truth for tests and oracles).
- Persist first, flash like an MCU's: a write that changes a persistent register (``persist``,
  the default) calls the shell's ``persist`` hook (given to ``execute``/``write``/
  ``write_if_generation``) with the configuration it is about to commit, before changing
  anything; a hook raising ``PersistError`` makes the request answer exception 04
  (SERVER_DEVICE_FAILURE) with nothing changed. A write that changes only volatile registers
  (``persist = false``) saves nothing, unless the generation reaches its saved ceiling.
- The generation's save policy: the generation must never repeat across a reboot, yet a volatile
  write moves it without a save. So flash holds a *ceiling*, not the generation: every save stores
  ``generation after the write + GENERATION_RESERVE`` (64) — or keeps the saved ceiling while the
  new generation is still below it — and a change whose generation reaches the ceiling saves (a
  new ceiling) even when only volatile registers changed: at most one flash write per 64
  volatile-only changes. At boot the generation starts at the saved ceiling, above every value
  shown before the reboot (it may jump by up to 64, never goes back or repeats; modulo 2^16).
- ``snapshot()``/``restore()`` carry the persistent configuration (holdings with the volatile
  ones at their defaults, and the ceiling as the generation); ``reset_volatile()`` models a
  reboot (triggers IDLE, faults re-latched from live conditions, volatile registers at their
  defaults, the generation at the ceiling).

Typed calls (``read``, ``write``, ``write_if_generation``, ``trigger``) give the same semantics
without Modbus encoding; they raise ``RegisterAccessError`` carrying the exception code.

Why one module of this size: it has one reason to change, the device's register semantics (the
trigger machine, fault latching, the generation counter, validate-all-then-apply, persist-first),
and ``DeviceCore`` is the one class that holds them; the C core mirrors it rule for rule
(``tests/test_c_device.py``). Splitting the rules from the class would make a reader of either
half read both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import TypeGuard

from idemlink.protocol.datatypes import DataType
from idemlink.protocol.long_integers import json_int
from idemlink.protocol.modbus import (
    BIT_FUNCTIONS,
    TRIGGER_CODE_EXCEPTION,
    ExceptionResponse,
    FunctionCode,
    MaskWriteRegister,
    ModbusPduError,
    ReadBits,
    ReadBitsResponse,
    ReadRegisters,
    ReadRegistersResponse,
    Request,
    Response,
    StandardFunction,
    TriggerRequest,
    TriggerResponse,
    WriteIfGeneration,
    WriteIfGenerationResponse,
    WriteMultipleCoils,
    WriteMultipleCoilsResponse,
    WriteMultipleRegisters,
    WriteMultipleRegistersResponse,
    WriteSingleCoil,
    WriteSingleRegister,
    WriteSingleRegisterResponse,
    decode_request,
    encode_response,
)
from idemlink.protocol.outcome import (
    MODBUS_EXCEPTION_TABLE,
    IdemlinkError,
    LocalProtocolError,
    ModbusException,
    RemoteProtocolError,
    Status,
)
from idemlink.protocol.registers import (
    RegisterKind,
    RegisterMap,
    RegisterSpec,
    Space,
    TriggerState,
    TriggerStatus,
)
from idemlink.protocol.regmap_file import DEFAULT_MAP

GENERATION_MODULUS = 0x10000
#: generations reserved by each save of the configuration (the module doc's save policy; the C
#: core's IDL_GENERATION_RESERVE)
GENERATION_RESERVE = 64

# ------------------------------------------------------------------------------ trigger machine


class TriggerEvent(Enum):
    WRITE_1 = "write 1"
    WRITE_0 = "write 0"
    FINISHED = "duration elapsed"


class TriggerAction(Enum):
    NONE = "none"
    START = "start the action"
    ABORT = "abort the running action"
    FINISH = "action finished"
    RESET = "reset to IDLE"


#: (state, event) -> (next state, side effect, answer). A write of any other value is
#: ILLEGAL_VALUE before this table is consulted; a state not in the table is ABNORMAL_STATE.
TRIGGER_TABLE: dict[tuple[TriggerState, TriggerEvent],
                    tuple[TriggerState, TriggerAction, TriggerStatus]] = {
    (TriggerState.IDLE, TriggerEvent.WRITE_1):
        (TriggerState.RUNNING, TriggerAction.START, TriggerStatus.ACCEPTED),
    (TriggerState.RUNNING, TriggerEvent.WRITE_1):
        (TriggerState.RUNNING, TriggerAction.NONE, TriggerStatus.RUNNING),
    (TriggerState.DONE, TriggerEvent.WRITE_1):
        (TriggerState.DONE, TriggerAction.NONE, TriggerStatus.DONE),
    (TriggerState.IDLE, TriggerEvent.WRITE_0):
        (TriggerState.IDLE, TriggerAction.NONE, TriggerStatus.ACCEPTED),
    (TriggerState.RUNNING, TriggerEvent.WRITE_0):
        (TriggerState.IDLE, TriggerAction.ABORT, TriggerStatus.ACCEPTED),
    (TriggerState.DONE, TriggerEvent.WRITE_0):
        (TriggerState.IDLE, TriggerAction.RESET, TriggerStatus.ACCEPTED),
    (TriggerState.RUNNING, TriggerEvent.FINISHED):
        (TriggerState.DONE, TriggerAction.FINISH, TriggerStatus.ACCEPTED),
}



def start_row(kind: RegisterKind, state: int,
              ) -> tuple[TriggerState, TriggerAction, TriggerStatus] | None:
    """What a start (a write of 1) does to a register of ``kind`` read as ``state``: the one
    rule a host's trigger follows on a plain slave (read first, write only when it starts). A
    TRIGGER follows ``TRIGGER_TABLE``; a COMMAND register starts only when it reads 0 (idle) and
    otherwise is RUNNING (nothing is written: a command that runs is never restarted). None: a
    state outside the table."""
    if kind is RegisterKind.COMMAND:
        return ((TriggerState.RUNNING, TriggerAction.START, TriggerStatus.ACCEPTED) if state == 0
                else (TriggerState.RUNNING, TriggerAction.NONE, TriggerStatus.RUNNING))
    if state not in {s.value for s in TriggerState}:
        return None
    return TRIGGER_TABLE.get((TriggerState(state), TriggerEvent.WRITE_1))


# ---------------------------------------------------------------------------------- ground truth


class EffectKind(IntEnum):
    SET = 1  #: a HOLDING register took a new value (old -> new)
    GENERATION = 2  #: the generation counter moved (old -> new)
    FAULT_LATCHED = 3  #: fault bits latched (old word -> new word)
    FAULT_CLEARED = 4  #: fault bits cleared by a W1C write (old word -> new word)
    TRIGGER_STARTED = 5  #: the one-shot action (a trigger's, a COMMAND's: new = the command) started
    TRIGGER_FINISHED = 6  #: the action completed (time = start + duration; a COMMAND reads 0)
    TRIGGER_ABORTED = 7  #: reset while RUNNING: the action was stopped
    TRIGGER_RESET = 8  #: DONE -> IDLE
    INPUT_SET = 9  #: the simulation changed a live input (sim hook, not a request)
    CONDITION = 10  #: the simulation changed an external fault condition (sim hook)
    REBOOT = 11  #: reset_volatile()
    RESTORED = 12  #: restore() loaded a configuration snapshot


@dataclass(frozen=True, slots=True)
class Effect:
    """One side effect, as it happened. ``request`` numbers the write-type calls (``write``,
    ``write_if_generation``, ``trigger``, also when reached through ``execute``) from 1; 0 means
    ``tick``, a sim hook, a reboot or a restore. ``tag`` is what the causing call was given
    (e.g. the framed layer's epoch:seq)."""

    index: int
    time: float
    kind: EffectKind
    register: str
    address: int
    old: int
    new: int
    request: int
    tag: int | str | None = None


class RegisterAccessError(RemoteProtocolError):
    """A request the device refuses; nothing changed. ``exception`` is the Modbus answer."""

    def __init__(self, message: str, exception: ModbusException) -> None:
        super().__init__(message, action=MODBUS_EXCEPTION_TABLE[exception].action)
        self.exception = exception


class PersistError(IdemlinkError):
    """The shell could not save the configuration a write was about to commit: a failure of the
    device's storage, not a misuse of the API and not a wire status (the request is answered
    with exception 04, SERVER_DEVICE_FAILURE)."""


#: The shell's persist hook: save this configuration or raise ``PersistError``.
Persist = Callable[["ConfigSnapshot"], None]


class SnapshotError(LocalProtocolError):
    """A configuration snapshot that does not fit this register map."""


def _u16(x: object) -> TypeGuard[int]:
    """A plain JSON integer (not a bool, not a float) of 0..65535."""
    return type(x) is int and 0 <= x <= 0xFFFF


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """Persistent configuration: HOLDING register words by address, the generation counter, and
    the coils by coil address (a map without coils: none, and the JSON form has no ``coils``
    key, as before coils existed)."""

    holdings: tuple[tuple[int, int], ...]
    generation: int
    coils: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> str:
        doc: dict[str, object] = {"holdings": [list(p) for p in self.holdings],
                                  "generation": self.generation}
        if self.coils:
            doc["coils"] = [list(p) for p in self.coils]
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ConfigSnapshot:
        """Strict: ``{"holdings": [[address, value], ...], "generation": g}`` with plain JSON
        integers 0..65535 only (no floats, booleans or strings) and each address once. The
        refusals (``SnapshotError``) are the C device's too, word for word
        (``tests/vectors/flash_files.json``): ``need an object with a holdings list``,
        ``holdings must be [address, value] pairs of integers 0..65535``, ``generation is not an
        integer 0..65535``, ``address A given twice``; text that is not JSON is ``not JSON: ...``."""
        try:  # an integer too long to convert is no integer 0..65535: its field says so
            raw = json.loads(text, parse_int=json_int)
        except ValueError as exc:
            raise SnapshotError(f"not JSON: {exc}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("holdings"), list):
            raise SnapshotError("need an object with a holdings list")
        pairs = raw["holdings"]
        if not all(isinstance(p, list) and len(p) == 2 and all(_u16(x) for x in p)
                   for p in pairs):
            raise SnapshotError("holdings must be [address, value] pairs of integers 0..65535")
        generation = raw.get("generation")
        if not _u16(generation):
            raise SnapshotError("generation is not an integer 0..65535")
        coils = raw.get("coils", [])  # present only for a map with coils (no C device has one)
        if not isinstance(coils, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(_u16(x) for x in p) for p in coils):
            raise SnapshotError("coils must be [address, value] pairs of integers 0..65535")
        snap = cls(tuple((a, v) for a, v in pairs), generation, tuple((a, v) for a, v in coils))
        snap.check_unique()
        return snap

    def check_unique(self) -> None:
        for what, pairs in (("address", self.holdings), ("coil address", self.coils)):
            seen: set[int] = set()
            for a, _ in pairs:
                if a in seen:
                    raise SnapshotError(f"{what} {a} given twice")
                seen.add(a)


@dataclass(frozen=True, slots=True)
class FaultRule:
    """A fault condition computed from register values (by name), e.g. over-temperature."""

    fault: str
    bit: int
    predicate: Callable[[Mapping[str, int]], bool]
    description: str = ""


def _over_temperature(v: Mapping[str, int]) -> bool:
    return v["temperature"] > v["threshold"]


#: Rules for ``DEFAULT_MAP``: over-temperature latches while temperature > threshold.
DEFAULT_RULES: tuple[FaultRule, ...] = (
    FaultRule("faults", 0, _over_temperature, "temperature > threshold"),
)



@dataclass(slots=True)
class _Plan:
    """The validated effect of one write request, applied only after validation succeeded."""

    holdings: dict[int, int] = field(default_factory=dict)  #: register words by address
    coils: dict[int, int] = field(default_factory=dict)
    clears: dict[int, int] = field(default_factory=dict)
    triggers: dict[int, TriggerEvent] = field(default_factory=dict)
    commands: dict[int, int] = field(default_factory=dict)  #: COMMAND registers written
    codes: dict[int, TriggerStatus] = field(default_factory=dict)


def broadcast_allowed(regmap: RegisterMap, pdu: bytes) -> bool:
    """Whether ``pdu`` may run as a broadcast (docs/BUS.md): a well-formed FC06 or FC16 whose
    every register is HOLDING in ``regmap`` (set-only: an absolute value, so nothing depends on
    who else ran it or how often). A trigger, a fault clear, a conditional write or a read never
    runs from a broadcast: nobody answers one. The device's rule and the host's check before
    it sends one."""
    try:
        req = decode_request(pdu)
    except ModbusPduError:
        return False
    if isinstance(req, WriteSingleRegister):
        first, count = req.address, 1
    elif isinstance(req, WriteMultipleRegisters):
        first, count = req.address, len(req.values)
    else:
        return False
    for a in range(first, first + count):
        spec = regmap.at(a)
        if spec is None or spec.kind is not RegisterKind.HOLDING:
            return False
    return True


class DeviceCore:
    """The simulated device's registers and their semantics. See the module docstring."""

    def __init__(
        self,
        regmap: RegisterMap = DEFAULT_MAP,
        *,
        trigger_duration: float = 5.0,
        rules: tuple[FaultRule, ...] | None = None,
        inputs: Mapping[str, int] | None = None,
        config: ConfigSnapshot | None = None,
        now: float = 0.0,
        max_log: int | None = None,
    ) -> None:
        if not math.isfinite(trigger_duration) or trigger_duration < 0:
            raise ValueError(f"trigger_duration must be finite and >= 0, not {trigger_duration}")
        self.regmap = regmap
        self.trigger_duration = trigger_duration
        self.rules = rules if rules is not None else (DEFAULT_RULES if regmap.hash ==
                                                      DEFAULT_MAP.hash else ())
        self.log: list[Effect] = []
        self.max_log = max_log
        self.requests = 0
        self._effects = 0
        self._now = now
        gen = regmap.generation
        #: where the generation's effects are recorded ("", -1: the map has no generation
        #: register, e.g. a third-party device's served by the RTU face: the count is internal)
        self._gen_at = (gen.name, gen.address) if gen is not None else ("", -1)
        self._holdings = self._words_of(regmap.of_kind(RegisterKind.HOLDING), {})
        self._generation = 0
        #: the generation saved in flash: the boot generation, above every one shown since
        self._ceiling = 0
        base_inputs = {r.name: r.default for r in regmap
                       if r.kind in (RegisterKind.INPUT, RegisterKind.DISCRETE_INPUT)}
        base_inputs.update(inputs or {})
        self._inputs = self._words_of(regmap.of_kind(RegisterKind.INPUT), base_inputs)
        self._coils = {r.address: r.default for r in regmap.of_kind(RegisterKind.COIL)}
        self._discretes = {r.address: base_inputs.get(r.name, 0)
                           for r in regmap.of_kind(RegisterKind.DISCRETE_INPUT)}
        self._latched = {r.address: 0 for r in regmap.of_kind(RegisterKind.FAULT)}
        self._external = {r.address: 0 for r in regmap.of_kind(RegisterKind.FAULT)}
        self._trigger = {r.address: int(TriggerState.IDLE)
                         for r in regmap.of_kind(RegisterKind.TRIGGER)}
        self._started: dict[int, float] = {}
        self._commands = {r.address: 0 for r in regmap.of_kind(RegisterKind.COMMAND)}
        self._command_started: dict[int, float] = {}
        if config is not None:
            self._load(config)
            self._revert_volatile(now)
        self._latch(now, 0, None)

    # ----------------------------------------------------------------------------- plumbing

    @staticmethod
    def _words_of(specs: tuple[RegisterSpec, ...], raws: Mapping[str, int]) -> dict[int, int]:
        """The register words of ``specs`` by address, each at its raw value in ``raws`` (by
        name; else its default)."""
        out: dict[int, int] = {}
        for r in specs:
            out.update(zip(r.span, r.words_of(raws.get(r.name, r.default)), strict=True))
        return out

    def _record(self, now: float, kind: EffectKind, spec: RegisterSpec | tuple[str, int],
                old: int, new: int, request: int, tag: int | str | None) -> None:
        name, address = (spec.name, spec.address) if isinstance(spec, RegisterSpec) else spec
        self._effects += 1
        self.log.append(Effect(self._effects, now, kind, name, address, old, new, request, tag))
        if self.max_log is not None and len(self.log) > self.max_log:
            del self.log[: len(self.log) - self.max_log]

    def _names(self) -> dict[str, int]:
        return {r.name: self._read_one(r) for r in self.regmap}

    def _conditions(self, address: int) -> int:
        cond = self._external[address]
        if self.rules:
            values = self._names()
            spec = self.regmap.at(address)
            for rule in self.rules:
                if spec is not None and rule.fault == spec.name and rule.predicate(values):
                    cond |= 1 << rule.bit
        return cond

    def _latch(self, now: float, request: int, tag: int | str | None) -> None:
        for address, old in self._latched.items():
            new = old | self._conditions(address)
            if new != old:
                self._latched[address] = new
                self._record(now, EffectKind.FAULT_LATCHED, self._spec(address), old, new,
                             request, tag)

    def _spec(self, address: int) -> RegisterSpec:
        spec = self.regmap.at(address)
        assert spec is not None
        return spec

    def _read_one(self, spec: RegisterSpec) -> int:
        """The raw value of a register (all its words), coil, discrete input or bit field."""
        a = spec.address
        match spec.kind:
            case RegisterKind.INPUT:
                return spec.raw_from_words([self._inputs[w] for w in spec.span])
            case RegisterKind.HOLDING:
                return spec.raw_from_words([self._holdings[w] for w in spec.span])
            case RegisterKind.FAULT:
                return self._latched[a]
            case RegisterKind.TRIGGER:
                return self._trigger[a]
            case RegisterKind.GENERATION:
                return self._generation
            case RegisterKind.COIL:
                return self._coils[a]
            case RegisterKind.DISCRETE_INPUT:
                return self._discretes[a]
            case RegisterKind.COMMAND:
                return self._commands[a]
        raise AssertionError(spec.kind)  # pragma: no cover

    def _word(self, spec: RegisterSpec, address: int) -> int:
        """The one word at ``address`` of the register ``spec``."""
        if spec.kind is RegisterKind.INPUT:
            return self._inputs[address]
        if spec.kind is RegisterKind.HOLDING:
            return self._holdings[address]
        return self._read_one(spec)

    def _advance(self, now: float) -> float:
        """Time never runs backwards inside the core."""
        self._now = max(self._now, now)
        return self._now

    # --------------------------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        """Advance simulated time: finish triggers whose duration elapsed, latch faults."""
        now = self._advance(now)
        for address, started in sorted(self._started.items()):
            done_at = started + self.trigger_duration
            if now >= done_at and self._trigger[address] == TriggerState.RUNNING:
                self._trigger_step(address, TriggerEvent.FINISHED, done_at, 0, None)
        for address, started in sorted(self._command_started.items()):
            done_at = started + self.trigger_duration
            if now >= done_at:
                old = self._commands[address]
                self._commands[address] = 0
                del self._command_started[address]
                self._record(done_at, EffectKind.TRIGGER_FINISHED, self._spec(address), old, 0,
                             0, None)
        self._latch(now, 0, None)

    def _trigger_step(self, address: int, event: TriggerEvent, now: float, request: int,
                      tag: int | str | None) -> None:
        state = TriggerState(self._trigger[address])
        nxt, action, _ = TRIGGER_TABLE[(state, event)]
        self._trigger[address] = int(nxt)
        spec = self._spec(address)
        kind = {TriggerAction.START: EffectKind.TRIGGER_STARTED,
                TriggerAction.FINISH: EffectKind.TRIGGER_FINISHED,
                TriggerAction.ABORT: EffectKind.TRIGGER_ABORTED,
                TriggerAction.RESET: EffectKind.TRIGGER_RESET}.get(action)
        if action is TriggerAction.START:
            self._started[address] = now
        elif action in (TriggerAction.FINISH, TriggerAction.ABORT):
            self._started.pop(address, None)
        if kind is not None:
            self._record(now, kind, spec, int(state), int(nxt), request, tag)

    # ------------------------------------------------------------------------- typed calls

    def read(self, address: int, count: int, now: float | None = None) -> tuple[int, ...]:
        """Values of ``count`` registers from ``address``; any unmapped one -> exception 02."""
        if now is not None:
            self.tick(now)
        if count < 1 or address < 0 or address + count > GENERATION_MODULUS:
            raise RegisterAccessError("read outside the address space",
                                      ModbusException.ILLEGAL_DATA_ADDRESS)
        specs = [self.regmap.at(a) for a in range(address, address + count)]
        out = []
        for a, spec in zip(range(address, address + count), specs, strict=True):
            if spec is None:
                raise RegisterAccessError(f"no register at 0x{a:04X}",
                                          ModbusException.ILLEGAL_DATA_ADDRESS)
            out.append(self._word(spec, a))
        return tuple(out)

    def read_bits(self, space: Space, address: int, count: int,
                  now: float | None = None) -> tuple[int, ...]:
        """Values of ``count`` coils or discrete inputs from ``address``; any unmapped one ->
        exception 02."""
        if now is not None:
            self.tick(now)
        out = []
        for a in range(address, address + count):
            spec = self.regmap.spec_at(a, space)
            if spec is None:
                raise RegisterAccessError(f"no {space.value} at 0x{a:04X}",
                                          ModbusException.ILLEGAL_DATA_ADDRESS)
            out.append(self._read_one(spec))
        return tuple(out)

    def _plan(self, address: int, values: tuple[int, ...], holdings_only: bool) -> _Plan:
        if not values or address < 0 or address + len(values) > GENERATION_MODULUS:
            raise RegisterAccessError("write outside the address space",
                                      ModbusException.ILLEGAL_DATA_ADDRESS)
        specs: list[RegisterSpec] = []
        end = address + len(values)
        for a in range(address, end):  # pass 1: addresses (02)
            spec = self.regmap.at(a)
            if spec is None:
                raise RegisterAccessError(f"no register at 0x{a:04X}",
                                          ModbusException.ILLEGAL_DATA_ADDRESS)
            if not spec.writable or (holdings_only and spec.kind is not RegisterKind.HOLDING):
                raise RegisterAccessError(f"{spec.name} ({spec.kind.name}) is not writable here",
                                          ModbusException.ILLEGAL_DATA_ADDRESS)
            if spec.address < address or spec.address + spec.words > end:
                raise RegisterAccessError(f"{spec.name}: a write covers {spec.words} registers "
                                          "of it or none", ModbusException.ILLEGAL_DATA_ADDRESS)
            if not specs or specs[-1] is not spec:
                specs.append(spec)
        plan = _Plan()
        for spec in specs:  # pass 2: values (03)
            words = values[spec.address - address: spec.address - address + spec.words]
            for value in words:
                if not 0 <= value <= 0xFFFF:
                    raise RegisterAccessError(f"{spec.name}: {value} is not a 16-bit value",
                                              ModbusException.ILLEGAL_DATA_VALUE)
            value = spec.raw_from_words(words)
            if spec.kind is RegisterKind.HOLDING:
                if not spec.in_range(value):
                    raise RegisterAccessError(
                        f"{spec.name}: {spec.native_text(value)} outside "
                        f"{spec.native_text(spec.minimum)}..{spec.native_text(spec.maximum)}",
                        ModbusException.ILLEGAL_DATA_VALUE)
                plan.holdings.update(zip(spec.span, words, strict=True))
            elif spec.kind is RegisterKind.FAULT:
                if value & ~spec.fault_mask:
                    raise RegisterAccessError(
                        f"{spec.name}: bits 0x{value & ~spec.fault_mask:04X} not declared",
                        ModbusException.ILLEGAL_DATA_VALUE)
                plan.clears[spec.address] = value
            elif spec.kind is RegisterKind.COMMAND:
                if value > spec.maximum:
                    raise RegisterAccessError(f"{spec.name}: command {value} outside "
                                              f"0..{spec.maximum}",
                                              ModbusException.ILLEGAL_DATA_VALUE)
                plan.commands[spec.address] = value
            else:  # TRIGGER
                if value not in (0, 1):
                    raise RegisterAccessError(
                        f"{spec.name}: trigger value {value} (0 or 1)",
                        TRIGGER_CODE_EXCEPTION[TriggerStatus.ILLEGAL_VALUE])
                plan.triggers[spec.address] = (TriggerEvent.WRITE_1 if value == 1
                                               else TriggerEvent.WRITE_0)
        for address, event in plan.triggers.items():  # pass 3: trigger states (04)
            spec = self._spec(address)
            raw = self._trigger[address]
            if raw not in {s.value for s in TriggerState}:
                raise RegisterAccessError(f"{spec.name}: impossible state {raw}",
                                          TRIGGER_CODE_EXCEPTION[TriggerStatus.ABNORMAL_STATE])
            entry = TRIGGER_TABLE.get((TriggerState(raw), event))
            if entry is None:  # pragma: no cover - the table covers every write
                raise RegisterAccessError(f"{spec.name}: no transition",
                                          ModbusException.SERVER_DEVICE_FAILURE)
            plan.codes[address] = entry[2]
        return plan

    def _persist_first(self, plan: _Plan, persist: Persist | None) -> None:
        """Save the configuration ``plan`` would commit, before anything changes, when flash
        must change: a persistent register changes, or the generation reaches the saved
        ceiling (the module doc's save policy). Without a hook the ceiling moves all the same
        (an in-memory flash)."""
        new = dict(self._holdings)
        new.update(plan.holdings)
        coils = dict(self._coils)
        coils.update(plan.coils)
        if new == self._holdings and coils == self._coils:
            return  # no effective change: the generation stays, nothing to save
        after = (self._generation + 1) % GENERATION_MODULUS
        below = 1 <= (self._ceiling - after) % GENERATION_MODULUS <= GENERATION_RESERVE
        persistent = any(self._spec(a).persist for a, v in new.items() if v != self._holdings[a])
        persistent = persistent or any(self._coil_persist(a)
                                       for a, v in coils.items() if v != self._coils[a])
        if below and not persistent:
            return  # a volatile change under the ceiling: flash untouched
        ceiling = self._ceiling if below else (after + GENERATION_RESERVE) % GENERATION_MODULUS
        if persist is not None:
            try:
                persist(self._persistent(new, coils, ceiling))
            except PersistError as exc:
                raise RegisterAccessError(f"configuration not saved, nothing changed: {exc}",
                                          ModbusException.SERVER_DEVICE_FAILURE) from None
        self._ceiling = ceiling

    def _coil_persist(self, address: int) -> bool:
        coil = self.regmap.spec_at(address, Space.COILS)
        return coil is None or coil.persist

    def _persistent(self, holdings: Mapping[int, int], coils: Mapping[int, int],
                    ceiling: int) -> ConfigSnapshot:
        """What flash keeps: the volatile registers at their defaults (a boot sets them there
        anyway), the ceiling as the generation."""
        kept = dict(holdings)
        for spec in self.regmap.of_kind(RegisterKind.HOLDING):
            if not spec.persist:
                kept.update(zip(spec.span, spec.words_of(spec.default), strict=True))
        kept_coils = {a: (v if self._coil_persist(a) else self._spec_coil_default(a))
                      for a, v in coils.items()}
        return ConfigSnapshot(tuple(sorted(kept.items())), ceiling,
                              tuple(sorted(kept_coils.items())))

    def _spec_coil_default(self, address: int) -> int:
        coil = self.regmap.spec_at(address, Space.COILS)
        return coil.default if coil is not None else 0

    def _apply(self, plan: _Plan, now: float, request: int, tag: int | str | None) -> None:
        changed = False
        for spec in dict.fromkeys(self._spec(a) for a in plan.holdings):
            old = self._read_one(spec)
            self._holdings.update((a, plan.holdings[a]) for a in spec.span)
            new = self._read_one(spec)
            if old != new:
                changed = True
                self._record(now, EffectKind.SET, spec, old, new, request, tag)
        for a, value in plan.coils.items():
            old = self._coils[a]
            if old != value:
                self._coils[a] = value
                changed = True
                coil = self.regmap.spec_at(a, Space.COILS)
                assert coil is not None
                self._record(now, EffectKind.SET, coil, old, value, request, tag)
        if changed:
            self._move_generation(now, request, tag)
        for a, event in plan.triggers.items():
            self._trigger_step(a, event, now, request, tag)
        for a, value in plan.commands.items():
            row = start_row(RegisterKind.COMMAND, self._commands[a])
            if value and row is not None and row[1] is TriggerAction.START:
                self._commands[a] = value
                self._command_started[a] = now
                self._record(now, EffectKind.TRIGGER_STARTED, self._spec(a), 0, value,
                             request, tag)
        for a, bits in plan.clears.items():
            old = self._latched[a]
            new = old & ~(bits & ~self._conditions(a))
            if new != old:
                self._latched[a] = new
                self._record(now, EffectKind.FAULT_CLEARED, self._spec(a), old, new, request,
                             tag)
        self._latch(now, request, tag)

    def write(self, address: int, values: tuple[int, ...] | list[int], now: float,
              tag: int | str | None = None, persist: Persist | None = None,
              ) -> dict[int, TriggerStatus]:
        """FC06/FC16 semantics: validate every value, then apply all. Returns the trigger answers
        (by address) for any trigger registers written."""
        now = self._advance(now)
        self.tick(now)
        self.requests += 1
        plan = self._plan(address, tuple(values), holdings_only=False)
        self._persist_first(plan, persist)
        self._apply(plan, now, self.requests, tag)
        return plan.codes

    def write_if_generation(self, generation: int, address: int,
                            values: tuple[int, ...] | list[int], now: float,
                            tag: int | str | None = None, persist: Persist | None = None,
                            ) -> tuple[bool, int]:
        """Write HOLDING registers only if the generation still equals ``generation``.
        Returns (executed, generation after); (False, current) changed nothing."""
        if self.regmap.generation is None:
            raise RegisterAccessError("this map has no generation register: no conditional "
                                      "write", ModbusException.ILLEGAL_FUNCTION)
        now = self._advance(now)
        self.tick(now)
        self.requests += 1
        plan = self._plan(address, tuple(values), holdings_only=True)
        if generation != self._generation:  # read-only guard, strictly before any change
            return False, self._generation
        self._persist_first(plan, persist)
        self._apply(plan, now, self.requests, tag)
        return True, self._generation

    def _move_generation(self, now: float, request: int, tag: int | str | None) -> None:
        old_gen = self._generation
        self._generation = (old_gen + 1) % GENERATION_MODULUS
        if self._gen_at[1] >= 0:
            self._record(now, EffectKind.GENERATION, self._gen_at, old_gen, self._generation,
                         request, tag)

    def write_coils(self, address: int, values: tuple[int, ...] | list[int], now: float,
                    tag: int | str | None = None, persist: Persist | None = None) -> None:
        """FC05/FC15 semantics: set absolute 0/1 values of coils, validated whole first
        (an address without a coil -> 02, a value other than 0/1 -> 03)."""
        now = self._advance(now)
        self.tick(now)
        self.requests += 1
        plan = _Plan()
        for a, value in zip(range(address, address + len(values)), values, strict=True):
            if self.regmap.spec_at(a, Space.COILS) is None:
                raise RegisterAccessError(f"no coil at 0x{a:04X}",
                                          ModbusException.ILLEGAL_DATA_ADDRESS)
            if value not in (0, 1):
                raise RegisterAccessError(f"coil 0x{a:04X}: {value} (0 or 1)",
                                          ModbusException.ILLEGAL_DATA_VALUE)
            plan.coils[a] = value
        if not plan.coils:
            raise RegisterAccessError("no coil written", ModbusException.ILLEGAL_DATA_ADDRESS)
        self._persist_first(plan, persist)
        self._apply(plan, now, self.requests, tag)

    def mask_write(self, address: int, and_mask: int, or_mask: int, now: float,
                   tag: int | str | None = None, persist: Persist | None = None) -> int:
        """FC22 semantics on one single-register HOLDING: it becomes ``(current & and_mask) |
        (or_mask & ~and_mask)``, checked against min..max like any write (03), atomically.
        Returns the new value."""
        now = self._advance(now)
        self.tick(now)
        self.requests += 1
        spec = self.regmap.at(address)
        if (spec is None or spec.kind is not RegisterKind.HOLDING or spec.words != 1
                or not spec.writable):
            raise RegisterAccessError(f"no single-register holding at 0x{address:04X}",
                                      ModbusException.ILLEGAL_DATA_ADDRESS)
        value = (self._holdings[address] & and_mask) | (or_mask & ~and_mask & 0xFFFF)
        plan = self._plan(address, (value,), holdings_only=True)
        self._persist_first(plan, persist)
        self._apply(plan, now, self.requests, tag)
        return value

    def broadcast_ok(self, pdu: bytes) -> bool:
        """Whether ``pdu`` may run as a broadcast on this device (``broadcast_allowed``)."""
        return broadcast_allowed(self.regmap, pdu)

    def serves(self, function: int) -> bool:
        """Whether this device answers a standard function beyond registers: the bit functions
        when its map has coils (discrete inputs), the mask write when it says ``mask_write``,
        the conditional write when it has a generation register. Otherwise: exception 01."""
        if function == StandardFunction.READ_DISCRETE_INPUTS:
            return bool(self._discretes)
        if function in BIT_FUNCTIONS:
            return bool(self._coils)
        if function == StandardFunction.MASK_WRITE_REGISTER:
            return self.regmap.mask_write
        if function == FunctionCode.WRITE_IF_GENERATION:
            return self.regmap.generation is not None
        return True

    def trigger(self, address: int, value: int, now: float,
                tag: int | str | None = None) -> TriggerStatus:
        """Write a trigger register and get its answer code (``TriggerStatus``); never raises for the
        value or state (0xFF01 / 0xFF00 come back as codes). Unknown/non-trigger -> 02."""
        now = self._advance(now)
        self.tick(now)
        self.requests += 1
        spec = self.regmap.at(address)
        if spec is None or spec.kind is not RegisterKind.TRIGGER:
            raise RegisterAccessError(f"no trigger register at 0x{address:04X}",
                                      ModbusException.ILLEGAL_DATA_ADDRESS)
        try:
            plan = self._plan(address, (value,), holdings_only=False)
        except RegisterAccessError as exc:
            if exc.exception is ModbusException.SERVER_DEVICE_FAILURE:
                return TriggerStatus.ABNORMAL_STATE
            return TriggerStatus.ILLEGAL_VALUE
        self._apply(plan, now, self.requests, tag)
        return plan.codes[address]

    # ----------------------------------------------------------------------------- Modbus

    def execute(self, pdu: bytes, now: float, tag: int | str | None = None,
                persist: Persist | None = None) -> bytes:
        """Answer one request PDU. Bad requests get their exception and change nothing;
        ``persist`` saves a configuration change before it is applied (see the module doc)."""
        return encode_response(self.handle(pdu, now, tag, persist))

    def handle(self, pdu: bytes, now: float, tag: int | str | None = None,
               persist: Persist | None = None) -> Response:
        """As ``execute`` but returns the typed response."""
        if pdu and not self.serves(pdu[0]):
            self._advance(now)
            self.tick(now)
            return ExceptionResponse(pdu[0], ModbusException.ILLEGAL_FUNCTION)
        try:
            req: Request = decode_request(pdu)
        except ModbusPduError as exc:
            self._advance(now)
            self.tick(now)
            return ExceptionResponse(exc.function & 0x7F, exc.exception)
        try:
            return self._dispatch(req, now, tag, persist)
        except RegisterAccessError as exc:
            return ExceptionResponse(pdu[0], exc.exception)

    def _dispatch(self, req: Request, now: float, tag: int | str | None,
                  persist: Persist | None) -> Response:
        match req:
            case ReadRegisters(function, address, count):
                return ReadRegistersResponse(function, self.read(address, count, now))
            case WriteSingleRegister(address, value):
                self._write_checked(address, (value,), now, tag, persist)
                return WriteSingleRegisterResponse(address, value)
            case WriteMultipleRegisters(address, values):
                self._write_checked(address, values, now, tag, persist)
                return WriteMultipleRegistersResponse(address, len(values))
            case WriteIfGeneration(generation, address, values):
                ok, gen = self.write_if_generation(generation, address, values, now, tag,
                                                   persist)
                return WriteIfGenerationResponse(Status.OK if ok else Status.GUARD_FAILED, gen)
            case TriggerRequest(address, value):
                return TriggerResponse(address, self.trigger(address, value, now, tag))
            case ReadBits(function, address, count):
                space = (Space.COILS if function is StandardFunction.READ_COILS
                         else Space.DISCRETE_INPUTS)
                return ReadBitsResponse(function, self.read_bits(space, address, count, now))
            case WriteSingleCoil(address, value):
                self.write_coils(address, (value,), now, tag, persist)
                return req
            case WriteMultipleCoils(address, values):
                self.write_coils(address, values, now, tag, persist)
                return WriteMultipleCoilsResponse(address, len(values))
            case MaskWriteRegister(address, and_mask, or_mask):
                self.mask_write(address, and_mask, or_mask, now, tag, persist)
                return req
        raise AssertionError(req)  # pragma: no cover

    def _write_checked(self, address: int, values: tuple[int, ...], now: float,
                       tag: int | str | None, persist: Persist | None) -> None:
        codes = self.write(address, values, now, tag, persist)
        for code in codes.values():  # unreachable for valid plans; kept for clarity
            if code in TRIGGER_CODE_EXCEPTION:  # pragma: no cover
                raise RegisterAccessError(code.name, TRIGGER_CODE_EXCEPTION[code])

    # ------------------------------------------------------------------------ inspection

    def value(self, name: str) -> int:
        """Current value of a register by name (no side effect)."""
        return self._read_one(self.regmap.named(name))

    def values(self) -> dict[str, int]:
        """Every register by name (no side effect)."""
        return self._names()

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def now(self) -> float:
        return self._now

    def effects(self, kind: EffectKind | None = None, register: str | None = None,
                ) -> list[Effect]:
        return [e for e in self.log
                if (kind is None or e.kind is kind) and (register is None or e.register == register)]

    def count(self, kind: EffectKind, register: str | None = None) -> int:
        """How many times a side effect happened (e.g. TRIGGER_STARTED on self_clean)."""
        return len(self.effects(kind, register))

    # ------------------------------------------------------------------------ sim hooks

    def set_input(self, name: str, value: int, now: float) -> None:
        """Simulation: the physical world changed a live input (e.g. temperature), a raw value
        (all its words: ``RegisterSpec.raw_from_text`` makes one from text)."""
        spec = self.regmap.named(name)
        if (spec.kind not in (RegisterKind.INPUT, RegisterKind.DISCRETE_INPUT)
                or spec.field is not None or not 0 <= value <= spec.raw_max):
            raise LocalProtocolError(f"{name} is not an INPUT register or {value} not a raw "
                                     f"value of it (0..{spec.raw_max})")
        now = self._advance(now)
        self.tick(now)
        old = self._read_one(spec)
        if old != value:
            if spec.kind is RegisterKind.DISCRETE_INPUT:
                self._discretes[spec.address] = value
            else:
                self._inputs.update(zip(spec.span, spec.words_of(value), strict=True))
            self._record(now, EffectKind.INPUT_SET, spec, old, value, 0, None)
        self._latch(now, 0, None)

    def set_condition(self, bit_name: str, active: bool, now: float) -> None:
        """Simulation: an external fault condition (e.g. fan_stall) appears or goes."""
        for spec in self.regmap.of_kind(RegisterKind.FAULT):
            for b in spec.bits:
                if b.name == bit_name:
                    now = self._advance(now)
                    self.tick(now)
                    old = self._external[spec.address]
                    new = old | (1 << b.bit) if active else old & ~(1 << b.bit)
                    if new != old:
                        self._external[spec.address] = new
                        self._record(now, EffectKind.CONDITION, spec, old, new, 0, None)
                    self._latch(now, 0, None)
                    return
        raise LocalProtocolError(f"no fault bit named {bit_name!r}")

    def finish_command(self, name: str, now: float) -> None:
        """Simulation: the running command of the COMMAND register ``name`` is done now (it reads
        0; nothing happens when none runs)."""
        spec = self.regmap.named(name)
        if spec.kind is not RegisterKind.COMMAND:
            raise LocalProtocolError(f"{name} is not a COMMAND register")
        now = self._advance(now)
        self.tick(now)
        if spec.address in self._command_started:
            old = self._commands[spec.address]
            self._commands[spec.address] = 0
            del self._command_started[spec.address]
            self._record(now, EffectKind.TRIGGER_FINISHED, spec, old, 0, 0, None)

    def force_trigger_state(self, name: str, raw: int) -> None:
        """Test hook: put a trigger in any raw state, including an impossible one."""
        spec = self.regmap.named(name)
        if spec.kind is not RegisterKind.TRIGGER:
            raise LocalProtocolError(f"{name} is not a TRIGGER")
        self._trigger[spec.address] = raw
        if raw == TriggerState.RUNNING:
            self._started[spec.address] = self._now
        else:
            self._started.pop(spec.address, None)

    # ---------------------------------------------------------------- persistence, reboot

    def snapshot(self) -> ConfigSnapshot:
        """The persistent configuration (what survives a reboot in simulated flash): the
        volatile registers at their defaults, the saved ceiling as the generation."""
        return self._persistent(self._holdings, self._coils, self._ceiling)

    def _load(self, snap: ConfigSnapshot) -> None:
        snap.check_unique()
        holdings = dict(snap.holdings)
        coils = dict(snap.coils)
        if set(holdings) != set(self._holdings):
            raise SnapshotError("snapshot holds other registers than this map's HOLDINGs")
        if set(coils) != set(self._coils):
            raise SnapshotError("snapshot holds other coils than this map's")
        for a, v in holdings.items():
            spec = self._spec(a)
            if spec.dtype is DataType.U16:
                if not spec.minimum <= v <= spec.maximum:
                    raise SnapshotError(f"address {a}: {v} outside {spec.minimum}..{spec.maximum}")
            elif a == spec.address:  # a typed value: all its words, as its type's number
                words = [holdings[w] for w in spec.span]
                if not all(0 <= w <= 0xFFFF for w in words) or not spec.in_range(
                        spec.raw_from_words(words)):
                    raise SnapshotError(f"address {a}: {spec.name} {words} outside "
                                        f"{spec.native_text(spec.minimum)}.."
                                        f"{spec.native_text(spec.maximum)}")
        for a, v in coils.items():
            if v not in (0, 1):
                raise SnapshotError(f"coil address {a}: {v} is not 0 or 1")
        if not 0 <= snap.generation < GENERATION_MODULUS:
            raise SnapshotError("generation is not an integer 0..65535")
        self._holdings = holdings
        self._coils = coils
        self._generation = self._ceiling = snap.generation

    def restore(self, snap: ConfigSnapshot, now: float) -> None:
        """Load a configuration snapshot (validated whole; a bad one changes nothing)."""
        now = self._advance(now)
        self._load(snap)
        self._record(now, EffectKind.RESTORED, self._gen_at, 0, snap.generation, 0, None)
        self._latch(now, 0, None)

    def reset_volatile(self, now: float) -> None:
        """A reboot: triggers back to IDLE (a running action is lost), latched faults forgotten
        and re-latched from the conditions that still hold. Configuration is kept, except
        HOLDING registers declared volatile (``persist = false``), which return to default."""
        now = self._advance(now)
        for a in self._trigger:
            self._trigger[a] = int(TriggerState.IDLE)
        self._started.clear()
        for a in self._commands:  # a reboot loses a running command: it reads 0
            self._commands[a] = 0
        self._command_started.clear()
        for a in self._latched:
            self._latched[a] = 0
        self._record(now, EffectKind.REBOOT, self._gen_at, self._generation, self._ceiling,
                     0, None)
        self._revert_volatile(now, count=False)
        self._generation = self._ceiling  # what flash gives at boot: above all shown before
        self._latch(now, 0, None)

    def _revert_volatile(self, now: float, count: bool = True) -> None:
        """At boot, HOLDING registers declared ``persist = false`` are back at their default.
        Loaded from a snapshot (``count``) that held another value for one — flash written
        before volatile registers were saved at their defaults — that is an effective
        configuration change (generation +1); a reboot's generation is the ceiling instead."""
        changed = False
        for spec in (*self.regmap.of_kind(RegisterKind.HOLDING),
                     *self.regmap.of_kind(RegisterKind.COIL)):
            old = self._read_one(spec)
            if not spec.persist and old != spec.default:
                if spec.kind is RegisterKind.COIL:
                    self._coils[spec.address] = spec.default
                else:
                    self._holdings.update(zip(spec.span, spec.words_of(spec.default),
                                              strict=True))
                self._record(now, EffectKind.SET, spec, old, spec.default, 0, None)
                changed = True
        if changed and count:
            self._move_generation(now, 0, None)


__all__ = [
    "DEFAULT_RULES",
    "GENERATION_RESERVE",
    "TRIGGER_TABLE",
    "ConfigSnapshot",
    "DeviceCore",
    "Effect",
    "EffectKind",
    "FaultRule",
    "Persist",
    "PersistError",
    "RegisterAccessError",
    "SnapshotError",
    "TriggerAction",
    "TriggerEvent",
    "start_row",
]
