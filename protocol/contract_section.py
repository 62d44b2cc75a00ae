"""The shape of one piece of the single-source contract.

Each declaration module (frames, status codes, the de-duplication window, the register map, ...)
exposes ``contract_section() -> ContractSection``. ``idemlink.protocol.contract`` collects the sections in a
fixed order and renders the C header, docs/PROTOCOL.md and the contract hash from them, so a
constant is written exactly once, in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any


@dataclass(frozen=True, slots=True)
class CDefine:
    """``#define NAME value`` with a comment; ``value`` is rendered verbatim if str."""

    name: str
    value: int | str
    comment: str = ""


@dataclass(frozen=True, slots=True)
class CEnum:
    """A C enum rendered from a Python IntEnum, members named ``PREFIX_MEMBER``."""

    type_name: str
    prefix: str
    members: type[IntEnum] | type[IntFlag]
    comment: str = ""


@dataclass(frozen=True, slots=True)
class ContractSection:
    """One section of the contract: C constants, a Markdown chapter and hashable data.

    ``data`` must be JSON-serialisable and deterministic: it feeds the contract hash that a host
    compares with the device's at session start. It holds exactly what the first devices were
    built with, and never grows: a host refuses a device whose hash differs, so a new entry there
    would make every device already flashed incompatible.

    ``additive`` is what the contract gained since (new flags, statuses, an appended HELLO_REPLY
    field), equally JSON data, rendered and checked but **never hashed**. Every entry in it is
    optional for both peers: a device advertises it in HELLO_REPLY's capabilities
    (``idemlink.protocol.payloads.Capability``) and a host uses it only after seeing it there,
    so an old peer, which neither sends nor accepts it, keeps working with a new one. A key may
    name the same table as in ``data`` (``flags``, ``status``) with only the added members; no
    member is in both (``tests/test_contract.py``).
    """

    name: str
    defines: list[CDefine] = field(default_factory=list)
    enums: list[CEnum] = field(default_factory=list)
    markdown: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    additive: dict[str, Any] = field(default_factory=dict)


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """Render a GitHub Markdown table (used by every section's docs)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"
