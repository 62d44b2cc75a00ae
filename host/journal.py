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
- Every change rewrites the whole snapshot by atomic replacement
  (``idemlink.protocol.regular_file.write_regular_file``): a temp file with a unique name
  (``.<name>.XXXXXXXXXXXX.tmp`` in the same directory, created 0600 with ``O_EXCL``; two processes
  never share one), written, fsynced, ``os.replace``d over the journal, then the directory
  fsynced. A reader sees the old file or the new one, never half.
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
- What a pending step sent (``SentRecord``): ``begin(device, key, sent)`` records, in the same
  atomic change that makes the step pending, the request's PDU and the (epoch, seq) it travels
  under, *before* it is sent — so a later process can ask the device whether it ran
  (``idemlink.host.evidence``). Stored in the optional top-level field (additive: older readers
  keep it as an unknown field)::

      "in_flight":{"<device id>":{"<id>":{"request":"<hex PDU>","epoch":E,"seq":S}}}

  (``epoch``/``seq`` absent for a plain Modbus slave). Only pending steps have a record: a step
  that leaves PENDING drops it; a record found for a step not pending (left by an older reader) is
  dropped on load. A malformed record is ``JournalCorruptError``.
  The limits (``MAX_IDS``, ``MAX_ENCODED_BYTES``) count the whole file, all devices together.
  ``decode``/``load``/``ReceiptJournal`` (the single-scope API) refuse a version-2 file
  (``JournalVersionError``).
- One writer per journal: ``lock_journal(path)`` takes an exclusive ``fcntl.flock`` (the one
  lock, ``idemlink.protocol.regular_file.lock_file``) on the sibling
  ``<path>.lock`` (created 0600, never deleted, a symlink refused) or raises ``JournalBusyError`` at
  once; the lock dies with its process, so it is never stale. ``run_steps`` does not take it: its
  caller does.

``run_steps`` is the job runner built on this: it re-executes nothing already receipted and
reports steps that were in flight as UNKNOWN - executing nothing - until they are reconciled.

Layout: this module holds the journal objects (``ReceiptJournal``, one job; ``DeviceJournal``, one
job per device; the same shell and the one transition rule, ``_next_state``) and the runner; the
format, snapshots and errors are ``idemlink.host.journal_format``'s, the file handling and the lock
``idemlink.host.journal_file``'s; import each name from the module that defines it.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from idemlink.host.journal_file import (
    load,
    load_keyed,
    save,
    save_keyed,
)
from idemlink.host.journal_format import (
    TRANSITIONS,
    JournalDuplicateError,
    JournalKeyError,
    JournalStateError,
    KeyedSnapshot,
    KeyLike,
    SentRecord,
    Snapshot,
    StepEvent,
    StepState,
    check_count,
)
from idemlink.host.keys import MalformedKeyError, format_key, parse_key
from idemlink.protocol.outcome import Outcome

__all__ = [
    "DeviceJournal",
    "KeyedStep",
    "ReceiptJournal",
    "RunReport",
    "run_steps",
]

log = logging.getLogger(__name__)

Snap = TypeVar("Snap", Snapshot, KeyedSnapshot)


# ------------------------------------------------------------------------------------ journal


def _as_key(key: object) -> uuid.UUID:
    if isinstance(key, uuid.UUID):
        return key
    try:
        return parse_key(key)
    except MalformedKeyError as exc:
        raise JournalKeyError(str(exc)) from exc


def _next_state(current: StepState, event: StepEvent, text: str) -> StepState:
    """Where ``event`` takes a step in state ``current`` (``TRANSITIONS``); a receipted step
    refuses everything (``JournalDuplicateError``), any other move off the table is a
    ``JournalStateError``. ``text`` names the step in the message."""
    nxt = TRANSITIONS.get((current, event))
    if nxt is None:
        if current is StepState.DONE:
            raise JournalDuplicateError(f"{text}: already receipted; {event.value} refused")
        raise JournalStateError(f"{text}: {event.value} is not allowed when {current.value}")
    return nxt


class _JournalShell(Generic[Snap]):
    """A journal bound to its file: the path, the snapshot in memory, and a change that is on
    disk before the object sees it (a refused change leaves both as they were)."""

    def __init__(self, path: str | os.PathLike[str], snapshot: Snap) -> None:
        self._path = os.fspath(path)
        self._snapshot: Snap = snapshot

    @property
    def path(self) -> str:
        return self._path

    @property
    def snapshot(self) -> Snap:
        return self._snapshot

    def _commit(self, new: Snap, store: Callable[[str, Snap], None]) -> None:
        store(self._path, new)
        self._snapshot = new


class ReceiptJournal(_JournalShell[Snapshot]):
    """The journal of one job, bound to its file. Every state change is on disk when it returns;
    a refused change leaves both the file and this object as they were."""

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ReceiptJournal:
        """Load the journal at ``path`` (missing means empty; nothing is created until a change)."""
        return cls(path, load(path))

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
        nxt = _next_state(current, event, format_key(key))
        self._commit(self._snapshot.with_state(key, nxt), save)
        log.debug("journal %s: %s %s -> %s", self._path, format_key(key), current.value, nxt.value)


class DeviceJournal(_JournalShell[KeyedSnapshot]):
    """One journal file serving many devices: the state of a step is kept per (device id, step
    key), so a step receipted on one device is still to run on another. Same transitions, limits
    and file rules as ``ReceiptJournal``; every change is on disk when it returns, a refused
    change leaves the file and this object as they were. Hold ``lock_journal(path)`` around a
    run: one writer per journal."""

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> DeviceJournal:
        return cls(path, load_keyed(path))

    def done(self, device_id: str) -> frozenset[uuid.UUID]:
        return self._snapshot.scope(device_id).done

    def pending(self, device_id: str) -> frozenset[uuid.UUID]:
        return self._snapshot.scope(device_id).pending

    def state(self, device_id: str, key: KeyLike) -> StepState:
        return self._snapshot.scope(device_id).state(_as_key(key))

    def begin(self, device_id: str, key: KeyLike, sent: SentRecord | None = None) -> None:
        """The step is about to run: pending, with ``sent`` (its request's PDU and number,
        recorded before it leaves) in the same atomic change."""
        self._apply(device_id, _as_key(key), StepEvent.BEGIN, sent)

    def sent_record(self, device_id: str, key: KeyLike) -> SentRecord | None:
        """What was recorded of a pending step's request before it left (None: nothing, e.g. a
        journal written by an older version)."""
        return self._snapshot.sent_record(device_id, _as_key(key))

    def complete(self, device_id: str, key: KeyLike) -> None:
        self._apply(device_id, _as_key(key), StepEvent.EXECUTED)

    def resolve(self, device_id: str, key: KeyLike, executed: bool) -> None:
        event = StepEvent.EXECUTED if executed else StepEvent.NOT_EXECUTED
        self._apply(device_id, _as_key(key), event)

    def _apply(self, device_id: str, key: uuid.UUID, event: StepEvent,
               sent: SentRecord | None = None) -> None:
        scope = self._snapshot.scope(device_id)
        nxt = _next_state(scope.state(key), event, f"device {device_id} step {format_key(key)}")
        self._commit(self._snapshot.with_scope(device_id, scope.with_state(key, nxt),
                                               None if sent is None else (key, sent)), save_keyed)


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
    check_count(len(journal.done | journal.pending | set(keys)))

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
