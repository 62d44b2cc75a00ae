"""The gateway's Modbus TCP face: SCADA and PLC clients that know only Modbus read and write the
gateway's ports as Modbus TCP units.

Contract (docs/GATEWAY.md, "Modbus TCP for clients that know only Modbus"):

- ``ModbusFace(gateway, units, read_only)`` serves MBAP connections (``serve`` on an asyncio
  server, ``idemlink gateway --modbus-tcp HOST:PORT``). Unit ``u`` is the port ``units[u]``
  (``--modbus-unit U=PORT``; by default port number ``i`` of the gateway, in the order given, is
  unit ``i``, and with one port units 0 and 255 — Modbus TCP's "this server" — are it too). A
  unit no port answers to: 0x0A at once.
- What passes and the answer of every outcome are ``idemlink.protocol.modbus_tcp_face``'s rules.
  A read is ``Gateway.read_words`` (on the port's shared pipeline, read-only, nothing stored). A
  register write is one call of the call layer (``Gateway.call``) under a new key — Modbus
  carries none, so a client's own retry is a new call: set-only values are harmless to repeat; a
  trigger start and a fault clear go as the gateway's ``trigger`` and ``clear`` (the map's rules:
  the trigger's state read first, started only when idle; the clear sent once) and a client's
  retry of them is a new trigger or clear. Every call is stored and audited as the caller
  ``modbus-tcp@HOST`` (the client's address). ``read_only``: every write is refused
  ILLEGAL_FUNCTION.
- One connection's requests are answered in the order they came, one at a time, each under its
  own transaction id and unit id; connections are served at once (their calls share the
  ports' pipelines), so answers never mix. A connection's input is bounded by the MBAP decoder
  (one ADU buffered, fed ``FEED`` bytes at a time so no pipelined request is dropped); a
  client that closes is dropped alone. At most ``MAX_CONNECTIONS`` connections are served at once
  (one more is closed at once, logged); a connection that completes no request for
  ``IDLE_SECONDS`` — silent, or sending a frame it never finishes — or that takes no answer
  for as long (it sends and never reads) is closed: a client that opens connections and never
  sends or reads cannot take every place, nor the process's file
  descriptors from its ports and store.
- Modbus TCP has no authentication: the face listens only where ``--modbus-tcp`` says (a
  loopback address unless given another); a write is audited with the client's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from idemlink.gateway.calls import CallError
from idemlink.gateway.service import Gateway
from idemlink.host.command import CommandBuilder, CommandKind
from idemlink.host.keys import new_key
from idemlink.protocol.modbus import ReadBits, ReadRegisters
from idemlink.protocol.modbus_tcp import MbapDecoder, encode_mbap
from idemlink.protocol.modbus_tcp_face import Plan, Planned, answer_pdu, plan
from idemlink.protocol.outcome import LocalProtocolError, ModbusException, Outcome
from idemlink.protocol.registers import RegisterKind

log = logging.getLogger(__name__)

THIS_SERVER = (0, 255)
MAX_CONNECTIONS = 32
IDLE_SECONDS = 60.0
"""A connection that completes no request for this long is closed (mbusd's default too)."""
READ_CHUNK = 4096
FEED = 128
"""Bytes given to the MBAP decoder at once, its frames answered before the next slice: with the
partial frame it may hold (``MAX_ADU`` - 1) at most 48 frames of 8 bytes, under its
``MAX_PENDING`` (64), past which it drops the oldest — a client pipelining 100 requests in one
write lost the first 36 unanswered."""


def default_units(ports: list[str]) -> dict[int, str]:
    """Port ``i`` (1-based, in the order given) is unit ``i``; one port is also units 0, 255."""
    units = {i: name for i, name in enumerate(ports, 1) if i <= 247}
    if len(ports) == 1:
        units.update({u: ports[0] for u in THIS_SERVER})
    return units


def _table(planned: Planned) -> tuple[str, int, int]:
    req = planned.request
    if isinstance(req, ReadRegisters):
        return ("input" if req.function == 4 else "holding"), req.address, req.count
    assert isinstance(req, ReadBits)
    return ("discrete" if req.function == 2 else "coils"), req.address, req.count


class ModbusFace:
    """See the module docstring."""

    def __init__(self, gateway: Gateway, units: Mapping[int, str], *,
                 read_only: bool = False) -> None:
        self.gateway = gateway
        self.units = dict(units)
        self.read_only = read_only
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, until it closes."""
        peer = writer.get_extra_info("peername")
        caller = f"modbus-tcp@{peer[0] if peer else 'unknown'}"[:64]
        if self.connections >= MAX_CONNECTIONS:
            log.warning("modbus tcp %s: %d connections are served already: closed", caller,
                        self.connections)
            writer.close()
            return
        decoder = MbapDecoder()
        self.connections += 1
        loop = asyncio.get_running_loop()
        idle_until = loop.time() + IDLE_SECONDS
        try:
            while data := await asyncio.wait_for(reader.read(READ_CHUNK),
                                                 max(0.0, idle_until - loop.time())):
                for at in range(0, len(data), FEED):  # a slice at a time: the decoder keeps
                    decoder.receive_data(data[at:at + FEED])  # at most MAX_PENDING frames
                    while (frame := decoder.next_event()) is not None:
                        pdu = await self.answer(caller, frame.unit, frame.pdu)
                        writer.write(encode_mbap(frame.tid, frame.unit, pdu))
                        await asyncio.wait_for(writer.drain(), IDLE_SECONDS)
                        idle_until = loop.time() + IDLE_SECONDS
        except TimeoutError:
            log.info("modbus tcp %s: no request completed, or no answer taken, for %g s: "
                     "closed", caller, IDLE_SECONDS)
        except (ConnectionError, OSError) as exc:
            log.info("modbus tcp %s: %s", caller, exc)
        finally:
            self.connections -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def answer(self, caller: str, unit: int, pdu: bytes) -> bytes:
        """The answer PDU to one request of ``caller`` for ``unit``."""
        planned = plan(pdu)
        if planned.plan is Plan.REFUSE:
            return answer_pdu(planned, None)
        port = self.units.get(unit)
        if port is None or port not in self.gateway.ports:
            return answer_pdu(planned, Outcome.NOT_EXECUTED, "NO_PATH")
        if planned.plan is Plan.READ:
            table, address, count = _table(planned)
            try:
                got = await self.gateway.read_words(port, address, count, table)
            except CallError:
                return answer_pdu(planned, Outcome.REJECTED, "NO_REGISTER")
            return self._answered(planned, got.body)
        if self.read_only:
            return answer_pdu(Planned(Plan.REFUSE, planned.function,
                                      exception=int(ModbusException.ILLEGAL_FUNCTION)), None)
        try:
            op, args = self._call_of(port, pdu)
        except (LocalProtocolError, ValueError):
            return answer_pdu(planned, Outcome.REJECTED, "NO_REGISTER")
        got = await self.gateway.call(caller, new_key(time.time()), port, op, args)
        return self._answered(planned, got.body)

    def _call_of(self, port: str, pdu: bytes) -> tuple[str, dict[str, Any]]:
        """The call a register write is, by the port's map (``command_of_pdu``: a write to a
        fault register is a clear, to a trigger register a start or reset)."""
        builder = CommandBuilder(self.gateway.ports[port].spec.regmap)
        command = builder.command_of_pdu(pdu)
        spec = builder.regmap.at(command.address)
        if spec is not None and command.kind is CommandKind.CLEAR_FAULTS:
            return "clear", {"mask": command.values[0], "register": spec.name}
        if spec is not None and spec.kind is RegisterKind.TRIGGER and len(command.values) == 1:
            if command.values[0] not in (0, 1):
                raise LocalProtocolError("a trigger register takes 1 (start) or 0 (reset)")
            return "trigger", {"register": spec.name, "reset": command.values[0] == 0}
        return "write", {"values": builder.named_values(command)}

    @staticmethod
    def _answered(planned: Planned, body: Mapping[str, Any]) -> bytes:
        word = str(body.get("outcome", ""))
        outcome = Outcome[word] if word in Outcome.__members__ else Outcome.UNKNOWN
        result: Mapping[str, Any] = body.get("result") or {}
        reason = str(body.get("reason", ""))
        if reason == "REJECTED" or reason.startswith("ILLEGAL"):
            reason = ""
        values = tuple(body.get("words") or ())
        return answer_pdu(planned, outcome, reason, result.get("exception_code"), values)


__all__ = ["IDLE_SECONDS", "MAX_CONNECTIONS", "ModbusFace", "default_units"]
