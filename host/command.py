"""The command model: what a caller asks of a device and what it gets back, free of any I/O.

``Command`` is one request before it is sent (its Modbus function, its PDU, whether it may have an
effect, whether it is harmless to re-issue after a reboot); ``Result`` is its one outcome with the
decoded answer (``answer_of``, ``file_info_of``); ``Reconciliation`` is what a read-back says of an
UNKNOWN command (``judge_read_back``). ``CommandBuilder`` turns register names and values as
people type them into commands, checked against the register map before anything is sent; every
driver (``Device``, ``AsyncDevice``, ``RtuDevice``, ``AsyncRtuDevice``) builds its commands with
it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from idemlink.protocol.modbus import (
    FileInfoRequest,
    FileInfoResponse,
    FunctionCode,
    ReadRegisters,
    Request,
    TriggerRequest,
    TriggerResponse,
    WriteIfGeneration,
    WriteIfGenerationResponse,
    WriteMultipleRegisters,
    WriteSingleRegister,
    decode_read_values,
    decode_request,
    decode_response,
    encode_file_info_request,
    encode_request,
    may_have_effect,
)
from idemlink.protocol.outcome import (
    LocalProtocolError,
    ModbusException,
    Outcome,
    RemoteProtocolError,
    Status,
)
from idemlink.protocol.registers import RegisterKind, RegisterMap, RegisterSpec, TriggerState


class CommandKind(Enum):
    READ = "read"
    WRITE = "write"
    WRITE_IF_GENERATION = "write_if_generation"
    CLEAR_FAULTS = "clear_faults"
    TRIGGER = "trigger"
    TRIGGER_RESET = "trigger_reset"
    FILE_RECEIVE = "file_receive"  #: hand the device's port to a YMODEM receiver for one batch
    FILE_INFO = "file_info"  #: size and CRC-32C of a stored file (read-only)


_FUNCTION_OF_KIND = {
    CommandKind.WRITE_IF_GENERATION: FunctionCode.WRITE_IF_GENERATION,
    CommandKind.TRIGGER: FunctionCode.TRIGGER,
    CommandKind.TRIGGER_RESET: FunctionCode.TRIGGER,
    CommandKind.FILE_RECEIVE: FunctionCode.FILE_RECEIVE,
    CommandKind.FILE_INFO: FunctionCode.FILE_INFO,
}


@dataclass(frozen=True, slots=True)
class Command:
    """One request, before it is sent. Build with the ``Device`` helpers or ``Command.…``."""

    kind: CommandKind
    address: int
    count: int = 1
    values: tuple[int, ...] = ()
    generation: int = 0
    input_registers: bool = False
    name: str = ""  #: FILE_INFO: the stored file's name

    @property
    def function(self) -> FunctionCode:
        """The Modbus function this command travels as."""
        k = self.kind
        if k is CommandKind.READ:
            return (FunctionCode.READ_INPUT_REGISTERS if self.input_registers
                    else FunctionCode.READ_HOLDING_REGISTERS)
        if k is CommandKind.WRITE or k is CommandKind.CLEAR_FAULTS:
            return (FunctionCode.WRITE_SINGLE_REGISTER if len(self.values) == 1
                    else FunctionCode.WRITE_MULTIPLE_REGISTERS)
        return _FUNCTION_OF_KIND[k]

    @property
    def may_have_effect(self) -> bool:
        """Whether running it can change the device's state: an UNKNOWN outcome then blocks the
        handle until reconciled. False for reads (register reads, FILE_INFO) only."""
        return may_have_effect(self.function)

    def request(self) -> Request:
        k = self.kind
        if k is CommandKind.READ:
            return ReadRegisters(self.function, self.address, self.count)
        if k is CommandKind.WRITE or k is CommandKind.CLEAR_FAULTS:
            if len(self.values) == 1:
                return WriteSingleRegister(self.address, self.values[0])
            return WriteMultipleRegisters(self.address, self.values)
        if k is CommandKind.WRITE_IF_GENERATION:
            return WriteIfGeneration(self.generation, self.address, self.values)
        if self.values:  # an explicit trigger value (a value other than 0/1 is refused: 0xFF01)
            return TriggerRequest(self.address, self.values[0])
        return TriggerRequest(self.address, 1 if k is CommandKind.TRIGGER else 0)

    def pdu(self) -> bytes:
        if self.kind is CommandKind.FILE_RECEIVE:  # values=(1,): existing files may be replaced
            return bytes([FunctionCode.FILE_RECEIVE, *self.values])
        if self.kind is CommandKind.FILE_INFO:
            return encode_file_info_request(FileInfoRequest(self.name))
        return encode_request(self.request())

    @property
    def set_only(self) -> bool:
        """Harmless to run again (a read or an absolute write): re-issued after a reboot.
        Triggers, fault clears and conditional writes are not: in flight across a reboot they end
        UNKNOWN."""
        return self.kind is CommandKind.WRITE or not self.may_have_effect


@dataclass(frozen=True, slots=True)
class Result:
    """The one outcome of a command, with its decoded answer."""

    command: Command
    outcome: Outcome
    status: Status | None
    exception: ModbusException | None = None
    values: tuple[int, ...] = ()
    code: int | None = None  #: trigger status code, or the generation after a conditional write
    replay: bool = False
    attempts: int = 0
    reissued: int = 0
    seq: int = 0
    epoch: int = 0
    sent_as: tuple[tuple[int, int], ...] = ()  #: every (epoch, seq) it travelled under
    file: FileInfoResponse | None = None  #: FILE_INFO: the decoded answer (OK outcome only)
    answered: bool = False  #: the device answered it with a PDU (it ran, now or before: replay)
    #: what the status alone does not say, e.g. ``wrote 0x0001, echo 0x0004`` (ANSWER_MISMATCH)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def describe(self) -> str:
        """``UNKNOWN (NO_ANSWER)``, ``UNKNOWN (ANSWER_MISMATCH: wrote 0x0001, echo 0x0004)``,
        ``REJECTED (Modbus exception ILLEGAL_DATA_VALUE)``, ``OK (replayed answer)``..."""
        if self.exception is not None:
            why = f"Modbus exception {self.exception.name}"
        elif self.status is not None and self.status is not Status.OK:
            why = self.status.name
        else:
            why = ""
        if self.detail:
            why = f"{why}: {self.detail}" if why else self.detail
        if why:
            return f"{self.outcome.name} ({why})"
        return self.outcome.name + (" (replayed answer)" if self.replay else "")


@dataclass(frozen=True, slots=True)
class SentRequest:
    """What a journal keeps of a request before it leaves: its PDU and the (epoch, seq) it
    travels under (None for a plain Modbus slave, which numbers nothing)."""

    pdu: bytes
    number: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What ``reconcile()`` read back for the command that ended UNKNOWN."""

    command: Command
    observed: dict[str, int]
    intended_state_holds: bool | None  #: what holds *now*; None: cannot be decided from the state
    summary: str
    #: did the command run, by the device's own evidence (``idemlink.host.evidence``): True (it
    #: ran, before or now on the re-send), False (the device proves it never ran), None (unknown;
    #: a state that holds is never taken for "it ran")
    executed: bool | None = None
    evidence: str = ""  #: how ``executed`` was settled, or why it could not be
    resent: Result | None = None  #: the re-send under the command's own number, if one was made

    def describe(self) -> str:
        """One line: what holds now, then whether it ran and why."""
        ran = {True: "it ran", False: "it did not run", None: "whether it ran is unknown"}
        return f"{self.summary}; {ran[self.executed]} ({self.evidence or 'no evidence'})"


