"""The ``idemlink`` command line.

Exit status (documented in the README, one per outcome class):

====  =============================================================
0     OK
1     usage or local error (no such port, unknown register, bad value)
2     argparse usage error
3     NOT_EXECUTED (definitely did not run: guard failed, conflict)
4     REJECTED (the request is invalid; retrying cannot help)
5     UNKNOWN (may have run: reconcile before anything else)
6     drift or check failure (``contract --check``, soak oracle)
====  =============================================================

User mistakes print one line on stderr, never a traceback; with ``--json`` that error is also one
``idemlink.error/1`` object on stdout (``idemlink.output``), usage errors (exit 2) included. Ctrl-C
ends every command with exit 130 and one line on stderr saying what happened (the command's own
line when it has one, else ``idemlink CMD: interrupted``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from idemlink.commands import COMMAND_MODULES
from idemlink.protocol.outcome import IdemlinkError

if TYPE_CHECKING:
    from idemlink.protocol.registers import RegisterMap

EXIT_OK = 0
EXIT_LOCAL_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_EXECUTED = 3
EXIT_REJECTED = 4
EXIT_UNKNOWN = 5
EXIT_CHECK_FAILED = 6
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer killed by SIGPIPE


class UserError(IdemlinkError):
    """A mistake of the user's (bad port, unknown register...): printed as one line, exit 1."""


Handler = Callable[[argparse.Namespace], int]


def add_regmap_option(parser: argparse.ArgumentParser) -> None:
    """``--regmap FILE``: the device's register map (default: the built-in thermal controller)."""
    parser.add_argument(
        "--regmap", metavar="FILE", default=None,
        help="the device's register map file (TOML or JSON, see docs/REGMAP.md) or a built-in "
             "map's name; default: the built-in thermal-controller")


def baud_rate(text: str) -> int:
    """A baud rate: an integer in 1..20,000,000 (0 would hang up a real line, B0): the rule of
    ``idemlink.protocol.link_profile.parse_baudrate``, as an argparse type."""
    from idemlink.protocol.link_profile import ProfileError, parse_baudrate

    try:
        return parse_baudrate(text)
    except ProfileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_baudrate_option(parser: argparse.ArgumentParser, default: int | None = 115200,
                        text: str = "baud rate (default 115200)") -> None:
    """``--baudrate N``, the spelling of every command (``--baud`` kept as a hidden alias)."""
    parser.add_argument("--baudrate", type=baud_rate, default=default, metavar="N", help=text)
    add_hidden_alias(parser, "--baud", "baudrate", baud_rate)


def _format_field(name: str) -> Callable[[str], Any]:
    """An argparse type for one character-format field (``idemlink.protocol.char_format``)."""
    from idemlink.protocol import char_format

    parse: Callable[[object], Any] = getattr(char_format, f"parse_{name}")

    def kind(text: str) -> Any:
        try:
            return parse(text)
        except char_format.CharFormatError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    kind.__name__ = name
    return kind


def add_char_format_options(parser: argparse.ArgumentParser, *, modbus: bool = False,
                            default: bool = False) -> None:
    """``--bytesize``, ``--parity``, ``--stopbits``: the line's character format. ``default``:
    8N1 filled in here (a command without connection settings); otherwise left None for
    ``idemlink.commands.connection`` (8N1, or 8E1 with ``--modbus-rtu`` when ``modbus``)."""
    parity = "N; E with --modbus-rtu, the Modbus default" if modbus else "N"
    parser.add_argument("--bytesize", type=_format_field("bytesize"),
                        default=8 if default else None, metavar="{5,6,7,8}",
                        help="data bits per character (default 8)")
    parser.add_argument("--parity", type=_format_field("parity"),
                        default="N" if default else None, metavar="{N,E,O,M,S}",
                        help=f"parity: none, even, odd, mark, space (default {parity})")
    parser.add_argument("--stopbits", type=_format_field("stopbits"),
                        default=1 if default else None, metavar="{1,1.5,2}",
                        help="stop bits (default 1)")


