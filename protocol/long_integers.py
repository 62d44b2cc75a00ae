"""Integers too long to convert in a file a person wrote: the file's fault, named, not Python's.

CPython refuses to turn a decimal string of more than ``sys.get_int_max_str_digits()`` digits
(4300 by default) into an ``int`` and says to call ``sys.set_int_max_str_digits()``: advice for a
programmer, useless to whoever wrote the map, plan or configuration. Every reader of such a file
that parses integers (``json``, ``tomllib``) goes through here instead, so the refusal says where
the integer is and what is wrong with it, in one line. One rule: an integer in these files has at
most ``max_digits()`` digits (4300, less if the process set a lower limit), whatever the process
allows.

- ``load_json(text, **kwargs)``: ``json.loads`` that raises ``LongIntegerError`` naming the
  field (``registers[0].address: integer too long (5000 digits, more than 4300)``).
- ``json_int``: the ``parse_int`` hook itself, for a reader whose own field checks should refuse
  the value (a ``TooLong``, not an ``int``: "not an integer 0..65535" names the field already).
- ``load_toml(text)``: ``tomllib.loads`` that raises ``LongIntegerError`` naming the line and key
  (``line 3: address: integer too long ...``); ``tomllib`` has no hook, so the integer is found
  in the text after the conversion failed.
- ``unique_keys``: the ``object_pairs_hook`` that refuses a key given twice in one JSON object
  (``json`` would silently keep the last): ``DuplicateKeyError`` naming the field.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass
from typing import Any

from idemlink.protocol.outcome import IdemlinkError

DEFAULT_MAX_DIGITS = 4300  #: CPython's default limit (``sys.get_int_max_str_digits``)


def max_digits() -> int:
    """The most digits an integer in a user's file may have: 4300, or the process's lower limit."""
    limit = sys.get_int_max_str_digits()
    return min(limit, DEFAULT_MAX_DIGITS) if limit else DEFAULT_MAX_DIGITS


class LongIntegerError(IdemlinkError, ValueError):
    """A file holds an integer with more digits than ``max_digits()``; the message says where."""


class DuplicateKeyError(IdemlinkError, ValueError):
    """A JSON object of a file a person wrote gives one key twice; the message names it."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, or ``DuplicateKeyError`` for a key
    given twice (``json`` alone would keep the last one without a word)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"field {key!r} is given twice in one object")
        out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class TooLong:
    """What ``json_int`` makes of an integer too long to convert: its digit count (None: not
    counted, an ``int`` a parser built anyway), no value."""

    digits: int | None

    def __str__(self) -> str:
        if self.digits is None:
            return f"integer too long (more than {max_digits()} digits)"
        return f"integer too long ({self.digits} digits, more than {max_digits()})"

    __repr__ = __str__


def json_int(text: str) -> int | TooLong:
    """``json.loads``'s ``parse_int``: the integer, or ``TooLong`` past ``max_digits()``."""
    digits = len(text) - text.startswith("-")
    if digits > max_digits():
        return TooLong(digits)
    return int(text)


def _too_long(doc: object) -> tuple[str, TooLong] | None:
    """The first ``TooLong`` (or ``int`` of more than ``max_digits()`` digits, which a parser
    built where the process allows it) in a decoded document and where it is (``a.b[2]``);
    iterative, so a document nested as deep as the parser allows is walked too."""
    bound = 10 ** max_digits()
    stack: list[tuple[str, object]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, TooLong):
            return path, value
        if type(value) is int and abs(value) >= bound:
            return path, TooLong(None)
        if isinstance(value, dict):
            stack.extend(reversed([(f"{path}.{k}" if path else str(k), v)
                                   for k, v in value.items()]))
        elif isinstance(value, list):
            stack.extend(reversed([(f"{path}[{i}]", v) for i, v in enumerate(value)]))
    return None


def load_json(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads(text, **kwargs)``; an integer too long is ``LongIntegerError`` naming its
    field (any other problem raises what ``json.loads`` raises)."""
    doc = json.loads(text, parse_int=json_int, **kwargs)
    _refuse_too_long(doc)
    return doc


_DECIMAL = re.compile(r"(?<![\w.])[+-]?[0-9](?:_?[0-9])*(?![\w.:])")
#: the last key assigned before a number on its line (``key = N``, ``key = [1, N``)
_KEY_BEFORE = re.compile(r"""([A-Za-z0-9_-]+|"[^"]*"|'[^']*')\s*=[^=]*$""")


def _locate_in_toml(text: str) -> str | None:
    """``line N: KEY`` of the first decimal integer with more than ``max_digits()`` digits."""
    limit = max_digits()
    for number, line in enumerate(text.splitlines(), 1):
        for m in _DECIMAL.finditer(line):
            digits = sum(c.isdigit() for c in m.group())
            if digits > limit:
                key = _KEY_BEFORE.search(line[:m.start()])
                name = f"{key.group(1).strip(chr(34) + chr(39))}: " if key else ""
                return f"line {number}: {name}{TooLong(digits)}"
    return None


def load_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``; an integer too long is ``LongIntegerError`` naming its line and
    key (any other problem raises what ``tomllib.loads`` raises)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:
        where = _locate_in_toml(text)
        if where is None:
            raise
        raise LongIntegerError(where) from None
    _refuse_too_long(doc)  # the process converts longer integers: the rule still holds
    return doc


def _refuse_too_long(doc: object) -> None:
    found = _too_long(doc)
    if found is not None:
        where, value = found
        raise LongIntegerError(f"{where or 'the document'}: {value}")


__all__ = ["DEFAULT_MAX_DIGITS", "DuplicateKeyError", "LongIntegerError", "TooLong", "json_int", "load_json",
           "load_toml", "max_digits", "unique_keys"]
