"""Connection settings: where a command's port, line and Modbus settings come from when its
command line leaves them out.

Contract:

- A command taking connection settings registers them with ``add_connection_options(parser,
  keys)``: ``--profile FILE`` and the list of keys it takes (a subset of
  ``idemlink.protocol.link_profile.PROFILE_KEYS``: port, baudrate, bytesize, parity, stopbits,
  unit, timeout, attempts, modbus_rtu, regmap). Its own options for those keys default to None:
  "not on the command line".
- ``fill_settings(args, environ)`` — run by ``idemlink.cli.Parser`` while the command line is
  parsed, so every parsed namespace is complete — gives each such key a value; the first source
  that has one wins:

  1. the command line;
  2. the environment: ``IDEMLINK_PORT``, ``IDEMLINK_BAUDRATE``, … (``ENV``; empty means unset);
  3. the profile: ``--profile FILE``, else the file ``IDEMLINK_PROFILE`` names;
  4. the ``[link]`` table of the map that 1-3 name (``regmap``);
  5. the defaults (``DEFAULTS``): 115200 Bd, 8N1 — 8E1 with ``--modbus-rtu``, the Modbus
     default —, 0.2 s per answer, 5 attempts, unit 1.

  A ``unit`` from 2-4 applies only when ``modbus_rtu`` or ``modbus_tcp`` is on, from whichever
  source; a unit on the command line without either stays the error it was
  (``idemlink.commands.common.rtu_unit``). ``modbus_rtu`` and ``modbus_tcp`` are one choice (a
  serial line or a TCP connection): both are taken from the first source that gives either, so
  ``--modbus-tcp`` on the command line overrides ``modbus_rtu = true`` in a profile (and the
  other way round). ``--port`` (or ``--ports-file``) and ``--modbus-tcp`` both on the command
  line are a usage error: one would be ignored. A port from 2-4 is simply unused with
  ``--modbus-tcp``.
  ``args.settings_from`` maps each key to where its value came from (``command line``,
  ``IDEMLINK_PORT``, a profile's path, ``pump.toml [link]``, ``default``).
- A bad environment variable is a ``SettingsError`` with ``usage`` (exit 2, as a bad option
  is); a profile or ``[link]`` that cannot be read or holds a bad value, one without (exit 1).
  Each names its source and key; nothing is sent. A command that requires a key (``send``'s and
  ``receive``'s port) and finds it nowhere is a usage error, as before profiles.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from idemlink.protocol.link_profile import (
    PROFILE_KEYS,
    Profile,
    ProfileError,
    check_setting,
    load_profile,
    map_link,
)
from idemlink.protocol.outcome import IdemlinkError

ENV: dict[str, str] = {key: f"IDEMLINK_{key.upper()}" for key in PROFILE_KEYS}
"""The environment variable of each setting: ``IDEMLINK_PORT``, ``IDEMLINK_MODBUS_RTU``..."""
PROFILE_ENV = "IDEMLINK_PROFILE"

DEFAULTS: dict[str, object] = {"port": None, "baudrate": 115200, "bytesize": 8, "stopbits": 1,
                               "timeout": 0.2, "attempts": 5, "modbus_rtu": False, "unit": 1,
                               "regmap": None, "modbus_tcp": None}
"""What a setting is when no source gives it (parity: ``default_parity``)."""

DEVICE_KEYS: tuple[str, ...] = PROFILE_KEYS
"""read, write, faults, clear, trigger, apply, watch."""
LINE_KEYS: tuple[str, ...] = ("baudrate", "bytesize", "parity", "stopbits")


def default_parity(modbus_rtu: bool) -> str:
    """N for an idemlink device; E, the Modbus over serial line default, for a Modbus slave."""
    return "E" if modbus_rtu else "N"


class SettingsError(IdemlinkError):
    """A setting that cannot be used; ``usage``: an environment variable (exit 2)."""

    def __init__(self, message: str, *, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


def add_connection_options(parser: argparse.ArgumentParser, keys: Sequence[str],
                           *, required: Sequence[str] = ()) -> None:
    """``--profile FILE`` and the note that ``keys`` are filled by ``fill_settings``
    (``required``: keys that must come from somewhere, else a usage error)."""
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="a connection profile (TOML or JSON: port, baudrate, bytesize, "
                             f"parity, ...; default: ${PROFILE_ENV}); the command line and "
                             "IDEMLINK_* variables override it (docs/CLI.md)")
    parser.set_defaults(connection_keys=tuple(keys), connection_required=tuple(required))


def _given(args: argparse.Namespace, key: str) -> bool:
    if key == "port" and getattr(args, "ports_file", None) is not None:
        return True
    return getattr(args, key, None) is not None


def _environment(keys: Sequence[str], environ: Mapping[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for key in keys:
        text = environ.get(ENV[key], "")
        if text:
            try:
                values[key] = check_setting(key, text, f"{ENV[key]}={text!r}", text=True)
            except ProfileError as exc:
                raise SettingsError(str(exc), usage=True) from None
    return values


def _profile(args: argparse.Namespace, environ: Mapping[str, str]) -> Profile | None:
    path = getattr(args, "profile", None) or environ.get(PROFILE_ENV) or None
    if path is None:
        return None
    try:
        return load_profile(path)
    except ProfileError as exc:
        via = "" if getattr(args, "profile", None) else f" (named by ${PROFILE_ENV})"
        raise SettingsError(f"{exc}{via}", usage=False) from None


def _map_link(regmap: str | None) -> Profile | None:
    try:
        return map_link(regmap)
    except ProfileError as exc:
        raise SettingsError(str(exc), usage=False) from None


def fill_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Give every connection key of ``args`` its value (see the module docstring)."""
    keys: tuple[str, ...] = args.connection_keys
    sources: dict[str, str] = {k: "command line" for k in keys if _given(args, k)}
    missing = [k for k in keys if k not in sources]
    env = _environment(missing, environ)
    profile = _profile(args, environ)
    layers: list[tuple[str, Mapping[str, object]]] = [
        *((ENV[k], {k: v}) for k, v in env.items()),
        *([(profile.source, profile.values)] if profile is not None else []),
    ]

    def found(key: str) -> tuple[str, object] | None:
        for source, values in layers:
            if key in values:
                return source, values[key]
        return None

    if "regmap" in missing and (hit := found("regmap")) is not None:
        sources["regmap"], args.regmap = hit
    link = _map_link(getattr(args, "regmap", None)) if "regmap" in keys else None
    if link is not None:
        layers.append((link.source, link.values))
    modbus = "modbus_rtu" in keys
    _choose_modbus(args, keys, sources, layers)
    order = sorted(missing, key=lambda k: k != "modbus_rtu")  # parity and unit depend on it
    for key in order:
        if key in sources:
            continue
        hit = found(key)
        if key == "unit" and not ((modbus and args.modbus_rtu)
                                  or getattr(args, "modbus_tcp", None) is not None):
            continue  # a unit is a Modbus setting: it stays as the command line left it
        if hit is None:
            value: object = (default_parity(modbus and bool(args.modbus_rtu))
                             if key == "parity" else DEFAULTS[key])
            hit = ("default", value)
        sources[key], value = hit
        setattr(args, key, value)
        if key == "port" and value is not None:
            args.ports = [value]  # what a command on several ports reads (``many.ports_of``)
    if (sources.get("port") == "command line" and sources.get("modbus_tcp") == "command line"
            and getattr(args, "modbus_tcp", None) is not None):
        raise SettingsError("--port and --modbus-tcp exclude each other: a Modbus TCP device is "
                            "reached at --modbus-tcp HOST[:PORT], a serial one at --port",
                            usage=True)
    for key in getattr(args, "connection_required", ()):
        if getattr(args, key, None) is None:
            raise SettingsError(f"the following arguments are required: --{key} (or "
                                f"{ENV[key]}, or {key} in a --profile)", usage=True)
    args.settings_from = sources


