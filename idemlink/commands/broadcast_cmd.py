"""``idemlink broadcast NAME=VALUE... --port P --address 1,2,5-8 [--verify] [--repeat N]``: one
set-only write to every idemlink device of a bus at once (issue 22 item 4; docs/BUS.md,
"Broadcast"; docs/CLI.md).

Contract:

- The values are ``write``'s ``NAME=VALUE`` (parsed and checked against the map the same way: a
  value outside the map's range is REJECTED, exit 4, nothing sent) and must make one set-only
  write of HOLDING registers at contiguous addresses (``broadcast_allowed``, the rule the devices
  apply): anything else — a coil, a trigger, a fault word, two separate runs — is one line, exit
  1, nothing sent.
- ``--address`` names the devices: each gets a HELLO first (the broadcast's number goes above
  every one's ``broadcast_next``); then one frame to address 0 (``--repeat N`` times, the same
  number: a device runs it once), and the command returns after its time on the line and the
  turnaround, never after a timeout (nobody answers). No device answering: exit 1, nothing sent.
- **Unsigned**: a broadcast carries no MAC (nobody answers, the devices share no session key) and
  a keyed device does not run one: ``--key-file`` is refused in one line, and so is a broadcast
  to an address whose HELLO says it is keyed (exit 1, nothing sent) — never a key silently
  ignored nor a write sent where it cannot run.
- **Honest outcomes**: without ``--verify`` every device is UNKNOWN / BROADCAST_SENT (exit 5): a
  broadcast has no answer, only a read-back knows. ``--verify`` reads each device back: OK where
  the values hold, NOT_EXECUTED where they do not (set-only: sending again is harmless), UNKNOWN
  where the read-back got no answer. A device that did not answer its HELLO stays UNKNOWN (it may
  have heard the broadcast; its number was not known). Reported as ``--address 1,2,5-8`` commands
  are: one block per ``PORT@ADDRESS`` (``idemlink.broadcast/1`` each with ``--json``, inside one
  ``idemlink.devices/1``), the summary line, the worst exit status.
"""

from __future__ import annotations

import argparse
from typing import Any

from idemlink.cli import UserError, regmap_from
from idemlink.commands.common import (
    EXIT_OF_OUTCOME,
    MAX_TIMEOUT,
    add_answer_options,
    add_half_duplex_options,
    bus_addresses,
    check_seconds,
    half_duplex,
    line_settings,
    result_json,
)
from idemlink.commands.device_io import log_sources, port_said_once
from idemlink.commands.many import ports_of, run_on_ports
from idemlink.commands.write_cmd import assignment_syntax, contiguous_runs, map_refusal, parse_assignments
from idemlink.host.command import CommandBuilder, Result
from idemlink.host.errors import IncompatibleDevice, NoDevice, PortBusy, PortError
from idemlink.host.port_hint import busy_message
from idemlink.output import add_json_option, emit, register_entry
from idemlink.protocol.device_core import broadcast_allowed
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status

SCHEMA = "idemlink.broadcast/1"


def register(sub: Any) -> None:
    from idemlink.cli import add_baudrate_option, add_char_format_options, add_regmap_option
    from idemlink.commands.connection import LINE_KEYS, add_connection_options
    from idemlink.commands.many import add_port_options

    p = sub.add_parser("broadcast", help="one set-only write to every device of a bus at once "
                                         "(UNKNOWN until read back: --verify)")
    add_port_options(p)
    add_baudrate_option(p, default=None)
    add_char_format_options(p, modbus=True)
    add_answer_options(p)
    add_regmap_option(p)
    add_half_duplex_options(p)
    add_connection_options(p, ("port", *LINE_KEYS, "timeout", "attempts", "regmap"))
    p.add_argument("--address", required=True, metavar="N,M-K",
                   help="the devices of the bus (1,2,5-8): each is asked its broadcast number "
                        "first and reported")
    p.add_argument("assignments", nargs="+", metavar="NAME=VALUE", type=assignment_syntax,
                   help="HOLDING registers at contiguous addresses and their values")
    p.add_argument("--verify", action="store_true",
                   help="read each device back: OK where the values hold, NOT_EXECUTED where "
                        "they do not")
    p.add_argument("--key-file", metavar="F", default=None,
                   help="refused: a broadcast is unsigned and a keyed device does not run one "
                        "(docs/BUS.md)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="send the same frame N times (1..100) against loss: each device runs "
                        "it once")
    add_json_option(p, SCHEMA)
    p.set_defaults(handler=run_broadcast)


