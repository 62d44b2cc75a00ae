"""The ``idemlink`` console script and ``python -m idemlink``: ``idemlink.cli.main`` behind a
Ctrl-C guard.

Contract: this module imports nothing but ``sys`` before its guard, so a Ctrl-C at any moment of
start-up (Python importing the command modules, building the parser) ends the process with one
line on stderr, ``idemlink: interrupted while starting; nothing was sent``, and exit 130 — never
a traceback. Once a command runs, ``idemlink.cli.main`` reports its own interrupts.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130
STARTUP_INTERRUPTED = "idemlink: interrupted while starting; nothing was sent"


def main() -> int:
    try:
        from idemlink.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        print(STARTUP_INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
