"""What the device commands share: their options, the exit status of each outcome, and how a
register's value is parsed and shown.

Contract:

- ``device_options()``: the options every device command takes (``--port`` once or several times,
  ``--ports-file``, ``--baudrate``, ``--bytesize``, ``--parity``, ``--stopbits``, ``--timeout``,
  ``--attempts``, ``--trace``, ``--regmap``, ``--profile``), as an argparse parent;
  ``add_rtu_options`` adds ``--modbus-rtu [--unit N]`` and ``--modbus-tcp HOST[:PORT]``
  (``rtu_unit`` and ``tcp_address`` check them: one or the other). Settings left
  off the command line come from the environment, a profile, the map's ``[link]`` or the
  defaults (``idemlink.commands.connection``). ``line_settings(args)`` is what opens the port:
  baud rate and character format. Each command adds its own ``--json``, naming its schema.
- ``EXIT_OF_OUTCOME``: OK 0, NOT_EXECUTED 3, REJECTED 4, UNKNOWN 5 (``idemlink.cli`` lists every
  exit status); ``worst`` ranks several outcomes (UNKNOWN > REJECTED > NOT_EXECUTED > OK).
- Values: ``parse_value`` reads a value as typed for a register (``RegisterSpec.raw_from_text``),
  ``shown`` prints one as the map reads it (``42.0 °C (raw 420)``); ``check_seconds`` bounds
  durations; every mistake is a ``UserError`` (one line, exit 1, nothing sent).
- Output pieces every command's JSON uses: ``result_json`` (one request's outcome),
  ``reading_entry`` (a register read), ``not_sent``, ``schema_of``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Sequence
from typing import Any

from idemlink.cli import (
    EXIT_NOT_EXECUTED,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_UNKNOWN,
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_regmap_option,
)
from idemlink.commands.connection import DEVICE_KEYS, add_connection_options
from idemlink.commands.many import add_port_options
from idemlink.commands.selection import resolve
from idemlink.host.command import Result, raw_in
from idemlink.output import register_entry
from idemlink.protocol.datatypes import DataType
from idemlink.protocol.link_profile import MAX_TIMEOUT as LINK_MAX_TIMEOUT
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import RegisterKind, RegisterMap, RegisterSpec

EXIT_OF_OUTCOME: dict[Outcome, int] = {
    Outcome.OK: EXIT_OK,
    Outcome.NOT_EXECUTED: EXIT_NOT_EXECUTED,
    Outcome.REJECTED: EXIT_REJECTED,
    Outcome.UNKNOWN: EXIT_UNKNOWN,
}

#: Worst first: the exit status of several commands is that of the worst outcome.
SEVERITY: tuple[Outcome, ...] = (Outcome.UNKNOWN, Outcome.REJECTED, Outcome.NOT_EXECUTED,
                                 Outcome.OK)

def worst(outcomes: Iterable[Outcome]) -> Outcome:
    seen = set(outcomes)
    for o in SEVERITY:
        if o in seen:
            return o
    return Outcome.OK


def device_options() -> argparse.ArgumentParser:
    """The options every device command takes (``--port``, ``--timeout``...), as an argparse
    parent (each command adds its own ``--json``, naming its schema)."""
    common = argparse.ArgumentParser(add_help=False)
    add_port_options(common)
    add_baudrate_option(common, default=None)
    add_char_format_options(common, modbus=True)
    add_answer_options(common)
    add_key_option(common)
    common.add_argument("--trace", metavar="FILE", default=None,
                        help="append every frame sent and received, decoded, as JSON lines")
    add_regmap_option(common)
    add_address_option(common)
    add_half_duplex_options(common)
    add_connection_options(common, DEVICE_KEYS)
    return common


def add_half_duplex_options(p: argparse.ArgumentParser) -> None:
    """``--echo`` and ``--guard S``: a half-duplex line's chores on the master's side
    (``idemlink.host.half_duplex``), for idemlink devices and ``--modbus-rtu`` alike."""
    p.add_argument("--echo", action="store_true", default=False,
                   help="the RS-485 adapter echoes what this host sends: recognise and skip "
                        "it (a wrong echo stops the command with a clear error)")
    p.add_argument("--guard", type=float, default=0.0, metavar="S",
                   help="turnaround guard: wait S seconds (0..1) after the last byte heard "
                        "before sending (default 0)")


def half_duplex(args: argparse.Namespace) -> dict[str, Any]:
    """``echo`` and ``guard`` for ``Device.open``, ``RtuDevice.open`` and ``Bus.open``
    (``UserError`` for a guard outside 0..1 s)."""
    guard = float(getattr(args, "guard", 0.0) or 0.0)
    if not 0.0 <= guard <= 1.0:  # nan fails too
        raise UserError(f"--guard {guard}: a turnaround guard is 0..1 s")
    return {"echo": bool(getattr(args, "echo", False)), "guard": guard}


def add_address_option(p: argparse.ArgumentParser, several: bool = True) -> None:
    """``--address N`` (or, for a device command, ``--address 1,2,5-8``): the idemlink
    device(s) of that bus address (docs/BUS.md)."""
    p.add_argument("--address", default=None, metavar="N,M-K" if several else "N",
                   help="the idemlink device at bus address N (1..247) on a shared line: frames "
                        "go addressed to it (default: the device on this line)"
                   + ("; a list (1,2,5-8) runs the command on each, one at a time on the line"
                      if several else ""))


def bus_addresses(args: argparse.Namespace) -> list[int] | None:
    """``--address`` parsed and checked (None without it): ``N`` or a list ``1,2,5-8`` of
    distinct addresses in 1..247; ``UserError`` otherwise or with ``--modbus-rtu`` /
    ``--modbus-tcp`` (their unit is ``--unit``)."""
    text: str | None = getattr(args, "address", None)
    if text is None:
        return None
    if getattr(args, "modbus_rtu", None) or getattr(args, "modbus_tcp", None):
        raise UserError("--address is an idemlink device's bus address; a Modbus slave's is "
                        "--unit N")
    return address_list(text, "--address", "0 is the broadcast address, which no device "
                        "answers")


def address_list(text: object, option: str, zero: str) -> list[int]:
    """``N`` or a list ``1,2,5-8`` of distinct addresses in 1..247 (``UserError`` otherwise;
    ``zero`` says why 0 is not one)."""
    from idemlink.protocol.frame import MAX_ADDRESS, MIN_ADDRESS

    out: list[int] = []
    for part in str(text).split(","):
        first, dash, last = part.strip().partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise UserError(f"{option} {text}: not an address or a list like 1,2,5-8") from None
        for a in (lo, hi):
            if not MIN_ADDRESS <= a <= MAX_ADDRESS:
                raise UserError(f"{option} must be {MIN_ADDRESS}..{MAX_ADDRESS} ({zero}), "
                                f"not {a}")
        if hi < lo:
            raise UserError(f"{option} {part.strip()}: a range goes up")
        for a in range(lo, hi + 1):
            if a in out:
                raise UserError(f"{option} {text}: {a} is named twice")
            out.append(a)
    return out


def bus_address(args: argparse.Namespace) -> int | None:
    """The one ``--address`` of a command on one device (None without it); ``UserError`` for a
    list here."""
    from idemlink.cli import UserError

    addresses = bus_addresses(args)
    if addresses is None:
        return None
    if len(addresses) > 1:
        raise UserError(f"--address {args.address}: this command takes one address")
    return addresses[0]


def add_answer_options(p: argparse.ArgumentParser, attempts: str = "sends per command before "
                       "it is UNKNOWN (default 5)") -> None:
    """``--timeout S`` and ``--attempts N``, left None for ``idemlink.commands.connection``."""
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for each answer before a retry (default 0.2)")
    p.add_argument("--attempts", type=int, default=None, help=attempts)


def add_key_option(p: argparse.ArgumentParser) -> None:
    """``--key-file F``: authenticate every frame with the key in F (docs/SECURITY.md)."""
    p.add_argument("--key-file", metavar="F", default=None,
                   help="authenticate with the key in F (0600, 64 hex digits; default: "
                        "$IDEMLINK_KEY_FILE, else $IDEMLINK_KEY): a keyed host refuses a device "
                        "that does not sign its frames with it (docs/SECURITY.md)")


def host_key(args: argparse.Namespace) -> tuple[bytes, ...] | None:
    """The host's keys: ``--key-file``, else the environment; None: an unkeyed host. The first
    key is used first; a file may list the other key of a rotation after it (docs/SECURITY.md).
    A refused file or variable is one ``UserError`` line (never showing the key)."""
    from idemlink.protocol.key_file import KeyFileError, keys_from_environment, read_key_file

    path = getattr(args, "key_file", None)
    try:
        return read_key_file(path) if path else keys_from_environment()
    except KeyFileError as exc:
        raise UserError(f"{exc}; nothing was sent") from None


MODBUS_KEY_REFUSED = ("--key-file signs idemlink frames; a standard Modbus {how} frame has no "
                      "room for a MAC and the slave could not check one (docs/SECURITY.md, "
                      "'Plain Modbus'): drop --key-file; nothing was sent")


def refuse_key_with_modbus(args: argparse.Namespace, how: str) -> None:
    """``--key-file`` with ``--modbus-rtu`` / ``--modbus-tcp`` (``how``): one ``UserError``
    line. The environment's key (``IDEMLINK_KEY_FILE``/``IDEMLINK_KEY``) is for idemlink
    devices and is not used with them."""
    if getattr(args, "key_file", None):
        raise UserError(f"{how}: " + MODBUS_KEY_REFUSED.format(
            how="RTU" if how == "--modbus-rtu" else "TCP"))


def add_rtu_options(p: argparse.ArgumentParser) -> None:
    """``--modbus-rtu [--unit N]``: drive a standard Modbus RTU slave (``RtuDevice``);
    ``--modbus-tcp HOST[:PORT] [--unit N]``: a Modbus TCP device or gateway (``TcpDevice``)."""
    p.add_argument("--modbus-rtu", action="store_true", default=None,
                   help="the port has a standard Modbus RTU slave (not an idemlink device)")
    p.add_argument("--modbus-tcp", metavar="HOST[:PORT]", default=None,
                   help="a Modbus TCP device or gateway at HOST (port 502 unless given; "
                        "[v6addr]:port for IPv6) instead of a port; answers wait 1 s unless "
                        "--timeout says otherwise")
    p.add_argument("--unit", type=unit_syntax, default=None, metavar="N",
                   help="with --modbus-rtu or --modbus-tcp: its unit id (1..247, default 1); "
                        "with --modbus-rtu a list (1,2,5-8) runs the command on each unit of "
                        "the line, one transaction at a time")


def unit_syntax(text: str) -> int | str:
    """``--unit``: a number (checked later), or a list kept as text (``rtu_units``)."""
    try:
        return int(text)
    except ValueError:
        if all(c.isdigit() or c in ",- " for c in text) and any(c.isdigit() for c in text):
            return text
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def tcp_address(args: argparse.Namespace) -> str | None:
    """The ``--modbus-tcp`` address (None without it); ``UserError`` for it with
    ``--modbus-rtu`` or for an address that is not ``HOST[:PORT]``."""
    from idemlink.protocol.modbus_tcp import TcpAddressError, parse_tcp_address

    address: str | None = getattr(args, "modbus_tcp", None)
    if address is None:
        return None
    if getattr(args, "modbus_rtu", False):
        raise UserError("--modbus-rtu and --modbus-tcp exclude each other (a serial line or a "
                        "TCP connection)")
    try:
        parse_tcp_address(address)
    except TcpAddressError as exc:
        raise UserError(f"--modbus-tcp: {exc}") from None
    return address


def line_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords that open the command's port: ``baudrate``, ``bytesize``, ``parity``,
    ``stopbits`` (``Device.open``, ``RtuDevice.open``, ``open_port`` take them all)."""
    return {"baudrate": args.baudrate, "bytesize": args.bytesize, "parity": args.parity,
            "stopbits": args.stopbits}


