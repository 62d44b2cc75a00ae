"""The keyed C device core against the Python reference, as a hostile tester (issue 23,
docs/SECURITY.md "The C device"): random streams of hostile frames — keyed, unkeyed and
stranger-key HELLOs (extensions cut short or too long, repeated nonces, tagged, addressed,
broadcast), requests signed with the current session key, an older one, the wrong direction, a long
or cut tag, a tag straddling a COBS block boundary, stripped, addressed, broadcast, of another
epoch, the device's own answers reflected, reboots — fed to the C session (ctypes,
``libidl_core.so``) and to ``DeviceSession`` with the same keys, nonces, bus address and state:
the same bytes out, the same counters and the same register state (the same executions).
"""

from __future__ import annotations

import ctypes
import random
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import firmware

from idemlink.protocol.auth import DeviceAuth, DeviceKeys, encode_hello_auth, key_id
from idemlink.protocol.cobs import decode as cobs_decode
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
from idemlink.protocol.outcome import Status
from idemlink.protocol.payloads import encode_hello
from idemlink.protocol.regmap_file import DEFAULT_MAP

KEY = bytes(range(1, 33))
OLD_KEY = bytes(range(101, 133))
STRANGER = bytes(range(201, 233))
EPOCH = 0x5EC0DE01
DEVICE_ID = "auth-0001"
THRESHOLD = DEFAULT_MAP.named("threshold").address
H2D, D2H = Direction.HOST_TO_DEVICE, Direction.DEVICE_TO_HOST
#: the C core's IDL_DISP_* (the library is built with the bus) by the Python counter's name
DISP = {"executed": 0, "replayed": 1, "conflict": 2, "evicted": 3, "too_old": 4,
        "epoch_mismatch": 5, "hello": 6, "unexpected_frames": 7, "decode_errors": 8,
        "other_address": 9, "broadcast_executed": 10, "broadcast_repeated": 11,
        "broadcast_refused": 12, "unauthenticated": 13}
BAD_MAC = 9  #: IDL_DECODE_BAD_MAC


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    return firmware.shim_library()


class _Tape:
    """The device's randomness, one byte sequence for both sides (the C shim replays it)."""

    def __init__(self, seed: int) -> None:
        self.bytes = random.Random(seed).randbytes(4096)
        self.at = 0

    def __call__(self, n: int) -> bytes:
        out = bytes(self.bytes[(self.at + i) % len(self.bytes)] for i in range(n))
        self.at += n
        return out


class Pair:
    """One keyed device twice: the Python reference and the C core."""

    def __init__(self, lib: ctypes.CDLL, keys: tuple[bytes, ...], address: int | None,
                 seed: int) -> None:
        self.lib, self.keys, self.address = lib, keys, address
        self.tape = _Tape(seed)
        self.epoch = EPOCH
        assert lib.idl_shim_auth_keys(b"".join(keys), len(keys)) == 1, "built without IDL_AUTH"
        self.keyed = bool(keys)  # unkeyed: the first contract's device (no DeviceAuth)
        lib.idl_shim_auth_tape(self.tape.bytes, len(self.tape.bytes))
        self.buf = ctypes.create_string_buffer(lib.idl_shim_sizeof())
        self.out = ctypes.create_string_buffer(8192)
        self.old: list[MacKey] = []
        self.answers: list[bytes] = []
        self.boot()

    def boot(self) -> None:
        """A (re)boot of both: a new epoch, no session; the tape goes on."""
        if getattr(self, "py", None) is not None and self.session is not None:
            self.old.append(self.session)  # its frames are replayed after the reboot
        self.epoch = (self.epoch + 1) & 0xFFFFFFFF
        self.core = DeviceCore(DEFAULT_MAP, trigger_duration=2.0)
        core = self.core
        self.py = DeviceSession(
            lambda pdu, now, seq: core.execute(pdu, now), self.epoch,
            contract_hash=contract_hash(), name="idemlink-sim", map_hash=DEFAULT_MAP.hash,
            device_id=DEVICE_ID, map_name=DEFAULT_MAP.name, replay_slots=8,
            address=self.address, broadcast_ok=core.broadcast_ok,
            auth=DeviceAuth(DeviceKeys(self.keys), self.tape) if self.keyed else None)
        self.lib.idl_shim_init(self.buf, self.epoch, 2000, DEVICE_ID.encode(), 0)
        if self.address is not None:
            self.lib.idl_shim_bus(self.buf, self.address)

    @property
    def session(self) -> MacKey | None:
        return None if self.py.auth is None else self.py.auth.session

    def feed(self, wire: bytes, what: str) -> None:
        before = self.session
        self.py.receive_data(wire, 0.0)
        want = self.py.data_to_send()
        n = self.lib.idl_shim_feed(self.buf, wire, len(wire), 0, self.out, len(self.out))
        got = self.out.raw[:n]
        assert got.hex() == want.hex(), what
        if want:
            self.answers.append(want)
        if before is not None and self.session != before:
            self.old.append(before)
        self.check(what)

    def check(self, what: str) -> None:
        want = {k: self.py.counters.get(k, 0) for k in DISP}
        got = {k: self.lib.idl_shim_counter(self.buf, DISP[k]) for k in DISP}
        want["bad_mac"] = self.py.decoder.counters["BAD_MAC"]
        got["bad_mac"] = self.lib.idl_shim_decoder_counter(self.buf, BAD_MAC)
        assert got == want, what
        assert self.lib.idl_shim_get(self.buf, THRESHOLD) == self.core.read(THRESHOLD, 1)[0], what
        assert not self.keyed or want["broadcast_executed"] == 0, what  # never, when keyed


