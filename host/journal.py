"""The receipt journal: crash-safe progress for a multi-step job, per device.

Contract.

- The journal is the persisted set of step keys (UUIDs, see ``idemlink.host.keys``) of one job, each either
  ``done`` (receipted: executed exactly once, never to run again) or ``pending`` (in flight: it
  was about to run, may have run, and is UNKNOWN until reconciled). A key in neither is absent.
- Per key, state only moves along ``TRANSITIONS``: ABSENT -BEGIN-> PENDING -EXECUTED-> DONE, and
  PENDING -NOT_EXECUTED-> ABSENT (a definite "did not run", or a reconciliation that found no
  effect). DONE is final: the done set only grows.
- Limits, applied to done + pending together: at most ``MAX_IDS`` (1024) ids and at most
  ``MAX_ENCODED_BYTES`` (64 KiB) encoded. A change that would exceed either is refused with
  ``JournalLimitError`` and changes nothing - never truncated. A file over either limit is refused.
- Ids are validated strictly: canonical lower-case hyphenated UUID text; malformed or duplicate ids
  are refused (``JournalKeyError`` / ``JournalDuplicateError`` from the API, ``JournalCorruptError``
  from a file).
- The file is private: mode 0600 whatever the umask, owned by the effective user. A symlink (even
  to a good journal), FIFO, directory, socket or device at the path is refused
  (``JournalUnsafeFileError``) - checked without a race: ``open(O_NOFOLLOW | O_NONBLOCK)`` then
  ``fstat`` on the descriptor. A journal readable by group or others is refused too.
- Every change rewrites the whole snapshot by atomic replacement: a temp file with a unique name
  (``tempfile.mkstemp``: ``.<name>.XXXXXXXX.tmp`` in the same directory, created 0600 with
  ``O_EXCL``; two processes never share one), written, fsynced, ``os.replace``d over the journal,
  then the directory fsynced. A reader sees the old file or the new one, never half.
  A state change is durable when the call returns.
- A missing file is the empty set. Anything else that does not decode - empty, truncated, not
  UTF-8, not JSON, wrong shape - is refused with ``JournalCorruptError``; never read as empty.
- Encoding (version 1): one line of compact UTF-8 JSON ending in the file's only newline (so no
  proper prefix of a journal is a journal)::

      {"format":"idemlink.receipt-journal","version":1,"done":[ids...],"pending":[ids...]}

  ids sorted. Evolution is additive: new optional top-level fields may be added without changing
  ``version``; readers keep unknown fields and write them back unchanged. ``version`` changes only
  for an incompatible layout, and a reader refuses a version it does not know
  (``JournalVersionError``). Object keys must be unique; NaN/Infinity are refused.
- Keyed by device (version 2, ``DeviceJournal``): one file serves many devices; the state is kept
  per (device id, step key), so a step receipted on one device still runs on another::

      {"format":"idemlink.receipt-journal","version":2,
       "devices":{"<device id>":{"done":[ids...],"pending":[ids...]}, ...},
       "unscoped":{"done":[...],"pending":[...]}}

  devices sorted, ids sorted, empty devices dropped; ``unscoped`` (only when non-empty) holds the
  ids of a version-1 file, which belong to no device: a version-1 file loads as a keyed journal
  whose ids are all unscoped, kept and written back, never taken for any device's. A device id is
  1-64 characters of ``[A-Za-z0-9_.:-]`` starting with a letter or digit (``DEVICE_ID_PATTERN``).
  The limits (``MAX_IDS``, ``MAX_ENCODED_BYTES``) count the whole file, all devices together.
  ``decode``/``load``/``ReceiptJournal`` (the single-scope API) refuse a version-2 file
  (``JournalVersionError``).
- One writer per journal: ``lock_journal(path)`` takes an exclusive ``fcntl.flock`` on the sibling
  ``<path>.lock`` (created 0600, never deleted, a symlink refused) or raises ``JournalBusyError`` at
  once; the lock dies with its process, so it is never stale. ``run_steps`` does not take it: its
  caller does.

``run_steps`` is the job runner built on this: it re-executes nothing already receipted and
reports steps that were in flight as UNKNOWN - executing nothing - until they are reconciled.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, TypeVar

from idemlink.host.keys import MalformedKeyError, format_key, parse_key
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.regular_file import FileRefused, Problem, kind_of, read_regular_file

__all__ = [
    "DEVICE_ID_PATTERN",
    "FILE_MODE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KEYED_FORMAT_VERSION",
    "MAX_ENCODED_BYTES",
    "MAX_IDS",
    "TRANSITIONS",
    "DeviceJournal",
    "JournalBusyError",
    "JournalCorruptError",
    "JournalDuplicateError",
    "JournalError",
    "JournalKeyError",
    "JournalLimitError",
    "JournalLock",
    "JournalStateError",
    "JournalUnsafeFileError",
    "JournalVersionError",
    "KeyedSnapshot",
    "KeyedStep",
    "ReceiptJournal",
    "RunReport",
    "Snapshot",
    "StepEvent",
    "StepState",
    "check_device_id",
    "decode",
    "decode_keyed",
    "encode",
    "encode_keyed",
    "load",
    "load_keyed",
    "lock_journal",
    "run_steps",
    "save",
    "save_keyed",
]

log = logging.getLogger(__name__)

MAX_IDS = 1024
MAX_ENCODED_BYTES = 64 * 1024
FORMAT_NAME = "idemlink.receipt-journal"
FORMAT_VERSION = 1
KEYED_FORMAT_VERSION = 2
FILE_MODE = 0o600

_KNOWN_FIELDS = ("format", "version", "done", "pending")

KeyLike = uuid.UUID | str


# --------------------------------------------------------------------------------------- errors


class JournalError(Exception):
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


def _check_count(count: int) -> None:
    if count > MAX_IDS:
        raise JournalLimitError(
            f"journal would hold {count} ids; the limit is {MAX_IDS} (refused, not truncated)",
            limit=MAX_IDS,
            actual=count,
        )


def _check_size(size: int) -> None:
    if size > MAX_ENCODED_BYTES:
        raise JournalLimitError(
            f"journal would be {size} bytes encoded; the limit is {MAX_ENCODED_BYTES} "
            "(refused, not truncated)",
            limit=MAX_ENCODED_BYTES,
            actual=size,
        )


def encode(snapshot: Snapshot) -> bytes:
    """The file bytes for ``snapshot``; ``JournalLimitError`` if over either limit."""
    _check_count(len(snapshot.done) + len(snapshot.pending))
    doc: dict[str, object] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "done": sorted(format_key(k) for k in snapshot.done),
        "pending": sorted(format_key(k) for k in snapshot.pending),
    }
    doc.update(snapshot.extra)
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise JournalStateError(f"extra fields are not plain JSON: {exc}") from exc
    data = text.encode("ascii") + b"\n"
    _check_size(len(data))
    return data


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"duplicate object key {name!r}")
        out[name] = value
    return out


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
    _check_size(len(data))
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        raise JournalCorruptError(f"{where}: not a receipt journal (not one newline-ended line)")
    try:
        text = data.decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_refuse_constant)
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
    _check_count(len(done) + len(pending))
    extra = {k: v for k, v in doc.items() if k not in _KNOWN_FIELDS}
    return Snapshot(frozenset(done), frozenset(pending), extra)


# ------------------------------------------------------------------------------------- files


def _check_private(path: str) -> Callable[[os.stat_result], None]:
    """The journal's own rule on the opened file: private to this user, within the size limit."""
    def check(st: os.stat_result) -> None:
        if st.st_mode & 0o077:
            raise JournalUnsafeFileError(
                f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read or write it; "
                f"a journal is private (chmod 600 {path})"
            )
        if st.st_uid != os.geteuid():
            raise JournalUnsafeFileError(
                f"{path}: owned by uid {st.st_uid}, not by this user ({os.geteuid()}); refused"
            )
        _check_size(st.st_size)
    return check