def add_hidden_alias(parser: argparse.ArgumentParser, alias: str, dest: str,
                     kind: Callable[[str], Any]) -> None:
    """``alias`` sets ``dest`` like the documented option but is left out of ``--help`` (an older
    spelling kept working)."""
    parser.add_argument(alias, dest=dest, type=kind, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)


def add_frame_fault_options(parser: argparse.ArgumentParser, *, loss: float, dup: float,
                           corrupt: float) -> None:
    """``--frame-loss/--frame-dup/--frame-corrupt`` (per frame, each direction; into ``loss``,
    ``dup``, ``corrupt``) with these defaults, and the spelling before the unit was named
    (``--loss/--dup/--corrupt``) as hidden aliases: the fault options of ``demo`` and ``soak``."""
    for name, default, what in (("loss", loss, "is lost"), ("dup", dup, "is duplicated"),
                                ("corrupt", corrupt, "gets a bit flip")):
        parser.add_argument(f"--frame-{name}", dest=name, type=float, default=default,
                            metavar="P", help=f"probability that a frame {what}, per frame, "
                                              f"each direction (default {default:g})")
    for old in ("loss", "dup", "corrupt"):
        add_hidden_alias(parser, f"--{old}", old, float)


def regmap_from(args: argparse.Namespace) -> RegisterMap:
    """The map ``--regmap`` names; a map file that cannot be loaded is one UserError line."""
    from idemlink.protocol.regmap_file import RegmapFileError, resolve_regmap

    try:
        return resolve_regmap(getattr(args, "regmap", None))
    except RegmapFileError as exc:
        raise UserError(str(exc)) from None


LOG_LEVELS = ("debug", "info", "warning", "error")