def _hello_payload(nonce: bytes | None, kid: int, cut: int) -> bytes:
    payload = encode_hello(1, contract_hash())
    if nonce is not None:
        payload += encode_hello_auth(nonce, kid)
    return payload[:len(payload) - cut] if cut > 0 else payload + bytes(-cut)


def _by_hand(ftype: int, flags: int, epoch: int, seq: int, payload: bytes, tag: bytes,
             address: int | None = None) -> bytes:
    """A frame built by hand, the tag (any length) given as is, the CRC right."""
    head = struct.pack("<BBBIIH", 1, ftype, flags, epoch, seq, len(payload))
    if address is not None:
        head += bytes((address,))
    body = head + payload + tag
    return b"\x00" + cobs_encode(body + struct.pack("<I", crc32c(body))) + b"\x00"


KEYS = st.sampled_from(["current", "old_session", "stale", "none", "reflected", "zeros",
                        "long", "cut"])
ADDRESSES = st.sampled_from([None, 5, 6, 0])
HELLO = st.tuples(st.just("hello"), st.sampled_from(["key", "old", "stranger", "unkeyed"]),
                  st.integers(0, 2), st.sampled_from([0, 0, 0, 1, 4, 19, 20, 25, 29, -1, -3]), ADDRESSES,
                  st.sampled_from(["none", "current", "stale"]))
REQUEST = st.tuples(st.just("request"), KEYS, ADDRESSES, st.integers(1, 40),
                    st.sampled_from(["same", "other"]),
                    st.sampled_from(["write", "read", "long", "garbage", "max", "over"]),
                    st.integers(0, 0xFFFF))
OTHER = st.tuples(st.sampled_from(["reflect", "reboot", "response", "split", "handshake"]),
                  st.integers(0, 50))
#: the last frame mutated, its CRC made right again: (byte index, new value); index 2 is the
#: flags, 11-12 the length field, the last ones the tag
MUTANT = st.tuples(st.just("mutant"), st.integers(-14, 14), st.integers(0, 255))
STEPS = st.lists(st.one_of(HELLO, REQUEST, REQUEST, REQUEST, OTHER, MUTANT), min_size=1,
                 max_size=25
                 ).map(lambda s: [("handshake", 0), *s])


