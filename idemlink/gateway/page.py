"""The gateway's page (``/ui/``) and the event stream it reads (``/v1/events``).

Contract (docs/GATEWAY.md, "The page"):

- ``GET /`` redirects to ``/ui/``; ``/ui/`` serves ``index.html``, ``/ui/app.js`` and
  ``/ui/style.css`` from the package (no build step). These hold no data and need no token; they
  are sent with a content security policy that allows the page's own script and nothing else
  (no inline script, no other origin, no framing).
- The page asks the operator for a token (kept in the tab's ``sessionStorage`` only: no cookie,
  so another site cannot make the browser call the gateway) and calls the HTTP API with it as
  ``Authorization: Bearer``, as any caller does, under the same roles (``app.ROUTE_ROLES``):
  the devices, values and stream need a ``viewer``, the open items an ``operator``, the recent
  commands (the audit log) and the acknowledge button (``POST /v1/open-items/{key}/acknowledge``
  under the token's caller id) an ``admin``; a section the role may not read says so and is
  not asked again until another token is given (each refusal is an audit entry).
- ``GET /v1/events`` (token needed, role ``viewer``) is a server-sent event stream: first
  ``snapshot`` (every port's state, bus load and registers as the ``Watcher`` last saw them),
  then each change as it happens (``value``, ``load``, ``port``). A listener that falls
  ``MAX_QUEUE`` events behind is ended with an ``overflow`` event (it reconnects and gets a new
  snapshot); a stream lasts at most ``STREAM_SECONDS``. At most ``MAX_STREAMS`` streams are
  open at once, ``MAX_STREAMS_PER_CALLER`` of one caller (one more: 503 ``TOO_MANY_STREAMS``,
  safe to retry): each holds a connection, and a token holder opening streams without end would
  take the process's file descriptors from its ports and store. A listener that does not take
  what is written for ``WRITE_SECONDS`` (a client that never reads, its socket's buffers full)
  is ended, its connection closed: never a handler held forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from importlib import resources

from aiohttp import web

from idemlink.gateway.watch import Event, Watcher

MAX_QUEUE = 1000
STREAM_SECONDS = 3600.0
MAX_STREAMS = 64
MAX_STREAMS_PER_CALLER = 16
WRITE_SECONDS = 10.0
PUBLIC_PREFIX = "/ui/"
FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def public(path: str) -> bool:
    """Whether ``path`` is served without a token (the page's own files, which hold no data)."""
    return path in ("/", "/favicon.ico") or path.startswith(PUBLIC_PREFIX)


def _file(name: str) -> bytes:
    return (resources.files("idemlink.gateway") / "ui" / name).read_bytes()


def routes(watcher: Watcher) -> list[web.RouteDef]:
    open_streams: dict[str, int] = {}  #: caller -> event streams open now

    async def root(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(PUBLIC_PREFIX)

    async def static(request: web.Request) -> web.Response:
        name = request.match_info.get("name") or "index.html"
        if name not in FILES:
            raise web.HTTPNotFound()
        return web.Response(body=_file(name), content_type=FILES[name], headers=HEADERS)

    async def events(request: web.Request) -> web.StreamResponse:
        caller = str(request.get("caller", "-"))
        mine = open_streams.get(caller, 0)
        if sum(open_streams.values()) >= MAX_STREAMS or mine >= MAX_STREAMS_PER_CALLER:
            return web.json_response(
                {"outcome": "NOT_EXECUTED", "reason": "TOO_MANY_STREAMS",
                 "message": f"{mine} event streams of caller {caller} are open (at most "
                            f"{MAX_STREAMS_PER_CALLER}; {MAX_STREAMS} in all): close one",
                 "action": "safe to retry", "replayed": False, "http": 503},
                status=503, headers={"Retry-After": "5"})
        open_streams[caller] = mine + 1
        try:
            return await _stream(request)
        finally:
            open_streams[caller] -= 1
            if not open_streams[caller]:
                del open_streams[caller]

    async def _stream(request: web.Request) -> web.StreamResponse:
        queue: asyncio.Queue[Event] = asyncio.Queue(MAX_QUEUE)

        def listener(event: Event) -> None:
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait({"type": "overflow"})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        unlisten = watcher.listen(listener)

        async def send(data: bytes) -> None:
            await asyncio.wait_for(resp.write(data), WRITE_SECONDS)

        try:
            snap = {"ports": watcher.gateway.port_list(), "watch": watcher.snapshot()}
            await send(f"event: snapshot\ndata: {json.dumps(snap)}\n\n".encode())
            loop = asyncio.get_running_loop()
            end = loop.time() + STREAM_SECONDS
            while loop.time() < end:
                try:
                    event = await asyncio.wait_for(queue.get(), 15)
                except TimeoutError:
                    await send(b": keep-alive\n\n")
                    continue
                await send(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                if event["type"] == "overflow":
                    break
        except ConnectionResetError:
            pass
        except TimeoutError:  # the client takes nothing: end it, whatever it holds
            if request.transport is not None:
                request.transport.abort()
            return resp
        finally:
            unlisten()
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    return [web.get("/", root), web.get("/ui/", static), web.get("/ui/{name}", static),
            web.get("/v1/events", events)]


__all__ = ["MAX_QUEUE", "MAX_STREAMS", "MAX_STREAMS_PER_CALLER", "PUBLIC_PREFIX", "WRITE_SECONDS",
           "public", "routes"]
