"""Authenticated sessions (issue 23): the HELLO nonces, the key id, and the one rule of which frames
a keyed peer takes. Sans-I/O: randomness comes in as a callable, keys as bytes; nothing is logged.

The frame codec (``idemlink.protocol.frame``) owns the MAC itself (``frame_mac``, keyed BLAKE2s
over direction + every byte before the tag) and the session-key KDF (``derive_session_key``). This
module adds what the sessions need around them:

- ``key_id(key)``: a 32-bit name of a long-term key, ``BLAKE2s(key, "idemlink key id v1")[:4]``
  (a keyed one-way function: it names a key without revealing it). It travels in HELLO (the key
  the host holds) and HELLO_REPLY (the key the device used), never the key.
- HELLO's auth extension (``HELLO_AUTH``, appended after the first contract's HELLO payload, so a
  device that does not know it ignores it): host nonce (16 bytes) and the host's key id.
- ``DeviceAuth``: a keyed device's keys (the current one first, older ones accepted during a
  rotation window) and its one session key. A HELLO naming a key it holds gets a fresh device
  nonce and a new session key; a HELLO repeated with the same host nonce gets the same device
  nonce (the reply is a retransmission, the key does not change under the host's feet).
- ``HostAuth``: a keyed host's key, its nonce per handshake, the check of the HELLO_REPLY (signed
  with the new session key, or refused: no downgrade) and of every later answer.

Rules (docs/SECURITY.md): a keyed device verifies the tag of every frame but HELLO right after the
CRC (the decoder's ``MacCheck``), refuses what does not verify (counted) and answers an
unauthenticated REQUEST with AUTHENTICATION_REQUIRED *unsigned* (so a keyed host, which takes only
signed answers, can never mistake it for the answer to its own, signed, request whose copy an
attacker stripped). A keyed host takes only frames whose tag verifies under the session key.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import construct as cs

from idemlink.protocol.frame import (
    KEY_LEN,
    LAYOUT_FLAGS,
    NONCE_LEN,
    Direction,
    Frame,
    FrameEncodeError,
    FrameType,
    MacCheck,
    MacKey,
    derive_session_key,
    raw_frame,
)
from idemlink.protocol.outcome import Status

KEY_ID_LABEL = b"idemlink key id v1"

HELLO_AUTH = cs.Struct(
    "host_nonce" / cs.Bytes(NONCE_LEN),
    "key_id" / cs.Int32ul,
    "_extensions" / cs.GreedyBytes,
)
"""Appended to HELLO's payload by a keyed host (its first extension)."""

NonceSource = Callable[[int], bytes]
"""``n -> n random bytes`` (the shell passes ``secrets.token_bytes`` or ``os.urandom``)."""


def key_id(key: bytes) -> int:
    """The 32-bit id of a long-term key (one-way: the id never reveals the key)."""
    if len(key) != KEY_LEN:
        raise FrameEncodeError(f"a long-term key is {KEY_LEN} bytes, not {len(key)}")
    return int.from_bytes(hashlib.blake2s(KEY_ID_LABEL, key=key, digest_size=4).digest(),
                          "little")


def encode_hello_auth(host_nonce: bytes, kid: int) -> bytes:
    return bytes(HELLO_AUTH.build({"host_nonce": host_nonce, "key_id": kid, "_extensions": b""}))


def decode_hello_auth(extension: bytes) -> tuple[bytes, int] | None:
    """``(host_nonce, key_id)`` from HELLO's extension bytes, or None (an unkeyed host's HELLO,
    or bytes too short to be one)."""
    if len(extension) < NONCE_LEN + 4:
        return None
    c = HELLO_AUTH.parse(extension)
    return bytes(c.host_nonce), int(c.key_id)


def hello_extension(hello_payload: bytes) -> bytes:
    """The bytes after the first contract's HELLO fields (version u8, contract hash 8)."""
    return hello_payload[9:]


def verify_frame(frame: Frame, key: MacKey, direction: Direction) -> bool:
    """Whether ``frame``'s tag is the one ``key`` gives it (the codec re-signs the parsed frame:
    the layout is canonical, so the covered bytes are the received ones)."""
    if frame.tag is None or len(frame.tag) != key.tag_len:
        return False
    raw = raw_frame(frame.type, frame.seq, frame.epoch, frame.payload,
                    int(frame.flags) & ~int(LAYOUT_FLAGS), address=frame.address, key=key,
                    direction=direction)
    return hmac.compare_digest(raw[-4 - key.tag_len:-4], frame.tag)


def epoch_hint(frame: Frame, current_epoch: int) -> bool:
    """Whether a keyed host takes ``frame`` although it is unsigned: only an EPOCH_MISMATCH
    RESPONSE naming another epoch than the session's. A keyed device that rebooted has no session
    key, so it cannot sign the news (AUTOSAR SecOC's desynchronisation after a reset). The hint is
    safe to take unsigned: the epoch-change path never concludes that a request did not run
    (set-only requests are re-issued, others settle UNKNOWN) and the new epoch is believed only
    from the HELLO_REPLY that follows, which is signed. A forged hint costs a handshake."""
    return (frame.type is FrameType.RESPONSE and frame.tag is None
            and frame.payload[:1] == bytes((Status.EPOCH_MISMATCH,))
            and frame.epoch != current_epoch)