MODBUS_CHOICE = ("modbus_rtu", "modbus_tcp")


def _choose_modbus(args: argparse.Namespace, keys: Sequence[str], sources: dict[str, str],
                   layers: Sequence[tuple[str, Mapping[str, object]]]) -> None:
    """``modbus_rtu`` and ``modbus_tcp`` from the first source that gives either (the command
    line, then ``layers`` in order); the other one is then off, from the same source."""
    pair = [k for k in MODBUS_CHOICE if k in keys]
    if len(pair) < 2:
        return
    given = [k for k in pair if k in sources]
    values: Mapping[str, object]
    if given:
        source, values = "command line", {k: getattr(args, k) for k in given}
    else:
        hit = next(((s, v) for s, v in layers if any(k in v for k in pair)), None)
        if hit is None:
            return
        source, values = hit
    for key in pair:
        if key not in sources:
            setattr(args, key, values.get(key, DEFAULTS[key]))
            sources[key] = source


def describe_sources(args: argparse.Namespace) -> str:
    """``port=/dev/ttyUSB0 (IDEMLINK_PORT), parity=E (bench.toml)``: the settings that came
    from neither the command line nor the defaults, and where they came from (for ``-v``)."""
    sources: dict[str, str] = getattr(args, "settings_from", {})
    return ", ".join(f"{k}={getattr(args, k, None)} ({s})" for k, s in sources.items()
                     if s not in ("command line", "default"))


__all__ = ["DEFAULTS", "DEVICE_KEYS", "ENV", "LINE_KEYS", "PROFILE_ENV", "SettingsError",
           "add_connection_options", "default_parity", "describe_sources", "fill_settings"]
