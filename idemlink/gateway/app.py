"""The HTTP shell of the gateway (aiohttp): routes, bearer tokens, JSON in and out.

It only moves requests to ``idemlink.gateway.service.Gateway`` and its ``Answer`` back: the rules
(keys, digests, retention, outcome -> status) are ``idemlink.gateway.calls``'s. Every route but
``/openapi.json`` and the page's files (``public``: ``/``, ``/ui/...``) needs ``Authorization:
Bearer TOKEN`` and the role ``ROUTE_ROLES`` gives it (403 ``FORBIDDEN`` otherwise); every
refusal (an answer of 400 or more) is audited; a request body is at most ``MAX_BODY`` bytes of
JSON. The routes and their schemas are ``idemlink.gateway.openapi``'s
(served at ``/openapi.json``, checked in as docs/gateway-openapi.json).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from idemlink.gateway.calls import CallError, args_for, parse_if_match
from idemlink.gateway.openapi import openapi
from idemlink.gateway.service import Answer, BadArguments, Gateway, error_answer, refusal
from idemlink.gateway.store import StoreError
from idemlink.gateway.tokens import DEFAULT_ROLE, allows, caller_of
from idemlink.host.keys import KEY_HEADER
from idemlink.protocol.outcome import Outcome

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
SSE_LOOK_SECONDS = 0.25
SSE_LOOKS = 4 * 3600
"""A watcher's stream looks at the call at least every ``SSE_LOOK_SECONDS`` and ends after an hour."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json(answer: Answer) -> web.Response:
    return web.json_response(answer.body, status=answer.http, headers=answer.headers)


def _refused(http: int, reason: str, message: str) -> web.Response:
    return web.json_response({"outcome": "REJECTED", "reason": reason, "message": message,
                              "action": "do not retry", "replayed": False, "http": http},
                             status=http)


def needed_role(method: str, route: str) -> str:
    """The least role a route needs (``ROUTE_ROLES``; any other read: viewer; any other method:
    operator, so a route added later without a row is never open to viewers)."""
    return ROUTE_ROLES.get((method, route), "viewer" if method in ("GET", "HEAD") else "operator")


ROUTE_ROLES: dict[tuple[str, str], str] = {
    ("POST", "/v1/ports/{port}/write"): "operator",
    ("POST", "/v1/ports/{port}/clear"): "operator",
    ("POST", "/v1/ports/{port}/trigger"): "operator",
    ("GET", "/v1/open-items"): "operator",
    ("POST", "/v1/open-items/{key}/acknowledge"): "admin",
    ("GET", "/v1/audit"): "admin",
    # the page (``idemlink.gateway.page``): its files are public (``public``) and hold no data;
    # its event stream is a read. What the page does beyond reading is the API's routes above.
    ("GET", "/"): "viewer",
    ("GET", "/ui/"): "viewer",
    ("GET", "/ui/{name}"): "viewer",
    ("GET", "/v1/events"): "viewer",
}
"""Which role each route needs: ``viewer`` for reads (ports, registers, the caller's own calls,
the page and its event stream), more for the rest."""


