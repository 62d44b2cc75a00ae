"""Connection profiles: the settings a command would otherwise repeat on every command line.

Contract:

- ``PROFILE_KEYS``: ``port``, ``baudrate``, ``bytesize``, ``parity``, ``stopbits``, ``unit``,
  ``timeout``, ``attempts``, ``modbus_rtu``, ``regmap``, ``modbus_tcp`` (``HOST[:PORT]``,
  ``idemlink.protocol.modbus_tcp.parse_tcp_address``'s rule). ``check_setting(key, value, source)`` is
  the one rule per key (a value as TOML/JSON types it, or as text from an environment variable:
  ``"19200"``, ``"e"``, ``"yes"``) and returns it typed; anything else is one ``ProfileError``
  line naming where it came from and the key: ``bench.toml: parity: 'X': one of N (none), ...``.
- ``load_profile(path)``: a profile file — TOML (JSON when the name ends in ``.json``) holding
  some of those keys at the top level and nothing else. A relative ``regmap`` path is taken
  relative to the profile's directory (the two files travel together).
- ``map_link(ref)``: the ``[link]`` table (a JSON map's ``"link"`` object) of the map file
  ``ref`` names as ``resolve_regmap`` reads it: the same keys but ``regmap`` (the map is the file
  itself), or None for no map, a built-in map's name, a file without one, or one that cannot be
  read or parsed (the map loader, ``idemlink.protocol.regmap_file``, then says why). A
  map's link is not part of its register contract: it changes neither the map nor its hash.
- Files are read through ``read_regular_file`` (a regular file of at most ``MAX_FILE_BYTES``)
  and parsed by ``idemlink.protocol.long_integers`` (an integer too long to convert is named
  where it is, as in a map).

Which source wins (command line, environment, profile, map, default) is the command line's
business (``idemlink.commands.connection``); this module only reads and checks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from idemlink.protocol.char_format import (
    CharFormatError,
    parse_bytesize,
    parse_parity,
    parse_stopbits,
)
from idemlink.protocol.long_integers import LongIntegerError, load_json, load_toml
from idemlink.protocol.modbus_tcp import TcpAddressError, parse_tcp_address
from idemlink.protocol.outcome import LocalProtocolError
from idemlink.protocol.regmap_file import BUILTIN_MAPS
from idemlink.protocol.regular_file import FileRefused, read_regular_file

MAX_FILE_BYTES = 1 << 20
MAX_BAUDRATE = 20_000_000
"""Highest baud rate taken (0 would hang up a real line: B0)."""
MAX_TIMEOUT = 60.0
"""Upper bound of the wait for each answer (seconds): beyond it a lost answer looks like a hang."""

PROFILE_KEYS: tuple[str, ...] = ("port", "baudrate", "bytesize", "parity", "stopbits", "unit",
                                 "timeout", "attempts", "modbus_rtu", "regmap", "modbus_tcp")
MAP_LINK_KEYS: tuple[str, ...] = tuple(k for k in PROFILE_KEYS if k != "regmap")


class ProfileError(LocalProtocolError, ValueError):
    """A profile, a map's ``[link]`` or an environment variable holding a bad setting."""


def _int(value: object, *, text: bool) -> int | None:
    if type(value) is int:
        return value
    if text and isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            return None
    return None


def _number(value: object, *, text: bool) -> float | None:
    if type(value) in (int, float):
        return float(value)  # type: ignore[arg-type]
    if text and isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def parse_baudrate(value: object, *, text: bool = True) -> int:
    """A baud rate: an integer in 1..``MAX_BAUDRATE``."""
    n = _int(value, text=text)
    if n is None:
        raise ProfileError(f"{value!r} is not an integer")
    if not 1 <= n <= MAX_BAUDRATE:
        raise ProfileError(f"{n} outside 1..{MAX_BAUDRATE}")
    return n


def _unit(value: object, *, text: bool) -> int:
    n = _int(value, text=text)
    if n is None or not 1 <= n <= 247:
        raise ProfileError(f"{value!r}: a Modbus unit id is 1..247 (broadcast, 0, gets no answer)")
    return n


def _timeout(value: object, *, text: bool) -> float:
    n = _number(value, text=text)
    if n is None or not (math.isfinite(n) and 0 < n <= MAX_TIMEOUT):
        raise ProfileError(f"{value!r}: expected seconds, > 0 and <= {MAX_TIMEOUT:g}")
    return n


def _attempts(value: object, *, text: bool) -> int:
    n = _int(value, text=text)
    if n is None or n < 1:
        raise ProfileError(f"{value!r}: sends per command, an integer >= 1")
    return n


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(value: object, *, text: bool) -> bool:
    if type(value) is bool:
        return value
    if text and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ProfileError(f"{value!r}: true or false" + (" (1/0, yes/no, on/off)" if text else ""))


def _path(value: object, *, text: bool) -> str:
    if (not isinstance(value, str) or not value.strip() or len(value) > 4096
            or any(ord(c) < 32 for c in value)):
        raise ProfileError(f"{value!r}: need a non-empty path or name")
    return value


