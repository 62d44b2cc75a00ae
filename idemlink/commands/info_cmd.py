"""``idemlink info --port P [--json] [--regmap FILE]``: who is on this port.

Contract: one HELLO, no command sent (nothing on the device changes). Prints the device id, name,
current boot epoch, the register map it serves (name and hash) and whether that is the map given
with ``--regmap`` (default: the built-in map), the protocol version and contract hash, the
de-duplication window, replay slots, pipelining depth, payload limit and the next sequence number
it would hand a new host. Works whatever map the device serves (the map is reported, not
enforced). ``--json`` prints one object, schema ``idemlink.info/1``. Exit 0, or 1 when no idemlink
device answered or the port cannot be opened (a port answering Modbus RTU instead says so).
``--modbus-rtu`` is refused in one line (exit 1): a standard slave has no HELLO identity.
"""

from __future__ import annotations

import argparse
from typing import Any

from idemlink.cli import (
    EXIT_OK,
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_regmap_option,
    regmap_from,
)
from idemlink.commands.common import (
    add_address_option,
    add_answer_options,
    add_half_duplex_options,
    add_key_option,
    half_duplex,
)
from idemlink.commands.connection import add_connection_options
from idemlink.output import add_json_option, print_json

INFO_SCHEMA = "idemlink.info/1"
RTU_INFO_REFUSED = ("info shows what an idemlink device says of itself in its HELLO reply (id, "
                    "epoch, map, limits); a standard Modbus RTU slave says none of it: read its "
                    "registers with `idemlink read --modbus-rtu --port P --all`")
INFO_KEYS = ("port", "baudrate", "bytesize", "parity", "stopbits", "timeout", "attempts",
             "modbus_rtu", "regmap")