def _read_existing(path: str) -> bytes | None:
    """The journal's bytes, or None if there is none. Refuses anything not private and regular
    (``read_regular_file``: no symlink, no FIFO, no device; judged on the opened descriptor)."""
    try:
        return read_regular_file(path, MAX_ENCODED_BYTES, check=_check_private(path))
    except FileNotFoundError:
        return None
    except FileRefused as exc:
        if exc.problem is Problem.SYMLINK:
            raise JournalUnsafeFileError(f"{path}: is a symbolic link; refused") from exc
        if exc.problem is Problem.SPECIAL:
            raise JournalUnsafeFileError(f"{path}: is a special file; refused") from exc
        if exc.problem is Problem.NOT_REGULAR:
            raise JournalUnsafeFileError(f"{path}: is {exc.kind}; refused") from exc
        _check_size(exc.size)  # TOO_LARGE, GREW: the journal's limit
        raise
    except OSError as exc:
        raise JournalError(f"{path}: cannot open: {exc.strerror}") from exc


def load(path: str | os.PathLike[str]) -> Snapshot:
    """Read the journal at ``path``. A missing file is the empty snapshot."""
    p = os.fspath(path)
    data = _read_existing(p)
    return Snapshot() if data is None else decode(data, where=p)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def save(path: str | os.PathLike[str], snapshot: Snapshot) -> None:
    """Replace the journal at ``path`` with ``snapshot`` atomically and durably.

    Encodes (and so checks the limits) before touching the disk. Refuses to replace anything but
    a regular file or nothing.
    """
    p = os.fspath(path)
    data = encode(snapshot)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise JournalUnsafeFileError(f"{p}: is {kind_of(st.st_mode)}; refused")
    _replace(p, data)