def answer_of(cmd: Command, pdu: bytes) -> tuple[tuple[int, ...], int | None]:
    """The values (reads) and code (trigger status; generation after a conditional write,
    also when its guard failed) that a Result carries for the answer ``pdu`` to ``cmd``, decoded
    by ``idemlink.protocol.modbus`` (``decode_read_values`` for a read, the hot path;
    ``decode_response`` otherwise). Never raises: an exception answer, an answer of another
    shape, or a malformed one (only a faulty device sends one; the CRC rules out the line)
    carries neither."""
    k = cmd.kind
    try:
        if k is CommandKind.READ:
            values = decode_read_values(pdu)
            return (values, None) if len(values) == cmd.count else ((), None)
        if not pdu:
            return (), None
        resp = decode_response(pdu)
    except RemoteProtocolError:
        return (), None
    if isinstance(resp, TriggerResponse):
        if k is CommandKind.TRIGGER or k is CommandKind.TRIGGER_RESET:
            return (), resp.code
    elif isinstance(resp, WriteIfGenerationResponse) and k is CommandKind.WRITE_IF_GENERATION:
        return (), resp.generation
    return (), None


def file_info_of(cmd: Command, pdu: bytes) -> FileInfoResponse | None:
    """The decoded FILE_INFO answer ``pdu`` to ``cmd`` (None for another command, an exception
    or a malformed answer; never raises)."""
    if cmd.kind is not CommandKind.FILE_INFO:
        return None
    try:
        resp = decode_response(pdu)
    except RemoteProtocolError:
        return None
    return resp if isinstance(resp, FileInfoResponse) else None


