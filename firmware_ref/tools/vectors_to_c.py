"""Turn tests/vectors/window_streams.json into a C header (run by the Makefile into the build dir).

Usage: ``python3 tools/vectors_to_c.py IN.json OUT.h``. Only the standard library is used, so the C
build needs nothing but a Python 3 interpreter.
"""

from __future__ import annotations

import json
import sys

VERDICT_C = {
    "NEW": "IDL_VERDICT_NEW",
    "ACCEPT_OLD": "IDL_VERDICT_ACCEPT_OLD",
    "DUPLICATE": "IDL_VERDICT_DUPLICATE",
    "TOO_OLD": "IDL_VERDICT_TOO_OLD",
}


def render(table: dict) -> str:  # type: ignore[type-arg]
    out = [
        "/* GENERATED from tests/vectors/window_streams.json by tools/vectors_to_c.py. */",
        "#ifndef WINDOW_VECTORS_H",
        "#define WINDOW_VECTORS_H",
        "#include <stdint.h>",
        '#include "idemlink_proto.h"',
        f"#define VEC_WINDOW {int(table['window'])}u",
        f"#define VEC_RING_BITS {int(table['ring_bits'])}u",
        "typedef struct { uint32_t seq; uint8_t deliver; uint8_t verdict; } vec_step_t;",
        "typedef struct { unsigned id; const char *name; uint32_t first; uint32_t count; }"
        " vec_stream_t;",
        "static const vec_step_t vec_steps[] = {",
    ]
    streams = []
    first = 0
    for s in table["streams"]:
        for op, seq, verdict in s["steps"]:
            if op not in ("d", "x"):
                raise SystemExit(f"unknown op {op!r} in stream {s['id']}")
            out.append(f"    {{{int(seq)}u, {1 if op == 'd' else 0}u, {VERDICT_C[verdict]}}},")
        n = len(s["steps"])
        name = str(s["name"]).replace('"', "")
        streams.append(f'    {{{int(s["id"])}u, "{name}", {first}u, {n}u}},')
        first += n
    out.append("};")
    out.append("static const vec_stream_t vec_streams[] = {")
    out += streams
    out.append("};")
    out.append(f"#define VEC_NSTREAMS {len(streams)}u")
    out.append(f"#define VEC_NSTEPS {first}u")
    out.append("#endif")
    return "\n".join(out) + "\n"


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = render(json.load(f))
    with open(dst, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
