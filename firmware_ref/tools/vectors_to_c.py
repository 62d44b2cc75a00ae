"""Turn the shared JSON vectors into C headers (run by the Makefile into the build dir).

Usage: ``python3 tools/vectors_to_c.py IN.json OUT.h`` for tests/vectors/window_streams.json,
``python3 tools/vectors_to_c.py --frames IN.json OUT.h`` for tests/vectors/frames.json (the golden
frames: the first contract's, addressed, broadcast and authenticated ones), ``--bus IN.json
OUT.h`` for tests/vectors/bus_session.json (a device on a bus: frames in, exact answers out, the
counters at the end of each stream). Only the standard
library is used, so the C build needs nothing but a Python 3 interpreter.
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


FRAME_TYPES = {"HELLO": "IDL_FT_HELLO", "HELLO_REPLY": "IDL_FT_HELLO_REPLY",
               "REQUEST": "IDL_FT_REQUEST", "RESPONSE": "IDL_FT_RESPONSE"}


def _bytes(name: str, hexstr: str) -> str:
    data = bytes.fromhex(hexstr)
    body = ", ".join(f"0x{b:02X}u" for b in data) if data else "0u"
    return f"static const uint8_t {name}[] = {{{body}}};"


def render_frames(table: dict) -> str:  # type: ignore[type-arg]
    out = [
        "/* GENERATED from tests/vectors/frames.json by tools/vectors_to_c.py --frames. */",
        "#ifndef FRAME_VECTORS_H",
        "#define FRAME_VECTORS_H",
        "#include <stdint.h>",
        '#include "idemlink_proto.h"',
        "typedef struct { const char *name; uint8_t type; uint8_t flags; uint32_t epoch;"
        " uint32_t seq; int16_t address; uint8_t tag_len; const uint8_t *payload;"
        " uint16_t payload_len; const uint8_t *tag; const uint8_t *wire; uint16_t wire_len; }"
        " vec_frame_t;",
    ]
    rows = []
    for i, v in enumerate(table["frames"]):
        out.append(_bytes(f"vec_payload_{i}", v["payload"]))
        out.append(_bytes(f"vec_wire_{i}", v["wire"]))
        out.append(_bytes(f"vec_tag_{i}", v.get("tag", "")))
        address = v.get("address")
        name = str(v["name"]).replace('"', "")
        rows.append(
            f'    {{"{name}", {FRAME_TYPES[v["type"]]}, {int(v["flags"])}u, {int(v["epoch"])}u,'
            f' {int(v["seq"])}u, {-1 if address is None else int(address)},'
            f' {int(v.get("tag_len", 0))}u, vec_payload_{i}, {len(v["payload"]) // 2}u,'
            f' vec_tag_{i}, vec_wire_{i}, {len(v["wire"]) // 2}u}},')
    out.append("static const vec_frame_t vec_frames[] = {")
    out += rows
    out.append("};")
    out.append(f"#define VEC_NFRAMES {len(rows)}u")
    out.append("#endif")
    return "\n".join(out) + "\n"


BUS_COUNTERS = {
    "executed": "IDL_DISP_EXECUTED", "replayed": "IDL_DISP_REPLAYED", "hello": "IDL_DISP_HELLO",
    "other_address": "IDL_DISP_OTHER_ADDRESS", "unexpected_frames": "IDL_DISP_UNEXPECTED",
    "broadcast_executed": "IDL_DISP_BROADCAST_EXECUTED",
    "broadcast_repeated": "IDL_DISP_BROADCAST_REPEATED",
    "broadcast_refused": "IDL_DISP_BROADCAST_REFUSED", "decode_errors": "IDL_DISP_DECODE_ERRORS",
    "epoch_mismatch": "IDL_DISP_EPOCH_MISMATCH",
}


def render_bus(table: dict) -> str:  # type: ignore[type-arg]
    out = [
        "/* GENERATED from tests/vectors/bus_session.json by tools/vectors_to_c.py --bus. */",
        "#ifndef BUS_VECTORS_H",
        "#define BUS_VECTORS_H",
        "#include <stdint.h>",
        '#include "idl_session.h"',
        f"#define VEC_BUS_REPLAY_SLOTS {int(table['replay_slots'])}u",
        "typedef struct { const char *name; const uint8_t *in; uint16_t in_len;"
        " const uint8_t *out; uint16_t out_len; } vec_bus_step_t;",
        "typedef struct { unsigned counter; uint32_t value; } vec_bus_count_t;",
        "typedef struct { const char *name; uint32_t epoch; uint8_t address; const char *device_id;"
        " uint32_t first; uint32_t count; uint32_t first_count; uint32_t counts; }"
        " vec_bus_stream_t;",
    ]
    steps, counts, streams = [], [], []
    k = 0
    for s in table["streams"]:
        first, first_count = len(steps), len(counts)
        for st in s["steps"]:
            out.append(_bytes(f"vec_bus_in_{k}", st["in"]))
            out.append(_bytes(f"vec_bus_out_{k}", st["out"]))
            steps.append(f'    {{"{st["name"]}", vec_bus_in_{k}, {len(st["in"]) // 2}u,'
                         f' vec_bus_out_{k}, {len(st["out"]) // 2}u}},')
            k += 1
        for name, value in s["counters"].items():
            counts.append(f"    {{{BUS_COUNTERS[name]}, {int(value)}u}},")
        address = 0 if s["address"] is None else int(s["address"])
        streams.append(f'    {{"{s["name"]}", {int(s["epoch"])}u, {address}u, "{s["device_id"]}",'
                       f' {first}u, {len(steps) - first}u, {first_count}u,'
                       f' {len(counts) - first_count}u}},')
    out += ["static const vec_bus_step_t vec_bus_steps[] = {", *steps, "};",
            "static const vec_bus_count_t vec_bus_counts[] = {", *counts, "};",
            "static const vec_bus_stream_t vec_bus_streams[] = {", *streams, "};",
            f"#define VEC_BUS_NSTREAMS {len(streams)}u", "#endif"]
    return "\n".join(out) + "\n"


AUTH_COUNTERS = dict(BUS_COUNTERS, unauthenticated="IDL_DISP_UNAUTHENTICATED")


def render_auth(table: dict) -> str:  # type: ignore[type-arg]
    """tests/vectors/auth_session.json: the bus streams' shape, plus each stream's keys and the
    tape of its randomness; ``bad_mac`` is the decoder's counter."""
    out = [
        "/* GENERATED from tests/vectors/auth_session.json by tools/vectors_to_c.py --auth. */",
        "#ifndef AUTH_VECTORS_H",
        "#define AUTH_VECTORS_H",
        "#include <stdint.h>",
        '#include "idl_session.h"',
        f"#define VEC_AUTH_REPLAY_SLOTS {int(table['replay_slots'])}u",
        "typedef struct { const char *name; const uint8_t *in; uint16_t in_len;"
        " const uint8_t *out; uint16_t out_len; } vec_auth_step_t;",
        "typedef struct { uint8_t decoder; unsigned counter; uint32_t value; } vec_auth_count_t;",
        "typedef struct { const char *name; uint32_t epoch; const char *device_id;"
        " const uint8_t *keys; unsigned nkeys; const uint8_t *tape; uint16_t tape_len;"
        " uint32_t first; uint32_t count; uint32_t first_count; uint32_t counts; }"
        " vec_auth_stream_t;",
    ]
    steps, counts, streams = [], [], []
    k = 0
    for i, s in enumerate(table["streams"]):
        first, first_count = len(steps), len(counts)
        for st in s["steps"]:
            out.append(_bytes(f"vec_auth_in_{k}", st["in"]))
            out.append(_bytes(f"vec_auth_out_{k}", st["out"]))
            steps.append(f'    {{"{st["name"]}", vec_auth_in_{k}, {len(st["in"]) // 2}u,'
                         f' vec_auth_out_{k}, {len(st["out"]) // 2}u}},')
            k += 1
        out.append(_bytes(f"vec_auth_keys_{i}", "".join(s["keys"])))
        out.append(_bytes(f"vec_auth_tape_{i}", s["tape"]))
        for name, value in s["counters"].items():
            if name == "bad_mac":
                counts.append(f"    {{1u, IDL_DECODE_BAD_MAC, {int(value)}u}},")
            else:
                counts.append(f"    {{0u, {AUTH_COUNTERS[name]}, {int(value)}u}},")
        streams.append(f'    {{"{s["name"]}", {int(s["epoch"])}u, "{s["device_id"]}",'
                       f' vec_auth_keys_{i}, {len(s["keys"])}u, vec_auth_tape_{i},'
                       f' {len(s["tape"]) // 2}u, {first}u, {len(steps) - first}u,'
                       f' {first_count}u, {len(counts) - first_count}u}},')
    out += ["static const vec_auth_step_t vec_auth_steps[] = {", *steps, "};",
            "static const vec_auth_count_t vec_auth_counts[] = {", *counts, "};",
            "static const vec_auth_stream_t vec_auth_streams[] = {", *streams, "};",
            f"#define VEC_AUTH_NSTREAMS {len(streams)}u", "#endif"]
    return "\n".join(out) + "\n"


def main() -> int:
    mode = sys.argv[1] if sys.argv[1] in ("--frames", "--bus", "--auth") else ""
    src, dst = sys.argv[1 + bool(mode)], sys.argv[2 + bool(mode)]
    with open(src, encoding="utf-8") as f:
        table = json.load(f)
    text = {"--frames": render_frames, "--bus": render_bus, "--auth": render_auth,
            "": render}[mode](table)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