def rtu_unit(args: argparse.Namespace) -> int | None:
    """The unit id to drive with ``--modbus-rtu`` (None without it); ``UserError`` for a unit
    outside 1..247 or ``--unit`` without ``--modbus-rtu``."""
    units = rtu_units(args)
    if units is None:
        return None
    if len(units) > 1:
        raise UserError(f"--unit {args.unit}: this command takes one unit")
    unit = units[0]
    if not 1 <= unit <= 247:
        raise UserError(f"--unit {unit} outside 1..247 (broadcast, unit 0, gets no answer and "
                        "cannot be read back)")
    return unit


def rtu_units(args: argparse.Namespace) -> list[int] | None:
    """The unit ids ``--unit`` names with ``--modbus-rtu`` (a list ``1,2,5-8`` only there) or
    ``--modbus-tcp`` (default ``[1]``; None without either)."""
    unit: int | str | None = getattr(args, "unit", None)
    if not (getattr(args, "modbus_rtu", False) or tcp_address(args) is not None):
        if unit is not None:
            raise UserError("--unit is a Modbus RTU unit id: it needs --modbus-rtu (or "
                            "--modbus-tcp)")
        return None
    if unit is None or isinstance(unit, int):
        return [1 if unit is None else unit]
    if not getattr(args, "modbus_rtu", False):
        raise UserError(f"--unit {unit}: a list of units is for --modbus-rtu (one line)")
    return address_list(unit, "--unit", "unit 0 is the broadcast, which no slave answers")


