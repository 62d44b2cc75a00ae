"""YMODEM file-name policy: what a name from block 0 may be, and the permissions a file gets.

Contract: pure functions, no I/O. ``check_name(raw)`` returns the name to use or a typed
``NameRefusal``; an accepted name is always a single plain path component (no separator, no
'..', no control or invisible format character, no Windows device name, no trailing '.' or ' ',
at most ``max_bytes`` UTF-8 bytes). The checks run in the order ``NameRefusal`` lists them
(``firmware_ref/include/idl_name.h`` keeps the same order). ``sanitize_mode`` never grants setuid,
setgid, sticky or world-write.
"""

from __future__ import annotations

import enum
import re
import unicodedata

MAX_NAME_BYTES = 255


class NameRefusal(enum.Enum):
    """Why a file name from block 0 was refused."""

    EMPTY = "empty name"
    NOT_UTF8 = "name is not valid UTF-8"
    CONTROL_CHAR = "name contains NUL or a control character"
    ABSOLUTE = "absolute path"
    DRIVE_LETTER = "drive letter or colon"
    PATH_SEPARATOR = "path separator"
    DOT_DOT = "'.' or '..'"
    TOO_LONG = "name too long"
    RESERVED_DEVICE = "Windows reserved device name (CON, PRN, AUX, NUL, COM1-9, LPT1-9)"
    TRAILING_DOT_SPACE = "name ends in '.' or ' ' (Windows drops them)"
    FORMAT_CHAR = "name contains an invisible Unicode format character (bidi override, BOM...)"



_DRIVE_RE = re.compile(r"^[A-Za-z]:")
#: Windows device names, reserved with any extension and in any case ("nul.txt", "Com1");
#: Windows also counts the superscript digits as COM/LPT numbers.
_RESERVED_RE = re.compile(r"(CON|PRN|AUX|NUL|(COM|LPT)[1-9\u00b9\u00b2\u00b3])", re.IGNORECASE)


def check_name(raw: bytes, max_bytes: int = MAX_NAME_BYTES) -> str | NameRefusal:
    """Return the name to use, or why it is refused. The result is always a single plain path
    component: no separator, no '..', no control character, at most ``max_bytes`` bytes."""
    if not raw:
        return NameRefusal.EMPTY
    if len(raw) > max_bytes:
        return NameRefusal.TOO_LONG
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return NameRefusal.NOT_UTF8
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in name):
        return NameRefusal.CONTROL_CHAR
    if name.startswith(("/", "\\")):
        return NameRefusal.ABSOLUTE
    if _DRIVE_RE.match(name) or ":" in name:
        return NameRefusal.DRIVE_LETTER
    if "/" in name or "\\" in name:
        return NameRefusal.PATH_SEPARATOR
    if name in (".", ".."):
        return NameRefusal.DOT_DOT
    if any(unicodedata.category(ch) == "Cf" for ch in name):
        return NameRefusal.FORMAT_CHAR
    if _RESERVED_RE.fullmatch(name.split(".", 1)[0].rstrip(" ")):
        return NameRefusal.RESERVED_DEVICE
    if name.endswith((".", " ")):
        return NameRefusal.TRAILING_DOT_SPACE
    return name


def sanitize_mode(mode: int | None, default: int = 0o644) -> int:
    """Permission bits to apply: never setuid/setgid/sticky, never world-writable."""
    if mode is None:
        return default
    return mode & 0o775

