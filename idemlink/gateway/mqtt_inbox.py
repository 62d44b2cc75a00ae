"""The MQTT bridge's inbox and outbox: one table in the gateway's store file.

Contract (docs/GATEWAY.md, "The fleet"):

- A command is written here, synced, *before* the gateway acknowledges its message to the
  broker (PUBACK): a gateway killed after the PUBACK finds it at the next start; one killed
  before it gets the message again from the broker (the session is persistent). One row per
  (caller, key): a copy with the same content (a QoS 1 redelivery, a caller's retry) is a
  ``DUPLICATE`` and adds nothing; other content under the key is a ``CONFLICT``.
- States: ``pending`` (the call is to run, or to be asked again under its key), ``done`` (its
  outcome message is written here, to be published), ``published`` (the broker acknowledged
  it). A restarted gateway runs every ``pending`` row again under its key — the call layer
  replays or settles it, never runs it twice — and publishes every ``done`` row it cannot find
  on the broker already.
- Refusals (a message refused before it is a call, or a key another call — over HTTP — holds
  with other content) wait in ``mqtt_refusals`` until the broker acknowledges them (at most
  ``MAX_REFUSALS``; more are logged, not kept); a command refused so has no row: it never
  stands for the key. A finished row whose call never ran (the call layer released the key)
  is set ``pending`` again when its command comes again (``again``): a caller's retry of a
  "safe to retry" outcome runs.
- Bounded: at most ``MAX_ROWS`` rows, ``MAX_OPEN`` of them not yet published,
  ``MAX_OPEN_PER_CALLER`` of one caller (a full inbox, or a caller's full share, refuses the
  command: ``InboxFull``); published rows are pruned with the call store's
  retention (``StoreLimits.retention_seconds``, by the key's time). The file is the store's, so
  its size limit (``StoreLimits.max_bytes``, SQLite's ``max_page_count``, set on this
  connection too) bounds the inbox as well: a write at it is ``StoreFull``. Any other SQLite
  failure is ``StoreError``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any

from idemlink.gateway import calls
from idemlink.gateway.mqtt_topics import Command
from idemlink.gateway.store import (
    PRUNE_GRACE_SECONDS,
    StoreError,
    StoreFull,
    StoreLimits,
    at_size_limit,
    bound_size,
)

MAX_ROWS = 100_000
MAX_OPEN = 10_000
MAX_OPEN_PER_CALLER = 1_000
"""Commands of one caller not yet answered: a caller's flood fills its own share, not the inbox
every other caller needs."""
MAX_REFUSALS = 1_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mqtt_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, caller TEXT NOT NULL, key TEXT NOT NULL,
    key_ms INTEGER NOT NULL, digest TEXT NOT NULL, port TEXT NOT NULL, op TEXT NOT NULL,
    args TEXT NOT NULL, deadline_ms INTEGER NOT NULL, state TEXT NOT NULL, topic TEXT,
    payload TEXT, retained INTEGER NOT NULL DEFAULT 0, UNIQUE (caller, key));
CREATE INDEX IF NOT EXISTS mqtt_inbox_open ON mqtt_inbox (port, id) WHERE state!='published';
CREATE INDEX IF NOT EXISTS mqtt_inbox_done ON mqtt_inbox (id) WHERE state='done';
CREATE INDEX IF NOT EXISTS mqtt_inbox_age ON mqtt_inbox (key_ms) WHERE state='published';
CREATE TABLE IF NOT EXISTS mqtt_refusals (
    id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload TEXT NOT NULL);
"""


class InboxFull(StoreFull):
    """The inbox holds ``MAX_OPEN`` commands not yet published (or ``MAX_ROWS`` in all)."""


