#!/usr/bin/env python3
"""The worst-case stack depth of a firmware image, from gcc's own per-function figures.

    stack_depth.py [--entry NAME]... [--isr NAME]... [--indirect CALLER=TARGET]...
                   [--unknown BYTES] CI...

Reads the ``.ci`` call graphs gcc writes with ``-fstack-usage -fcallgraph-info=su`` (one per
translation unit; every node carries the function's frame in bytes and whether it is static) and
prints, as ``key=value`` words on one line:

- ``stack_main``: the deepest path from an entry (``--entry``, default ``Reset_Handler``);
- ``stack_isr``: the deepest interrupt handler (``--isr``), plus the 32 bytes a Cortex-M pushes
  on exception entry (8 words; no FPU on M0/M0+), added once: the handlers here share one
  priority, so they do not nest;
- ``stack_total``: their sum, the most the stack can hold;
- ``path``: the functions of the deepest main path.

Indirect calls (gcc's ``__indirect_call`` node) are resolved by ``--indirect CALLER=TARGET``: the
callbacks a function calls through a pointer (the session's execute hook, the registers' persist
and conditions hooks, FILE_INFO's lookup); the deepest of a caller's targets is assumed at each of
its indirect calls, and an indirect call with no target given is an error. A function without a
figure (newlib's
``memcpy``, libgcc's division) counts ``--unknown`` bytes (default 32, an allowance for the leaf
routines newlib and libgcc link, not a measurement); their names are listed as ``unknown=``. A
dynamic or bounded frame, or a cycle in the graph (recursion), is an error: the figure would not
be a bound. Exit 1 on those, 2 on usage.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

NODE = re.compile(r'node: \{ title: "([^"]+)" label: "([^"]*)"')
EDGE = re.compile(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"')
FRAME = re.compile(r"\\n(\d+) bytes \((static|dynamic|dynamic,bounded)\)")
EXCEPTION_FRAME = 32


def short(title: str) -> str:
    """A node's function name: static functions are titled ``file:name``."""
    return title.rsplit(":", 1)[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ci", nargs="+", type=Path)
    p.add_argument("--entry", action="append", default=None)
    p.add_argument("--isr", action="append", default=[])
    p.add_argument("--indirect", action="append", default=[])
    p.add_argument("--unknown", type=int, default=32)
    args = p.parse_args()
    frames: dict[str, int] = {}
    edges: dict[str, set[str]] = {}
    problems: list[str] = []
    for ci in args.ci:
        text = ci.read_text(encoding="utf-8")
        for title, label in NODE.findall(text):
            m = FRAME.search(label)
            if m is None:
                continue  # a callee declared here, defined elsewhere (or not compiled by us)
            if m.group(2) != "static":
                problems.append(f"{title}: {m.group(2)} frame")
            frames[short(title)] = int(m.group(1))
        for src, dst in EDGE.findall(text):
            edges.setdefault(short(src), set()).add(short(dst))
    indirect: dict[str, list[str]] = {}
    for pair in args.indirect:
        caller, _, target = pair.partition("=")
        indirect.setdefault(short(caller), []).append(short(target))
    unknown: set[str] = set()
    memo: dict[str, tuple[int, list[str]]] = {}
    active: set[str] = set()

    def depth(fn: str) -> tuple[int, list[str]]:
        if fn in memo:
            return memo[fn]
        if fn in active:
            problems.append(f"recursion through {fn}")
            return 0, [fn]
        if fn not in frames:
            unknown.add(fn)
            return args.unknown, [fn]
        active.add(fn)
        best: tuple[int, list[str]] = (0, [])
        for callee in sorted(edges.get(fn, ())):
            targets = [callee]
            if callee == "__indirect_call":
                targets = indirect.get(fn, [])
                if not targets:
                    problems.append(f"{fn}: an indirect call without a --indirect target")
            for t in targets:
                d = depth(t)
                if d[0] > best[0]:
                    best = d
        active.discard(fn)
        memo[fn] = (frames[fn] + best[0], [fn, *best[1]])
        return memo[fn]

    entries = args.entry or ["Reset_Handler"]
    main_depth, path = max((depth(e) for e in entries), key=lambda d: d[0])
    isr = max((depth(i)[0] for i in args.isr), default=0)
    isr_total = isr + EXCEPTION_FRAME if args.isr else 0
    unknown.discard("__indirect_call")
    print(f"stack_main={main_depth} stack_isr={isr_total} stack_total={main_depth + isr_total} "
          f"unknown={','.join(sorted(unknown)) or '-'} path={'>'.join(path)}")
    for problem in problems:
        print(f"stack_depth: {problem}: no bound", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
