"""Authenticated sessions (issue 23): HELLO nonces and key ids, the keyed device's gate, the keyed
host's refusal of unsigned peers; sessions wired back to back, byte by byte."""

from __future__ import annotations

import os

from idemlink.protocol.auth import DeviceAuth, DeviceKeys, HostAuth, key_id
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import (
    Direction,
    Frame,
    FrameType,
    MacKey,
    decode_frames,
    encode_frame,
)
from idemlink.protocol.host_session import (
    Completion,
    HelloFailed,
    HostSession,
    SessionOpened,
    SessionState,
)
from idemlink.protocol.outcome import Outcome, Status
from idemlink.protocol.payloads import Capability, DeviceInfo, decode_response_payload

HASH = b"12345678"
KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


class Exe:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, pdu: bytes, now: float, seq: int) -> bytes:
        self.calls.append(seq)
        return b"\x06" + pdu[1:]


def device(keys: list[bytes] | None = (KEY,), **kw: object) -> tuple[DeviceSession, Exe]:  # type: ignore[assignment]
    ex = Exe()
    auth = None if keys is None else DeviceAuth(DeviceKeys(tuple(keys)), os.urandom)
    return DeviceSession(ex, 0x1234, contract_hash=HASH, map_hash=b"m" * 8, device_id="dev-1",
                         auth=auth, **kw), ex  # type: ignore[arg-type]


def host(key: bytes | None = KEY) -> HostSession:
    auth = None if key is None else HostAuth(key, os.urandom)
    return HostSession(contract_hash=HASH, timeout=0.1, attempts=3, hello_attempts=2, auth=auth)


def pump(h: HostSession, d: DeviceSession, now: float = 0.0,
         tap: list[bytes] | None = None) -> list[object]:
    events: list[object] = []
    for _ in range(20):
        out = h.data_to_send()
        if tap is not None and out:
            tap.append(out)
        if out:
            d.receive_data(out, now)
        back = d.data_to_send()
        if back:
            h.receive_data(back, now)
        while (ev := h.next_event()) is not None:
            events.append(ev)
        if not out and not back:
            break
    return events


def opened(h: HostSession, d: DeviceSession) -> SessionOpened:
    h.open(0.0)
    evs = pump(h, d)
    assert isinstance(evs[0], SessionOpened), evs
    return evs[0]


def test_keyed_pair_opens_signed_and_runs_exactly_once() -> None:
    d, ex = device()
    h = host()
    ev = opened(h, d)
    assert ev.info.serves(Capability.AUTH) and ev.info.key_id == key_id(KEY)
    assert h.auth is not None and h.auth.session is not None
    assert d.auth is not None and d.auth.session == h.auth.session
    tap: list[bytes] = []
    h.submit(b"\x06\x00\x01\x00\x05", 0.0, set_only=True, tag="w")
    evs = pump(h, d, tap=tap)
    done = [e for e in evs if isinstance(e, Completion)]
    assert done[0].outcome is Outcome.OK and ex.calls == [done[0].seq]
    (req,) = decode_frames(tap[0])
    assert isinstance(req, Frame) and req.tag is not None
    # the same frame again (a retry that crossed the answer): replayed, not run again
    d.receive_data(tap[0], 0.1)
    (ans,) = decode_frames(d.data_to_send())
    assert isinstance(ans, Frame) and ans.tag is not None and ex.calls == [done[0].seq]


def test_unkeyed_pair_is_unchanged_and_advertises_nothing() -> None:
    d, _ex = device(None)
    h = host(None)
    ev = opened(h, d)
    assert not ev.info.serves(Capability.AUTH) and ev.info.key_id is None
    h.submit(b"\x06\x00\x01\x00\x05", 0.0, set_only=True, tag="w")
    evs = pump(h, d)
    assert any(isinstance(e, Completion) and e.outcome is Outcome.OK for e in evs)


