"""The command model: what a caller asks of a device and what it gets back, free of any I/O.

``Command`` is one request before it is sent (its Modbus function, its PDU, whether it may have an
effect, whether it is harmless to re-issue after a reboot); ``Result`` is its one outcome with the
decoded answer (``answer_of``, ``file_info_of``); ``Reconciliation`` is what a read-back says of an
UNKNOWN command (``judge_read_back``: exactly what the command touched, and the generation when
the map has one). ``CommandBuilder`` turns register names and values as people type them into
commands, checked against the register map before anything is sent (a typed value into all its
words, bit fields into one mask write, coils into FC05/FC15; ``atomic_writes`` groups values into
such writes, ``read_runs`` names into reads), and types what a read got back (``decode``); every
driver (``Device``, ``AsyncDevice``, ``RtuDevice``, ``AsyncRtuDevice``) builds its commands
with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from idemlink.protocol.datatypes import DataType
from idemlink.protocol.modbus import (
    EXCEPTION_NAMES,
    MAX_READ_BITS,
    MAX_READ_COUNT,
    FileInfoRequest,
    FileInfoResponse,
    FunctionCode,
    MaskWriteRegister,
    ReadBits,
    ReadBitsResponse,
    ReadRegisters,
    Request,
    StandardFunction,
    TriggerRequest,
    TriggerResponse,
    WriteIfGeneration,
    WriteIfGenerationResponse,
    WriteMultipleCoils,
    WriteMultipleRegisters,
    WriteSingleCoil,
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
from idemlink.protocol.registers import (
    BIT_KINDS,
    RegisterKind,
    RegisterMap,
    RegisterSpec,
    Space,
    TriggerState,
)


class CommandKind(Enum):
    READ = "read"
    WRITE = "write"
    MASK_WRITE = "mask_write"  #: FC22: set some bits of one register, the others untouched
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
    """One request, before it is sent. Build with the ``Device`` helpers or ``Command.…``.

    ``bits``: a READ or WRITE of coils (FC01, FC05/FC15; with ``input_registers``, a READ of
    discrete inputs, FC02) instead of registers. A MASK_WRITE (FC22) sets the bits of one
    register that ``and_mask`` clears to those of ``values[0]`` (the OR mask)."""

    kind: CommandKind
    address: int
    count: int = 1
    values: tuple[int, ...] = ()
    generation: int = 0
    input_registers: bool = False
    name: str = ""  #: FILE_INFO: the stored file's name
    bits: bool = False
    and_mask: int = 0xFFFF  #: MASK_WRITE: the bits kept (0s are set from the OR mask)

    @property
    def function(self) -> FunctionCode | StandardFunction:
        """The Modbus function this command travels as."""
        k = self.kind
        if k is CommandKind.READ:
            if self.bits:
                return (StandardFunction.READ_DISCRETE_INPUTS if self.input_registers
                        else StandardFunction.READ_COILS)
            return (FunctionCode.READ_INPUT_REGISTERS if self.input_registers
                    else FunctionCode.READ_HOLDING_REGISTERS)
        if k is CommandKind.WRITE and self.bits:
            return (StandardFunction.WRITE_SINGLE_COIL if len(self.values) == 1
                    else StandardFunction.WRITE_MULTIPLE_COILS)
        if k is CommandKind.WRITE or k is CommandKind.CLEAR_FAULTS:
            return (FunctionCode.WRITE_SINGLE_REGISTER if len(self.values) == 1
                    else FunctionCode.WRITE_MULTIPLE_REGISTERS)
        if k is CommandKind.MASK_WRITE:
            return StandardFunction.MASK_WRITE_REGISTER
        return _FUNCTION_OF_KIND[k]

    @property
    def space(self) -> Space:
        """The address space its address is in (registers, coils, discrete inputs)."""
        if not self.bits:
            return Space.REGISTERS
        return Space.DISCRETE_INPUTS if self.input_registers else Space.COILS

    @property
    def may_have_effect(self) -> bool:
        """Whether running it can change the device's state: an UNKNOWN outcome then blocks the
        handle until reconciled. False for reads (register reads, FILE_INFO) only."""
        return may_have_effect(self.function)

    def request(self) -> Request:
        k = self.kind
        if k is CommandKind.READ and self.bits:
            return ReadBits(StandardFunction(self.function), self.address, self.count)
        if k is CommandKind.READ:
            return ReadRegisters(FunctionCode(self.function), self.address, self.count)
        if k is CommandKind.WRITE and self.bits:
            if len(self.values) == 1:
                return WriteSingleCoil(self.address, self.values[0])
            return WriteMultipleCoils(self.address, self.values)
        if k is CommandKind.MASK_WRITE:
            return MaskWriteRegister(self.address, self.and_mask, self.values[0])
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
        UNKNOWN. A mask write sets its bits to absolute values: set-only too."""
        return (self.kind is CommandKind.WRITE or self.kind is CommandKind.MASK_WRITE
                or not self.may_have_effect)


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
    #: the exception code as the device (or a gateway) sent it: 01-04 (``exception``) or any
    #: other (06 SERVER_DEVICE_BUSY, 0x0A, 0x0B ...: ``exception`` is None, ``detail`` names it)
    exception_code: int | None = None

    @property
    def exception_name(self) -> str | None:
        """The exception's name as the Modbus spec gives it (``SERVER_DEVICE_BUSY``), its
        number for a code the spec does not define (``0x42``), None without an exception."""
        if self.exception is not None:
            return self.exception.name
        if self.exception_code is None:
            return None
        return EXCEPTION_NAMES.get(self.exception_code, f"0x{self.exception_code:02X}")

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
    #: each register of ``observed`` as the map shows it (``-5``, ``2.5 m3/h``, ``quiet``): what
    #: a person reads; ``observed`` keeps the raw values
    shown: dict[str, str] = field(default_factory=dict)

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
        if k is CommandKind.READ and cmd.bits:
            resp = decode_response(pdu) if pdu else None
            if isinstance(resp, ReadBitsResponse) and len(resp.values) >= cmd.count:
                return resp.values[: cmd.count], None
            return (), None
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