class Added(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    caller: str
    key: str
    port: str
    op: str
    args: dict[str, Any]
    deadline_ms: int
    state: str
    topic: str | None
    payload: bytes | None
    retained: bool


class Inbox:
    """The inbox (see the module docstring): its own connection to the store's file (the call
    store holds the file's lock). Not thread-safe: the gateway's event loop uses it."""

    def __init__(self, path: str, limits: StoreLimits | None = None) -> None:
        self.path = path
        self.limits = limits or StoreLimits()
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute("PRAGMA synchronous=FULL")
            bound_size(self._db, self.limits)
            self._db.executescript(_SCHEMA)
            self._rows: int = self._db.execute("SELECT COUNT(*) FROM mqtt_inbox").fetchone()[0]
            self._open: int = self._db.execute(
                "SELECT COUNT(*) FROM mqtt_inbox WHERE state!='published'").fetchone()[0]
            self._open_by: dict[str, int] = self._open_by_caller()
            self._refusals: int = self._db.execute(
                "SELECT COUNT(*) FROM mqtt_refusals").fetchone()[0]
        except sqlite3.Error as exc:
            raise StoreError(f"store {path}: the MQTT inbox cannot be used ({exc})") from exc

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if db.in_transaction:
                    db.execute("ROLLBACK")
            self._recount()
            if isinstance(exc, sqlite3.DatabaseError) and at_size_limit(db):
                raise StoreFull(f"store {self.path} is at its size limit "
                                f"({self.limits.max_bytes} bytes): retry later") from exc
            raise StoreError(f"store {self.path}: the MQTT inbox cannot be written ({exc})") from exc

    def _recount(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._rows = self._db.execute("SELECT COUNT(*) FROM mqtt_inbox").fetchone()[0]
            self._open = self._db.execute(
                "SELECT COUNT(*) FROM mqtt_inbox WHERE state!='published'").fetchone()[0]
            self._open_by = self._open_by_caller()

    def _open_by_caller(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT caller, COUNT(*) FROM mqtt_inbox WHERE "
                                     "state!='published' GROUP BY caller").fetchall())

    def _opened(self, caller: str, n: int) -> None:
        left = self._open_by.get(caller, 0) + n
        if left > 0:
            self._open_by[caller] = left
        else:
            self._open_by.pop(caller, None)

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"store {self.path}: the MQTT inbox cannot be read ({exc})") from exc

    def add(self, cmd: Command, now_ms: int) -> Added:
        """Record a command (synced when this returns), or say it is a copy or a conflict."""
        digest = cmd.digest
        args = calls.canonical(cmd.args).decode()
        with self._tx() as db:
            row = db.execute("SELECT digest FROM mqtt_inbox WHERE caller=? AND key=?",
                             (cmd.caller, cmd.key)).fetchone()
            if row is not None:
                return Added.DUPLICATE if row[0] == digest else Added.CONFLICT
            self._prune(db, now_ms)
            if self._open >= MAX_OPEN or self._rows >= MAX_ROWS:
                raise InboxFull(f"the MQTT inbox holds {self._open} commands not yet answered "
                                f"(limit {MAX_OPEN}) of {self._rows} (limit {MAX_ROWS}): "
                                "retry later")
            mine = self._open_by.get(cmd.caller, 0)
            if mine >= MAX_OPEN_PER_CALLER:
                raise InboxFull(f"the MQTT inbox holds {mine} commands of caller {cmd.caller} "
                                f"not yet answered (limit {MAX_OPEN_PER_CALLER} a caller): "
                                "retry later")
            db.execute("INSERT INTO mqtt_inbox (caller, key, key_ms, digest, port, op, args, "
                       "deadline_ms, state) VALUES (?,?,?,?,?,?,?,?,'pending')",
                       (cmd.caller, cmd.key, calls.key_time_ms(cmd.key), digest, cmd.port,
                        cmd.op, args, now_ms + int(cmd.wait * 1000)))
            self._rows += 1
            self._open += 1
            self._opened(cmd.caller, 1)
        return Added.NEW

    def pending(self, port: str, limit: int = 100) -> list[Entry]:
        return self._entries("WHERE port=? AND state='pending' ORDER BY id LIMIT ?", (port, limit))

    def done(self, limit: int = 100) -> list[Entry]:
        """Rows whose outcome message is written and not yet acknowledged by the broker."""
        return self._entries("WHERE state='done' ORDER BY id LIMIT ?", (limit,))

    def get(self, caller: str, key: str) -> Entry | None:
        found = self._entries("WHERE caller=? AND key=?", (caller, key))
        return found[0] if found else None

    def _entries(self, where: str, args: tuple[Any, ...]) -> list[Entry]:
        rows = self._read("SELECT id, caller, key, port, op, args, deadline_ms, state, topic, "
                          f"payload, retained FROM mqtt_inbox {where}", args)
        return [Entry(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), r[6], r[7], r[8],
                      None if r[9] is None else r[9].encode(), bool(r[10])) for r in rows]

    def finish(self, entry: Entry, topic: str, payload: bytes, *, retained: bool) -> None:
        """The message that ends the command, to be published (synced)."""
        with self._tx() as db:
            db.execute("UPDATE mqtt_inbox SET state='done', topic=?, payload=?, retained=? "
                       "WHERE id=?", (topic, payload.decode(), int(retained), entry.id))

    def again(self, entry: Entry, deadline_ms: int) -> bool:
        """Run a finished row's command again under its key (synced): its call did not run and
        released the key, and the caller sent it again. False if the row is still pending."""
        with self._tx() as db:
            was = db.execute("SELECT state FROM mqtt_inbox WHERE id=?", (entry.id,)).fetchone()
            if was is None or was[0] == "pending":
                return False
            db.execute("UPDATE mqtt_inbox SET state='pending', topic=NULL, payload=NULL, "
                       "retained=0, deadline_ms=? WHERE id=?", (deadline_ms, entry.id))
            if was[0] == "published":
                self._open += 1
                self._opened(entry.caller, 1)
        return True

    def published(self, entry_id: int) -> None:
        """The broker acknowledged the row's message."""
        with self._tx() as db:
            row = db.execute("SELECT caller FROM mqtt_inbox WHERE id=? AND state='done'",
                             (entry_id,)).fetchone()
            n = db.execute("UPDATE mqtt_inbox SET state='published' WHERE id=? AND "
                           "state='done'", (entry_id,)).rowcount
            self._open -= n
            if row is not None:
                self._opened(row[0], -n)

    # ------------------------------------------------------------------ refusals
    def refuse(self, topic: str, payload: bytes, entry: Entry | None = None) -> bool:
        """A refusal to publish (synced); with ``entry``, that command's row is dropped in the
        same transaction (its key is another call's: the row must not stand for it). False when
        ``MAX_REFUSALS`` wait already: the refusal is not kept (logged by the caller)."""
        with self._tx() as db:
            if entry is not None:
                gone = db.execute("DELETE FROM mqtt_inbox WHERE id=?", (entry.id,)).rowcount
                self._rows -= gone
                self._open -= gone
                self._opened(entry.caller, -gone)
            if self._refusals >= MAX_REFUSALS:
                return False
            db.execute("INSERT INTO mqtt_refusals (topic, payload) VALUES (?, ?)",
                       (topic, payload.decode()))
            self._refusals += 1
        return True

    def refusals(self, limit: int = 100) -> list[tuple[int, str, bytes]]:
        """Refusals not yet acknowledged by the broker: (id, topic, payload), oldest first."""
        return [(r[0], r[1], r[2].encode()) for r in self._read(
            "SELECT id, topic, payload FROM mqtt_refusals ORDER BY id LIMIT ?", (limit,))]

    def refusal_sent(self, refusal_id: int) -> None:
        with self._tx() as db:
            self._refusals -= db.execute("DELETE FROM mqtt_refusals WHERE id=?",
                                         (refusal_id,)).rowcount

    def _prune(self, db: sqlite3.Connection, now_ms: int) -> None:
        horizon = now_ms - (self.limits.retention_seconds + PRUNE_GRACE_SECONDS) * 1000
        self._rows -= db.execute("DELETE FROM mqtt_inbox WHERE key_ms < ? AND "
                                 "state='published'", (horizon,)).rowcount


__all__ = ["MAX_OPEN", "MAX_OPEN_PER_CALLER", "MAX_REFUSALS", "MAX_ROWS", "Added", "Entry", "Inbox",
           "InboxFull"]