def make_app(gateway: Gateway, tokens: dict[str, str],
             roles: dict[str, str] | None = None,
             extra: Sequence[web.RouteDef] = (),
             public: Callable[[str], bool] = lambda path: False) -> web.Application:
    """The app; ``roles`` (caller -> role, ``DEFAULT_ROLE`` for a caller not named) as
    ``ROUTE_ROLES`` needs them; ``extra`` routes (the page's, ``idemlink.gateway.page``) are
    added, and the paths ``public`` names are served without a token, as ``/openapi.json`` is."""
    role_of = roles or {}

    @web.middleware
    async def audited(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every refusal (an answer of 400 or more) the service did not audit itself is
        audited here: who (or ``-`` without a valid token), what, the key, the status — also
        one raised past ``auth`` (a public path's 404)."""
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400 and not request.get("audited"):
                await _audit_refusal(request, exc)
            raise
        if response.status >= 400 and not request.get("audited"):
            await _audit_refusal(request, response)
        return response

    async def _audit_refusal(request: web.Request, response: web.StreamResponse) -> None:
        outcome = "REJECTED"
        if isinstance(response, web.Response) and isinstance(response.body, bytes):
            with contextlib.suppress(ValueError):
                outcome = str(json.loads(response.body).get("outcome", outcome))
        content: dict[str, Any] = {"query": dict(request.query)} if request.query else {}
        if request.method == "POST":
            with contextlib.suppress(Exception):
                content["body"] = (await request.text())[:1000]
        gateway.audit_refusal(request.get("caller", "-"), request.method, request.path[:300],
                              content, request.headers.get(KEY_HEADER, "")[:80] or None,
                              outcome, response.status)

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/openapi.json" or public(request.path):
            return await handler(request)
        caller = caller_of(tokens, request.headers.get("Authorization"))
        if caller is None:
            return web.json_response(
                {"outcome": "REJECTED", "reason": "UNAUTHENTICATED",
                 "message": "Authorization: Bearer TOKEN required (a token of the gateway's "
                            "tokens file)", "action": "do not retry", "replayed": False,
                 "http": 401}, status=401, headers={"WWW-Authenticate": "Bearer"})
        request["caller"] = caller
        route = request.match_info.route.resource
        needed = needed_role(request.method, route.canonical if route is not None else "")
        role = role_of.get(caller, DEFAULT_ROLE)
        if not allows(role, needed):
            return _refused(403, "FORBIDDEN", f"caller {caller} is a {role}: this needs the "
                                              f"role {needed} (the tokens file's third word)")
        try:
            return await handler(request)
        except CallError as exc:
            return _json(error_answer(exc))
        except web.HTTPException as exc:
            return _refused(exc.status, "NOT_FOUND" if exc.status == 404 else "BAD_REQUEST",
                            exc.reason)
        except StoreError as exc:
            effect = request.method == "POST" and request.path.startswith("/v1/ports/")
            return _json(refusal(Outcome.UNKNOWN if effect else Outcome.NOT_EXECUTED,
                                 "STORE_ERROR", str(exc), may_have_effect=effect))
        except Exception as exc:  # never a bare 500: the body still says what a caller does
            log.exception("%s %s failed", request.method, request.path)
            return web.json_response(
                {"outcome": "UNKNOWN", "reason": "INTERNAL_ERROR",
                 "message": f"{type(exc).__name__}: {exc}; ask about the call again under the "
                            "same key (GET /v1/calls/KEY)",
                 "action": "reconcile first" if request.method == "POST" else "safe to retry",
                 "replayed": False, "http": 500}, status=500)

    async def body_of(request: web.Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.text(), parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise BadArguments(f"the body must be a JSON object: {str(exc)[:200]}") from exc
        except web.HTTPRequestEntityTooLarge as exc:
            raise BadArguments(f"the body is over {MAX_BODY} bytes") from exc
        if not isinstance(data, dict):
            raise BadArguments("the body must be a JSON object")
        return data

    async def spec(request: web.Request) -> web.Response:
        return web.json_response(openapi())

    async def ports(request: web.Request) -> web.Response:
        return web.json_response({"ports": gateway.port_list()})

    async def port(request: web.Request) -> web.Response:
        return web.json_response(gateway.identity(request.match_info["port"]))

    async def registers(request: web.Request) -> web.Response:
        if "address" in request.query:
            try:
                address = int(request.query["address"])
                count = int(request.query.get("count", "1"))
            except ValueError as exc:
                raise BadArguments("address and count must be numbers") from exc
            return _json(await gateway.read_words(request.match_info["port"], address, count,
                                                  request.query.get("table", "holding")))
        names = [n for n in request.query.get("names", "").split(",") if n]
        return _json(await gateway.read(request.match_info["port"], names))

    async def write(request: web.Request) -> web.Response:
        if "If-None-Match" in request.headers:
            raise CallError("a write takes If-Match (the generation), not If-None-Match: "
                            "nothing sent")
        data = await body_of(request)
        generation = parse_if_match(request.headers.get("If-Match"))
        return await _effect(request, "write", args_for("write", data, generation))

    def no_condition(request: web.Request, op: str) -> None:
        """A condition the gateway cannot evaluate is refused, never ignored (RFC 9110: a
        server that gets ``If-Match`` evaluates it): only a write carries one."""
        if "If-Match" in request.headers or "If-None-Match" in request.headers:
            raise CallError(f"a {op} takes no If-Match (only a write is conditional, on the "
                            "generation): nothing sent")

    async def clear(request: web.Request) -> web.Response:
        no_condition(request, "clear")
        return await _effect(request, "clear", args_for("clear", await body_of(request)))

    async def trigger(request: web.Request) -> web.Response:
        no_condition(request, "trigger")
        data = await body_of(request) if request.can_read_body else {}
        return await _effect(request, "trigger", args_for("trigger", data), background=True)

    async def _effect(request: web.Request, op: str, args: dict[str, Any], *,
                      background: bool = False) -> web.Response:
        request["audited"] = True  # the service audits every call with an effect
        return _json(await gateway.call(request["caller"], request.headers.get(KEY_HEADER),
                                        request.match_info["port"], op, args,
                                        background=background))

    async def call_status(request: web.Request) -> web.Response:
        return _json(gateway.status(request["caller"], request.match_info["key"]))

    async def call_events(request: web.Request) -> web.StreamResponse:
        """Server-sent events: the status resource each time it changes (``event:`` its
        state), ending after ``done`` (or an ``error`` event for a call that is not there)."""
        caller, key = request["caller"], request.match_info["key"]
        answer = gateway.status(caller, key)
        if answer.http != 200:
            return _json(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        last: dict[str, Any] | None = None
        for _ in range(SSE_LOOKS):
            answer = gateway.status(caller, key)
            state = str(answer.body.get("state", "error"))
            if answer.body != last:
                last = answer.body
                await resp.write(f"event: {state}\ndata: {json.dumps(answer.body)}\n\n".encode())
            if answer.http != 200 or state == "done":
                break
            await gateway.settled_or(caller, key, SSE_LOOK_SECONDS)
        await resp.write_eof()
        return resp

    async def open_items(request: web.Request) -> web.Response:
        return web.json_response({"open_items": gateway.open_items()})

    async def acknowledge(request: web.Request) -> web.Response:
        data = await body_of(request)
        reason = data.get("reason")
        answer = gateway.acknowledge(request["caller"], request.match_info["key"],
                                     reason if isinstance(reason, str) else "",
                                     request.query.get("caller"))
        request["audited"] = answer.http == 200  # the service audits an acknowledgement
        return _json(answer)

    async def audit(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
            after = int(request.query["after"]) if "after" in request.query else None
            if not (0 <= (after or 0) < 2**63 and limit < 2**63):
                raise ValueError
        except ValueError as exc:
            raise BadArguments("limit and after must be numbers (after: 0 to 2**63-1)") from exc
        return web.json_response({"entries": gateway.store.audit_entries(max(1, limit), after)})

    app = web.Application(middlewares=[audited, auth], client_max_size=MAX_BODY)
    app.add_routes([
        web.get("/openapi.json", spec),
        web.get("/v1/ports", ports),
        web.get("/v1/ports/{port}", port),
        web.get("/v1/ports/{port}/registers", registers),
        web.post("/v1/ports/{port}/write", write),
        web.post("/v1/ports/{port}/clear", clear),
        web.post("/v1/ports/{port}/trigger", trigger),
        web.get("/v1/calls/{key}", call_status),
        web.get("/v1/calls/{key}/events", call_events),
        web.get("/v1/open-items", open_items),
        web.post("/v1/open-items/{key}/acknowledge", acknowledge),
        web.get("/v1/audit", audit),
        *extra,
    ])
    return app


__all__ = ["MAX_BODY", "ROUTE_ROLES", "make_app", "needed_role"]