Value = int | float | str
"""A typed value as ``CommandBuilder.decode`` gives it (``RegisterSpec.value``): a number in the
register's unit, or a string register's text."""


def raw_in(spec: RegisterSpec, command: Command, values: tuple[int, ...]) -> int | None:
    """The raw value of ``spec`` in what ``command`` (a read) got back, or None when the read
    did not cover all of it (another table, or only some of its registers)."""
    if spec.space is not command.space:
        return None
    at = spec.address - command.address
    if at < 0 or at + spec.words > len(values):
        return None
    return spec.raw_from_words(values[at:at + spec.words])


def _table(spec: RegisterSpec) -> tuple[Space, bool]:
    """What reads ``spec``: its space, and whether by the input function (FC04, FC02)."""
    return spec.space, spec.kind in (RegisterKind.INPUT, RegisterKind.DISCRETE_INPUT)


def read_runs(specs: Sequence[RegisterSpec], limit: int = MAX_READ_COUNT,
              bit_limit: int = MAX_READ_BITS) -> list[list[RegisterSpec]]:
    """``specs`` grouped into reads: each group one run of contiguous (or shared: a bit field
    and its register) addresses of one table (input registers apart from the others, as FC04
    and FC03 are; coils; discrete inputs), in address order, at most ``limit`` registers
    (``bit_limit`` bits) a read. ``CommandBuilder.read_covering`` makes a group's read."""
    order = {Space.REGISTERS: 0, Space.COILS: 1, Space.DISCRETE_INPUTS: 2}
    out: list[list[RegisterSpec]] = []
    start = end = 0
    for spec in sorted(dict.fromkeys(specs), key=lambda s: (order[s.space], s.address,
                                                            -s.words)):
        most = bit_limit if spec.space is not Space.REGISTERS else limit
        run = out[-1] if out else None
        if (run is not None and _table(run[-1]) == _table(spec) and spec.address <= end
                and max(end, spec.address + spec.words) - start <= most):
            run.append(spec)
            end = max(end, spec.address + spec.words)
        else:
            out.append([spec])
            start, end = spec.address, spec.address + spec.words
    return out


def refuse_assigned_twice(specs: Sequence[RegisterSpec]) -> None:
    """``LocalProtocolError`` when one write gives a register whole and by one of its bit
    fields: whichever went second would undo the other (the field's value lost)."""
    wholes = {s.name for s in specs if s.field is None and s.space is Space.REGISTERS}
    for s in specs:
        if s.field is not None and s.parent in wholes:
            raise LocalProtocolError(
                f"{s.parent} assigned twice: whole and by its field {s.name} (one write would "
                f"undo the other); give {s.parent} or its fields, not both")


