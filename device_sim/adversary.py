"""An attacker in the line (issue 23): the link emulator's adversary, sans-I/O and seeded.

``Adversary(rate, seed)`` watches both directions of a ``Link`` (every idemlink frame that crosses
it, as wire bytes) and, for each frame the host sends, with probability ``rate``, puts one attack
frame on the host→device direction right after it (so the line's own faults apply to it too).
Every attack has a correct CRC-32C: the attacker controls the wire, the CRC is no obstacle. The
kinds (``Attack``), drawn uniformly:

- FORGE: a REQUEST of the attacker's own (a register write) with a random 8-byte tag, in the
  device's current epoch and just past the host's numbers;
- REPLAY_SAME: a host frame of this session again, bit for bit (the de-duplication answers it
  from the replay cache; nothing runs twice);
- REPLAY_OLD: a host frame captured before the last HELLO (an older session, or an older boot);
- REFLECT: one of the device's own answers sent back to it;
- STRIP: a host frame with its AUTH flag and tag removed (a downgrade to the first contract's
  frame), CRC recomputed;
- TRUNCATE: a host frame whose tag is cut to 4 bytes, or claimed 16 bytes long (AUTH_LONG) with
  random bytes after the real 8;
- BITFLIP: a host frame with one bit of its header or payload flipped, CRC recomputed.

``sent`` counts what it injected by kind. A keyed device must refuse every one but REPLAY_SAME
(answered from the replay cache) and run none (judged from its execution log); an unkeyed device
is expected to fall to FORGE, STRIP and BITFLIP — that is the point of keys.
Configured as the link parameter ``adversary=RATE`` (``faulty://``, ``idemlink link``).
"""

from __future__ import annotations

import random
import struct
from collections import Counter, deque
from enum import Enum

from idemlink.protocol import cobs
from idemlink.protocol.frame import (
    AUTH_TAG_LEN,
    CRC_LEN,
    HEADER_LEN,
    Flags,
    FrameType,
    crc32c,
)

MAX_CAPTURED = 256  #: frames kept per kind of capture (bounded memory)


class Attack(Enum):
    FORGE = "forge"
    REPLAY_SAME = "replay_same"
    REPLAY_OLD = "replay_old"
    REFLECT = "reflect"
    STRIP = "strip"
    TRUNCATE = "truncate"
    BITFLIP = "bitflip"


def _wire(raw: bytes) -> bytes:
    return b"\x00" + cobs.encode(raw) + b"\x00"


def _recrc(body: bytes) -> bytes:
    return body + struct.pack("<I", crc32c(body))


def _frames(buf: bytearray, data: bytes) -> list[bytes]:
    """Complete raw frames (COBS-decoded, CRC left on) found in ``buf + data``."""
    buf += data
    out: list[bytes] = []
    while (end := buf.find(0)) >= 0:
        segment = bytes(buf[:end])
        del buf[:end + 1]
        if segment:
            raw = cobs.decode_segment(segment)
            if raw is not None and len(raw) >= HEADER_LEN + CRC_LEN:
                out.append(raw)
    if len(buf) > 4096:
        buf.clear()
    return out


