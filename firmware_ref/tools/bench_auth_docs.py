#!/usr/bin/env python3
"""Write the output of `make bench-auth` into README.md as a table, never typed by hand.

    bench_auth_docs.py BENCH_OUTPUT README.md

BENCH_OUTPUT holds the bench's lines (`cpu=... module=M text=A text_auth=B delta=D`, one
`module=total` line per CPU with the RAM, then `case=tag|sign|derive instructions=N cycles=C`);
the tables replace what stands between `<!-- bench_auth:begin -->` and `<!-- bench_auth:end -->`
(the markers stay). Missing markers: one line on stderr, exit 1, the file untouched.
`table(text)` is what the tests compare the README with.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by a test
from doc_markers import replace_between

BEGIN = "<!-- bench_auth:begin -->"
END = "<!-- bench_auth:end -->"
CPUS = {"cortex-m0plus": "Cortex-M0+", "cortex-m4": "Cortex-M4"}
CASES = {"tag": "a short frame's tag (6-byte request: direction, header, payload; 2 compressions)",
         "sign": "the same frame encoded and signed (tag, CRC-32C, COBS)",
         "hello": "a keyed HELLO through the session: decoded, key id (2 compressions), device "
                  "nonce, session key (3), its HELLO_REPLY built and signed"}


def parse(text: str) -> list[dict[str, str]]:
    return [dict(kv.split("=", 1) for kv in line.split())
            for line in text.splitlines() if line.startswith("cpu=")]


def table(text: str) -> str:
    rows = parse(text)
    sized = [r for r in rows if "module" in r]
    cpus = list(dict.fromkeys(r["cpu"] for r in sized))
    modules = list(dict.fromkeys(r["module"] for r in sized))
    by = {(r["cpu"], r["module"]): r for r in sized}
    out = ["| module (-Os, bytes of code and constants) | "
           + " | ".join(f"{CPUS.get(c, c)}: without / with IDL_AUTH" for c in cpus) + " |",
           "|---|" + "---|" * len(cpus)]
    for m in modules:
        cells = [f"{by[(c, m)]['text']} / {by[(c, m)]['text_auth']} (+{by[(c, m)]['delta']})"
                 for c in cpus]
        out.append(f"| {'**total**' if m == 'total' else m} | " + " | ".join(cells) + " |")
    totals = [by[(c, "total")] for c in cpus]
    out.append("| RAM of one device (sizeof idl_device_t) | "
               + " | ".join(f"{t['ram']} / {t['ram_auth']} (+{t['ram_delta']})" for t in totals)
               + " |")
    m0 = by.get(("cortex-m0plus", "total"))
    if m0 is not None:
        over = int(m0["delta"]) - int(m0["budget_text"])
        out += ["", f"Budget (issue 23, Cortex-M0+): code +{m0['delta']} B against "
                f"{m0['budget_text']} B ("
                + (f"**{over} B over**" if over > 0 else f"{-over} B to spare")
                + f"); RAM +{m0['ram_delta']} B against {m0['budget_ram']} B."]
    cases = [r for r in rows if "case" in r]
    if cases:
        out += ["", "| Cortex-M0+ (-Os), traced under QEMU, priced by tools/cycle_model.py | "
                "instructions | cycles | µs at 48 MHz |", "|---|---|---|---|"]
        for r in cases:
            budget = f" (budget {r['budget_cycles']} cycles)" if "budget_cycles" in r else ""
            out.append(f"| {CASES.get(r['case'], r['case'])}{budget} | {r['instructions']} | "
                       f"{r['cycles']} | {r['us_at_48MHz']} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: bench_auth_docs.py BENCH_OUTPUT README.md", file=sys.stderr)
        return 2
    replace_between(Path(argv[1]), BEGIN, END, table(Path(argv[0]).read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
