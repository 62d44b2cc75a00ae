"""``idemlink watch``: poll registers at an interval and print what changed.

Contract:

- Each poll reads the chosen registers (names, addresses, ``FIRST:LAST`` ranges or ``--all``,
  ``idemlink.commands.selection``; default: every register of the map) in one pipelined batch,
  one request per contiguous run. The first poll prints every value; later polls print
  only registers whose raw value changed (``--every`` prints all of them each time).
- Every reading carries its read's outcome in the four words every command uses (OK,
  NOT_EXECUTED, REJECTED, UNKNOWN: ``Outcome``), and why when it is not OK (``detail``:
  ``UNKNOWN (NO_ANSWER)``, ``REJECTED (Modbus exception ILLEGAL_DATA_ADDRESS)``).
- Formats: text (``12:00:01.250 threshold = 42.0 °C (raw 420)``; a read without a value,
  ``threshold : REJECTED (Modbus exception ILLEGAL_DATA_ADDRESS)``), ``--csv`` (header
  ``time,poll,name,address,raw,value,label,unit,outcome,detail``: the JSON reading's keys,
  ``value`` a number, ``label`` the map's name for it, empty when null) and ``--json`` (one
  object per line, schema ``idemlink.watch/1``).
- Line trouble is reported per poll, honestly: a run that got no answer prints its registers as
  ``UNKNOWN (NO_ANSWER)`` for that poll (a read changes nothing, so the next poll goes on); a
  port that fails, or a device that stops answering HELLO, is one stderr line per streak
  (``idemlink watch: poll 7: /dev/ttyUSB0 failed (Input/output error), no values; trying again
  at every poll``: the root cause once, no "may have run" — only reads were out), then reopened
  at each interval, and ``idemlink watch: PORT is back`` once it is.
- ``--modbus-rtu [--unit N]`` polls a standard Modbus RTU slave instead (``RtuDevice``: reads
  one after the other, retried like any read).
- It stops after ``--count`` polls, or on Ctrl-C, with a summary on stderr (polls, changes, the
  register readings counted by outcome in those four words, polls without the device — port
  failed or no HELLO answer — and reconnections; a change is a raw value different from the
  previous reading of that register, so a first reading or an ``--every`` repeat is none) and
  exit 0; exit 1 if no poll ever reached the device (a device serving another map is exit 1 at
  once).
- The port, its line and the Modbus settings may come from the environment, a profile or the
  map's ``[link]`` (``idemlink.commands.connection``), as for every device command.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from idemlink.cli import (
    EXIT_LOCAL_ERROR,
    EXIT_OK,
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_regmap_option,
    regmap_from,
)
from idemlink.commands.common import (
    SEVERITY,
    add_answer_options,
    add_half_duplex_options,
    add_key_option,
    add_rtu_options,
    half_duplex,
    line_settings,
)
from idemlink.commands.connection import DEVICE_KEYS, add_connection_options
from idemlink.output import error_json, print_json, register_entry
from idemlink.protocol.outcome import Outcome

if TYPE_CHECKING:
    from idemlink.host.command import Command, Result
    from idemlink.host.device import Device
    from idemlink.host.rtu_device import RtuDevice
    from idemlink.host.tcp_device import TcpDevice
    from idemlink.protocol.registers import RegisterMap, RegisterSpec

CSV_HEADER = ("time", "poll", "name", "address", "raw", "value", "label", "unit", "outcome",
              "detail")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch", help="poll registers at an interval and print changes")
    p.add_argument("registers", nargs="*", metavar="NAME",
                   help="register names, addresses, or inclusive address ranges FIRST:LAST "
                        "(0:9, 0x100:0x10F; addresses without a register skipped); "
                        "default: every register")
    p.add_argument("--all", action="store_true", help="every register of the map (the default)")
    p.add_argument("--port", help="device path or pyserial URL (see `idemlink ports`)")
    add_baudrate_option(p, default=None)
    add_char_format_options(p, modbus=True)
    add_half_duplex_options(p)
    add_answer_options(p, "sends per read before it is UNKNOWN (default 5)")
    add_key_option(p)
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between the starts of two polls (default 1)")
    p.add_argument("--count", type=int, default=None, help="stop after this many polls")
    p.add_argument("--every", action="store_true",
                   help="print every register at every poll, not only changes")
    add_rtu_options(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV lines (with a header)")
    fmt.add_argument("--json", action="store_true",
                     help="one JSON object per reading, schema idemlink.watch/1 (docs/CLI.md)")
    add_regmap_option(p)
    add_connection_options(p, DEVICE_KEYS)
    p.set_defaults(handler=run)


def _no_outcomes() -> dict[Outcome, int]:
    return dict.fromkeys(reversed(SEVERITY), 0)


@dataclass(slots=True)
class Summary:
    polls: int = 0
    changes: int = 0
    #: register readings by their read's outcome (OK, NOT_EXECUTED, REJECTED, UNKNOWN)
    readings: dict[Outcome, int] = field(default_factory=_no_outcomes)
    port_failures: int = 0  #: polls without a device: the port failed or nothing answered HELLO
    reconnects: int = 0

    def line(self) -> str:
        counts = ", ".join(f"{n} {o.name}" for o, n in self.readings.items())
        return (f"idemlink watch: {self.polls} poll(s), {self.changes} change(s), "
                f"readings: {counts}; "
                f"{self.port_failures} poll(s) without the device (port failed or no answer "
                f"to HELLO), {self.reconnects} reconnection(s)")


class Printer:
    """Writes one register reading per line in the chosen format."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.csv = args.csv
        self.json = args.json
        if self.csv:
            self._row(CSV_HEADER)

    def _row(self, row: tuple[object, ...]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(row)
        sys.stdout.write(buf.getvalue())

    def reading(self, stamp: float, poll: int, spec: RegisterSpec, raw: int | None,
                result: Result) -> None:
        """One register's reading at one poll: ``raw`` (None: the read got no value) and the
        read's ``result`` (its outcome, one of the four words, and ``detail``, why)."""
        from idemlink.commands.common import shown

        clock = time.strftime("%H:%M:%S", time.localtime(stamp)) + f".{int(stamp * 1000) % 1000:03d}"
        entry = {**register_entry(spec, raw), "outcome": result.outcome.name,
                 "detail": result.describe()}
        if self.json:
            print_json("idemlink.watch/1", {"time": round(stamp, 3), "poll": poll, **entry})
        elif self.csv:  # the JSON reading's columns, in the same order; null is empty
            self._row((f"{stamp:.3f}", poll, *("" if entry[k] is None else entry[k]
                                               for k in CSV_HEADER[2:])))
            sys.stdout.flush()
        elif raw is None:
            print(f"{clock} {spec.name} : {entry['detail']}", flush=True)
        else:
            print(f"{clock} {spec.name} = {shown(spec, raw)}", flush=True)


def run(args: argparse.Namespace) -> int:
    from idemlink.commands.common import (
        MAX_TIMEOUT,
        check_seconds,
        host_key,
        refuse_key_with_modbus,
        rtu_unit,
        tcp_address,
    )
    from idemlink.commands.device_io import log_sources
    from idemlink.commands.selection import select_registers
    from idemlink.host.command import read_runs

    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    check_seconds("--interval", args.interval, 86400.0)
    if args.count is not None and args.count < 1:
        raise UserError("--count must be >= 1")
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    if tcp_address(args) is not None:
        args.port = args.modbus_tcp  # what the watch names in its lines
    if not args.port:
        raise UserError("--port is required (a device path or pyserial URL; see `idemlink ports`)")
    unit = rtu_unit(args)
    regmap = regmap_from(args)
    if unit is not None:
        refuse_key_with_modbus(args, "--modbus-tcp" if args.modbus_tcp else "--modbus-rtu")
    args.host_keys = None if unit is not None else host_key(args)  # read once, refused early
    log_sources(args)
    groups = read_runs(select_registers(regmap, args.registers, args.all))
    printer = Printer(args)
    summary = Summary()
    try:
        return _loop(args, regmap, groups, printer, summary, unit)
    except KeyboardInterrupt:
        print(summary.line(), file=sys.stderr)
        return EXIT_OK


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, outermost first."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _innermost_errno(exc: BaseException) -> int | None:
    errnos = [e.errno for e in _chain(exc) if isinstance(e, OSError) and e.errno]
    return errnos[-1] if errnos else None


def root_cause(exc: BaseException) -> str:
    """What went wrong at the bottom of ``exc``'s chain, said once: the operating system's words
    for the innermost errno (``Input/output error``, ``No such file or directory``), else the
    exception's own text (the layers above each repeat their cause in their message)."""
    errno = _innermost_errno(exc)
    return os.strerror(errno) if errno is not None else str(exc)


def poll_failure(exc: BaseException) -> str:
    """Why the port failed under a poll, said once: the innermost errno's words, else the
    innermost exception's own text (pyserial's "device reports readiness to read but returned
    no data" carries no errno). Never the outer text: a lost link's (``LinkLost``) adds how many
    requests "may have run", and a poll has only reads out, which change nothing."""
    errno = _innermost_errno(exc)
    return os.strerror(errno) if errno is not None else str(_chain(exc)[-1])


class Trouble:
    """Says a port or device problem once per streak of failed polls (not at every interval),
    and that it is back when it is."""

    def __init__(self, port: str) -> None:
        self.port = port
        self.failing = False

    def failed(self, what: str) -> None:
        if not self.failing:
            print(f"idemlink watch: {what}; trying again at every poll", file=sys.stderr,
                  flush=True)
        self.failing = True

    def back(self) -> None:
        if self.failing:
            print(f"idemlink watch: {self.port} is back", file=sys.stderr, flush=True)
        self.failing = False


def _loop(args: argparse.Namespace, regmap: RegisterMap, groups: list[list[RegisterSpec]],
          printer: Printer, summary: Summary, unit: int | None) -> int:
    from idemlink.commands.device_io import tcp_timeout
    from idemlink.host.device import Device
    from idemlink.host.errors import IncompatibleDevice, NoDevice, PortError
    from idemlink.host.rtu_device import RtuDevice
    from idemlink.host.tcp_device import TcpDevice

    last: dict[str, int] = {}
    dev: Device | RtuDevice | TcpDevice | None = None
    next_start = time.monotonic()
    ever_open = False
    trouble = Trouble(args.port)
    try:
        while args.count is None or summary.polls < args.count:
            time.sleep(max(0.0, next_start - time.monotonic()))
            next_start += args.interval
            if dev is None:
                try:
                    if unit is not None and args.modbus_tcp is not None:
                        dev = TcpDevice.open(args.modbus_tcp, unit=unit, timeout=tcp_timeout(args),
                                             attempts=args.attempts, regmap=regmap)
                    elif unit is not None:
                        dev = RtuDevice.open(args.port, unit=unit, **line_settings(args),
                                             **half_duplex(args),
                                             timeout=args.timeout, attempts=args.attempts,
                                             regmap=regmap)
                    else:
                        dev = Device.open(args.port, **line_settings(args),
                                          **half_duplex(args),
                                          timeout=args.timeout, attempts=args.attempts,
                                          regmap=regmap, key=args.host_keys)
                except IncompatibleDevice as exc:
                    raise UserError(f"{args.port}: {exc}") from None
                except NoDevice:
                    trouble.failed(f"no device answered on {args.port}")
                    summary.polls += 1
                    summary.port_failures += 1
                    continue
                except PortError as exc:
                    why = root_cause(exc)  # no errno: the port's own line, already "cannot open"
                    trouble.failed(why if why.startswith("cannot open ")
                                   else f"cannot open {args.port}: {why}")
                    summary.polls += 1
                    summary.port_failures += 1
                    continue
                if ever_open:
                    summary.reconnects += 1
                ever_open = True
            current = dev
            try:
                if _poll(current, groups, printer, summary, last, args.every):
                    # Our numbers fell behind the device's window (another host drove it far
                    # ahead): a new session (HELLO) hands out numbers that are new again.
                    current.close()
                    dev = None
                trouble.back()
            except PortError as exc:
                # A read changes nothing: this poll simply got no values.
                trouble.failed(f"poll {summary.polls}: {args.port} failed "
                               f"({poll_failure(exc)}), no values")
                summary.port_failures += 1
                current.close()
                dev = None
    finally:
        if dev is not None:
            dev.close()
    print(summary.line(), file=sys.stderr)
    if ever_open:
        return EXIT_OK
    error_json(args, f"no poll reached a device on {args.port}", EXIT_LOCAL_ERROR,
               polls=summary.polls)
    return EXIT_LOCAL_ERROR


def _poll(dev: Device | RtuDevice | TcpDevice, groups: list[list[RegisterSpec]],
          printer: Printer, summary: Summary, last: dict[str, int], every: bool) -> bool:
    """One poll; True when the session must be opened anew (answers refused as TOO_OLD)."""
    from idemlink.host.command import raw_in
    from idemlink.protocol.outcome import Status

    summary.polls += 1
    commands: list[Command] = [dev.read_covering(g) for g in groups]
    stamp = time.time()
    results = dev.run(commands)
    for group, result in zip(groups, results, strict=True):
        summary.readings[result.outcome] += len(group)
        for spec in group:
            raw = raw_in(spec, result.command, result.values) if result.ok else None
            if raw is None:
                printer.reading(stamp, summary.polls, spec, None, result)
                last.pop(spec.name, None)
                continue
            changed = spec.name in last and last[spec.name] != raw  # a first reading is no change
            summary.changes += changed
            if every or changed or spec.name not in last:
                printer.reading(stamp, summary.polls, spec, raw, result)
            last[spec.name] = raw
    return any(r.status is Status.TOO_OLD for r in results)
