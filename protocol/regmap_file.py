"""Register-map files: one device's registers described in TOML (or JSON), validated whole.

Contract (the format is documented in docs/REGMAP.md):

- ``parse_regmap(text, source=..., fmt="toml"|"json") -> RegisterMap``: a document with ``name``,
  optional ``description``, optional ``mask_write`` (the device takes FC22) and a ``registers``
  list; each register has ``address``, ``name``, ``kind`` and the fields its kind allows
  (``min``, ``max``, ``default``, ``unit``, ``scale``, ``offset``, ``labels``, ``persist``,
  ``bits``, ``type``, ``word_order``, ``length``, ``fields``, ``description``; limits, defaults
  and label values of a typed register as the type's numbers). Unknown fields and non-idempotent behaviours
  (``kind = "toggle"``, ``clear_on_read = true``) are refused, as are overlapping addresses, bad
  ranges and names the generated C header could not define; so are JSON objects that give a key
  twice (TOML refuses them itself), and an integer too long to convert (``long_integers``: the
  line or field is named, not Python's ``sys.set_int_max_str_digits()``). A leading byte-order
  mark is ignored. A ``link`` table is a connection profile
  (``idemlink.protocol.link_profile.map_link``): not read here, not hashed.
- Every refusal is one ``RegmapFileError`` whose message names the file, the register (by name,
  else by position) and the field: ``pump.toml: register 'speed' (#2): field 'max': 70000 outside
  0..65535``. Nothing is half-loaded.
- ``load_regmap(path)`` reads a regular file of at most ``MAX_FILE_BYTES`` (``.json`` is JSON,
  anything else TOML); ``resolve_regmap(ref)`` takes a path or the name of a map shipped in the
  package (``BUILTIN_MAPS``). ``DEFAULT_MAP`` is the shipped thermal controller.
"""

from __future__ import annotations

import os
import tomllib
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import Any

from idemlink.protocol.datatypes import (
    MAX_STRING_WORDS,
    DataType,
    full_range,
    native,
    parse_type,
    parse_word_order,
    raw_of,
)
from idemlink.protocol.long_integers import (
    DuplicateKeyError,
    LongIntegerError,
    load_json,
    load_toml,
    unique_keys,
)
from idemlink.protocol.registers import (
    BIT_KINDS,
    FORBIDDEN_KINDS,
    BitField,
    FaultBit,
    RegisterKind,
    RegisterMap,
    RegisterSchemaError,
    RegisterSpec,
    Space,
    check_scale,
    parse_kind,
)
from idemlink.protocol.regular_file import FileRefused, Problem, read_regular_file

MAX_FILE_BYTES = 1 << 20
MAX_REGISTERS = 4096

#: Maps shipped in the package (``protocol/maps/NAME.toml``), by name.
BUILTIN_MAPS: tuple[str, ...] = ("thermal-controller", "pump-controller")
DEFAULT_MAP_NAME = "thermal-controller"

_TOP_FIELDS = {"name", "description", "registers", "schema", "hash", "mask_write",
               "link"}  # link: a connection profile (link_profile.map_link), not the map's
SCHEMA = "idemlink.regmap/1"
_TYPED = {"type", "word_order", "length", "offset", "fields"}
_FIELDS = {"address", "name", "kind", "unit", "scale", "min", "max", "default", "labels",
           "persist", "bits", "description", *_TYPED}
_BIT_FIELDS = {"bit", "name", "description"}
_FIELD_FIELDS = {"name", "bit", "width", "description", "labels"}
#: Which optional fields each kind takes (address, name, kind, description: every kind).
_KIND_FIELDS = {
    "input": {"unit", "scale", "default", "labels", "min", "max", *_TYPED},
    "holding": {"unit", "scale", "min", "max", "default", "labels", "persist", *_TYPED},
    "fault": {"bits"},
    "trigger": set(),
    "generation": set(),
    "coil": {"default", "labels", "persist"},
    "discrete_input": {"default", "labels"},
    "command": {"max", "labels"},
}
#: Field names people reach for that would break idempotency, and why they are refused.
_FORBIDDEN_FIELDS = {
    "clear_on_read": FORBIDDEN_KINDS["read_to_clear"],
    "read_to_clear": FORBIDDEN_KINDS["read_to_clear"],
    "increment": FORBIDDEN_KINDS["increment"],
    "toggle": FORBIDDEN_KINDS["toggle"],
    "on_read": "reading a register never has a side effect",
}


class RegmapFileError(RegisterSchemaError):
    """A map file that cannot be loaded; the message names the file, register and field."""


