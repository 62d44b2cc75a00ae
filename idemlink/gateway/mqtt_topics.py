"""The MQTT bridge's topic layout and payloads, pure: what a topic names, what a command's
payload asks for, what the gateway publishes. No I/O, no clock (times are passed in): the bridge
(``idemlink.gateway.mqtt_bridge``) uses these and writes none of them again.

Contract (docs/GATEWAY.md, "The fleet"), ``P`` the prefix (``idemlink``), ``GW`` the gateway's
id, ``CALLER`` a caller id of the tokens file:

| topic | who publishes | QoS, retained | payload |
|---|---|---|---|
| ``P/cmd/CALLER/GW/PORT/OP`` | a caller | 1, no | ``{"key": UUIDv7, ...the HTTP body}`` |
| ``P/outcome/CALLER/KEY`` | the gateway | 1, retained (expires) | the HTTP answer's body |
| ``P/refused/CALLER`` | the gateway | 1, no | ``{"outcome", "reason", "message", "http", "topic", "key"?}`` |
| ``P/value/GW/PORT/REGISTER`` | the gateway | 1, retained | the register's reading |
| ``P/gateway/GW`` | the gateway (last will) | 1, retained | ``{"state": "online"/"offline", ...}`` |

- ``OP`` is ``write``, ``clear`` or ``trigger``; the payload is the HTTP request's JSON body
  (``calls.args_for``) plus ``"key"`` and, for a conditional write, ``"if_match"`` (the
  generation, a number); ``"wait"`` (seconds, 0-3600, default ``DEFAULT_WAIT``) is how long the
  bridge keeps retrying a call that did not run for a passing reason before it publishes that
  as the outcome. At most ``MAX_PAYLOAD`` bytes of JSON (``NaN``/``Infinity`` refused).
- The caller's identity is the topic's ``CALLER`` segment: the broker's access list lets user
  ``CALLER`` publish only under ``P/cmd/CALLER/#`` and read only ``P/outcome/CALLER/#`` and
  ``P/refused/CALLER``. The gateway takes the segment as the caller id (the same scope as the
  HTTP token's caller id: one caller's key is one call over HTTP and MQTT).
- A command is published with retain off: one published retained is refused
  (``RetainedCommand``), never run — the broker would hand it to every later subscription.
- Anything refused before a call exists (a malformed topic or payload, an unknown caller, port
  or operation, a caller whose role may not call, a key reused for other content) is refused
  with its reason (``Refused`` for what this module finds).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from idemlink.gateway import calls
from idemlink.gateway.calls import CallError
from idemlink.gateway.store import PRUNE_GRACE_SECONDS

DEFAULT_PREFIX = "idemlink"
MAX_PAYLOAD = 64 * 1024
DEFAULT_WAIT = 30.0
MAX_WAIT = 3600.0
OUTCOME_EXPIRY_SECONDS = calls.RETENTION_SECONDS + PRUNE_GRACE_SECONDS
"""A retained outcome expires (MQTT 5 message expiry) when its key's record would be pruned
(``outcome_expiry``: this for the default retention window)."""


def outcome_expiry(retention_seconds: float = calls.RETENTION_SECONDS) -> int:
    """Seconds a retained outcome lives on the broker: the key's record's life in the store
    (the gateway's ``--retention-hours`` and the prune grace)."""
    return int(retention_seconds) + PRUNE_GRACE_SECONDS

OPERATIONS = ("write", "clear", "trigger")
MAX_SENDER = 1024
"""The longest CALLER segment a refusal is published to (``Topics.sender_of``)."""

_SEGMENT = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


class Refused(CallError):
    """A command refused before any call exists: published on ``P/refused/CALLER``."""

    reason = "MALFORMED_COMMAND"


class RetainedCommand(Refused):
    """A command published retained: the broker would hand it to every later subscription (a
    reconnect, a new session) as if sent again. Refused, never run."""

    reason = "RETAINED_COMMAND"


@dataclass(frozen=True, slots=True)
class Command:
    caller: str
    gateway: str
    port: str
    op: str
    key: str
    args: dict[str, Any]
    wait: float

    @property
    def digest(self) -> str:
        return calls.digest(self.port, self.op, self.args)


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics of one gateway under one prefix."""

    gateway: str
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _SEGMENT.fullmatch(self.gateway):
            raise ValueError(f"gateway id {self.gateway!r}: 1-64 of A-Z a-z 0-9 _ . : @ -")
        if not self.prefix or any(c in self.prefix for c in "+#\0") or self.prefix.startswith(
                "$") or self.prefix.endswith("/"):
            raise ValueError(f"MQTT prefix {self.prefix!r}: no wildcard, no leading $, no "
                             "trailing /")

    @property
    def commands(self) -> str:
        """The subscription for this gateway's commands."""
        return f"{self.prefix}/cmd/+/{self.gateway}/+/+"

    def command(self, caller: str, port: str, op: str) -> str:
        return f"{self.prefix}/cmd/{caller}/{self.gateway}/{port}/{op}"

    def outcome(self, caller: str, key: str) -> str:
        return f"{self.prefix}/outcome/{caller}/{key}"

    def refused(self, caller: str) -> str:
        return f"{self.prefix}/refused/{caller}"

    def value(self, port: str, register: str) -> str:
        return f"{self.prefix}/value/{self.gateway}/{port}/{register}"

    @property
    def presence(self) -> str:
        return f"{self.prefix}/gateway/{self.gateway}"

    def probe(self, nonce: str) -> str:
        return f"{self.prefix}/gateway/{self.gateway}/probe/{nonce}"

    def caller_of(self, topic: str) -> str | None:
        """The CALLER segment of a command topic (None if it has none)."""
        parts = topic[len(self.prefix) + 1:].split("/") if topic.startswith(
            self.prefix + "/") else []
        return parts[1] if len(parts) == 5 and parts[0] == "cmd" and _SEGMENT.fullmatch(
            parts[1]) else None

    def sender_of(self, topic: str) -> str | None:
        """The CALLER segment of a topic shaped as a command's, whatever its characters (a
        broker user whose name is no caller id of a tokens file: refused ``UNKNOWN_CALLER`` on
        its own refusal topic); None for another topic or a segment over ``MAX_SENDER``."""
        parts = topic[len(self.prefix) + 1:].split("/") if topic.startswith(
            self.prefix + "/") else []
        return parts[1] if len(parts) == 5 and parts[0] == "cmd" and 0 < len(
            parts[1]) <= MAX_SENDER else None

    def parse(self, topic: str, payload: bytes, now: float,
              retention: float = calls.RETENTION_SECONDS) -> Command:
        """The command a message asks for, or ``Refused`` saying why not (a key older than
        ``retention`` seconds, the store's window: ``KeyOutsideRetention``)."""
        caller = self.caller_of(topic)
        parts = topic[len(self.prefix) + 1:].split("/")
        if caller is None or parts[2] != self.gateway or not _SEGMENT.fullmatch(parts[3]):
            raise Refused(f"topic {topic[:200]!r} is not {self.prefix}/cmd/CALLER/"
                          f"{self.gateway}/PORT/OP")
        port, op = parts[3], parts[4]
        if op not in OPERATIONS:
            raise Refused(f"no operation {op!r} (one of {', '.join(OPERATIONS)})")
        if len(payload) > MAX_PAYLOAD:
            raise Refused(f"the payload is over {MAX_PAYLOAD} bytes")
        try:
            body = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise Refused(f"the payload must be a JSON object: {str(exc)[:200]}") from exc
        if not isinstance(body, dict):
            raise Refused("the payload must be a JSON object")
        key = body.get("key")
        if not isinstance(key, str):  # (the call layer's own words name the HTTP header)
            raise calls.MalformedIdempotencyKey('the payload needs "key": a UUIDv7 (RFC 9562), '
                                                "a new one for each command")
        try:
            calls.key_time_ms(key)
        except calls.MalformedIdempotencyKey:
            raise calls.MalformedIdempotencyKey(
                '"key" must be a UUIDv7 in lower-case canonical text (RFC 9562), got '
                f"{key[:60]!r}") from None
        calls.check_key(key, now, retention)
        if_match = body.get("if_match")
        if if_match is not None and (not isinstance(if_match, int) or isinstance(if_match, bool)
                                     or not 0 <= if_match <= 0xFFFF or op != "write"):
            raise Refused('"if_match" is a write\'s generation, a number 0..65535')
        wait = body.get("wait", DEFAULT_WAIT)
        if not isinstance(wait, int | float) or isinstance(wait, bool) or not (
                0 <= wait <= MAX_WAIT):
            raise Refused(f'"wait" must be seconds, 0..{MAX_WAIT:.0f}')
        assert isinstance(key, str)
        return Command(caller, self.gateway, port, op, key, calls.args_for(op, body, if_match),
                       float(wait))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def payload(body: dict[str, Any]) -> bytes:
    """A published payload: compact sorted-key JSON (equal content, equal bytes)."""
    return calls.canonical(body)


def refusal(exc: CallError, topic: str, key: str | None = None) -> dict[str, Any]:
    """The refusal's payload: the HTTP refusal's body (``http``: the status HTTP would answer)
    and the topic it answers."""
    body: dict[str, Any] = {"outcome": "REJECTED", "reason": exc.reason, "message": str(exc),
                            "action": "do not retry", "http": exc.http, "topic": topic[:300]}
    if key is not None:
        body["key"] = key
    return body


__all__ = ["DEFAULT_PREFIX", "DEFAULT_WAIT", "MAX_PAYLOAD", "MAX_SENDER", "MAX_WAIT", "OPERATIONS",
           "OUTCOME_EXPIRY_SECONDS", "Command", "Refused", "RetainedCommand", "Topics",
           "outcome_expiry", "payload", "refusal"]
