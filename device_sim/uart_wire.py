"""A serial wire that carries each end's character format: a pty at one end, an RFC 2217 port at
the other, every byte framed bit by bit at the sender's format and sampled at the receiver's
(``idemlink.protocol.uart_line``), so a parity, data-bits or stop-bits mismatch garbles or loses
characters exactly as two UARTs set differently would.

Why the ends are what they are: a Linux pty carries no character format. Its driver forces 8 data
bits and clears the parity enable on every ``tcsetattr`` (``pty_set_termios``), so neither end
of a pty pair — nor anyone holding its master — can see whether a program opened it at 8E1 or
8N1; only the odd-parity flag, the stop bits and the speed are kept. An RFC 2217 port is told the
format: its client (pyserial's ``rfc2217://`` URL, as a network serial server's is) sends
SET-DATASIZE, SET-PARITY and SET-STOPSIZE, which the server answers — that end's format is what
the program under test asked for, read again at every burst.

Contract:

- ``UartWire(device_format, device_errors="discard", host_errors="deliver")`` opens a raw pty
  (``device_path``: the device under test opens it, at ``device_format`` — the device's own
  setting; the kept odd-parity and stop-bits flags of the pty are read at every burst and
  override the declaration's parity sense and stop bits) and listens on 127.0.0.1 for one RFC
  2217 client at a time (``url``: ``rfc2217://127.0.0.1:PORT``; the host's end, 8N1 until the
  client sets its format). ``start()`` serves on a thread until ``close()``; a context manager.
- Each chunk one end writes is one burst at its format, then an idle line; the other end's
  receiver samples it at its format (receivers are kept across bursts and made anew when a
  format changes). A character with a parity or framing error is delivered as sampled
  (``"deliver"``: what Linux's tty layer does for a port pyserial opened, ``INPCK`` off) or
  discarded (``"discard"``: what a Modbus RTU device does, Modbus over serial line V1.02 2.5.1).
- Ground truth: ``log`` holds one ``Burst`` per direction and chunk — which way, the bytes sent,
  both formats, the characters received and which had errors, the bytes passed on.
- Bytes that reach an end with no reader (no RFC 2217 client connected) are dropped, as on an
  unplugged line.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import termios
import threading
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from serial.rfc2217 import PortManager

from idemlink.device_sim.pty import PtyPair, open_pty
from idemlink.protocol.char_format import CharFormat
from idemlink.protocol.uart_line import RxChar, UartReceiver, transfer

ErrorPolicy = Literal["deliver", "discard"]

TO_HOST, TO_DEVICE = "to_host", "to_device"


@dataclass(frozen=True, slots=True)
class Burst:
    direction: str  #: TO_HOST (the device wrote) or TO_DEVICE (the host wrote)
    sent: bytes
    sender: CharFormat
    receiver: CharFormat
    received: tuple[RxChar, ...]
    passed: bytes  #: what the receiving end's program got

    @property
    def errors(self) -> int:
        return sum(1 for c in self.received if not c.ok)


class _PortSettings:
    """What RFC 2217's server side (pyserial's ``PortManager``) sets and reads: the client's
    line settings, and modem lines that are always up."""

    def __init__(self) -> None:
        self.baudrate = 9600
        self.bytesize = 8
        self.parity = "N"
        self.stopbits: float = 1
        self.rtscts = self.xonxoff = self.break_condition = False
        self.rts = self.dtr = True
        self.cts = self.dsr = self.cd = True
        self.ri = False

    def reset_input_buffer(self) -> None:
        pass

    def reset_output_buffer(self) -> None:
        pass

    @property
    def char_format(self) -> CharFormat:
        return CharFormat(self.bytesize, self.parity, self.stopbits)


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock, contextlib.suppress(OSError):
            self.sock.sendall(data)


def pty_format(fd: int, declared: CharFormat) -> CharFormat:
    """The format of the pty whose termios ``fd`` reads: ``declared``, with the parity sense
    (even/odd) and the stop bits the pty kept (its driver clears the parity enable and the data
    bits, so those come from the declaration)."""
    cflag = termios.tcgetattr(fd)[2]
    parity = declared.parity
    if parity in ("E", "O"):
        parity = "O" if cflag & termios.PARODD else "E"
    stop: float = 1
    if cflag & termios.CSTOPB:
        stop = 1.5 if declared.bytesize == 5 else 2
    return CharFormat(declared.bytesize, parity, stop)


@dataclass
class _Direction:
    policy: ErrorPolicy
    receiver: UartReceiver | None = None
    log: list[Burst] = field(default_factory=list)

    def carry(self, name: str, data: bytes, sender: CharFormat, receiving: CharFormat) -> bytes:
        if self.receiver is None or self.receiver.fmt != receiving:
            self.receiver = UartReceiver(receiving)
        chars = transfer(data, sender, self.receiver)
        passed = bytes(c.value for c in chars if c.ok or self.policy == "deliver")
        self.log.append(Burst(name, data, sender, receiving, tuple(chars), passed))
        return passed


class UartWire:
    """See the module docstring."""

    def __init__(self, device_format: CharFormat, *, device_errors: ErrorPolicy = "discard",
                 host_errors: ErrorPolicy = "deliver") -> None:
        self.device_format = device_format
        self.pty: PtyPair = open_pty()
        self.device_path = self.pty.slave_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"rfc2217://127.0.0.1:{self.listener.getsockname()[1]}"
        self.settings = _PortSettings()
        self.log: list[Burst] = []
        self._to_host = _Direction(host_errors, log=self.log)
        self._to_device = _Direction(device_errors, log=self.log)
        self._client: socket.socket | None = None
        self._manager: PortManager | None = None
        self._conn: _Connection | None = None
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()  #: guards ``log`` while serving

    # -------------------------------------------------------------------------------- formats
    @property
    def device_side(self) -> CharFormat:
        return pty_format(self.pty.master_fd, self.device_format)

    @property
    def host_side(self) -> CharFormat:
        return self.settings.char_format

    # -------------------------------------------------------------------------------- serving
    def start(self) -> UartWire:
        self._thread = threading.Thread(target=self._serve, name="uart-wire", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> UartWire:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join(5)
            self._thread = None
        for closable in (self._client, self.listener):
            if closable is not None:
                with contextlib.suppress(OSError):
                    closable.close()
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pty.close()

    def _serve(self) -> None:
        master = self.pty.master_fd
        os.set_blocking(master, False)
        while True:
            watched: list[int | socket.socket] = [self._stop_r, master, self.listener]
            if self._client is not None:
                watched.append(self._client)
            ready, _, _ = select.select(watched, [], [])
            if self._stop_r in ready:
                return
            if self.listener in ready:
                self._accept()
            if master in ready:
                self._from_device(master)
            if self._client is not None and self._client in ready:
                self._from_host()

    def _accept(self) -> None:
        sock, _ = self.listener.accept()
        if self._client is not None:  # one client at a time: the newer one takes the line
            with contextlib.suppress(OSError):
                self._client.close()
        self._client = sock
        self._conn = _Connection(sock)
        self.settings = _PortSettings()
        # pyserial's server side takes any object with a port's settings and a ``write``
        self._manager = PortManager(cast(Any, self.settings), cast(Any, self._conn))

    def _from_device(self, master: int) -> None:
        try:
            data = os.read(master, 4096)
        except (BlockingIOError, OSError):
            return
        if not data:
            return
        with self.lock:
            passed = self._to_host.carry(TO_HOST, data, self.device_side, self.host_side)
        if passed and self._conn is not None and self._manager is not None:
            self._conn.write(b"".join(self._manager.escape(passed)))

    def _from_host(self) -> None:
        assert self._client is not None and self._manager is not None
        try:
            data = self._client.recv(4096)
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(OSError):
                self._client.close()
            self._client = self._conn = self._manager = None
            return
        payload = b"".join(self._manager.filter(data))
        if not payload:
            return
        with self.lock:
            passed = self._to_device.carry(TO_DEVICE, payload, self.host_side, self.device_side)
        if passed:
            with contextlib.suppress(OSError):
                os.write(self.pty.master_fd, passed)


__all__ = ["TO_DEVICE", "TO_HOST", "Burst", "UartWire", "pty_format"]
