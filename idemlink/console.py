"""The ``idemlink`` console script and ``python -m idemlink``: ``idemlink.cli.main`` behind a
Ctrl-C guard.

Contract: this module imports nothing but ``sys`` and ``signal`` before its guard, so a Ctrl-C at
any moment of start-up (Python importing the command modules, building the parser) ends the
process with one line on stderr, ``idemlink: interrupted while starting; nothing was sent``, and
exit 130 — never a traceback; with ``--json`` on the command line also one ``idemlink.error/1``
object on stdout. Once a command runs, ``idemlink.cli.main`` reports its own interrupts. Once it
has returned, SIGINT is ignored: a Ctrl-C landing after the command finished (while Python shuts
down, which restores the default action of a handler it installed and would die of the signal
silently) changes nothing, the command's own exit status stands.
"""

from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130
STARTUP_INTERRUPTED = "idemlink: interrupted while starting; nothing was sent"
STARTUP_INTERRUPTED_JSON = ('{"command": null, "exit": 130, "message": "interrupted while '
                            'starting; nothing was sent", "schema": "idemlink.error/1"}')


def main() -> int:
    status: int | None = None
    try:
        from idemlink.cli import main as cli_main

        status = cli_main()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        if status is not None:  # the command had finished: its status stands
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return status
        print(STARTUP_INTERRUPTED, file=sys.stderr)
        if "--json" in sys.argv[1:]:
            print(STARTUP_INTERRUPTED_JSON, flush=True)
        return EXIT_INTERRUPTED
    return status