def _replace(p: str, data: bytes) -> None:
    """Write ``data`` to a new uniquely named temp file beside ``p`` (``tempfile.mkstemp``:
    created 0600 with ``O_EXCL``, so two processes never share one), fsync it, ``os.replace``
    it over ``p``, fsync the directory."""
    directory, name = os.path.split(os.path.abspath(p))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise JournalError(f"{directory}: cannot create a temp file: {exc.strerror}") from exc
    try:
        try:
            os.fchmod(fd, FILE_MODE)  # the umask may have removed owner bits
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            log.warning("could not remove temp file %s", tmp)
        if isinstance(exc, IsADirectoryError):
            raise JournalUnsafeFileError(f"{p}: is a directory; refused") from exc
        raise JournalError(f"{p}: cannot write journal: {exc.strerror}") from exc
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise JournalError(
            f"{directory}: journal replaced but the directory fsync failed ({exc.strerror}); "
            "the change may not survive a power loss - reopen the journal before going on"
        ) from exc


# ------------------------------------------------------------------------------------ journal


def _as_key(key: object) -> uuid.UUID:
    if isinstance(key, uuid.UUID):
        return key
    try:
        return parse_key(key)
    except MalformedKeyError as exc:
        raise JournalKeyError(str(exc)) from exc


class ReceiptJournal:
    """The journal of one job, bound to its file. Every state change is on disk when it returns;
    a refused change leaves both the file and this object as they were."""

    def __init__(self, path: str | os.PathLike[str], snapshot: Snapshot) -> None:
        self._path = os.fspath(path)
        self._snapshot = snapshot

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ReceiptJournal:
        """Load the journal at ``path`` (missing means empty; nothing is created until a change)."""
        return cls(path, load(path))

    @property
    def path(self) -> str:
        return self._path

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def done(self) -> frozenset[uuid.UUID]:
        return self._snapshot.done

    @property
    def pending(self) -> frozenset[uuid.UUID]:
        """Steps that were in flight: each is UNKNOWN until ``resolve``d."""
        return self._snapshot.pending

    def state(self, key: KeyLike) -> StepState:
        return self._snapshot.state(_as_key(key))

    def begin(self, key: KeyLike) -> None:
        """Record ``key`` as in flight. Call before the step's side effect."""
        self._apply(_as_key(key), StepEvent.BEGIN)

    def complete(self, key: KeyLike) -> None:
        """Receipt ``key``: the step returned OK."""
        self._apply(_as_key(key), StepEvent.EXECUTED)

    def resolve(self, key: KeyLike, executed: bool) -> None:
        """Settle an in-flight ``key``: after reconciliation, or after a definite NOT_EXECUTED /
        REJECTED. ``executed=True`` receipts it; ``False`` makes it absent (it may run again)."""
        event = StepEvent.EXECUTED if executed else StepEvent.NOT_EXECUTED
        self._apply(_as_key(key), event)

    def _apply(self, key: uuid.UUID, event: StepEvent) -> None:
        current = self._snapshot.state(key)
        nxt = TRANSITIONS.get((current, event))
        if nxt is None:
            text = format_key(key)
            if current is StepState.DONE:
                raise JournalDuplicateError(f"{text}: already receipted; {event.value} refused")
            raise JournalStateError(f"{text}: {event.value} is not allowed when {current.value}")
        new = self._snapshot.with_state(key, nxt)
        save(self._path, new)
        self._snapshot = new
        log.debug("journal %s: %s %s -> %s", self._path, format_key(key), current.value, nxt.value)


