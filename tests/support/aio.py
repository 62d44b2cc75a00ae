"""An asyncio transport for ``AsyncDevice`` whose reads really wait, over an in-memory device."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from idemlink.device_sim.device import SimulatedDevice
from idemlink.protocol.frame import Flags, Frame, FrameDecoder, FrameType
from idemlink.protocol.modbus import FunctionCode


class WaitingTransport:
    """An in-memory device whose answers arrive on the event loop, and whose ``read`` really waits
    (for an answer or its timeout) — and, like ``asyncio.StreamReader``, raises RuntimeError when
    a second coroutine waits while one already does. ``answer=False``: the device runs every
    request but its answers are lost."""

    def __init__(self, device: SimulatedDevice) -> None:
        self.device = device
        self.answer = True
        self.buf = bytearray()
        self.arrived = asyncio.Event()
        self.waiting = False
        self.request_out = asyncio.Event()  #: set when a write request reached the device

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def write(self, data: bytes) -> None:
        before = len(self.device.executions)
        self.device.receive_data(data, self.now())
        reply = self.device.data_to_send()
        if any(e.request[:1] != bytes([FunctionCode.READ_HOLDING_REGISTERS])
               for e in self.device.executions[before:]):
            self.request_out.set()
        if reply and self.answer:
            asyncio.get_running_loop().call_soon(self._deliver, reply)

    def _deliver(self, data: bytes) -> None:
        self.buf += data
        self.arrived.set()

    async def read(self, timeout: float) -> bytes:
        if self.waiting:
            raise RuntimeError("read() called while another coroutine is already waiting")
        if not self.buf:
            self.waiting = True
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout)
            except TimeoutError:
                return b""
            finally:
                self.waiting = False
        data = bytes(self.buf)
        self.buf.clear()
        self.arrived.clear()
        return data

    async def close(self) -> None:
        pass


class DropsSomeAnswers(WaitingTransport):
    """``WaitingTransport`` whose device runs every request but whose answers to the requests
    ``drop(pdu)`` picks are lost (their retries' replayed answers too); ``out`` is set once such a
    request has reached the device. Records the most requests the device had to answer at once
    (``deepest``: requests written, not yet answered)."""

    def __init__(self, device: SimulatedDevice, drop: Callable[[bytes], bool]) -> None:
        super().__init__(device)
        self.drop = drop
        self.dropped: set[int] = set()  #: sequence numbers whose answers are lost
        self.out = asyncio.Event()
        self._decoder = FrameDecoder()
        self.unanswered = 0
        self.deepest = 0

    async def write(self, data: bytes) -> None:
        self._decoder.receive_data(data)
        sent = sum(1 for f in iter(self._decoder.next_event, None)
                   if isinstance(f, Frame) and f.type is FrameType.REQUEST
                   and not f.flags & Flags.RETRANSMIT)
        self.unanswered += sent
        self.deepest = max(self.deepest, self.unanswered)
        before = len(self.device.executions)
        self.device.receive_data(data, self.now())
        for e in self.device.executions[before:]:
            if self.drop(e.request):
                self.dropped.add(e.seq)
                self.out.set()
        decoder = FrameDecoder()
        decoder.receive_data(self.device.data_to_send())
        kept = b""
        for f in iter(decoder.next_event, None):
            if not isinstance(f, Frame) or f.seq in self.dropped:
                continue
            if f.type is FrameType.RESPONSE and not f.flags & Flags.REPLAY:
                self.unanswered -= 1
            kept += f.encode()
        if kept and self.answer:
            asyncio.get_running_loop().call_soon(self._deliver, kept)
