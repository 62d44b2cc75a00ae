"""The host driver: a typed handle on one idemlink device over any byte transport.

``Device.open(url)`` opens any pyserial URL (``/dev/ttyUSB0``, the simulator's pty, ``loop://``,
``socket://``, ``rfc2217://``, ``faulty://…``) without toggling DTR/RTS by default, runs the HELLO
handshake and refuses a device whose protocol version or contract hash differs from ours.

Every command returns a ``Result`` with exactly one ``Outcome`` — a protocol outcome is never an
exception. An UNKNOWN result of a command that may have had an effect (``Command.may_have_effect``:
writes, conditional writes, triggers, fault clears, the file hand-over — every function but the
read-only ones, ``idemlink.protocol.modbus.may_have_effect``) blocks the handle: further commands
raise ``UnknownOutstanding`` until ``acknowledge_unknown()``; ``reconcile()`` reads back what the
unknown command touched. A read (register read, FILE_INFO) that got no answer is UNKNOWN too and
carries no values, but it changed nothing: it does not block, and the next command proceeds.

A failing port (an OSError / ``PortError`` from the transport) ends the operation with
``LinkLost``, whose ``results`` settle every request of it (UNKNOWN/LINK_LOST if it was sent, which
blocks the handle if it may have had an effect); an interrupted operation (KeyboardInterrupt)
settles its requests as UNKNOWN/CANCELLED before the interrupt propagates, by the same rule.
Nothing is left in the session to run later.

``file_info(name)`` reads a stored file's size and CRC-32C back (FILE_INFO, read-only: like any
read, its UNKNOWN does not block the handle). ``send_files`` uses it to verify every
file of a framed YMODEM batch once the port is back in framed mode: a file is ok only when the
device holds exactly its bytes (``FileResult.verified``).

The request loop lives once, in ``Device._drive``: it only moves bytes between the transport and
the sans-I/O ``HostSession`` and passes the time in. An asyncio shell would replace only that loop.
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from idemlink.protocol.contract import contract_hash
from idemlink.protocol.frame import PROTOCOL_VERSION, crc32c
from idemlink.protocol.host_session import (
    Completion,
    HelloFailed,
    HostSession,
    SessionOpened,
    SessionState,
)
from idemlink.protocol.modbus import (
    MAX_FILE_INFO_NAME,
    FileInfoRequest,
    FileInfoResponse,
    FileInfoStatus,
    FunctionCode,
    ReadRegisters,
    Request,
    TriggerRequest,
    WriteIfGeneration,
    WriteMultipleRegisters,
    WriteSingleRegister,
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
from idemlink.protocol.payloads import DeviceInfo, printable
from idemlink.protocol.registers import RegisterKind, RegisterMap, RegisterSpec, TriggerState
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

if TYPE_CHECKING:
    from idemlink.protocol.ymodem import SenderConfig
    from idemlink.protocol.ymodem_files import FileResult, TransferReport

log = logging.getLogger(__name__)

T = TypeVar("T")
Steps = Generator[tuple[bytes, float], bytes, T]
"""An operation as a generator: yields (bytes to write, seconds to wait for input), is sent the
bytes that arrived, returns its result."""


class Transport(Protocol):
    """What the driver needs from a byte pipe: the clock travels with it."""

    def write(self, data: bytes) -> None: ...
    def read(self, timeout: float) -> bytes: ...
    def now(self) -> float: ...
    def close(self) -> None: ...


POLL_STEP = 0.005
"""Read timeout of a port without a file descriptor: how late a deadline may be noticed."""


class SerialTransport:
    """A pyserial port (any URL). DTR/RTS are set low *before* opening, so opening does not pulse
    the reset line that many boards wire to DTR (pass ``keep_lines=False`` to leave pyserial's
    defaults). A local serial device is opened exclusively (an advisory ``flock``, released when
    the process dies): a second program driving the same port would take our answers and make
    every command look replayed, so it is refused with "port busy" (``PortBusy``)."""

    def __init__(self, url: str, *, baudrate: int = 115200, keep_lines: bool = True) -> None:
        import time

        import serial

        self._clock = time.monotonic
        try:
            port = serial.serial_for_url(url, baudrate=baudrate, timeout=0, do_not_open=True)
            if keep_lines:
                port.dtr = False
                port.rts = False
            if hasattr(port, "exclusive"):
                port.exclusive = True
            port.open()
        except (serial.SerialException, ValueError, OSError) as exc:
            if "exclusively lock" in str(exc):
                from idemlink.host.port_hint import busy_hint

                raise PortBusy(f"port busy: {url} is already open in another program "
                               f"({busy_hint(url)})") from exc
            hint = ""
            if url.startswith("rfc2217://") and "option 'control'" in str(exc):
                hint = (" (the server does not answer RFC 2217 line control, as ser2net on a pty "
                        "does not: add ?ign_set_control to the URL)")
            raise PortError(f"cannot open {url}: {exc}{hint}") from exc
        self.port = port
        self._fd: int | None = None
        try:
            fd = port.fileno()
            if isinstance(fd, int) and fd >= 0:
                self._fd = fd
        except (AttributeError, OSError, NotImplementedError, ValueError):
            self._fd = None
        if self._fd is not None:
            port.timeout = 0  # reads below never block: select() does the waiting
        else:
            port.timeout = POLL_STEP

    def write(self, data: bytes) -> None:
        try:
            self.port.write(data)
        except OSError as exc:  # serial.SerialException is an OSError
            raise PortError(f"{self.port.name}: write failed: {exc}") from exc

    def read(self, timeout: float) -> bytes:
        try:
            return self._read(timeout)
        except (OSError, ValueError) as exc:  # ValueError: select() on a closed descriptor
            raise PortError(f"{self.port.name}: read failed: {exc}") from exc

    def _read(self, timeout: float) -> bytes:
        port = self.port
        if self._fd is not None:
            # Waiting in select() rather than through port.timeout: pyserial reconfigures the
            # line (tcsetattr) on every timeout change, which costs more than the exchange.
            import select

            ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
            if not ready:
                return b""
            return bytes(port.read(max(1, port.in_waiting)))
        # No descriptor (rfc2217://, loop://, faulty://): the port keeps one short timeout set at
        # open, because changing it reconfigures the port — over RFC 2217 a network round trip
        # per change. Wait in steps of it until the deadline.
        deadline = self._clock() + max(0.0, timeout)
        while True:
            first = port.read(1)
            if first:
                waiting = port.in_waiting
                return first + port.read(waiting) if waiting else first
            if self._clock() >= deadline:
                return b""

    def now(self) -> float:
        return self._clock()

    def close(self) -> None:
        try:
            self.port.close()
        except OSError as exc:  # a port that already failed may fail to close too
            log.warning("closing %s: %s", self.port.name, exc)


class PortError(LocalProtocolError):
    """The port could not be opened or failed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.LINK_LOST)


