"""What every ``idemlink`` command prints: the one JSON convention, and progress on stderr.

Contract:

- ``--json`` (``add_json_option``): stdout carries JSON objects only, one per line, each with a
  ``schema`` key naming its kind and version (``"idemlink.read/1"``), keys sorted. ``emit`` prints
  either that object or the command's text lines. The same thing has the same key in every
  schema: ``outcome`` (OK, NOT_EXECUTED, REJECTED, UNKNOWN), ``status``, ``device``, ``port``,
  ``registers`` as a list of ``{"name", "address", "raw", "value", "label", "unit"}``
  (``register_entry``: ``value`` always a number, ``label`` the map's name for it or null).
  Every object goes through ``json_line``: no command prints JSON on stdout any other way.
- An error with ``--json`` (``error_json``) is still one line on stderr, and also one object on
  stdout: ``{"schema": "idemlink.error/1", "command", "message", "exit"}`` plus what the command
  knew when it stopped (``outcome``, ``results``, counts so far...).
- ``Progress``: a tqdm bar when stderr is a terminal; otherwise one line on stderr
  (``idemlink send: a.bin 40960/65536 B (62%)``) every ``IDEMLINK_PROGRESS_SECONDS`` seconds
  (default 5) or every further 10 % once that long has passed since the start — a command shorter
  than that prints no progress line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from idemlink.host.frame_view import register_json
from idemlink.protocol.registers import RegisterSpec

ERROR_SCHEMA = "idemlink.error/1"
PROGRESS_SECONDS_ENV = "IDEMLINK_PROGRESS_SECONDS"
DEFAULT_PROGRESS_SECONDS = 5.0


def add_json_option(parser: argparse.ArgumentParser, schema: str) -> None:
    """``--json``: one JSON object per line on stdout, of schema ``schema`` (docs/CLI.md)."""
    parser.add_argument("--json", action="store_true",
                        help=f"machine-readable output: JSON objects, one per line, schema "
                             f"{schema} (docs/CLI.md)")


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def json_line(schema: str, doc: dict[str, Any]) -> str:
    """One object of ``schema``: ``doc`` with its ``schema`` key, on one line, keys sorted."""
    return json.dumps({**doc, "schema": schema}, sort_keys=True, ensure_ascii=False)


def print_json(schema: str, doc: dict[str, Any], file: TextIO | None = None) -> None:
    print(json_line(schema, doc), file=file if file is not None else sys.stdout, flush=True)


def emit(args: argparse.Namespace, schema: str, doc: dict[str, Any],
         lines: Sequence[str]) -> None:
    """The command's result: the JSON object with ``--json``, else the text lines."""
    if wants_json(args):
        print_json(schema, doc)
    else:
        for line in lines:
            print(line)


def error_json(args: argparse.Namespace, message: str, exit_status: int,
               **known: Any) -> None:
    """With ``--json``: the error as one ``idemlink.error/1`` object on stdout (the caller prints
    its one stderr line)."""
    if wants_json(args):
        print_json(ERROR_SCHEMA, {"command": getattr(args, "command", None), "message": message,
                                  "exit": exit_status, **known})


def register_entry(spec: RegisterSpec, raw: int | None) -> dict[str, Any]:
    """A register's reading as every schema lists it (``register_json``): ``value`` always a number
    (scaled with the map's scale, else the raw word), ``label`` the map's name for it or null,
    ``raw`` the 16-bit word, ``unit`` the map's (``""`` without one). ``raw`` None (a read that
    got no value): ``raw``, ``value`` and ``label`` null."""
    if raw is None:
        return {"name": spec.name, "address": spec.address, "raw": None, "value": None,
                "label": None, "unit": spec.unit}
    return register_json(spec, spec.address, raw)


def progress_seconds() -> float:
    """The non-terminal progress period (``IDEMLINK_PROGRESS_SECONDS``, default 5 s)."""
    try:
        value = float(os.environ.get(PROGRESS_SECONDS_ENV, DEFAULT_PROGRESS_SECONDS))
    except ValueError:
        return DEFAULT_PROGRESS_SECONDS
    return value if value >= 0 else DEFAULT_PROGRESS_SECONDS


class Progress:
    """Progress of one long command on stderr: tqdm on a terminal, periodic lines elsewhere.

    ``update(done, total, label)`` reports the absolute amount done (of the item ``label``, e.g.
    a file name: a new label starts a new bar). Disabled, it prints nothing."""

    def __init__(self, command: str, unit: str, *, enabled: bool = True,
                 stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.command = command
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and _isatty(self.stream)
        self.clock = clock
        self.period = progress_seconds()
        self._bar: Any = None
        self.label: str | None = None
        self._start = clock()
        self._last_line = self._start
        self._last_fraction = 0.0
        self.done = 0
        self.total: int | None = None
        self.items = 0  #: labels seen so far (files started)

    def update(self, done: int, total: int | None = None, label: str | None = None) -> None:
        if label != self.label:
            self._close_bar()
            self.label = label
            self.items += 1
            self._last_fraction = 0.0
        self.done, self.total = done, total
        if not self.enabled:
            return
        if self.tty:
            self._tqdm(done, total, label)
            return
        now = self.clock()
        if now - self._start < self.period:
            return
        fraction = done / total if total else 0.0
        if now - self._last_line >= self.period or fraction - self._last_fraction >= 0.1:
            self._last_line, self._last_fraction = now, fraction
            # one write: a Ctrl-C between the text and its newline would glue the next line on
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def update_item(self, label: str, done: int, total: int | None) -> None:
        """``update`` in the shape of a YMODEM progress callback ``(name, done, size)``."""
        self.update(done, total, label)

    def line(self) -> str:
        """``idemlink send: a.bin 40960/65536 B (62%)``: what is done so far."""
        head = f"idemlink {self.command}: " + (f"{self.label} " if self.label else "")
        if self.total:
            return (f"{head}{self.done}/{self.total} {self.unit} "
                    f"({100 * self.done // self.total}%)")
        return f"{head}{self.done} {self.unit}"

    def _tqdm(self, done: int, total: int | None, label: str | None) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label or self.command, unit=self.unit,
                             unit_scale=self.unit == "B", leave=True, file=self.stream)
        self._bar.update(done - self._bar.n)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        self._close_bar()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
