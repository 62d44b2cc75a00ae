"""``idemlink monitor --port P [--count N] [--seconds S]``: decode the idemlink frames passing on
a port.

Contract: one line per frame or refused frame (``idemlink.protocol.frame.FrameDecoder``,
``FrameDescriber``), ``--json`` one ``idemlink.monitor/1`` object each; one port only; it stops
after N frames, S seconds (finite, > 0, at most a year) or Ctrl-C (exit 0). ``--timeout``,
``--attempts`` and ``--trace`` do not apply and are not taken. The port's baud rate and
character format (default 8N1), and the port itself, may come from a profile or the environment
(``idemlink.commands.connection``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from idemlink.cli import (
    EXIT_LOCAL_ERROR,
    EXIT_OK,
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_regmap_option,
    regmap_from,
)
from idemlink.commands.common import MAX_SECONDS, check_seconds, line_settings
from idemlink.commands.connection import LINE_KEYS, add_connection_options
from idemlink.commands.many import PortAction, ports_of
from idemlink.host.frame_view import FrameDescriber
from idemlink.output import add_json_option, print_json


def register(sub: Any) -> None:
    p = sub.add_parser("monitor", help="decode frames passing on a port")
    p.add_argument("--port", action=PortAction, default=None,
                   help="the device path or pyserial URL to listen on")
    add_baudrate_option(p, default=None)
    add_char_format_options(p)
    add_regmap_option(p)
    add_connection_options(p, ("port", *LINE_KEYS, "regmap"))
    add_json_option(p, "idemlink.monitor/1")
    p.add_argument("--count", type=int, metavar="N", help="stop after N frames")
    p.add_argument("--seconds", type=float, metavar="S", help="stop after S seconds")
    p.set_defaults(handler=run_monitor)


def run_monitor(args: argparse.Namespace) -> int:
    import serial

    from idemlink.host.errors import PortError
    from idemlink.host.transport import open_port
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
        port = open_port(args.port, **line_settings(args), exclusive=False, timeout=0.05)
    except PortError as exc:
        raise UserError(str(exc)) from None
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
