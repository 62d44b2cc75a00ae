"""The gateway's page in a real headless browser: Chromium from the distribution, driven by
Selenium through the distribution's chromedriver (no browser download). It opens the page with
an operator's token, sees the device and its live values, sees a value change after a write
from another client, is refused the acknowledgement of an UNKNOWN (it needs an admin's role),
then with an admin's token acknowledges it and sees it leave the list. A screenshot is kept
(its path is printed; under ``$IDEMLINK_ARTIFACTS`` when set, as CI sets it). The browser test
is a long campaign (about 8 s: a browser starts); the default run keeps the page's files and
its event stream."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.gateway import (
    TOKEN,
    TOKEN_BOB,
    TOKEN_OPERATOR,
    TOKEN_VIEWER,
    running_gateway,
    served_sim,
)
from support.timing import scaled, wait_until

from idemlink.host.gateway_client import GatewayClient
from idemlink.host.keys import new_key

CHROMIUM = ("chromium", "chromium-browser")
DRIVER = "chromedriver"


def _browser_paths() -> tuple[str, str]:
    browser = next((p for n in CHROMIUM if (p := shutil.which(n))), None)
    driver = shutil.which(DRIVER)
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    if driver is None:
        pytest.skip("chromedriver is not installed (apt-get install chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install 'idemlink[test]')")
    return browser, driver


@contextmanager
def chromium() -> Iterator[Any]:
    browser, driver = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    d = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    d.set_page_load_timeout(scaled(30))
    try:
        yield d
    finally:
        d.quit()


def _text(d: Any, element_id: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(d.find_element("id", element_id).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def _artifacts(tmp_path: Path) -> Path:
    d = Path(os.environ.get("IDEMLINK_ARTIFACTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _events(url: str, token: str) -> Iterator[tuple[str, Any]]:
    """A server-sent event stream, event by event: (event, data)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=scaled(30)) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        event = ""
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                yield event, json.loads(line[len("data: "):])