# ------------------------------------------------------------------------------------- runner


class KeyedStep(Protocol):
    """A step of a job: anything with a ``key`` (its idempotency key, see ``idemlink.host.keys``)."""

    @property
    def key(self) -> uuid.UUID: ...


S = TypeVar("S", bound=KeyedStep)


@dataclass(frozen=True, slots=True)
class RunReport:
    """What ``run_steps`` did.

    ``outcome`` is OK when every step is receipted; UNKNOWN when a step is in flight and
    unresolved (``unknown`` lists them; nothing new ran); NOT_EXECUTED or REJECTED when the step
    ``stopped_at`` returned that (it was released, and later steps did not run).
    """

    outcome: Outcome
    skipped: tuple[uuid.UUID, ...] = ()  #: already receipted before this run: not re-executed
    reconciled: tuple[uuid.UUID, ...] = ()  #: were in flight; reconciliation found them executed
    executed: tuple[uuid.UUID, ...] = ()  #: executed and receipted by this run, in order
    unknown: tuple[uuid.UUID, ...] = ()  #: in flight and unresolved
    stopped_at: uuid.UUID | None = None
    #: in flight in the journal but not among ``steps`` (e.g. the plan was edited since): no
    #: ``reconcile`` can settle them; ``ReceiptJournal.resolve`` them once checked by hand
    orphaned: tuple[uuid.UUID, ...] = ()


def run_steps(
    journal_path: str | os.PathLike[str],
    steps: Sequence[S],
    execute: Callable[[S], Outcome],
    reconcile: Callable[[S], bool | None] | None = None,
) -> RunReport:
    """Run ``steps`` in order with crash-safe progress kept in the journal at ``journal_path``.

    - Refused before anything runs: a key that is not a UUID, a key given twice, or more keys
      (with those already in the journal) than ``MAX_IDS``; and any journal refusal.
    - Steps whose key is receipted are skipped, never re-executed.
    - A step found in flight (a crash between BEGIN and its receipt) is handed to ``reconcile``,
      which answers True (it ran: receipt it), False (it did not: run it again) or None (cannot
      tell). Without ``reconcile``, or on None, it stays UNKNOWN, and so does any in-flight key of
      the journal that is not among ``steps`` (listed again in ``orphaned``: only
      ``ReceiptJournal.resolve`` settles it); then nothing runs and the report says UNKNOWN.
    - Otherwise each remaining step is journaled as in flight, executed, and on OK receipted. On
      NOT_EXECUTED or REJECTED it is released and the run stops; on UNKNOWN it stays in flight and
      the run stops. If ``execute`` raises, the step stays in flight and the exception propagates.
    """
    keys: list[uuid.UUID] = []
    for i, step in enumerate(steps):
        key = step.key
        if not isinstance(key, uuid.UUID):
            raise JournalKeyError(f"step {i}: key is {type(key).__name__}, not uuid.UUID")
        keys.append(key)
    if len(set(keys)) != len(keys):
        seen: set[uuid.UUID] = set()
        for key in keys:
            if key in seen:
                raise JournalDuplicateError(f"step key {format_key(key)} appears twice")
            seen.add(key)
    journal = ReceiptJournal.open(journal_path)
    _check_count(len(journal.done | journal.pending | set(keys)))

    skipped: list[uuid.UUID] = []
    reconciled: list[uuid.UUID] = []
    executed: list[uuid.UUID] = []
    unknown: list[uuid.UUID] = []
    index = {key: i for i, key in enumerate(keys)}
    for key in sorted(journal.pending, key=lambda k: (index.get(k, len(keys)), format_key(k))):
        owner = steps[index[key]] if key in index else None
        verdict = reconcile(owner) if (owner is not None and reconcile is not None) else None
        if verdict is None:
            unknown.append(key)
        else:
            journal.resolve(key, executed=verdict)
            if verdict:
                reconciled.append(key)
    if unknown:
        log.warning("journal %s: %d step(s) in flight, UNKNOWN until reconciled",
                    journal.path, len(unknown))
        orphaned = tuple(k for k in unknown if k not in index)
        return RunReport(Outcome.UNKNOWN, reconciled=tuple(reconciled), unknown=tuple(unknown),
                         orphaned=orphaned)

    def report(outcome: Outcome, stopped_at: uuid.UUID | None = None) -> RunReport:
        return RunReport(
            outcome,
            skipped=tuple(skipped),
            reconciled=tuple(reconciled),
            executed=tuple(executed),
            unknown=(stopped_at,) if (stopped_at and outcome is Outcome.UNKNOWN) else (),
            stopped_at=stopped_at,
        )

    for key, step in zip(keys, steps, strict=True):
        if journal.state(key) is StepState.DONE:
            if key not in reconciled:
                skipped.append(key)
            continue
        journal.begin(key)
        outcome = execute(step)
        if not isinstance(outcome, Outcome):
            raise TypeError(f"execute returned {outcome!r}, not an Outcome; step left in flight")
        if outcome is Outcome.OK:
            journal.complete(key)
            executed.append(key)
        elif outcome is Outcome.UNKNOWN:
            return report(outcome, key)
        else:  # NOT_EXECUTED or REJECTED: definitely did not run
            journal.resolve(key, executed=False)
            return report(outcome, key)
    return report(Outcome.OK)