class Adversary:
    """See the module docstring. ``to_device(data, now)`` and ``to_host(data, now)`` observe the
    two directions; ``to_device`` returns the attack frames to put on the line after ``data``."""

    def __init__(self, rate: float, seed: int = 0) -> None:
        self.rate = rate
        self._rng = random.Random(f"adversary:{seed}")
        self._in = bytearray()
        self._back = bytearray()
        self._session: deque[bytes] = deque(maxlen=MAX_CAPTURED)  #: host frames since last HELLO
        self._older: deque[bytes] = deque(maxlen=MAX_CAPTURED)  #: host frames of earlier sessions
        self._answers: deque[bytes] = deque(maxlen=MAX_CAPTURED)
        self._epoch = 0
        self._seq = 0
        self.sent: Counter[str] = Counter()
        #: attack frames put on the line and not yet seen delivered (wire unit -> kinds), for
        #: a judge that reads the line's delivery record (``delivered``); bounded
        self._injected: dict[bytes, list[str]] = {}

    def delivered(self, unit: bytes) -> str | None:
        """The kind of attack ``unit`` (the bytes between two delimiters, as the link's
        delivery record has them) is, if it is one injected and not yet matched."""
        kinds = self._injected.get(unit)
        if not kinds:
            return None
        kind = kinds.pop(0)
        if not kinds:
            del self._injected[unit]
        return kind

    def to_host(self, data: bytes, now: float) -> list[bytes]:
        for raw in _frames(self._back, data):
            if raw[1] in (FrameType.RESPONSE, FrameType.HELLO_REPLY):
                self._answers.append(raw)
                self._epoch = struct.unpack_from("<I", raw, 3)[0]
        return []

    def to_device(self, data: bytes, now: float) -> list[bytes]:
        out: list[bytes] = []
        for raw in _frames(self._in, data):
            if raw[1] == FrameType.HELLO:
                self._older.extend(self._session)
                self._session.clear()
                continue
            if raw[1] != FrameType.REQUEST:
                continue
            self._session.append(raw)
            self._seq = max(self._seq, struct.unpack_from("<I", raw, 7)[0])
            if self._rng.random() < self.rate:
                attack = self._rng.choice(list(Attack))
                forged = self._make(attack, raw)
                if forged is not None:
                    self.sent[attack.value] += 1
                    wire = _wire(forged)
                    out.append(wire)
                    if len(self._injected) >= MAX_CAPTURED * 16:
                        self._injected.pop(next(iter(self._injected)))
                    self._injected.setdefault(wire[1:-1], []).append(attack.value)
        return out

    def _make(self, attack: Attack, raw: bytes) -> bytes | None:
        rng = self._rng
        body = raw[:-CRC_LEN]
        flags = raw[2]
        if attack is Attack.FORGE:
            self._seq += 1
            pdu = bytes((0x06,)) + rng.randbytes(4)
            header = struct.pack("<BBBIIH", 1, FrameType.REQUEST, int(Flags.AUTH), self._epoch,
                                 self._seq, len(pdu))
            return _recrc(header + pdu + rng.randbytes(AUTH_TAG_LEN))
        if attack is Attack.REPLAY_SAME:
            return raw
        if attack is Attack.REPLAY_OLD:
            return rng.choice(self._older) if self._older else None
        if attack is Attack.REFLECT:
            return rng.choice(self._answers) if self._answers else None
        if not flags & Flags.AUTH:
            # an unkeyed host's frame: nothing to strip or truncate; flip a bit instead
            attack = Attack.BITFLIP
        tag_len = AUTH_TAG_LEN * (2 if flags & Flags.AUTH_LONG else 1)
        if attack is Attack.STRIP:
            length = struct.unpack_from("<H", body, 11)[0]
            keep = body[:len(body) - tag_len]
            stripped = bytes((keep[0], keep[1], flags & ~(Flags.AUTH | Flags.AUTH_LONG))) + keep[3:]
            assert len(stripped) - HEADER_LEN >= length
            return _recrc(stripped)
        if attack is Attack.TRUNCATE:
            if rng.random() < 0.5:
                return _recrc(body[:-4])
            longer = bytes((body[0], body[1], flags | Flags.AUTH_LONG)) + body[3:]
            return _recrc(longer + rng.randbytes(AUTH_TAG_LEN))
        # BITFLIP: one bit of the covered bytes past the version/type/flags (so the frame still
        # parses: epoch, seq, length excluded too, then address and payload)
        covered = len(body) - (tag_len if flags & Flags.AUTH else 0)
        if covered <= HEADER_LEN:
            pos = 3 + rng.randrange(8)  # epoch or seq
        else:
            pos = rng.choice([3 + rng.randrange(8), HEADER_LEN + rng.randrange(covered - HEADER_LEN)])
        flipped = bytearray(body)
        flipped[pos] ^= 1 << rng.randrange(8)
        return _recrc(bytes(flipped))