def int_arg(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def parse_int(text: str, what: str) -> int:
    """An integer in decimal, 0x hex or 0b binary; ``UserError`` otherwise."""
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise UserError(f"{what}: {text!r} is not an integer") from None


def no_register_of_kind(regmap: RegisterMap, kind: RegisterKind) -> str:
    """The one line for a command that needs a FAULT (W1C) or TRIGGER register of a map that has
    none, as a third-party device's map often has not; nothing is sent."""
    what = {RegisterKind.FAULT: "fault register (W1C)",
            RegisterKind.TRIGGER: "trigger register"}.get(kind, f"{kind.name.lower()} register")
    hint = (": a device's own fault word that is not write-1-to-clear is an input or holding "
            "register, read it with `idemlink read NAME`" if kind is RegisterKind.FAULT else "")
    return f"the map {regmap.name} has no {what}{hint}; nothing was sent"


def only_register(regmap: RegisterMap, kind: RegisterKind, ref: str | None, verb: str) -> RegisterSpec:
    if ref is not None:
        spec = resolve(regmap, ref)
        if spec.kind is not kind:
            raise UserError(f"{spec.name} is a {spec.kind.name} register, not {kind.name}")
        return spec
    specs = regmap.of_kind(kind)
    if not specs:
        raise UserError(no_register_of_kind(regmap, kind))
    if len(specs) != 1:
        option = "--register NAME" if kind is RegisterKind.FAULT else "its name"
        raise UserError(f"the map has {len(specs)} {kind.name.lower()} registers: give "
                        f"{option} ({', '.join(s.name for s in specs)})")
    return specs[0]


def fault_word_of_bits(regmap: RegisterMap, bits: Sequence[str]) -> str | None:
    """The one fault word that declares every named bit (bit names are unique in a map), or
    None when a name is unknown (``fault_mask`` then names the choices)."""
    owners = {s.name for s in regmap.of_kind(RegisterKind.FAULT)
              for b in s.bits if b.name in bits}
    if len(owners) > 1:
        raise UserError(f"those bits belong to different fault words ({', '.join(sorted(owners))})"
                        ": clear one word at a time with --register NAME")
    return owners.pop() if owners else None


# ------------------------------------------------------------------------------- opening, output


MAX_TIMEOUT = LINK_MAX_TIMEOUT
"""Upper bound of ``--timeout`` (seconds per answer): beyond it a lost answer looks like a hang."""
MAX_SECONDS = 366 * 86400.0
"""Upper bound of ``monitor --seconds`` (a year): larger values overflow the clock arithmetic."""


def check_seconds(option: str, value: float, maximum: float) -> None:
    """A duration option must be a finite number in (0, maximum]; ``UserError`` otherwise
    (``float()`` accepts ``nan`` and ``inf``, which would hang or crash the loops)."""
    if not (math.isfinite(value) and 0 < value <= maximum):
        raise UserError(f"{option} {value!r}: expected seconds, > 0 and <= {maximum:g}")


def schema_of(args: argparse.Namespace) -> str:
    """``idemlink.read/1``, ``idemlink.write/1``...: the schema of the command's document."""
    return f"idemlink.{args.command}/1"


def result_json(r: Result) -> dict[str, Any]:
    return {
        "outcome": r.outcome.name,
        "status": r.status.name if r.status is not None else None,
        "exception": r.exception_name,
        "replay": r.replay,
        "attempts": r.attempts,
        "detail": r.describe(),
    }


def reading_entry(spec: RegisterSpec, r: Result, raw: int | None = None) -> dict[str, Any]:
    """A register read as every schema lists it (``register_entry``) with the read's
    ``outcome``; ``raw`` and ``value`` are null when the read got no value. ``raw`` is the
    register's raw value when ``r`` read more (default: its own, ``raw_in``)."""
    if raw is None and r.ok and r.values:
        raw = raw_in(spec, r.command, r.values)
    return {**register_entry(spec, raw), "outcome": r.outcome.name}


def not_sent(reason: str) -> dict[str, Any]:
    return {"outcome": Outcome.REJECTED.name, "status": None, "exception": None,
            "replay": False, "attempts": 0, "detail": f"REJECTED (not sent: {reason})"}


def unit_suffix(spec: RegisterSpec) -> str:
    return f" {spec.unit}" if spec.unit else ""


def shown(spec: RegisterSpec, raw: int) -> str:
    """``42.0 °C (raw 420)``, ``auto (1)``, ``50 %``, ``-5.0 °C (raw 0xFFCE)``: the map's
    reading, and the raw value whenever the reading is not the raw number itself (a fault word,
    a word of bit fields and a string show theirs already)."""
    text = spec.show(raw)
    if spec.kind is RegisterKind.FAULT or spec.fields or spec.dtype is DataType.STRING:
        return text
    bare = text[: -len(unit_suffix(spec))] if unit_suffix(spec) and text.endswith(unit_suffix(spec)) else text
    if bare == str(raw):
        return text
    if spec.label_of(raw) is not None or spec.kind is RegisterKind.TRIGGER:
        return f"{text} ({spec.raw_text(raw)})"
    return f"{text} (raw {spec.raw_text(raw)})"


def parse_value(spec: RegisterSpec, text: str) -> int:
    """A value typed for ``spec`` (``RegisterSpec.raw_from_text``: a label, a number in the
    register's unit, or ``raw:N``/``0x..``); ``UserError`` naming the register otherwise."""
    try:
        return spec.raw_from_text(text)
    except ValueError as exc:
        raise UserError(str(exc)) from None
