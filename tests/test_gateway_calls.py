"""The call layer's rules (``idemlink.gateway.calls``) and its store (``idemlink.gateway.store``),
without a server: keys and retention, digests, what a record decides, the HTTP table, the store's
durability settings, bounds, privacy and single writer."""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path

import pytest

from idemlink.gateway import calls, store
from idemlink.gateway.calls import Decision
from idemlink.gateway.store import CallStore, StoreBusy, StoreFull, StoreUnsafe
from idemlink.gateway.tokens import TokenFileError, caller_of, load_tokens, parse_tokens
from idemlink.host.keys import new_key
from idemlink.protocol.outcome import Outcome, Status

NOW = 1_800_000_000.0


def test_keys_are_uuid7_carrying_their_time() -> None:
    k = new_key(NOW)
    assert uuid.UUID(k).version == 7
    assert calls.key_time_ms(k) == int(NOW * 1000)
    assert calls.check_key(k, NOW + 3600) == k
    assert len({new_key(NOW) for _ in range(100)}) == 100


A_KEY = "01a3185c-5000-7539-8d95-05920d1c1c13"  # a UUIDv7 of NOW (fixed: xdist collects twice)
A_V4 = "9f1b1a52-3c56-4d6e-8f10-2b7c3a4d5e6f"


def test_the_fixed_key_is_of_now() -> None:
    assert calls.key_time_ms(A_KEY) == int(NOW * 1000)


@pytest.mark.parametrize("bad", [None, "", "abc", A_V4, A_KEY.upper(), A_KEY + " "])
def test_malformed_key_refused(bad: str | None) -> None:
    with pytest.raises(calls.MalformedIdempotencyKey):
        calls.check_key(bad, NOW)


def test_key_outside_retention_refused_not_new() -> None:
    old = new_key(NOW - calls.RETENTION_SECONDS - 1)
    with pytest.raises(calls.KeyOutsideRetention, match="older than the retention window"):
        calls.check_key(old, NOW)
    future = new_key(NOW + calls.MAX_CLOCK_SKEW_SECONDS + 1)
    with pytest.raises(calls.KeyOutsideRetention, match="future"):
        calls.check_key(future, NOW)
    assert calls.KeyOutsideRetention.http == 422


def test_digest_is_of_canonical_content() -> None:
    a = calls.digest("dev", "write", {"values": {"a": 1, "b": 2}})
    assert a == calls.digest("dev", "write", {"values": {"b": 2, "a": 1}})
    assert a != calls.digest("dev", "write", {"values": {"a": 1, "b": 3}})
    assert a != calls.digest("dev2", "write", {"values": {"a": 1, "b": 2}})
    assert a != calls.digest("dev", "write", {"values": {"a": 1, "b": 2}, "if_match": 3})


def test_decide_table() -> None:
    assert calls.decide(None, False, "d") is Decision.NEW
    assert calls.decide("d", True, "d") is Decision.REPLAY
    assert calls.decide("d", False, "d") is Decision.WAIT
    assert calls.decide("d", True, "e") is Decision.CONFLICT
    assert calls.decide("d", False, "e") is Decision.CONFLICT


@pytest.mark.parametrize(("outcome", "status", "reason", "http", "action", "kept"), [
    (Outcome.OK, Status.OK, "", 200, "none", True),
    (Outcome.NOT_EXECUTED, Status.GUARD_FAILED, "", 412, "do not retry", True),
    (Outcome.NOT_EXECUTED, Status.BUSY, "", 503, "safe to retry", False),
    (Outcome.NOT_EXECUTED, Status.EPOCH_MISMATCH, "", 503, "safe to retry", False),
    (Outcome.NOT_EXECUTED, None, "", 503, "safe to retry", False),
    (Outcome.NOT_EXECUTED, Status.IDEMPOTENCY_CONFLICT, "IDEMPOTENCY_CONFLICT", 409,
     "do not retry", True),
    (Outcome.NOT_EXECUTED, None, "UNKNOWN_OUTSTANDING", 409, "reconcile first", True),
    (Outcome.REJECTED, Status.MALFORMED_REQUEST, "", 422, "do not retry", True),
    (Outcome.UNKNOWN, Status.NO_ANSWER, "", 504, "reconcile first", True),
    (Outcome.UNKNOWN, Status.EPOCH_CHANGED_IN_FLIGHT, "", 502, "reconcile first", True),
])
def test_outcome_to_http(outcome: Outcome, status: Status | None, reason: str, http: int,
                         action: str, kept: bool) -> None:
    assert calls.rule_for(outcome, status, reason).http == http
    assert calls.action_for(outcome, status, reason) == action
    assert calls.keeps_key(outcome, status, reason) is kept