class PortBusy(PortError):
    """The port is held open by another program (exclusive lock)."""


class LinkLost(PortError):
    """The transport failed while a command was out. ``results`` settles every request of the
    interrupted operation: UNKNOWN (LINK_LOST) for one that was sent — the handle is then blocked
    if it may have had an effect, as for any UNKNOWN — NOT_EXECUTED for one never sent. Empty:
    nothing was out (e.g. HELLO)."""

    def __init__(self, message: str, results: tuple[Result, ...] = ()) -> None:
        super().__init__(message)
        self.results = results

    @property
    def unknown(self) -> bool:
        """Whether something may have run."""
        return any(r.outcome is Outcome.UNKNOWN for r in self.results)


TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, PortError)
"""What a failing transport raises (``SerialTransport`` turns pyserial's errors into PortError;
other transports may raise OSError, as sockets and file descriptors do)."""


def check_map(info: DeviceInfo, regmap: RegisterMap) -> None:
    """Refuse a device whose advertised register map is not ``regmap`` (naming both hashes). A
    device too old to advertise one is taken at its word only for the built-in default map."""
    theirs = info.map_hash
    if theirs is None:
        if regmap.hash != DEFAULT_MAP.hash:
            raise IncompatibleDevice(
                f"device {info.name!r} does not advertise its register map (an older firmware); "
                f"cannot confirm it serves {regmap.name} {regmap.hash.hex()}")
        return
    if theirs != regmap.hash:
        raise IncompatibleDevice(
            f"device {printable(info.device_id or info.name)} serves register map "
            f"{printable(info.map_name or '?')} {theirs.hex()}, ours is {regmap.name} "
            f"{regmap.hash.hex()}: open it with its map file (regmap=FILE; --regmap FILE on the "
            "command line)")


class IncompatibleDevice(RemoteProtocolError):
    """The device speaks another protocol version or another contract."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.UNSUPPORTED)


class NoDevice(RemoteProtocolError):
    """No HELLO_REPLY: nothing idemlink-shaped answers on this port."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.NO_ANSWER)


class UnknownOutstanding(LocalProtocolError):
    """A previous command ended UNKNOWN; reconcile and ``acknowledge_unknown()`` first."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.NO_ANSWER)


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

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def describe(self) -> str:
        if self.exception is not None:
            return f"{self.outcome.name} (Modbus exception {self.exception.name})"
        if self.status is not None and self.status is not Status.OK:
            return f"{self.outcome.name} ({self.status.name})"
        return self.outcome.name + (" (replayed answer)" if self.replay else "")


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What ``reconcile()`` read back for the command that ended UNKNOWN."""

    command: Command
    observed: dict[str, int]
    intended_state_holds: bool | None  #: None: cannot be decided from the state alone
    summary: str


def answer_of(cmd: Command, pdu: bytes) -> tuple[tuple[int, ...], int | None]:
    """The values (reads) and code (trigger status; generation after a conditional write,
    also when its guard failed) that a Result carries for the answer ``pdu`` to ``cmd``.
    Never raises: a malformed answer (only a faulty device sends one; the CRC rules out the line)
    carries no values."""
    if pdu[:1] and pdu[0] & 0x80:  # an exception answer carries neither
        return (), None
    k = cmd.kind
    if k is CommandKind.READ:
        if len(pdu) != 2 + 2 * cmd.count or pdu[1] != 2 * cmd.count:
            return (), None
        return struct.unpack_from(f">{cmd.count}H", pdu, 2), None
    if k in (CommandKind.TRIGGER, CommandKind.TRIGGER_RESET) and len(pdu) >= 5:
        return (), struct.unpack_from(">H", pdu, 3)[0]
    if k is CommandKind.WRITE_IF_GENERATION and len(pdu) >= 4:
        return (), struct.unpack_from(">H", pdu, 2)[0]
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


