"""The gateway's call store: one SQLite file per gateway (WAL, ``synchronous=FULL``).

Contract (docs/GATEWAY.md, "The store"):

- One row per call with an effect, keyed by (caller id, idempotency key): the digest of its
  content, the port, operation and arguments, and its state — ``accepted`` (on disk, nothing
  sent), ``started`` (the device sequence number it travels under, ``epoch``/``seq``, and its
  request PDU are on disk: written *before* the request leaves), ``done`` (the result body is
  final). Every change is one transaction, synced to disk when the call returns (WAL with
  ``synchronous=FULL``): a gateway killed at any moment finds, after restart, exactly what it had
  sent under which number. Two kinds of write a restart does not need are written to the WAL
  without their own sync and synced by the next synced one: ``accepted`` (a call never sent is
  released at start whether or not its record survived) and audit entries (a killed process
  loses none; a power cut may lose the last ones). A call's ``done`` may also be written
  unsynced when its answer waits for the next synced transaction (``syncs``/``sync``): under load
  the next call's ``started`` syncs the previous call's outcome with it (group commit).
- Open items: a ``done`` row whose outcome is UNKNOWN and that nobody acknowledged; ``acknowledge``
  records who and why (and when). They are never pruned.
- The audit log: who (caller id), what (method, path, content), when, key, outcome, HTTP status.
- Bounded (``StoreLimits``, settings of the gateway; these constants are the defaults): at most
  ``MAX_CALLS`` call rows and ``MAX_AUDIT`` audit rows (refusals, which make no call row, up to
  ``MAX_AUDIT_SLACK`` more), a file of at most ``MAX_BYTES``, each row's text at most
  ``MAX_TEXT`` bytes. Audit rows older than the retention window (``calls.RETENTION_SECONDS``
  by default) are pruned, call rows ``PRUNE_GRACE_SECONDS`` after it (by the key's time),
  except calls not ``done`` and open items; a store (or audit log) still full after pruning —
  or a file at ``max_bytes`` — refuses the new call (``StoreFull``: NOT_EXECUTED, safe to retry
  later): it never drops a record that is still needed. Every per-call query uses an index;
  the row counts are kept in memory.
- Any SQLite failure (disk full, I/O error) is ``StoreError`` and the transaction is rolled back;
  a store file (or its ``-wal``) removed or replaced under the gateway refuses new calls
  (``check_file``).
- One gateway per store: ``<path>.lock`` (``idemlink.protocol.regular_file.lock_file``) or
  ``StoreBusy``. The file is private (created 0600; a store readable by group or others, or a
  symbolic link, is refused: ``StoreUnsafe``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from idemlink.gateway.calls import RETENTION_SECONDS
from idemlink.protocol.outcome import IdemlinkError
from idemlink.protocol.regular_file import FileLock, LockHeld, lock_file

MAX_CALLS = 100_000
MAX_AUDIT = 200_000
MAX_BYTES = 256 * 1024 * 1024
MAX_TEXT = 16 * 1024
MAX_AUDIT_SLACK = 10_000
"""Refusals (which make no call record) may still be audited this far past ``MAX_AUDIT``."""

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    caller TEXT NOT NULL, key TEXT NOT NULL, key_ms INTEGER NOT NULL, digest TEXT NOT NULL,
    port TEXT NOT NULL, op TEXT NOT NULL, args TEXT NOT NULL, state TEXT NOT NULL,
    epoch INTEGER, seq INTEGER, pdu TEXT, outcome TEXT, body TEXT,
    ack_by TEXT, ack_reason TEXT, ack_ms INTEGER, created_ms INTEGER NOT NULL,
    PRIMARY KEY (caller, key));
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, caller TEXT NOT NULL,
    method TEXT NOT NULL, path TEXT NOT NULL, content TEXT NOT NULL, key TEXT,
    outcome TEXT NOT NULL, http INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sync (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS calls_by_key ON calls (key);
CREATE INDEX IF NOT EXISTS calls_done_by_age ON calls (key_ms) WHERE state='done';
CREATE INDEX IF NOT EXISTS calls_unsettled ON calls (created_ms) WHERE state!='done';
CREATE INDEX IF NOT EXISTS calls_open ON calls (created_ms)
    WHERE state='done' AND outcome='UNKNOWN' AND ack_by IS NULL;
CREATE INDEX IF NOT EXISTS audit_by_age ON audit (at_ms);
"""
"""Every query the gateway makes per call uses an index (``tests/test_gateway_calls.py`` reads
the query plans): a store near its bound costs a call what an empty one does."""

