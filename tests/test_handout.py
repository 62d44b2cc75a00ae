"""``DeviceSession.first_seq``: the start a HELLO hands out never runs away from the window.

Each HELLO hands out a start a whole window beyond the last one (a new host process never reuses
numbers a dead one may still have in flight), but never more than ``HANDOUT_SPAN`` ahead of the
highest number seen: millions of HELLOs without a request between them used to push the start
more than 2^31 ahead, and the next session's first write was refused TOO_OLD.
"""

from __future__ import annotations

import random

from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import Frame, FrameType, decode_frames, encode_frame
from idemlink.protocol.outcome import Status
from idemlink.protocol.payloads import HANDOUT_SPAN, DeviceInfo

HASH = b"12345678"
W = bytes.fromhex("060004012c")


def dev_reply(dev: DeviceSession, data: bytes, now: float) -> bytes:
    """What the device answers to ``data`` received at ``now``."""
    dev.receive_data(data, now)
    return dev.data_to_send()


def _run(pdu: bytes, now: float, seq: int) -> bytes:
    return pdu


def _hello(dev: DeviceSession, nonce: int) -> int:
    (reply,) = [f for f in decode_frames(
        dev_reply(dev, encode_frame(FrameType.HELLO, nonce, 0, b"\x01" + HASH), 0.0))
        if isinstance(f, Frame)]
    return DeviceInfo.decode(reply.payload).next_seq


def _request(dev: DeviceSession, seq: int) -> Status:
    (answer,) = [f for f in decode_frames(
        dev_reply(dev, encode_frame(FrameType.REQUEST, seq, dev.epoch, W), 0.0))
        if isinstance(f, Frame)]
    return Status(answer.payload[0])


def _ahead(dev: DeviceSession, seq: int) -> int:
    highest = dev.window.highest
    assert highest is not None
    return (seq - highest) & 0xFFFFFFFF


def test_the_start_after_two_million_quiet_hellos_is_still_accepted() -> None:
    dev = DeviceSession(_run, 0xE1, contract_hash=HASH)
    assert _request(dev, _hello(dev, 1)) is Status.OK
    # the state ~2.16 M request-less HELLOs leave: the last start just under the runaway point
    highest = dev.window.highest
    assert highest is not None
    dev._handed_out = (highest + (1 << 31) - dev.window.size // 2) & 0xFFFFFFFF
    start = _hello(dev, 2)
    assert 0 < _ahead(dev, start) <= HANDOUT_SPAN
    assert _request(dev, start) is Status.OK


def test_many_quiet_hellos_stay_bounded_and_distinct() -> None:
    dev = DeviceSession(_run, 0xE2, contract_hash=HASH)
    assert _request(dev, _hello(dev, 1)) is Status.OK
    cycle = HANDOUT_SPAN // dev.window.size
    seen: set[int] = set()
    for n in range(cycle + 10):
        start = dev.first_seq()
        dev._handed_out = start  # what a HELLO does, without building ~1 M frames
        assert 0 < _ahead(dev, start) <= HANDOUT_SPAN
        if n < cycle:
            assert start not in seen, "a start repeats only after a whole cycle"
        seen.add(start)
    assert _request(dev, _hello(dev, 2)) is Status.OK


def test_hellos_and_requests_interleaved_never_hand_out_a_refused_start() -> None:
    rng = random.Random(5)
    dev = DeviceSession(_run, 0xE3, contract_hash=HASH)
    previous = None
    for n in range(3000):
        start = _hello(dev, n)
        assert start != previous, "a new session never starts where the last one did"
        previous = start
        if dev.window.highest is not None:
            assert 0 < _ahead(dev, start) <= HANDOUT_SPAN
        for k in range(rng.choice((0, 0, 0, 1, 3))):
            assert _request(dev, (start + k) & 0xFFFFFFFF) is Status.OK