class CommandBuilder:
    """Commands from register names (or addresses) and values as people type them, checked
    against ``regmap`` before anything is sent (``LocalProtocolError`` naming the register)."""

    def __init__(self, regmap: RegisterMap) -> None:
        self.regmap = regmap

    def spec(self, register: str | int) -> RegisterSpec:
        """A register by name or address; ``LocalProtocolError`` if unknown."""
        spec = self.regmap.at(register) if isinstance(register, int) else None
        if spec is None and isinstance(register, str):
            try:
                spec = self.regmap.named(register)
            except (KeyError, ValueError, LookupError):
                spec = None
        if spec is None:
            raise LocalProtocolError(f"no register {register!r} in the map")
        return spec

    def read_command(self, register: str | int, count: int = 1) -> Command:
        spec = self.spec(register)
        return Command(CommandKind.READ, spec.address, count,
                       input_registers=spec.kind is RegisterKind.INPUT)

    def write_command(self, values: Mapping[str | int, int | str]) -> Command:
        """An absolute (set-only, re-issued after a reboot) write. Fault words and triggers are
        refused: a W1C clear or a trigger start is not harmless to repeat in a new boot epoch;
        use ``clear_faults()`` / ``trigger()``."""
        for key in values:
            spec = self.spec(key)
            if spec.kind in (RegisterKind.FAULT, RegisterKind.TRIGGER):
                use = "clear_faults()" if spec.kind is RegisterKind.FAULT else "trigger()"
                raise LocalProtocolError(
                    f"{spec.name} is a {spec.kind.name} register, not a set-only value: use {use}")
        return Command(CommandKind.WRITE, *self._contiguous(values))

    def _contiguous(self, values: Mapping[str | int, int | str]) -> tuple[int, int, tuple[int, ...]]:
        """``(first address, count, raw values)`` of a write. A value is a raw integer (0..65535)
        or text as people type it (``"42.5"`` in the register's unit, a label, ``"raw:425"``:
        ``RegisterSpec.raw_from_text``); anything else is a ``LocalProtocolError`` naming the
        register, raised before anything is sent."""
        if not values:
            raise LocalProtocolError("nothing to write")
        pairs: list[tuple[RegisterSpec, int]] = []
        for key, value in values.items():
            spec = self.spec(key)
            if isinstance(value, str):
                try:
                    value = spec.raw_from_text(value)
                except ValueError as exc:
                    raise LocalProtocolError(str(exc)) from None
            elif isinstance(value, bool) or not isinstance(value, int):
                raise LocalProtocolError(
                    f"{spec.name}={value!r}: give a raw integer or text such as \"42.5\" or a "
                    "label")
            if not 0 <= value <= 0xFFFF:
                raise LocalProtocolError(f"{spec.name}={value}: a register holds 0..65535")
            pairs.append((spec, value))
        pairs.sort(key=lambda sv: sv[0].address)
        first = pairs[0][0].address
        if [s.address for s, _ in pairs] != list(range(first, first + len(pairs))):
            raise LocalProtocolError(
                "a multi-register write must cover contiguous addresses (it is applied "
                "atomically): " + ", ".join(f"{s.name}@0x{s.address:04X}" for s, _ in pairs)
                + "; write them in separate calls or through run()")
        return first, len(pairs), tuple(v for _, v in pairs)

    def write_if_generation_command(self, generation: int,
                                    values: Mapping[str | int, int | str]) -> Command:
        addr, count, vals = self._contiguous(values)
        return Command(CommandKind.WRITE_IF_GENERATION, addr, count, vals, generation=generation)

    def clear_faults_command(self, mask: int, register: str | int | None = None) -> Command:
        spec = self.register_of_kind(RegisterKind.FAULT, register)
        return Command(CommandKind.CLEAR_FAULTS, spec.address, 1, (mask,))

    def trigger_command(self, register: str | int | None = None, *, reset: bool = False) -> Command:
        kind = CommandKind.TRIGGER_RESET if reset else CommandKind.TRIGGER
        return Command(kind, self.register_of_kind(RegisterKind.TRIGGER, register).address)

    def trigger_status_command(self, register: str | int | None = None) -> Command:
        return self.read_command(self.register_of_kind(RegisterKind.TRIGGER, register).name)

    def file_info_command(self, name: str) -> Command:
        """FILE_INFO for ``name``; ``ValueError`` for a name the device would refuse."""
        cmd = Command(CommandKind.FILE_INFO, 0, name=name)
        cmd.pdu()  # ValueError for a name YMODEM's receiver would refuse
        return cmd

    def command_of_pdu(self, pdu: bytes) -> Command:
        """The ``Command`` whose ``pdu()`` is ``pdu`` (a journaled request, re-sent byte for
        byte): a write to a fault register is a clear, a trigger request of 0 a reset.
        ``LocalProtocolError`` for bytes that are no register request of this map."""
        try:
            req = decode_request(pdu)
        except RemoteProtocolError as exc:
            raise LocalProtocolError(f"not a request this host sends: {exc}") from None
        if isinstance(req, ReadRegisters):
            return Command(CommandKind.READ, req.address, req.count,
                           input_registers=req.function == FunctionCode.READ_INPUT_REGISTERS)
        if isinstance(req, WriteIfGeneration):
            return Command(CommandKind.WRITE_IF_GENERATION, req.address, len(req.values),
                           req.values, generation=req.generation)
        if isinstance(req, TriggerRequest):
            kind = {1: CommandKind.TRIGGER, 0: CommandKind.TRIGGER_RESET}.get(req.value)
            if kind is None:
                return Command(CommandKind.TRIGGER, req.address, values=(req.value,))
            return Command(kind, req.address)
        values = (req.value,) if isinstance(req, WriteSingleRegister) else req.values
        spec = self.regmap.at(req.address)
        kind = (CommandKind.CLEAR_FAULTS if spec is not None and spec.kind is RegisterKind.FAULT
                and len(values) == 1 else CommandKind.WRITE)
        return Command(kind, req.address, len(values), values)

    def register_of_kind(self, kind: RegisterKind, register: str | int | None) -> RegisterSpec:
        """``register``'s spec, or the map's only register of ``kind`` (``ValueError`` naming
        the choices when the map has several or none)."""
        if register is not None:
            return self.spec(register)
        specs = self.regmap.of_kind(kind)
        if len(specs) != 1:
            names = ", ".join(s.name for s in specs) or "none"
            raise ValueError(f"the map {self.regmap.name} has {len(specs)} {kind.name.lower()} "
                             f"registers ({names}): name one")
        return specs[0]