PRUNE_GRACE_SECONDS = 3600
"""How much longer than the retention window a settled record is kept: a retry that crosses the
line still finds it (replayed), while a *new* key older than the window is refused."""


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """The store's bounds, settings of the gateway (``idemlink gateway --max-calls ...``,
    docs/GATEWAY.md "Limits"); the defaults are the module's constants. ``max_bytes`` bounds the
    database file (SQLite's ``max_page_count``): a store at it refuses new calls
    (``StoreFull``) as one at ``max_calls`` does."""

    max_calls: int = MAX_CALLS
    max_audit: int = MAX_AUDIT
    retention_seconds: int = RETENTION_SECONDS
    max_bytes: int = MAX_BYTES

    def check(self) -> StoreLimits:
        """Itself, or ``StoreError`` naming the setting out of its range."""
        for name, value, low, high in (
                ("max_calls", self.max_calls, 1, 10_000_000),
                ("max_audit", self.max_audit, 1, 20_000_000),
                ("retention_seconds", self.retention_seconds, 60, 30 * 86400),
                ("max_bytes", self.max_bytes, 1024 * 1024, 64 * 1024**3)):
            if not low <= value <= high:
                raise StoreError(f"store limit {name} = {value}: must be {low} to {high}")
        return self


def bound_size(db: sqlite3.Connection, limits: StoreLimits) -> None:
    """Bound the file to ``limits.max_bytes`` for writes through ``db`` (SQLite's
    ``max_page_count`` is a setting of the connection: each one that writes sets it)."""
    (page,) = db.execute("PRAGMA page_size").fetchone()
    db.execute(f"PRAGMA max_page_count={max(16, limits.max_bytes // page)}")


def at_size_limit(db: sqlite3.Connection) -> bool:
    """Whether the file is within a few pages of its ``max_page_count`` (SQLITE_FULL is the same
    error for a full disk and for the page limit)."""
    try:
        (pages,) = db.execute("PRAGMA page_count").fetchone()
        (cap,) = db.execute("PRAGMA max_page_count").fetchone()
    except sqlite3.Error:
        return False
    return bool(pages >= cap - 8)


class StoreError(IdemlinkError):
    """The call store cannot be used (or cannot be written now: disk full, I/O error, the file
    removed under the gateway)."""


class StoreBusy(StoreError):
    """Another gateway holds this store."""


class StoreUnsafe(StoreError):
    """The store's path is a symbolic link, not a regular file, or readable by others."""


