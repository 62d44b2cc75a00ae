"""Pseudo-terminal helper for the simulators.

Contract: ``open_pty()`` creates a pty pair in raw mode and returns a ``PtyPair`` whose
``slave_path`` any serial tool can open; the simulator serves the master side through
``FdTransport`` (``read(timeout) -> bytes``, ``write(bytes)``; a write the reader does not take
within ``WRITE_STALL`` is dropped with ``WriteStalled``, never blocking the device). The pair
keeps its own slave fd open so that a client closing and reopening the path does not hang up the
master (no EIO).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import termios
import threading
import tty
from dataclasses import dataclass

from idemlink.protocol.outcome import IdemlinkError


@dataclass(slots=True)
class PtyPair:
    master_fd: int
    slave_fd: int
    slave_path: str

    def close(self) -> None:
        for fd in (self.master_fd, self.slave_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def transport(self) -> FdTransport:
        return FdTransport(self.master_fd)


def open_pty() -> PtyPair:
    """A raw-mode pty pair (no echo, no line discipline, 8 bits)."""
    master, slave = os.openpty()
    for fd in (master, slave):
        tty.setraw(fd, termios.TCSANOW)
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return PtyPair(master, slave, os.ttyname(slave))


WRITE_STALL = 0.1
"""Longest wait for the reader to make room before the rest of an answer is dropped (seconds)."""


class WriteStalled(IdemlinkError, TimeoutError):
    """The reader did not take the bytes in time: ``unsent`` bytes of the answer were dropped."""

    def __init__(self, unsent: int) -> None:
        super().__init__(f"the reader took no bytes for {WRITE_STALL} s: {unsent} bytes dropped")
        self.unsent = unsent


class FdTransport:
    """Byte transport over a file descriptor (the master side of a pty).

    Writes never block for long: when the reader stops reading and the pty buffer is full, the
    rest of the answer is dropped after ``WRITE_STALL`` seconds (``WriteStalled``), and while the
    reader stays stalled further answers are dropped at once (like a UART whose transmit FIFO
    overflows). The serving loop counts them and keeps serving."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._stalled = False
        os.set_blocking(fd, False)
        self._wake: tuple[int, int] | None = None  #: a pipe, made on the first ``wake``
        self._wake_lock = threading.Lock()

    def wake(self) -> None:
        """End the wait of a ``read`` in progress, or of the next one (any thread; a simulated
        bus's devices in other processes have bytes for the medium)."""
        with self._wake_lock:
            if self._wake is None:
                r, w = os.pipe()
                os.set_blocking(r, False)
                os.set_blocking(w, False)
                self._wake = (r, w)
            wake = self._wake
        with contextlib.suppress(OSError):  # full: already woken
            os.write(wake[1], b"w")

    def read(self, timeout: float) -> bytes:
        """Bytes available within ``timeout`` seconds (b"" when the line stayed silent, or when
        ``wake`` ended the wait)."""
        wake = self._wake
        ready, _, _ = select.select([self.fd] if wake is None else [self.fd, wake[0]], [], [],
                                   timeout)
        if wake is not None and wake[0] in ready:
            with contextlib.suppress(OSError):
                os.read(wake[0], 4096)
            if self.fd not in ready:
                return b""
        if not ready:
            return b""
        try:
            return os.read(self.fd, 4096)
        except BlockingIOError:
            return b""
        except OSError as exc:  # no reader on the slave side right now
            if exc.errno == errno.EIO:
                return b""
            raise

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [self.fd], [], 0.0 if self._stalled else WRITE_STALL)
            n = 0
            if ready:
                try:
                    n = os.write(self.fd, view)
                except BlockingIOError:
                    n = 0
            if n == 0:
                self._stalled = True
                raise WriteStalled(len(view))
            view = view[n:]
        self._stalled = False

    def close(self) -> None:
        wake, self._wake = self._wake, None  # the PtyPair owns the fd; the wake pipe is ours
        for fd in wake or ():
            with contextlib.suppress(OSError):
                os.close(fd)