def test_unanswered_read_is_safe_to_retry() -> None:
    assert calls.action_for(Outcome.UNKNOWN, Status.NO_ANSWER, may_have_effect=False) == (
        "safe to retry")


def test_if_match() -> None:
    assert calls.parse_if_match(None) is None
    assert calls.parse_if_match('"7"') == 7
    assert calls.etag(7) == '"7"'
    for bad in ("7", 'W/"7"', '"x"', '"70000"', '"1", "2"'):
        with pytest.raises(calls.CallError):
            calls.parse_if_match(bad)


# ------------------------------------------------------------------------------- the store


def _begin(s: CallStore, key: str, now_ms: int, caller: str = "alice") -> None:
    s.begin(caller, key, calls.key_time_ms(key), "d", "dev", "write", {"values": {"a": 1}},
            now_ms)


def test_store_is_wal_synchronous_private(tmp_path: Path) -> None:
    p = tmp_path / "calls.db"
    s = CallStore.open(p)
    try:
        assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert os.stat(p).st_mode & 0o777 == 0o600
        with pytest.raises(StoreBusy):
            CallStore.open(p)
    finally:
        s.close()


def test_store_records_the_number_before_send_and_survives_reopen(tmp_path: Path) -> None:
    p = tmp_path / "calls.db"
    k = new_key(NOW)
    s = CallStore.open(p)
    _begin(s, k, int(NOW * 1000))
    s.started("alice", k, (0xABCD, 42), b"\x10\x00")
    s._db.close()  # no orderly close: as if killed
    s._lock.release()
    s = CallStore.open(p)
    try:
        rec = s.get("alice", k)
        assert rec is not None and rec.state == "started"
        assert (rec.epoch, rec.seq, rec.pdu) == (0xABCD, 42, b"\x10\x00")
        assert [r.key for r in s.unsettled("dev")] == [k]
        assert s.get("bob", k) is None  # scoped to the caller
    finally:
        s.close()


def test_store_refuses_unsafe_files(tmp_path: Path) -> None:
    p = tmp_path / "calls.db"
    p.write_bytes(b"")
    p.chmod(0o644)
    with pytest.raises(StoreUnsafe, match="chmod 600"):
        CallStore.open(p)
    link = tmp_path / "link.db"
    link.symlink_to(p)
    with pytest.raises(StoreUnsafe):
        CallStore.open(link)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    junk.chmod(0o600)
    with pytest.raises(store.StoreError):
        CallStore.open(junk)


def test_store_is_bounded_and_prunes_only_what_is_settled(tmp_path: Path) -> None:
    s = CallStore.open(tmp_path / "calls.db", store.StoreLimits(max_calls=3))
    now_ms = int(NOW * 1000)
    old = [new_key(NOW - 10) for _ in range(3)]
    try:
        for k in old:
            _begin(s, k, now_ms)
        with pytest.raises(StoreFull):
            _begin(s, new_key(NOW), now_ms)
        # a day (and the grace) later: a settled record goes, an open UNKNOWN and an unsettled
        # call stay
        s.finish("alice", old[0], "OK", {"outcome": "OK"})
        s.finish("alice", old[1], "UNKNOWN", {"outcome": "UNKNOWN"})
        later = now_ms + (calls.RETENTION_SECONDS + store.PRUNE_GRACE_SECONDS) * 1000
        _begin(s, new_key(later / 1000), later)
        assert s.get("alice", old[0]) is None
        assert s.get("alice", old[1]) is not None and s.get("alice", old[2]) is not None
        assert [r.key for r in s.open_items()] == [old[1]]
        s.acknowledge("alice", old[1], "bob", "read back: it ran", later)
        assert s.open_items() == []
        rec = s.get("alice", old[1])
        assert rec is not None and (rec.ack_by, rec.ack_reason) == ("bob", "read back: it ran")
        with pytest.raises(StoreFull, match="limit"):
            s.begin("alice", new_key(later / 1000), later // 1000, "d", "dev", "write",
                    {"values": {"a": "x" * (store.MAX_TEXT + 1)}}, later)
    finally:
        s.close()


