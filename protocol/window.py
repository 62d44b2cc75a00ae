"""The sliding-window sequence de-duplication, bit-exact with ``firmware_ref``.

Contract:

- Sequence numbers are ``SEQ_BITS`` (32) wide and compared with RFC 1982 serial arithmetic:
  ``d = (seq - highest) mod 2^32``. ``1 <= d < 2^31`` is *ahead* (``NEW``); a distance of exactly
  2^31 is undefined in RFC 1982 and is treated here as *old* — with a window far smaller than 2^31
  it is therefore ``TOO_OLD``.
- The window holds the last ``WINDOW_SIZE`` numbers ending at the highest accepted one:
  ``back = (highest - seq) mod 2^32``; ``back < WINDOW_SIZE`` is inside, ``back >= WINDOW_SIZE`` is
  ``TOO_OLD``. ``WINDOW_SIZE = RING_BITS - BLOCK_BITS`` (992 for the default 1024-bit ring of 32-bit
  blocks, WireGuard's layout): the block holding ``highest`` is only partly in use, so one spare block
  keeps whole-block clearing correct.
- State is explicit: EMPTY (nothing accepted since init/reset: every number is ``NEW``) or TRACKING.
- ``check(seq)`` is pure. ``commit(seq)`` re-derives the verdict and applies it (``COMMIT_SPEC``):
  NEW advances ``highest`` and clears the ring blocks passed over (whole blocks, at most the whole
  ring; the bitmap is never shifted), ACCEPT_OLD sets the bit, DUPLICATE and TOO_OLD only count.
  Call ``commit`` only once the frame passed its integrity check, so a forged far-ahead number
  cannot wipe the window.
- Bad input (a number outside ``0 .. 2^32-1``) raises ``LocalProtocolError`` and changes nothing.

The ring is a list of ``BLOCK_BITS``-bit ints indexed by ``(seq >> log2(BLOCK_BITS)) & (blocks-1)``;
block numbers stay continuous across the wrap because ``RING_BITS`` divides 2^32.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from idemlink.protocol.frame import SEQ_BITS
from idemlink.protocol.outcome import LocalProtocolError

RING_BITS = 1024
"""Bits in the ring (a power of two dividing 2^SEQ_BITS)."""
BLOCK_BITS = 32
"""Bits per ring block: advancing clears whole blocks."""
WINDOW_SIZE = RING_BITS - BLOCK_BITS
"""Numbers tracked: ``highest - WINDOW_SIZE + 1 .. highest``."""

SEQ_MASK = (1 << SEQ_BITS) - 1
HALF = 1 << (SEQ_BITS - 1)


class Verdict(IntEnum):
    """What the window says about a sequence number (values are on the C side too)."""

    NEW = 0  #: ahead of the highest (or the window is empty): accept, commit advances
    ACCEPT_OLD = 1  #: inside the window, not seen yet: accept, commit sets its bit
    DUPLICATE = 2  #: inside the window and already committed: replay, never re-run
    TOO_OLD = 3  #: behind the window (or exactly 2^31 away): cannot tell, refuse


class WindowState(Enum):
    EMPTY = "empty"
    TRACKING = "tracking"


class CommitEffect(Enum):
    ADVANCE = "advance highest, clear the ring blocks passed over (capped at the ring), set the bit"
    MARK = "set the bit"
    COUNT = "change nothing but the diagnostic counter"


COMMIT_SPEC: dict[tuple[WindowState, Verdict], tuple[WindowState, CommitEffect, str]] = {
    (WindowState.EMPTY, Verdict.NEW): (WindowState.TRACKING, CommitEffect.ADVANCE, "advances"),
    (WindowState.TRACKING, Verdict.NEW): (WindowState.TRACKING, CommitEffect.ADVANCE, "advances"),
    (WindowState.TRACKING, Verdict.ACCEPT_OLD): (WindowState.TRACKING, CommitEffect.MARK, "accepted"),
    (WindowState.TRACKING, Verdict.DUPLICATE): (WindowState.TRACKING, CommitEffect.COUNT, "duplicates"),
    (WindowState.TRACKING, Verdict.TOO_OLD): (WindowState.TRACKING, CommitEffect.COUNT, "too_old"),
}
"""The specification of ``commit``, per (state, verdict): next state, effect, counter bumped (NEW
also bumps ``accepted``). ``commit`` is written out by hand for speed (and bit-exact with the C
window); tests/test_window.py checks it against every row, and the contract renders the rows. An
EMPTY window only ever says NEW. ``check`` never changes anything."""

_NEW = Verdict.NEW
_OLD = Verdict.ACCEPT_OLD
_DUP = Verdict.DUPLICATE
_TOO_OLD = Verdict.TOO_OLD


@dataclass(frozen=True, slots=True)
class WindowCounters:
    """Diagnostic counters (the C idl_window_counters_t has the same four, outside the state)."""

    accepted: int  #: commits of NEW or ACCEPT_OLD
    duplicates: int  #: commits that found DUPLICATE
    too_old: int  #: commits that found TOO_OLD
    advances: int  #: commits of NEW


def _bad_seq(seq: int) -> LocalProtocolError:
    return LocalProtocolError(f"sequence number {seq!r} is outside 0..{SEQ_MASK}")


class ReplayWindow:
    """A ring-of-blocks replay window; see the module docstring for the rules."""

    __slots__ = (
        "_accepted_old",
        "_advances",
        "_bit_mask",
        "_blocks",
        "_duplicates",
        "_empty",
        "_highest",
        "_idx_mask",
        "_nblocks",
        "_shift",
        "_size",
        "_too_old",
        "block_bits",
        "ring_bits",
    )

    def __init__(self, ring_bits: int = RING_BITS, block_bits: int = BLOCK_BITS) -> None:
        for name, v in (("ring_bits", ring_bits), ("block_bits", block_bits)):
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if ring_bits < 2 * block_bits or ring_bits > HALF:
            raise ValueError("ring_bits must hold at least two blocks and at most 2^(SEQ_BITS-1)")
        self.ring_bits = ring_bits
        self.block_bits = block_bits
        self._nblocks = ring_bits // block_bits
        self._idx_mask = self._nblocks - 1
        self._shift = block_bits.bit_length() - 1
        self._bit_mask = block_bits - 1
        self._size = ring_bits - block_bits
        self._blocks = [0] * self._nblocks
        self._highest = 0
        self._empty = True
        self._accepted_old = self._duplicates = self._too_old = self._advances = 0

    @property
    def size(self) -> int:
        """Numbers tracked behind and including the highest: ``ring_bits - block_bits``."""
        return self._size

    @property
    def state(self) -> WindowState:
        return WindowState.EMPTY if self._empty else WindowState.TRACKING

    @property
    def highest(self) -> int | None:
        """The highest committed number, ``None`` while EMPTY."""
        return None if self._empty else self._highest

    def reset(self) -> None:
        """Back to EMPTY (e.g. a new boot epoch). Counters are kept."""
        self._blocks = [0] * self._nblocks
        self._highest = 0
        self._empty = True

    def check(self, seq: int) -> Verdict:
        """The verdict for ``seq``; changes nothing."""
        if not 0 <= seq <= SEQ_MASK:
            raise _bad_seq(seq)
        back = (self._highest - seq) & SEQ_MASK
        if back > HALF or self._empty:  # d = seq - highest in 1 .. 2^31-1 (or nothing seen yet)
            return _NEW
        if back >= self._size:  # includes back = d = 2^31 exactly: old
            return _TOO_OLD
        if self._blocks[(seq >> self._shift) & self._idx_mask] >> (seq & self._bit_mask) & 1:
            return _DUP
        return _OLD

    def commit(self, seq: int) -> Verdict:
        """Apply ``seq`` (after its frame passed the integrity check); returns the verdict applied.

        The verdict is re-derived, so committing after a stale ``check`` is safe: a number that became
        DUPLICATE or TOO_OLD in between is only counted.
        """
        if not 0 <= seq <= SEQ_MASK:
            raise _bad_seq(seq)
        highest = self._highest
        back = (highest - seq) & SEQ_MASK
        shift = self._shift
        if back > HALF or self._empty:
            blocks = self._blocks
            # Blocks passed over: (highest mod block + d) // block with d = seq - highest < 2^31,
            # so the count is right across the wrap at 2^SEQ_BITS (no block-number overflow).
            n = ((highest & self._bit_mask) - back) & SEQ_MASK
            n >>= shift
            if n:
                nblocks = self._nblocks
                if n >= nblocks or self._empty:
                    blocks[:] = [0] * nblocks
                else:
                    mask = self._idx_mask
                    last = seq >> shift
                    for k in range(n):
                        blocks[(last - k) & mask] = 0
            blocks[(seq >> shift) & self._idx_mask] |= 1 << (seq & self._bit_mask)
            self._highest = seq
            self._empty = False
            self._advances += 1
            return _NEW
        if back >= self._size:
            self._too_old += 1
            return _TOO_OLD
        blocks = self._blocks
        i = (seq >> shift) & self._idx_mask
        bit = 1 << (seq & self._bit_mask)
        if blocks[i] & bit:
            self._duplicates += 1
            return _DUP
        blocks[i] |= bit
        self._accepted_old += 1
        return _OLD

    @property
    def counters(self) -> WindowCounters:
        return WindowCounters(
            self._advances + self._accepted_old, self._duplicates, self._too_old, self._advances
        )


def contract_section() -> ContractSection:
    rows = [
        [st.value, v.name, nxt.value, eff.value, ctr]
        for (st, v), (nxt, eff, ctr) in COMMIT_SPEC.items()
    ]
    vrows = [
        [0, "NEW", "d = (seq - highest) mod 2^32 in 1 .. 2^31-1, or the window is empty"],
        [1, "ACCEPT_OLD", "back = (highest - seq) mod 2^32 < W and its bit is clear"],
        [2, "DUPLICATE", "back < W and its bit is set (back = 0 is the highest itself)"],
        [3, "TOO_OLD", "back >= W, including d = 2^31 exactly (RFC 1982 leaves it undefined)"],
    ]
    md = (
        "## Sequence de-duplication window\n\n"
        f"A ring of {RING_BITS} bits in blocks of {BLOCK_BITS} bits; the window tracks the last "
        f"W = {WINDOW_SIZE} numbers (ring minus one block, WireGuard's layout) ending at the highest "
        f"committed one. Sequence numbers are {SEQ_BITS}-bit and compared with RFC 1982 serial "
        "arithmetic. `check` is pure; `commit` (only after the frame passed its integrity check) "
        "re-derives the verdict and applies it. Advancing clears whole blocks (at most the whole "
        "ring); the bitmap is never shifted.\n\n"
        + md_table(["value", "verdict", "when"], vrows)
        + "\n"
        + md_table(["state", "verdict", "next state", "commit does", "counter"], rows)
    )
    return ContractSection(
        name="window",
        defines=[
            CDefine("IDL_WINDOW_RING_BITS", RING_BITS, "bits in the de-duplication ring"),
            CDefine("IDL_WINDOW_BLOCK_BITS", BLOCK_BITS, "bits per ring block"),
            CDefine("IDL_WINDOW_SIZE", WINDOW_SIZE, "numbers tracked: ring minus one block"),
        ],
        enums=[CEnum("idl_verdict_t", "IDL_VERDICT", Verdict, "window verdicts")],
        markdown=md,
        data={
            "ring_bits": RING_BITS,
            "block_bits": BLOCK_BITS,
            "window_size": WINDOW_SIZE,
            "seq_bits": SEQ_BITS,
            "half_distance": "TOO_OLD",
            "verdicts": {v.name: int(v) for v in Verdict},
        },
    )
