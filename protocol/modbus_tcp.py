"""Modbus TCP (sans-I/O): MBAP framing, and the master session over it.

Contract:

- An ADU is the MBAP header — transaction id (2 bytes), protocol id (2 bytes, always 0), length
  (2 bytes: the unit id and the PDU that follow), unit id (1 byte) — and the PDU (Modbus
  Messaging on TCP/IP Implementation Guide V1.0b, 3.1.3). ``encode_mbap(tid, unit, pdu)``;
  ``MbapDecoder`` is the streaming decoder: bytes in (``receive_data``), ``MbapFrame``s out
  (``next_event``). Its buffer is bounded (at most one ADU, ``MAX_ADU`` bytes, waits for its
  end; a burst is cut into frames as it comes). A header that cannot be an MBAP header (protocol
  id not 0, a length below 2 or above 254) means the stream is out of step: the decoder drops
  everything it holds and counts it (``resyncs``); TCP loses no bytes, so a peer that garbles one
  header is not worth trusting for the rest of that buffer, and the next segment starts afresh.
  Frames decoded and not yet taken are bounded too (``MAX_PENDING``: the oldest is dropped and
  counted in ``dropped``). ``discard_partial()`` drops the bytes of a frame not complete yet
  (counted in ``resyncs``): the master calls it before every send, so a truncated answer is
  never completed by the bytes of the next answer (a retry's, or the next request's) — the
  stream is out of step from the truncation on, and the next bytes are read as a new header.
- ``TcpMaster`` is ``idemlink.protocol.rtu_master.RtuMaster`` with MBAP instead of RTU framing:
  every rule of the RTU master holds unchanged (what the map lets be retried, the trigger read
  first and written only in IDLE, the ANSWER_MISMATCH of an answer of the right function that
  does not fit, what a plain slave cannot carry, broadcast at unit 0) because it is the RTU
  master's code, not a copy. What differs:

  * before every send (a retry too) the bytes of an answer not complete yet are dropped
    (``MbapDecoder.discard_partial``): a truncated answer the deadline ran out on is no answer,
    and the next answer's bytes never complete it (that made a wrong value OK).
  * every send (a retry too) carries a new transaction id; an answer is taken only when its id
    is one this request was sent under (a retry's answer or the first send's late one: either is
    the answer to this request) and its unit is the request's. An answer with any other id — a
    late answer to an earlier request, however well it fits the current one — is ignored and
    counted (``late``). This closes the RTU master's one limit (docs/MODBUS_RTU.md): no late
    answer is ever taken for a later request.
  * no line timing: the wait for an answer is ``timeout``; requests follow each other at once
    (no t3.5), one at a time (``max_inflight`` 1: a plain slave or a gateway to a serial line).
  * gateway exceptions (``GatewayException``) are the RTU master's rule, since an RTU gateway
    can sit in front of a serial line too (``RtuMaster._other_exception``): 0x0A (the gateway
    has no path to the target) means nothing reached the device: NOT_EXECUTED — unless an
    earlier send of the same request went unanswered (it may have run): then UNKNOWN. 0x0B (the
    target did not answer the gateway) is the RTU line's silence seen from TCP: it is treated
    exactly as no answer — sent again where the map allows it, then UNKNOWN
    (``Status.NO_ANSWER``) for anything that may have had an effect, a trigger start whose state
    read got none NOT_EXECUTED. ``Completion.detail`` names the exception. Neither code is in
    ``ModbusException`` (the framed contract), so neither changes the contract's hash.
- ``parse_tcp_address("HOST[:PORT]")`` is ``(host, port)``, port 502 by default; IPv6 in
  brackets (``[::1]:1502``). ``TcpAddressError`` (a ``ValueError``) for anything else.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT
from idemlink.protocol.modbus import EXCEPTION_FLAG, answer_fits
from idemlink.protocol.modbus_rtu import BROADCAST_UNIT
from idemlink.protocol.outcome import LocalProtocolError
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.rtu_master import RtuMaster, _Request, misfit

DEFAULT_TCP_PORT = 502
MBAP_HEADER = 7  #: transaction id, protocol id, length, unit id
MAX_PDU = 253
MAX_ADU = MBAP_HEADER + MAX_PDU  #: 260
MAX_PENDING = 64
"""Decoded frames kept until taken; more is a peer flooding us (the oldest are dropped)."""

frame_log = logging.getLogger("idemlink.frames")


class TcpAddressError(LocalProtocolError, ValueError):
    """A ``--modbus-tcp`` address that is not ``HOST[:PORT]``."""


def parse_tcp_address(text: str) -> tuple[str, int]:
    """``HOST[:PORT]`` (``[V6ADDR]:PORT`` for IPv6) as ``(host, port)``; port 502 by default."""
    text = text.strip()
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (end + 1 < len(text) and text[end + 1] != ":"):
            raise TcpAddressError(f"{text!r} is not HOST[:PORT] ([::1]:502 for IPv6)")
        host, port_text = text[1:end], text[end + 2:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif text.count(":") > 1:
        raise TcpAddressError(f"{text!r}: an IPv6 address goes in brackets: [{text}]:502")
    if not host:
        raise TcpAddressError(f"{text!r} has no host (HOST[:PORT])")
    if not port_text:
        return host, DEFAULT_TCP_PORT
    try:
        port = int(port_text)
    except ValueError:
        raise TcpAddressError(f"{text!r}: port {port_text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise TcpAddressError(f"{text!r}: port {port} outside 1..65535")
    return host, port


def encode_mbap(tid: int, unit: int, pdu: bytes) -> bytes:
    """The ADU carrying ``pdu`` for ``unit`` under transaction id ``tid``."""
    if not 0 <= tid <= 0xFFFF:
        raise ValueError(f"transaction id {tid} outside 0..65535")
    if not 0 <= unit <= 0xFF:
        raise ValueError(f"unit id {unit} outside 0..255")
    if not 1 <= len(pdu) <= MAX_PDU:
        raise ValueError(f"a PDU has 1..{MAX_PDU} bytes, not {len(pdu)}")
    return (tid.to_bytes(2, "big") + b"\x00\x00" + (len(pdu) + 1).to_bytes(2, "big")
            + bytes([unit]) + pdu)


@dataclass(frozen=True, slots=True)
class MbapFrame:
    tid: int
    unit: int
    pdu: bytes


class MbapDecoder:
    """MBAP frames out of a TCP byte stream (see the module docstring)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._events: deque[MbapFrame] = deque()
        self.resyncs = 0  #: garbled headers: the buffer was dropped
        self.dropped = 0  #: frames dropped because ``MAX_PENDING`` were not taken

    def receive_data(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= MBAP_HEADER:
            length = int.from_bytes(buf[4:6], "big")
            if buf[2:4] != b"\x00\x00" or not 2 <= length <= MAX_PDU + 1:
                self.resyncs += 1
                if frame_log.isEnabledFor(logging.DEBUG):
                    frame_log.debug("rx MBAP header %s garbled: %d byte(s) dropped",
                                    bytes(buf[:MBAP_HEADER]).hex(" "), len(buf))
                buf.clear()
                return
            end = 6 + length
            if len(buf) < end:
                return
            if len(self._events) >= MAX_PENDING:
                self._events.popleft()
                self.dropped += 1
            self._events.append(MbapFrame(int.from_bytes(buf[0:2], "big"), buf[6],
                                          bytes(buf[7:end])))
            del buf[:end]

    def next_event(self) -> MbapFrame | None:
        return self._events.popleft() if self._events else None

    def discard_partial(self) -> int:
        """Drop the bytes held of a frame not complete yet (a truncated answer that will never
        be completed by its own bytes); counted in ``resyncs``. The number of bytes dropped."""
        held = len(self._buf)
        if held:
            self.resyncs += 1
            if frame_log.isEnabledFor(logging.DEBUG):
                frame_log.debug("rx MBAP partial frame %s dropped: never completed before the "
                                "next send", bytes(self._buf).hex(" "))
            self._buf.clear()
        return held

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not complete yet (at most ``MAX_ADU - 1``)."""
        return len(self._buf)


class GatewayException(IntEnum):
    """The gateway's own exception codes (Modbus Application Protocol V1.1b3, 7)."""

    GATEWAY_PATH_UNAVAILABLE = 0x0A
    GATEWAY_TARGET_FAILED = 0x0B


def gateway_exception(pdu: bytes) -> GatewayException | None:
    """The gateway exception an answer PDU carries, or None."""
    if len(pdu) == 2 and pdu[0] & EXCEPTION_FLAG and pdu[1] in set(GatewayException):
        return GatewayException(pdu[1])
    return None


class TcpMaster(RtuMaster):
    """One Modbus TCP master on one connection. See the module docstring."""

    def __init__(self, regmap: RegisterMap, *, unit: int = 1, timeout: float = 1.0,
                 attempts: int = 5, turnaround: float = 0.1) -> None:
        super().__init__(regmap, unit=unit, baudrate=None, timeout=timeout, attempts=attempts,
                         turnaround=turnaround, char_format=MODBUS_CHAR_FORMAT)
        self.frame_gap = 0.0  # no line to leave silent between requests
        self.late_guard = False  # transaction ids tell a late answer apart: no guard window
        self.mbap = MbapDecoder()
        self.late = 0  #: answers under a transaction id no request out was sent with
        self._next_tid = 1
        self._live: set[int] = set()  #: the transaction ids the request out was sent under

    @property
    def resyncs(self) -> int:
        return self.mbap.resyncs

    def receive_data(self, data: bytes, now: float) -> None:
        if not data:
            return
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("rx MBAP bytes %s", data.hex(" "))
        self.mbap.receive_data(data)
        while (frame := self.mbap.next_event()) is not None:
            req = self._current
            if req is None or frame.tid not in self._live:
                self.late += 1
                self._ignore(frame.unit, frame.pdu, f"transaction id {frame.tid} is no request's "
                                                    "out (a late answer)")
            elif req.unit == BROADCAST_UNIT or frame.unit != req.unit:
                self._ignore(frame.unit, frame.pdu, "another unit")
            elif not answer_fits(req.wire, frame.pdu):
                if frame.pdu[:1] == req.wire[:1]:
                    req.misfit = misfit(req.wire, frame.pdu)
                self._ignore(frame.unit, frame.pdu, req.misfit or "another function")
            else:
                self._answered(req, frame.pdu, now)

    def tick(self, now: float) -> None:
        self._stale = False  # transaction ids tell late answers apart: nothing to drain first
        super().tick(now)

    def _send(self, req: _Request, now: float) -> None:
        self.mbap.discard_partial()  # a truncated answer is never completed by the next one's
        if req.attempts == 0:  # a new request (or a trigger's write after its read)
            self._live.clear()
        tid = self._next_tid
        self._next_tid = tid % 0xFFFF + 1
        self._live.add(tid)
        adu = encode_mbap(tid, req.unit, req.wire)
        self._out += adu
        self.sent += 1
        req.attempts += 1
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("tx MBAP tid=%d unit=%d fc=0x%02x attempt=%d: %s", tid, req.unit,
                            req.wire[0], req.attempts, adu.hex(" "))
        req.deadline = now + (self.turnaround if req.unit == BROADCAST_UNIT else self.timeout)
        req.stretch_until = req.deadline


__all__ = ["DEFAULT_TCP_PORT", "MAX_ADU", "MAX_PENDING", "MBAP_HEADER", "GatewayException",
           "MbapDecoder", "MbapFrame", "TcpAddressError", "TcpMaster", "encode_mbap",
           "gateway_exception", "parse_tcp_address"]