def atomic_writes(pairs: Sequence[tuple[RegisterSpec, int]],
                  ) -> list[list[tuple[RegisterSpec, int]]]:
    """(register, raw value) pairs grouped into the writes that carry them, each atomic on the
    device: registers at contiguous addresses (all the words of each) in one FC06/FC16, coils
    at contiguous addresses in one FC05/FC15, the bit fields of one register in one mask write
    (FC22). In address order; ``CommandBuilder.write_command`` makes each group's command.
    A register given whole and by one of its bit fields in the same write is assigned twice
    (``LocalProtocolError``): as two writes, one would undo the other."""
    refuse_assigned_twice([s for s, _ in pairs])
    groups: list[list[tuple[RegisterSpec, int]]] = []
    fields: dict[str, list[tuple[RegisterSpec, int]]] = {}
    for spec, raw in sorted(pairs, key=lambda p: (p[0].space is not Space.REGISTERS,
                                                  p[0].address)):
        if spec.field is not None:
            if spec.parent not in fields:
                fields[spec.parent] = []
                groups.append(fields[spec.parent])
            fields[spec.parent].append((spec, raw))
            continue
        last = groups[-1] if groups else None
        if (last is not None and last[-1][0].field is None
                and last[-1][0].space is spec.space
                and last[-1][0].address + last[-1][0].words == spec.address):
            last.append((spec, raw))
        else:
            groups.append([(spec, raw)])
    return groups


def _word_error(spec: RegisterSpec, value: int) -> str:
    if spec.dtype is DataType.U16 and spec.field is None and spec.kind not in BIT_KINDS:
        return f"{spec.name}={value}: a register holds 0..65535"
    if spec.kind in BIT_KINDS:
        return f"{spec.name}={value}: a bit is 0 or 1"
    if spec.field is not None:
        return f"{spec.name}={value}: the field holds 0..{spec.raw_max}"
    return (f"{spec.name}={value}: a raw {spec.dtype.value} is 0..{spec.raw_max} (give a value "
            "in the unit as text, e.g. \"-5.0\")")


