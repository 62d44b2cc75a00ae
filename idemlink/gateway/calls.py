"""The call layer's rules, pure: keys, digests, retention, what a stored record decides, and how an
outcome reads over HTTP. No I/O, no clock (times are passed in), no server: the store
(``idemlink.gateway.store``), the service (``idemlink.gateway.service``) and the HTTP shell
(``idemlink.gateway.app``) use these and write none of them again.

Contract (docs/GATEWAY.md, "The call layer"):

- **Keys.** An ``Idempotency-Key`` is a UUIDv7 (RFC 9562) in canonical lower-case text: its first
  48 bits are the caller's clock in Unix milliseconds. A key is scoped to the caller's identity
  (the token's caller id): the record's primary key is (caller id, key), so two callers never
  share one. ``idemlink.host.keys.new_key(now)`` makes one.
- **Retention.** Records are kept ``RETENTION_SECONDS`` (24 h) after the key's time. A key whose
  time is older than that (or more than ``MAX_CLOCK_SKEW_SECONDS`` in the future) is refused —
  ``KeyOutsideRetention`` — never treated as new: the time is in the key, so the rule holds also
  for a key whose record was already pruned.
- **Digest.** The record stores the SHA-256 of the canonical content of the call (port, operation,
  and the operation's arguments as compact sorted-key JSON; ``If-Match`` is part of it).
- **What a record decides** (``decide``): no record → NEW (run it); same digest, final → REPLAY
  (the first result, marked replayed); same digest, still running → WAIT (the caller gets the
  first call's outcome when it ends); other digest → CONFLICT (IDEMPOTENCY_CONFLICT, nothing sent).
- **Which outcomes are kept** (``keeps_key``): a NOT_EXECUTED whose action is "safe to retry"
  (busy, port down, no number to give) releases the key — nothing ran, the same key may run
  later; every other outcome is final under its key.
- **HTTP** (``http_status``, ``action_for``): the four outcomes, each with the action a caller
  takes, in ``HTTP_RULES``; the body is ``{outcome, reason, action, replayed, ...}``.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from idemlink.host.keys import KEY_HEADER
from idemlink.protocol.outcome import STATUS_TABLE, Action, LocalProtocolError, Outcome, Status

RETENTION_SECONDS = 24 * 3600
"""How long a key's record is kept after the key's time, and the age past which a key is refused."""

MAX_CLOCK_SKEW_SECONDS = 300
"""How far in the future a key's time may be (the caller's clock ahead of the gateway's)."""

_UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


class CallError(LocalProtocolError):
    """A call refused before anything was sent: ``reason`` is its word in the JSON body,
    ``http`` its status code."""

    reason = "BAD_REQUEST"
    http = 400


class MalformedIdempotencyKey(CallError, ValueError):
    """The ``Idempotency-Key`` is missing or not a canonical UUIDv7."""

    reason = "MALFORMED_KEY"


class KeyOutsideRetention(CallError, ValueError):
    """The key's time is older than the retention window (or too far in the future): refused, not
    taken for a new key."""

    reason = "KEY_OUTSIDE_RETENTION"
    http = 422



def key_time_ms(key: str) -> int:
    """The Unix milliseconds a canonical UUIDv7 carries; ``MalformedIdempotencyKey`` otherwise."""
    if not isinstance(key, str) or not _UUID_TEXT.fullmatch(key):
        raise MalformedIdempotencyKey(
            f"{KEY_HEADER} must be a UUIDv7 in lower-case canonical text (RFC 9562), "
            f"got {str(key)[:60]!r}")
    return uuid.UUID(key).int >> 80


def check_key(key: str | None, now: float, retention: float = RETENTION_SECONDS) -> str:
    """``key`` if it is a UUIDv7 within the retention window (``retention`` seconds, a setting
    of the gateway) of ``now`` (Unix seconds)."""
    if key is None:
        raise MalformedIdempotencyKey(f"{KEY_HEADER} header required for a call with an effect")
    ms = key_time_ms(key)
    age = now - ms / 1000
    if age > retention:
        raise KeyOutsideRetention(
            f"key {key} is {age / 3600:.1f} h old, older than the retention window "
            f"({retention / 3600:g} h): its record may be gone; use a new key")
    if age < -MAX_CLOCK_SKEW_SECONDS:
        raise KeyOutsideRetention(
            f"key {key} is {-age:.0f} s in the future (more than {MAX_CLOCK_SKEW_SECONDS} s): "
            "check the caller's clock")
    return key


