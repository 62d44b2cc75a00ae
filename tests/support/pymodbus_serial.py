"""pymodbus's own servers as real peers (serial RTU, Modbus TCP), each served by an event loop on a
thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


class BackgroundSerialServer:
    """``ModbusSerialServer(device, port=path, trace_packet=trace)`` serving until ``close()``;
    the constructor returns once the server exists."""

    def __init__(self, device: Any, path: str, trace: Callable[[bool, bytes], bytes]) -> None:
        from pymodbus.server import ModbusSerialServer

        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve() -> None:  # the server binds to the running loop
            self.server = ModbusSerialServer(device, port=path, baudrate=115200,
                                             trace_packet=trace)
            ready.set()
            await self.server.serve_forever()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(serve())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.shutdown(), self.loop).result(5)
        self.thread.join(5)


class BackgroundTcpServer:
    """``ModbusTcpServer(device, address=("127.0.0.1", 0), trace_packet=trace)`` serving until
    ``close()``; the constructor returns once it listens (``address``: ``"127.0.0.1:PORT"``, the
    port the server's own loop reports)."""

    def __init__(self, device: Any, trace: Callable[[bool, bytes], bytes]) -> None:
        from pymodbus.server import ModbusTcpServer

        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0
        failure: list[BaseException] = []

        async def serve() -> None:
            self.server = ModbusTcpServer(device, address=("127.0.0.1", 0), trace_packet=trace)
            await self.server.serve_forever(background=True)
            self.port = self.server.transport.sockets[0].getsockname()[1]
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(serve())
            except BaseException as exc:  # handed to the test
                failure.append(exc)
                ready.set()
                return
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10), "pymodbus's TCP server did not start listening"
        if failure:
            raise failure[0]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
