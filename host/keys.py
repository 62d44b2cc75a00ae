"""Idempotency keys derived from content: UUIDv5, one namespace per source, length-prefixed fields.

Contract. A key names *a piece of work* by what it is, not by when it was asked for, so
that a restarted job computes the same key for the same step and its receipt journal can tell
"already done" from "not yet done".

- One namespace per ``KeySource`` (a job kind such as ``plan-step`` or ``file-send``): the same
  fields under two sources never give the same key. The namespace of source ``s`` is
  ``uuid5(NAMESPACE_URL, "urn:idemlink:key-source:" + s)``; the values are frozen in ``KeySource``.
- The UUIDv5 *name* is the concatenation of the fields, each encoded as::

      tag (1 byte) | length (4 bytes, unsigned big-endian) | payload (length bytes)

  tag ``b"B"``: bytes, payload as is; tag ``b"S"``: str, payload UTF-8 (strict; lone surrogates
  are refused); tag ``b"I"``: int, payload two's-complement big-endian, signed,
  ``n.bit_length() // 8 + 1`` bytes. ``bool`` is refused (an int by accident, not by intent).
  The layout is a prefix code: the name decodes back to exactly one typed tuple, so
  ``("ab", "c")`` and ``("a", "bc")`` differ, and so do ``"1"``, ``b"1"`` and ``1``.
- The key is ``UUID(bytes=SHA-1(namespace.bytes + name)[:16], version=5)`` - RFC 4122 §4.3, exactly
  what ``uuid.uuid5`` computes for a ``str`` name, extended to arbitrary bytes.
- This byte layout is frozen: other systems de-duplicate on these keys, so a "harmless" refactor
  would break reconciliation. A new layout gets a new source name (e.g. ``plan-step/2``).

``new_key(now)`` is the other kind: a UUIDv7 (RFC 9562) naming *one call* by when it was asked
for — its first 48 bits are ``now`` in Unix milliseconds, the rest random — the key a gateway
call carries in its ``KEY_HEADER`` (docs/GATEWAY.md, "The call layer"): made once per call and
sent again on every retry of it.

``parse_key`` is the strict reader of keys written as text (the receipt journal's ids): canonical
lower-case hyphenated form only.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from enum import Enum

from idemlink.protocol.outcome import LocalProtocolError

__all__ = [
    "FIELD_LENGTH_BYTES",
    "KEY_HEADER",
    "KeyFieldError",
    "KeySource",
    "MalformedKeyError",
    "encode_fields",
    "format_key",
    "new_key",
    "parse_key",
    "source_namespace",
    "step_key",
]

#: Width of each field's length prefix (unsigned big-endian).
FIELD_LENGTH_BYTES = 4
_MAX_FIELD_LENGTH = (1 << (8 * FIELD_LENGTH_BYTES)) - 1

TAG_BYTES = b"B"
TAG_STR = b"S"
TAG_INT = b"I"

_NAMESPACE_PREFIX = "urn:idemlink:key-source:"

_CANONICAL_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

Field = bytes | str | int


class KeyFieldError(LocalProtocolError, TypeError):
    """A field cannot be part of a key (wrong type, bool, unencodable str, too long)."""


class MalformedKeyError(LocalProtocolError, ValueError):
    """Text that is not a key in canonical form (lower-case hyphenated UUID, 36 characters)."""


class KeySource(Enum):
    """Where a key comes from. Each source has its own frozen UUIDv5 namespace.

    The value is the source name; ``namespace`` is ``uuid5(NAMESPACE_URL,
    "urn:idemlink:key-source:<name>")``, written out so that it can never drift.
    """

    PLAN_STEP = "plan-step"  #: one register write of an ``idemlink apply PLAN.json`` plan
    FILE_SEND = "file-send"  #: one file of an ``idemlink send FILE...`` batch

    @property
    def namespace(self) -> uuid.UUID:
        return _NAMESPACES[self]


_NAMESPACES: dict[KeySource, uuid.UUID] = {
    KeySource.PLAN_STEP: uuid.UUID("b3dedddc-c5dd-5803-801e-ac62c1d708a2"),
    KeySource.FILE_SEND: uuid.UUID("1787f46d-04c5-5dc2-bc8f-c0c45b8e07d5"),
}


def source_namespace(source: KeySource) -> uuid.UUID:
    """The frozen namespace UUID of ``source``."""
    return _NAMESPACES[source]


def _encode_field(field: object) -> bytes:
    if isinstance(field, bool):
        raise KeyFieldError("a bool is not a key field (use 0/1 or a str if that is meant)")
    if isinstance(field, bytes):
        tag, payload = TAG_BYTES, field
    elif isinstance(field, str):
        try:
            payload = field.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise KeyFieldError(f"str field is not encodable as UTF-8: {exc}") from exc
        tag = TAG_STR
    elif isinstance(field, int):
        tag = TAG_INT
        payload = field.to_bytes(field.bit_length() // 8 + 1, "big", signed=True)
    else:
        raise KeyFieldError(f"key fields are bytes, str or int, not {type(field).__name__}")
    if len(payload) > _MAX_FIELD_LENGTH:
        raise KeyFieldError(f"field of {len(payload)} bytes exceeds {_MAX_FIELD_LENGTH}")
    return tag + len(payload).to_bytes(FIELD_LENGTH_BYTES, "big") + payload


def encode_fields(*fields: Field) -> bytes:
    """The UUIDv5 name for ``fields``: the documented tag/length/payload layout, concatenated."""
    return b"".join(_encode_field(f) for f in fields)


def step_key(source: KeySource, *fields: Field) -> uuid.UUID:
    """The idempotency key of the work described by ``fields`` under ``source``.

    Raises ``KeyFieldError`` for a field that is not bytes/str/int (or is a bool).
    """
    if not isinstance(source, KeySource):
        raise KeyFieldError(f"source must be a KeySource, not {type(source).__name__}")
    digest = hashlib.sha1(source.namespace.bytes + encode_fields(*fields)).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def format_key(key: uuid.UUID) -> str:
    """The canonical text of a key (what the journal stores)."""
    return str(key)


def parse_key(text: object) -> uuid.UUID:
    """Parse a key written in canonical form; anything else raises ``MalformedKeyError``.

    Canonical means exactly 36 characters, lower-case hex, hyphens at 8-4-4-4-12: no braces, no
    ``urn:uuid:`` prefix, no upper case, no surrounding whitespace.
    """
    if not isinstance(text, str):
        raise MalformedKeyError(f"a key is a str, not {type(text).__name__}")
    if _CANONICAL_KEY.fullmatch(text) is None:
        raise MalformedKeyError(f"not a canonical lower-case hyphenated UUID: {text[:60]!r}")
    return uuid.UUID(text)


KEY_HEADER = "Idempotency-Key"
"""The HTTP header a call's key travels in (the IETF httpapi draft's name)."""


def new_key(now: float) -> str:
    """A fresh UUIDv7 for ``now`` (Unix seconds): a call's key, made once and reused on its
    retries."""
    ms = int(now * 1000) & ((1 << 48) - 1)
    rand = secrets.randbits(74)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))