def _int(where: str, field: str, value: object) -> int:
    if type(value) is not int:
        raise RegmapFileError(f"{where}: field {field!r}: {value!r} is not an integer")
    return value


def _text(where: str, field: str, value: object, limit: int = 200) -> str:
    if not isinstance(value, str) or len(value) > limit or any(ord(c) < 32 for c in value):
        raise RegmapFileError(f"{where}: field {field!r}: need text of at most {limit} "
                              "printable characters")
    return value


def _scale(where: str, value: object) -> str:
    if type(value) is float:
        text = repr(value)
    elif type(value) is int or isinstance(value, str):
        text = str(value)
    else:
        raise RegmapFileError(f"{where}: field 'scale': {value!r} is not a number")
    try:
        number = Decimal(text)
    except InvalidOperation:
        number = Decimal("nan")
    if not number.is_finite() or number <= 0:
        raise RegmapFileError(f"{where}: field 'scale': {value!r} must be a number > 0")
    try:
        check_scale(number)
    except RegisterSchemaError as exc:
        raise RegmapFileError(f"{where}: field 'scale': {value!r}: {exc}") from None
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def _labels(where: str, value: object, dtype: DataType = DataType.U16,
            ) -> tuple[tuple[int, str], ...]:
    if not isinstance(value, dict) or not value:
        raise RegmapFileError(f"{where}: field 'labels': need a table of label = value, "
                              "e.g. labels = { off = 0, auto = 1 }")
    if dtype is DataType.U16:
        return tuple(sorted((_int(where, f"labels.{k}", v), str(k)) for k, v in value.items()))
    return tuple(sorted((_raw_number(where, f"labels.{k}", v, dtype), str(k))
                        for k, v in value.items()))


def _offset(where: str, value: object) -> str:
    if type(value) is float:
        text = repr(value)
    elif type(value) is int or isinstance(value, str):
        text = str(value)
    else:
        raise RegmapFileError(f"{where}: field 'offset': {value!r} is not a number")
    try:
        number = Decimal(text)
    except InvalidOperation:
        number = Decimal("nan")
    if not number.is_finite():
        raise RegmapFileError(f"{where}: field 'offset': {value!r} is not a number")
    if number:
        try:
            check_scale(abs(number))
        except RegisterSchemaError as exc:
            raise RegmapFileError(f"{where}: field 'offset': {value!r}: "
                                  f"{str(exc).replace('scale', 'an offset')}") from None
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def _raw_number(where: str, field: str, value: object, dtype: DataType) -> int:
    """The raw value of a number a map file gives for a typed register (an integer of the type's
    range; for a float type any finite number)."""
    if dtype.is_float:
        if type(value) not in (int, float):
            raise RegmapFileError(f"{where}: field {field!r}: {value!r} is not a number")
    elif type(value) is not int:
        raise RegmapFileError(f"{where}: field {field!r}: {value!r} is not an integer")
    try:
        return raw_of(dtype, value)  # type: ignore[arg-type]
    except ValueError as exc:
        raise RegmapFileError(f"{where}: field {field!r}: {exc}") from None


def _string_default(where: str, value: object, length: int) -> int:
    if not isinstance(value, str) or not all(32 <= ord(c) < 127 for c in value):
        raise RegmapFileError(f"{where}: field 'default': need printable ASCII text")
    data = value.encode("ascii")
    if len(data) > 2 * length:
        raise RegmapFileError(f"{where}: field 'default': {len(data)} characters; the string "
                              f"holds {2 * length}")
    return int.from_bytes(data.ljust(2 * length, b"\0"), "big")


def _fields(where: str, value: object) -> tuple[BitField, ...]:
    if not isinstance(value, list) or not value:
        raise RegmapFileError(f"{where}: field 'fields': need a list of "
                              "{ name = ..., bit = N, width = W }")
    out = []
    for i, f in enumerate(value):
        at = f"{where}: fields[{i}]"
        if not isinstance(f, dict):
            raise RegmapFileError(f"{at}: need {{ name = ..., bit = N, width = W }}")
        unknown = set(f) - _FIELD_FIELDS
        if unknown:
            raise RegmapFileError(f"{at}: unknown field(s) {sorted(unknown)}; a bit field has "
                                  f"{sorted(_FIELD_FIELDS)}")
        if "bit" not in f or "name" not in f:
            raise RegmapFileError(f"{at}: needs both 'bit' and 'name'")
        out.append(BitField(_text(at, "name", f["name"], 64), _int(at, "bit", f["bit"]),
                            _int(at, "width", f.get("width", 1)),
                            _text(at, "description", f.get("description", "")),
                            _labels(at, f["labels"]) if "labels" in f else ()))
    return tuple(out)