class BlockingCommands(CommandBuilder):
    """The named commands of a blocking driver, each one ``execute`` of its builder's command:
    the one place ``Device`` and ``RtuDevice`` spell them (a driver that cannot carry one
    overrides it with a refusal)."""

    def execute(self, command: Command) -> Result:
        raise NotImplementedError

    def read(self, register: str | int, count: int = 1) -> Result:
        return self.execute(self.read_command(register, count))

    def write(self, values: Mapping[str | int, int | str]) -> Result:
        """Set absolute values (FC06 for one register, FC16 for several contiguous ones); values
        as in ``write_command`` (raw integers, or text in the register's unit or a label)."""
        return self.execute(self.write_command(values))

    def write_if_generation(self, generation: int, values: Mapping[str | int, int | str]) -> Result:
        return self.execute(self.write_if_generation_command(generation, values))

    def clear_faults(self, mask: int, register: str | int | None = None) -> Result:
        """Write 1s to clear the bits of ``mask`` in a fault word (the map's only one when
        ``register`` is None); sent once."""
        return self.execute(self.clear_faults_command(mask, register))

    def trigger(self, register: str | int | None = None) -> Result:
        """Start a trigger's action once (the map's only trigger when ``register`` is None)."""
        return self.execute(self.trigger_command(register))

    def trigger_reset(self, register: str | int | None = None) -> Result:
        return self.execute(self.trigger_command(register, reset=True))

    def trigger_status(self, register: str | int | None = None) -> Result:
        return self.execute(self.trigger_status_command(register))