def _run(pair: Pair, steps: list[tuple[Any, ...]]) -> None:
    nonces = [bytes(16), bytes(range(16)), bytes(range(16, 32))]
    kids = {"key": key_id(KEY), "old": key_id(OLD_KEY), "stranger": key_id(STRANGER)}
    stale = MacKey(bytes(32))
    last = b""
    for i, step in enumerate(steps):
        what = f"step {i}: {step!r}"
        if step[0] == "hello":
            _, who, nonce_i, cut, address, tagged = step
            payload = _hello_payload(None if who == "unkeyed" else nonces[nonce_i],
                                     kids.get(who, 0), cut)
            key = pair.session if tagged == "current" else stale if tagged == "stale" else None
            wire = encode_frame(FrameType.HELLO, 100 + i, 0, payload, address=address, key=key,
                                direction=H2D if key else None)
        elif step[0] == "request":
            _, how, address, seq, epoch_kind, pdu_kind, value = step
            epoch = pair.epoch if epoch_kind == "same" else pair.epoch ^ 0x5A5A
            pdu = {"write": struct.pack(">BHH", 6, THRESHOLD, value % 1000),
                   "read": struct.pack(">BHH", 3, THRESHOLD, 1),
                   # no zero after the PDU's head: the tag lies across a full COBS block's
                   # end (254 bytes without a zero)
                   "long": struct.pack(">BHHB", 0x10, THRESHOLD, 1, 2) + b"\x55" * (
                       (value % 12) + 243),
                   "garbage": bytes((value & 0xFF, value >> 8)),
                   # the longest payload, and one byte more (the decoders' bounds with a tag)
                   "max": struct.pack(">BHHB", 0x10, THRESHOLD, 1, 2) + bytes(506),
                   "over": struct.pack(">BHHB", 0x10, THRESHOLD, 1, 2) + bytes(507)}[pdu_kind]
            old = pair.old[value % len(pair.old)] if pair.old else None
            key = {"current": pair.session, "old_session": old,
                   "stale": stale, "reflected": pair.session}.get(how)
            if len(pdu) > 512:  # beyond the codec: by hand, signed with whatever key is at hand
                key = key or pair.session or stale
                flags = Flags.AUTH | (Flags.ADDRESSED if address is not None else 0)
                head = struct.pack("<BBBIIH", 1, FrameType.REQUEST, flags, epoch, seq, len(pdu))
                head += bytes((address,)) if address is not None else b""
                wire = _by_hand(FrameType.REQUEST, flags, epoch, seq, pdu,
                                frame_mac(key.key, H2D, head + pdu, 8), address)
            elif how in ("current", "old_session", "stale", "reflected") and key is not None:
                wire = encode_frame(FrameType.REQUEST, seq, epoch, pdu, address=address,
                                    key=key, direction=D2H if how == "reflected" else H2D)
            elif how in ("zeros", "long", "cut") and pair.session is not None:
                flags = Flags.AUTH | (Flags.AUTH_LONG if how == "long" else 0)
                flags |= Flags.ADDRESSED if address is not None else 0
                head = struct.pack("<BBBIIH", 1, FrameType.REQUEST, flags, epoch, seq, len(pdu))
                head += bytes((address,)) if address is not None else b""
                tag = {"zeros": bytes(8),
                       "long": frame_mac(pair.session.key, H2D, head + pdu, 16),
                       "cut": frame_mac(pair.session.key, H2D, head + pdu, 8)[:4]}[how]
                wire = _by_hand(FrameType.REQUEST, flags, epoch, seq, pdu, tag, address)
            else:
                wire = encode_frame(FrameType.REQUEST, seq, epoch, pdu, address=address)
        elif step[0] == "handshake":  # the legitimate host's HELLO
            wire = encode_frame(FrameType.HELLO, 100 + i, 0, _hello_payload(
                nonces[step[1] % 3], kids["key"], 0), address=pair.address)
        elif step[0] == "reflect":
            if not pair.answers:
                continue
            wire = pair.answers[step[1] % len(pair.answers)]
        elif step[0] == "reboot":
            pair.boot()
            continue
        elif step[0] == "response":
            key = pair.session
            wire = encode_frame(FrameType.RESPONSE, step[1], pair.epoch, b"\x00", key=key,
                                direction=H2D if key else None)
        elif step[0] == "mutant":
            if not last:
                continue
            raw = bytearray(cobs_decode(last.strip(b"\x00"))[:-4])
            raw[step[1] % len(raw)] = step[2]
            wire = b"\x00" + cobs_encode(bytes(raw) + struct.pack("<I", crc32c(bytes(raw)))) \
                + b"\x00"
        else:  # "split": the last frame again, one byte at a time
            for j in range(len(last)):
                pair.feed(last[j:j + 1], what + f" byte {j}")
            continue
        last = wire
        pair.feed(wire, what)


@pytest.fixture
def keyed(lib: ctypes.CDLL) -> Callable[..., Pair]:
    made: list[Pair] = []

    def make(keys: tuple[bytes, ...] = (KEY, OLD_KEY), address: int | None = 5,
             seed: int = 23) -> Pair:
        made.append(Pair(lib, keys, address, seed))
        return made[-1]

    yield make  # type: ignore[misc]
    lib.idl_shim_auth_keys(b"", 0)  # the library's other users get unkeyed devices


def _differential(lib: ctypes.CDLL, steps: list[tuple[Any, ...]], address: int | None,
                  keyed: bool) -> None:
    try:
        pair = Pair(lib, (KEY, OLD_KEY) if keyed else (), address, 23)
        _run(pair, steps)
    finally:
        lib.idl_shim_auth_keys(b"", 0)


@settings(max_examples=40)
@given(steps=STEPS, address=st.sampled_from([None, 5]),
       keyed=st.sampled_from([True, True, False]))
def test_the_keyed_c_core_answers_hostile_streams_as_python(lib: ctypes.CDLL,
                                                            steps: list[tuple[Any, ...]],
                                                            address: int | None,
                                                            keyed: bool) -> None:
    """An unkeyed device (the control) too: it takes no tagged frame."""
    _differential(lib, steps, address, keyed)


@pytest.mark.slow
@settings(max_examples=5000)
@given(steps=STEPS, address=st.sampled_from([None, 5]),
       keyed=st.sampled_from([True, True, False]))
