"""``idemlink --gateway URL read|write|trigger --gateway-port NAME ...``: the same commands through a gateway
(docs/GATEWAY.md), by ``idemlink.host.gateway_client.GatewayClient``.

Contract: ``idemlink --gateway URL`` before the command name makes ``read NAME...``, ``write
NAME=VALUE...`` (``--if-match G``) and ``trigger [NAME] [--reset]`` calls of the gateway at URL on
its port ``--gateway-port NAME`` (default: its only port), with the bearer token read from
``--token-file FILE``, ``$IDEMLINK_GATEWAY_TOKEN`` or the file ``$IDEMLINK_GATEWAY_TOKEN_FILE``.
``--gateway idemlink+http://HOST:PORT/PORTNAME`` (the URL a device command's ``--port`` takes)
names the port too. A call with an effect gets a new key (``--key
K`` to give one: the same call again, e.g. after an UNKNOWN), reused on every retry. The line
printed is the outcome, reason and action, ``(replayed)`` when the gateway replayed it; the exit
status is the outcome's (OK 0, NOT_EXECUTED 3, REJECTED 4, UNKNOWN 5); ``--json`` prints one
``idemlink.gateway-call/1`` object (``answer``: the gateway's JSON body). No gateway, no token, a
bad value: one line on stderr, exit 1. The key is printed on stderr whenever the outcome is not OK,
so the call can be asked about again.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from idemlink.cli import (
    EXIT_NOT_EXECUTED,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_UNKNOWN,
    UserError,
)
from idemlink.output import add_json_option, json_line

NAME = "gateway-call"
SCHEMA = "idemlink.gateway-call/1"
EXIT_OF: dict[str, int] = {"OK": EXIT_OK, "NOT_EXECUTED": EXIT_NOT_EXECUTED,
                           "REJECTED": EXIT_REJECTED, "UNKNOWN": EXIT_UNKNOWN}
TOKEN_ENV = "IDEMLINK_GATEWAY_TOKEN"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        NAME, help="read, write or trigger through a gateway (idemlink --gateway URL ...)")
    p.add_argument("--gateway", required=True, metavar="URL",
                   help="the gateway's address (http://HOST:PORT), or a device's "
                        "(idemlink+http://HOST:PORT/PORTNAME)")
    p.add_argument("--token-file", metavar="FILE", help=f"the bearer token (or ${TOKEN_ENV})")
    p.add_argument("--gateway-port", metavar="NAME",
                   help="the gateway's port (default: its only one)")
    p.add_argument("--key", help="the call's Idempotency-Key (default: a new UUIDv7)")
    add_json_option(p, SCHEMA)
    p.add_argument("action", choices=("read", "write", "trigger"), help="what to do")
    p.add_argument("items", nargs="*", metavar="NAME|NAME=VALUE",
                   help="read: registers; write: NAME=VALUE; trigger: the trigger (optional)")
    p.add_argument("--if-match", type=int, default=None, metavar="G",
                   help="write: only if the generation still is G")
    p.add_argument("--reset", action="store_true", help="trigger: reset to IDLE")
    p.set_defaults(handler=run)


def rewrite(words: list[str]) -> list[str]:
    """``--gateway URL COMMAND ...`` (before the command) as this command's line."""
    if words[:1] != ["--gateway"] or len(words) < 3:
        return words
    return [NAME, "--gateway", words[1], *words[2:]]


def _token(args: argparse.Namespace) -> str:
    """``--token-file``, else ``$IDEMLINK_GATEWAY_TOKEN``, else the file
    ``$IDEMLINK_GATEWAY_TOKEN_FILE``: the same sources as a device command's ``--port
    idemlink+http://...`` (``idemlink.host.gateway_device.read_token``)."""
    from idemlink.host.gateway_device import NotThroughGateway, read_token

    try:
        return read_token(None, args.token_file)
    except NotThroughGateway as exc:
        where = f"--token-file {args.token_file}" if args.token_file else "no token"
        raise UserError(f"{where}: {exc}" if args.token_file else
                        f"no token: --token-file FILE, ${TOKEN_ENV} or ${TOKEN_ENV}_FILE"
                        ) from None