@dataclass(frozen=True, slots=True)
class DeviceKeys:
    """A device's long-term keys: ``keys[0]`` is the current one (named in HELLO_REPLY); the
    others are older keys still accepted during a rotation window (the operator removes them
    when the window closes, docs/SECURITY.md). ``repr`` shows key ids only."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise FrameEncodeError("a keyed device needs at least one key")
        for k in self.keys:
            key_id(k)  # checks the length

    @property
    def current_id(self) -> int:
        return key_id(self.keys[0])

    def find(self, kid: int) -> bytes | None:
        for k in self.keys:
            if key_id(k) == kid:
                return k
        return None

    def __repr__(self) -> str:
        return "DeviceKeys(" + ", ".join(f"{key_id(k):08x}" for k in self.keys) + ")"


class DeviceAuth:
    """A keyed device's authentication state: its keys and the one session key (None until a
    HELLO from a host holding one of its keys)."""

    __slots__ = ("_host_nonce", "device_nonce", "key_id", "keys", "nonce", "session")

    def __init__(self, keys: DeviceKeys, nonce: NonceSource) -> None:
        self.keys = keys
        self.nonce = nonce
        self.session: MacKey | None = None
        self.key_id = keys.current_id  #: the key of the current session (current key before)
        self.device_nonce = nonce(NONCE_LEN)
        self._host_nonce: bytes | None = None

    def hello(self, hello_payload: bytes, device_id: str, address: int | None) -> MacKey | None:
        """A HELLO arrived: a new session key if it names a key this device holds (None: the
        reply goes unsigned and every later frame is refused until a keyed HELLO)."""
        ext = decode_hello_auth(hello_extension(hello_payload))
        if ext is None:
            self.key_id = self.keys.current_id
            return None
        host_nonce, kid = ext
        key = self.keys.find(kid)
        if key is None:  # the host holds another key: say which one we hold, sign nothing
            self.key_id = self.keys.current_id
            return None
        if host_nonce != self._host_nonce or self.session is None:
            self.device_nonce = self.nonce(NONCE_LEN)  # same HELLO again: same answer
            self._host_nonce = host_nonce
        self.key_id = kid
        self.session = MacKey(derive_session_key(key, host_nonce, self.device_nonce,
                                                 device_id.encode(), address))
        return self.session

    def check(self) -> MacCheck | None:
        return None if self.session is None else MacCheck(self.session, Direction.HOST_TO_DEVICE)

    def __repr__(self) -> str:
        return f"DeviceAuth({self.keys!r}, session={'yes' if self.session else 'no'})"


class HostAuth:
    """A keyed host's authentication state: its key, the nonce of the current handshake and the
    session key once a HELLO_REPLY verified."""

    __slots__ = ("_key", "_nonce", "_nonce_seq", "key_id", "nonce_source", "session")

    def __init__(self, key: bytes, nonce: NonceSource) -> None:
        self.key_id = key_id(key)
        self._key = key
        self.nonce_source = nonce
        self._nonce = b""
        self._nonce_seq: int | None = None
        self.session: MacKey | None = None

    def hello_extension(self, hello_seq: int) -> bytes:
        """HELLO's auth extension: one nonce per handshake (a resent HELLO carries the same)."""
        if hello_seq != self._nonce_seq:
            self._nonce = self.nonce_source(NONCE_LEN)
            self._nonce_seq = hello_seq
        return encode_hello_auth(self._nonce, self.key_id)

    def on_hello_reply(self, frame: Frame, device_nonce: bytes | None, device_key_id: int | None,
                       advertises_auth: bool, device_id: str, address: int | None
                       ) -> MacKey | str:
        """The session key if the reply is signed with it; else why the device is refused."""
        if not advertises_auth or device_nonce is None:
            return ("the device is not keyed (it does not advertise AUTH): a host with a key "
                    "refuses it (no downgrade)")
        if device_key_id != self.key_id:
            return (f"the device holds key id {device_key_id:08x}, ours is {self.key_id:08x}"
                    if device_key_id is not None else "the device names no key id")
        key = MacKey(derive_session_key(self._key, self._nonce, device_nonce,
                                        device_id.encode(), address))
        if frame.tag is None:
            return "the device's HELLO_REPLY is not signed (no downgrade)"
        if not verify_frame(frame, key, Direction.DEVICE_TO_HOST):
            return "the device's HELLO_REPLY does not verify under our key"
        self.session = key
        return key

    def verify(self, frame: Frame) -> bool:
        return self.session is not None and verify_frame(frame, self.session,
                                                         Direction.DEVICE_TO_HOST)

    def __repr__(self) -> str:
        return f"HostAuth(key id {self.key_id:08x}, session={'yes' if self.session else 'no'})"


def device_keys(keys: Sequence[bytes]) -> DeviceKeys:
    return DeviceKeys(tuple(keys))


def contract_additive() -> dict[str, object]:
    """The auth additions of the session contract (not hashed)."""
    return {"hello_auth": [sc.name for sc in HELLO_AUTH.subcons],
            "key_id": "BLAKE2s(key=long-term key, data='" + KEY_ID_LABEL.decode()
                      + "', digest 4) LE"}
