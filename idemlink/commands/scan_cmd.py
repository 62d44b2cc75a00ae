"""``idemlink scan --modbus-rtu --port PORT [--units 1-247] [--bauds 9600,19200] [--parity E]``:
who answers on a Modbus RTU line.

Contract: each baud rate of ``--bauds`` (default: the connection's ``--baudrate``) is scanned in
turn, the port opened anew for each, with the line's character format (8E1 unless given: scan
speaks Modbus RTU only, ``--modbus-rtu`` is implied); each unit of ``--units`` (``1-247`` by
default; ``1-10,20,30-40``) gets one cheap read (``idemlink.protocol.rtu_scan.BusScan``: the
map's first register with ``--regmap``, else holding register 0; any answer, an exception too,
means a slave is there) and a fixed listening window (``--turnaround`` + transmission + t3.5);
a unit that answers is asked for its FC43/14 identification (``--no-identify`` skips it), and
with ``--id-register NAME`` that register of the map is read when it offers none. Two slaves
answering one unit (two answers, CRC-bad bytes, twice) are reported as a conflict. Each baud's
line says how long the scan took and its bound (``scan_bound``; docs/CLI.md states it).

Text: one line per unit that answered, then one summary line per baud rate. ``--json``: one
``idemlink.scan/1`` object. Exit 0 when any unit answered (a conflict too), 1 when none did.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from idemlink.cli import (
    EXIT_LOCAL_ERROR,
    EXIT_OK,
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_regmap_option,
    baud_rate,
)
from idemlink.commands.connection import add_connection_options
from idemlink.output import add_json_option, emit
from idemlink.protocol.registers import RegisterSpec

SCHEMA = "idemlink.scan/1"
SCAN_KEYS = ("port", "baudrate", "bytesize", "parity", "stopbits", "modbus_rtu", "regmap")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "scan", help="list the Modbus RTU slaves that answer on a line (and their identity)")
    p.add_argument("--port", help="device path or pyserial URL (see `idemlink ports`)")
    p.add_argument("--modbus-rtu", action="store_true", default=True,
                   help="the line speaks Modbus RTU (implied: scan speaks nothing else)")
    p.add_argument("--framed", action="store_true",
                   help="the line is a bus of framed idemlink devices (8N1): an addressed HELLO "
                        "to each address of --units; who answers with which identity, and two "
                        "devices sharing an address (docs/BUS.md, 'Finding what is on a bus')")
    p.add_argument("--units", default="1-247", metavar="LIST",
                   help="unit ids to probe: 1-247 (default), or e.g. 1-10,20,30-40")
    add_baudrate_option(p, default=None, text="baud rate (default 115200); see --bauds")
    p.add_argument("--bauds", default=None, metavar="LIST",
                   help="baud rates to scan one after the other, e.g. 9600,19200 (default: "
                        "--baudrate)")
    add_char_format_options(p, modbus=True)
    p.add_argument("--turnaround", type=float, default=0.05, metavar="S",
                   help="seconds a slave gets to start answering (default 0.05); sets the "
                        "scan's time (docs/CLI.md)")
    p.add_argument("--no-identify", action="store_true",
                   help="do not ask the units that answer for FC43/14 identification")
    add_regmap_option(p)
    p.add_argument("--id-register", metavar="NAME", default=None,
                   help="with --regmap: the register read as the identity of a unit that "
                        "offers no FC43 identification")
    add_json_option(p, SCHEMA)
    add_connection_options(p, SCAN_KEYS)
    p.set_defaults(handler=run)


def parse_units(text: str) -> list[int]:
    """``1-247``, ``1,2,5-9``: unit ids in 1..247, each once, in order; ``UserError`` else."""
    units: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise UserError(f"--units: {part!r} is not N or N-M") from None
        if not 1 <= first <= last <= 247:
            raise UserError(f"--units: {part!r} is not within 1..247 (low to high)")
        units.extend(u for u in range(first, last + 1) if u not in units)
    return units


def parse_bauds(text: str) -> list[int]:
    try:
        return [baud_rate(b.strip()) for b in text.split(",")]
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise UserError(f"--bauds: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from idemlink.cli import regmap_from
    from idemlink.host.errors import PortError
    from idemlink.host.rtu_scan import scan_line
    from idemlink.protocol.char_format import CharFormat

    if not args.port:
        raise UserError("--port is required (a device path or pyserial URL; see `idemlink ports`)")
    units = parse_units(args.units)
    if args.framed:
        return _run_framed(args, units)
    bauds = parse_bauds(args.bauds) if args.bauds else [args.baudrate]
    if not (0 < args.turnaround <= 10 and math.isfinite(args.turnaround)):
        raise UserError("--turnaround: expected seconds, > 0 and <= 10")
    regmap = regmap_from(args) if args.regmap is not None else None
    id_spec: RegisterSpec | None = None
    if args.id_register is not None:
        if regmap is None:
            raise UserError("--id-register names a register of a map: it needs --regmap")
        from idemlink.commands.selection import resolve

        id_spec = resolve(regmap, args.id_register)
    fmt = CharFormat(args.bytesize, args.parity, args.stopbits)
    scans = []
    for baud in bauds:
        try:
            scans.append(scan_line(args.port, baudrate=baud, char_format=fmt, units=units,
                                   turnaround=args.turnaround, regmap=regmap,
                                   id_register=args.id_register,
                                   identify=not args.no_identify))
        except PortError as exc:
            raise UserError(str(exc)) from None
    lines: list[str] = []
    docs = []
    for s in scans:
        line = f"{s.baudrate} {s.char_format}"
        for r in s.reports:
            ident = ", ".join(f"{k}={v}" for k, v in r.identity.items())
            id_shown = _id_shown(id_spec, r.id_words)
            extra = [x for x in (r.answer, ident,
                                 f"id register {id_shown}" if id_shown is not None else "",
                                 r.detail) if x]
            lines.append(f"unit {r.unit:3d} @ {line}: {r.state.upper()}"
                         + (f" ({'; '.join(extra)})" if extra else ""))
        found = sum(r.state == "present" for r in s.reports)
        conflicts = sum(r.state == "conflict" for r in s.reports)
        lines.append(f"scanned {s.units} unit(s) at {line} in {s.seconds:.1f} s (bound "
                     f"{s.bound:.1f} s): {found} answered, {conflicts} conflict(s)")
        docs.append({"baudrate": s.baudrate, "format": str(s.char_format), "units": s.units,
                     "seconds": round(s.seconds, 3), "bound": round(s.bound, 3),
                     "found": [{"unit": r.unit, "state": r.state, "answer": r.answer,
                                "identity": r.identity, "id_value": r.id_value,
                                "id_words": list(r.id_words),
                                "id_shown": _id_shown(id_spec, r.id_words),
                                "detail": r.detail} for r in s.reports]})
    answered = any(s.answered for s in scans)
    emit(args, SCHEMA, {"port": args.port, "answered": answered, "scans": docs}, lines)
    return EXIT_OK if answered else EXIT_LOCAL_ERROR


def _id_shown(spec: RegisterSpec | None, words: tuple[int, ...]) -> str | None:
    """The id register's value as ``read`` shows it (a string's whole text, a u32's number),
    from every word its read got; None when it got none."""
    if spec is None or not words:
        return None
    if len(words) != spec.words:
        return " ".join(f"0x{w:04X}" for w in words)
    return spec.show(spec.raw_from_words(words))


def _run_framed(args: argparse.Namespace, units: list[int]) -> int:
    """``scan --framed``: ``idemlink.host.bus_scan`` on the port, one line per address that
    answered and a summary line with the time taken and its bound."""
    from idemlink.host.bus_scan import scan_bus_url
    from idemlink.host.errors import PortError

    if args.bauds or args.id_register is not None or args.no_identify:
        raise UserError("--bauds, --id-register and --no-identify are the Modbus RTU scan's; a "
                        "framed scan asks each address for its HELLO_REPLY at --baudrate")
    if not (0 < args.turnaround <= 10 and math.isfinite(args.turnaround)):
        raise UserError("--turnaround: expected seconds, > 0 and <= 10")
    try:
        s = scan_bus_url(args.port, units, baudrate=args.baudrate, turnaround=args.turnaround)
    except PortError as exc:
        raise UserError(str(exc)) from None
    lines = []
    for r in s.reports:
        ident = ", ".join(f"{k}={v}" for k, v in r.identity.items())
        extra = "; ".join(x for x in (ident, r.detail) if x)
        lines.append(f"address {r.address:3d}: {r.state.upper()}" + (f" ({extra})" if extra
                                                                      else ""))
    found = sum(r.state == "present" for r in s.reports)
    conflicts = sum(r.state == "conflict" for r in s.reports)
    lines.append(f"scanned {s.addresses} address(es) at {args.baudrate} (framed) in "
                 f"{s.seconds:.1f} s (bound {s.bound:.1f} s): {found} answered, {conflicts} "
                 "conflict(s)")
    doc = {"port": args.port, "answered": s.answered, "framed": True,
           "scans": [{"baudrate": args.baudrate, "format": "8N1", "units": s.addresses,
                      "seconds": round(s.seconds, 3), "bound": round(s.bound, 3),
                      "found": [{"unit": r.address, "state": r.state, "answer": "",
                                 "identity": r.identity, "id_value": None, "id_words": [],
                                 "id_shown": None, "detail": r.detail}
                                for r in s.reports]}]}
    emit(args, SCHEMA, doc, lines)
    return EXIT_OK if s.answered else EXIT_LOCAL_ERROR


__all__ = ["parse_bauds", "parse_units", "register", "run"]