def _gateway(args: argparse.Namespace) -> tuple[str, str | None]:
    """(base URL, port name) of ``--gateway``: ``http://HOST:PORT`` (the port by
    ``--gateway-port``) or a device URL ``idemlink+http://HOST:PORT/PORTNAME``."""
    from idemlink.host.gateway_device import NotThroughGateway, is_gateway_url, parse_gateway_url

    if not is_gateway_url(args.gateway):
        return args.gateway, args.gateway_port
    try:
        base, port = parse_gateway_url(args.gateway)
    except NotThroughGateway as exc:
        raise UserError(str(exc)) from None
    if port is not None and args.gateway_port not in (None, port):
        raise UserError(f"--gateway names port {port} and --gateway-port {args.gateway_port}: "
                        "give one")
    return base, port or args.gateway_port


def run(args: argparse.Namespace) -> int:
    from idemlink.gateway.calls import check_key
    from idemlink.host.gateway_client import GatewayClient, GatewayUnreachable
    from idemlink.protocol.outcome import IdemlinkError

    base, named = _gateway(args)
    client = GatewayClient(base, _token(args))
    try:
        if args.key is not None:
            import time

            check_key(args.key, time.time())
        port = named or _only_port(client)
        if args.action == "read":
            if not args.items:
                raise UserError("read: name the registers")
            answer = client.read(port, *args.items)
        elif args.action == "write":
            values: dict[str, int | str] = {}
            for item in args.items:
                name, sep, value = item.partition("=")
                if not sep or not name:
                    raise UserError(f"write: {item!r} is not NAME=VALUE")
                values[name] = value
            if not values:
                raise UserError("write: give NAME=VALUE")
            answer = client.write(port, values, if_match=args.if_match, key=args.key)
        else:
            if len(args.items) > 1:
                raise UserError("trigger: at most one register name")
            answer = client.trigger(port, args.items[0] if args.items else None,
                                    reset=args.reset, key=args.key)
    except GatewayUnreachable as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"gateway {args.gateway}: {exc}") from None
    except IdemlinkError as exc:
        raise UserError(str(exc)) from None
    return _report(args, answer)


def _only_port(client: Any) -> str:
    answer = client.ports()
    if "ports" not in answer:
        raise UserError(f"the gateway answered {answer.get('http')} {answer.get('reason')}: "
                        f"{answer.get('message', '')}")
    ports = [p["name"] for p in answer["ports"]]
    if len(ports) != 1:
        raise UserError(f"the gateway has {len(ports)} ports ({', '.join(ports)}): name one "
                        "with --gateway-port")
    return str(ports[0])


def _report(args: argparse.Namespace, answer: dict[str, Any]) -> int:
    outcome = str(answer.get("outcome", ""))
    if outcome not in EXIT_OF:
        raise UserError(f"the gateway answered {answer.get('http')}: "
                        f"{answer.get('message') or answer}")
    if args.json:
        print(json_line(SCHEMA, {"outcome": outcome, "http": answer.get("http"),
                                 "reason": answer.get("reason"), "action": answer.get("action"),
                                 "replayed": bool(answer.get("replayed")), "answer": answer}))
    else:
        for name, reading in (answer.get("registers") or {}).items():
            print(f"{name} = {reading.get('value')}")
        line = f"{outcome} ({answer.get('reason')}); action: {answer.get('action')}"
        result = answer.get("result") or {}
        if result.get("code_name"):
            line += f"; trigger {result['code_name']}"
        if answer.get("replayed"):
            line += " (replayed)"
        print(line)
    if outcome != "OK" and answer.get("message") and not args.json:
        print(f"idemlink: {answer['message']}", file=sys.stderr)  # why, in the gateway's words
    if outcome != "OK" and answer.get("key"):
        print(f"idemlink: key {answer['key']} (ask again with --key {answer['key']})",
              file=sys.stderr)
    return EXIT_OF[outcome]
