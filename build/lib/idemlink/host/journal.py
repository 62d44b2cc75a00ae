"""The receipt journal: crash-safe progress for a multi-step job (seed 003).

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
- Every change rewrites the whole snapshot by atomic replacement: temp file ``.<name>.tmp`` in the
  same directory created 0600 with ``O_EXCL | O_NOFOLLOW``, written, fsynced, ``os.replace``d over
  the journal, then the directory fsynced. A reader sees the old file or the new one, never half.
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
- Not supported: two processes changing one journal at once (one job runner per journal).

``run_steps`` is the job runner built on this: it re-executes nothing already receipted and
reports steps that were in flight as UNKNOWN - executing nothing - until they are reconciled.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, TypeVar

from idemlink.host.keys import MalformedKeyError, format_key, parse_key
from idemlink.protocol.outcome import Outcome

__all__ = [
    "FILE_MODE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_ENCODED_BYTES",
    "MAX_IDS",
    "TRANSITIONS",
    "JournalCorruptError",
    "JournalDuplicateError",
    "JournalError",
    "JournalKeyError",
    "JournalLimitError",
    "JournalStateError",
    "JournalUnsafeFileError",
    "JournalVersionError",
    "KeyedStep",
    "ReceiptJournal",
    "RunReport",
    "Snapshot",
    "StepEvent",
    "StepState",
    "decode",
    "encode",
    "load",
    "run_steps",
    "save",
]

log = logging.getLogger(__name__)

MAX_IDS = 1024
MAX_ENCODED_BYTES = 64 * 1024
FORMAT_NAME = "idemlink.receipt-journal"
FORMAT_VERSION = 1
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


def decode(data: bytes, where: str = "journal") -> Snapshot:
    """Decode file bytes strictly. Raises ``JournalLimitError`` over a limit,
    ``JournalVersionError`` for an unknown version, ``JournalCorruptError`` for anything else."""
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
    if version != FORMAT_VERSION:
        raise JournalVersionError(
            f"{where}: format version {version} is newer than this reader ({FORMAT_VERSION})"
        )
    done = _ids(doc, "done", where)
    pending = _ids(doc, "pending", where)
    _check_count(len(done) + len(pending))
    seen: set[uuid.UUID] = set()
    for key in (*done, *pending):
        if key in seen:
            raise JournalCorruptError(f"{where}: duplicate id {format_key(key)}")
        seen.add(key)
    extra = {k: v for k, v in doc.items() if k not in _KNOWN_FIELDS}
    return Snapshot(frozenset(done), frozenset(pending), extra)


# ------------------------------------------------------------------------------------- files


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_existing(path: str) -> int | None:
    """A descriptor on the journal, or None if there is none. Refuses anything not private and
    regular, judged on the opened descriptor (no check-then-open race)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JournalUnsafeFileError(f"{path}: is a symbolic link; refused") from exc
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):
            raise JournalUnsafeFileError(f"{path}: is a special file; refused") from exc
        raise JournalError(f"{path}: cannot open: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JournalUnsafeFileError(f"{path}: is {_kind(st.st_mode)}; refused")
        if st.st_mode & 0o077:
            raise JournalUnsafeFileError(
                f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read or write it; "
                f"a journal is private (chmod 600 {path})"
            )
        if st.st_uid != os.geteuid():
            raise JournalUnsafeFileError(
                f"{path}: owned by uid {st.st_uid}, not by this user ({os.geteuid()}); refused"
            )
        if st.st_size > MAX_ENCODED_BYTES:
            _check_size(st.st_size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_all(fd: int) -> bytes:
    chunks = []
    total = 0
    while total <= MAX_ENCODED_BYTES:
        chunk = os.read(fd, MAX_ENCODED_BYTES + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def load(path: str | os.PathLike[str]) -> Snapshot:
    """Read the journal at ``path``. A missing file is the empty snapshot."""
    p = os.fspath(path)
    fd = _open_existing(p)
    if fd is None:
        return Snapshot()
    try:
        data = _read_all(fd)
    finally:
        os.close(fd)
    return decode(data, where=p)


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
            raise JournalUnsafeFileError(f"{p}: is {_kind(st.st_mode)}; refused")
    directory, name = os.path.split(os.path.abspath(p))
    tmp = os.path.join(directory, f".{name}.tmp")
    try:
        # A crash may have left a temp file behind; it was never the journal.
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise JournalError(f"{tmp}: cannot remove stale temp file: {exc.strerror}") from exc
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, FILE_MODE)
    except OSError as exc:
        raise JournalError(f"{tmp}: cannot create: {exc.strerror}") from exc
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
