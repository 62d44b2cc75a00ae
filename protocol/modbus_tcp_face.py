"""The gateway's Modbus TCP face, its rules (sans-I/O): which request of a Modbus-only client
passes to a port, and the answer PDU each outcome gives.

Contract (docs/GATEWAY.md, "Modbus TCP for clients that know only Modbus"):

- ``plan(pdu)``: a request PDU decoded by ``idemlink.protocol.modbus.decode_request`` (the one
  reader; a malformed one is the exception it names). Reads (FC03, FC04, FC01, FC02) are
  ``Plan.READ``; register writes (FC06, FC16) are ``Plan.WRITE`` — set-only values, or, by the
  map, a trigger start/reset or a fault clear, which go as those calls and follow their rules.
  Everything else — coil writes, mask write (FC22), the idemlink functions (0x41-0x45), any other
  code — is refused ``ILLEGAL_FUNCTION`` (``Plan.REFUSE``), nothing sent.
- ``answer_pdu(request, outcome, reason, exception_code, values)``: the answer a Modbus client
  understands for what the port did (``ANSWERS``, one table):

  * OK: the normal response (read: the values; FC06: the echo; FC16: address and count);
  * REJECTED: the device's own exception code when it gave one (01-04), else 03 ILLEGAL DATA
    VALUE (a value the map refuses), 02 for a register the map does not have;
  * NOT_EXECUTED: 0x0A GATEWAY PATH UNAVAILABLE (the port is down, blocked by an open item, the
    store cannot take the call, no port at that unit) — nothing reached the device, a retry is
    safe — except BUSY, 06 SERVER DEVICE BUSY;
  * UNKNOWN: 0x0B GATEWAY TARGET DEVICE FAILED TO RESPOND — the device did not answer (it may
    have run a write: the gateway lists that as an open item).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from idemlink.protocol.modbus import (
    ExceptionResponse,
    ModbusPduError,
    ReadBits,
    ReadBitsResponse,
    ReadRegisters,
    ReadRegistersResponse,
    Request,
    WriteMultipleRegisters,
    WriteMultipleRegistersResponse,
    WriteSingleRegister,
    WriteSingleRegisterResponse,
    decode_request,
    encode_response,
)
from idemlink.protocol.modbus_tcp import GatewayException
from idemlink.protocol.outcome import ModbusException, Outcome

BUSY = 0x06
"""SERVER DEVICE BUSY: not a ``ModbusException`` of the framed contract, so spelt here."""


class Plan(Enum):
    READ = "read"
    WRITE = "write"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Planned:
    plan: Plan
    function: int
    request: Request | None = None
    exception: int | None = None  #: REFUSE: the code to answer with


def plan(pdu: bytes) -> Planned:
    """What a client's request PDU becomes (see the module docstring)."""
    function = pdu[0] if pdu else 0
    try:
        req = decode_request(pdu)
    except ModbusPduError as exc:
        return Planned(Plan.REFUSE, function & 0x7F, exception=int(exc.exception))
    if isinstance(req, ReadRegisters | ReadBits):
        return Planned(Plan.READ, function, req)
    if isinstance(req, WriteSingleRegister | WriteMultipleRegisters):
        return Planned(Plan.WRITE, function, req)
    return Planned(Plan.REFUSE, function, exception=int(ModbusException.ILLEGAL_FUNCTION))


ANSWERS: dict[tuple[Outcome, str], int] = {
    (Outcome.NOT_EXECUTED, "BUSY"): BUSY,
    (Outcome.NOT_EXECUTED, ""): int(GatewayException.GATEWAY_PATH_UNAVAILABLE),
    (Outcome.REJECTED, "UNKNOWN_PORT"): int(GatewayException.GATEWAY_PATH_UNAVAILABLE),
    (Outcome.REJECTED, "NO_REGISTER"): int(ModbusException.ILLEGAL_DATA_ADDRESS),
    (Outcome.REJECTED, ""): int(ModbusException.ILLEGAL_DATA_VALUE),
    (Outcome.UNKNOWN, ""): int(GatewayException.GATEWAY_TARGET_FAILED),
}
"""(outcome, reason) -> the exception code a Modbus client gets ("": any other reason of that
outcome); a REJECTED that carries the device's own exception code answers with that code."""


def exception_for(outcome: Outcome, reason: str, exception_code: int | None) -> int:
    """The exception code of a call that did not end OK (``ANSWERS``)."""
    if outcome is Outcome.REJECTED and exception_code is not None:
        return exception_code
    return ANSWERS.get((outcome, reason), ANSWERS[(outcome, "")])


def answer_pdu(planned: Planned, outcome: Outcome | None, reason: str = "",
               exception_code: int | None = None, values: tuple[int, ...] = ()) -> bytes:
    """The answer PDU for ``planned`` once the port did it (``outcome`` None: refused here)."""
    req = planned.request
    if planned.plan is Plan.REFUSE or req is None or outcome is None:
        code = planned.exception if planned.exception is not None else int(
            ModbusException.ILLEGAL_FUNCTION)
        return _exception(planned.function, code)
    if outcome is not Outcome.OK:
        return _exception(planned.function, exception_for(outcome, reason, exception_code))
    if isinstance(req, ReadRegisters):
        return encode_response(ReadRegistersResponse(req.function, values[:req.count]))
    if isinstance(req, ReadBits):
        return encode_response(ReadBitsResponse(req.function, values[:req.count]))
    if isinstance(req, WriteSingleRegister):
        return encode_response(WriteSingleRegisterResponse(req.address, req.value))
    if isinstance(req, WriteMultipleRegisters):
        return encode_response(WriteMultipleRegistersResponse(req.address, len(req.values)))
    return _exception(planned.function, int(ModbusException.ILLEGAL_FUNCTION))


def _exception(function: int, code: int) -> bytes:
    if code in set(ModbusException):
        return encode_response(ExceptionResponse(function & 0x7F, ModbusException(code)))
    return bytes([(function & 0x7F) | 0x80, code])


__all__ = ["ANSWERS", "BUSY", "Plan", "Planned", "answer_pdu", "exception_for",
           "plan"]