class StoreFull(StoreError):
    """The store is at its bound with records still needed: the call is refused, nothing sent."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    caller: str
    key: str
    key_ms: int
    digest: str
    port: str
    op: str
    args: dict[str, Any]
    state: str  #: accepted / started / done
    epoch: int | None
    seq: int | None
    pdu: bytes | None
    outcome: str | None
    body: dict[str, Any] | None
    ack_by: str | None
    ack_reason: str | None
    ack_ms: int | None

    @property
    def open_item(self) -> bool:
        return self.state == "done" and self.outcome == "UNKNOWN" and self.ack_by is None

    def summary(self) -> dict[str, Any]:
        return {"caller": self.caller, "key": self.key, "port": self.port, "op": self.op,
                "args": self.args, "state": self.state, "outcome": self.outcome,
                "epoch": self.epoch, "seq": self.seq, "acknowledged_by": self.ack_by,
                "acknowledge_reason": self.ack_reason, "acknowledged_ms": self.ack_ms,
                "result": self.body}


def _text(value: Mapping[str, Any] | None) -> str | None:
    if value is None:
        return None
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_TEXT:
        raise StoreFull(f"a record of {len(text)} bytes is over the store's {MAX_TEXT}-byte limit")
    return text


def _check_file(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise StoreUnsafe(f"store {path}: not a regular file (a symbolic link or other): refused")
    if st.st_mode & 0o077:
        raise StoreUnsafe(f"store {path}: readable or writable by group or others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")


class CallStore:
    """The store (see the module docstring). Not thread-safe: one event loop uses it."""

    def __init__(self, path: str, db: sqlite3.Connection, lock: FileLock,
                 limits: StoreLimits = StoreLimits()) -> None:
        self.path = path
        self.limits = limits
        self._db = db
        self._lock = lock
        st = os.stat(path)
        self._identity = (st.st_dev, st.st_ino)
        self._wal_identity = self._identity_of(path + "-wal")  # there while the store is open
        self.syncs = 0  #: synced transactions so far (each also syncs every unsynced one before)
        self.unsynced = False  #: a transaction since the last synced one was not synced
        self._calls: int = db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
        self._audits: int = db.execute("SELECT COUNT(*) FROM audit").fetchone()[0]

    @classmethod
    def open(cls, path: str | os.PathLike[str], limits: StoreLimits | None = None) -> CallStore:
        p = os.fspath(path)
        limits = (limits or StoreLimits()).check()
        try:
            lock = lock_file(p + ".lock")
        except LockHeld as exc:
            raise StoreBusy(f"store {p} is in use by another gateway ({exc})") from exc
        except OSError as exc:
            raise StoreError(f"store {p}: {exc.strerror or exc}") from exc
        try:
            _check_file(p)
            db = sqlite3.connect(p, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            bound_size(db, limits)
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version == 0:
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise StoreError(f"store {p}: schema version {version}, this gateway reads "
                                 f"{SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            lock.release()
            raise StoreError(f"store {p}: not a gateway store ({exc})") from exc
        except BaseException:
            lock.release()
            raise
        return cls(p, db, lock, limits)

    def close(self) -> None:
        self._db.close()
        self._lock.release()

    @contextmanager
    def _tx(self, synced: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction, on disk when it ends (``synced``); any SQLite failure (disk full, I/O
        error) is ``StoreError`` and leaves the store as it was. Not ``synced``: written to the
        WAL (a killed process loses nothing) and synced by the next synced transaction (a power
        cut may lose it) — for what a restart does not need: an ``accepted`` record (released at
        start anyway) and an audit entry."""
        db = self._db
        try:
            if not synced:
                db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            if not synced:
                db.execute("PRAGMA synchronous=FULL")
                self.unsynced = True
            else:
                self.syncs += 1
                self.unsynced = False
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.execute("PRAGMA synchronous=FULL")
            self._recount()
            if isinstance(exc, sqlite3.DatabaseError) and at_size_limit(db):
                raise StoreFull(f"store {self.path} is at its size limit "
                                f"({self.limits.max_bytes} bytes): retry later") from exc
            raise StoreError(f"store {self.path}: cannot be written ({exc})") from exc

    def _recount(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._calls = self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
            self._audits = self._db.execute("SELECT COUNT(*) FROM audit").fetchone()[0]

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"store {self.path}: cannot be read ({exc})") from exc

    @staticmethod
    def _identity_of(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def check_file(self) -> None:
        """``StoreError`` if the store's path — or its write-ahead log's, which holds what was
        written since the last checkpoint — no longer names the file this gateway writes (it
        was removed or replaced): what it writes now would be lost at the next start."""
        if self._wal_identity is None:  # not made yet when the store was opened
            self._wal_identity = self._identity_of(self.path + "-wal")
        wal = self._identity_of(self.path + "-wal") if self._wal_identity else None
        if self._identity_of(self.path) != self._identity or wal != self._wal_identity:
            raise StoreError(f"store {self.path} was removed or replaced under the running "
                             "gateway: what it recorded would be lost at the next start; calls "
                             "with an effect are refused until it is restarted")

    # ------------------------------------------------------------------ calls
    def get(self, caller: str, key: str) -> CallRecord | None:
        rows = self._read("SELECT * FROM calls WHERE caller=? AND key=?", (caller, key))
        return _record(rows[0]) if rows else None

    def find_key(self, key: str) -> list[CallRecord]:
        return [_record(r) for r in self._read("SELECT * FROM calls WHERE key=?", (key,))]

    def begin(self, caller: str, key: str, key_ms: int, digest: str, port: str, op: str,
              args: Mapping[str, Any], now_ms: int) -> None:
        """A new call, ``accepted``, on disk when this returns (``StoreFull`` at the bound)."""
        args_text = _text(args)
        self.check_file()
        with self._tx(synced=False) as db:
            self._prune(db, now_ms)
            if self._calls >= self.limits.max_calls:
                raise StoreFull(f"the store holds {self._calls} calls still within retention or "
                                f"unsettled (limit {self.limits.max_calls}): retry later")
            if self._audits >= self.limits.max_audit:
                raise StoreFull(f"the audit log holds {self._audits} entries within retention "
                                f"(limit {self.limits.max_audit}): retry later")
            db.execute("INSERT INTO calls (caller, key, key_ms, digest, port, op, args, state, "
                       "created_ms) VALUES (?,?,?,?,?,?,?,'accepted',?)",
                       (caller, key, key_ms, digest, port, op, args_text, now_ms))
            self._calls += 1

    def started(self, caller: str, key: str, number: tuple[int, int] | None, pdu: bytes) -> None:
        """The number and PDU the request travels under: on disk before it leaves."""
        epoch, seq = number if number is not None else (None, None)
        with self._tx() as db:
            db.execute("UPDATE calls SET state='started', epoch=?, seq=?, pdu=? WHERE caller=? "
                       "AND key=?", (epoch, seq, pdu.hex(), caller, key))

    def finish(self, caller: str, key: str, outcome: str, body: Mapping[str, Any], *,
               synced: bool = True) -> None:
        """The call's outcome, final. Not ``synced``: the caller must ``sync`` (or see another
        synced transaction, ``syncs`` moving on) before it answers anyone with it."""
        with self._tx(synced) as db:
            db.execute("UPDATE calls SET state='done', outcome=?, body=? WHERE caller=? AND key=?",
                       (outcome, _text(body), caller, key))

    def sync(self) -> None:
        """Everything written so far on disk (one synced transaction, if anything is unsynced)."""
        if self.unsynced:
            with self._tx() as db:
                db.execute("INSERT OR REPLACE INTO sync (id, n) VALUES (1, ?)", (self.syncs,))

    def release(self, caller: str, key: str) -> None:
        """Drop a call that did not run: the key may be used again."""
        with self._tx() as db:
            self._calls -= db.execute("DELETE FROM calls WHERE caller=? AND key=?",
                                      (caller, key)).rowcount

    def unsettled(self, port: str | None = None) -> list[CallRecord]:
        """Calls not ``done`` (a gateway stopped while they ran), oldest first."""
        rows = self._read("SELECT * FROM calls WHERE state!='done' ORDER BY created_ms")
        return [r for r in map(_record, rows) if port is None or r.port == port]

    def open_items(self) -> list[CallRecord]:
        rows = self._read("SELECT * FROM calls WHERE state='done' AND outcome='UNKNOWN' AND "
                          "ack_by IS NULL ORDER BY created_ms")
        return [_record(r) for r in rows]

    def acknowledge(self, caller: str, key: str, by: str, reason: str, now_ms: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE calls SET ack_by=?, ack_reason=?, ack_ms=? WHERE caller=? AND "
                       "key=?", (by, reason[:1000], now_ms, caller, key))

    # ------------------------------------------------------------------ audit
    def audit(self, at_ms: int, caller: str, method: str, path: str,
              content: Mapping[str, Any] | None, key: str | None, outcome: str,
              http: int) -> None:
        """One entry. At the bound (``MAX_AUDIT`` entries within retention) a refusal's entry is
        not written (``StoreFull``); calls with an effect are refused before that (``begin``).
        Synced with the next call record (``_tx``)."""
        with self._tx(synced=False) as db:
            if self._audits >= self.limits.max_audit:
                self._audits -= db.execute(
                    "DELETE FROM audit WHERE at_ms < ?",
                    (at_ms - self.limits.retention_seconds * 1000,)).rowcount
            if self._audits >= self.limits.max_audit + MAX_AUDIT_SLACK:
                raise StoreFull(f"the audit log is full ({self._audits} entries within retention)")
            db.execute("INSERT INTO audit (at_ms, caller, method, path, content, key, outcome, "
                       "http) VALUES (?,?,?,?,?,?,?,?)",
                       (at_ms, caller, method, path, _text(content) or "{}", key, outcome, http))
            self._audits += 1

    def audit_entries(self, limit: int = 100, after: int | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` entries, newest first; with ``after``, the oldest ``limit``
        entries whose id is above it, oldest first (to read the whole log page by page)."""
        columns = "id, at_ms, caller, method, path, content, key, outcome, http"
        if after is None:
            rows = self._read(f"SELECT {columns} FROM audit ORDER BY id DESC LIMIT ?",
                              (min(limit, 1000),))
        else:
            rows = self._read(f"SELECT {columns} FROM audit WHERE id > ? ORDER BY id LIMIT ?",
                              (after, min(limit, 1000)))
        return [{"id": r[0], "at_ms": r[1], "caller": r[2], "method": r[3], "path": r[4],
                 "content": json.loads(r[5]), "key": r[6], "outcome": r[7], "http": r[8]}
                for r in rows]

    def _prune(self, db: sqlite3.Connection, now_ms: int) -> None:
        horizon = now_ms - self.limits.retention_seconds * 1000
        self._calls -= db.execute(
            "DELETE FROM calls WHERE key_ms < ? AND state='done' AND NOT "
            "(outcome='UNKNOWN' AND ack_by IS NULL)",
            (horizon - PRUNE_GRACE_SECONDS * 1000,)).rowcount
        self._audits -= db.execute("DELETE FROM audit WHERE at_ms < ?", (horizon,)).rowcount


def _record(row: tuple[Any, ...]) -> CallRecord:
    (caller, key, key_ms, digest, port, op, args, state, epoch, seq, pdu, outcome, body,
     ack_by, ack_reason, ack_ms, _created) = row
    return CallRecord(caller, key, key_ms, digest, port, op, json.loads(args), state, epoch, seq,
                      None if pdu is None else bytes.fromhex(pdu), outcome,
                      None if body is None else json.loads(body), ack_by, ack_reason, ack_ms)


__all__ = [
    "MAX_AUDIT",
    "MAX_BYTES",
    "MAX_CALLS",
    "MAX_TEXT",
    "PRUNE_GRACE_SECONDS",
    "CallRecord",
    "CallStore",
    "StoreBusy",
    "StoreError",
    "StoreFull",
    "StoreLimits",
    "StoreUnsafe",
    "at_size_limit",
    "bound_size",
]
