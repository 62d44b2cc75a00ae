"""The gateway's OpenAPI 3.1 description, declared once here: served at ``/openapi.json`` and
checked in as docs/gateway-openapi.json (``idemlink gateway --openapi`` prints it; a test fails
when the two drift)."""

from __future__ import annotations

import json
from typing import Any

from idemlink.gateway.calls import HTTP_RULES, RETENTION_SECONDS
from idemlink.host.keys import KEY_HEADER

_OUTCOME = {
    "type": "object",
    "required": ["outcome", "reason", "action", "replayed", "http"],
    "properties": {
        "outcome": {"enum": ["OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN"]},
        "reason": {"type": "string", "description": "the status word (OK, GUARD_FAILED, "
                   "IDEMPOTENCY_CONFLICT, NO_ANSWER, PORT_DOWN, ...)"},
        "action": {"enum": ["none", "safe to retry", "do not retry", "reconcile first"]},
        "replayed": {"type": "boolean", "description": "the stored outcome of an earlier call "
                     "with this key and content (the device did not run it again)"},
        "http": {"type": "integer"},
        "key": {"type": "string"},
        "message": {"type": "string"},
        "result": {"type": "object", "description": "what the device answered: status, "
                   "device_replay, epoch, seq, values, code, detail"},
    },
}

_KEY = {"name": KEY_HEADER, "in": "header", "required": True,
        "description": "a UUIDv7 chosen by the caller, scoped to its token's caller id; "
                       f"refused when older than {RETENTION_SECONDS // 3600} h",
        "schema": {"type": "string", "format": "uuid"}}
_PORT = {"name": "port", "in": "path", "required": True, "schema": {"type": "string"}}


def _answers(*codes: int) -> dict[str, Any]:
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Outcome"}}}}
    codes = (*codes, 403) if 401 in codes else codes  # every route with a token has roles
    return {str(c): {"description": _meaning(c), **ref} for c in sorted(set(codes))}


def _meaning(code: int) -> str:
    rows = sorted(name for name, rule in HTTP_RULES.items() if rule.http == code)
    extra = {200: "read", 202: "accepted: see the status resource", 400: "malformed request",
             401: "no or unknown bearer token", 403: "FORBIDDEN: the token's role does not allow it",
             404: "no such port, call or item",
             422: "REJECTED, or a key outside the retention window"}
    return ", ".join(rows + ([extra[code]] if code in extra else []))


_EFFECT = _answers(200, 400, 401, 404, 409, 412, 422, 502, 503, 504)


def openapi() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "idemlink gateway", "version": "1",
                 "description": "Retries are harmless: every call with an effect carries an "
                                "Idempotency-Key; outcomes are OK / NOT_EXECUTED / REJECTED / "
                                "UNKNOWN with the action to take (docs/GATEWAY.md)."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Outcome": _OUTCOME},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/ports": {"get": {"summary": "the ports and their state",
                                  "responses": _answers(200, 401)}},
            "/v1/ports/{port}": {"get": {"summary": "a port's device identity",
                                         "parameters": [_PORT],
                                         "responses": _answers(200, 401, 404)}},
            "/v1/ports/{port}/registers": {"get": {
                "summary": "read registers by name (the ETag is the generation counter), or "
                           "raw words by address (address, count, table: the body's words)",
                "parameters": [_PORT, {"name": "names", "in": "query", "required": False,
                                       "schema": {"type": "string"},
                                       "description": "comma-separated register names"},
                               {"name": "address", "in": "query", "required": False,
                                "schema": {"type": "integer", "minimum": 0, "maximum": 65535},
                                "description": "a raw read's first address (instead of names)"},
                               {"name": "count", "in": "query", "required": False,
                                "schema": {"type": "integer", "minimum": 1, "maximum": 125}},
                               {"name": "table", "in": "query", "required": False,
                                "schema": {"enum": ["holding", "input", "coils", "discrete"]}}],
                "responses": _answers(200, 400, 401, 404, 422, 503, 504)}},
            "/v1/ports/{port}/write": {"post": {
                "summary": "write registers (set-only); with If-Match: only if the generation "
                           "still is the ETag (412 otherwise, nothing executed)",
                "parameters": [_PORT, _KEY, {"name": "If-Match", "in": "header",
                                             "required": False, "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["values"],
                    "properties": {"values": {"type": "object"}}}}}},
                "responses": _EFFECT}},
            "/v1/ports/{port}/clear": {"post": {
                "summary": "clear latched faults (write 1 to clear)",
                "parameters": [_PORT, _KEY],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["mask"],
                    "properties": {"mask": {"type": "integer"},
                                   "register": {"type": "string"}}}}}},
                "responses": _EFFECT}},
            "/v1/ports/{port}/trigger": {"post": {
                "summary": "start (or reset) a one-shot trigger: 202 and a status resource",
                "parameters": [_PORT, _KEY],
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"register": {"type": "string"},
                                                     "reset": {"type": "boolean"}}}}}},
                "responses": {**_answers(202, 400, 401, 404, 409, 422, 503)}}},
            "/v1/calls/{key}": {"get": {
                "summary": "a call's status: accepted -> started -> done (with its outcome)",
                "parameters": [{"name": "key", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": _answers(200, 401, 404)}},
            "/v1/calls/{key}/events": {"get": {
                "summary": "server-sent events: the status resource at each change, until done",
                "parameters": [{"name": "key", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": {"description": "text/event-stream: `event: accepted | "
                                                     "started | done`, `data:` the status"},
                              **_answers(401, 404)}}},
            "/v1/open-items": {"get": {"summary": "UNKNOWN calls nobody acknowledged",
                                       "responses": _answers(200, 401)}},
            "/v1/open-items/{key}/acknowledge": {"post": {
                "summary": "acknowledge an UNKNOWN call: who (the token's caller) and why",
                "parameters": [{"name": "key", "in": "path", "required": True,
                                "schema": {"type": "string"}},
                               {"name": "caller", "in": "query", "required": False,
                                "description": "whose open item, when several callers have "
                                               "one under this key text (default: your own, "
                                               "else the only one)",
                                "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["reason"],
                    "properties": {"reason": {"type": "string"}}}}}},
                "responses": _answers(200, 400, 401, 404, 409)}},
            "/v1/audit": {"get": {
                "summary": "the audit log: the newest `limit` entries (at most 1000), newest "
                           "first; with `after=ID`, the entries after that id, oldest first",
                "parameters": [{"name": "limit", "in": "query", "required": False,
                                "schema": {"type": "integer"}},
                               {"name": "after", "in": "query", "required": False,
                                "schema": {"type": "integer"}}],
                "responses": _answers(200, 400, 401)}},
            "/v1/events": {"get": {
                "summary": "server-sent events for the page: `snapshot` (ports, their state, "
                           "bus load and registers as last read), then `value`, `load` and "
                           "`port` as they change",
                "responses": {"200": {"description": "text/event-stream: `event: snapshot | "
                                                     "value | load | port | overflow`, `data:` "
                                                     "JSON"},
                              **_answers(401, 503)}}},
            "/ui/": {"get": {
                "summary": "the page (HTML; `/ui/app.js`, `/ui/style.css`); `/` redirects here",
                "security": [],
                "responses": {"200": {"description": "text/html"}}}},
        },
    }


def openapi_text() -> str:
    return json.dumps(openapi(), indent=2, sort_keys=True) + "\n"


__all__ = ["openapi", "openapi_text"]
