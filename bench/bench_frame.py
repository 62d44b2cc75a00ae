"""Frame codec throughput: encode + decode of a 10-register read request and its response.

Prints request/response pairs per second for idemlink's frame layer (COBS + CRC-32C, through the
streaming decoder) and for pymodbus's RTU framer doing the same exchange, in the same run, as
medians of several rounds, and their ratio. Run: ``python3 bench/bench_frame.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from idemlink.protocol.frame import Frame, FrameDecoder, FrameType, encode_frame

N = 20_000
ROUNDS = 7

REQ_PDU = bytes.fromhex("030000000a")  # FC03, address 0, count 10
RESP_PDU = bytes([3, 20]) + bytes(range(20))


def idemlink_pairs(n: int) -> None:
    host_dec = FrameDecoder()
    dev_dec = FrameDecoder()
    epoch = 0x1234ABCD
    for seq in range(n):
        dev_dec.receive_data(encode_frame(FrameType.REQUEST, seq, epoch, REQ_PDU))
        req = dev_dec.next_event()
        assert isinstance(req, Frame) and dev_dec.next_event() is None
        host_dec.receive_data(encode_frame(FrameType.RESPONSE, req.seq, epoch, b"\x00" + RESP_PDU))
        resp = host_dec.next_event()
        assert isinstance(resp, Frame) and host_dec.next_event() is None


def pymodbus_pairs(n: int) -> None:
    from pymodbus.framer import FramerRTU
    from pymodbus.pdu import DecodePDU
    from pymodbus.pdu.register_message import (
        ReadHoldingRegistersRequest,
        ReadHoldingRegistersResponse,
    )

    client = FramerRTU(DecodePDU(False))
    server = FramerRTU(DecodePDU(True))
    regs = list(range(10))
    for _ in range(n):
        wire = client.buildFrame(ReadHoldingRegistersRequest(dev_id=1, address=0, count=10))
        _, req = server.handleFrame(wire, 0, 0)
        assert req is not None
        wire = server.buildFrame(ReadHoldingRegistersResponse(dev_id=1, registers=regs))
        _, resp = client.handleFrame(wire, 0, 0)
        assert resp is not None


def rate(fn: Callable[[int], None]) -> float:
    t0 = time.perf_counter()
    fn(N)
    return N / (time.perf_counter() - t0)


def main() -> None:
    ours, theirs = [], []
    for _ in range(ROUNDS):  # interleaved so machine noise hits both alike
        ours.append(rate(idemlink_pairs))
        theirs.append(rate(pymodbus_pairs))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"idemlink frame layer : {o:10,.0f} request/response pairs/s (median of {ROUNDS})")
    print(f"pymodbus FramerRTU   : {t:10,.0f} request/response pairs/s (median of {ROUNDS})")
    print(f"ratio idemlink/pymodbus: {o / t:.2f}x")


if __name__ == "__main__":
    main()
