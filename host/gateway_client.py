"""A small blocking client of the gateway (standard library only): keys generated once per call
and reused on every retry, so a retry is the same call.

Contract: ``write``, ``clear`` and ``trigger`` take a new UUIDv7 key unless given one, and send
the call again *under that key* after a connection failure or an answer whose action is "safe
to retry" (503: busy, port down, nothing ran) or an UNKNOWN the gateway says it settles later
(``LINK_LOST``/``PORT_DOWN``), up to ``attempts`` times, waiting ``Retry-After`` (or 0.2 s doubling
to 2 s) between. Every other answer is returned as it is: the JSON body (``outcome``, ``reason``,
``action``, ``replayed``, ``http``...). ``trigger`` waits for the call's status resource to say
``done`` and returns its result. A gateway that never answers raises ``GatewayUnreachable`` with
the key, so the caller can ask again under it later.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from idemlink.host.keys import KEY_HEADER, new_key
from idemlink.protocol.outcome import IdemlinkError

_SETTLED_LATER = ("LINK_LOST", "PORT_DOWN")


class GatewayUnreachable(IdemlinkError):
    """No answer from the gateway after every attempt; ``key`` is the call's key (ask again under
    it: the call runs at most once)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class NotAnAnswer(GatewayUnreachable):
    """An HTTP answer without the gateway's JSON body (a proxy's error page, another server)."""


class GatewayClient:
    def __init__(self, url: str, token: str, *, attempts: int = 5, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.attempts = max(1, attempts)
        self.timeout = timeout

    # ------------------------------------------------------------------ calls
    def ports(self) -> dict[str, Any]:
        return self._once("GET", "/v1/ports")

    def read(self, port: str, *names: str) -> dict[str, Any]:
        query = urllib.parse.urlencode({"names": ",".join(names)})
        return self._retried("GET", f"/v1/ports/{_q(port)}/registers?{query}", None, None)

    def write(self, port: str, values: Mapping[str, int | str], *, if_match: int | None = None,
              key: str | None = None) -> dict[str, Any]:
        headers = {} if if_match is None else {"If-Match": f'"{if_match}"'}
        return self._retried("POST", f"/v1/ports/{_q(port)}/write", {"values": dict(values)},
                             key or new_key(time.time()), headers)

    def clear(self, port: str, mask: int, register: str | None = None, *,
              key: str | None = None) -> dict[str, Any]:
        return self._retried("POST", f"/v1/ports/{_q(port)}/clear",
                             {"mask": mask, "register": register}, key or new_key(time.time()))

    def trigger(self, port: str, register: str | None = None, *, reset: bool = False,
                key: str | None = None, wait: float = 30.0) -> dict[str, Any]:
        key = key or new_key(time.time())
        deadline = time.monotonic() + wait
        for attempt in range(self.attempts):
            body = self._retried("POST", f"/v1/ports/{_q(port)}/trigger",
                                 {"register": register, "reset": reset}, key)
            if body.get("http") != 202 and "state" not in body:
                return body  # replayed or refused: the answer itself
            delay = 0.02
            while True:
                status = self._once("GET", f"/v1/calls/{key}")
                if status.get("state") == "done":
                    result: dict[str, Any] = status["result"]
                    break
                if "state" not in status or time.monotonic() > deadline:
                    return status
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            # it never ran (its key was released): the same call again, under its key
            if (result.get("action") != "safe to retry" or result.get("http") != 503
                    or attempt == self.attempts - 1 or time.monotonic() > deadline):
                return result
            time.sleep(min(0.2 * 2 ** attempt, 2.0))
        return result

    def open_items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._once("GET", "/v1/open-items")["open_items"]
        return items

    def acknowledge(self, key: str, reason: str) -> dict[str, Any]:
        return self._once("POST", f"/v1/open-items/{_q(key)}/acknowledge", {"reason": reason})

    # ------------------------------------------------------------------ transport
    def _retried(self, method: str, path: str, body: Any, key: str | None,
                 headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        h = dict(headers or {})
        if key is not None:
            h[KEY_HEADER] = key
        delay = 0.2
        last = ""
        for attempt in range(self.attempts):
            try:
                answer = self._once(method, path, body, h)
            except (OSError, NotAnAnswer) as exc:  # the call may not have arrived: again
                last = str(exc)
            else:
                again = answer.get("action") == "safe to retry" and answer.get("http") == 503
                later = answer.get("outcome") == "UNKNOWN" and answer.get("reason") in _SETTLED_LATER
                if not (again or later) or attempt == self.attempts - 1:
                    return answer
                last = f"{answer.get('reason')}: {answer.get('message', '')}"
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise GatewayUnreachable(f"no answer from {self.url} after {self.attempts} attempts "
                                 f"({last}); ask again with key {key}", key)

    def _once(self, method: str, path: str, body: Any = None,
              headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        h = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        if data is not None:
            h["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        try:
            answer = json.loads(text or b"{}")
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # a proxy's error page, or not a gateway at all
            raise NotAnAnswer(f"{self.url}{path}: HTTP {status}, not a gateway's answer: "
                              f"{text[:80]!r}")
        answer.setdefault("http", status)
        return answer


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


__all__ = ["GatewayClient", "GatewayUnreachable", "NotAnAnswer"]
