"""``idemlink gateway --port URL[=NAME] ... --tokens FILE --store FILE [--listen HOST:PORT]``: one
process owns the ports and serves callers over HTTP with idempotency keys (docs/GATEWAY.md).

Contract: ``--port`` (an idemlink device) and ``--rtu-port`` (a plain Modbus RTU slave through
``--regmap``, at ``--unit``) may be given several times; a port's name is ``NAME`` or ``p1``,
``p2``... in order. Binds ``127.0.0.1:8080`` unless ``--listen`` says otherwise (port 0: any free
one). Once the ports are open and what a stopped gateway left is settled, prints one line on
stdout, ``idemlink gateway: listening on http://HOST:PORT``, and serves until SIGINT/SIGTERM
(exit 0). A bad option, an unsafe tokens file or store, a store another gateway holds, an address
that cannot be bound: one line on stderr, exit 1. ``--openapi`` prints the API description.
The tokens file's third word is the caller's role; ``--max-calls``, ``--max-audit``,
``--retention-hours`` and ``--store-max-mb`` are the store's limits (``StoreLimits``);
``--modbus-tcp HOST:PORT`` also answers Modbus TCP (``idemlink.gateway.modbus_tcp``; one more
line on stdout, ``idemlink gateway: modbus tcp on HOST:PORT``, after the readiness line).
``--watch SECONDS`` reads every register that often for the page (``/ui/``) and the MQTT values;
``--mqtt URL --mqtt-id ID`` serves a fleet through a broker (``idemlink.gateway.mqtt_bridge``)
under the same roles and limits.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

from idemlink.cli import (
    EXIT_OK,
    UserError,
    add_char_format_options,
    add_regmap_option,
    regmap_from,
)
from idemlink.output import add_json_option, json_line

SCHEMA = "idemlink.gateway/1"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "gateway", help="own ports and serve callers over HTTP with idempotency keys")
    p.add_argument("--port", action="append", default=[], metavar="URL[=NAME]",
                   help="an idemlink device's port or pyserial URL (repeatable)")
    p.add_argument("--rtu-port", action="append", default=[], metavar="URL[=NAME]",
                   help="a plain Modbus RTU slave's port, driven through --regmap (repeatable)")
    p.add_argument("--unit", type=int, default=1, help="the RTU slaves' unit id (default 1)")
    p.add_argument("--baudrate", type=int, default=115200,
                   help="the ports' line speed (default 115200)")
    add_char_format_options(p, modbus=True)
    p.add_argument("--timeout", type=float, default=0.2,
                   help="seconds to wait for each answer before a retry (default 0.2)")
    add_regmap_option(p)
    p.add_argument("--key-file", metavar="F", default=None,
                   help="the idemlink ports' key file (0600; docs/SECURITY.md): every frame "
                        "signed, a device that does not sign with it is refused (no downgrade); "
                        "read again whenever a port reopens. Not for --rtu-port: a plain Modbus "
                        "frame has nothing to sign")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:8080: this machine only)")
    p.add_argument("--tokens", metavar="FILE",
                   help="bearer tokens: `TOKEN CALLER [viewer|operator|admin]` a line, mode 600")
    p.add_argument("--store", metavar="FILE", help="the call store (SQLite), one per gateway")
    p.add_argument("--max-calls", type=int, default=None, metavar="N",
                   help="call records kept at most (default 100000; then 503 STORE_FULL)")
    p.add_argument("--max-audit", type=int, default=None, metavar="N",
                   help="audit entries kept at most (default 200000)")
    p.add_argument("--retention-hours", type=float, default=None, metavar="H",
                   help="how long a key's record is kept; older keys are refused (default 24)")
    p.add_argument("--store-max-mb", type=float, default=None, metavar="MB",
                   help="the store file's size limit (default 256)")
    p.add_argument("--modbus-tcp", metavar="HOST:PORT", default=None,
                   help="also answer Modbus TCP there, for clients that know only Modbus "
                        "(docs/GATEWAY.md; no authentication: bind it with care)")
    p.add_argument("--modbus-unit", action="append", default=[], metavar="UNIT=PORT",
                   help="Modbus TCP unit UNIT is the gateway's port PORT (default: port i is "
                        "unit i; one port is also units 0 and 255)")
    p.add_argument("--modbus-read-only", action="store_true",
                   help="the Modbus TCP face refuses every write (ILLEGAL FUNCTION)")
    p.add_argument("--watch", type=float, default=2.0, metavar="SECONDS",
                   help="seconds between reads of every register for the page and MQTT values "
                        "(default 2; at once after a write; 0: none)")
    p.add_argument("--mqtt", metavar="URL",
                   help="serve a fleet through an MQTT broker: mqtt://[USER@]HOST[:PORT] "
                        "(mqtts:// for TLS); docs/GATEWAY.md, 'The fleet'")
    p.add_argument("--mqtt-id", metavar="ID",
                   help="this gateway's id in the fleet's topics (required with --mqtt)")
    p.add_argument("--mqtt-prefix", default="idemlink", metavar="PREFIX",
                   help="the fleet's topic prefix (default idemlink)")
    p.add_argument("--mqtt-password-file", metavar="FILE",
                   help="the broker password of --mqtt's USER (a file of mode 600)")
    p.add_argument("--openapi", action="store_true", help="print the OpenAPI description and exit")
    add_json_option(p, SCHEMA)
    p.set_defaults(handler=run)


def _named(values: list[str], first: int) -> list[tuple[str, str]]:
    out = []
    for i, value in enumerate(values, first):
        url, sep, name = value.rpartition("=") if re.search(r"=[A-Za-z0-9_.-]+$", value) and (
            "://" not in value.rpartition("=")[2]) else (value, "", "")
        if not sep:
            url, name = value, f"p{i}"
        if not url:
            raise UserError(f"--port {value!r}: no URL")
        out.append((url, name))
    return out


def _listen(text: str, option: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"{option} {text!r}: expected HOST:PORT (e.g. 127.0.0.1:8080)")
    return host.strip("[]"), int(port)


def _key_file(args: argparse.Namespace) -> str | None:
    """``--key-file``, checked once before anything opens (a refused file is one line); with
    only ``--rtu-port`` ports it is refused: a plain Modbus frame has nothing to sign."""
    from idemlink.commands.common import MODBUS_KEY_REFUSED
    from idemlink.protocol.key_file import KeyFileError, read_key_file

    path: str | None = args.key_file
    if path is None:
        return None
    if not args.port:
        raise UserError("--rtu-port: " + MODBUS_KEY_REFUSED.format(how="RTU"))
    try:
        read_key_file(path)
    except KeyFileError as exc:
        raise UserError(f"{exc}; nothing was opened") from None
    return path


def run(args: argparse.Namespace) -> int:
    from idemlink.gateway.openapi import openapi_text

    if args.openapi:
        print(openapi_text(), end="")
        return EXIT_OK
    from idemlink.gateway.server import GatewayConfig, serve
    from idemlink.gateway.service import PortSpec
    from idemlink.gateway.store import StoreError, StoreLimits
    from idemlink.gateway.tokens import TokenFileError, load_token_file

    if not args.port and not args.rtu_port:
        raise UserError("name at least one --port or --rtu-port")
    if args.tokens is None or args.store is None:
        raise UserError("--tokens FILE and --store FILE are required")
    host, port = _listen(args.listen)
    regmap = regmap_from(args)
    named = _named(args.port, 1) + _named(args.rtu_port, len(args.port) + 1)
    names = [n for _, n in named]
    if len(set(names)) != len(names):
        raise UserError(f"two ports share a name: {', '.join(names)}")
    key_file = _key_file(args)
    specs = [PortSpec(name, url, regmap, rtu=i >= len(args.port), unit=args.unit,
                      baudrate=args.baudrate, timeout=args.timeout, bytesize=args.bytesize or 8,
                      parity=args.parity or ("E" if i >= len(args.port) else "N"),
                      stopbits=args.stopbits or 1,
                      key_file=None if i >= len(args.port) else key_file)
             for i, (url, name) in enumerate(named)]
    try:
        tokens, roles = load_token_file(args.tokens)
    except TokenFileError as exc:
        raise UserError(str(exc)) from exc
    if not 0 <= args.watch <= 3600:
        raise UserError("--watch: seconds, 0 to 3600")
    mqtt = None
    if args.mqtt is not None:
        try:
            from idemlink.gateway.mqtt_bridge import MqttConfig, MqttConfigError
        except ImportError as exc:  # paho-mqtt: pip install 'idemlink[gateway]'
            raise UserError(f"--mqtt needs paho-mqtt (pip install 'idemlink[gateway]'): {exc}"
                            ) from exc
        if not args.mqtt_id:
            raise UserError("--mqtt needs --mqtt-id ID: this gateway's id in the fleet")
        try:
            mqtt = MqttConfig.parse(args.mqtt, args.mqtt_id, args.mqtt_prefix,
                                    args.mqtt_password_file)
        except MqttConfigError as exc:
            raise UserError(str(exc)) from exc

    def ready(url: str) -> None:
        if args.json:
            print(json_line(SCHEMA, {"url": url}), flush=True)
        else:
            print(f"idemlink gateway: listening on {url}", flush=True)

    given = {"max_calls": args.max_calls, "max_audit": args.max_audit,
             "retention_seconds": None if args.retention_hours is None
             else int(args.retention_hours * 3600),
             "max_bytes": None if args.store_max_mb is None else int(args.store_max_mb * 2**20)}
    limits = StoreLimits(**{k: v for k, v in given.items() if v is not None})
    modbus = _listen(args.modbus_tcp, "--modbus-tcp") if args.modbus_tcp is not None else None
    units: dict[int, str] | None = None
    if args.modbus_unit:
        units = {}
        for item in args.modbus_unit:
            unit, sep, name = item.partition("=")
            if not sep or not unit.isdigit() or not 0 <= int(unit) <= 255 or name not in names:
                raise UserError(f"--modbus-unit {item!r}: UNIT=PORT, a unit 0-255 and one of "
                                f"the ports ({', '.join(names)})")
            units[int(unit)] = name

    def modbus_ready(address: str) -> None:
        if not args.json:
            print(f"idemlink gateway: modbus tcp on {address}", flush=True)

    try:
        asyncio.run(serve(GatewayConfig(specs, tokens, args.store, host, port, roles, limits,
                                        modbus, units, args.modbus_read_only,
                                        watch=args.watch, mqtt=mqtt),
                          ready, modbus_ready=modbus_ready))
    except StoreError as exc:
        raise UserError(str(exc)) from exc
    except OSError as exc:
        raise UserError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from exc
    return EXIT_OK