def test_store_file_is_sqlite(tmp_path: Path) -> None:
    s = CallStore.open(tmp_path / "calls.db")
    _begin(s, new_key(NOW), int(NOW * 1000))
    s.close()
    with sqlite3.connect(tmp_path / "calls.db") as db:
        assert db.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 1


# ------------------------------------------------------------------------------- tokens


def test_tokens(tmp_path: Path) -> None:
    tokens = parse_tokens("# c\n\nabcdefghijklmnop0 alice\nqrstuvwxyz0123456 bob\n")
    assert caller_of(tokens, "Bearer abcdefghijklmnop0") == "alice"
    assert caller_of(tokens, "Bearer nope-nope-nope-nope") is None
    assert caller_of(tokens, None) is None
    assert caller_of(tokens, "Basic abcdefghijklmnop0") is None
    # a header that is not UTF-8 reaches us with surrogates (aiohttp): 401, not a bare 500
    assert caller_of(tokens, "Bearer \udcc3\udca9abcdefghijklmnop") is None
    for bad in ("short alice\n", "abcdefghijklmnop0\n", "abcdefghijklmnop0 a b\n", "",
                "abcdefghijklmnop0 a\nabcdefghijklmnop0 b\n"):
        with pytest.raises(TokenFileError):
            parse_tokens(bad)
    p = tmp_path / "tokens"
    p.write_text("abcdefghijklmnop0 alice\n")
    p.chmod(0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        load_tokens(p)
    p.chmod(0o600)
    assert load_tokens(p) == {"abcdefghijklmnop0": "alice"}


def test_every_query_a_call_makes_uses_an_index(tmp_path: Path) -> None:
    """A store near its bound must cost a call what an empty one does: the per-call statements
    (and the open-item check every new call makes) never scan a table. Without the indexes a
    begin and an audit entry on a store of 90,000 calls took 83 ms, on the event loop."""
    s = CallStore.open(tmp_path / "calls.db")
    seen: list[str] = []
    try:
        now_ms = int(NOW * 1000)
        s._db.set_trace_callback(seen.append)
        key = new_key(NOW)
        _begin(s, key, now_ms)
        s.get("alice", key)
        s.started("alice", key, (1, 2), b"\x06\x00\x04\x01\x00")
        s.finish("alice", key, "UNKNOWN", {"outcome": "UNKNOWN"})
        s.open_items()
        s.find_key(key)
        s.acknowledge("alice", key, "bob", "read back", now_ms)
        s.audit(now_ms, "alice", "POST", "/v1/ports/dev/write", {}, key, "OK", 200)
        s.release("alice", key)
        s._db.set_trace_callback(None)
        statements = [q for q in seen if q.split()[0] in ("SELECT", "DELETE", "UPDATE")]
        assert len(statements) >= 8
        for q in statements:
            plan = " / ".join(r[3] for r in s._db.execute("EXPLAIN QUERY PLAN " + q))
            scans = [p for p in plan.split(" / ")
                     if p.startswith("SCAN") and "INDEX" not in p]
            assert not scans, (q, plan)
    finally:
        s.close()


def test_store_counts_stay_true_across_prune_release_and_failure(tmp_path: Path) -> None:
    s = CallStore.open(tmp_path / "calls.db")
    try:
        now_ms = int(NOW * 1000)
        keys = [new_key(NOW) for _ in range(4)]
        for k in keys:
            _begin(s, k, now_ms)
        s.release("alice", keys[0])
        s.finish("alice", keys[1], "OK", {"outcome": "OK"})
        later = now_ms + (calls.RETENTION_SECONDS + store.PRUNE_GRACE_SECONDS) * 1000 + 1
        _begin(s, new_key(later / 1000), later)  # prunes keys[1]
        assert s._calls == s._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 3
    finally:
        s.close()


def test_unsynced_writes_are_synced_by_the_next_synced_one(tmp_path: Path) -> None:
    """Group commit's bookkeeping: an outcome written unsynced is covered by the next synced
    transaction (``syncs`` moves on) or by ``sync``; a begin and an audit entry are unsynced."""
    s = CallStore.open(tmp_path / "calls.db")
    try:
        now_ms = int(NOW * 1000)
        a, b = new_key(NOW), new_key(NOW)
        _begin(s, a, now_ms)
        assert s.unsynced and s.syncs == 0
        s.started("alice", a, (1, 1), b"\x06")
        assert not s.unsynced and s.syncs == 1
        s.finish("alice", a, "OK", {"outcome": "OK"}, synced=False)
        assert s.unsynced
        _begin(s, b, now_ms)
        s.started("alice", b, (1, 2), b"\x06")  # carries a's outcome to disk with b's number
        assert not s.unsynced and s.syncs == 2
        s.audit(now_ms, "alice", "POST", "/v1/ports/dev/write", {}, b, "OK", 200)
        s.sync()
        assert not s.unsynced and s.syncs == 3
        s.sync()  # nothing to sync: no transaction
        assert s.syncs == 3
        assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    finally:
        s.close()


def test_token_roles() -> None:
    from idemlink.gateway.tokens import allows, parse_token_file

    tok = "t" * 16
    tokens, roles = parse_token_file(f"{tok}1 ann viewer\n{tok}2 bo\n{tok}3 cy admin\n")
    assert roles == {"ann": "viewer", "bo": "operator", "cy": "admin"}
    assert tokens[f"{tok}2"] == "bo"
    assert allows("admin", "operator") and not allows("viewer", "operator")
    with pytest.raises(TokenFileError, match="role"):
        parse_token_file(f"{tok}1 ann root\n")
    with pytest.raises(TokenFileError, match="one role a caller"):
        parse_token_file(f"{tok}1 ann viewer\n{tok}2 ann admin\n")


def test_store_limits_are_settings(tmp_path: Path) -> None:
    """The bounds are the gateway's settings: a store of 10 calls refuses the 11th (StoreFull,
    nothing dropped), a store of 1 MiB refuses a call once the file is at it, a retention of an
    hour refuses a key two hours old; a setting out of range is refused at open."""
    limits = store.StoreLimits(max_calls=10, retention_seconds=3600)
    s = CallStore.open(tmp_path / "calls.db", limits)
    now_ms = int(NOW * 1000)
    try:
        for _ in range(10):
            _begin(s, new_key(NOW), now_ms)
        with pytest.raises(StoreFull, match="limit 10"):
            _begin(s, new_key(NOW), now_ms)
    finally:
        s.close()
    with pytest.raises(calls.KeyOutsideRetention):
        calls.check_key(new_key(NOW - 7200), NOW, limits.retention_seconds)
    calls.check_key(new_key(NOW - 7200), NOW)  # the default window: a day
    with pytest.raises(store.StoreError, match="max_calls"):
        CallStore.open(tmp_path / "other.db", store.StoreLimits(max_calls=0))
    small = CallStore.open(tmp_path / "small.db", store.StoreLimits(max_bytes=1024 * 1024))
    try:
        big = {"values": {"a": "x" * (store.MAX_TEXT // 3)}}
        with pytest.raises(StoreFull, match="size limit"):
            for _ in range(1000):  # about 16 MiB of records: the file reaches its 1 MiB first
                k = new_key(NOW)
                small.begin("alice", k, calls.key_time_ms(k), "d", "dev", "write", big, now_ms)
        assert os.path.getsize(tmp_path / "small.db") <= 1024 * 1024
        small.get("alice", k)  # still readable
    finally:
        small.close()


def test_a_flood_of_refusals_cannot_fill_the_audit_log(tmp_path: Path) -> None:
    """The HTTP shell's refusals are audited up to a burst, then one a second; the entry after a
    gap says how many were not written (a flood of 401s must not stop calls: StoreFull)."""
    from idemlink.gateway import service

    s = CallStore.open(tmp_path / "calls.db")
    try:
        gw = service.Gateway(s, [])
        for _ in range(service.REFUSAL_AUDIT_BURST + 50):
            gw.audit_refusal("-", "GET", "/v1/ports", {}, None, "REJECTED", 401)
        assert len(s.audit_entries(1000)) == service.REFUSAL_AUDIT_BURST
        assert gw.refusals_suppressed == 50
        gw._refusal_at -= 2 / service.REFUSAL_AUDITS_PER_SECOND  # two seconds later
        gw.audit_refusal("-", "GET", "/v1/ports", {}, None, "REJECTED", 401)
        assert s.audit_entries(1)[0]["content"] == {"suppressed": 50}
        assert gw.refusals_suppressed == 0
    finally:
        s.close()
