"""What a journal file says, free of any I/O: the step states and their transitions, the
snapshots (one scope; keyed by device), the limits, the errors, and the exact bytes (``encode`` /
``decode``, version 1; ``encode_keyed`` / ``decode_keyed``, version 2).

``idemlink.host.journal`` states the whole contract; ``idemlink.host.journal_file`` keeps a
snapshot on disk; the journal objects and the job runner are in ``idemlink.host.journal``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from idemlink.host.keys import MalformedKeyError, format_key, parse_key
from idemlink.protocol.long_integers import load_json, unique_keys
from idemlink.protocol.outcome import IdemlinkError

MAX_IDS = 1024
MAX_ENCODED_BYTES = 64 * 1024
FORMAT_NAME = "idemlink.receipt-journal"
FORMAT_VERSION = 1
KEYED_FORMAT_VERSION = 2
FILE_MODE = 0o600

_KNOWN_FIELDS = ("format", "version", "done", "pending")

KeyLike = uuid.UUID | str


# --------------------------------------------------------------------------------------- errors


class JournalError(IdemlinkError):
    """Base of every receipt-journal error. Whatever raised it changed nothing on disk."""


class JournalLimitError(JournalError):
    """Over ``MAX_IDS`` ids or ``MAX_ENCODED_BYTES`` bytes: refused, never truncated."""

    def __init__(self, message: str, *, limit: int, actual: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.actual = actual


class JournalKeyError(JournalError, ValueError):
    """A step key that is not a UUID in canonical form."""


class JournalDuplicateError(JournalError, ValueError):
    """A key given twice, or a key already receipted given to run again."""


class JournalStateError(JournalError):
    """A transition the table does not allow (e.g. completing a step that never began)."""


class JournalBusyError(JournalError):
    """Another process holds the journal's lock: one writer per journal."""


class JournalUnsafeFileError(JournalError):
    """The journal path is not a private regular file (symlink, FIFO, directory, socket, device,
    readable by others, owned by someone else)."""


class JournalCorruptError(JournalError):
    """The journal file exists but is not a valid journal. It is never read as the empty set."""


class JournalVersionError(JournalCorruptError):
    """The journal was written in a format version this reader does not know."""


# ------------------------------------------------------------------------------ state machine


class StepState(Enum):
    ABSENT = "absent"  #: never began, or definitely did not run
    PENDING = "pending"  #: in flight: UNKNOWN until reconciled
    DONE = "done"  #: receipted; final


class StepEvent(Enum):
    BEGIN = "begin"  #: about to execute (persisted before the step runs)
    EXECUTED = "executed"  #: the step ran (its OK, or a reconciliation that found its effect)
    NOT_EXECUTED = "not-executed"  #: the step definitely did not run


#: Every legal (state, event) -> next state. Anything else is refused; DONE has no exit.
TRANSITIONS: dict[tuple[StepState, StepEvent], StepState] = {
    (StepState.ABSENT, StepEvent.BEGIN): StepState.PENDING,
    (StepState.PENDING, StepEvent.EXECUTED): StepState.DONE,
    (StepState.PENDING, StepEvent.NOT_EXECUTED): StepState.ABSENT,
}


