"""The asyncio byte pipe under ``idemlink.host.aio.AsyncDevice``: a pyserial port on the event loop.

``AsyncTransport`` is what the asyncio driver needs from a line (``await write``, ``await
read(timeout)``, ``now``, ``await close``). ``AsyncSerialTransport`` opens any pyserial URL with
``idemlink.host.transport.open_port`` (the one place a port is opened: DTR/RTS low, exclusive) and
reads it through the loop's readiness callback, or through one helper thread for a port without a
file descriptor; see its docstring. It changes with the event loop and pyserial, not with the
protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from idemlink.host.errors import PortError
from idemlink.host.transport import open_port

log = logging.getLogger("idemlink.host.aio")

_READ_CHUNK = 4096
ROUND_BYTES = 512
"""Most bytes one ``AsyncSerialTransport.read`` returns (about a dozen answers): what one round of
the request loop works through before the event loop gets a turn."""


class AsyncTransport(Protocol):
    async def write(self, data: bytes) -> None: ...
    async def read(self, timeout: float) -> bytes: ...
    def now(self) -> float: ...
    async def close(self) -> None: ...


class AsyncSerialTransport:
    """A pyserial port driven by the event loop.

    The port is opened by pyserial (same URLs, same DTR/RTS handling as the blocking
    ``SerialTransport``), so every URL handler works and YMODEM can borrow the very same port.
    A port with a file descriptor (ttys, ptys, ``socket://``) is read through the loop's
    readiness callback (``loop.add_reader``) and written with non-blocking ``os.write`` (waiting
    in ``loop.add_writer`` when the kernel's buffer is full): no thread, no polling, and the
    callback only moves bytes into a buffer. A port without one (``rfc2217://``, ``loop://``,
    ``faulty://``) is read by one helper thread that hands bytes to the loop
    (``call_soon_threadsafe``), and written from a worker thread.
    """

    def __init__(self, port: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.port = port
        self._loop = loop
        self._buf = bytearray()
        self._more_waiting = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._fd = _fileno(port)
        self._thread: threading.Thread | None = None
        self._running = threading.Event()  # the helper thread reads while set
        self._idle = threading.Event()  # the helper thread is not inside a read
        if self._fd is not None:
            os.set_blocking(self._fd, False)
            loop.add_reader(self._fd, self._on_readable)
        else:
            port.timeout = 0.02
            self._running.set()
            self._thread = threading.Thread(target=self._pump, name=f"aio-{port.name}",
                                            daemon=True)
            self._thread.start()

    @classmethod
    async def open(cls, url: str, *, baudrate: int = 115200, bytesize: int = 8,
                   parity: str = "N", stopbits: float = 1,
                   keep_lines: bool = True) -> AsyncSerialTransport:
        """Open ``url`` with ``idemlink.host.transport.open_port``, as the blocking driver does (a
        network URL's connection is made in a worker thread)."""
        port = await asyncio.to_thread(open_port, url, baudrate=baudrate, bytesize=bytesize,
                                       parity=parity, stopbits=stopbits, keep_lines=keep_lines)
        return cls(port, asyncio.get_running_loop())

    # -------------------------------------------------------------- reading
    def _on_readable(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(PortError(f"{self.port.name}: read failed: {exc}"))
            return
        if not data:
            self._fail(PortError(f"{self.port.name}: closed by the other end"))
            return
        self._feed(data)

    def _pump(self) -> None:
        while not self._closed:
            if not self._running.wait(0.1):
                continue
            self._idle.clear()
            try:
                if not self._running.is_set():
                    continue
                data = self.port.read(max(1, self.port.in_waiting))
            except Exception as exc:  # pyserial raises several types on a dying port
                if not self._closed:
                    self._call(self._fail, PortError(f"{self.port.name}: read failed: {exc}"))
                return
            finally:
                self._idle.set()
            if data:
                self._call(self._feed, bytes(data))

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(fn, *args)

    def _feed(self, data: bytes) -> None:
        self._buf += data
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def read(self, timeout: float) -> bytes:
        """What has arrived (at most ``ROUND_BYTES``), waiting at most ``timeout`` seconds for
        the first byte. When more was waiting than one call returns, the next call first lets
        the loop run other callbacks: a backlog (a loop busy with many devices) is worked off in
        short slices instead of one long callback."""
        if self._more_waiting:
            self._more_waiting = False
            await asyncio.sleep(0)
        if not self._buf and self._error is None and timeout > 0:
            waiter = self._loop.create_future()
            self._waiter = waiter
            timer = self._loop.call_later(timeout, _settle, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        if self._buf:
            data = bytes(self._buf[:ROUND_BYTES])
            del self._buf[:ROUND_BYTES]
            self._more_waiting = bool(self._buf)
            return data
        if self._error is not None:
            raise self._error
        return b""

    # -------------------------------------------------------------- writing
    async def write(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise PortError(f"{self.port.name}: write on a closed port")
        if self._fd is None:
            try:
                await asyncio.to_thread(self.port.write, data)
            except OSError as exc:
                raise PortError(f"{self.port.name}: write failed: {exc}") from exc
            return
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                raise PortError(f"{self.port.name}: write failed: {exc}") from exc
            view = view[n:]
            if view:
                await self._writable()

    async def _writable(self) -> None:
        assert self._fd is not None
        fut = self._loop.create_future()
        self._loop.add_writer(self._fd, _settle, fut)
        try:
            await fut
        finally:
            self._loop.remove_writer(self._fd)

    # -------------------------------------------------------------- the port for YMODEM
    @contextlib.asynccontextmanager
    async def borrowed(self) -> AsyncIterator[Any]:
        """Lend the pyserial port to blocking code run in a worker thread (YMODEM): the loop
        stops reading it meanwhile, and takes it back (non-blocking again) afterwards."""
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.set_blocking(self._fd, True)
        else:
            self._running.clear()
            await asyncio.to_thread(self._idle.wait, 1.0)
        self._buf.clear()
        try:
            yield self.port
        finally:
            if self._fd is not None:
                os.set_blocking(self._fd, False)
                if self._error is None and not self._closed:
                    self._loop.add_reader(self._fd, self._on_readable)
            else:
                self.port.timeout = 0.02
                self._running.set()

    def now(self) -> float:
        return time.monotonic()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
        self._running.set()  # let the helper thread see _closed
        self._fail(PortError(f"{self.port.name}: closed"))
        try:
            await asyncio.to_thread(self.port.close)
        except OSError as exc:
            log.warning("closing %s: %s", self.port.name, exc)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _fileno(port: Any) -> int | None:
    """The port's file descriptor, when the event loop can wait on it."""
    try:
        fd = port.fileno()
    except (AttributeError, OSError, NotImplementedError, ValueError):
        return None
    if not isinstance(fd, int) or fd < 0:
        return None
    with contextlib.suppress(OSError):
        os.fstat(fd)
        return fd
    return None


__all__ = ["ROUND_BYTES", "AsyncSerialTransport", "AsyncTransport"]