def test_the_keyed_c_core_answers_hostile_streams_as_python_long(lib: ctypes.CDLL,
                                                                 steps: list[tuple[Any, ...]],
                                                                 address: int | None,
                                                                 keyed: bool) -> None:
    """The same, 5,000 streams (under a minute)."""
    _differential(lib, steps, address, keyed)


@pytest.mark.parametrize("signed", [True, False])
def test_a_keyed_device_never_runs_a_broadcast(keyed: Callable[..., Pair], signed: bool) -> None:
    """docs/SECURITY.md, docs/BUS.md: broadcasts stay unsigned and a keyed device never runs one
    (counted ``unauthenticated``) — not even one signed with this device's session key (its
    holder could have sent the same command addressed, and answered)."""
    pair = keyed(keys=(KEY,), address=5)
    pair.feed(encode_frame(FrameType.HELLO, 1, 0, _hello_payload(bytes(16), key_id(KEY), 0),
                           address=5), "handshake")
    assert pair.session is not None
    write = struct.pack(">BHH", 6, THRESHOLD, 444)
    pair.feed(encode_frame(FrameType.REQUEST, 3, 0, write, address=0,
                           key=pair.session if signed else None,
                           direction=H2D if signed else None), "broadcast")
    assert pair.py.counters["broadcast_executed"] == 0
    assert pair.py.counters["unauthenticated"] == 1
    assert pair.core.read(THRESHOLD, 1)[0] != 444


def test_after_a_lost_key_the_re_keyed_device_runs_nothing_of_its_keyed_life(
        keyed: Callable[..., Pair]) -> None:
    """The recovery of a lost key on a device the operator holds (docs/SECURITY.md): the device
    restarted with a new key. Every frame of its old keyed life (handshakes, signed writes,
    across a reboot) replayed into the re-keyed device runs nothing on either side; the new key's
    host drives it."""
    pair = keyed(keys=(OLD_KEY,), address=None)
    wires: list[bytes] = []
    for boot in range(2):
        hello = encode_frame(FrameType.HELLO, 1, 0, _hello_payload(bytes((boot,)) * 16,
                                                                    key_id(OLD_KEY), 0))
        pair.feed(hello, "old handshake")
        assert pair.session is not None
        for seq in (5, 6):
            wires += [hello, encode_frame(
                FrameType.REQUEST, seq, pair.epoch, struct.pack(">BHH", 6, THRESHOLD, 400 + seq),
                key=pair.session, direction=H2D)]
            pair.feed(wires[-1], "old write")
        assert pair.py.counters["executed"] == 2 and pair.core.read(THRESHOLD, 1)[0] == 406
        pair.boot()
    new = keyed(keys=(KEY,), address=None, seed=24)  # the re-keyed device (a new boot)
    for i, wire in enumerate(wires):
        new.feed(wire, f"replayed frame {i}")
    for answer in new.answers:  # refusals only, never signed
        raw = cobs_decode(answer.strip(b"\x00"))
        assert not raw[2] & Flags.AUTH, raw.hex()
        assert raw[1] == FrameType.HELLO_REPLY or raw[13] in (Status.AUTHENTICATION_REQUIRED,
                                                              Status.EPOCH_MISMATCH)
    assert new.session is None and new.py.counters["executed"] == 0
    assert new.py.counters["unauthenticated"] == 4
    new.feed(encode_frame(FrameType.HELLO, 1, 0, _hello_payload(bytes(16), key_id(KEY), 0)),
             "new handshake")
    assert new.session is not None
    new.feed(encode_frame(FrameType.REQUEST, 9, new.epoch, struct.pack(">BHH", 6, THRESHOLD, 7),
                          key=new.session, direction=H2D), "new write")
    assert new.py.counters["executed"] == 1 and new.core.read(THRESHOLD, 1)[0] == 7


def test_a_tag_across_a_cobs_block_end_verifies(keyed: Callable[..., Pair]) -> None:
    """Payloads without a zero, so that a full COBS block (254 bytes) ends inside the tag, at
    every offset: each signed request verifies and runs once on both sides."""
    pair = keyed(keys=(KEY,), address=None)
    pair.feed(encode_frame(FrameType.HELLO, 1, 0, _hello_payload(bytes(16), key_id(KEY), 0)),
              "handshake")
    assert pair.session is not None
    for n in range(240, 256):
        pdu = struct.pack(">BHHB", 0x10, THRESHOLD, 1, 2) + b"\x55" * n
        pair.feed(encode_frame(FrameType.REQUEST, n, pair.epoch, pdu, key=pair.session,
                               direction=H2D), f"{n} filler bytes")
        raw = cobs_decode(pair.answers[-1].strip(b"\x00"))
        assert raw[2] & Flags.AUTH and raw[3:7] == pair.epoch.to_bytes(4, "little")
    assert pair.py.counters["executed"] == 16 and pair.py.decoder.counters["BAD_MAC"] == 0
