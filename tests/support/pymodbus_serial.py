"""pymodbus's own serial server as a real peer: served by an event loop on a thread of its own."""

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