def _bits(where: str, value: object) -> tuple[FaultBit, ...]:
    if not isinstance(value, list) or not value:
        raise RegmapFileError(f"{where}: field 'bits': need a list of {{ bit = N, name = ... }}")
    out = []
    for i, b in enumerate(value):
        at = f"{where}: bits[{i}]"
        if not isinstance(b, dict):
            raise RegmapFileError(f"{at}: need {{ bit = N, name = ... }}")
        unknown = set(b) - _BIT_FIELDS
        if unknown:
            raise RegmapFileError(f"{at}: unknown field(s) {sorted(unknown)}; a bit has "
                                  f"{sorted(_BIT_FIELDS)}")
        if "bit" not in b or "name" not in b:
            raise RegmapFileError(f"{at}: needs both 'bit' and 'name'")
        out.append(FaultBit(_int(at, "bit", b["bit"]), _text(at, "name", b["name"], 64),
                            _text(at, "description", b.get("description", ""))))
    return tuple(out)


def _register(source: str, index: int, raw: object) -> RegisterSpec:
    where = f"{source}: register #{index + 1}"
    if not isinstance(raw, dict):
        raise RegmapFileError(f"{where}: need a table of fields")
    if isinstance(raw.get("name"), str):
        where = f"{source}: register {raw['name']!r} (#{index + 1})"
    for field in raw:
        if field in _FORBIDDEN_FIELDS:
            raise RegmapFileError(f"{where}: field {field!r} is not allowed: "
                                  f"{_FORBIDDEN_FIELDS[field]}")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise RegmapFileError(f"{where}: unknown field(s) {sorted(unknown)}; fields are "
                              f"{sorted(_FIELDS)}")
    for field in ("address", "name", "kind"):
        if field not in raw:
            raise RegmapFileError(f"{where}: field {field!r} is missing")
    try:
        kind = parse_kind(_text(where, "kind", raw["kind"], 40))
    except RegmapFileError:
        raise
    except RegisterSchemaError as exc:
        raise RegmapFileError(f"{where}: field 'kind': {exc}") from None
    allowed = _KIND_FIELDS[kind.name.lower()] | {"address", "name", "kind", "description"}
    misplaced = set(raw) - allowed
    if misplaced:
        raise RegmapFileError(f"{where}: field(s) {sorted(misplaced)} do not apply to a "
                              f"{kind.name.lower()} register")
    options: dict[str, Any] = {}
    if "unit" in raw:
        options["unit"] = _text(where, "unit", raw["unit"], 32)
    if "scale" in raw:
        options["scale"] = _scale(where, raw["scale"])
    if "offset" in raw:
        options["offset"] = _offset(where, raw["offset"])
    dtype = _dtype(where, raw, options)
    if dtype is DataType.U16:
        _u16_limits(where, raw, options, kind)
    else:
        _typed_limits(where, raw, options, dtype)
    if "labels" in raw:
        options["labels"] = _labels(where, raw["labels"], dtype)
    if "persist" in raw:
        if type(raw["persist"]) is not bool:
            raise RegmapFileError(f"{where}: field 'persist': need true or false")
        options["persist"] = raw["persist"]
    if "bits" in raw:
        options["bits"] = _bits(where, raw["bits"])
    if "fields" in raw:
        options["fields"] = _fields(where, raw["fields"])
    if "description" in raw:
        options["description"] = _text(where, "description", raw["description"], 500)
    try:
        return RegisterSpec(address=_int(where, "address", raw["address"]),
                            name=_text(where, "name", raw["name"], 64), kind=kind, **options)
    except RegmapFileError:
        raise
    except RegisterSchemaError as exc:
        raise RegmapFileError(f"{where}: {_strip_name(str(exc), raw['name'])}") from None