# ------------------------------------------------------------------------- keyed by device

#: A device id as a journal accepts it: what a device advertises at HELLO (the MCU's unique id,
#: the simulator's id file), 1-64 characters of ``[A-Za-z0-9_.:-]`` starting with a letter or digit.
DEVICE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")

_KEYED_FIELDS = ("format", "version", "devices", "unscoped")


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

    def __post_init__(self) -> None:
        for device_id, scope in self.devices.items():
            check_device_id(device_id)
            if scope.extra:
                raise JournalStateError(f"device {device_id}: a scope has no extra fields")
        for name in self.extra:
            if name in _KEYED_FIELDS:
                raise JournalStateError(f"extra field {name!r} collides with a journal field")

    @property
    def count(self) -> int:
        return sum(len(s.done) + len(s.pending) for s in (*self.devices.values(), self.unscoped))

    def scope(self, device_id: str) -> Snapshot:
        return self.devices.get(check_device_id(device_id), Snapshot())

    def with_scope(self, device_id: str, scope: Snapshot) -> KeyedSnapshot:
        devices = dict(self.devices)
        devices[check_device_id(device_id)] = scope
        return KeyedSnapshot({d: s for d, s in devices.items() if s.done or s.pending},
                             self.unscoped, self.extra)


def encode_keyed(snapshot: KeyedSnapshot) -> bytes:
    """The version-2 file bytes of ``snapshot``; ``JournalLimitError`` if over either limit."""
    _check_count(snapshot.count)
    devices = {d: {"done": sorted(format_key(k) for k in s.done),
                   "pending": sorted(format_key(k) for k in s.pending)}
               for d, s in sorted(snapshot.devices.items())}
    doc: dict[str, object] = {"format": FORMAT_NAME, "version": KEYED_FORMAT_VERSION,
                              "devices": devices}
    u = snapshot.unscoped
    if u.done or u.pending or u.extra:
        doc["unscoped"] = {"done": sorted(format_key(k) for k in u.done),
                           "pending": sorted(format_key(k) for k in u.pending), **u.extra}
    doc.update(snapshot.extra)
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise JournalStateError(f"extra fields are not plain JSON: {exc}") from exc
    data = text.encode("ascii") + b"\n"
    _check_size(len(data))
    return data


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
    snap = KeyedSnapshot(devices, unscoped, extra)
    _check_count(snap.count)
    return snap


def load_keyed(path: str | os.PathLike[str]) -> KeyedSnapshot:
    """Read the journal at ``path`` (either version). A missing file is the empty snapshot."""
    p = os.fspath(path)
    data = _read_existing(p)
    return KeyedSnapshot() if data is None else decode_keyed(data, where=p)


def save_keyed(path: str | os.PathLike[str], snapshot: KeyedSnapshot) -> None:
    """Replace the journal at ``path`` with ``snapshot`` (version 2), atomically and durably."""
    p = os.fspath(path)
    data = encode_keyed(snapshot)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise JournalUnsafeFileError(f"{p}: is {kind_of(st.st_mode)}; refused")
    _replace(p, data)