def _span(c: Command) -> range:
    return range(c.address, c.address + max(c.count, len(c.values), 1))


def _conflict(a: Command, b: Command, generation: int | None = None) -> bool:
    """Would running ``a`` and ``b`` in either order give different results? ``generation`` is
    the address of the map's generation counter, which every effective write moves."""
    return _flows_conflict(_flow(0, a, generation), _flow(0, b, generation))


@dataclass(frozen=True, slots=True)
class _Flow:
    """A command of the continuous pipeline, with what the dependency rule needs precomputed."""

    tag: int
    command: Command
    effect: bool
    span: range
    sees_generation: bool  #: a conditional write, or a read of the generation counter


def _flow(tag: int, c: Command, generation: int | None) -> _Flow:
    span = _span(c)
    sees = (c.kind is CommandKind.WRITE_IF_GENERATION
            or (generation is not None and generation in span))
    return _Flow(tag, c, c.may_have_effect, span, sees)


def _flows_conflict(a: _Flow, b: _Flow) -> bool:
    """``_conflict`` on precomputed facts (the pipeline checks it often): overlapping registers
    when one may have an effect; a command that sees the generation counter (a conditional
    write's guard, a read of the counter) next to any command that may have an effect."""
    if not (a.effect or b.effect):
        return False
    if (a.sees_generation and b.effect) or (b.sees_generation and a.effect):
        return True
    return a.span.start < b.span.stop and b.span.start < a.span.stop


RECONCILE_ROUNDS = 3
"""Read-back attempts of ``reconcile()`` (each with the session's own retries)."""