def test_the_page_and_its_event_stream(tmp_path: Path) -> None:
    """The default run's look at the page: its files need no token and allow no other origin;
    the stream it reads needs a token, starts with a snapshot and carries a value another client
    wrote, a device reboot (its new epoch) and a port gone down (the browser test, with
    --run-slow, drives the page itself)."""
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=oven"],
                                                      "--watch", "0.1") as gw:
        with urllib.request.urlopen(gw.url + "/") as r:  # redirected to /ui/
            page = r.read().decode()
            assert r.url.endswith("/ui/") and "<title>idemlink gateway</title>" in page
            csp = r.headers["Content-Security-Policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert "<script>" not in page  # no inline script: the policy forbids it
        with urllib.request.urlopen(gw.url + "/ui/app.js") as r:
            assert b"Authorization" in r.read()
        for sneaky in ("/ui/../v1/ports", "/ui/%2e%2e/v1/ports", "/ui//v1/ports"):
            try:  # a public prefix in front of an API path serves no data
                with urllib.request.urlopen(gw.url + sneaky) as r:
                    pytest.fail(f"{sneaky}: {r.status} {r.read()[:100]!r}")
            except urllib.error.HTTPError as e:
                assert e.code == 404 and b"ports" not in e.read()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(gw.url + "/ui/nothing.js")
        audit = gw.call("GET", "/v1/audit?limit=20").body["entries"]  # refusals of public paths
        assert ("-", "/ui/nothing.js", 404) in {(e["caller"], e["path"], e["http"]) for e in audit}
        assert gw.call("GET", "/v1/events", token=None).status == 401
        from idemlink.gateway.app import needed_role

        assert needed_role("GET", "/v1/events") == needed_role("GET", "/ui/{name}") == "viewer"
        # a viewer's token reads the stream (ROUTE_ROLES); the stream below is an admin's
        assert next(_events(gw.url + "/v1/events", TOKEN_VIEWER))[0] == "snapshot"
        stream = _events(gw.url + "/v1/events", TOKEN)
        kind, snap = next(stream)
        assert kind == "snapshot" and [p["name"] for p in snap["ports"]] == ["oven"]
        # each read of the stream waits for the next event (the socket's timeout bounds it)
        load = next(d for e, d in stream if e == "load")
        assert load["port"] == "oven" and load["bytes"] > 0
        GatewayClient(gw.url, TOKEN_BOB).write("oven", {"threshold": "47.5"})
        seen = next(d for e, d in stream if e == "value" and d["register"]["name"] == "threshold"
                    and d["register"]["text"] == "47.5")  # (35.0 may come first: a first look)
        assert (seen["register"]["value"], seen["register"]["unit"]) == (47.5, "°C")
        # the page shows a device's identity from /v1/ports and looks again on each `port`
        # event: a reboot the watcher's reads find (a new boot epoch) is one, so the page never
        # keeps an old boot's; a port that goes down is one too, its reason in the identity
        before = gw.call("GET", "/v1/ports/oven").body["device"]["epoch"]

        def next_port() -> dict[str, Any]:
            end = time.monotonic() + scaled(10)  # (load events come every look meanwhile)
            for e, d in stream:
                if e == "port":
                    return dict(d)
                assert time.monotonic() < end, "no port event"
            raise AssertionError("the stream ended")

        sim.reboot()
        port = next_port()
        assert port["state"] == "up" and port["epoch"] not in (None, before), port
        assert gw.call("GET", "/v1/ports/oven").body["device"]["epoch"] == port["epoch"]
        sim.unplug()
        down = next_port()
        assert (down["state"], down["epoch"]) == ("down", None)
        assert gw.call("GET", "/v1/ports/oven").body["reason"]
        stream.close()


@pytest.mark.slow
def test_a_headless_chromium_watches_writes_and_acknowledges(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _browser_paths()
    with served_sim(tmp_path) as sim, running_gateway(
            tmp_path, [f"{sim.link}=oven"], "--watch", "0.2", "--timeout", "0.05") as gw, \
            chromium() as d:
        assert sim.line is not None
        d.get(gw.url + "/ui/")
        # an operator's token first: the page works, but the audit log and the acknowledge
        # button need an admin's (the page says so)
        d.find_element("id", "token").send_keys(TOKEN_OPERATOR)
        d.find_element("id", "use-token").click()
        wait_until(lambda: "admin" in _text(d, "recent-note"), timeout=30,
                   what="the page to say the audit log needs an admin token")
        wait_until(lambda: _text(d, "v-oven-threshold") == "35.0", timeout=30,
                   what="the page to show threshold 35.0")
        assert _text(d, "v-oven-mode").endswith("(auto)")  # the map's label for the value
        assert "°C" in d.find_element("id", "port-oven").text  # units
        assert str(sim.device.device_id) in d.find_element("id", "port-oven").text
        wait_until(lambda: float(_text(d, "load-oven") or 0) > 0, timeout=30,
                   what="a bus-load figure above 0")

        # another client writes: the page shows the new value
        other = GatewayClient(gw.url, TOKEN_BOB)
        assert other.write("oven", {"threshold": "47.5"})["outcome"] == "OK"
        wait_until(lambda: _text(d, "v-oven-threshold") == "47.5", timeout=30,
                   what="the page to show the value another client wrote")

        # an UNKNOWN: the device runs the write, its answer is lost
        sim.line.mute = True
        lost = other.write("oven", {"threshold": "38.8"}, key=new_key(time.time()))
        sim.line.mute = False
        assert lost["outcome"] == "UNKNOWN", lost
        key = lost["key"]
        row = wait_until(lambda: d.find_elements("id", f"open-{key}"), timeout=30,
                         what="the UNKNOWN listed on the page")
        row[0].find_element("css selector", "button.ack").click()  # as the operator: refused
        wait_until(lambda: "needs the role admin" in _text(d, "status"), timeout=30,
                   what="the page to say acknowledging needs an admin token")
        assert other.open_items() != []
        # the admin's token: the page's next look uses it
        d.find_element("id", "token").clear()
        d.find_element("id", "token").send_keys(TOKEN)
        d.find_element("id", "use-token").click()
        wait_until(lambda: _text(d, "recent-note") == "", timeout=30,
                   what="the audit log shown to the admin")
        row = wait_until(lambda: d.find_elements("id", f"open-{key}"), timeout=30,
                         what="the UNKNOWN still listed")
        row[0].find_element("css selector", "input.reason").send_keys("read back 38.8: it ran")
        shot = _artifacts(tmp_path) / "gateway-page.png"
        d.save_screenshot(str(shot))
        with capsys.disabled():  # shown in a passing run too: where the picture is
            print(f"\nthe gateway page's screenshot: {shot}")
        row[0].find_element("css selector", "button.ack").click()
        wait_until(lambda: not d.find_elements("id", f"open-{key}"), timeout=30,
                   what="the acknowledged UNKNOWN to leave the list")
        assert other.open_items() == []
        # the port is no longer blocked: the page reads the state the lost write left
        wait_until(lambda: _text(d, "v-oven-threshold") == "38.8", timeout=30,
                   what="the page to show the value read back after the acknowledgement")
        audit = gw.call("GET", "/v1/audit?limit=50").body["entries"]
        ack = next(e for e in audit if e["outcome"] == "ACKNOWLEDGED")
        assert ack["caller"] == "alice" and ack["content"]["reason"] == "read back 38.8: it ran"
        assert any(e["caller"] == "olga" and e["http"] == 403 for e in audit)  # the refusal
        # a section the role may not read is asked once, not every refresh (each is audited)
        assert sum(e["caller"] == "olga" and e["path"] == "/v1/audit" for e in audit) == 1
        d.save_screenshot(str(shot.with_name("gateway-page-after.png")))
        assert shot.stat().st_size > 10_000
        # the device unplugged: the port says down and why, and its values are marked as the
        # last ones read, not shown as if live
        sim.unplug()
        wait_until(lambda: _text(d, "state-oven") == "down", timeout=30,
                   what="the page to show the port down")
        card = d.find_element("id", "port-oven")
        assert "last read" in card.text, card.text
        assert d.find_element("css selector", "#port-oven .reason").text, card.text
        assert "stale" in str(d.find_element("id", "v-oven-threshold").get_attribute("class"))


@pytest.mark.slow
def test_the_page_shows_hostile_text_as_text(tmp_path: Path) -> None:
    """What anyone can put in front of the page — a path and a body the audit log records
    (a refused request's, shown in "recent commands"), a value's text — is shown as text: no
    element made of it, no handler run (the page builds its tables from text nodes; the
    content security policy forbids inline script besides)."""
    import urllib.parse

    _browser_paths()
    evil = '<img src=x onerror="window.pwned=1">'
    with served_sim(tmp_path) as sim, running_gateway(
            tmp_path, [f"{sim.link}=oven"], "--watch", "0.2") as gw, chromium() as d:
        assert gw.call("GET", "/v1/ports/" + urllib.parse.quote(evil) + "/registers"
                       ).status == 404
        assert gw.call("POST", "/v1/ports/oven/write", {"values": {"threshold": evil}},
                       headers={"Idempotency-Key": new_key(time.time())}).status == 422
        d.get(gw.url + "/ui/")
        d.find_element("id", "token").send_keys(TOKEN)
        d.find_element("id", "use-token").click()
        wait_until(lambda: d.find_element("id", "recent").text.count("<img src=x") >= 2,
                   timeout=30, what="the hostile path and body shown as text")
        assert d.find_elements("css selector", "main img") == []
        assert d.execute_script("return window.pwned === undefined")
        assert d.title == "idemlink gateway"

def test_the_bus_load_figure() -> None:
    """Bits on the line over what the baud rate carries: 1152 bytes of 8N1 (10 bits each) in
    one second at 115200 Bd is a tenth of the line; a re-opened driver counts on from there."""
    import asyncio
    from types import SimpleNamespace

    from idemlink.gateway.service import Port, PortSpec
    from idemlink.gateway.watch import LOAD_WINDOW, Watcher
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    port = Port(PortSpec("oven", "x", DEFAULT_MAP, baudrate=115200))
    now = [0.0]

    async def run() -> list[float]:
        watcher = Watcher(SimpleNamespace(ports={"oven": port}),  # type: ignore[arg-type]
                          clock=lambda: now[0])
        loads = []
        port.device = SimpleNamespace(line_bytes=SimpleNamespace(sent=0, received=0))  # type: ignore[assignment]
        watcher._measure("oven", port)
        port.device.line_bytes.sent, port.device.line_bytes.received = 576, 576  # type: ignore[attr-defined]
        now[0] = 1.0
        watcher._measure("oven", port)
        loads.append(watcher.loads["oven"])
        port.device = SimpleNamespace(line_bytes=SimpleNamespace(sent=1152, received=0))  # type: ignore[assignment]
        now[0] = 2.0  # re-opened: its own count starts at 0, the figure goes on
        watcher._measure("oven", port)
        loads.append(watcher.loads["oven"])
        now[0] = 2.0 + LOAD_WINDOW + 1  # nothing more on the line: the window empties
        watcher._measure("oven", port)
        now[0] += 1
        watcher._measure("oven", port)
        loads.append(watcher.loads["oven"])
        return loads

    assert asyncio.run(run()) == [0.1, 0.1, 0.0]


class _StubWatcher:
    """What the event stream needs of a ``Watcher``: listeners, a snapshot, the ports."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.listeners: list[Any] = []
        self.gateway = SimpleNamespace(port_list=lambda: [])

    def listen(self, listener: Any) -> Any:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    def snapshot(self) -> dict[str, Any]:
        return {}


async def _serve_events(watcher: _StubWatcher) -> tuple[Any, int]:
    """The page's routes alone on a free port; the caller is the ``X-Caller`` header (the
    gateway's ``auth`` middleware sets it from the token)."""
    from aiohttp import web

    from idemlink.gateway import page

    @web.middleware
    async def caller(request: web.Request, handler: Any) -> web.StreamResponse:
        request["caller"] = request.headers.get("X-Caller", "-")
        return await handler(request)

    app = web.Application(middlewares=[caller])
    app.add_routes(page.routes(watcher))  # type: ignore[arg-type]
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def _open_stream(port: int, caller: str, rcvbuf: int | None = None) -> tuple[Any, bytes]:
    """A raw connection asking for the stream: (its socket, the answer's first bytes)."""
    import asyncio
    import socket

    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(s, ("127.0.0.1", port))
    await loop.sock_sendall(s, f"GET /v1/events HTTP/1.1\r\nHost: x\r\nX-Caller: {caller}\r\n"
                               "\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got or (b" 200 " in got and b"event: snapshot" not in got):
        chunk = await asyncio.wait_for(loop.sock_recv(s, 65536), scaled(10))
        assert chunk, got
        got += chunk
    return s, got


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_event_streams_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """``/v1/events`` holds a connection each: at most ``MAX_STREAMS_PER_CALLER`` of one caller
    and ``MAX_STREAMS`` in all are open at once (one more: 503 TOO_MANY_STREAMS, safe to retry;
    a closed one frees its place) — a token holder cannot take the process's file descriptors
    from its ports and store by opening streams without end."""
    import asyncio

    from idemlink.gateway import page

    monkeypatch.setattr(page, "MAX_STREAMS_PER_CALLER", 2)
    monkeypatch.setattr(page, "MAX_STREAMS", 3)

    async def run() -> None:
        watcher = _StubWatcher()
        runner, port = await _serve_events(watcher)
        try:
            a1, h = await _open_stream(port, "alice")
            a2, h = await _open_stream(port, "alice")
            a3, h = await _open_stream(port, "alice")
            assert b" 503 " in h and b"TOO_MANY_STREAMS" in h, h
            b1, h = await _open_stream(port, "bob")
            assert b" 200 " in h
            b2, h = await _open_stream(port, "bob")  # three open in all
            assert b" 503 " in h and b"safe to retry" in h, h
            a1.close()  # its handler sees the end at its next write: an event
            await asyncio.sleep(0.05)
            for listener in list(watcher.listeners):
                listener({"type": "load", "port": "p", "load": 0.0})
            for _ in range(200):
                if len(watcher.listeners) == 2:
                    break
                await asyncio.sleep(0.02)
            b3, h = await _open_stream(port, "bob")
            assert b" 200 " in h, h
            for s in (a2, a3, b1, b2, b3):
                s.close()
        finally:
            await runner.cleanup()

    asyncio.run(run())


def test_a_stream_nobody_reads_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that opens ``/v1/events`` and never reads: once its socket's buffers are full,
    a write that waits ``WRITE_SECONDS`` ends the stream and closes the connection — its handler
    and listener are not held for the stream's hour."""
    import asyncio

    from idemlink.gateway import page

    monkeypatch.setattr(page, "WRITE_SECONDS", 0.2)

    async def run() -> None:
        watcher = _StubWatcher()
        runner, port = await _serve_events(watcher)
        try:
            sock, h = await _open_stream(port, "alice", rcvbuf=4096)
            assert b" 200 " in h
            big = {"type": "value", "port": "p", "register": {"name": "x" * 65536}}
            loop = asyncio.get_running_loop()
            end = loop.time() + scaled(10)
            while watcher.listeners and loop.time() < end:
                for listener in list(watcher.listeners):
                    listener(big)
                await asyncio.sleep(0.001)
            assert not watcher.listeners, "the stalled stream is still held"
            sock.close()
        finally:
            await runner.cleanup()

    asyncio.run(run())
