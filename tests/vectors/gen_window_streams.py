"""Generate tests/vectors/window_streams.json: the numbered table of sequence streams.

Run once (``python3 tests/vectors/gen_window_streams.py``) and commit the JSON; the Python tests and
the C tests (through firmware_ref/tools/vectors_to_c.py) both consume it.

Where the expected verdicts come from: every step below is written with the verdict reasoned by hand
from the rules (W = 992, 32-bit RFC 1982 arithmetic, distance 2^31 is old). The generator then replays
each stream through ``Naive`` — a deliberately simple model (a set of committed numbers and the
highest, pruned to the window on every advance) that shares no code with protocol/window.py or the
C — and refuses to write the table if any hand verdict disagrees. A few long streams (``model``
steps) take their verdicts from ``Naive`` only; they are marked ``"source": "naive-model"``.

Step ops: ``"d"`` = deliver (the frame passed its integrity check: check, then commit, both must give
the verdict); ``"x"`` = check only (the frame failed its integrity check: the verdict must come back
and nothing may change).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SEQ_BITS = 32
M = 1 << SEQ_BITS
HALF = M >> 1
RING = 1024
BLOCK = 32
W = RING - BLOCK  # 992

NEW, OLD, DUP, TOO_OLD = "NEW", "ACCEPT_OLD", "DUPLICATE", "TOO_OLD"


class Naive:
    """The rules, written as plainly as possible (no bitmap, no blocks)."""

    def __init__(self) -> None:
        self.highest: int | None = None
        self.seen: set[int] = set()

    def verdict(self, seq: int) -> str:
        if self.highest is None:
            return NEW
        d = (seq - self.highest) % M
        if 1 <= d < HALF:
            return NEW
        back = (self.highest - seq) % M
        if back >= W:
            return TOO_OLD
        return DUP if seq in self.seen else OLD

    def commit(self, seq: int) -> str:
        v = self.verdict(seq)
        if v == NEW:
            self.highest = seq
            self.seen = {s for s in self.seen if (seq - s) % M < W}
            self.seen.add(seq)
        elif v == OLD:
            self.seen.add(seq)
        return v


Step = list[Any]
STREAMS: list[tuple[str, str, list[Step]]] = []


def stream(name: str, about: str, steps: list[Step]) -> None:
    STREAMS.append((name, about, steps))


def d(seq: int, v: str) -> Step:
    return ["d", seq % M, v]


def x(seq: int, v: str) -> Step:
    return ["x", seq % M, v]


def run(seqs: range | list[int], v: str) -> list[Step]:
    return [d(s, v) for s in seqs]


# 1-4: the empty state
stream("empty_zero", "an empty window accepts 0; 0 and 1 then repeat as duplicates",
       [d(0, NEW), d(0, DUP), d(1, NEW), d(0, DUP), d(1, DUP)])
stream("empty_max_then_wrap", "first number 2^32-1; 0 is one ahead of it",
       [d(M - 1, NEW), x(0, NEW), d(0, NEW), d(M - 1, DUP), d(M - 2, OLD), d(M - 2, DUP)])
stream("empty_check_is_pure", "checks on an empty window change nothing",
       [x(5, NEW), x(5, NEW), x(M - 1, NEW), d(5, NEW), x(5, DUP), x(4, OLD), x(6, NEW),
        d(4, OLD), d(4, DUP)])
stream("empty_first_is_half", "first 2^31; 0 is exactly 2^31 away (old); later 2^31 falls behind",
       [d(HALF, NEW), d(0, TOO_OLD), x(0, TOO_OLD), d(HALF - 1, OLD), d(M - 1, NEW),
        d(HALF, TOO_OLD), d(M - 2, OLD)])

# 5-6: order and reordering
stream("in_order_across_wrap", "48 numbers in order across 2^32, then all of them again",
       run(range(M - 16, M + 32), NEW) + run(range(M - 16, M + 32), DUP))
stream("reorder", "late numbers inside the window are accepted once",
       [d(100, NEW), d(99, OLD), d(97, OLD), d(98, OLD), d(50, OLD), d(97, DUP), d(50, DUP),
        d(101, NEW), d(100, DUP), d(96, OLD), d(101, DUP), d(99, DUP)])
stream("check_then_commit_old", "a check of an old number does not mark it; commit does",
       [d(1000, NEW), x(999, OLD), x(999, OLD), d(999, OLD), x(999, DUP), d(999, DUP)])

# 7-8: the back edge of the window
stream("window_edge", "back = W-1 is inside, back = W and W+1 are too old",
       [d(2000, NEW), d(2000 - (W - 1), OLD), d(2000 - W, TOO_OLD), d(2000 - W - 1, TOO_OLD),
        d(2000 - (W - 1), DUP), x(2000 - W, TOO_OLD)])
stream("window_edge_across_wrap", "the same edge with the window straddling 2^32",
       [d(256, NEW), d(256 - (W - 1), OLD), d(256 - W, TOO_OLD), d(M - 1, OLD), d(0, OLD),
        d(M - 1, DUP), d(256 - (W - 1), DUP), d(255, OLD)])

# 9-12: jumps of W-1, W, W+1, the ring, more
stream("jump_exactly_w", "after a jump of exactly W the old highest falls out, its successor stays",
       [*run(range(1000, 1011), NEW), d(1009 + W, NEW), d(1009, TOO_OLD), d(1010, DUP),
        d(1011, OLD), d(1011, DUP), d(1009 + W, DUP)])
stream("jump_w_minus_1_and_w_plus_1", "jumps of W-1 keep the old highest, W+1 drops it",
       [d(10, NEW), d(10 + W - 1, NEW), d(10, DUP), d(11, OLD), d(10 + W - 1 + W + 1, NEW),
        d(10 + W - 1, TOO_OLD), d(10 + W - 1 + 1, TOO_OLD),
        d(10 + W - 1 + 2, OLD)])
stream("jump_ring", "a jump of exactly the ring size (1024) empties the window but the highest",
       [d(5000, NEW), d(4999, OLD), d(5000 + RING, NEW), d(5000, TOO_OLD), d(4999, TOO_OLD),
        d(5000 + RING - (W - 1), OLD), d(5000 + RING - 1, OLD), d(5000 + RING, DUP),
        d(5000 + RING - 1, DUP)])
stream("jump_ring_across_wrap", "a ring-size jump landing exactly on 0",
       [d(M - RING, NEW), d(M - RING - 1, OLD), d(0, NEW), d(M - RING, TOO_OLD),
        d(M - 1, OLD), d(M - 1, DUP), d(1, NEW), d(0, DUP)])
stream("jump_far", "jumps of several rings, of 2^31-1 (the largest forward step) and back",
       [d(7, NEW), d(7 + 5 * RING + 3, NEW), d(7, TOO_OLD), d(7 + 5 * RING + 2, OLD),
        d(7 + 5 * RING + 3 + HALF - 1, NEW), d(7 + 5 * RING + 3, TOO_OLD),
        d(7 + 5 * RING + 3 + HALF - 2, OLD), d(7 + 5 * RING + 3 + HALF - 1, DUP)])

# 13-15: the +-2^31 edge
stream("half_edge", "d = 2^31 is old (TOO_OLD), d = 2^31-1 is new",
       [d(0x10, NEW), x(0x10 + HALF, TOO_OLD), d(0x10 + HALF, TOO_OLD),
        d(0x10 + HALF - 1, NEW), d(0x10, TOO_OLD), d(0x10 + HALF, NEW), d(0x10 + HALF, DUP)])
stream("half_edge_at_max", "highest 2^32-1: 2^31-1 is exactly half away, 2^31-2 is ahead",
       [d(M - 1, NEW), d(HALF - 1, TOO_OLD), d(HALF - 2, NEW), d(M - 1, TOO_OLD),
        d(HALF - 3, OLD), d(HALF - 1, NEW)])
stream("half_edge_behind", "numbers just over 2^31 behind are ahead (d < 2^31)",
       [d(HALF + 5, NEW), d(4, NEW), d(HALF + 5, TOO_OLD), d(HALF + 4, TOO_OLD), d(HALF + 3, NEW),
        d(4, TOO_OLD)])

# 16-19: advancing must clear, exactly and across the wrap
stream("forged_ahead_not_committed", "a far-ahead number that failed its check moves nothing",
       [*run(range(0, 101), NEW), x(100 + 5000, NEW), x(100 + HALF - 1, NEW), d(50, DUP),
        d(100, DUP), d(101, NEW), d(5, DUP)])
stream("advance_clears_stale_lap", "a slot reused one ring later must not keep last lap's bits",
       [*run(range(0, 41), NEW), d(1030, NEW), d(39, DUP), d(40, DUP), d(38, TOO_OLD),
        d(1024, OLD), d(1025, OLD), d(1029, OLD), d(1024, DUP), d(1026, OLD), d(1031, NEW),
        d(1031, DUP)])
stream("advance_clears_partial", "advancing by a few blocks clears those blocks only",
       [*run(range(0, 200), NEW), d(200 + 3 * BLOCK, NEW), d(199, DUP), d(200, OLD), d(231, OLD),
        d(200 + 3 * BLOCK - 1, OLD), d(0, DUP), d(8, DUP)])
stream("advance_clears_first_passed_block", "the first block passed over loses last lap's bits",
       [*run(range(0, 1024), NEW), d(1023 + 2 * BLOCK, NEW), d(1024, OLD), d(1055, OLD),
        d(1056, OLD), d(1086, OLD), d(1023, DUP), d(1023 + 2 * BLOCK - (W - 1), DUP),
        d(1023 + 2 * BLOCK - W, TOO_OLD)])
stream("advance_across_wrap_mid_block", "block numbers stay continuous over 2^32",
       [d(M - 2, NEW), d(M - 1, NEW), d(0x40, NEW), d(M - 1, DUP), d(M - 2, DUP),
        d(M - 3, OLD), d(0, OLD), d(0x3F, OLD), d(0x40, DUP), d(0x20, OLD)])
stream("second_lap_in_order", "2048 in order; the last W are duplicates, the one before is old",
       run(range(0, 2048), NEW) + run(range(2047, 2047 - W, -1), DUP)
       + [d(2047 - W, TOO_OLD), d(0, TOO_OLD), d(1024, TOO_OLD), d(1056, DUP)])
stream("wrap_lap_in_order", "1500 in order across 2^32, then the window's tail",
       run(range(M - 700, M + 800), NEW) + run(range(M + 799 - W + 1, M + 799 - W + 40), DUP)
       + [d(M + 799 - W, TOO_OLD), d(M - 700, TOO_OLD), d(M + 800, NEW)])


def model_stream(name: str, about: str, seqs: list[int], ops: list[str]) -> None:
    """Verdicts from ``Naive`` only (marked as such in the JSON)."""
    m = Naive()
    steps: list[Step] = []
    for s, op in zip(seqs, ops, strict=True):
        v = m.verdict(s) if op == "x" else m.commit(s)
        steps.append([op, s % M, v])
    STREAMS.append((name, about + " [verdicts from the naive model]", steps))


def _model_streams() -> None:
    rng = random.Random(20261130)
    base = M - 300
    seqs: list[int] = []
    for g in range(20):
        grp = [base + 32 * g + i for i in range(32)]
        rng.shuffle(grp)
        seqs += grp
    model_stream("shuffled_groups_of_32", "groups of 32 shuffled, straddling 2^32",
                 [s % M for s in seqs], ["d"] * len(seqs))
    seqs, ops = [], []
    cur = M - 2000
    for _ in range(3000):
        r = rng.random()
        if r < 0.1:
            s = cur - rng.randrange(0, 64)
        elif r < 0.15:
            s = cur + rng.choice([W - 1, W, W + 1, RING, RING + 1, HALF - 1, HALF, HALF + 1])
        elif r < 0.25:
            s = cur - rng.choice([W - 2, W - 1, W, W + 1, HALF - 1, HALF])
        else:
            s = cur + rng.randrange(1, 4)
        op = "x" if rng.random() < 0.05 else "d"
        seqs.append(s % M)
        ops.append(op)
        if op == "d" and 1 <= (s - cur) % M < HALF:
            cur = s
    model_stream("mixed_random", "dups, reorders, edge jumps and check-only frames around 2^32",
                 seqs, ops)


def build() -> dict[str, Any]:
    _model_streams()
    out = []
    for num, (name, about, steps) in enumerate(STREAMS, start=1):
        m = Naive()
        for i, (op, seq, want) in enumerate(steps):
            got = m.verdict(seq) if op == "x" else m.commit(seq)
            if got != want:
                raise SystemExit(f"stream {num} {name} step {i}: hand says {want}, model {got}")
        out.append({"id": num, "name": name, "about": about,
                    "source": "naive-model" if "naive model" in about else "hand",
                    "steps": steps})
    return {
        "about": "Sequence streams and expected verdicts for the de-duplication window. "
                 "GENERATED once by tests/vectors/gen_window_streams.py; read by tests/test_window.py "
                 "and firmware_ref (tools/vectors_to_c.py). Ops: d = deliver (check then commit), "
                 "x = check only.",
        "seq_bits": SEQ_BITS, "ring_bits": RING, "block_bits": BLOCK, "window": W,
        "verdicts": [NEW, OLD, DUP, TOO_OLD],
        "streams": out,
    }


def render() -> str:
    data = build()
    lines = ["{"]
    head = {k: v for k, v in data.items() if k != "streams"}
    for k, v in head.items():
        lines.append(f" {json.dumps(k)}: {json.dumps(v)},")
    lines.append(' "streams": [')
    for i, s in enumerate(data["streams"]):
        meta = {k: v for k, v in s.items() if k != "steps"}
        body = json.dumps(meta)[:-1] + ', "steps": ['
        steps = ",\n   ".join(json.dumps(st) for st in s["steps"])
        lines.append("  " + body + "\n   " + steps + "]}" + ("," if i < len(data["streams"]) - 1 else ""))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path = Path(__file__).with_name("window_streams.json")
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path} ({len(STREAMS)} streams)")