# ----------------------------------------------------------------------------------- snapshot


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One complete journal state: what a file holds. ``extra`` keeps unknown top-level fields of
    a newer writer, written back unchanged."""

    done: frozenset[uuid.UUID] = frozenset()
    pending: frozenset[uuid.UUID] = frozenset()
    extra: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        both = self.done & self.pending
        if both:
            raise JournalDuplicateError(
                f"key both done and pending: {format_key(min(both))}"
            )
        for name in self.extra:
            if name in _KNOWN_FIELDS:
                raise JournalStateError(f"extra field {name!r} collides with a journal field")

    def state(self, key: uuid.UUID) -> StepState:
        if key in self.done:
            return StepState.DONE
        if key in self.pending:
            return StepState.PENDING
        return StepState.ABSENT

    def with_state(self, key: uuid.UUID, new: StepState) -> Snapshot:
        done = self.done - {key}
        pending = self.pending - {key}
        if new is StepState.DONE:
            done |= {key}
        elif new is StepState.PENDING:
            pending |= {key}
        return Snapshot(frozenset(done), frozenset(pending), self.extra)


def check_count(count: int) -> None:
    if count > MAX_IDS:
        raise JournalLimitError(
            f"journal would hold {count} ids; the limit is {MAX_IDS} (refused, not truncated)",
            limit=MAX_IDS,
            actual=count,
        )


def check_size(size: int) -> None:
    if size > MAX_ENCODED_BYTES:
        raise JournalLimitError(
            f"journal would be {size} bytes encoded; the limit is {MAX_ENCODED_BYTES} "
            "(refused, not truncated)",
            limit=MAX_ENCODED_BYTES,
            actual=size,
        )


def encode(snapshot: Snapshot) -> bytes:
    """The file bytes for ``snapshot``; ``JournalLimitError`` if over either limit."""
    check_count(len(snapshot.done) + len(snapshot.pending))
    doc: dict[str, object] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "done": sorted(format_key(k) for k in snapshot.done),
        "pending": sorted(format_key(k) for k in snapshot.pending),
    }
    doc.update(snapshot.extra)
    return _dump(doc)


def _dump(doc: Mapping[str, object]) -> bytes:
    """The one-line file form of a journal document, within the size limit."""
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise JournalStateError(f"extra fields are not plain JSON: {exc}") from exc
    data = text.encode("ascii") + b"\n"
    check_size(len(data))
    return data


def _refuse_constant(name: str) -> object:
    raise ValueError(f"non-finite number {name}")


def _ids(doc: Mapping[str, object], name: str, where: str) -> list[uuid.UUID]:
    if name not in doc:
        raise JournalCorruptError(f"{where}: missing field {name!r}")
    raw = doc[name]
    if not isinstance(raw, list):
        raise JournalCorruptError(f"{where}: field {name!r} is not a list")
    keys = []
    for i, item in enumerate(raw):
        try:
            keys.append(parse_key(item))
        except MalformedKeyError as exc:
            raise JournalCorruptError(f"{where}: {name}[{i}]: {exc}") from exc
    return keys


def _parse_doc(data: bytes, where: str) -> tuple[dict[str, object], int]:
    """The top-level object of a journal file and its format version (any version >= 1)."""
    check_size(len(data))
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        raise JournalCorruptError(f"{where}: not a receipt journal (not one newline-ended line)")
    try:
        text = data.decode("utf-8")
        doc = load_json(text, object_pairs_hook=unique_keys, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise JournalCorruptError(f"{where}: not a receipt journal ({exc})") from exc
    if not isinstance(doc, dict):
        raise JournalCorruptError(f"{where}: not a receipt journal (top level is not an object)")
    if doc.get("format") != FORMAT_NAME:
        raise JournalCorruptError(f"{where}: not a receipt journal (format is not {FORMAT_NAME!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise JournalCorruptError(f"{where}: bad format version {version!r}")
    return doc, version


def _scope(doc: Mapping[str, object], where: str) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """The ``done`` and ``pending`` ids of one scope, each list free of duplicates across both."""
    done = _ids(doc, "done", where)
    pending = _ids(doc, "pending", where)
    seen: set[uuid.UUID] = set()
    for key in (*done, *pending):
        if key in seen:
            raise JournalCorruptError(f"{where}: duplicate id {format_key(key)}")
        seen.add(key)
    return done, pending


def decode(data: bytes, where: str = "journal") -> Snapshot:
    """Decode the bytes of a version-1 (unscoped) journal strictly. Raises ``JournalLimitError``
    over a limit, ``JournalVersionError`` for another version (a version-2 file is keyed by
    device: read it with ``decode_keyed``), ``JournalCorruptError`` for anything else."""
    doc, version = _parse_doc(data, where)
    if version == KEYED_FORMAT_VERSION:
        raise JournalVersionError(
            f"{where}: format version {version} is keyed by device; open it as a DeviceJournal")
    if version != FORMAT_VERSION:
        raise JournalVersionError(
            f"{where}: format version {version} is newer than this reader ({KEYED_FORMAT_VERSION})"
        )
    done, pending = _scope(doc, where)
    check_count(len(done) + len(pending))
    extra = {k: v for k, v in doc.items() if k not in _KNOWN_FIELDS}
    return Snapshot(frozenset(done), frozenset(pending), extra)


# ------------------------------------------------------------------------- keyed by device

#: A device id as a journal accepts it: what a device advertises at HELLO (the MCU's unique id,
#: the simulator's id file), 1-64 characters of ``[A-Za-z0-9_.:-]`` starting with a letter or digit.
DEVICE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")

_KEYED_FIELDS = ("format", "version", "devices", "unscoped", "in_flight")

MAX_REQUEST_BYTES = 253
"""The longest request PDU a frame carries; a longer recorded request is corrupt."""


@dataclass(frozen=True, slots=True)
class SentRecord:
    """What was recorded of a pending step's request *before* it left: its PDU and, for an
    idemlink device, the (epoch, seq) it travels under (None: a plain Modbus slave). It lets a
    later process ask the device whether the step ran (``idemlink.host.evidence``)."""

    request: bytes
    number: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.request) <= MAX_REQUEST_BYTES:
            raise JournalStateError(f"a recorded request is 1..{MAX_REQUEST_BYTES} bytes")
        if self.number is not None and not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 0xFFFFFFFF
                for n in self.number):
            raise JournalStateError("a recorded epoch and seq are 0..2^32-1")

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"request": self.request.hex()}
        if self.number is not None:
            doc["epoch"], doc["seq"] = self.number
        return doc

    @classmethod
    def from_json(cls, body: object, where: str) -> SentRecord:
        if not isinstance(body, dict) or not {"request"} <= set(body) <= {"request", "epoch",
                                                                           "seq"}:
            raise JournalCorruptError(f"{where}: expected {{\"request\": hex[, \"epoch\", "
                                      "\"seq\"]}")
        raw, epoch, seq = body["request"], body.get("epoch"), body.get("seq")
        try:
            if not isinstance(raw, str) or len(raw) > 2 * MAX_REQUEST_BYTES:
                raise ValueError("request is not hex of a request")
            request = bytes.fromhex(raw)
            if (epoch is None) != (seq is None):
                raise ValueError("epoch and seq go together")
            return cls(request, None if epoch is None else (epoch, seq))  # type: ignore[arg-type]
        except (ValueError, JournalStateError) as exc:
            raise JournalCorruptError(f"{where}: {exc}") from None


def check_device_id(device_id: object) -> str:
    """``device_id`` if a journal can key on it; ``JournalKeyError`` otherwise."""
    if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.match(device_id):
        raise JournalKeyError(f"device id {str(device_id)[:70]!r} is not 1-64 characters of "
                              "[A-Za-z0-9_.:-] starting with a letter or digit")
    return device_id


@dataclass(frozen=True, slots=True)
class KeyedSnapshot:
    """A journal keyed by device: per device id, the ``done`` and ``pending`` ids of that device
    (a ``Snapshot`` without extra fields). ``unscoped`` holds the ids of a version-1 file, which
    belong to no device: kept and written back, never consulted for a device. Empty scopes are
    dropped. The limits count every id of every scope together."""

    devices: Mapping[str, Snapshot] = field(default_factory=dict)
    unscoped: Snapshot = Snapshot()
    extra: Mapping[str, object] = field(default_factory=dict)
    #: per (device id, step key) in flight: what was recorded before its request left
    sent: Mapping[tuple[str, uuid.UUID], SentRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for device_id, scope in self.devices.items():
            check_device_id(device_id)
            if scope.extra:
                raise JournalStateError(f"device {device_id}: a scope has no extra fields")
        for device_id, key in self.sent:
            if key not in self.scope(device_id).pending:
                raise JournalStateError(f"device {device_id} step {format_key(key)}: a record "
                                        "of a request kept for a step not in flight")
        for name in self.extra:
            if name in _KEYED_FIELDS:
                raise JournalStateError(f"extra field {name!r} collides with a journal field")

    @property
    def count(self) -> int:
        return sum(len(s.done) + len(s.pending) for s in (*self.devices.values(), self.unscoped))

    def scope(self, device_id: str) -> Snapshot:
        return self.devices.get(check_device_id(device_id), Snapshot())

    def with_scope(self, device_id: str, scope: Snapshot,
                   sent: tuple[uuid.UUID, SentRecord] | None = None) -> KeyedSnapshot:
        """This snapshot with ``device_id``'s scope replaced (and ``sent`` recorded for one of
        its pending steps); records of steps no longer in flight are dropped."""
        devices = dict(self.devices)
        devices[check_device_id(device_id)] = scope
        records = {(d, k): r for (d, k), r in self.sent.items()
                   if d != device_id or k in scope.pending}
        if sent is not None:
            records[(device_id, sent[0])] = sent[1]
        return KeyedSnapshot({d: s for d, s in devices.items() if s.done or s.pending},
                             self.unscoped, self.extra, records)

    def sent_record(self, device_id: str, key: uuid.UUID) -> SentRecord | None:
        return self.sent.get((check_device_id(device_id), key))


def encode_keyed(snapshot: KeyedSnapshot) -> bytes:
    """The version-2 file bytes of ``snapshot``; ``JournalLimitError`` if over either limit."""
    check_count(snapshot.count)
    devices = {d: {"done": sorted(format_key(k) for k in s.done),
                   "pending": sorted(format_key(k) for k in s.pending)}
               for d, s in sorted(snapshot.devices.items())}
    doc: dict[str, object] = {"format": FORMAT_NAME, "version": KEYED_FORMAT_VERSION,
                              "devices": devices}
    u = snapshot.unscoped
    if u.done or u.pending or u.extra:
        doc["unscoped"] = {"done": sorted(format_key(k) for k in u.done),
                           "pending": sorted(format_key(k) for k in u.pending), **u.extra}
    if snapshot.sent:
        in_flight: dict[str, dict[str, object]] = {}
        for (d, k), record in sorted(snapshot.sent.items(), key=lambda dk: (dk[0][0], str(dk[0][1]))):
            in_flight.setdefault(d, {})[format_key(k)] = record.to_json()
        doc["in_flight"] = in_flight
    doc.update(snapshot.extra)
    return _dump(doc)


def _in_flight(raw: object, devices: Mapping[str, Snapshot], where: str,
               ) -> dict[tuple[str, uuid.UUID], SentRecord]:
    """The ``in_flight`` records of a file. A record of a step that is no longer pending (left by
    a reader older than the field, which keeps it unchanged) is dropped: it proves nothing."""
    if not isinstance(raw, dict):
        raise JournalCorruptError(f"{where}: field 'in_flight' is not an object")
    out: dict[tuple[str, uuid.UUID], SentRecord] = {}
    for device_id, steps in raw.items():
        at = f"{where}: in_flight {device_id[:70]!r}"
        if not DEVICE_ID_PATTERN.match(device_id) or not isinstance(steps, dict):
            raise JournalCorruptError(f"{at}: not a device id with an object of steps")
        for text, body in steps.items():
            try:
                key = parse_key(text)
            except MalformedKeyError as exc:
                raise JournalCorruptError(f"{at}: {exc}") from exc
            record = SentRecord.from_json(body, f"{at} {text}")
            scope = devices.get(device_id)
            if scope is not None and key in scope.pending:
                out[(device_id, key)] = record
    return out


def decode_keyed(data: bytes, where: str = "journal") -> KeyedSnapshot:
    """Decode a journal file of either version strictly: a version-1 file becomes the
    ``unscoped`` ids (no device); a version-2 file its devices. Errors as ``decode``."""
    doc, version = _parse_doc(data, where)
    if version == FORMAT_VERSION:
        return KeyedSnapshot(unscoped=decode(data, where))
    if version != KEYED_FORMAT_VERSION:
        raise JournalVersionError(f"{where}: format version {version} is newer than this reader "
                                  f"({KEYED_FORMAT_VERSION})")
    raw = doc.get("devices")
    if not isinstance(raw, dict):
        raise JournalCorruptError(f"{where}: field 'devices' is missing or not an object")
    devices: dict[str, Snapshot] = {}
    for device_id, body in raw.items():
        at = f"{where}: device {device_id[:70]!r}"
        if not DEVICE_ID_PATTERN.match(device_id):
            raise JournalCorruptError(f"{at}: not a device id")
        if not isinstance(body, dict) or set(body) != {"done", "pending"}:
            raise JournalCorruptError(f"{at}: expected {{\"done\": [...], \"pending\": [...]}}")
        done, pending = _scope(body, at)
        devices[device_id] = Snapshot(frozenset(done), frozenset(pending))
    unscoped = Snapshot()
    if "unscoped" in doc:
        body = doc["unscoped"]
        if not isinstance(body, dict):
            raise JournalCorruptError(f"{where}: field 'unscoped' is not an object")
        done, pending = _scope(body, f"{where}: unscoped")
        unscoped = Snapshot(frozenset(done), frozenset(pending),
                            {k: v for k, v in body.items() if k not in _KNOWN_FIELDS})
    extra = {k: v for k, v in doc.items() if k not in _KEYED_FIELDS}
    sent = _in_flight(doc["in_flight"], devices, where) if "in_flight" in doc else {}
    snap = KeyedSnapshot(devices, unscoped, extra, sent)
    check_count(snap.count)
    return snap