def test_unauthenticated_request_gets_authentication_required_and_never_runs() -> None:
    d, ex = device()
    h = host(None)  # an unkeyed host talking to a keyed device
    ev = opened(h, d)
    assert ev.info.serves(Capability.AUTH)
    h.submit(b"\x06\x00\x01\x00\x05", 0.0, set_only=True, tag="w")
    evs = pump(h, d)
    (c,) = [e for e in evs if isinstance(e, Completion)]
    assert c.outcome is Outcome.NOT_EXECUTED and c.status is Status.AUTHENTICATION_REQUIRED
    assert ex.calls == [] and d.counters["unauthenticated"] == 1


def test_keyed_host_refuses_an_unkeyed_device() -> None:
    d, _ = device(None)
    h = host()
    h.open(0.0)
    pump(h, d)
    for t in (0.2, 0.4, 0.6):
        h.tick(t)
        pump(h, d, t)
    evs = []
    while (e := h.next_event()) is not None:
        evs.append(e)
    assert h.state is SessionState.CLOSED
    assert h.counters.unauthenticated >= 1


def test_keyed_host_refuses_a_device_with_another_key() -> None:
    d, ex = device([OTHER])
    h = host()
    h.open(0.0)
    evs = pump(h, d)
    for t in (0.2, 0.4):
        h.tick(t)
        evs += pump(h, d, t)
    fails = [e for e in evs if isinstance(e, HelloFailed)]
    assert fails and "key id" in fails[0].reason and ex.calls == []


def test_rotation_window_device_accepts_the_old_key() -> None:
    d, _ex = device([OTHER, KEY])  # new key current, old one still accepted
    h = host(KEY)
    ev = opened(h, d)
    assert ev.info.key_id == key_id(KEY)
    h.submit(b"\x06\x00\x01\x00\x05", 0.0, set_only=True, tag="w")
    assert any(isinstance(e, Completion) and e.outcome is Outcome.OK for e in pump(h, d))


def test_reflected_older_session_and_stripped_frames_are_refused() -> None:
    d, ex = device()
    h = host()
    opened(h, d)
    tap: list[bytes] = []
    h.submit(b"\x06\x00\x01\x00\x05", 0.0, set_only=True, tag="w")
    pump(h, d, tap=tap)
    runs = len(ex.calls)
    assert h.auth is not None and h.auth.session is not None
    old = h.auth.session
    # a reflected answer: the device's own signed frame sent back to it
    (req,) = decode_frames(tap[0])
    assert isinstance(req, Frame)
    reflected = encode_frame(FrameType.REQUEST, req.seq + 1, req.epoch, req.payload, key=old,
                             direction=Direction.DEVICE_TO_HOST)
    d.receive_data(reflected, 0.1)
    assert d.data_to_send() == b"" and d.counters["bad_mac"] == 1
    # stripped of its tag: refused, the refusal unsigned
    d.receive_data(encode_frame(FrameType.REQUEST, req.seq + 2, req.epoch, req.payload), 0.1)
    (ans,) = decode_frames(d.data_to_send())
    assert isinstance(ans, Frame) and ans.tag is None
    assert decode_response_payload(ans.payload) == (Status.AUTHENTICATION_REQUIRED, b"")
    # a new session: frames of the old one fail
    opened(h, d)
    fresh = encode_frame(FrameType.REQUEST, req.seq + 3, req.epoch, req.payload, key=old,
                         direction=Direction.HOST_TO_DEVICE)
    d.receive_data(fresh, 0.2)
    assert d.data_to_send() == b"" and d.counters["bad_mac"] == 2
    # a truncated (short) tag under the right key
    short = encode_frame(FrameType.REQUEST, req.seq + 4, req.epoch, req.payload,
                         key=MacKey(h.auth.session.key, 16), direction=Direction.HOST_TO_DEVICE)
    d.receive_data(short, 0.2)
    assert d.data_to_send() == b"" and d.counters["bad_mac"] == 3
    assert len(ex.calls) == runs


def test_keys_stay_out_of_reprs() -> None:
    d, _ = device()
    h = host()
    opened(h, d)
    for thing in (d.auth, h.auth, d.auth.session if d.auth else None, d.device_info()):
        assert KEY.hex() not in repr(thing) and repr(KEY) not in repr(thing)
    info = DeviceInfo.decode(d.device_info().encode())
    assert info.key_id == key_id(KEY)
