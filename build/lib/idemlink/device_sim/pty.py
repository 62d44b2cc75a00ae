"""Pseudo-terminal helper for the simulators.

Contract: ``open_pty()`` creates a pty pair in raw mode and returns a ``PtyPair`` whose
``slave_path`` any serial tool can open; the simulator serves the master side through
``FdTransport`` (``read(timeout) -> bytes``, ``write(bytes)``). The pair keeps its own slave fd
open so that a client closing and reopening the path does not hang up the master (no EIO).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import termios
import tty
from dataclasses import dataclass


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


class FdTransport:
    """Byte transport over a file descriptor (the master side of a pty)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, timeout: float) -> bytes:
        """Bytes available within ``timeout`` seconds (b"" when the line stayed silent)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return b""
        try:
            return os.read(self.fd, 4096)
        except OSError as exc:  # no reader on the slave side right now
            if exc.errno == errno.EIO:
                return b""
            raise

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [self.fd], [], 1.0)
            if not ready:
                raise TimeoutError("pty write stalled for 1 s")
            n = os.write(self.fd, view)
            view = view[n:]

    def close(self) -> None:
        pass  # the PtyPair owns the fd