def _format_field(parse: Callable[[object], object]) -> Callable[..., object]:
    """A character-format field (``idemlink.protocol.char_format``'s rule); a number typed as
    text in a file is refused, as for every other number."""

    def check(value: object, *, text: bool) -> object:
        if not text and isinstance(value, str) and parse is not parse_parity:
            raise ProfileError(f"{value!r} is not a number")
        try:
            return parse(value)
        except CharFormatError as exc:  # "parity 'X': why" -> "'X': why"
            raise ProfileError(f"{value!r}: {str(exc).split(': ', 1)[-1]}") from None

    return check


def _tcp_address(value: object, *, text: bool) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"{value!r}: need HOST[:PORT]")
    try:
        parse_tcp_address(value)
    except TcpAddressError as exc:
        raise ProfileError(str(exc)) from None
    return value.strip()


_CHECKS: dict[str, Callable[..., object]] = {
    "port": _path,
    "baudrate": parse_baudrate,
    "bytesize": _format_field(parse_bytesize),
    "parity": _format_field(parse_parity),
    "stopbits": _format_field(parse_stopbits),
    "unit": _unit,
    "timeout": _timeout,
    "attempts": _attempts,
    "modbus_rtu": _flag,
    "regmap": _path,
    "modbus_tcp": _tcp_address,
}


def check_setting(key: str, value: object, source: str, *, text: bool = False) -> object:
    """``value`` for ``key`` checked and typed (``text``: given as text, an environment
    variable's); ``ProfileError`` naming ``source`` and the key otherwise."""
    if key not in _CHECKS:
        raise ProfileError(f"{source}: no setting {key!r}; settings are {', '.join(PROFILE_KEYS)}")
    try:
        return _CHECKS[key](value, text=text)
    except ProfileError as exc:
        raise ProfileError(f"{source}: {key}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Profile:
    """Checked settings (``values``, by key) and where they came from (``source``, for
    messages: a file, ``pump.toml [link]``)."""

    source: str
    values: Mapping[str, object] = field(default_factory=dict)


def _document(path: Path, what: str) -> dict[str, object]:
    """The parsed TOML/JSON document in ``path`` (``.json``: JSON)."""
    try:
        data = read_regular_file(path, MAX_FILE_BYTES, follow_symlinks=True)
    except FileRefused as exc:
        raise ProfileError(f"{path}: {exc.kind or exc.problem.value}; a {what} is a regular file "
                           f"of at most {MAX_FILE_BYTES} bytes") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    fmt = "json" if path.suffix.lower() == ".json" else "toml"
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
        doc: object = load_json(text) if fmt == "json" else load_toml(text)
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not UTF-8 text") from None
    except LongIntegerError as exc:  # named where it is, not Python's conversion-limit advice
        raise ProfileError(f"{path}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError and JSONDecodeError included
        raise ProfileError(f"{path}: not valid {fmt.upper()}: {exc}") from None
    if not isinstance(doc, dict):
        raise ProfileError(f"{path}: need a table of settings ({', '.join(PROFILE_KEYS)})")
    return doc


def _checked(table: Mapping[str, object], source: str, keys: tuple[str, ...]) -> dict[str, object]:
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise ProfileError(f"{source}: unknown setting(s) {unknown}; settings are "
                           f"{', '.join(keys)}")
    return {k: check_setting(k, v, source) for k, v in table.items()}


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """A profile file's settings (see the module docstring)."""
    p = Path(path)
    values = _checked(_document(p, "profile"), str(p), PROFILE_KEYS)
    regmap = values.get("regmap")
    if isinstance(regmap, str) and not Path(regmap).is_absolute():
        beside = p.parent / regmap
        # a built-in map's name stays a name, unless a file of that name sits beside the profile
        if regmap not in BUILTIN_MAPS or beside.exists():
            values["regmap"] = str(beside)
    return Profile(str(p), values)


def map_link(ref: str | os.PathLike[str] | None) -> Profile | None:
    """The ``[link]`` table of the map ``ref`` names, checked (see the module docstring)."""
    if ref is None or (isinstance(ref, str) and ref in BUILTIN_MAPS and not Path(ref).exists()):
        return None
    p = Path(ref)
    try:
        doc = _document(p, "map file")
    except ProfileError:
        return None
    table = doc.get("link")
    if table is None:
        return None
    source = f"{p} [link]"
    if not isinstance(table, dict):
        raise ProfileError(f"{source}: need a table of settings ({', '.join(MAP_LINK_KEYS)})")
    if "regmap" in table:
        raise ProfileError(f"{source}: regmap: a map's link cannot name a map (it is this one)")
    return Profile(source, _checked(table, source, MAP_LINK_KEYS))


__all__ = ["MAP_LINK_KEYS", "MAX_BAUDRATE", "MAX_TIMEOUT", "PROFILE_KEYS",
           "Profile", "ProfileError", "check_setting", "load_profile", "map_link",
           "parse_baudrate"]