def read_back_of(c: Command, generation_address: int) -> Reconciliation | list[Command]:
    """What reconciling ``c`` takes: a verdict that needs no read (a read has no effect; a file
    hand-over leaves no register state), or the reads that decide it — what ``c`` touched, and
    the generation counter at ``generation_address`` — for ``judge_read_back``."""
    if not c.may_have_effect:
        return Reconciliation(c, {}, True, f"a {c.kind.value} has no effect to reconcile")
    if c.kind is CommandKind.FILE_RECEIVE:
        return Reconciliation(c, {}, None, "a file hand-over leaves no register state")
    span = max(c.count, len(c.values), 1)
    return [Command(CommandKind.READ, c.address, span),
            Command(CommandKind.READ, generation_address, 1)]


def judge_read_back(
    c: Command, values: tuple[int, ...], generation: int,
    spec: Callable[[int], RegisterSpec],
) -> Reconciliation:
    """Does the state a command intended hold, given what was read back?"""
    observed = {spec(c.address + i).name: v for i, v in enumerate(values)}
    observed["generation"] = generation
    if c.kind is CommandKind.TRIGGER or c.kind is CommandKind.TRIGGER_RESET:
        written = c.values or ((1,) if c.kind is CommandKind.TRIGGER else (0,))
    else:
        written = c.values
    holds = all(register_holds(spec(c.address + i).kind, w, v)
                for i, (w, v) in enumerate(zip(written, values, strict=False)))
    kinds = {spec(c.address + i).kind for i in range(len(written))}
    if kinds == {RegisterKind.TRIGGER}:
        state = values[0]
        summary = "trigger state " + (TriggerState(state).name if state in set(TriggerState)
                                      else f"{state:#06x}")
    elif kinds == {RegisterKind.FAULT}:
        summary = "the bits are clear" if holds else "some bits are still latched"
    else:
        summary = ("the registers hold the intended values" if holds
                   else "the registers do not hold the intended values")
    return Reconciliation(c, observed, holds, summary)


def register_holds(kind: RegisterKind, written: int, now: int) -> bool:
    """Does a register read back as ``now`` hold what writing ``written`` intended? By kind:
    a holding holds the value; a fault has the written bits clear; a trigger written 1 is
    RUNNING or DONE (not IDLE, not an abnormal state), written 0 is IDLE; a trigger value other
    than 0/1 was refused and intends nothing that can hold."""
    if kind is RegisterKind.FAULT:
        return now & written == 0
    if kind is RegisterKind.TRIGGER:
        if written == 1:
            return now in (TriggerState.RUNNING, TriggerState.DONE)
        return written == 0 and now == TriggerState.IDLE
    return now == written


__all__ = [
    "BlockingCommands",
    "Command",
    "CommandBuilder",
    "CommandKind",
    "Reconciliation",
    "Result",
    "SentRequest",
    "answer_of",
    "file_info_of",
    "judge_read_back",
    "read_back_of",
    "register_holds",
]
