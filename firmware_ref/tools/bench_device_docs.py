#!/usr/bin/env python3
"""Write the output of `make bench-device` into README.md as a table, never typed by hand.

    bench_device_docs.py BENCH_OUTPUT README.md

BENCH_OUTPUT holds the bench's lines (`case=read registers=9 crc_table=1 instr_per_request=...`,
then `case=rtu ...`, `case=size cpu=... text=...` and `reference=nanoMODBUS ...`); the tables
(framed requests per CRC-32C table mode; then, when the reference line is there, ours against
nanoMODBUS's in the same run) replace what stands between `<!-- bench_device:begin -->` and
`<!-- bench_device:end -->` (the markers stay). Missing markers: one line on stderr, exit 1, the
file untouched. `table(text)` is what the tests compare the README with.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by a test
from doc_markers import replace_between

BEGIN = "<!-- bench_device:begin -->"
END = "<!-- bench_device:end -->"
CASES = {"read": "executed (a new number)", "replay": "replayed (a retransmission)"}
TABLES = {"1": "nibble table (64 B, default)", "2": "byte table (1 KiB)",
          "3": "slicing by 4 (4 KiB)"}


def parse(text: str) -> list[dict[str, str]]:
    return [dict(kv.split("=", 1) for kv in line.split())
            for line in text.splitlines() if line.startswith(("case=", "reference="))]


def table(text: str) -> str:
    lines = parse(text)
    rows = [r for r in lines if "crc_table" in r]
    by = {(r["case"], r["crc_table"]): r["instr_per_request"] for r in rows}
    modes = sorted({r["crc_table"] for r in rows})
    out = ["| request (FC03 of all " + rows[0]["registers"] + " registers) | "
           + " | ".join(f"CRC-32C {TABLES.get(m, m)}" for m in modes) + " |",
           "|---|" + "---|" * len(modes)]
    for case in dict.fromkeys(r["case"] for r in rows):
        out.append(f"| {CASES.get(case, case)} | "
                   + " | ".join(by.get((case, m), "") for m in modes) + " |")
    ref = next((r for r in lines if "reference" in r), None)
    if ref is not None:
        rtu = next((r for r in lines if r.get("case") == "rtu"), None)
        size = next((r for r in lines if r.get("case") == "size"), None)
        name = ref["reference"]
        out += ["", f"| the same job (FC03 of {ref['registers']} registers) | idemlink C core | {name} |",
                "|---|---|---|",
                f"| instructions, framed (executed, {TABLES.get(modes[0], modes[0])}) | "
                f"{by.get(('read', modes[0]), '')} | {ref['instr_per_request']} |"]
        if rtu is not None:
            out.append(f"| instructions, Modbus RTU face | {rtu['instr_per_request']} | "
                       f"{ref['instr_per_request']} |")
        if size is not None:
            out.append(f"| code on {size['cpu']} (-Os), framed device without FILE_INFO and YMODEM"
                       f" | {size['text']} B | {ref['text']} B |")
    return "\n".join(out) + "\n"


def replace(doc: Path, body: str) -> None:
    replace_between(doc, BEGIN, END, body)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: bench_device_docs.py BENCH_OUTPUT README.md", file=sys.stderr)
        return 2
    replace(Path(argv[1]), table(Path(argv[0]).read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