def _dtype(where: str, raw: dict[str, Any], options: dict[str, Any]) -> DataType:
    """The register's ``type`` (u16 when absent) and what it needs: ``word_order`` for a value of
    several registers (declared, never guessed: devices differ), ``length`` for a string."""
    dtype = DataType.U16
    if "type" in raw:
        try:
            dtype = parse_type(_text(where, "type", raw["type"], 20))
        except ValueError as exc:
            raise RegmapFileError(f"{where}: field 'type': {exc}") from None
        options["dtype"] = dtype
    if dtype is DataType.STRING:
        if "length" not in raw:
            raise RegmapFileError(f"{where}: field 'length' is missing: a string says how many "
                                  f"registers it takes (1..{MAX_STRING_WORDS}, two characters "
                                  "each)")
        options["length"] = _int(where, "length", raw["length"])
    elif "length" in raw:
        raise RegmapFileError(f"{where}: field 'length' applies to a string (type = \"string\")")
    if dtype.words > 1:
        if "word_order" not in raw:
            raise RegmapFileError(
                f"{where}: field 'word_order' is missing: a {dtype.value} takes {dtype.words} "
                "registers; say which comes first: \"big\" (the first register holds the most "
                "significant word) or \"little\" (the last does)")
        try:
            options["word_order"] = parse_word_order(_text(where, "word_order",
                                                           raw["word_order"], 20))
        except ValueError as exc:
            raise RegmapFileError(f"{where}: field 'word_order': {exc}") from None
    elif "word_order" in raw:
        raise RegmapFileError(f"{where}: field 'word_order' applies to a type of several "
                              f"registers (u32, i32, f32, u64, i64, f64), not {dtype.value}")
    return dtype


def _u16_limits(where: str, raw: dict[str, Any], options: dict[str, Any],
                kind: RegisterKind) -> None:
    for field, key in (("min", "minimum"), ("max", "maximum"), ("default", "default")):
        if field in raw:
            options[key] = _int(where, field, raw[field])
    top = 1 if kind in BIT_KINDS else 0xFFFF
    if kind in BIT_KINDS and options.get("default", 0) not in (0, 1):
        raise RegmapFileError(f"{where}: field 'default': {options['default']}: a "
                              f"{kind.name.lower()} is 0 or 1")
    lo, hi = options.get("minimum", 0), options.get("maximum", top)
    for field, value in (("min", lo), ("max", hi), ("default", options.get("default", lo))):
        if not 0 <= value <= 0xFFFF:
            raise RegmapFileError(f"{where}: field {field!r}: {value} outside 0..65535")
    if lo > hi:
        raise RegmapFileError(f"{where}: field 'max': {hi} is below min {lo}")
    if "default" in options and not lo <= options["default"] <= hi:
        raise RegmapFileError(f"{where}: field 'default': {options['default']} outside "
                              f"min..max ({lo}..{hi})")


def _typed_limits(where: str, raw: dict[str, Any], options: dict[str, Any],
                  dtype: DataType) -> None:
    """``min``/``max``/``default`` of a typed register, given as the type's numbers."""
    if dtype is DataType.STRING:
        for field in ("min", "max"):
            if field in raw:
                raise RegmapFileError(f"{where}: field {field!r} does not apply to a string")
        if "default" in raw:
            options["default"] = _string_default(where, raw["default"], options["length"])
        return
    for field, key in (("min", "minimum"), ("max", "maximum"), ("default", "default")):
        if field in raw:
            options[key] = _raw_number(where, field, raw[field], dtype)
    lo_raw, hi_raw = full_range(dtype)
    lo = native(dtype, options.get("minimum", lo_raw))
    hi = native(dtype, options.get("maximum", hi_raw))
    if lo > hi:
        raise RegmapFileError(f"{where}: field 'max': {raw['max']} is below min {raw['min']}")
    if "default" in options and not lo <= native(dtype, options["default"]) <= hi:
        raise RegmapFileError(f"{where}: field 'default': {raw['default']} outside "
                              f"min..max ({raw.get('min', lo)}..{raw.get('max', hi)})")


def _strip_name(message: str, name: object) -> str:
    prefix = f"{name}: "
    return message[len(prefix):] if message.startswith(prefix) else message