"""Every connection setting but the unit: info has no --unit (it refuses --modbus-rtu)."""
RTU_INFO_HINT = ("`idemlink info` cannot identify it; read it with `idemlink read --modbus-rtu "
                 "--port P --all`")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "info", help="identify the device on a port: id, epoch, register map, limits")
    p.add_argument("--port", help="device path or pyserial URL (see `idemlink ports`)")
    add_baudrate_option(p, default=None)
    add_char_format_options(p)
    add_answer_options(p, "HELLOs before giving up (default 5)")
    add_key_option(p)
    add_json_option(p, INFO_SCHEMA)
    add_regmap_option(p)
    add_address_option(p, several=False)
    add_half_duplex_options(p)
    p.add_argument("--modbus-rtu", action="store_true", default=None,
                   help="refused: a standard Modbus RTU slave has no HELLO identity to show "
                        "(read its registers with `idemlink read --modbus-rtu --all`)")
    p.add_argument("--modbus-tcp", metavar="HOST[:PORT]", default=None,
                   help="refused, as --modbus-rtu: a Modbus TCP device has no HELLO identity "
                        "(read its registers with `idemlink read --modbus-tcp HOST --all`)")
    add_connection_options(p, INFO_KEYS)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from idemlink.commands.common import (
        MAX_TIMEOUT,
        bus_address,
        check_seconds,
        host_key,
        line_settings,
    )
    from idemlink.commands.device_io import log_sources, no_device, port_said_once
    from idemlink.host.device import Device
    from idemlink.host.errors import IncompatibleDevice, NoDevice, PortError
    from idemlink.host.gateway_device import GatewayDevice, NotThroughGateway
    from idemlink.protocol.contract import contract_hash
    from idemlink.protocol.payloads import Capability, printable

    if args.modbus_rtu:
        raise UserError(f"--modbus-rtu: {RTU_INFO_REFUSED}; nothing was sent")
    if args.modbus_tcp is not None:
        raise UserError("--modbus-tcp: info shows what an idemlink device says of itself in its "
                        "HELLO reply; a Modbus TCP device says none of it: read its registers "
                        f"with `idemlink read --modbus-tcp {args.modbus_tcp} --all`; nothing was "
                        "sent")
    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    if not args.port:
        raise UserError("--port is required (a device path or pyserial URL; see `idemlink ports`)")
    regmap = regmap_from(args)
    key = host_key(args)
    log_sources(args)
    try:
        with Device.open(args.port, **line_settings(args), **half_duplex(args),
                         timeout=args.timeout,
                         attempts=args.attempts, regmap=regmap, check_map=False,
                         address=bus_address(args), key=key) as dev:
            info = dev.info
            if isinstance(dev, GatewayDevice):  # what the gateway's port says of its device
                epoch, authenticated = dev.epoch, dev.authenticated
            else:
                epoch, authenticated = dev.session.epoch, dev.ops.authenticated
    except NoDevice as exc:
        raise no_device(args.port, exc, hint=RTU_INFO_HINT) from None
    except (PortError, IncompatibleDevice, NotThroughGateway) as exc:
        raise UserError(port_said_once(args.port, exc)) from None
    if info is None:  # through a gateway: a port that is down, or a plain Modbus slave
        raise UserError(f"{args.port}: the gateway has no HELLO of this port's device (a plain "
                        "Modbus slave, or the port is down)")
    matches = info.map_hash == regmap.hash
    ours = contract_hash()
    out: dict[str, Any] = {
        "port": args.port, "device_id": info.device_id,
        "name": info.name, "epoch": epoch,
        "map": {"name": info.map_name, "hash": info.map_hash.hex() if info.map_hash else None,
                "matches": matches, "expected": {"name": regmap.name, "hash": regmap.hash.hex()}},
        "protocol": {"version": info.version, "contract_hash": info.contract_hash.hex(),
                     "matches": info.contract_hash == ours},
        "window": info.window, "replay_slots": info.replay_slots,
        "max_inflight": info.max_inflight, "max_payload": info.max_payload,
        "next_seq": info.next_seq,
        # the second HELLO_REPLY extension (None: a device from before it)
        "address": info.address or None,
        "capabilities": None if info.capabilities is None else
        [c.name for c in Capability if c and info.serves(c)],
        # issue 23: whether this session is authenticated, and the key's id (never the key)
        "authenticated": authenticated,
        "key_id": None if info.key_id is None else f"{info.key_id:08x}",
    }
    if args.json:
        print_json(INFO_SCHEMA, out)
        return EXIT_OK
    if info.map_hash is None:
        map_line = "not advertised (an older firmware)"
    else:
        ours_is = "matches --regmap" if args.regmap is not None else "the built-in default map"
        verdict = ours_is if matches else (
            f"differs from {regmap.name} {regmap.hash.hex()}: commands need its map file")
        map_line = f"{printable(info.map_name or '')} {info.map_hash.hex()} ({verdict})"
    proto = "same as ours" if info.contract_hash == ours else f"ours is {ours.hex()}"
    rows = [
        ("device id", printable(info.device_id) if info.device_id else "not advertised"),
        ("name", printable(info.name)),
        ("boot epoch", f"0x{epoch:08x}"),
        ("register map", map_line),
        ("protocol", f"version {info.version}, contract {info.contract_hash.hex()} ({proto})"),
        ("window", f"{info.window} numbers, {info.replay_slots} replayed answers, "
                   f"{info.max_inflight} in flight, payload <= {info.max_payload} B"),
        ("next seq", str(info.next_seq)),
    ]
    if authenticated:
        rows.append(("authenticated", f"yes, key id {info.key_id or 0:08x} (every frame "
                                      "carries a MAC)"))
    elif info.serves(Capability.AUTH):
        rows.append(("authenticated", f"no: the device is keyed (key id {info.key_id or 0:08x})"
                                      "; give its key with --key-file to send it commands"))
    else:
        rows.append(("authenticated", "no (the device is not keyed)"))
    if info.address:
        rows.append(("bus address", f"{info.address} (answers frames addressed to it; acts on "
                                    "broadcast set-only writes)"))
    for k, v in rows:
        print(f"{k:<13} {v}")
    return EXIT_OK
