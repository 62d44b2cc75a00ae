"""pymodbus's own Modbus TCP server as a test peer, in a thread of its own.

``PymodbusTcp(values, unit=1)`` serves ``values`` as holding registers 0.. at ``unit`` on
127.0.0.1, a port the OS picks (``address``: ``"127.0.0.1:PORT"``); it is ready when the
constructor returns (the listening socket is bound: the readiness signal is the port number the
server's own loop reports). Ground truth and faults, all set from the test:

- ``writes``: every write the server executed, ``(address, values)``, in order;
- ``fail[address] = code``: requests touching ``address`` answer that exception code (0x0A, 0x0B
  as a gateway would; only ``fail_reads`` and ``fail_writes`` say which kind, both by default),
  after executing nothing;
- ``drop(frame)``: an outgoing answer for which it returns True is not sent (``lost`` counts
  them) — the request was executed all the same;
- ``delays``: seconds the server's action sleeps for each coming request, one entry per
  request, in order of arrival.

pymodbus's server answers one request per connection at a time, and cannot answer a write with
an exception from its action; a gateway can. ``Gateway(server)`` is a Modbus TCP gateway in front
of it (on the server's loop, its own port, one upstream connection per client): each request it
receives takes the next entry of ``script`` (``FORWARD`` when it is empty) —

- ``FORWARD``: passed to the server, its answer passed back;
- ``("refuse", code)``: answered with exception ``code`` at once, never passed on (0x0A: no
  path to the device);
- ``("lose", code)``: passed on and executed, the server's answer replaced by exception ``code``
  (0x0B: the gateway says the target did not answer; it did, the answer was lost);
- ``DROP``: passed on and executed, no answer at all;
- ``("late", seconds)``: passed on, the answer held back that long.

``log``: every request ADU the gateway received, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from support.pymodbus_serial import BackgroundTcpServer

FORWARD = "forward"
DROP = "drop"


class PymodbusTcp:
    def __init__(self, values: list[int], *, unit: int = 1) -> None:
        from pymodbus.simulator import DataType, SimData, SimDevice

        self.values = list(values)
        self.writes: list[tuple[int, list[int]]] = []
        self.fail: dict[int, int] = {}
        self.fail_reads = True
        self.fail_writes = True
        self.drop: Callable[[bytes], bool] = lambda frame: False
        self.lost = 0
        self.delays: list[float] = []
        self.requests = 0

        async def action(fc: int, start: int, address: int, count: int, regs: list[int],
                         set_values: list[int] | None) -> Any:
            self.requests += 1
            if self.delays:
                await asyncio.sleep(self.delays.pop(0))
            touched = set(range(address, address + count))
            for a, code in self.fail.items():
                if a in touched and (self.fail_writes if set_values is not None
                                     else self.fail_reads):
                    return code
            if set_values is not None:
                self.writes.append((address, list(set_values)))
            return None

        def trace(sending: bool, frame: bytes) -> bytes:
            if sending and self.drop(frame):
                self.lost += 1
                return b""
            return frame

        device = SimDevice(unit, simdata=[SimData(0, values=list(self.values),
                                                  datatype=DataType.REGISTERS)], action=action)
        self.background = BackgroundTcpServer(device, trace)
        self.loop, self.server = self.background.loop, self.background.server

    @property
    def port(self) -> int:
        return self.background.port

    @property
    def address(self) -> str:
        return self.background.address

    def close(self) -> None:
        self.background.close()


class Gateway:
    def __init__(self, server: PymodbusTcp) -> None:
        self.server = server
        self.script: list[Any] = []
        self.log: list[bytes] = []
        self.port = 0
        loop = server.loop

        async def start() -> int:
            self._listener = await asyncio.start_server(self._client, "127.0.0.1", 0)
            port: int = self._listener.sockets[0].getsockname()[1]
            return port

        self.port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.server.port)
        lock = asyncio.Lock()
        held: list[asyncio.Handle] = []
        try:
            while True:
                head = await reader.readexactly(6)
                body = await reader.readexactly(int.from_bytes(head[4:6], "big"))
                adu = head + body
                self.log.append(adu)
                step = self.script.pop(0) if self.script else FORWARD
                if isinstance(step, tuple) and step[0] == "refuse":
                    writer.write(exception_adu(adu, step[1]))
                    continue
                async with lock:
                    up_w.write(adu)
                    await up_w.drain()
                    ahead = await up_r.readexactly(6)
                    answer = ahead + await up_r.readexactly(int.from_bytes(ahead[4:6], "big"))
                if step == DROP:
                    continue
                if isinstance(step, tuple) and step[0] == "lose":
                    writer.write(exception_adu(adu, step[1]))
                elif isinstance(step, tuple) and step[0] == "late":
                    held.append(asyncio.get_running_loop().call_later(step[1], writer.write,
                                                                      answer))
                else:
                    writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for h in held:
                h.cancel()
            up_w.close()
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            self._listener.close()

        asyncio.run_coroutine_threadsafe(stop(), self.server.loop).result(10)


def exception_adu(request: bytes, code: int) -> bytes:
    """The exception answer ``code`` to a request ADU (same transaction id and unit)."""
    return request[:4] + b"\x00\x03" + request[6:7] + bytes([request[7] | 0x80, code])