def canonical(content: Mapping[str, Any]) -> bytes:
    """The content of a call as compact, sorted-key JSON (ASCII): equal content, equal bytes."""
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def digest(port: str, operation: str, args: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of what a call asks for: its port, operation and arguments."""
    return hashlib.sha256(canonical({"port": port, "op": operation, "args": args})).hexdigest()


def args_for(op: str, body: Mapping[str, Any], if_match: int | None = None) -> dict[str, Any]:
    """The arguments of a call with an effect, taken from its body (an HTTP request's JSON, an
    MQTT command's payload): the same content whatever carried it, so the digest is the same
    and one caller's key means one call over HTTP and MQTT alike."""
    if op == "write":
        args: dict[str, Any] = {"values": body.get("values")}
        if if_match is not None:
            args["if_match"] = if_match
        return args
    if op == "clear":
        return {"mask": body.get("mask"), "register": body.get("register")}
    if op == "trigger":
        return {"register": body.get("register"), "reset": body.get("reset", False)}
    return dict(body)


class Decision(Enum):
    NEW = "new"  #: no record: run it
    REPLAY = "replay"  #: same content, final: the first result, marked replayed
    WAIT = "wait"  #: same content, still running: the first call's outcome when it ends
    CONFLICT = "conflict"  #: other content under the key: IDEMPOTENCY_CONFLICT, nothing sent


def decide(stored_digest: str | None, final: bool, asked_digest: str) -> Decision:
    """What a call with ``asked_digest`` does, given the record under its (caller, key)."""
    if stored_digest is None:
        return Decision.NEW
    if stored_digest != asked_digest:
        return Decision.CONFLICT
    return Decision.REPLAY if final else Decision.WAIT


# ------------------------------------------------------------------------------------- HTTP

ACTION_WORDS: dict[Action, str] = {
    Action.NONE: "none",
    Action.SAFE_TO_RETRY: "safe to retry",
    Action.DO_NOT_RETRY: "do not retry",
    Action.RECONCILE_FIRST: "reconcile first",
}


@dataclass(frozen=True, slots=True)
class HttpRule:
    http: int
    action: Action


HTTP_RULES: dict[str, HttpRule] = {
    # outcome OK
    "OK": HttpRule(200, Action.NONE),
    # NOT_EXECUTED, by why
    "GUARD_FAILED": HttpRule(412, Action.DO_NOT_RETRY),  # If-Match stale: nothing executed
    "IDEMPOTENCY_CONFLICT": HttpRule(409, Action.DO_NOT_RETRY),  # key reused, other content
    "UNKNOWN_OUTSTANDING": HttpRule(409, Action.RECONCILE_FIRST),  # an open UNKNOWN blocks the port
    "NOT_EXECUTED_RETRY": HttpRule(503, Action.SAFE_TO_RETRY),  # busy, port down, no number yet
    "NOT_EXECUTED_FINAL": HttpRule(409, Action.DO_NOT_RETRY),  # any other definite "did not run"
    # REJECTED
    "REJECTED": HttpRule(422, Action.DO_NOT_RETRY),
    # UNKNOWN
    "NO_ANSWER": HttpRule(504, Action.RECONCILE_FIRST),
    "UNKNOWN": HttpRule(502, Action.RECONCILE_FIRST),
}
"""Every outcome class of a call and its HTTP status and action: the rule, in one table."""


def rule_for(outcome: Outcome, status: Status | None, reason: str = "") -> HttpRule:
    """The ``HTTP_RULES`` row of an outcome (``status``: the device's or the host's; ``reason``:
    the gateway's own word, which wins for its own refusals)."""
    if reason in HTTP_RULES and reason not in ("OK", "REJECTED", "UNKNOWN"):
        return HTTP_RULES[reason]
    if outcome is Outcome.OK:
        return HTTP_RULES["OK"]
    if outcome is Outcome.REJECTED:
        return HTTP_RULES["REJECTED"]
    if outcome is Outcome.UNKNOWN:
        return HTTP_RULES["NO_ANSWER" if status is Status.NO_ANSWER else "UNKNOWN"]
    if status is not None and status.name in HTTP_RULES:
        return HTTP_RULES[status.name]
    action = STATUS_TABLE[status].action if status is not None else Action.SAFE_TO_RETRY
    return HTTP_RULES["NOT_EXECUTED_RETRY" if action is Action.SAFE_TO_RETRY
                      else "NOT_EXECUTED_FINAL"]


def action_for(outcome: Outcome, status: Status | None, reason: str = "", *,
               may_have_effect: bool = True) -> str:
    """The action word of an outcome; an unanswered read had no effect: safe to retry."""
    if outcome is Outcome.UNKNOWN and not may_have_effect:
        return ACTION_WORDS[Action.SAFE_TO_RETRY]
    return ACTION_WORDS[rule_for(outcome, status, reason).action]


def keeps_key(outcome: Outcome, status: Status | None, reason: str = "") -> bool:
    """Whether the outcome is final under its key (False: nothing ran and it may run later, so
    the key is released)."""
    if outcome is not Outcome.NOT_EXECUTED:
        return True
    return rule_for(outcome, status, reason).action is not Action.SAFE_TO_RETRY


def parse_if_match(value: str | None) -> int | None:
    """The generation an ``If-Match`` names (``"7"`` or ``W/"7"`` is refused: a strong ETag of
    the device's generation counter); None without the header."""
    if value is None:
        return None
    m = re.fullmatch(r'\s*"(\d{1,10})"\s*', value)
    if m is None or int(m.group(1)) > 0xFFFF:
        raise CallError(f'If-Match must be one strong ETag of the generation, e.g. "7"; got '
                        f"{value[:40]!r}")
    return int(m.group(1))


def etag(generation: int) -> str:
    return f'"{generation}"'


__all__ = [
    "ACTION_WORDS",
    "HTTP_RULES",
    "MAX_CLOCK_SKEW_SECONDS",
    "RETENTION_SECONDS",
    "CallError",
    "Decision",
    "HttpRule",
    "KeyOutsideRetention",
    "MalformedIdempotencyKey",
    "action_for",
    "args_for",
    "canonical",
    "check_key",
    "decide",
    "digest",
    "etag",
    "keeps_key",
    "key_time_ms",
    "parse_if_match",
    "rule_for",
]
