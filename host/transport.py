"""The byte pipe under the driver, and the one place a pyserial port is opened.

``Transport`` is what every driver needs from a line (``write``, ``read(timeout)``, ``now``,
``close``: the clock travels with the line, so a simulated line can bring simulated time).
``open_port(url, ...)`` opens any pyserial URL the way every idemlink tool opens one: DTR/RTS set
low *before* opening (many boards wire reset to DTR), a local serial device locked exclusively
(``PortBusy`` when another program holds it), pyserial's and the OS's failures turned into one
``PortError`` naming the URL. The line's baud rate and character format (``bytesize``,
``parity``, ``stopbits``; default 8N1, ``idemlink.protocol.char_format``) are set here; a format
a serial line cannot take is ``CharFormatError`` (a ``ValueError``) before the port is touched.
A pseudo-terminal has no data bits or parity to set (Linux keeps 8 bits, no parity, and a
recent kernel refuses, EINVAL, a request whose only change is one it cannot keep): a pty is
opened with 8 data bits and no parity whatever was asked (the stop bits as asked), so a format
is accepted there but not enforced. ``SerialTransport`` is a ``Transport`` over such a port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import TYPE_CHECKING, Protocol

from idemlink.host.errors import BaudrateError, PortBusy, PortError
from idemlink.protocol.char_format import CharFormat

if TYPE_CHECKING:
    from serial import Serial

log = logging.getLogger(__name__)

POLL_STEP = 0.005
"""Read timeout of a port without a file descriptor: how late a deadline may be noticed."""


class Transport(Protocol):
    """What the driver needs from a byte pipe: the clock travels with it."""

    def write(self, data: bytes) -> None: ...
    def read(self, timeout: float) -> bytes: ...
    def now(self) -> float: ...
    def close(self) -> None: ...


def open_port(url: str, *, baudrate: int = 115200, bytesize: int = 8, parity: str = "N",
              stopbits: float = 1, keep_lines: bool = True, exclusive: bool = True,
              timeout: float | None = 0) -> Serial:
    """An open pyserial port on ``url`` (any pyserial URL) at ``baudrate`` with the character
    format ``bytesize``/``parity``/``stopbits`` (``CharFormatError`` for one a line cannot
    take; ``BaudrateError`` for a baud rate outside 1..20,000,000). ``keep_lines``: DTR and RTS
    are set low
    before opening, so opening does not pulse a reset line (False leaves pyserial's defaults).
    ``exclusive``: a local serial device is locked (an advisory ``flock``, released when the
    process dies) — a second program driving it would take our answers — and a port already
    locked raises ``PortBusy``. Any other failure raises ``PortError`` ("cannot open URL: why")."""
    import serial

    from idemlink.protocol.link_profile import ProfileError, parse_baudrate

    try:  # the CLI's rule (--baudrate), for the API too: before anything is opened
        parse_baudrate(baudrate, text=False)
    except ProfileError as exc:
        raise BaudrateError(f"baud rate {exc}") from None
    fmt = opened_format(url, CharFormat(bytesize, parity, stopbits))
    failures: tuple[type[Exception], ...] = (serial.SerialException, ValueError, OSError,
                                             *_TERMIOS_ERRORS)
    try:
        port = serial.serial_for_url(url, baudrate=baudrate, bytesize=fmt.bytesize,
                                     parity=fmt.parity, stopbits=fmt.stopbits, timeout=timeout,
                                     do_not_open=True)
        if keep_lines:
            port.dtr = False
            port.rts = False
        if exclusive and hasattr(port, "exclusive"):
            port.exclusive = True
        port.open()
    except failures as exc:
        if "exclusively lock" in str(exc):
            from idemlink.host.port_hint import busy_message

            raise PortBusy(busy_message(url)) from exc
        hint = ""
        if url.startswith("rfc2217://") and "option 'control'" in str(exc):
            hint = (" (the server does not answer RFC 2217 line control, as ser2net on a pty "
                    "does not: add ?ign_set_control to the URL)")
        raise PortError(f"cannot open {url}: {_reason(exc)}{hint}") from exc
    return port


try:
    import termios

    _TERMIOS_ERRORS: tuple[type[Exception], ...] = (termios.error,)
    """pyserial lets the line's ``tcsetattr`` failure through as ``termios.error`` (no OSError)."""
except ImportError:  # pragma: no cover - not a POSIX system
    _TERMIOS_ERRORS = ()

PTY_SLAVE_MAJORS = range(136, 144)
"""Linux's Unix98 pty slaves (/dev/pts/N): character devices of these major numbers."""


def opened_format(url: str, fmt: CharFormat) -> CharFormat:
    """The character format ``url`` is opened with: ``fmt``, but 8 data bits and no parity on a
    pseudo-terminal (it has neither; a recent Linux refuses a request whose only change is one
    of them, EINVAL), the stop bits as asked."""
    if (fmt.bytesize, fmt.parity) == (8, "N") or not is_pty(url):
        return fmt
    log.debug("%s is a pseudo-terminal: %s accepted, opened as 8N (a pty has neither data bits "
              "nor parity)", url, fmt)
    return CharFormat(8, "N", fmt.stopbits)


def is_pty(url: str) -> bool:
    """Whether ``url`` names a pseudo-terminal (a symbolic link to one too, as socat makes)."""
    if "://" in url:
        return False
    try:
        real = os.path.realpath(url)
        st = os.stat(real)
    except (OSError, ValueError):
        return False
    if not stat.S_ISCHR(st.st_mode):
        return False
    return real.startswith("/dev/pts/") or os.major(st.st_rdev) in PTY_SLAVE_MAJORS


def _reason(exc: BaseException) -> str:
    """Why a port did not open, without the path pyserial repeats in its message ("could not
    open port /dev/x: [Errno 2] No such file or directory: '/dev/x'" -> "No such file or
    directory")."""
    errno = getattr(exc, "errno", None)
    if isinstance(errno, int) and errno > 0:
        import os

        return os.strerror(errno)
    return str(exc)


class SerialTransport:
    """A pyserial port (any URL) opened by ``open_port`` (DTR/RTS low unless ``keep_lines=False``,
    exclusive: "port busy" is ``PortBusy``). Reads wait in ``select()`` on the port's descriptor,
    or, without one, in short steps of ``POLL_STEP``. ``wake()`` (from any thread) ends the wait
    of a ``read`` early, with what has arrived so far (maybe nothing): another thread sharing the
    device has a command to send."""

    def __init__(self, url: str, *, baudrate: int = 115200, bytesize: int = 8, parity: str = "N",
                 stopbits: float = 1, keep_lines: bool = True) -> None:
        import time

        self._clock = time.monotonic
        port = open_port(url, baudrate=baudrate, bytesize=bytesize, parity=parity,
                         stopbits=stopbits, keep_lines=keep_lines)
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
        self._woken = False
        self._wake_r, self._wake_w = os.pipe()  # select() on the port's descriptor watches it too
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_fds: tuple[int, ...] = (self._wake_r, self._wake_w)

    def wake(self) -> None:
        """End the wait of a ``read`` in progress, or of the next one (any thread may call it)."""
        self._woken = True
        if self._wake_fds:
            with contextlib.suppress(OSError):  # full: already woken
                os.write(self._wake_w, b"w")

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

            ready, _, _ = select.select([self._fd, self._wake_r], [], [], max(0.0, timeout))
            if self._wake_r in ready:
                self._woken = False
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
                if self._fd not in ready:
                    return b""
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
            if self._woken or self._clock() >= deadline:
                self._woken = False
                return b""

    def now(self) -> float:
        return self._clock()

    def close(self) -> None:
        try:
            self.port.close()
        except OSError as exc:  # a port that already failed may fail to close too
            log.warning("closing %s: %s", self.port.name, exc)
        finally:
            fds, self._wake_fds = self._wake_fds, ()  # closed once: a number may be reused
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)


__all__ = [
    "POLL_STEP",
    "SerialTransport",
    "Transport",
    "is_pty",
    "open_port",
    "opened_format",
]
