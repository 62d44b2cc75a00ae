"""``idemlink read|write|faults|clear|trigger|monitor|ports``: the device commands.

Contract:

- Every command except ``ports`` talks to one device at ``--port`` (a device path or any pyserial
  URL), opened without toggling DTR/RTS, through ``idemlink.host.device.Device``; ``--timeout`` and
  ``--attempts`` tune the retries, ``--json`` prints one JSON object on stdout instead of text
  (schema ``idemlink.COMMAND/1``, ``idemlink.output``; an error is an ``idemlink.error/1`` object).
  Several ``--port`` values (or ``--ports-file``) run the command on every device at once
  (``idemlink.commands.many``: a block per device, a summary, the worst exit status; ``--json`` one
  ``idemlink.devices/1`` object); ``monitor`` watches one port (``--timeout``, ``--attempts``,
  ``--trace`` do not apply to it and it does not take them).
- The exit status is the worst outcome class of the commands sent (UNKNOWN 5 > REJECTED 4 >
  NOT_EXECUTED 3 > OK 0); see ``idemlink.cli``. A write the register map already shows to be invalid
  (out of range, read-only register) is REJECTED without being sent (exit 4; ``--no-check`` sends
  it anyway and lets the device refuse it).
- User mistakes (no such port, no device answering, unknown register or bit, a value that is not an
  integer or does not fit 16 bits, a bad plan file, a refused journal) raise ``UserError``: one line
  on stderr, exit 1, nothing sent.
- After an UNKNOWN the command reads back what it touched (``Device.reconcile()``) and reports it;
  an unanswered read (UNKNOWN, exit 5, no value) changed nothing and is not read back.
- ``--modbus-rtu [--unit N]`` (read, write, faults, clear, trigger) drives a standard Modbus RTU
  slave with the map file instead (``idemlink.host.rtu_device.RtuDevice``): reads and set-only
  writes may be retried, a fault clear (FC06 of the mask) or a trigger (FC06 of 1, then its state
  read back) is sent once and is UNKNOWN without an answer; ``--if-generation`` and ``--trace``
  are refused. A framed command that finds no idemlink device but a Modbus RTU slave at unit 1
  says "this port answers Modbus RTU, not idemlink: add --modbus-rtu" (exit 1).
- ``apply PLAN.json`` lives in ``idemlink.commands.apply_cmd`` (it shares these options and
  helpers).
- ``monitor`` decodes the idemlink frames passing on a port (``idemlink.protocol.frame.FrameDecoder``) and
  prints one line per frame or refused frame.

Tests may inject the device: a handler uses ``args.open_device()`` when the namespace has it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from idemlink.cli import (
    EXIT_INTERRUPTED,
    EXIT_LOCAL_ERROR,
    EXIT_NOT_EXECUTED,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_UNKNOWN,
    UserError,
    add_baudrate_option,
    add_regmap_option,
    mark_reported,
    regmap_from,
)
from idemlink.commands.many import PortAction, add_port_options, ports_of, run_on_ports
from idemlink.commands.selection import is_range, read_runs, resolve, select_registers
from idemlink.host.device import Device, IncompatibleDevice, LinkLost, NoDevice, PortError, Result
from idemlink.host.frame_view import FrameDescriber, trigger_code_name
from idemlink.host.rtu_device import RtuDevice
from idemlink.output import add_json_option, emit, error_json, print_json, register_entry
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import (
    REGISTER_MAX,
    RegisterKind,
    RegisterMap,
    RegisterSpec,
    TriggerState,
    TriggerStatus,
)

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


# ------------------------------------------------------------------------------- argument parsing


def device_options() -> argparse.ArgumentParser:
    """The options every device command takes (``--port``, ``--timeout``...), as an argparse
    parent (each command adds its own ``--json``, naming its schema)."""
    common = argparse.ArgumentParser(add_help=False)
    add_port_options(common)
    add_baudrate_option(common)
    common.add_argument("--timeout", type=float, default=0.2,
                        help="seconds to wait for each answer before a retry (default 0.2)")
    common.add_argument("--attempts", type=int, default=5,
                        help="sends per command before it is UNKNOWN (default 5)")
    common.add_argument("--trace", metavar="FILE", default=None,
                        help="append every frame sent and received, decoded, as JSON lines")
    add_regmap_option(common)
    return common


def register(sub: Any) -> None:
    common = device_options()

    p = sub.add_parser("read", parents=[common], help="read registers by name, address or range")
    add_rtu_options(p)
    p.add_argument("registers", nargs="*", metavar="NAME",
                   help="register names, addresses, or inclusive address ranges FIRST:LAST "
                        "(0:9, 0x100:0x10F; addresses without a register skipped); "
                        "default: every register")
    p.add_argument("--all", action="store_true",
                   help="every register of the map, contiguous runs read together")
    add_json_option(p, "idemlink.read/1")
    p.set_defaults(handler=link_guarded(run_read))

    p = sub.add_parser("write", parents=[common], help="set registers: NAME=VALUE...")
    add_rtu_options(p)
    p.add_argument("assignments", nargs="+", metavar="NAME=VALUE",
                   help="a register and its value as the map reads it (42.0, auto, raw:420)")
    add_json_option(p, "idemlink.write/1")
    p.add_argument("--if-generation", type=_int_arg, metavar="G",
                   help="write only if the generation counter still equals G (else exit 3)")
    p.add_argument("--no-check", action="store_true",
                   help="send even what the register map shows to be invalid")
    p.set_defaults(handler=link_guarded(run_write))

    p = sub.add_parser("faults", parents=[common], help="read the fault words, bit by bit")
    add_rtu_options(p)
    add_json_option(p, "idemlink.faults/1")
    p.set_defaults(handler=link_guarded(run_faults))

    p = sub.add_parser("clear", parents=[common], help="clear latched fault bits (write 1s)")
    add_rtu_options(p)
    p.add_argument("bits", nargs="*", metavar="BIT",
                   help="bit names or numbers (default: every declared bit)")
    p.add_argument("--mask", type=_int_arg, metavar="M", help="the bits to clear as a mask")
    p.add_argument("--register", metavar="NAME", help="the fault register (default: the only one)")
    add_json_option(p, "idemlink.clear/1")
    p.set_defaults(handler=link_guarded(run_clear))

    p = sub.add_parser("trigger", parents=[common], help="start a one-shot action, or reset/query")
    add_rtu_options(p)
    p.add_argument("name", nargs="?", metavar="NAME", help="trigger register (default: the only one)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--reset", action="store_true", help="reset the trigger to IDLE (write 0)")
    g.add_argument("--status", action="store_true", help="read the trigger state only")
    add_json_option(p, "idemlink.trigger/1")
    p.set_defaults(handler=link_guarded(run_trigger))

    p = sub.add_parser("monitor", help="decode frames passing on a port")
    p.add_argument("--port", action=PortAction, default=None,
                   help="the device path or pyserial URL to listen on")
    add_baudrate_option(p)
    add_regmap_option(p)
    add_json_option(p, "idemlink.monitor/1")
    p.add_argument("--count", type=int, metavar="N", help="stop after N frames")
    p.add_argument("--seconds", type=float, metavar="S", help="stop after S seconds")
    p.set_defaults(handler=run_monitor)

    p = sub.add_parser("ports", help="list serial ports")
    add_json_option(p, "idemlink.ports/1")
    p.set_defaults(handler=run_ports)


def add_rtu_options(p: argparse.ArgumentParser) -> None:
    """``--modbus-rtu [--unit N]``: drive a standard Modbus RTU slave (``RtuDevice``)."""
    p.add_argument("--modbus-rtu", action="store_true",
                   help="the port has a standard Modbus RTU slave (not an idemlink device)")
    p.add_argument("--unit", type=int, default=None,
                   help="with --modbus-rtu: its unit id (1..247, default 1)")


def rtu_unit(args: argparse.Namespace) -> int | None:
    """The unit id to drive with ``--modbus-rtu`` (None without it); ``UserError`` for a unit
    outside 1..247 or ``--unit`` without ``--modbus-rtu``."""
    unit: int | None = getattr(args, "unit", None)
    if not getattr(args, "modbus_rtu", False):
        if unit is not None:
            raise UserError("--unit is a Modbus RTU unit id: it needs --modbus-rtu")
        return None
    unit = 1 if unit is None else unit
    if not 1 <= unit <= 247:
        raise UserError(f"--unit {unit} outside 1..247 (broadcast, unit 0, gets no answer and "
                        "cannot be read back)")
    return unit


def _int_arg(text: str) -> int:
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


def _only(regmap: RegisterMap, kind: RegisterKind, ref: str | None, verb: str) -> RegisterSpec:
    if ref is not None:
        spec = resolve(regmap, ref)
        if spec.kind is not kind:
            raise UserError(f"{spec.name} is a {spec.kind.name} register, not {kind.name}")
        return spec
    specs = regmap.of_kind(kind)
    if len(specs) != 1:
        option = "--register NAME" if kind is RegisterKind.FAULT else "its name"
        raise UserError(f"the map has {len(specs)} {kind.name.lower()} registers: give "
                        f"{option} ({', '.join(s.name for s in specs)})")
    return specs[0]


def _fault_word_of_bits(regmap: RegisterMap, bits: Sequence[str]) -> str | None:
    """The one fault word that declares every named bit (bit names are unique in a map), or
    None when a name is unknown (``fault_mask`` then names the choices)."""
    owners = {s.name for s in regmap.of_kind(RegisterKind.FAULT)
              for b in s.bits if b.name in bits}
    if len(owners) > 1:
        raise UserError(f"those bits belong to different fault words ({', '.join(sorted(owners))})"
                        ": clear one word at a time with --register NAME")
    return owners.pop() if owners else None


# ------------------------------------------------------------------------------- opening, output


MAX_TIMEOUT = 60.0
"""Upper bound of ``--timeout`` (seconds per answer): beyond it a lost answer looks like a hang."""
MAX_SECONDS = 366 * 86400.0
"""Upper bound of ``monitor --seconds`` (a year): larger values overflow the clock arithmetic."""


def check_seconds(option: str, value: float, maximum: float) -> None:
    """A duration option must be a finite number in (0, maximum]; ``UserError`` otherwise
    (``float()`` accepts ``nan`` and ``inf``, which would hang or crash the loops)."""
    if not (math.isfinite(value) and 0 < value <= maximum):
        raise UserError(f"{option} {value!r}: expected seconds, > 0 and <= {maximum:g}")


def open_device(args: argparse.Namespace) -> Device:
    """The device at ``args.port`` (or ``args.open_device()`` when a test injected one)."""
    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    injected: Callable[[], Device] | None = getattr(args, "open_device", None)
    if injected is not None:
        return injected()
    if not args.port:
        raise UserError("--port is required (a device path or pyserial URL; see `idemlink ports`)")
    regmap = regmap_from(args)
    trace = getattr(args, "trace", None)
    try:
        return Device.open(args.port, baudrate=args.baudrate, timeout=args.timeout,
                           attempts=args.attempts, regmap=regmap, trace=trace)
    except OSError as exc:  # the trace file (the port's own failures are PortError)
        raise UserError(f"--trace {trace}: {exc.strerror or exc}") from None
    except NoDevice as exc:
        if answers_modbus_rtu(args.port, args.baudrate, regmap, args.timeout):
            raise UserError(f"{args.port}: this port answers Modbus RTU, not idemlink: add "
                            "--modbus-rtu") from None
        raise UserError(f"{args.port}: {exc}") from None
    except (PortError, IncompatibleDevice) as exc:
        raise UserError(f"{args.port}: {exc}") from None


AnyDevice = Device | RtuDevice
"""An idemlink device or, with ``--modbus-rtu``, a standard Modbus RTU slave."""


def open_any_device(args: argparse.Namespace) -> AnyDevice:
    """``open_device``, or with ``--modbus-rtu`` the slave at ``args.port``, unit ``args.unit``."""
    unit = rtu_unit(args)
    if unit is None:
        return open_device(args)
    injected: Callable[[], RtuDevice] | None = getattr(args, "open_device", None)
    if injected is not None:
        return injected()
    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    if not args.port:
        raise UserError("--port is required (a device path or pyserial URL; see `idemlink ports`)")
    if getattr(args, "trace", None) is not None:
        raise UserError("--trace decodes idemlink frames: it does not apply with --modbus-rtu")
    if getattr(args, "if_generation", None) is not None:
        raise UserError("--if-generation needs the idemlink conditional write (function 0x41), "
                        "which a standard Modbus RTU slave does not have; nothing was sent")
    try:
        return RtuDevice.open(args.port, unit=unit, baudrate=args.baudrate,
                              timeout=args.timeout, attempts=args.attempts,
                              regmap=regmap_from(args))
    except (PortError, NoDevice) as exc:
        raise UserError(f"{args.port}: {exc}") from None


def answers_modbus_rtu(port: str, baudrate: int, regmap: RegisterMap, timeout: float) -> bool:
    """Whether a Modbus RTU slave answers at unit 1 on ``port`` (one read of the map's first
    register; an exception answer counts): said when a framed command found no idemlink
    device there."""
    try:
        with RtuDevice.open(port, baudrate=baudrate, regmap=regmap, timeout=timeout,
                            attempts=1, probe=False) as dev:
            r = dev.execute(dev.read_command(regmap.registers[0].address))
    except (PortError, LinkLost):
        return False
    return r.outcome is not Outcome.UNKNOWN or r.exception is not None


def link_guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler``, with a port that fails mid-command reported instead of a traceback: exit 5
    (UNKNOWN) if a request was out — it may have run — else exit 1 (nothing was sent); the hint to
    read back is given only if one that was out may have had an effect (not for a read). An
    interrupt (Ctrl-C) still exits 130, after one line if a request that may have had an effect
    was out."""

    def guarded(args: argparse.Namespace) -> int:
        ports = ports_of(args)
        if len(ports) > 1:
            return run_on_ports(args, one_port, ports)
        args.port = ports[0] if ports else None
        return one_port(args)

    def one_port(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except LinkLost as exc:
            outcome = Outcome.UNKNOWN if exc.unknown else None
            hint = ""
            if any(r.outcome is Outcome.UNKNOWN and r.command.may_have_effect for r in exc.results):
                hint = ("; once the port is back, `idemlink apply` again reads the step back"
                        if args.command == "apply" else
                        "; once the port is back, read back what it touched before going on")
            print(f"idemlink {args.command}: {exc}{hint}",
                  file=sys.stderr)
            status = EXIT_UNKNOWN if exc.unknown else EXIT_LOCAL_ERROR
            error_json(args, f"{exc}{hint}", status, outcome=outcome.name if outcome else None,
                       error=str(exc), results=[result_json(r) for r in exc.results])
            return status
        except KeyboardInterrupt as exc:
            results: tuple[Result, ...] = getattr(exc, "settled_results", ())
            sent = [r for r in results if r.outcome is Outcome.UNKNOWN and r.command.may_have_effect]
            if sent:
                message = (f"interrupted; {len(sent)} request(s) may have run (UNKNOWN, "
                           "CANCELLED): read back what it touched before going on")
                print(f"idemlink {args.command}: {message}", file=sys.stderr)
                error_json(args, message, EXIT_INTERRUPTED, outcome=Outcome.UNKNOWN.name,
                           error="interrupted", results=[result_json(r) for r in results])
                mark_reported(exc)
            raise

    guarded.__name__ = handler.__name__
    guarded.__doc__ = handler.__doc__
    return guarded


def schema_of(args: argparse.Namespace) -> str:
    """``idemlink.read/1``, ``idemlink.write/1``...: the schema of the command's document."""
    return f"idemlink.{args.command}/1"


def result_json(r: Result) -> dict[str, Any]:
    return {
        "outcome": r.outcome.name,
        "status": r.status.name if r.status is not None else None,
        "exception": r.exception.name if r.exception is not None else None,
        "replay": r.replay,
        "attempts": r.attempts,
        "detail": r.describe(),
    }


def reading_entry(spec: RegisterSpec, r: Result, raw: int | None = None) -> dict[str, Any]:
    """A register read as every schema lists it (``register_entry``) with the read's
    ``outcome``; ``raw`` and ``value`` are null when the read got no value. ``raw`` is the
    register's word when ``r`` read several (default: its first value)."""
    if raw is None and r.ok and r.values:
        raw = r.values[0]
    return {**register_entry(spec, raw), "outcome": r.outcome.name}


def not_sent(reason: str) -> dict[str, Any]:
    return {"outcome": Outcome.REJECTED.name, "status": None, "exception": None,
            "replay": False, "attempts": 0, "detail": f"REJECTED (not sent: {reason})"}


def reconcile_json(dev: AnyDevice, r: Result) -> tuple[dict[str, Any], str]:
    """Read back what the UNKNOWN command ``r`` touched: its JSON and its text line."""
    rec = dev.reconcile(r)
    if rec is None:  # pragma: no cover - reconcile(r) answers for every command
        return {"observed": {}, "intended_state_holds": None, "summary": "nothing to read"}, ""
    doc = {"observed": rec.observed, "intended_state_holds": rec.intended_state_holds,
           "summary": rec.summary}
    line = " ".join([f"UNKNOWN: it may have run; read back: {rec.summary}",
                     *(f"{k}={v}" for k, v in rec.observed.items())])
    return doc, line


def after_unknown(dev: AnyDevice, results: Sequence[Result], doc: dict[str, Any],
                  lines: list[str]) -> None:
    """Read back what every UNKNOWN command that may have had an effect touched and add it to the
    output: ``reconcile`` is the first one's (the one blocking the handle), ``reconciles`` lists
    each in command order. An unanswered read has nothing to read back."""
    each: list[dict[str, Any]] = []
    for r in results:
        if r.outcome is not Outcome.UNKNOWN or not r.command.may_have_effect:
            continue
        rec, line = reconcile_json(dev, r)
        each.append(rec)
        lines.append(line)
    if each:
        doc["reconcile"] = each[0]
        doc["reconciles"] = each


def finish(args: argparse.Namespace, dev: AnyDevice, results: Sequence[Result],
           doc: dict[str, Any], lines: list[str]) -> int:
    """Print the command's result (``idemlink.COMMAND/1`` with ``--json``): the worst outcome,
    and on UNKNOWN what was read back; return its exit status."""
    outcome = worst(r.outcome for r in results)
    doc["outcome"] = outcome.name
    if outcome is Outcome.UNKNOWN:
        after_unknown(dev, results, doc, lines)
    emit(args, schema_of(args), doc, lines)
    return EXIT_OF_OUTCOME[outcome]


def _unit(spec: RegisterSpec) -> str:
    return f" {spec.unit}" if spec.unit else ""


def shown(spec: RegisterSpec, raw: int) -> str:
    """``42.0 °C (raw 420)``, ``auto (1)``, ``50 %``: the map's reading, and the raw value
    whenever the reading is not the raw number itself."""
    text = spec.show(raw)
    if spec.kind is RegisterKind.FAULT:
        return text
    bare = text[: -len(_unit(spec))] if _unit(spec) and text.endswith(_unit(spec)) else text
    if bare == str(raw):
        return text
    if spec.label_of(raw) is not None or spec.kind is RegisterKind.TRIGGER:
        return f"{text} ({raw})"
    return f"{text} (raw {raw})"


def parse_value(spec: RegisterSpec, text: str) -> int:
    """A value typed for ``spec`` (``RegisterSpec.raw_from_text``: a label, a number in the
    register's unit, or ``raw:N``/``0x..``); ``UserError`` naming the register otherwise."""
    try:
        return spec.raw_from_text(text)
    except ValueError as exc:
        raise UserError(str(exc)) from None


# ------------------------------------------------------------------------------------------ read


def run_read(args: argparse.Namespace) -> int:
    """``read NAME...`` reads each register by its own request; ``--all`` and ranges read each
    run of contiguous registers by one request."""
    regmap = regmap_from(args)
    specs = select_registers(regmap, args.registers, args.all)
    in_runs = args.all or any(is_range(r) for r in args.registers)
    groups = read_runs(specs) if in_runs else [[s] for s in specs]
    with open_any_device(args) as dev:
        results = dev.run([dev.read_command(g[0].address, len(g)) for g in groups])
        registers: list[dict[str, Any]] = []
        values: dict[str, int] = {}
        per: dict[str, Any] = {}
        lines: list[str] = []
        width = max(len(s.name) for s in specs)
        for group, r in zip(groups, results, strict=True):
            for i, s in enumerate(group):
                per[s.name] = {"address": s.address, **result_json(r)}
                raw = r.values[i] if r.ok and len(r.values) > i else None
                registers.append(reading_entry(s, r, raw))
                if raw is not None:
                    values[s.name] = raw
                    per[s.name]["value"] = raw
                    per[s.name]["shown"] = s.show(raw)
                    lines.append(f"{s.name:<{width}} = {shown(s, raw)}")
                else:
                    lines.append(f"{s.name:<{width}} : {r.describe()}")
        doc: dict[str, Any] = {"registers": registers, "values": values, "results": per}
        return finish(args, dev, results, doc, lines)


# ----------------------------------------------------------------------------------------- write


@dataclass(frozen=True, slots=True)
class Assignment:
    spec: RegisterSpec
    value: int


def parse_assignments(regmap: RegisterMap, items: Sequence[str]) -> list[Assignment]:
    out: list[Assignment] = []
    seen: set[str] = set()
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name or not text:
            raise UserError(f"{item!r}: expected NAME=VALUE")
        spec = resolve(regmap, name.strip())
        if spec.name in seen:
            raise UserError(f"{spec.name} assigned twice")
        seen.add(spec.name)
        value = parse_value(spec, text)
        if not 0 <= value <= REGISTER_MAX:
            raise UserError(f"{spec.name}={value}: a register holds 0..{REGISTER_MAX}")
        if spec.kind is RegisterKind.FAULT:
            raise UserError(f"{spec.name} is a fault word: use `idemlink clear`")
        if spec.kind is RegisterKind.TRIGGER:
            raise UserError(f"{spec.name} is a trigger: use `idemlink trigger`")
        out.append(Assignment(spec, value))
    return out


def map_refusal(a: Assignment) -> str | None:
    """Why the register map already shows this write to be invalid, or None."""
    s = a.spec
    if not s.writable:
        return f"{s.name} is a read-only {s.kind.name} register"
    if s.kind is RegisterKind.HOLDING and not s.minimum <= a.value <= s.maximum:
        limits = f"{s.minimum}..{s.maximum}"
        if s.scale:
            limits += f" ({s.scaled(s.minimum)}..{s.scaled(s.maximum)}{_unit(s)})"
        elif s.unit:
            limits += _unit(s)
        return f"{s.name}={_typed(a)} outside {limits}"
    return None


def contiguous_runs(assignments: Sequence[Assignment]) -> list[list[Assignment]]:
    """Group by contiguous addresses: each group is one atomic write (FC06 or FC16)."""
    runs: list[list[Assignment]] = []
    for a in sorted(assignments, key=lambda x: x.spec.address):
        if runs and runs[-1][-1].spec.address + 1 == a.spec.address:
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs


def _typed(a: Assignment) -> str:
    """``420`` or ``4200 (420.0 °C)``: the raw value, and how the map reads it if that differs."""
    text = a.spec.show(a.value)
    return str(a.value) if text == str(a.value) else f"{a.value} ({text})"


def _fmt(run: Sequence[Assignment]) -> str:
    return " ".join(f"{a.spec.name}={_typed(a)}" for a in run)


def run_write(args: argparse.Namespace) -> int:
    regmap = regmap_from(args)
    assignments = parse_assignments(regmap, args.assignments)
    runs = contiguous_runs(assignments)
    if args.if_generation is not None:
        if len(runs) != 1:
            raise UserError("--if-generation needs registers at contiguous addresses "
                            "(one atomic conditional write)")
        if not 0 <= args.if_generation <= REGISTER_MAX:
            raise UserError(f"generation {args.if_generation} outside 0..{REGISTER_MAX}")
    if not args.no_check:
        refusals = [(a, why) for a in assignments if (why := map_refusal(a)) is not None]
        if refusals:
            emit(args, schema_of(args), {
                "outcome": Outcome.REJECTED.name,
                "registers": [register_entry(a.spec, a.value) for a, _ in refusals],
                "writes": [{"registers": [register_entry(a.spec, a.value)], **not_sent(why)}
                           for a, why in refusals]},
                 [f"REJECTED (checked against the register map, nothing sent): {why}"
                  for _, why in refusals])
            return EXIT_REJECTED
    with open_any_device(args) as dev:
        if args.if_generation is not None:
            values: dict[str | int, int] = {a.spec.name: a.value for a in runs[0]}
            results = [dev.write_if_generation(args.if_generation, values)]
        else:
            results = dev.run([dev.write_command({a.spec.name: a.value for a in run})
                               for run in runs])
        writes: list[dict[str, Any]] = []
        lines: list[str] = []
        for run, r in zip(runs, results, strict=True):
            entry = {"registers": [register_entry(a.spec, a.value) for a in run],
                     **result_json(r)}
            line = f"{_fmt(run)}: {r.describe()}"
            if args.if_generation is not None and r.code is not None:
                entry["generation"] = r.code
                line += f" (generation {'now' if r.ok else 'is'} {r.code})"
            writes.append(entry)
            lines.append(line)
        doc: dict[str, Any] = {"registers": [register_entry(a.spec, a.value)
                                             for run in runs for a in run], "writes": writes}
        return finish(args, dev, results, doc, lines)


# ---------------------------------------------------------------------------------------- faults


def decode_fault_word(spec: RegisterSpec, value: int) -> dict[str, Any]:
    """The named bits of a fault word (undeclared set bits appear as ``bitN``)."""
    declared = {b.bit: b.name for b in spec.bits}
    latched = [declared.get(i, f"bit{i}") for i in range(16) if value >> i & 1]
    return {"value": value, "latched": latched,
            "bits": {b.name: bool(value >> b.bit & 1) for b in spec.bits}}


def _fault_line(spec: RegisterSpec, value: int) -> str:
    latched = decode_fault_word(spec, value)["latched"]
    return f"{spec.name} = 0x{value:04X}  " + (", ".join(latched) if latched else "(none latched)")


def run_faults(args: argparse.Namespace) -> int:
    specs = regmap_from(args).of_kind(RegisterKind.FAULT)
    with open_any_device(args) as dev:
        results = dev.run([dev.read_command(s.address) for s in specs])
        faults: dict[str, Any] = {}
        registers: list[dict[str, Any]] = []
        lines: list[str] = []
        for s, r in zip(specs, results, strict=True):
            registers.append(reading_entry(s, r))
            if r.ok:
                registers[-1]["latched"] = decode_fault_word(s, r.values[0])["latched"]
                faults[s.name] = decode_fault_word(s, r.values[0])
                lines.append(_fault_line(s, r.values[0]))
            else:
                faults[s.name] = result_json(r)
                lines.append(f"{s.name}: {r.describe()}")
        return finish(args, dev, results, {"registers": registers, "faults": faults}, lines)


def fault_mask(spec: RegisterSpec, bits: Sequence[str], mask: int | None) -> int:
    if bits and mask is not None:
        raise UserError("give bit names or --mask, not both")
    if mask is not None:
        if not 0 < mask <= REGISTER_MAX:
            raise UserError(f"mask {mask:#x} outside 1..0xFFFF")
        return mask
    if not bits:
        return spec.fault_mask
    by_name = {b.name: b.bit for b in spec.bits}
    out = 0
    for text in bits:
        if text in by_name:
            out |= 1 << by_name[text]
            continue
        try:
            n = int(text, 0)
        except ValueError:
            raise UserError(f"no fault bit {text!r} in {spec.name} (bits: "
                            + ", ".join(f"{b.bit} {b.name}" for b in spec.bits) + ")") from None
        if not 0 <= n <= 15:
            raise UserError(f"bit {n} outside 0..15")
        out |= 1 << n
    return out


def run_clear(args: argparse.Namespace) -> int:
    regmap = regmap_from(args)
    register = args.register
    if register is None and args.bits:
        register = _fault_word_of_bits(regmap, args.bits)
    spec = _only(regmap, RegisterKind.FAULT, register, "clear")
    mask = fault_mask(spec, args.bits, args.mask)
    with open_any_device(args) as dev:
        r = dev.clear_faults(mask, spec.name)
        doc: dict[str, Any] = {"register": spec.name, "mask": mask, "clear": result_json(r)}
        lines = [f"clear {spec.name} mask 0x{mask:04X}: {r.describe()}"]
        sent = [r]
        if r.outcome is not Outcome.UNKNOWN:
            back = dev.read(spec.name)
            sent.append(back)
            if back.ok:
                after = decode_fault_word(spec, back.values[0])
                doc["after"] = after
                doc["registers"] = [{**reading_entry(spec, back),
                                     "latched": after["latched"]}]
                still = [n for n in after["latched"] if n in
                         decode_fault_word(spec, mask)["latched"]]
                lines.append(_fault_line(spec, back.values[0]) + (
                    f"  ({', '.join(still)} still latched: the condition persists)"
                    if still else ""))
        return finish(args, dev, sent, doc, lines)


# --------------------------------------------------------------------------------------- trigger

TRIGGER_MEANING: dict[int, str] = {
    TriggerStatus.ACCEPTED: "started",
    TriggerStatus.RUNNING: "already running: nothing started",
    TriggerStatus.DONE: "already done: nothing started (`--reset` to re-arm)",
    TriggerStatus.ABNORMAL_STATE: "abnormal state",
    TriggerStatus.ILLEGAL_VALUE: "illegal value",
}


def _state_name(value: int) -> str:
    try:
        return TriggerState(value).name
    except ValueError:
        return f"0x{value:04X}"


def run_trigger(args: argparse.Namespace) -> int:
    spec = _only(regmap_from(args), RegisterKind.TRIGGER, args.name, "use")
    with open_any_device(args) as dev:
        doc: dict[str, Any] = {"register": spec.name}
        if args.status:
            r = dev.trigger_status(spec.name)
            doc.update(result_json(r))
            if r.ok:
                doc["state"] = _state_name(r.values[0])
                doc["value"] = r.values[0]
                doc["registers"] = [reading_entry(spec, r)]
                lines = [f"{spec.name}: {doc['state']}"]
            else:
                lines = [f"{spec.name}: {r.describe()}"]
        else:
            r = dev.trigger_reset(spec.name) if args.reset else dev.trigger(spec.name)
            doc.update(result_json(r))
            doc["action"] = "reset" if args.reset else "start"
            if r.ok and r.code is not None:
                doc["code"] = r.code
                doc["code_name"] = trigger_code_name(r.code)
                meaning = "reset to IDLE" if args.reset and r.code == 0 else (
                    TRIGGER_MEANING.get(r.code, "unknown code"))
                lines = [f"{spec.name}: {doc['code_name']} (0x{r.code:04X}): {meaning}"]
            elif r.ok:  # a Modbus RTU slave's answer is an echo: its state says what happened
                lines = [f"{spec.name}: {r.describe()}"]
                state = dev.trigger_status(spec.name)
                if state.ok:
                    doc["state"] = _state_name(state.values[0])
                    doc["registers"] = [reading_entry(spec, state)]
                    lines[0] += f" (written {0 if args.reset else 1}; state now {doc['state']})"
            else:
                lines = [f"{spec.name}: {r.describe()}"]
        return finish(args, dev, [r], doc, lines)


# ----------------------------------------------------------------------------------------- ports


def run_ports(args: argparse.Namespace) -> int:
    from serial.tools import list_ports

    ports = sorted(list_ports.comports(), key=lambda p: p.device)
    doc = [{"device": p.device, "description": p.description, "hwid": p.hwid} for p in ports]
    if args.json:
        print_json("idemlink.ports/1", {"ports": doc})
    elif not ports:
        print("no serial ports found (the simulator's pty is not listed: `idemlink sim` prints it)")
    else:
        for p in ports:
            print(f"{p.device}\t{p.description}\t{p.hwid}")
    return EXIT_OK


# --------------------------------------------------------------------------------------- monitor


def run_monitor(args: argparse.Namespace) -> int:
    import serial

    from idemlink.protocol.frame import FrameDecoder

    ports = ports_of(args)
    if len(ports) != 1:
        raise UserError("monitor watches one port: give one --port (a device path or pyserial URL)")
    args.port = ports[0]
    if args.count is not None and args.count < 1:
        raise UserError("--count must be >= 1")
    if args.seconds is not None:
        check_seconds("--seconds", args.seconds, MAX_SECONDS)
    try:
        port = serial.serial_for_url(args.port, baudrate=args.baudrate, timeout=0.05,
                                     do_not_open=True)
        port.dtr = False
        port.rts = False
        port.open()
    except (serial.SerialException, ValueError, OSError) as exc:
        raise UserError(f"cannot open {args.port}: {exc}") from None
    print(f"idemlink monitor: listening on {args.port}", file=sys.stderr, flush=True)
    decoder = FrameDecoder()
    describer = FrameDescriber(regmap_from(args))
    start = time.monotonic()
    end = start + args.seconds if args.seconds is not None else None
    shown = 0
    try:
        while args.count is None or shown < args.count:
            now = time.monotonic()
            if end is not None and now >= end:
                break
            port.timeout = 0.05 if end is None else max(0.0, min(0.05, end - now))
            data = port.read(1)
            if not data:
                continue
            waiting = int(getattr(port, "in_waiting", 0) or 0)
            if waiting:
                data += port.read(waiting)
            t = time.monotonic() - start
            decoder.receive_data(data)
            for item in iter(decoder.next_event, None):
                d = describer.describe(item)
                d["t"] = round(t, 6)
                if args.json:
                    print_json("idemlink.monitor/1", d)
                else:
                    print(f"+{t:9.3f}s {d['text']}", flush=True)
                shown += 1
                if args.count is not None and shown >= args.count:
                    break
    except KeyboardInterrupt:
        pass
    except serial.SerialException as exc:
        print(f"idemlink monitor: {args.port}: {exc}", file=sys.stderr)
        return EXIT_LOCAL_ERROR
    finally:
        port.close()
    return EXIT_OK