@dataclass(slots=True)
class DriverStats:
    commands: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class Device:
    """A session with one idemlink device. See the module docstring."""

    def __init__(
        self,
        transport: Transport,
        *,
        regmap: RegisterMap = DEFAULT_MAP,
        timeout: float = 0.2,
        attempts: int = 5,
        max_inflight: int = 8,
        check_map: bool = True,
    ) -> None:
        self.transport = transport
        self.regmap = regmap
        self.check_map = check_map
        self.session = HostSession(
            contract_hash=contract_hash(), timeout=timeout, attempts=attempts,
            max_inflight=max_inflight, hello_attempts=max(attempts, 1),
            hello_nonce=secrets.randbits(32),
        )
        self.unknown: Result | None = None
        self.stats = DriverStats()
        self._results: dict[int, Completion] = {}
        self._commands: dict[int, Command] = {}  #: tag -> command, while submitted
        self._tag = 0
        self._operating = False  #: a blocking operation (or a stream) is being driven

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, url: str, *, baudrate: int = 115200, keep_lines: bool = True,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, timeout: float = 0.2,
             attempts: int = 5, max_inflight: int = 8, check_map: bool = True,
             trace: str | os.PathLike[str] | None = None) -> Device:
        """Open ``url`` (any pyserial URL) and run the HELLO handshake. ``regmap`` is the device's
        register map (a ``RegisterMap``, a map file's path or a built-in map's name); a device
        that advertises another map is refused (``IncompatibleDevice``) unless ``check_map`` is
        False (for tools that only ask who is there, like ``idemlink info``). ``trace``: append
        every frame both ways to that file as JSON lines (``idemlink.host.trace``); a trace file
        that cannot be opened raises its ``OSError`` with the port closed again."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        transport: Transport = SerialTransport(url, baudrate=baudrate, keep_lines=keep_lines)
        if trace is not None:
            from idemlink.host.trace import TracingTransport

            try:
                transport = TracingTransport(transport, trace, rm)
            except OSError:
                transport.close()
                raise
        dev = cls(transport, regmap=rm, timeout=timeout, attempts=attempts,
                  max_inflight=max_inflight, check_map=check_map)
        try:
            dev.connect()
        except BaseException:
            dev.close()
            raise
        return dev

    def connect(self) -> None:
        """HELLO handshake; refuses an incompatible device."""
        self._drive(self._connect_steps())

    def _connect_steps(self) -> Steps[None]:
        s = self.session
        s.open(self.transport.now())
        opened: list[SessionOpened | HelloFailed] = []
        yield from self._exchange(lambda: bool(opened), opened)
        ev = opened[0]
        if isinstance(ev, HelloFailed):
            if ev.incompatible:
                raise IncompatibleDevice(ev.reason)
            raise NoDevice(f"no idemlink device answered: {ev.reason}")
        if ev.info.version != PROTOCOL_VERSION:
            raise IncompatibleDevice(
                f"device speaks protocol version {ev.info.version}, we speak {PROTOCOL_VERSION}")
        if ev.info.contract_hash != contract_hash():
            raise IncompatibleDevice(
                f"device protocol contract {ev.info.contract_hash.hex()} differs from ours "
                f"{contract_hash().hex()} (a different idemlink version: frame layout or codes)")
        if self.check_map:
            check_map(ev.info, self.regmap)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def info(self) -> DeviceInfo | None:
        """What the device advertised at HELLO (None before ``connect``)."""
        return self.session.info

    # ------------------------------------------------------------------ the one request loop
    # Every operation is written once, as a generator of I/O requests ("write these bytes, then
    # wait at most this long for input") over the sans-I/O HostSession. ``_drive`` runs one on
    # the blocking transport; ``idemlink.host.aio.AsyncDevice`` runs the very same generators on asyncio.

    def _io_round(self) -> Steps[None]:
        """One I/O round of every request loop: send what the session has, wait for input until
        its next deadline (at most 50 ms when it has none), feed what came, let time pass."""
        s = self.session
        t = self.transport
        deadline = s.next_deadline()
        wait = 0.05 if deadline is None else max(0.0, deadline - t.now())
        data = yield s.data_to_send(), wait
        now = t.now()
        if data:
            s.receive_data(data, now)
        s.tick(now)

    def _exchange(
        self, done: Callable[[], bool], sink: list[SessionOpened | HelloFailed] | None = None
    ) -> Steps[None]:
        s = self.session
        while True:
            for ev in s.events():
                if isinstance(ev, Completion):
                    self._results[ev.tag] = ev
                elif sink is not None:
                    sink.append(ev)
            if done():
                return
            yield from self._io_round()

    def _drive(self, steps: Steps[T]) -> T:
        """Run an operation on the blocking transport to its end (``_rounds``)."""
        rounds = self._rounds(steps)
        try:
            while True:
                next(rounds)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def _rounds(self, steps: Steps[T]) -> Generator[None, None, T]:
        """The blocking request loop, one I/O round per ``next()`` (``stream`` hands results out
        between rounds); returns the operation's result.

        If the transport fails, every request of the operation is settled (``abandon``) and
        ``LinkLost`` carries the results; if the caller interrupts (KeyboardInterrupt, any other
        exception, leaving a ``stream`` early), the requests are settled the same way (CANCELLED)
        before it propagates. Either way nothing stays in the session to run behind the caller's
        back, and the handle is blocked if a command that may have had an effect was out."""
        t = self.transport
        if self._operating:
            steps.close()
            raise LocalProtocolError(
                "another operation of this device is in progress (a stream being iterated?): "
                "one operation at a time per device", Status.MALFORMED_REQUEST)
        self._operating = True
        try:
            out, wait = next(steps)
            while True:
                try:
                    if out:
                        t.write(out)
                    data = t.read(wait)
                except TRANSPORT_ERRORS as exc:
                    raise self._link_lost(exc) from exc
                out, wait = steps.send(data)
                yield
        except StopIteration as stop:
            result: T = stop.value
            return result
        except LinkLost:
            raise
        except BaseException as exc:
            self._interrupted(exc)
            raise
        finally:
            self._operating = False
            steps.close()

    def _interrupted(self, exc: BaseException) -> None:
        """The caller stopped the operation (KeyboardInterrupt, asyncio cancellation): settle its
        requests as CANCELLED (a cancelled read blocks nothing, a cancelled write does). The
        interrupt propagates unchanged; the settled requests ride along on it so a caller that
        reports it (the CLI) can say whether something may have run. Shared by the blocking and
        the asyncio request loops."""
        exc.settled_results = tuple(  # type: ignore[attr-defined]
            self._settle_abandoned(Status.CANCELLED))

    def _link_lost(self, exc: BaseException) -> LinkLost:
        results = self._settle_abandoned(Status.LINK_LOST)
        sent = sum(r.outcome is Outcome.UNKNOWN for r in results)
        what = (f"{sent} request(s) may have run (UNKNOWN)" if sent
                else "nothing was out")
        return LinkLost(f"the port failed: {exc}; {what}", tuple(results))

    def _settle_abandoned(self, status: Status) -> list[Result]:
        """Give up every request the session holds (``HostSession.abandon``) and turn those of
        the interrupted operation into Results; an UNKNOWN one blocks the handle if it may have
        had an effect (``_result``, the one place that rule is applied)."""
        self.session.abandon(status)
        for ev in self.session.events():
            if isinstance(ev, Completion):
                self._results[ev.tag] = ev
        never_sent = Completion(None, Outcome.NOT_EXECUTED, None)  # taken, not yet submitted
        results = [self._result(c, self._results.pop(tag, never_sent))
                   for tag, c in sorted(self._commands.items())]
        self._results.clear()
        self._commands.clear()
        return results

    def _result(self, c: Command, comp: Completion) -> Result:
        values, code = answer_of(c, comp.pdu)
        file = file_info_of(c, comp.pdu) if comp.outcome is Outcome.OK else None
        r = Result(c, comp.outcome, comp.status, comp.exception, values, code, comp.replay,
                   comp.attempts, comp.reissued, comp.seq, comp.epoch, comp.sent_as, file)
        self.stats.commands += 1
        self.stats.outcomes[r.outcome.name] = self.stats.outcomes.get(r.outcome.name, 0) + 1
        if r.outcome is Outcome.UNKNOWN and self.unknown is None and c.may_have_effect:
            self.unknown = r  # a read changed nothing: there is nothing to reconcile
        return r

    # ------------------------------------------------------------------ commands
    def run(self, commands: Iterable[Command]) -> list[Result]:
        """Send commands pipelined and return one Result each, in order (``stream`` collected).
        Raises ``UnknownOutstanding`` while an UNKNOWN is unacknowledged."""
        return self._drive(self._run_steps(list(commands)))

    def stream(self, commands: Iterable[Command]) -> Iterator[Result]:
        """The continuous pipeline: yield one Result per command, in submission order, while
        later commands are already on the line.

        Requests keep leaving while answers arrive, up to the negotiated depth (the device's
        advertised window and ``max_inflight``). A command waits only for the earlier commands it
        does not commute with (``_conflict``: overlapping registers when one may have an effect,
        a conditional write or a read of the generation counter after any effective write);
        everything else overtakes it. Once a command that may have had an effect ends UNKNOWN
        the handle is blocked: commands not yet
        sent are not sent (NOT_EXECUTED, no status) and nothing more is taken from ``commands``:
        the stream ends after the results of the commands it had taken (``run`` takes them all,
        so every command gets its result). An unanswered read blocks nothing. ``commands`` is
        read lazily (at most about twice the pipeline depth ahead), so it may be endless.
        Leaving the loop early (``break``, an exception) settles what is still out as CANCELLED,
        like an interrupted ``run``. The device runs one operation at a time: calling another of
        its operations inside the loop raises ``LocalProtocolError``."""
        self._refuse_if_blocked()
        ready: deque[Result] = deque()
        steps = self._flow_steps(iter(commands), ready.append, self._lookahead())
        for _ in self._rounds(steps):
            while ready:
                yield ready.popleft()
        while ready:
            yield ready.popleft()

    def _lookahead(self) -> int:
        return 2 * max(self.session.max_inflight, 1)

    def _refuse_if_blocked(self) -> None:
        if self.unknown is not None:
            status = self.unknown.status
            raise UnknownOutstanding(
                f"a previous {self.unknown.command.kind.value} ended UNKNOWN"
                f"{f' ({status.name})' if status is not None else ''}; "
                "reconcile() and acknowledge_unknown() first")

    def _run_steps(self, commands: list[Command]) -> Steps[list[Result]]:
        self._refuse_if_blocked()
        results: list[Result] = []
        yield from self._flow_steps(iter(commands), results.append, None)
        return results

    def _flow_steps(self, source: Iterator[Command], emit: Callable[[Result], None],
                    lookahead: int | None) -> Steps[None]:
        """The continuous pipeline as an operation: pull commands from ``source`` (all at once
        when ``lookahead`` is None), submit each as soon as the session has room and no earlier
        unfinished command conflicts with it, ``emit`` results in submission order."""
        self._require_open()
        s = self.session
        t = self.transport
        held: deque[_Flow] = deque()  # taken from source, not yet submitted
        live: dict[int, _Flow] = {}  # submitted, not yet completed
        done: dict[int, Result] = {}
        order: deque[int] = deque()  # tags in submission order, not yet emitted
        effectful_live = 0
        exhausted = False
        while True:
            for ev in s.events():
                if isinstance(ev, Completion) and ev.tag in live:
                    f = live.pop(ev.tag)
                    effectful_live -= f.effect
                    done[f.tag] = self._result(self._commands.pop(f.tag), ev)
            while order and order[0] in done:
                emit(done.pop(order.popleft()))
            if self.unknown is not None:  # blocked: what was not sent stays unsent
                exhausted = True  # and nothing more is taken from the source
                if held:
                    for f in held:
                        done[f.tag] = self._result(self._commands.pop(f.tag),
                                                   Completion(f.tag, Outcome.NOT_EXECUTED, None))
                    held.clear()
                    continue
            if not exhausted and (lookahead is None or len(held) + len(live) < lookahead):
                exhausted = self._take(source, held, order, lookahead, len(live))
            if held:
                effectful_live += self._submit_ready(held, live, effectful_live, t.now())
            if exhausted and not held and not live and not order:
                return
            yield from self._io_round()

    def _take(self, source: Iterator[Command], held: deque[_Flow], order: deque[int],
              lookahead: int | None, in_flight: int) -> bool:
        """Move commands from ``source`` to ``held`` (up to the lookahead); True once exhausted."""
        while lookahead is None or len(held) + in_flight < lookahead:
            try:
                c = next(source)
            except StopIteration:
                return True
            self._tag += 1
            self._commands[self._tag] = c
            order.append(self._tag)
            held.append(_flow(self._tag, c, self.regmap.generation.address))
        return False

    def _submit_ready(self, held: deque[_Flow], live: dict[int, _Flow], effectful_live: int,
                      now: float) -> int:
        """Submit every held command (in order, scanning at most the lookahead) that conflicts
        with no unfinished earlier one, while the session has room; returns how many of the
        submitted may have an effect."""
        s = self.session
        room = s.max_inflight - s.outstanding
        if room <= 0:
            return 0
        added = 0
        # Only a command that may have an effect conflicts with anything: without one (a stream
        # of reads) nothing is checked.
        check = bool(effectful_live) or any(f.effect for f in held)
        blockers: list[_Flow] = list(live.values()) if check else []
        scan = self._lookahead()
        kept: list[_Flow] = []
        while held and room > 0 and scan > 0:
            f = held.popleft()
            scan -= 1
            if check and any(_flows_conflict(f, b) for b in blockers):
                kept.append(f)
                blockers.append(f)
                continue
            s.submit(f.command.pdu(), now, set_only=self._reissuable(f.command), tag=f.tag)
            live[f.tag] = f
            added += f.effect
            room -= 1
            if check:
                blockers.append(f)
        held.extendleft(reversed(kept))
        return added

    def _require_open(self) -> None:
        if self.session.state is SessionState.CLOSED:
            # Without a session nothing would ever be sent, and the loop would wait forever.
            raise LocalProtocolError("not connected: call connect() first (HELLO handshake)",
                                     Status.MALFORMED_REQUEST)

    def _wave_steps(self, cmds: list[Command]) -> Steps[list[Result]]:
        """Submit ``cmds`` together (they commute: reconcile's read-back, FILE_INFO) and wait for
        all of them."""
        self._require_open()
        now = self.transport.now()
        tags = []
        for c in cmds:
            self._tag += 1
            tags.append(self._tag)
            self._commands[self._tag] = c
            self.session.submit(c.pdu(), now, set_only=self._reissuable(c), tag=self._tag)
        yield from self._exchange(lambda: all(t in self._results for t in tags))
        return [self._result(self._commands.pop(t), self._results.pop(t)) for t in tags]

    def execute(self, command: Command) -> Result:
        return self.run([command])[0]

    def _reissuable(self, c: Command) -> bool:
        """Harmless to run again after a reboot: a read, or a write that touches only HOLDING
        registers (checked against the map, whoever built the Command)."""
        if not c.may_have_effect:
            return True
        if c.kind is not CommandKind.WRITE:
            return False
        specs = [self.regmap.at(a) for a in range(c.address, c.address + len(c.values))]
        return all(s is not None and s.kind is RegisterKind.HOLDING for s in specs)

    # ------------------------------------------------------------------ typed helpers
    def spec(self, register: str | int) -> RegisterSpec:
        """A register by name or address; ``LocalProtocolError`` if unknown."""
        spec = self.regmap.at(register) if isinstance(register, int) else None
        if spec is None and isinstance(register, str):
            try:
                spec = self.regmap.named(register)
            except (KeyError, ValueError, LookupError):
                spec = None
        if spec is None:
            raise LocalProtocolError(f"no register {register!r} in the map", Status.MALFORMED_REQUEST)
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
                    f"{spec.name} is a {spec.kind.name} register, not a set-only value: use {use}",
                    Status.MALFORMED_REQUEST)
        return Command(CommandKind.WRITE, *self._contiguous(values))

    def _contiguous(self, values: Mapping[str | int, int | str]) -> tuple[int, int, tuple[int, ...]]:
        """``(first address, count, raw values)`` of a write. A value is a raw integer (0..65535)
        or text as people type it (``"42.5"`` in the register's unit, a label, ``"raw:425"``:
        ``RegisterSpec.raw_from_text``); anything else is a ``LocalProtocolError`` naming the
        register, raised before anything is sent."""
        if not values:
            raise LocalProtocolError("nothing to write", Status.MALFORMED_REQUEST)
        pairs: list[tuple[RegisterSpec, int]] = []
        for key, value in values.items():
            spec = self.spec(key)
            if isinstance(value, str):
                try:
                    value = spec.raw_from_text(value)
                except ValueError as exc:
                    raise LocalProtocolError(str(exc), Status.MALFORMED_REQUEST) from None
            elif isinstance(value, bool) or not isinstance(value, int):
                raise LocalProtocolError(
                    f"{spec.name}={value!r}: give a raw integer or text such as \"42.5\" or a "
                    "label", Status.MALFORMED_REQUEST)
            if not 0 <= value <= 0xFFFF:
                raise LocalProtocolError(f"{spec.name}={value}: a register holds 0..65535",
                                         Status.MALFORMED_REQUEST)
            pairs.append((spec, value))
        pairs.sort(key=lambda sv: sv[0].address)
        first = pairs[0][0].address
        if [s.address for s, _ in pairs] != list(range(first, first + len(pairs))):
            raise LocalProtocolError(
                "a multi-register write must cover contiguous addresses (it is applied "
                "atomically): " + ", ".join(f"{s.name}@0x{s.address:04X}" for s, _ in pairs)
                + "; write them in separate calls or through run()", Status.MALFORMED_REQUEST)
        return first, len(pairs), tuple(v for _, v in pairs)

    def read(self, register: str | int, count: int = 1) -> Result:
        return self.execute(self.read_command(register, count))

    def write(self, values: Mapping[str | int, int | str]) -> Result:
        """Set absolute values (FC06 for one register, FC16 for several contiguous ones); values
        as in ``_contiguous`` (raw integers, or text in the register's unit or a label)."""
        return self.execute(self.write_command(values))

    def write_if_generation_command(self, generation: int,
                                    values: Mapping[str | int, int | str]) -> Command:
        addr, count, vals = self._contiguous(values)
        return Command(CommandKind.WRITE_IF_GENERATION, addr, count, vals, generation=generation)

    def clear_faults_command(self, mask: int, register: str | int | None = None) -> Command:
        spec = self._the(RegisterKind.FAULT, register)
        return Command(CommandKind.CLEAR_FAULTS, spec.address, 1, (mask,))

    def trigger_command(self, register: str | int | None = None, *, reset: bool = False) -> Command:
        kind = CommandKind.TRIGGER_RESET if reset else CommandKind.TRIGGER
        return Command(kind, self._the(RegisterKind.TRIGGER, register).address)

    def trigger_status_command(self, register: str | int | None = None) -> Command:
        return self.read_command(self._the(RegisterKind.TRIGGER, register).name)

    def file_info_command(self, name: str) -> Command:
        """FILE_INFO for ``name``; ``ValueError`` for a name the device would refuse."""
        cmd = Command(CommandKind.FILE_INFO, 0, name=name)
        cmd.pdu()  # ValueError for a name YMODEM's receiver would refuse
        return cmd

    def write_if_generation(self, generation: int, values: Mapping[str | int, int | str]) -> Result:
        return self.execute(self.write_if_generation_command(generation, values))

    def clear_faults(self, mask: int, register: str | int | None = None) -> Result:
        """Write 1s to clear the bits of ``mask`` in a fault word (the map's only one when
        ``register`` is None)."""
        return self.execute(self.clear_faults_command(mask, register))

    def trigger(self, register: str | int | None = None) -> Result:
        """Start a trigger's action once (the map's only trigger when ``register`` is None)."""
        return self.execute(self.trigger_command(register))

    def trigger_reset(self, register: str | int | None = None) -> Result:
        return self.execute(self.trigger_command(register, reset=True))

    def trigger_status(self, register: str | int | None = None) -> Result:
        return self.execute(self.trigger_status_command(register))

    def _the(self, kind: RegisterKind, register: str | int | None) -> RegisterSpec:
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

    def file_info(self, name: str) -> Result:
        """Size and CRC-32C of the committed file ``name`` on the device (``Result.file``;
        ``FileInfoStatus.ABSENT`` when it has none). Read-only: harmless to retry or replay.
        A name the device would refuse raises ``ValueError`` before anything is sent."""
        return self.execute(self.file_info_command(name))

    def send_files(
        self,
        paths: Iterable[str],
        *,
        progress: Callable[[str, int, int | None], None] | None = None,
        config: SenderConfig | None = None,
        overwrite: bool = False,
    ) -> tuple[Result, TransferReport | None]:
        """Hand the device's port to YMODEM (FILE_RECEIVE), send ``paths`` as one batch, return
        to framed mode and read every file back (FILE_INFO). The report is None when the device
        did not switch.

        YMODEM's bytes cannot always prove a commit (docs/YMODEM.md), so each file the batch
        reported ok or "not confirmed" is checked against the device's size and CRC-32C of what
        it stored: the same bytes → ok and ``verified``; absent or different → failed
        (``verified=False``); no answer → the YMODEM verdict stays, ``verified=None`` ("not
        verified"). A file the batch reported failed is not read back (a device that already had
        it refused it). Local digests are taken before the batch.

        If the hand-over answer is lost (UNKNOWN), the batch is attempted anyway: a device that
        did switch answers the sender's header, and a completed batch settles the UNKNOWN.
        """
        from idemlink.host.ymodem_io import send_files
        from idemlink.protocol.ymodem_files import TransferReport

        paths, digests, handover = self._prepare_batch(paths, overwrite)
        identical, asked = self._drive(self._already_there_steps(paths, digests, overwrite))
        todo = [p for p in paths if Path(p).name not in {f.name for f in identical}]
        if not todo:  # every file is on the device byte for byte: nothing to hand over
            return asked, TransferReport(files=identical, ok=True)
        res = self.execute(handover)
        if res.outcome not in (Outcome.OK, Outcome.UNKNOWN):
            return res, None
        port = getattr(self.transport, "port", None)
        if port is None:
            raise LocalProtocolError("file transfer needs a serial transport", Status.UNSUPPORTED)
        report = send_files(port, todo, config, progress=progress)
        self._batch_done(res, report)
        self._verify(report.files, digests)
        report.files[:0] = identical
        return res, report

    def _prepare_batch(self, paths: Iterable[str], overwrite: bool
                       ) -> tuple[list[str], dict[str, tuple[int, int]], Command]:
        """Check a batch's names, take the local digests, build the hand-over command (nothing
        is sent: a bad name raises ``ValueError`` first)."""
        from idemlink.host.ymodem_io import check_batch_names

        paths = list(paths)
        check_batch_names(paths)  # before the device is switched: it would wait for a sender
        for p in paths:  # every name must fit the read-back's request, or it could not be verified
            if len(Path(p).name.encode("utf-8", "surrogateescape")) > MAX_FILE_INFO_NAME:
                raise ValueError(f"file name {Path(p).name!r} is longer than the "
                                 f"{MAX_FILE_INFO_NAME} bytes a read-back (FILE_INFO) can ask for")
        digests = {Path(p).name: _digest(Path(p)) for p in paths}
        return paths, digests, Command(CommandKind.FILE_RECEIVE, 0,
                                       values=(1,) if overwrite else ())

    def _batch_done(self, handover: Result, report: TransferReport) -> None:
        """Back in framed mode after a batch: forget YMODEM's bytes; a completed batch proves an
        UNKNOWN hand-over did happen."""
        self.session.resync()
        if handover.outcome is Outcome.UNKNOWN and report.ok and self.unknown is handover:
            self.unknown = None  # the receiver answered: the hand-over did happen

    def _already_there_steps(self, paths: list[str], digests: Mapping[str, tuple[int, int]],
                             overwrite: bool) -> Steps[tuple[list[FileResult], Result]]:
        """Ask the device (FILE_INFO, read-only) what it holds under each name before sending:
        the same size and CRC-32C -> that file is not sent again (``identical``); different bytes
        without ``overwrite`` -> ``ValueError`` naming the file and ``--overwrite`` before anything
        is switched. A question that got no answer decides nothing: the file is sent."""
        from idemlink.protocol.ymodem_files import FileResult

        cmds = [Command(CommandKind.FILE_INFO, 0, name=Path(p).name) for p in paths]
        answers = yield from self._wave_steps(cmds)
        identical: list[FileResult] = []
        for p, r in zip(paths, answers, strict=True):
            name = Path(p).name
            info = r.file
            if info is None or info.status is not FileInfoStatus.PRESENT:
                continue
            size, crc = digests[name]
            if (info.size, info.crc32c) == (size, crc):
                identical.append(FileResult(name, size, ok=True, seconds=0.0, verified=True,
                                            identical=True,
                                            detail="already on the device, identical"))
            elif not overwrite:
                raise ValueError(
                    f"{name}: the device already has a different {name} ({info.size} bytes, "
                    f"CRC-32C {info.crc32c:08x}; this one: {size} bytes, CRC-32C {crc:08x}); "
                    "send with --overwrite to replace it")
        return identical, answers[-1]

    def _verify(self, files: list[FileResult], digests: Mapping[str, tuple[int, int]]) -> None:
        """Read back (FILE_INFO, pipelined; allowed while the handle is blocked, like
        ``reconcile``) every file YMODEM reported ok or unconfirmed, and settle its verdict."""
        todo = _to_verify(files, digests)
        if not todo:
            return
        try:
            back = self._drive(self._wave_steps(
                [Command(CommandKind.FILE_INFO, 0, name=f.name) for f in todo]))
        except LinkLost as exc:
            _not_verified(todo, exc)
            return
        _judge_files(todo, back, digests)

    # ------------------------------------------------------------------ UNKNOWN handling
    def acknowledge_unknown(self) -> None:
        """Unblock the handle once the caller has reconciled."""
        self.unknown = None

    def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        """Read back the state an UNKNOWN command (default: the blocking one) touched and say
        whether the state it intended holds. Allowed while the handle is blocked. A read has no
        effect to reconcile: it is answered without sending anything."""
        return self._drive(self._reconcile_steps(result))

    def _reconcile_steps(self, result: Result | None) -> Steps[Reconciliation | None]:
        r = result if result is not None else self.unknown
        if r is None:
            return None
        c = r.command
        if not c.may_have_effect:
            return Reconciliation(c, {}, True, f"a {c.kind.value} has no effect to reconcile")
        if c.kind is CommandKind.FILE_RECEIVE:
            return Reconciliation(c, {}, None, "a file hand-over leaves no register state")
        span = max(c.count, len(c.values), 1)
        reads = [Command(CommandKind.READ, c.address, span),
                 Command(CommandKind.READ, self.regmap.generation.address, 1)]
        for _ in range(RECONCILE_ROUNDS):  # reads are harmless to repeat
            back = yield from self._wave_steps(reads)
            if all(b.outcome is Outcome.OK and b.values for b in back):
                return _judge_read_back(c, back[0].values, back[1].values[0], self.spec)
        return Reconciliation(c, {}, None, "read-back failed; still unknown")


def _to_verify(files: list[FileResult], digests: Mapping[str, tuple[int, int]]) -> list[FileResult]:
    """The files of a batch to read back: those YMODEM reported ok or unconfirmed."""
    return [f for f in files if (f.ok or f.unconfirmed) and f.name in digests]


def _not_verified(todo: list[FileResult], exc: BaseException) -> None:
    for f in todo:
        f.verified = None
        f.detail = _join(f.detail, f"not verified: {exc}")


def _judge_files(todo: list[FileResult], back: list[Result],
                 digests: Mapping[str, tuple[int, int]]) -> None:
    """Settle each file's verdict from its FILE_INFO read-back."""
    for f, r in zip(todo, back, strict=True):
        size, crc = digests[f.name]
        info = r.file
        if info is None:
            f.verified = None
            f.detail = _join(f.detail, f"not verified: read-back {r.describe()}")
        elif info.status is FileInfoStatus.ABSENT:
            f.ok, f.verified = False, False
            f.detail = ("the device does not have it (read back after the batch: absent)"
                        + (", though YMODEM reported it ok" if not f.unconfirmed else ""))
        elif (info.size, info.crc32c) != (size, crc):
            f.ok, f.verified = False, False
            f.detail = (f"the device holds different bytes: {info.size} bytes, CRC-32C "
                        f"{info.crc32c:08x}; sent {size} bytes, CRC-32C {crc:08x}")
        else:
            was_unconfirmed = not f.ok
            f.ok, f.verified = True, True
            f.detail = ("YMODEM could not confirm it; the read-back did"
                        if was_unconfirmed else "")


def _digest(path: Path) -> tuple[int, int]:
    """(size, CRC-32C) of a local file, as FILE_INFO reports a stored one."""
    crc, size = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 16):
            crc = crc32c(chunk, crc)
            size += len(chunk)
    return size, crc


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _judge_read_back(
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
    holds = all(_holds(spec(c.address + i).kind, w, v)
                for i, (w, v) in enumerate(zip(written, values, strict=False)))
    kinds = {spec(c.address + i).kind for i in range(len(written))}
    if kinds == {RegisterKind.TRIGGER}:
        summary = f"trigger state {values[0]:#06x}"
    elif kinds == {RegisterKind.FAULT}:
        summary = "the bits are clear" if holds else "some bits are still latched"
    else:
        summary = ("the registers hold the intended values" if holds
                   else "the registers do not hold the intended values")
    return Reconciliation(c, observed, holds, summary)


def _holds(kind: RegisterKind, written: int, now: int) -> bool:
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
