"""Generate ``auth_session.json``: golden streams of a keyed device (issue 23, docs/SECURITY.md),
shared by the Python and the C tests.

Each stream is a device (epoch, keys, bus address or none, device id) fed whole frames one after
the other at time 0; each step holds the frame's wire bytes and the exact bytes the device answers
(empty: silence). ``tape`` is every byte the device drew from its randomness, in order (its HELLO
nonces): the C core's port hook replays it (``idl_port_random``), so both draw the same nonces.
The answers come from the Python reference (``DeviceSession`` with ``DeviceAuth`` in front of
``DeviceCore`` of the built-in map, 8 replay slots); ``tests/test_auth_vectors.py`` checks that the
file is what this script writes now and that the C core (``make check``'s ``-auth`` variants,
through ``build/auth_vectors.h``, and the ctypes library) answers every step byte for byte, with
the same counters at the end of each stream.

Run ``python3 tests/vectors/gen_auth_session.py`` after a change of the rule; the file is
committed.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path
from typing import Any

from idemlink.protocol.auth import DeviceAuth, DeviceKeys, encode_hello_auth, key_id
from idemlink.protocol.cobs import encode as cobs_encode
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import (
    Direction,
    Flags,
    FrameType,
    MacKey,
    crc32c,
    encode_frame,
    frame_mac,
)
from idemlink.protocol.payloads import encode_hello
from idemlink.protocol.regmap_file import DEFAULT_MAP

OUT = Path(__file__).with_name("auth_session.json")
EPOCH = 0x5EC0DE01
OTHER_EPOCH = 0x0BADCAFE
KEY = bytes(range(1, 33))
OLD_KEY = bytes(range(101, 133))
STRANGER = bytes(range(201, 233))
DEVICE_ID = "auth-0001"
COUNTERS = ("executed", "replayed", "hello", "unexpected_frames", "decode_errors",
            "epoch_mismatch", "unauthenticated", "bad_mac")
"""The counters compared at the end of a stream (the C core's IDL_DISP_* of the same meaning;
``bad_mac`` is the decoder's IDL_DECODE_BAD_MAC)."""

H2D = Direction.HOST_TO_DEVICE
D2H = Direction.DEVICE_TO_HOST


def _fc06(address: int, value: int) -> bytes:
    return struct.pack(">BHH", 0x06, address, value)


def _hello(seq: int, nonce: bytes | None, kid: int = 0, address: int | None = None) -> bytes:
    payload = encode_hello(1, contract_hash())
    if nonce is not None:
        payload += encode_hello_auth(nonce, kid)
    return encode_frame(FrameType.HELLO, seq, 0, payload, address=address)


def _tagged(ftype: int, flags: int, epoch: int, seq: int, payload: bytes, tag: bytes) -> bytes:
    """A frame built by hand with the tag given (a wrong one, a long one)."""
    head = struct.pack("<BBBIIH", 1, ftype, flags, epoch, seq, len(payload))
    body = head + payload + tag
    return b"\x00" + cobs_encode(body + struct.pack("<I", crc32c(body))) + b"\x00"


class _Tape:
    """The device's randomness: seeded, and every byte it gave kept for the C side."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.given = bytearray()

    def __call__(self, n: int) -> bytes:
        out = self.rng.randbytes(n)
        self.given += out
        return out


def _device(keys: tuple[bytes, ...], tape: _Tape, address: int | None = None
            ) -> tuple[DeviceSession, DeviceCore]:
    core = DeviceCore(DEFAULT_MAP, trigger_duration=2.0)
    session = DeviceSession(
        lambda pdu, now, seq: core.execute(pdu, now), EPOCH, contract_hash=contract_hash(),
        name="idemlink-sim", map_hash=DEFAULT_MAP.hash, device_id=DEVICE_ID,
        map_name=DEFAULT_MAP.name, replay_slots=8, address=address,
        broadcast_ok=core.broadcast_ok, auth=DeviceAuth(DeviceKeys(keys), tape))
    return session, core


def _run(name: str, keys: tuple[bytes, ...], seed: int, address: int | None,
         script: Any) -> dict[str, Any]:
    tape = _Tape(seed)
    session, _core = _device(keys, tape, address)
    steps: list[dict[str, str]] = []

    def send(step: str, wire: bytes) -> bytes:
        session.receive_data(wire, 0.0)
        out = session.data_to_send()
        steps.append({"name": step, "in": wire.hex(), "out": out.hex()})
        return out

    script(session, send)
    counters = dict(session.counters)
    counters["bad_mac"] = session.decoder.counters["BAD_MAC"]
    return {"name": name, "epoch": EPOCH, "address": address, "device_id": DEVICE_ID,
            "keys": [k.hex() for k in keys], "tape": bytes(tape.given).hex(), "steps": steps,
            "counters": {k: counters.get(k, 0) for k in COUNTERS}}


def _session_key(session: DeviceSession) -> MacKey:
    assert session.auth is not None and session.auth.session is not None
    return session.auth.session


def _keyed(session: DeviceSession, send: Any) -> None:
    threshold = DEFAULT_MAP.named("threshold").address
    e, req = EPOCH, FrameType.REQUEST
    n1, n2 = bytes(range(16)), bytes(range(16, 32))
    send("hello_unkeyed", _hello(1, None))
    send("request_unsigned", encode_frame(req, 5, e, _fc06(threshold, 300)))
    send("hello_keyed", _hello(2, n1, key_id(KEY)))
    send("hello_keyed_again", _hello(2, n1, key_id(KEY)))
    key = _session_key(session)
    write = _fc06(threshold, 301)
    send("write_signed", encode_frame(req, 10, e, write, key=key, direction=H2D))
    send("write_retransmitted", encode_frame(req, 10, e, write, Flags.RETRANSMIT, key=key,
                                             direction=H2D))
    good = encode_frame(req, 11, e, _fc06(threshold, 302), key=key, direction=H2D)
    send("write_wrong_tag", _tagged(req, Flags.AUTH, e, 11, _fc06(threshold, 302), bytes(8)))
    send("write_reflected", encode_frame(req, 11, e, _fc06(threshold, 302), key=key,
                                         direction=D2H))
    send("write_stripped", encode_frame(req, 11, e, _fc06(threshold, 302)))
    long_tag = frame_mac(key.key, H2D, b"", 16)
    send("write_long_tag", _tagged(req, Flags.AUTH | Flags.AUTH_LONG, e, 11,
                                   _fc06(threshold, 302), long_tag))
    send("write_signed_after_refusals", good)
    send("response_unsigned", encode_frame(FrameType.RESPONSE, 12, e, b"\x00"))
    send("hello_stranger_key", _hello(3, n2, key_id(STRANGER)))
    send("write_old_session_still", encode_frame(req, 13, e, _fc06(threshold, 303), key=key,
                                                 direction=H2D))
    send("write_other_epoch", encode_frame(req, 14, OTHER_EPOCH, _fc06(threshold, 304), key=key,
                                           direction=H2D))
    send("hello_new_session", _hello(4, n2, key_id(KEY)))
    send("write_previous_session", encode_frame(req, 15, e, _fc06(threshold, 305), key=key,
                                                direction=H2D))
    key2 = _session_key(session)
    send("write_new_session", encode_frame(req, 15, e, _fc06(threshold, 305), key=key2,
                                           direction=H2D))
    send("hello_addressed_no_bus", _hello(5, n1, key_id(KEY), address=9))


def _rotation(session: DeviceSession, send: Any) -> None:
    threshold = DEFAULT_MAP.named("threshold").address
    send("hello_old_key", _hello(1, bytes(16), key_id(OLD_KEY)))
    key = _session_key(session)
    send("write_old_key_session", encode_frame(FrameType.REQUEST, 3, EPOCH,
                                               _fc06(threshold, 310), key=key, direction=H2D))
    send("hello_current_key", _hello(2, bytes(16), key_id(KEY)))


def _rebooted(session: DeviceSession, send: Any) -> None:
    threshold = DEFAULT_MAP.named("threshold").address
    stale = MacKey(bytes(32))
    send("tagged_other_epoch_no_session", encode_frame(
        FrameType.REQUEST, 7, OTHER_EPOCH, _fc06(threshold, 320), key=stale, direction=H2D))
    send("tagged_same_epoch_no_session", encode_frame(
        FrameType.REQUEST, 8, EPOCH, _fc06(threshold, 321), key=stale, direction=H2D))
    send("tagged_hello_no_session", encode_frame(
        FrameType.HELLO, 9, 0, encode_hello(1, contract_hash()) + encode_hello_auth(
            bytes(16), key_id(KEY)), key=stale, direction=H2D))


def _unkeyed_frames(session: DeviceSession, send: Any) -> None:
    threshold = DEFAULT_MAP.named("threshold").address
    send("hello_keyed_to_unkeyed_build", _hello(1, bytes(16), key_id(KEY)))
    send("request", encode_frame(FrameType.REQUEST, 2, EPOCH, _fc06(threshold, 330)))


def render() -> str:
    table = {
        "about": "generated by tests/vectors/gen_auth_session.py: a keyed device, frames in, "
                 "exact answers out (docs/SECURITY.md)",
        "map": DEFAULT_MAP.name,
        "replay_slots": 8,
        "streams": [
            _run("keyed", (KEY,), 1, None, _keyed),
            _run("rotation", (KEY, OLD_KEY), 2, None, _rotation),
            _run("rebooted", (KEY,), 3, None, _rebooted),
        ],
    }
    return json.dumps(table, indent=1) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    sys.exit(0)
