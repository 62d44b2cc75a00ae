#!/usr/bin/env python3
"""Cycles of Cortex-M0+ code from a QEMU instruction trace (make bench-auth).

QEMU runs the ARMv6-M program one instruction per translation block (``-singlestep -d
exec,nochain``): its log names every instruction executed, in order. This script takes the
program's disassembly (``arm-none-eabi-objdump -d``), cuts the trace into the windows between an
execution of ``idl_mark_begin`` and the next of ``idl_mark_end`` (the markers' own instructions
and the call to the end marker excluded), and prices each instruction executed there with the
Cortex-M0+ timings (ARM Cortex-M0+ Technical Reference Manual, "Instruction set summary"; zero
wait-state memory, the single-cycle multiplier):

=====================================================  ======================================
data processing (MOVS, ADDS, EORS, RORS, CMP, MULS...)  1
LDR*, STR* (one register)                               2
LDM, STM, PUSH, POP (N registers)                       1 + N
POP including PC                                        3 + N
B<cond>                                                 2 taken, 1 not taken
B, BX, BLX                                              2
BL                                                      3
=====================================================  ======================================

Branch outcome is read from the trace (the next instruction's address). Usage:
``cycle_model.py DISASSEMBLY TRACE NAME [NAME...]``: one line per window, ``case=NAME
instructions=N cycles=C us_at_48MHz=X``.
"""

from __future__ import annotations

import re
import sys

_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(?:[0-9a-f]{4}\s?)+\s+(\S+)\s*(.*)$")
_FUNC = re.compile(r"^([0-9a-f]+) <([^>]+)>:$")
_TRACE = re.compile(r"\[[0-9a-f]+/([0-9a-f]+)/")


def disassembly(path: str) -> tuple[dict[int, tuple[str, str]], dict[str, int]]:
    insns: dict[int, tuple[str, str]] = {}
    funcs: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = _FUNC.match(line.strip())
            if m:
                funcs[m.group(2)] = int(m.group(1), 16)
                continue
            m = _INSN.match(line)
            if m and not m.group(2).startswith("."):
                insns[int(m.group(1), 16)] = (m.group(2), m.group(3))
    return insns, funcs


def _regs(ops: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", ops)
    if not m:
        return []
    out: list[str] = []
    for part in m.group(1).split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-")
            out += [f"r{i}" for i in range(int(a[1:]), int(b[1:]) + 1)]
        elif part:
            out.append(part)
    return out


def cycles(mnemonic: str, ops: str, taken: bool) -> int:
    m = mnemonic.split(".")[0]
    if m in ("push", "pop", "ldmia", "stmia", "ldm", "stm"):
        regs = _regs(ops)
        return 1 + len(regs) + (2 if m == "pop" and "pc" in regs else 0)
    if m.startswith(("ldr", "str")):
        return 2
    if m == "bl":
        return 3
    if m in ("bx", "blx", "b"):
        return 2
    if m.startswith("b") and len(m) == 3:  # b<cond>
        return 2 if taken else 1
    return 1


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print("usage: cycle_model.py DISASSEMBLY TRACE NAME [NAME...]", file=sys.stderr)
        return 2
    insns, funcs = disassembly(argv[1])
    begin, end = funcs["idl_mark_begin"], funcs["idl_mark_end"]
    pcs: list[int] = []
    with open(argv[2], encoding="utf-8") as f:
        for line in f:
            m = _TRACE.search(line)
            if m:
                pcs.append(int(m.group(1), 16))
    names = argv[3:]
    windows: list[tuple[int, int]] = []
    inside = False
    for i, pc in enumerate(pcs):
        if pc == begin and not inside:
            inside, start = True, i
        elif pc == end and inside:
            windows.append((start, i))
            inside = False
    if len(windows) != len(names):
        print(f"{len(windows)} marked windows in the trace, {len(names)} names", file=sys.stderr)
        return 1
    for name, (start, stop) in zip(names, windows):
        # skip the begin marker (up to its return), stop before the bl to the end marker
        i = start
        while i < stop and insns.get(pcs[i], ("", ""))[0] not in ("bx",) \
                and not insns.get(pcs[i], ("", ""))[1].startswith("{") :
            i += 1
        i += 1  # the marker's return
        n = cyc = 0
        for j in range(i, stop - 1):  # stop - 1: the bl that calls the end marker
            pc = pcs[j]
            mnem, ops = insns.get(pc, ("?", ""))
            taken = pcs[j + 1] != pc + 2 and pcs[j + 1] != pc + 4
            n += 1
            cyc += cycles(mnem, ops, taken)
        print(f"case={name} instructions={n} cycles={cyc} us_at_48MHz={cyc / 48:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
