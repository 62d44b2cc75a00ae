"""A driver for any standard Modbus RTU slave, with the same ``Result``s as ``Device``.

``RtuDevice.open(url, unit=1, regmap=...)`` opens the port like ``Device.open`` (exclusively,
DTR/RTS low) and reads one register of the map to make sure a slave answers at ``unit``
(``NoDevice`` otherwise; an exception answer is a slave too). There is no handshake: a standard
slave cannot say which map it serves, so the map given is taken at its word.

It offers the part of ``Device``'s API the command line uses (``read``/``write``/``run``/
``read_command``/``write_command``/``clear_faults``/``trigger``/``trigger_reset``/
``trigger_status``/``spec``/``reconcile``/``acknowledge_unknown``/``close``, a context
manager) with the same ``Command`` and ``Result`` types, over the sans-I/O
``idemlink.protocol.rtu_master.RtuMaster`` (which decides, from the map, what may be retried):

- the idemlink functions do not exist on a standard slave: a trigger is an FC06 write of 1 (reset:
  0) to the trigger register — its answer is an echo, so ``Result.code`` is None: read the state
  back with ``trigger_status`` — a fault clear is an FC06 write of the bit mask (write 1 to
  clear); a conditional write and the file functions are refused before anything is sent
  (``LocalProtocolError``, status UNSUPPORTED);
- commands run one after the other (no pipelining); an UNKNOWN command that may have had an
  effect blocks the handle (``UnknownOutstanding``) and leaves the rest of a ``run`` unsent
  (NOT_EXECUTED), as with ``Device``; ``reconcile`` reads back what it touched;
- a failing port raises ``LinkLost`` settling the command out (UNKNOWN/LINK_LOST) and the rest
  (NOT_EXECUTED); an interrupt settles them as CANCELLED before it propagates.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from idemlink.host.command import (
    BlockingCommands,
    Command,
    CommandKind,
    Reconciliation,
    Result,
    SentRequest,
    answer_of,
)
from idemlink.host.errors import (
    TRANSPORT_ERRORS,
    LinkLost,
    NoDevice,
    UnknownOutstanding,
)
from idemlink.host.evidence import no_resend_reason, with_evidence
from idemlink.host.operations import reconcile_plan
from idemlink.host.transport import SerialTransport, Transport
from idemlink.protocol.host_session import Completion
from idemlink.protocol.modbus import FunctionCode, WriteSingleRegister, encode_request
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap
from idemlink.protocol.rtu_master import RtuMaster

IDLE_WAIT = 0.05  #: longest read while nothing is out
DRAIN_ROUNDS = 64  #: reads of stale input before a request (bounded: a babbling line ends it)


class RtuDevice(BlockingCommands):
    """A session with one Modbus RTU slave. See the module docstring."""

    def __init__(self, transport: Transport, *, regmap: RegisterMap = DEFAULT_MAP, unit: int = 1,
                 baudrate: int | None = None, timeout: float = 0.2, attempts: int = 5) -> None:
        super().__init__(regmap)
        self.transport = transport
        self.master = RtuMaster(regmap, unit=unit, baudrate=baudrate, timeout=timeout,
                                attempts=attempts)
        self.unknown: Result | None = None

    @classmethod
    def open(cls, url: str, *, unit: int = 1, baudrate: int = 115200,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, timeout: float = 0.2,
             attempts: int = 5, keep_lines: bool = True, probe: bool = True) -> RtuDevice:
        """Open ``url`` and (``probe``) check that a slave answers at ``unit``."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        transport = SerialTransport(url, baudrate=baudrate, keep_lines=keep_lines)
        # a pty or a socket has no line rate: t3.5 is then the fast-line 1.75 ms
        line_rate = baudrate if _is_serial_line(transport) else None
        dev = cls(transport, regmap=rm, unit=unit, baudrate=line_rate, timeout=timeout,
                  attempts=attempts)
        try:
            if probe:
                dev.probe()
        except BaseException:
            dev.close()
            raise
        return dev

    def probe(self) -> None:
        """Read the map's first register; ``NoDevice`` if nothing answers at the unit."""
        first = self.regmap.registers[0]
        r = self.execute(Command(CommandKind.READ, first.address))
        if r.outcome is Outcome.UNKNOWN and r.exception is None:
            raise NoDevice(f"no Modbus RTU slave answered at unit {self.master.unit} "
                           f"({r.attempts} read(s) of {first.name} got no answer)")

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> RtuDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the request loop
    def _send_all(self, cmds: list[Command]) -> list[Result]:
        """Run ``cmds`` one by one; stop sending after an UNKNOWN that may have had an effect."""
        results: list[Result] = []
        for i, c in enumerate(cmds):
            if self.unknown is not None:
                results += [Result(x, Outcome.NOT_EXECUTED, None) for x in cmds[i:]]
                break
            try:
                results.append(self._one(c))
            except LinkLost as exc:  # the commands never sent ride along, as with Device
                exc.results = exc.results + _not_sent(cmds[i + len(exc.results):])
                raise
            except (LocalProtocolError, ValueError):
                raise  # refused before anything was sent
            except BaseException as exc:
                settled: tuple[Result, ...] = getattr(exc, "settled_results", ())
                exc.settled_results = settled + _not_sent(  # type: ignore[attr-defined]
                    cmds[i + len(settled):])
                raise
        return results

    def _discard_input(self) -> None:
        """Drop what arrived while no request was out (a late answer to an earlier one): with no
        transaction id it would fit the next request of the same shape. Nothing is out yet, so a
        failing port here has run nothing."""
        try:
            for _ in range(DRAIN_ROUNDS):
                if not self.transport.read(0.0):
                    return
                self.master.ignored += 1
        except TRANSPORT_ERRORS as exc:
            raise LinkLost(f"the port failed: {exc}; nothing was out") from exc

    def _one(self, c: Command) -> Result:
        pdu = self._pdu(c)
        m, t = self.master, self.transport
        got: Completion | None = None
        self._discard_input()
        try:
            m.submit(pdu, t.now(), tag=c)
            while got is None:
                try:
                    out = m.data_to_send()
                    if out:
                        t.write(out)
                    deadline = m.next_deadline()
                    now = t.now()
                    data = t.read(IDLE_WAIT if deadline is None else max(0.0, deadline - now))
                except TRANSPORT_ERRORS as exc:
                    m.abandon(Status.LINK_LOST)
                    settled = m.next_event()
                    assert settled is not None  # abandon settles the one request submitted
                    r = self._result(c, settled)
                    raise LinkLost(f"the port failed: {exc}; "
                                   + ("1 request(s) may have run (UNKNOWN)"
                                      if r.outcome is Outcome.UNKNOWN else "nothing was out"),
                                   (r,)) from exc
                now = t.now()
                m.receive_data(data, now)
                m.tick(now)
                got = m.next_event()
        except (LinkLost, LocalProtocolError, ValueError):
            raise
        except BaseException as exc:
            m.abandon(Status.CANCELLED)
            exc.settled_results = tuple(  # type: ignore[attr-defined]
                self._result(c, e) for e in iter(m.next_event, None))
            raise
        return self._result(c, got)

    def _result(self, c: Command, comp: Completion) -> Result:
        values, code = answer_of(c, comp.pdu) if comp.pdu else ((), None)
        if c.kind in (CommandKind.TRIGGER, CommandKind.TRIGGER_RESET):
            code = None  # an FC06 answer echoes the value written: it carries no trigger code
        r = Result(c, comp.outcome, comp.status, comp.exception, values, code,
                   attempts=comp.attempts)
        if r.outcome is Outcome.UNKNOWN and self.unknown is None and c.may_have_effect:
            self.unknown = r
        return r

    def _pdu(self, c: Command) -> bytes:
        """The standard PDU ``c`` travels as; the idemlink-only functions are refused."""
        k = c.kind
        if k in (CommandKind.TRIGGER, CommandKind.TRIGGER_RESET):
            value = 1 if k is CommandKind.TRIGGER else 0
            return encode_request(WriteSingleRegister(c.address, value))
        if c.function in (FunctionCode.WRITE_IF_GENERATION, FunctionCode.FILE_RECEIVE,
                          FunctionCode.FILE_INFO):
            raise LocalProtocolError(
                f"a {k.value} needs the idemlink function 0x{c.function:02X}, which a standard "
                "Modbus RTU slave does not have; nothing was sent")
        return c.pdu()

    # ------------------------------------------------------------------ commands
    def run(self, commands: Iterable[Command]) -> list[Result]:
        """One Result per command, in order; see the module docstring."""
        if self.unknown is not None:
            raise UnknownOutstanding(
                f"a previous {self.unknown.command.kind.value} ended UNKNOWN; "
                "reconcile() and acknowledge_unknown() first")
        cmds = list(commands)
        for c in cmds:
            self._pdu(c)  # refuse an impossible command before anything is sent
        return self._send_all(cmds)

    def execute(self, command: Command) -> Result:
        return self.run([command])[0]

    def write_if_generation(self, generation: int,
                            values: Mapping[str | int, int | str]) -> Result:
        raise LocalProtocolError(
            "a conditional write needs the idemlink function 0x41, which a standard Modbus RTU "
            "slave does not have; nothing was sent")

    # ------------------------------------------------------------------ UNKNOWN handling
    def acknowledge_unknown(self) -> None:
        self.unknown = None

    def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        """Read back what an UNKNOWN command touched (and the generation counter) and judge
        whether its intended state holds, as ``Device.reconcile`` does. Allowed while blocked."""
        r = result if result is not None else self.unknown
        if r is None:
            return None
        return self.reconcile_sent(r.command, r.sent_as)

    def reconcile_sent(self, command: Command,
                       sent_as: tuple[tuple[int, int], ...] = ()) -> Reconciliation:
        """Read back what ``command`` touched. A standard slave keeps no record of what it ran,
        so whether it ran stays unknown (``executed`` None) whatever the state shows."""
        plan = reconcile_plan(command, self.regmap.generation.address, self.spec)
        try:
            reads = next(plan)
            while True:  # one read at a time here
                reads = plan.send([self._one(read) for read in reads])
        except StopIteration as done:
            verdict: Reconciliation = done.value
        if not command.may_have_effect:
            return verdict
        return with_evidence(verdict, None, no_resend_reason(sent_as, None))

    def execute_recorded(self, command: Command,
                         record: Callable[[SentRequest], None]) -> Result:
        """``record`` the request (a plain slave numbers nothing: PDU only), then run it."""
        if self.unknown is not None:
            self.run([])  # raises UnknownOutstanding
        record(SentRequest(self._pdu(command)))
        return self.execute(command)


def _not_sent(cmds: list[Command]) -> tuple[Result, ...]:
    return tuple(Result(c, Outcome.NOT_EXECUTED, None) for c in cmds)


def _is_serial_line(transport: SerialTransport) -> bool:
    """A real UART (its baud rate paces the line), not a pty, socket or loop URL."""
    name = str(getattr(transport.port, "portstr", "") or "")
    if "://" in name:
        return False
    try:
        return not os.path.realpath(name).startswith(("/dev/pts/", "/dev/ptmx"))
    except (OSError, ValueError):
        return True


__all__ = ["RtuDevice"]