class CommandBuilder:
    """Commands from register names (or addresses) and values as people type them, checked
    against ``regmap`` before anything is sent (``LocalProtocolError`` naming the register)."""

    def __init__(self, regmap: RegisterMap) -> None:
        self.regmap = regmap

    def spec(self, register: str | int) -> RegisterSpec:
        """A register (coil, discrete input, bit field) by name, or a register by its first
        address (``RegisterMap.addressed``: a later word of a multi-register value is refused);
        ``LocalProtocolError`` if unknown."""
        spec = self.regmap.addressed(register) if isinstance(register, int) else None
        if spec is None and isinstance(register, str):
            try:
                spec = self.regmap.named(register)
            except (KeyError, ValueError, LookupError):
                spec = None
        if spec is None:
            raise LocalProtocolError(f"no register {register!r} in the map")
        return spec

    def read_covering(self, specs: Sequence[RegisterSpec]) -> Command:
        """One read of everything ``specs`` take (one table: a group of ``read_runs``), from the
        first address to the last; ``raw_in`` takes each one's value out of its result."""
        first = min(s.address for s in specs)
        end = max(s.address + s.words for s in specs)
        space, inputs = _table(specs[0])
        return Command(CommandKind.READ, first, end - first, input_registers=inputs,
                       bits=space is not Space.REGISTERS)

    def read_command(self, register: str | int, count: int | None = None) -> Command:
        """A read from ``register`` of ``count`` registers (default: all of its own: 2 for a
        u32; a bit field reads its register; a coil or discrete input reads bits)."""
        spec = self.spec(register)
        return Command(CommandKind.READ, spec.address, spec.words if count is None else count,
                       input_registers=spec.kind in (RegisterKind.INPUT,
                                                     RegisterKind.DISCRETE_INPUT),
                       bits=spec.kind in BIT_KINDS)

    def write_command(self, values: Mapping[str | int, int | str]) -> Command:
        """An absolute (set-only, re-issued after a reboot) write: registers at contiguous
        addresses in one atomic FC06/FC16 (a value of several registers, a u32 say, as all of
        its words), coils at contiguous addresses in one FC05/FC15, or bit fields of one register
        in one mask write (FC22, when the map says the device takes it: ``mask_write``).
        Fault words and triggers are refused: a W1C clear or a trigger start is not harmless to
        repeat in a new boot epoch; use ``clear_faults()`` / ``trigger()``. A plain device's
        COMMAND register may be written (command N of several): the write is sent once, never
        retried or re-issued (``reissuable``, ``rtu_master.retry_allowed``); ``trigger()``
        starts it the safe way (read first)."""
        specs = [self.spec(key) for key in values]
        refuse_assigned_twice(specs)
        for spec in specs:
            if spec.kind in (RegisterKind.FAULT, RegisterKind.TRIGGER):
                use = "clear_faults()" if spec.kind is RegisterKind.FAULT else "trigger()"
                raise LocalProtocolError(
                    f"{spec.name} is a {spec.kind.name} register, not a set-only value: use {use}")
            if spec.dtype is DataType.STRING:
                raise LocalProtocolError(f"{spec.name} is a read-only string register")
        fields = [s for s in specs if s.field is not None]
        if fields:
            return self._mask_command(specs, values)
        if any(s.kind in BIT_KINDS for s in specs):
            for s in specs:
                if s.kind is RegisterKind.DISCRETE_INPUT:
                    raise LocalProtocolError(f"{s.name} is a read-only discrete input (FC02): "
                                             "nothing writes it")
            if not all(s.kind is RegisterKind.COIL for s in specs):
                raise LocalProtocolError(
                    "coils are written apart from registers (another Modbus table): "
                    + ", ".join(s.name for s in specs))
            first, count, raws = self._contiguous(values)
            return Command(CommandKind.WRITE, first, count, raws, bits=True)
        return Command(CommandKind.WRITE, *self._contiguous(values))

    def _mask_command(self, specs: list[RegisterSpec],
                      values: Mapping[str | int, int | str]) -> Command:
        """One mask write (FC22) setting bit fields of one register, the other bits untouched."""
        parents = {s.parent or s.name for s in specs}
        if len(parents) != 1 or any(s.field is None for s in specs):
            raise LocalProtocolError(
                "bit fields are written by a mask write of their one register, alone: "
                + ", ".join(s.name for s in specs) + "; write them in separate calls")
        register = self.spec(parents.pop())
        if not register.writable or register.kind is not RegisterKind.HOLDING:
            raise LocalProtocolError(f"{specs[0].name} is a field of the read-only "
                                     f"{register.kind.name} register {register.name}")
        if not self.regmap.mask_write:
            raise LocalProtocolError(
                f"{specs[0].name} is a bit field of {register.name}: writing it alone needs a "
                "mask write (FC22), which this map does not say the device takes (mask_write = "
                f"true): write all of {register.name} instead; nothing was sent")
        and_mask, or_mask = 0xFFFF, 0
        for spec, value in zip(specs, values.values(), strict=True):
            raw = self._raw(spec, value)
            assert spec.field is not None
            and_mask &= ~spec.field.mask & 0xFFFF
            or_mask |= raw << spec.field.bit
        return Command(CommandKind.MASK_WRITE, register.address, 1, (or_mask,), and_mask=and_mask)

    def _raw(self, spec: RegisterSpec, value: int | str) -> int:
        """The raw value of one value as given: a raw integer, or text as people type it
        (``RegisterSpec.raw_from_text``)."""
        if isinstance(value, str):
            try:
                return spec.raw_from_text(value)
            except ValueError as exc:
                raise LocalProtocolError(str(exc)) from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise LocalProtocolError(
                f"{spec.name}={value!r}: give a raw integer or text such as \"42.5\" or a "
                "label")
        if not 0 <= value <= spec.raw_max:
            raise LocalProtocolError(_word_error(spec, value))
        return value

    def _contiguous(self, values: Mapping[str | int, int | str]) -> tuple[int, int, tuple[int, ...]]:
        """``(first address, count, words)`` of a write. A value is a raw integer (0..65535 for a
        u16; a value of several registers: the integer its words make, most significant first)
        or text as people type it (``"42.5"`` in the register's unit, a label, ``"raw:425"``:
        ``RegisterSpec.raw_from_text``); anything else is a ``LocalProtocolError`` naming the
        register, raised before anything is sent."""
        if not values:
            raise LocalProtocolError("nothing to write")
        pairs: list[tuple[RegisterSpec, int]] = []
        for key, value in values.items():
            spec = self.spec(key)
            pairs.append((spec, self._raw(spec, value)))
        pairs.sort(key=lambda sv: sv[0].address)
        first = pairs[0][0].address
        words: list[int] = []
        for spec, raw in pairs:
            if spec.address != first + len(words):
                raise LocalProtocolError(
                    "a multi-register write must cover contiguous addresses (it is applied "
                    "atomically): " + ", ".join(f"{s.name}@0x{s.address:04X}" for s, _ in pairs)
                    + "; write them in separate calls or through run()")
            words += spec.words_of(raw)
        return first, len(words), tuple(words)

    def write_if_generation_command(self, generation: int,
                                    values: Mapping[str | int, int | str]) -> Command:
        """The conditional write (function 0x41) of registers at contiguous addresses. Refused
        before anything is sent when the map has no generation register (nothing to compare
        with) or names a coil or a bit field (0x41 carries whole registers)."""
        if self.regmap.generation is None:
            raise LocalProtocolError(
                f"the map {self.regmap.name} has no generation register: a conditional write has "
                "no generation to compare with; nothing was sent")
        for key in values:
            spec = self.spec(key)
            if spec.field is not None or spec.kind in BIT_KINDS:
                raise LocalProtocolError(f"{spec.name}: a conditional write carries whole "
                                         "registers, not a coil or a bit field")
        addr, count, vals = self._contiguous(values)
        return Command(CommandKind.WRITE_IF_GENERATION, addr, count, vals, generation=generation)

    def decode(self, result: Result) -> dict[str, Value]:
        """The typed values a read got back, by name: every register (coil, discrete input) the
        read covered whole, in its unit (``RegisterSpec.value``: ``-5.0`` for an i16 at scale 0.1,
        a float for an f32, a string register's text), and the bit fields of those registers.
        ``Result.values`` keeps the raw words; an unanswered read decodes to nothing."""
        c = result.command
        if c.kind is not CommandKind.READ or not result.values:
            return {}
        out: dict[str, Value] = {}
        for spec in self.regmap:
            raw = raw_in(spec, c, result.values)
            if raw is None:
                continue
            out[spec.name] = spec.value(raw)
            for name, v in spec.field_values(raw).items():
                out[name] = v
        return out

    def clear_faults_command(self, mask: int, register: str | int | None = None) -> Command:
        spec = self.register_of_kind(RegisterKind.FAULT, register)
        return Command(CommandKind.CLEAR_FAULTS, spec.address, 1, (mask,))

    def trigger_command(self, register: str | int | None = None, *, reset: bool = False) -> Command:
        """Start (``reset``: reset) a TRIGGER register, or a plain device's COMMAND register (its
        state read first, 1 written only when it reads 0: ``device_core.start_row``); without
        ``register``, the map's only trigger (else its only command register)."""
        kind = CommandKind.TRIGGER_RESET if reset else CommandKind.TRIGGER
        of = (RegisterKind.COMMAND if register is None and not self.regmap.of_kind(
            RegisterKind.TRIGGER) and self.regmap.of_kind(RegisterKind.COMMAND)
            else RegisterKind.TRIGGER)
        return Command(kind, self.register_of_kind(of, register).address)

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
        if isinstance(req, ReadBits):
            return Command(CommandKind.READ, req.address, req.count, bits=True, input_registers=(
                req.function is StandardFunction.READ_DISCRETE_INPUTS))
        if isinstance(req, WriteSingleCoil | WriteMultipleCoils):
            coils = (req.value,) if isinstance(req, WriteSingleCoil) else req.values
            return Command(CommandKind.WRITE, req.address, len(coils), coils, bits=True)
        if isinstance(req, MaskWriteRegister):
            return Command(CommandKind.MASK_WRITE, req.address, 1, (req.or_mask,),
                           and_mask=req.and_mask)
        values = (req.value,) if isinstance(req, WriteSingleRegister) else req.values
        spec = self.regmap.at(req.address)
        kind = (CommandKind.CLEAR_FAULTS if spec is not None and spec.kind is RegisterKind.FAULT
                and len(values) == 1 else CommandKind.WRITE)
        return Command(kind, req.address, len(values), values)

    def named_values(self, command: Command) -> dict[str, int]:
        """The raw value of each register a register write covers, by name, in address order —
        ``write_command`` of it is ``command`` again (a gateway writes by name).
        ``LocalProtocolError`` when an address of it starts no register of the map."""
        out: dict[str, int] = {}
        at = 0
        while at < len(command.values):
            spec = self.regmap.at(command.address + at)
            if spec is None or spec.address != command.address + at or command.bits:
                raise LocalProtocolError(f"address {command.address + at} starts no register of "
                                         f"the map {self.regmap.name}")
            out[spec.name] = spec.raw_from_words(command.values[at:at + spec.words])
            at += spec.words
        return out

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

    def read(self, register: str | int, count: int | None = None) -> Result:
        """Read ``register`` (``count`` registers; default: all of its own). ``Result.values``
        are the raw words; ``decode(result)`` gives them typed, by name."""
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