def _add_logging_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``-v``/``-vv`` and ``--log-level``, accepted before or after the command name (the
    command's copy does not override what was given before it)."""
    keep = argparse.SUPPRESS
    parser.add_argument("-v", "--verbose", action="count", default=0 if top else keep,
                        help="log to stderr: -v progress (INFO), -vv every frame (DEBUG)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None if top else keep,
                        help="log level on stderr (overrides -v)")


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage error is one line on stderr, ``idemlink write: error:
    MESSAGE (usage: idemlink write --help)``, exit 2 — and also an ``idemlink.error/1`` object
    on stdout when the command line asks for ``--json``.

    A command that takes connection settings (``idemlink.commands.connection``) gets the ones
    its command line left out from the environment, a profile, its map's ``[link]`` and the
    defaults while it is parsed, so every parsed namespace is complete: a bad environment
    variable is a usage error (exit 2), a bad profile or ``[link]`` one line and exit 1."""

    json_errors = False

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if getattr(ns, "connection_keys", None) and not getattr(ns, "connection_filled", False):
            from idemlink.commands.connection import SettingsError, fill_settings

            ns.connection_filled = True
            try:
                fill_settings(ns, os.environ)
            except SettingsError as exc:
                if exc.usage:
                    self.error(str(exc))
                self._refuse(str(exc))
        return ns, extras

    def _refuse(self, message: str) -> None:
        """A local error found while parsing (a bad profile): one line, exit 1."""
        if Parser.json_errors:
            from idemlink.output import ERROR_SCHEMA, print_json

            print_json(ERROR_SCHEMA, {"command": self._command(), "message": message,
                                      "exit": EXIT_LOCAL_ERROR})
        self.exit(EXIT_LOCAL_ERROR, f"{self.prog}: {message}\n")

    def _command(self) -> str | None:
        return self.prog.split()[1] if len(self.prog.split()) > 1 else None

    def error(self, message: str) -> Any:
        message = " ".join(message.split())  # argparse's own messages may span lines
        if Parser.json_errors:
            from idemlink.output import ERROR_SCHEMA, print_json

            print_json(ERROR_SCHEMA, {"command": self._command(), "message": message,
                                      "exit": EXIT_USAGE})
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


VERSION_SCHEMA = "idemlink.version/1"


class VersionAction(argparse.Action):
    """``idemlink --version``: ``idemlink X.Y.Z``, or with ``--json`` anywhere on the command line
    ``{"schema": "idemlink.version/1", "version": "X.Y.Z"}``; exit 0. A top-level option: a
    command's options do not include it."""

    def __init__(self, option_strings: Sequence[str], version: str = "",
                 dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)
        self.version = version

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        # "": looked up when asked for (the package metadata scan would cost every start)
        version = self.version or str(importlib.import_module("idemlink").__version__)
        if Parser.json_errors:
            from idemlink.output import print_json

            print_json(VERSION_SCHEMA, {"version": version})
        else:
            print(f"idemlink {version}", flush=True)
        parser.exit(EXIT_OK)


def command_named(words: Sequence[str]) -> str | None:
    """The command a command line names, when it can be told without parsing: the first word
    that is not a top-level option (nor ``--log-level``'s value). None when there is none, when
    it is no known command, or when ``-h``/``--help`` comes first (the overview lists them all)."""
    from idemlink.commands import COMMAND_NAMES

    words = list(words)
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-h", "--help") or word == "--":
            return None
        if word == "--log-level":
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        return word if word in COMMAND_NAMES else None
    return None


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given a command line (``words``) that names a command, a
    parser of that command only, so only its module is imported (a CLI child starts faster).
    Both parse that command line the same way. Every command opens idemlink's own pyserial URLs
    (``faulty://``): importing ``idemlink.device_sim`` registers them."""
    import idemlink.device_sim  # noqa: F401  (registers faulty:// with pyserial)

    parser = Parser(
        prog="idemlink",
        description="idemlink: a serial protocol stack where retries are harmless.",
    )
    parser.add_argument("--version", action=VersionAction,
                        help="print idemlink's version and exit (with --json: one "
                             "idemlink.version/1 object); before the command name only")
    _add_logging_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    named = command_named(words) if words is not None else None
    if named is not None:
        from idemlink.commands import COMMAND_NAMES

        modules: Sequence[str] = [COMMAND_NAMES[named]]
    else:
        modules = COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(sub)
    for command in sub.choices.values():
        _add_logging_options(command, top=False)
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    return parser


def configure_logging(args: argparse.Namespace) -> None:
    """Logging on stderr as the options ask; silent (warnings only) by default."""
    import logging

    level_name: str | None = getattr(args, "log_level", None)
    verbose: int = getattr(args, "verbose", 0)
    if level_name is not None:
        level = getattr(logging, level_name.upper())
    else:
        level = (logging.WARNING, logging.INFO)[verbose] if verbose < 2 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")


EXIT_INTERRUPTED = 130


def mark_reported(exc: BaseException) -> BaseException:
    """Note that the command already printed its line about this interrupt (``main`` then adds
    none)."""
    exc.idemlink_reported = True  # type: ignore[attr-defined]
    return exc


def main(argv: Sequence[str] | None = None) -> int:
    from idemlink.output import error_json

    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["--gateway"]:  # `idemlink --gateway URL read ...`: through a gateway
        from idemlink.commands.gateway_call_cmd import rewrite

        words = rewrite(words)
    Parser.json_errors = "--json" in words
    try:
        parser = build_parser(words)  # imports the command's module(s): Ctrl-C may land here
    except KeyboardInterrupt:
        from idemlink.console import STARTUP_INTERRUPTED, STARTUP_INTERRUPTED_JSON

        print(STARTUP_INTERRUPTED, file=sys.stderr)
        if Parser.json_errors:
            print(STARTUP_INTERRUPTED_JSON, flush=True)
        return EXIT_INTERRUPTED
    args, extras = parser.parse_known_args(words)
    if extras:  # name the command's own usage, not the top-level one
        command = _subparser(parser, args.command)
        hint = "; --version goes before the command: idemlink --version" if (
            "--version" in extras) else ""
        command.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    configure_logging(args)
    handler: Handler = args.handler
    try:
        return handler(args)
    except UserError as exc:
        print(f"idemlink {args.command}: {exc}", file=sys.stderr)
        error_json(args, str(exc), EXIT_LOCAL_ERROR)
        return EXIT_LOCAL_ERROR
    except KeyboardInterrupt as exc:
        if not getattr(exc, "idemlink_reported", False):
            print(f"idemlink {args.command}: interrupted", file=sys.stderr)
            error_json(args, "interrupted", EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): say nothing more, and keep Python's shutdown flush
        # from raising again on the dead stdout.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