class DeviceJournal:
    """One journal file serving many devices: the state of a step is kept per (device id, step
    key), so a step receipted on one device is still to run on another. Same transitions, limits
    and file rules as ``ReceiptJournal``; every change is on disk when it returns, a refused
    change leaves the file and this object as they were. Hold ``lock_journal(path)`` around a
    run: one writer per journal."""

    def __init__(self, path: str | os.PathLike[str], snapshot: KeyedSnapshot) -> None:
        self._path = os.fspath(path)
        self._snapshot = snapshot

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> DeviceJournal:
        return cls(path, load_keyed(path))

    @property
    def path(self) -> str:
        return self._path

    @property
    def snapshot(self) -> KeyedSnapshot:
        return self._snapshot

    def done(self, device_id: str) -> frozenset[uuid.UUID]:
        return self._snapshot.scope(device_id).done

    def pending(self, device_id: str) -> frozenset[uuid.UUID]:
        return self._snapshot.scope(device_id).pending

    def state(self, device_id: str, key: KeyLike) -> StepState:
        return self._snapshot.scope(device_id).state(_as_key(key))

    def begin(self, device_id: str, key: KeyLike) -> None:
        self._apply(device_id, _as_key(key), StepEvent.BEGIN)

    def complete(self, device_id: str, key: KeyLike) -> None:
        self._apply(device_id, _as_key(key), StepEvent.EXECUTED)

    def resolve(self, device_id: str, key: KeyLike, executed: bool) -> None:
        event = StepEvent.EXECUTED if executed else StepEvent.NOT_EXECUTED
        self._apply(device_id, _as_key(key), event)

    def _apply(self, device_id: str, key: uuid.UUID, event: StepEvent) -> None:
        scope = self._snapshot.scope(device_id)
        current = scope.state(key)
        nxt = TRANSITIONS.get((current, event))
        if nxt is None:
            text = f"device {device_id} step {format_key(key)}"
            if current is StepState.DONE:
                raise JournalDuplicateError(f"{text}: already receipted; {event.value} refused")
            raise JournalStateError(f"{text}: {event.value} is not allowed when {current.value}")
        new = self._snapshot.with_scope(device_id, scope.with_state(key, nxt))
        save_keyed(self._path, new)
        self._snapshot = new


# ------------------------------------------------------------------------------------- lock


class JournalBusyError(JournalError):
    """Another process holds the journal's lock: one writer per journal."""


class JournalLock:
    """An exclusive ``fcntl.flock`` on ``<journal>.lock``, held while the object is open. The lock
    file is created 0600 on first use and never deleted (deleting it would let two processes lock
    two different files); the lock dies with the process that holds it, so it is never stale."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> JournalLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_path(journal: str | os.PathLike[str]) -> str:
    return os.fspath(journal) + ".lock"


def lock_journal(journal: str | os.PathLike[str]) -> JournalLock:
    """Take the journal's lock at once or raise ``JournalBusyError`` naming the holder's pid (as
    it wrote it); ``JournalUnsafeFileError`` if the lock path is a symlink or not a private
    regular file; ``JournalError`` if it cannot be created."""
    p = lock_path(journal)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(p, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JournalUnsafeFileError(f"{p}: is a symbolic link; refused") from exc
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP, errno.EISDIR):
            raise JournalUnsafeFileError(f"{p}: is not a regular file; refused") from exc
        raise JournalError(f"{p}: cannot open the journal lock: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JournalUnsafeFileError(f"{p}: is {kind_of(st.st_mode)}; refused")
        if st.st_uid != os.geteuid():
            raise JournalUnsafeFileError(f"{p}: owned by uid {st.st_uid}; refused")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise JournalBusyError(
                f"journal {os.fspath(journal)} is in use by another process"
                + (f" (pid {holder})" if holder.isdigit() else "")
                + ": one apply per journal at a time") from None
        os.fchmod(fd, FILE_MODE)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except OSError as exc:
        os.close(fd)
        raise JournalError(f"{p}: cannot lock: {exc.strerror}") from exc
    except BaseException:
        os.close(fd)
        raise
    return JournalLock(p, fd)