def read_back_of(c: Command, generation_address: int | None) -> Reconciliation | list[Command]:
    """What reconciling ``c`` takes: a verdict that needs no read (a read has no effect; a file
    hand-over leaves no register state), or the reads that decide it — exactly what ``c``
    touched, and the generation counter at ``generation_address`` when the map has one — for
    ``judge_read_back``."""
    if not c.may_have_effect:
        return Reconciliation(c, {}, True, f"a {c.kind.value} has no effect to reconcile")
    if c.kind is CommandKind.FILE_RECEIVE:
        return Reconciliation(c, {}, None, "a file hand-over leaves no register state")
    span = 1 if c.kind is CommandKind.MASK_WRITE else max(c.count, len(c.values), 1)
    reads = [Command(CommandKind.READ, c.address, span, bits=c.bits)]
    if generation_address is not None:
        reads.append(Command(CommandKind.READ, generation_address, 1))
    return reads


def judge_read_back(
    c: Command, values: tuple[int, ...], generation: int | None,
    spec: Callable[[int], RegisterSpec],
) -> Reconciliation:
    """Does the state a command intended hold, given what was read back (and the generation,
    None when the map has none)? ``spec`` finds what the map declares at an address of the
    command's table."""
    observed: dict[str, int] = {}
    shown: dict[str, str] = {}
    for i in range(len(values)):
        s = spec(c.address + i)
        at = s.address - c.address
        if s.name not in observed and at >= 0 and at + s.words <= len(values):
            observed[s.name] = s.raw_from_words(values[at:at + s.words])
            shown[s.name] = s.show(observed[s.name])
    if generation is not None:
        observed["generation"] = generation
    if c.kind is CommandKind.TRIGGER or c.kind is CommandKind.TRIGGER_RESET:
        written = c.values or ((1,) if c.kind is CommandKind.TRIGGER else (0,))
    elif c.kind is CommandKind.MASK_WRITE:
        keep = c.and_mask
        written = c.values
    else:
        written = c.values
    if c.kind is CommandKind.MASK_WRITE:
        holds = bool(values) and values[0] & ~keep & 0xFFFF == written[0] & ~keep & 0xFFFF
    else:
        holds = all(register_holds(spec(c.address + i).kind, w, v)
                    for i, (w, v) in enumerate(zip(written, values, strict=False)))
    kinds = {spec(c.address + i).kind for i in range(len(written))}
    if kinds == {RegisterKind.COMMAND} and values and written[0] and values[0] != written[0]:
        # a command register returns to 0 when done: 0 (or another command) cannot say
        # whether this one ran
        return Reconciliation(c, observed, None,
                              f"command register reads {values[0]}: the command ran and ended, "
                              "or never started; the register cannot tell", shown=shown)
    if kinds == {RegisterKind.COMMAND}:
        summary = f"command register reads {values[0] if values else '?'}"
        return Reconciliation(c, observed, holds, summary, shown=shown)
    if kinds == {RegisterKind.TRIGGER}:
        state = values[0]
        summary = "trigger state " + (TriggerState(state).name if state in set(TriggerState)
                                      else f"{state:#06x}")
    elif kinds == {RegisterKind.FAULT}:
        summary = "the bits are clear" if holds else "some bits are still latched"
    elif c.kind is CommandKind.MASK_WRITE:
        summary = ("the bits hold the intended values" if holds
                   else "the bits do not hold the intended values")
    else:
        summary = ("the registers hold the intended values" if holds
                   else "the registers do not hold the intended values")
    return Reconciliation(c, observed, holds, summary, shown=shown)


def register_holds(kind: RegisterKind, written: int, now: int) -> bool:
    """Does a register read back as ``now`` hold what writing ``written`` intended? By kind:
    a holding (each word of it) or a coil holds the value; a fault has the written bits clear;
    a trigger written 1 is
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
    "Value",
    "answer_of",
    "atomic_writes",
    "file_info_of",
    "judge_read_back",
    "raw_in",
    "read_back_of",
    "read_runs",
    "register_holds",
]
