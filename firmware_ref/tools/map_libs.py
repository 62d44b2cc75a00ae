#!/usr/bin/env python3
"""The bytes of flash a link takes from the C library and from libgcc, from GNU ld's map file.

    map_libs.py MAP

Reads the map a link writes with ``-Wl,-Map=MAP`` and sums the sizes of the input sections that
land in flash (``.text*``, ``.rodata*``, ``.data*``: a ``.data`` is copied from flash at boot,
``.ARM.exidx*``/``.ARM.extab*``) by the archive they come from: ``libc`` is newlib (``libc.a``,
``libc_nano.a``, ``libg*.a``, ``libm.a``, ``libnosys.a``), ``libgcc`` is the compiler's runtime
(``libgcc.a``: division, switch tables, soft float). Debug and attribute sections are not
counted. Prints one line, ``libc=N libgcc=M libc_members=a,b libgcc_members=c,d`` (the archive
members pulled, without their ``lib_a-`` prefix and ``.o`` suffix). Exit 2 when the file has no
memory map (not a GNU ld map).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

FLASH_PREFIXES = (".text", ".rodata", ".data", ".ARM.exidx", ".ARM.extab")
# an input section line: name, address, size, the object it comes from (archive(member))
_LINE = re.compile(r"^ (\S+)?\s+0x[0-9a-fA-F]+\s+0x([0-9a-fA-F]+)\s+(\S+)$")
_ARCHIVE = re.compile(r"(?:^|/)(lib[^/()]*)\.a\(([^)]*)\)$")


def library(archive: str) -> str | None:
    """``libc`` or ``libgcc`` for an archive's name, None for anything else."""
    if archive == "libgcc":
        return "libgcc"
    if re.fullmatch(r"libc(_nano)?|libg(_nano)?|libm(_nano)?|libnosys", archive):
        return "libc"
    return None


def sizes(text: str) -> dict[str, dict[str, int]]:
    """Bytes per library per archive member, from a map's text."""
    marker = "Linker script and memory map"
    if marker not in text:
        raise ValueError("no 'Linker script and memory map' section: not a GNU ld map")
    out: dict[str, dict[str, int]] = {"libc": {}, "libgcc": {}}
    pending = None  # a section name alone on its line: its address and size come on the next
    for line in text.split(marker, 1)[1].splitlines():
        m = _LINE.match(line)
        if m is None:
            name = line.strip()
            pending = name if line.startswith(" .") and " " not in name else None
            continue
        name = m.group(1) or pending
        pending = None
        a = _ARCHIVE.search(m.group(3))
        if name is None or a is None or not name.startswith(FLASH_PREFIXES):
            continue
        lib = library(a.group(1))
        if lib is None:
            continue
        member = re.sub(r"^lib_a-|\.o$", "", a.group(2))
        out[lib][member] = out[lib].get(member, 0) + int(m.group(2), 16)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: map_libs.py MAP", file=sys.stderr)
        return 2
    try:
        found = sizes(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        print(f"map_libs.py: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    words = [f"{lib}={sum(found[lib].values())}" for lib in ("libc", "libgcc")]
    words += [f"{lib}_members={','.join(sorted(m for m, n in found[lib].items() if n)) or '-'}"
              for lib in ("libc", "libgcc")]
    print(" ".join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