def parse_regmap(text: str | bytes, *, source: str = "<map>", fmt: str = "toml") -> RegisterMap:
    """Parse and validate a whole map document. See the module docstring."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors save
        doc: object = (load_json(text, object_pairs_hook=unique_keys) if fmt == "json"
                       else load_toml(text))
    except UnicodeDecodeError:
        raise RegmapFileError(f"{source}: not UTF-8 text") from None
    except (DuplicateKeyError, LongIntegerError) as exc:  # a key twice, an integer too long
        raise RegmapFileError(f"{source}: {exc}") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise RegmapFileError(f"{source}: not valid {fmt.upper()}: {exc}") from None
    except RecursionError:
        raise RegmapFileError(f"{source}: not valid {fmt.upper()}: nested too deeply") from None
    if not isinstance(doc, dict):
        raise RegmapFileError(f"{source}: need a document with name and registers")
    unknown = set(doc) - _TOP_FIELDS
    if unknown:
        raise RegmapFileError(f"{source}: unknown top-level field(s) {sorted(unknown)}; fields "
                              f"are {sorted(_TOP_FIELDS)} (a register is one [[registers]] table)")
    if "name" not in doc:
        raise RegmapFileError(f"{source}: field 'name' is missing (the map's name)")
    regs = doc.get("registers")
    if not isinstance(regs, list) or not regs:
        raise RegmapFileError(f"{source}: field 'registers': need a list of registers")
    if len(regs) > MAX_REGISTERS:
        raise RegmapFileError(f"{source}: {len(regs)} registers; at most {MAX_REGISTERS}")
    specs = [_register(source, i, r) for i, r in enumerate(regs)]
    owners: dict[tuple[Space, int], RegisterSpec] = {}
    for s in specs:
        for a in s.span:
            other = owners.get((s.space, a))
            if other is not None:
                which = "" if a == other.address else f" (its register {a - other.address + 1})"
                space = "" if s.space is Space.REGISTERS else f"{s.space.value} "
                raise RegmapFileError(f"{source}: register {s.name!r}: field 'address': {space}0x"
                                      f"{a:04X} is already {other.name!r}{which}")
        for a in s.span:
            owners[(s.space, a)] = s
    mask_write = doc.get("mask_write", False)
    if type(mask_write) is not bool:
        raise RegmapFileError(f"{source}: field 'mask_write': need true or false (whether the "
                              "device takes FC22, mask write register)")
    if "schema" in doc and doc["schema"] != SCHEMA:
        raise RegmapFileError(f"{source}: field 'schema': {doc['schema']!r} is not {SCHEMA!r}")
    try:
        regmap = RegisterMap(tuple(specs), name=_text(source, "name", doc["name"], 40),
                             description=_text(source, "description",
                                               doc.get("description", ""), 500),
                             mask_write=mask_write)
    except RegmapFileError:
        raise
    except RegisterSchemaError as exc:
        raise RegmapFileError(f"{source}: {exc}") from None
    if "hash" in doc and doc["hash"] != regmap.hash.hex():
        raise RegmapFileError(f"{source}: field 'hash': the file says {doc['hash']!r} but its "
                              f"registers hash to {regmap.hash.hex()!r} (edited after export?); "
                              "remove the hash field to accept the edit")
    return regmap


def map_document(regmap: RegisterMap) -> dict[str, Any]:
    """The map as a JSON map file (what ``idemlink regmap --json`` prints; loads back as is)."""
    doc: dict[str, Any] = {"schema": SCHEMA, "name": regmap.name, "hash": regmap.hash.hex(),
                           "description": regmap.description, "registers": regmap.to_json()}
    if regmap.mask_write:
        doc["mask_write"] = True
    return doc


def load_regmap(path: str | os.PathLike[str]) -> RegisterMap:
    """Read and parse a map file (regular file, at most 1 MiB, a symbolic link followed:
    ``read_regular_file``; ``.json`` is JSON, else TOML)."""
    p = Path(path)
    try:
        data = read_regular_file(p, MAX_FILE_BYTES, follow_symlinks=True)
    except FileRefused as exc:
        if exc.problem is Problem.NOT_REGULAR:
            raise RegmapFileError(f"{p}: not a regular file") from None
        if exc.problem in (Problem.TOO_LARGE, Problem.GREW):
            raise RegmapFileError(f"{p}: {exc.size} bytes; a map file is at most "
                                  f"{MAX_FILE_BYTES}") from None
        raise RegmapFileError(f"{p}: cannot open the map file: {exc.strerror}") from None
    except OSError as exc:
        raise RegmapFileError(f"{p}: cannot open the map file: {exc.strerror}") from None
    return parse_regmap(data, source=str(p), fmt="json" if p.suffix.lower() == ".json" else "toml")


def builtin_map(name: str) -> RegisterMap:
    """A map shipped in the package, by name (``BUILTIN_MAPS``)."""
    if name not in BUILTIN_MAPS:
        raise RegmapFileError(f"no built-in map {name!r}; built-in maps: {', '.join(BUILTIN_MAPS)}")
    text = resources.files("idemlink.protocol").joinpath("maps", f"{name}.toml").read_text("utf-8")
    return parse_regmap(text, source=f"{name}.toml")


def resolve_regmap(ref: str | os.PathLike[str] | None) -> RegisterMap:
    """``None`` -> the default map; a built-in map's name; else a path to a map file."""
    if ref is None:
        return DEFAULT_MAP
    if isinstance(ref, str) and ref in BUILTIN_MAPS and not Path(ref).exists():
        return builtin_map(ref)
    return load_regmap(ref)


#: The built-in thermal controller: what the demo, ``idemlink sim`` and every command use when no
#: ``--regmap`` is given.
DEFAULT_MAP: RegisterMap = builtin_map(DEFAULT_MAP_NAME)
