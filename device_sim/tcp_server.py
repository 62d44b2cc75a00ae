"""The simulator's Modbus TCP face: the same slave as ``idemlink sim --modbus-rtu`` (an
``RtuServer``'s core and flash), its requests and answers in MBAP frames.

Contract:

- ``TcpConnection(server)`` is one client connection, sans-I/O: ``receive_data(data, now)``
  takes the bytes a read returned (MBAP frames, ``idemlink.protocol.modbus_tcp.MbapDecoder``:
  a garbled header drops the buffer), ``data_to_send()`` drains the answers. A request for the
  server's unit, or for unit 255 or 0 (the Modbus TCP "this server" ids: Modbus Messaging on
  TCP/IP V1.0b, 4.4.2), is executed by ``RtuServer.execute`` (the one rule: persisted first)
  and answered under its transaction id and unit id; a request for another unit gets no
  answer, as a device on its own IP address that is not a gateway ignores it (``ignored``).
- ``serve_tcp(listener, server, stop, between=None)`` serves every connection of ``listener``
  (a bound, listening socket) until ``stop`` is set, in one thread: a ``selectors`` loop that
  waits at most ``TICK`` (20 ms) and then runs the core's timers (``tick``) and ``between(now)``
  (the control FIFO). A client that closes, or whose socket fails, is dropped alone; so is one
  that does not take an answer (its socket buffer full): the rest of an answer is never sent
  later into a stream it would misalign.
- ``parse_listen_address("[HOST:]PORT")``: ``(host, port)``, host 127.0.0.1 when only a port is
  given, port 0 meaning one the system picks; ``TcpAddressError`` otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from idemlink.device_sim.rtu_server import RtuServer
from idemlink.protocol.modbus_tcp import (
    MbapDecoder,
    TcpAddressError,
    encode_mbap,
    parse_tcp_address,
)

log = logging.getLogger(__name__)

TICK = 0.02
"""Longest wait for bytes before the core's timers run (seconds)."""
THIS_SERVER = frozenset({0, 255})


class TcpConnection:
    """One client's requests and answers (see the module docstring)."""

    def __init__(self, server: RtuServer) -> None:
        self.server = server
        self.decoder = MbapDecoder()
        self.answered = 0
        self.ignored = 0
        self._out = bytearray()

    def receive_data(self, data: bytes, now: float) -> None:
        self.decoder.receive_data(data)
        while (frame := self.decoder.next_event()) is not None:
            if frame.unit != self.server.unit and frame.unit not in THIS_SERVER:
                self.ignored += 1
                continue
            self._out += encode_mbap(frame.tid, frame.unit, self.server.execute(frame.pdu, now))
            self.answered += 1

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out


def parse_listen_address(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1) or ``HOST:PORT``; port 0: the system picks one."""
    text = text.strip()
    if text.isdigit():
        if int(text) > 65535:
            raise TcpAddressError(f"{text!r}: port {int(text)} outside 0..65535")
        return "127.0.0.1", int(text)
    if text.endswith(":0"):
        return parse_tcp_address(text[:-2])[0], 0
    return parse_tcp_address(text)


def serve_tcp(listener: socket.socket, server: RtuServer, stop: threading.Event,
              between: Callable[[float], None] | None = None,
              clock: Callable[[], float] = time.monotonic) -> None:
    """Serve ``server`` to every client of ``listener`` until ``stop`` is set."""
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    clients: dict[socket.socket, TcpConnection] = {}

    def drop(sock: socket.socket) -> None:
        sel.unregister(sock)
        clients.pop(sock, None)
        with contextlib.suppress(OSError):
            sock.close()

    try:
        while not stop.is_set():
            for key, _ in sel.select(TICK):
                if key.fileobj is listener:
                    with contextlib.suppress(BlockingIOError):
                        sock, peer = listener.accept()
                        sock.setblocking(False)
                        sel.register(sock, selectors.EVENT_READ, None)
                        clients[sock] = TcpConnection(server)
                        log.info("Modbus TCP client %s connected", peer)
                    continue
                sock = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    drop(sock)
                    continue
                conn = clients[sock]
                conn.receive_data(data, clock())
                answer = conn.data_to_send()
                if answer:
                    try:
                        sent = sock.send(answer)
                    except OSError:  # BlockingIOError too: the client stopped reading
                        sent = -1
                    if sent != len(answer):
                        log.warning("Modbus TCP client dropped: it did not take an answer")
                        drop(sock)
            now = clock()
            server.core.tick(now)
            if between is not None:
                between(now)
    finally:
        for sock in list(clients):
            drop(sock)
        sel.close()


__all__ = ["TICK", "TcpConnection", "parse_listen_address", "serve_tcp"]