def run_broadcast(args: argparse.Namespace) -> int:
    from idemlink.host.bus import BROADCAST_UNSIGNED, Bus

    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    if not 1 <= args.repeat <= 100:
        raise UserError(f"--repeat {args.repeat}: a broadcast is sent 1..100 times")
    if args.key_file is not None:
        raise UserError(f"--key-file: {BROADCAST_UNSIGNED}")
    ports = ports_of(args)
    if len(ports) != 1:
        raise UserError("a broadcast goes on one bus: give one --port")
    port = ports[0]
    addresses = bus_addresses(args)
    assert addresses is not None  # required
    regmap = regmap_from(args)
    assignments = parse_assignments(regmap, args.assignments)
    runs = contiguous_runs(assignments)
    values: dict[str | int, int | str] = {a.spec.name: a.value for a in assignments}
    refusal = UserError("a broadcast is one set-only write of HOLDING registers at contiguous "
                        "addresses (nobody answers it); nothing was sent")
    if len(runs) != 1:
        raise refusal
    try:
        command = CommandBuilder(regmap).write_command(values)
    except LocalProtocolError as exc:
        raise UserError(f"{exc}; nothing was sent") from None
    if not broadcast_allowed(regmap, command.pdu()):
        raise refusal
    refusals = [why for a in assignments if (why := map_refusal(a)) is not None]
    registers = [register_entry(a.spec, a.value) for a in assignments]
    if refusals:
        emit(args, SCHEMA, {"outcome": Outcome.REJECTED.name, "registers": registers},
             [f"REJECTED (checked against the register map, nothing sent): {why}"
              for why in refusals])
        return EXIT_OF_OUTCOME[Outcome.REJECTED]
    log_sources(args)
    try:
        bus = Bus.open(port, **line_settings(args), **half_duplex(args), regmap=regmap,
                       timeout=args.timeout, attempts=args.attempts)
    except PortBusy:
        raise UserError(busy_message(port, getattr(args, "regmap", None))) from None
    except PortError as exc:
        raise UserError(port_said_once(port, exc)) from None
    try:
        silent: dict[int, str] = {}
        for a in addresses:
            try:
                bus.framed(a).connect()
            except (NoDevice, IncompatibleDevice) as exc:
                silent[a] = str(exc)
        if len(silent) == len(addresses):
            raise UserError(f"{port}: no device of --address {args.address} answered its "
                            "HELLO; nothing was sent")
        keyed = [a for a in addresses if a not in silent
                 and (info := bus.framed(a).info) is not None and info.key_id is not None]
        if keyed:
            raise UserError(f"{port}: address {', '.join(map(str, keyed))} is keyed: "
                            f"{BROADCAST_UNSIGNED}")
        try:
            sent = bus.broadcast(values, repeat=args.repeat)
        except PortError as exc:
            raise UserError(port_said_once(port, exc)) from None
        except LocalProtocolError as exc:  # refused before sending (a device's max_payload)
            raise UserError(f"{port}: {exc}") from None
        seq = next(iter(sent.values())).seq
        results: dict[int, Result] = dict(sent)
        for a, why in silent.items():
            results[a] = Result(command, Outcome.UNKNOWN, Status.BROADCAST_SENT, seq=seq,
                                detail=f"did not answer its HELLO ({why}): it may have heard "
                                       "the broadcast")

        def one(ns: argparse.Namespace) -> int:
            a = int(ns.port.rpartition("@")[2])
            r = results[a]
            if args.verify and a not in silent:
                r = bus.verify({a: r})[a]
            doc = {"address": a, "broadcast_seq": seq, "registers": registers,
                   **result_json(r)}
            shown = " ".join(f"{x.spec.name}={x.spec.typed(x.value)}" for x in assignments)
            emit(ns, SCHEMA, doc, [f"{shown}: {r.describe()}"])
            return EXIT_OF_OUTCOME[r.outcome]

        return run_on_ports(args, one, [f"{port}@{a}" for a in addresses])
    finally:
        bus.close()
