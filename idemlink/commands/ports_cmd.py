"""``idemlink ports``: list the serial ports pyserial sees (device, description, hardware id).

Contract: text one port per line (or a note that there is none: the simulator's pty is not
listed); ``--json`` one ``idemlink.ports/1`` object. Always exit 0.
"""

from __future__ import annotations

import argparse
from typing import Any

from idemlink.cli import EXIT_OK
from idemlink.output import add_json_option, print_json


def register(sub: Any) -> None:
    p = sub.add_parser("ports", help="list serial ports")
    add_json_option(p, "idemlink.ports/1")
    p.set_defaults(handler=run_ports)


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
