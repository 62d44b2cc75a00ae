"""What to tell someone whose port is busy (``PortBusy``): only what works for that kind of port.

Contract: ``busy_hint(url, regmap)`` is the advice after "port busy: URL is already open in another
program". Two programs can never share one end of a line: each would take the other's answers.
On a pseudo-terminal (``/dev/pts/N``, ``/dev/ttysNNN``; also behind ``faulty://``) a second reader
such as ``idemlink monitor`` would steal bytes too, so the only way to watch its traffic is to put
``idemlink link --monitor`` in front of it. On a serial device, ``idemlink monitor`` works on a
*tap* of the line (a second adapter on an RS-485 bus), never on the busy port itself.
"""

from __future__ import annotations

import os
import re

_PTY = re.compile(r"^/dev/(pts/\d+|ttys\d+|ttyp[0-9a-f])$")


def local_path(url: str) -> str:
    """The device path a URL opens (``faulty://PATH?...`` -> PATH), or the URL itself."""
    while url.startswith("faulty://"):
        url = url[len("faulty://"):]
    return url.split("?", 1)[0]


def is_pty(url: str) -> bool:
    """Whether the port is a pseudo-terminal (by its resolved path)."""
    path = local_path(url)
    return bool(_PTY.match(os.path.realpath(path)) or _PTY.match(path))


def busy_message(url: str, regmap: str | None = None) -> str:
    """The whole ``PortBusy`` line: "port busy: URL is already open in another program (HINT)"."""
    return f"port busy: {url} is already open in another program ({busy_hint(url, regmap)})"


def busy_hint(url: str, regmap: str | None = None) -> str:
    """What works when ``url`` is held by another program (closing that program always does).
    The watching command it suggests carries ``--regmap REGMAP`` when the user gave one; without
    one it says to add it for a device serving another map (or frames are decoded by the
    built-in map's names)."""
    with_map = f" --regmap {regmap}" if regmap else ""
    add_map = "" if regmap else (" (add --regmap FILE if the device serves another map than the "
                                 "built-in one)")
    if is_pty(url):
        return ("close it first; a pty has one reader, so to watch its traffic start "
                f"`idemlink link --monitor --b {local_path(url)}{with_map}`{add_map} and connect "
                "the other program to the pty link prints")
    return ("close it first; to watch the line while the other program drives it, run "
            f"`idemlink monitor{with_map}`{add_map} on a tap of the line (a second adapter on an "
            "RS-485 bus), not on this port")
