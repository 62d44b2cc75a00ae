"""The device's response journal: the last K answers, keyed by sequence number.

A journal of answers small enough for a microcontroller. For every request the
device executed it keeps ``(seq, digest of the request content, response payload)``; K entries,
oldest evicted first. On a duplicate sequence number (the window's DUPLICATE verdict):

- same digest → the exact response payload of the first answer (``lookup`` returns it; the
  session sends it with the REPLAY flag): the command does not run again;
- different digest → IDEMPOTENCY_CONFLICT: the number was reused for other content; nothing runs;
- no entry (evicted) → ANSWER_EVICTED: it ran before, its answer is no longer kept.

The digest is CRC-32C of the request payload (the frame's own CRC engine, so firmware needs no
second hash). Memory budget per entry: 4 (seq) + 4 (digest) + 2 (length) + the largest response
payload (1 status + 253 PDU bytes = 254) = 264 bytes; the default K = 64 costs 16.5 KiB in the
simulator, and a firmware sizing K to its RAM (K = 8 → 2.1 KiB) keeps the same semantics with a
shorter replay horizon (older duplicates get ANSWER_EVICTED, never a second execution).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from idemlink.protocol.frame import crc32c

DEFAULT_SLOTS = 64
ENTRY_OVERHEAD = 10
MAX_RESPONSE_PAYLOAD = 254


def request_digest(payload: bytes) -> int:
    """Digest of a request's content (its payload): CRC-32C."""
    digest: int = crc32c(payload)
    return digest


class ReplayVerdict(Enum):
    REPLAY = "replay"
    CONFLICT = "conflict"
    EVICTED = "evicted"


@dataclass(slots=True)
class ReplayEntry:
    digest: int
    response: bytes


class ReplayCache:
    """Bounded map seq → (digest, response payload), evicting the oldest insertion."""

    __slots__ = ("_entries", "slots")

    def __init__(self, slots: int = DEFAULT_SLOTS) -> None:
        if slots < 1:
            raise ValueError("a replay cache needs at least one slot")
        self.slots = slots
        self._entries: OrderedDict[int, ReplayEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, seq: int, digest: int, response: bytes) -> None:
        """Remember the answer to a request that was just executed."""
        entries = self._entries
        entries[seq] = ReplayEntry(digest, response)
        entries.move_to_end(seq)
        if len(entries) > self.slots:
            entries.popitem(last=False)

    def lookup(self, seq: int, digest: int) -> tuple[ReplayVerdict, bytes]:
        """Classify a duplicate; the bytes are the stored response for REPLAY, else b''."""
        entry = self._entries.get(seq)
        if entry is None:
            return ReplayVerdict.EVICTED, b""
        if entry.digest != digest:
            return ReplayVerdict.CONFLICT, b""
        return ReplayVerdict.REPLAY, entry.response

    def budget_bytes(self) -> int:
        """RAM a fixed-size C implementation of this cache needs."""
        return self.slots * (ENTRY_OVERHEAD + MAX_RESPONSE_PAYLOAD)
