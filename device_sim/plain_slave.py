"""A *plain* third-party Modbus RTU slave from a map, with faults a test controls, and its
ground-truth log.

Contract:

- ``PlainRtuServer`` is ``RtuServer`` (sans-I/O: ``receive_data``/``tick``/``data_to_send``)
  without anything of idemlink's: the idemlink functions (0x41 conditional write, 0x42 trigger,
  0x44/0x45 file hand-over) are answered with exception 01 ILLEGAL FUNCTION and change nothing,
  as a device that never heard of them answers. The map's registers keep the semantics
  ``DeviceCore`` gives them: HOLDINGs are set-only values, FAULT words W1C, INPUTs read-only,
  COMMAND registers return to 0 when their command is done (docs/REGMAP.md).
- Faults (``inject``), each for the next ``times`` requests it applies to (``None``: until
  ``clear_faults``): ``DROP_ANSWER`` executes the request and answers nothing; ``LATE`` executes
  and answers ``delay`` seconds later (released by a later ``tick``/``receive_data``);
  ``ECHO_DIFFERS`` executes and answers a write with an echo whose last word differs (``echo``,
  default the written word XOR 0x0004); ``MUTE`` hears nothing (executes nothing, answers
  nothing); ``WRONG_UNIT`` executes and answers as another unit id. DROP_ANSWER, LATE and
  ECHO_DIFFERS apply to writes unless ``writes_only=False``; MUTE and WRONG_UNIT to any request.
- Ground truth: ``executed`` lists every request the slave executed (MUTE ones are not: they
  were never heard), in order, with the time, the request, the answer as the line carried it
  (``sent``: after the fault, the differing echo itself) and the answer the device gave before
  any fault, the fault that changed what went on the line, and the core's ``Effect``s the
  request caused. The core's ``log`` holds the rest (a command ending, a condition).
- ``parse_fault_line`` reads the control FIFO's fault lines for ``idemlink sim --modbus-rtu
  --plain --control FIFO`` (docs/CLI.md): ``fault drop [TIMES]``, ``fault late SECONDS [TIMES]``,
  ``fault echo [TIMES]``, ``fault mute``, ``fault unit [UNIT]``, ``fault clear``, and
  ``finish ADDRESS`` (the COMMAND register's running command is done); ``on_executed`` is
  called with each ``Executed`` (``--effects FILE`` writes them as JSON lines: ``to_json``).
- Thread safety: ``lock`` guards the core, the faults and the log; the serving thread takes it
  for every round, a test takes it for a hook (``PlainSlave`` in ``idemlink.pytest_plugin``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from idemlink.device_sim.control import ControlError
from idemlink.device_sim.flash import ConfigFlash
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.device_core import DeviceCore, Effect
from idemlink.protocol.modbus import ExceptionResponse, FunctionCode, encode_response
from idemlink.protocol.modbus_rtu import BROADCAST_UNIT, encode_rtu
from idemlink.protocol.outcome import LocalProtocolError, ModbusException
from idemlink.protocol.registers import RegisterKind

__all__ = ["IDEMLINK_FUNCTIONS", "Executed", "FaultRule", "PlainFault", "PlainRtuServer"]

IDEMLINK_FUNCTIONS = frozenset({int(FunctionCode.WRITE_IF_GENERATION), int(FunctionCode.TRIGGER),
                                int(FunctionCode.FILE_RECEIVE), int(FunctionCode.FILE_INFO)})
"""The functions a plain slave answers with exception 01."""

#: The function codes that write (an echo or a count comes back).
WRITE_FUNCTIONS = frozenset({0x05, 0x06, 0x0F, 0x10, 0x16})


class PlainFault(Enum):
    DROP_ANSWER = "drop"  #: executed, no answer
    LATE = "late"  #: executed, answered ``delay`` seconds late
    ECHO_DIFFERS = "echo"  #: executed, the write's echo differs
    MUTE = "mute"  #: not heard: nothing executed, nothing answered
    WRONG_UNIT = "unit"  #: executed, answered as another unit


@dataclass(slots=True)
class FaultRule:
    fault: PlainFault
    times: int | None = 1  #: requests left it applies to; None: until cleared
    writes_only: bool = True
    delay: float = 0.0
    unit: int | None = None
    echo: int | None = None

    def applies(self, pdu: bytes) -> bool:
        if self.fault in (PlainFault.MUTE, PlainFault.WRONG_UNIT) or not self.writes_only:
            return True
        return bool(pdu) and pdu[0] in WRITE_FUNCTIONS


@dataclass(frozen=True, slots=True)
class Executed:
    """One request the slave executed (ground truth)."""

    time: float
    unit: int
    function: int
    address: int | None  #: the first register/coil addressed (None: a PDU too short to say)
    request: bytes  #: the request PDU
    answer: bytes  #: the answer PDU the device gave, before any fault (b"": broadcast)
    fault: PlainFault | None  #: what changed the answer on the line (None: sent as it was)
    effects: tuple[Effect, ...]  #: what the request changed
    #: the answer PDU as the line carried it, after the fault (``ECHO_DIFFERS``: the differing
    #: echo; b"": none was sent — dropped, or a broadcast). ``answer`` is the device's own.
    sent: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "unit": self.unit, "function": self.function,
                "address": self.address, "request": self.request.hex(),
                "answer": self.answer.hex(), "sent": self.sent.hex(),
                "fault": self.fault.value if self.fault else None,
                "effects": [{"kind": e.kind.name, "register": e.register, "old": e.old,
                             "new": e.new} for e in self.effects]}

    @property
    def exception(self) -> ModbusException | None:
        if len(self.answer) >= 2 and self.answer[0] & 0x80:
            try:
                return ModbusException(self.answer[1])
            except ValueError:
                return None
        return None


class PlainRtuServer(RtuServer):
    """A plain Modbus RTU slave serving ``core`` as ``unit``, with injectable faults."""

    def __init__(self, core: DeviceCore, unit: int = 1, flash: ConfigFlash | None = None,
                 baudrate: int | None = None, char_format: CharFormat = MODBUS_CHAR_FORMAT,
                 on_executed: Callable[[Executed], None] | None = None) -> None:
        super().__init__(core, unit=unit, flash=flash, baudrate=baudrate,
                         char_format=char_format)
        self.on_executed = on_executed
        self.lock = threading.RLock()
        self.executed: list[Executed] = []
        self.unheard = 0  #: requests a MUTE fault swallowed
        self._rules: list[FaultRule] = []
        self._late: list[tuple[float, bytes]] = []

    # ------------------------------------------------------------------------------ faults
    def inject(self, fault: PlainFault, *, times: int | None = 1, writes_only: bool = True,
               delay: float = 0.5, unit: int | None = None, echo: int | None = None) -> None:
        """Apply ``fault`` to the next ``times`` requests it applies to (None: until
        ``clear_faults``). ``LocalProtocolError`` for a bad argument."""
        if times is not None and times < 1:
            raise LocalProtocolError(f"times {times}: give 1 or more, or None (until cleared)")
        if not delay >= 0:
            raise LocalProtocolError(f"delay {delay}: give seconds >= 0")
        if unit is not None and not 1 <= unit <= 247:
            raise LocalProtocolError(f"unit {unit} outside 1..247")
        if echo is not None and not 0 <= echo <= 0xFFFF:
            raise LocalProtocolError(f"echo {echo} outside 0..65535")
        with self.lock:
            self._rules.append(FaultRule(fault, times, writes_only, delay, unit, echo))

    def clear_faults(self, fault: PlainFault | None = None) -> None:
        """Forget the faults still to apply (only those of ``fault`` when given)."""
        with self.lock:
            self._rules[:] = [r for r in self._rules if fault is not None and r.fault is not fault]

    def _take(self, pdu: bytes) -> FaultRule | None:
        for rule in self._rules:
            if rule.applies(pdu):
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times == 0:
                        self._rules.remove(rule)
                return rule
        return None

    # ------------------------------------------------------------------------------ serving
    def receive_data(self, data: bytes, now: float) -> None:
        with self.lock:
            super().receive_data(data, now)
            self._release(now)

    def tick(self, now: float) -> None:
        with self.lock:
            super().tick(now)
            self._release(now)

    def _release(self, now: float) -> None:
        due = [frame for at, frame in self._late if at <= now]
        if due:
            self._late = [(at, frame) for at, frame in self._late if at > now]
            for frame in due:
                self._outgoing += frame

    def _answer(self, now: float) -> None:
        while (frame := self.decoder.next_event()) is not None:
            if frame.unit not in (self.unit, BROADCAST_UNIT):
                self.ignored += 1
                continue
            pdu = frame.pdu
            rule = self._take(pdu)
            if rule is not None and rule.fault is PlainFault.MUTE:
                self.unheard += 1
                continue
            mark = len(self.core.log)
            if pdu and pdu[0] in IDEMLINK_FUNCTIONS:  # a plain slave never heard of them
                self.core.tick(now)
                response = encode_response(ExceptionResponse(pdu[0],
                                                             ModbusException.ILLEGAL_FUNCTION))
            else:
                response = self.execute(pdu, now)
            effects = tuple(e for e in self.core.log[mark:] if e.request)
            broadcast = frame.unit == BROADCAST_UNIT
            sent = b"" if broadcast else _as_sent(response, rule)
            done = Executed(now, frame.unit, pdu[0] if pdu else 0,
                            int.from_bytes(pdu[1:3], "big") if len(pdu) >= 3 else None, pdu,
                            b"" if broadcast else response,
                            None if broadcast or rule is None else rule.fault, effects, sent)
            self.executed.append(done)
            if self.on_executed is not None:
                self.on_executed(done)
            if broadcast:
                continue
            self.answered += 1
            self._send(sent, rule, now)

    def _send(self, response: bytes, rule: FaultRule | None, now: float) -> None:
        """Put ``response`` (already as the fault made it: ``_as_sent``) on the line."""
        if rule is None or rule.fault is PlainFault.ECHO_DIFFERS:
            self._outgoing += encode_rtu(self.unit, response)
        elif rule.fault is PlainFault.DROP_ANSWER:
            self.answers_dropped += 1
        elif rule.fault is PlainFault.LATE:
            self._late.append((now + rule.delay, encode_rtu(self.unit, response)))
        else:  # WRONG_UNIT
            other = rule.unit if rule.unit is not None else self.unit % 247 + 1
            self._outgoing += encode_rtu(other, response)


def _as_sent(response: bytes, rule: FaultRule | None) -> bytes:
    """The answer PDU as the line carries it under ``rule``: an ``ECHO_DIFFERS`` write's echo
    with its last word changed, nothing for ``DROP_ANSWER``, else ``response`` itself."""
    if rule is None:
        return response
    if rule.fault is PlainFault.DROP_ANSWER:
        return b""
    if rule.fault is PlainFault.ECHO_DIFFERS and len(response) >= 5 and not response[0] & 0x80:
        last = int.from_bytes(response[-2:], "big")
        echo = rule.echo if rule.echo is not None else last ^ 0x0004
        return response[:-2] + echo.to_bytes(2, "big")
    return response


def _count(text: str, what: str) -> int:
    if not text.isdigit() or len(text) > 9 or int(text) < 1:
        raise ControlError(f"{what} {text!r}: give a whole number >= 1")
    return int(text)


def parse_fault_line(line: str, server: PlainRtuServer, now: float) -> bool:
    """Apply one ``fault ...`` or ``finish ADDRESS`` line to ``server`` (True), or say it is not
    one (False: another control line). ``ControlError`` for a wrong one (nothing changed)."""
    words = line.split()
    if not words or words[0] not in ("fault", "finish"):
        return False
    if words[0] == "finish":
        if len(words) != 2 or not words[1].isdigit():
            raise ControlError("say 'finish ADDRESS' (a COMMAND register's address)")
        spec = server.core.regmap.at(int(words[1]))
        if spec is None or spec.kind is not RegisterKind.COMMAND:
            raise ControlError(f"address {words[1]} is not a COMMAND register")
        with server.lock:
            server.core.finish_command(spec.name, now)
        return True
    usage = ("say 'fault drop [TIMES]', 'fault late SECONDS [TIMES]', 'fault echo [TIMES]', "
             "'fault mute', 'fault unit [UNIT]' or 'fault clear'")
    rest = words[2:]
    what = words[1] if len(words) > 1 else ""
    if what == "clear" and not rest:
        server.clear_faults()
    elif what in ("drop", "echo") and len(rest) <= 1:
        server.inject(PlainFault(what), times=_count(rest[0], "TIMES") if rest else 1)
    elif what == "late" and 1 <= len(rest) <= 2:
        try:
            delay = float(rest[0])
        except ValueError:
            raise ControlError(f"SECONDS {rest[0]!r} is not a number") from None
        if not 0 <= delay <= 60:
            raise ControlError(f"SECONDS {rest[0]!r}: give 0..60")
        server.inject(PlainFault.LATE, delay=delay,
                      times=_count(rest[1], "TIMES") if len(rest) > 1 else 1)
    elif what == "mute" and not rest:
        server.inject(PlainFault.MUTE, times=None)
    elif what == "unit" and len(rest) <= 1:
        unit = _count(rest[0], "UNIT") if rest else None
        if unit is not None and unit > 247:
            raise ControlError(f"UNIT {unit} outside 1..247")
        server.inject(PlainFault.WRONG_UNIT, times=None, unit=unit)
    else:
        raise ControlError(usage)
    return True
