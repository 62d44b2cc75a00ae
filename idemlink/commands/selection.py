"""Which registers a reading command (``read``, ``watch``) covers, and the reads that fetch them.

Contract:

- ``select_registers(regmap, refs, every)``: each ref is a register name (or the name of a coil,
  a discrete input or a bit field: a field is read in its register), an address (``4``,
  ``0x4``: a register's) or an inclusive range of register addresses ``A:B`` (``0:9``,
  ``0x100:0x10F``). A range takes the map's registers starting inside it and skips the
  addresses the map does not declare; a range with ``B < A``, bounds that are not integers, or no
  register inside is a ``UserError`` (one line, nothing sent). ``every`` (``--all``) is every
  register, coil and discrete input of the map and takes no refs; no refs at all is every one
  too. A register named twice is read once (its first place kept).
- An address is a value's first register: an address inside a value of several registers
  (``RegisterMap.addressed``) is a ``UserError`` naming the value and its first address.
- ``is_range(ref)``: whether a ref is a range (``read`` then reads in runs, like ``--all``).
- The reads that fetch them: ``idemlink.host.command.read_runs``.
"""

from __future__ import annotations

from collections.abc import Sequence

from idemlink.cli import UserError
from idemlink.protocol.registers import MidValueAddress, RegisterMap, RegisterSpec, Space


def is_range(ref: str) -> bool:
    return ":" in ref


def _bound(text: str, ref: str) -> int:
    try:
        value = int(text.strip(), 0)
    except ValueError:
        raise UserError(f"{ref!r}: a range is FIRST:LAST, two addresses (0:9, 0x100:0x10F)") from None
    if value < 0:
        raise UserError(f"{ref!r}: an address is >= 0")
    return value


def _range(regmap: RegisterMap, ref: str) -> list[RegisterSpec]:
    first_text, _, last_text = ref.partition(":")
    first, last = _bound(first_text, ref), _bound(last_text, ref)
    if last < first:
        raise UserError(f"{ref!r}: the range ends before it starts (FIRST:LAST, both included)")
    specs = [s for s in regmap if s.space is Space.REGISTERS and first <= s.address <= last]
    if not specs:
        known = ", ".join(str(s.address) for s in regmap if s.space is Space.REGISTERS)
        raise UserError(f"no register at addresses {first}..{last} in the map {regmap.name} "
                        f"(addresses: {known})")
    return specs


def resolve(regmap: RegisterMap, ref: str | int) -> RegisterSpec:
    """A register by name or address; ``UserError`` naming the known ones otherwise."""
    spec: RegisterSpec | None
    if isinstance(ref, int) or ref.strip().lstrip("-").isdigit() or ref.startswith("0x"):
        try:
            address = ref if isinstance(ref, int) else int(ref, 0)
        except ValueError:
            spec = None
        else:
            try:
                spec = regmap.addressed(address)
            except MidValueAddress as exc:
                raise UserError(f"{exc}; nothing was sent") from None
    else:
        try:
            spec = regmap.named(ref)
        except KeyError:
            spec = None
    if spec is None:
        names = ", ".join(r.name for r in regmap)
        raise UserError(f"no register {ref!r} in the map {regmap.name} (registers: {names}); "
                        "for another device, give its map with --regmap FILE")
    return spec


def select_registers(regmap: RegisterMap, refs: Sequence[str], every: bool = False
                     ) -> list[RegisterSpec]:
    """The registers ``refs`` name (names, addresses, ``A:B`` ranges), or every register."""
    if every and refs:
        raise UserError("--all reads every register: give register names or --all, not both")
    if every or not refs:
        return list(regmap)
    out: list[RegisterSpec] = []
    for ref in refs:
        for spec in _range(regmap, ref) if is_range(ref) else [resolve(regmap, ref)]:
            if spec not in out:
                out.append(spec)
    return out


