"""Benchmark of protocol.window in CPython: microseconds per number, median of several runs.

Four streams as in firmware_ref/bench (in order; shuffled within groups of 32; 10% repeats of one
of the last 32; 1% forward jumps of W + rand(W)), starting just below 2^32 so the wrap is mid-run.
For each stream: ``check`` then ``commit`` per number (the device pipeline), and ``check`` alone
over the same stream on the final state. The peer, run in the same process, is the same algorithm
with the ring held in one big Python int instead of a list of 32-bit blocks (the alternative the
design weighed); the ratio is peer / ours.

Usage: python3 bench/bench_window.py [--n 65536] [--runs 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from idemlink.protocol.window import HALF, SEQ_MASK, WINDOW_SIZE, ReplayWindow

RING = 1024


class BigIntWindow:
    """Peer: the same rules, the ring as one 1024-bit int (bit = seq mod ring)."""

    __slots__ = ("bits", "empty", "highest")

    def __init__(self) -> None:
        self.bits = 0
        self.highest = 0
        self.empty = True

    def check(self, seq: int) -> int:
        back = (self.highest - seq) & SEQ_MASK
        if back > HALF or self.empty:
            return 0
        if back >= WINDOW_SIZE:
            return 3
        return 2 if self.bits >> (seq & (RING - 1)) & 1 else 1

    def commit(self, seq: int) -> int:
        back = (self.highest - seq) & SEQ_MASK
        if back > HALF or self.empty:
            h = self.highest
            n = ((h & 31) - back) & SEQ_MASK
            blocks = n >> 5
            if self.empty or blocks >= RING // 32:
                self.bits = 0
            elif blocks:
                for b in range((h >> 5) + 1, (h >> 5) + blocks + 1):
                    self.bits &= ~(0xFFFFFFFF << ((b & 31) << 5))
            self.bits |= 1 << (seq & (RING - 1))
            self.highest = seq
            self.empty = False
            return 0
        if back >= WINDOW_SIZE:
            return 3
        bit = 1 << (seq & (RING - 1))
        if self.bits & bit:
            return 2
        self.bits |= bit
        return 1


def streams(n: int) -> dict[str, list[int]]:
    rng = random.Random(1)
    start = (1 << 32) - n // 2
    inorder = [(start + i) & SEQ_MASK for i in range(n)]
    shuffled: list[int] = []
    for g in range(0, n, 32):
        grp = inorder[g:g + 32]
        rng.shuffle(grp)
        shuffled += grp
    dup, cur = [], start
    for i in range(n):
        if i > 32 and rng.random() < 0.1:
            dup.append((cur - rng.randrange(32)) & SEQ_MASK)
        else:
            cur += 1
            dup.append(cur & SEQ_MASK)
    jumps, cur = [], start
    for _ in range(n):
        cur += WINDOW_SIZE + rng.randrange(WINDOW_SIZE) if rng.random() < 0.01 else 1
        jumps.append(cur & SEQ_MASK)
    return {"inorder": inorder, "shuffled": shuffled, "dup10": dup, "jumps1": jumps}


def time_pipeline(factory: Callable[[], object], seqs: list[int], runs: int) -> tuple[float, float]:
    """(median µs per check+commit, median µs per check alone on the final state)."""
    both, alone = [], []
    for _ in range(runs):
        w = factory()
        check = w.check  # type: ignore[attr-defined]
        commit = w.commit  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        for s in seqs:
            check(s)
            commit(s)
        t1 = time.perf_counter()
        for s in seqs:
            check(s)
        t2 = time.perf_counter()
        both.append((t1 - t0) / len(seqs) * 1e6)
        alone.append((t2 - t1) / len(seqs) * 1e6)
    return statistics.median(both), statistics.median(alone)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 16)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print(f"window={WINDOW_SIZE} n={args.n} runs={args.runs} (median µs per number)")
    print(f"{'pattern':10} {'check':>8} {'check+commit':>13} {'peer check':>11} "
          f"{'peer c+c':>9} {'ratio c+c':>10}")
    for name, seqs in streams(args.n).items():
        ours = time_pipeline(ReplayWindow, seqs, args.runs)
        peer = time_pipeline(BigIntWindow, seqs, args.runs)
        print(f"{name:10} {ours[1]:8.3f} {ours[0]:13.3f} {peer[1]:11.3f} {peer[0]:9.3f} "
              f"{peer[0] / ours[0]:9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
