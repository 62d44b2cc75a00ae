"""What a hostile tester found in the gateway, each against a real ``idemlink gateway`` process in
front of the real simulator (ground truth: the device's execution log)."""

from __future__ import annotations

import http.server
import os
import resource
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.gateway import CLI, TOKEN, TOKEN_BOB, Gw, Reply, running_gateway, served_sim
from support.timing import scaled, wait_until

from idemlink.host.keys import new_key


def _write(gw: Gw, key: str, values: dict[str, object], *, token: str = TOKEN,
           port: str = "dev") -> Reply:
    return gw.call("POST", f"/v1/ports/{port}/write", {"values": values},
                   headers={"Idempotency-Key": key}, token=token)


def _pdu_of(threshold: int) -> bytes:
    from idemlink.host.command import CommandBuilder
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    return CommandBuilder(DEFAULT_MAP).write_command({"threshold": threshold}).pdu()


def _raw(gw: Gw, path: str, data: bytes, key: str | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    h = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if key is not None:
        h["Idempotency-Key"] = key
    req = urllib.request.Request(gw.url + path, data=data, method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=scaled(30)) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_open_items_of_two_callers_under_one_key_text_are_each_acknowledged(
        tmp_path: Path) -> None:
    """Keys are scoped to the caller, so alice and bob may each have an UNKNOWN under the same
    key text (on two ports): acknowledging by key must still settle each, never leave both open
    for good (the port blocked until someone edits the store). Whose item is settled can be
    named (``?caller=``); without a name a caller settles its own, else the only one left."""
    (tmp_path / "b").mkdir()
    with served_sim(tmp_path) as one, served_sim(tmp_path / "b") as two, running_gateway(
            tmp_path, [f"{one.link}=one", f"{two.link}=two"], "--timeout", "0.05") as gw:
        assert one.line is not None and two.line is not None
        one.line.mute = two.line.mute = True  # the answers' waits are the test's cost: short
        key = new_key(time.time())
        a = _write(gw, key, {"threshold": 311}, port="one")
        b = _write(gw, key, {"threshold": 312}, port="two", token=TOKEN_BOB)
        assert (a.body["outcome"], b.body["outcome"]) == ("UNKNOWN", "UNKNOWN")
        one.line.mute = two.line.mute = False
        assert len(gw.call("GET", "/v1/open-items").body["open_items"]) == 2
        path = f"/v1/open-items/{key}/acknowledge"
        assert gw.call("POST", path + "?caller=nobody", {"reason": "x"}).status == 404
        ack = gw.call("POST", path + "?caller=bob", {"reason": "read back"})  # named: bob's
        assert ack.status == 200 and ack.body["caller"] == "bob"
        left = gw.call("GET", "/v1/open-items").body["open_items"]
        assert [i["caller"] for i in left] == ["alice"]
        ack = gw.call("POST", path, {"reason": "read back"}, token=TOKEN_BOB)  # the only one
        assert ack.status == 200 and ack.body["caller"] == "alice"
        assert gw.call("GET", "/v1/open-items").body["open_items"] == []
        assert _write(gw, new_key(time.time()), {"threshold": 313}, port="one").status == 200


def test_a_trigger_reset_is_asked_for_with_true_not_any_text(tmp_path: Path) -> None:
    """``{"reset": "no"}`` was taken as a reset (``bool("no")``): another command ran."""
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        r = gw.call("POST", "/v1/ports/dev/trigger", {"reset": "no"},
                    headers={"Idempotency-Key": new_key(time.time())})
        assert (r.status, r.body["outcome"]) == (422, "REJECTED"), r.body
        with sim.shared.lock:
            assert [e for e in sim.device.executions if e.request[:1] == b"\x42"] == []


def test_bad_json_is_a_typed_refusal_never_a_500(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        for body in (b'{"mask": 1, "register": NaN}', b'{"values": {"threshold": Infinity}}',
                     b"[" * 50000 + b"]" * 50000):
            for path in ("/v1/ports/dev/clear", "/v1/ports/dev/write"):
                status, text = _raw(gw, path, body, new_key(time.time()))
                assert status in (400, 422) and text.startswith(b"{"), (status, text[:80])
        r = gw.call("GET", "/v1/audit?after=99999999999999999999999")
        assert r.status in (400, 422) and r.body["outcome"] == "REJECTED"
        # the audit log stays JSON any parser reads (no NaN)
        import json
        import urllib.request

        req = urllib.request.Request(gw.url + "/v1/audit",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=scaled(30)) as resp:
            json.loads(resp.read(), parse_constant=lambda c: (_ for _ in ()).throw(
                ValueError(c)))


@pytest.mark.slow  # default-suite budget; see CONTRIBUTING.md's slow/default table
def test_a_store_that_cannot_be_written_refuses_calls_as_not_executed(tmp_path: Path) -> None:
    """Disk full (here RLIMIT_FSIZE on the gateway): every call with an effect is NOT_EXECUTED,
    503, safe to retry, in JSON, and nothing runs; once there is room the same key runs once."""
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        assert _write(gw, new_key(time.time()), {"threshold": 320}).status == 200
        wal = tmp_path / "calls.db-wal"
        size = wal.stat().st_size
        unlimited = resource.RLIM_INFINITY  # the soft limit only: it can be lifted again
        resource.prlimit(gw.proc.pid, resource.RLIMIT_FSIZE, (size, unlimited))
        key = new_key(time.time())
        for _ in range(2):
            r = _write(gw, key, {"threshold": 321})
            assert (r.status, r.body["outcome"], r.body["action"]) == (
                503, "NOT_EXECUTED", "safe to retry"), r.body
            assert r.body["reason"] == "STORE_ERROR"
        assert sim.executions_of(_pdu_of(321)) == []
        resource.prlimit(gw.proc.pid, resource.RLIMIT_FSIZE, (unlimited, unlimited))
        r = _write(gw, key, {"threshold": 321})
        assert (r.status, r.body["outcome"]) == (200, "OK"), r.body
        assert len(sim.executions_of(_pdu_of(321))) == 1


def test_a_store_file_removed_under_a_running_gateway_stops_calls(tmp_path: Path) -> None:
    """The store deleted (or replaced) while the gateway runs: what it writes after that is lost
    at the next restart, so a retry would run again. It refuses calls with an effect (503,
    nothing sent) and says why."""
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        assert _write(gw, new_key(time.time()), {"threshold": 330}).status == 200
        os.unlink(tmp_path / "calls.db")
        r = _write(gw, new_key(time.time()), {"threshold": 331})
        assert (r.status, r.body["reason"]) == (503, "STORE_ERROR"), r.body
        assert "removed or replaced" in r.body["message"]
        assert sim.executions_of(_pdu_of(331)) == []


def test_a_store_wal_removed_under_a_running_gateway_stops_calls(tmp_path: Path) -> None:
    """Its write-ahead log deleted (a tmp cleaner, a careless hand): SQLite writes on into the
    unlinked file and the next start finds none of it — a retry would run again."""
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        assert _write(gw, new_key(time.time()), {"threshold": 332}).status == 200
        os.unlink(tmp_path / "calls.db-wal")
        r = _write(gw, new_key(time.time()), {"threshold": 333})
        assert (r.status, r.body["reason"]) == (503, "STORE_ERROR"), r.body
        assert sim.executions_of(_pdu_of(333)) == []


@pytest.mark.slow  # default-suite budget; see CONTRIBUTING.md's slow/default table
def test_a_key_past_retention_with_its_record_still_kept_is_replayed(tmp_path: Path) -> None:
    """A retry that crosses the 24-hour line must get the record's answer, not 'use a new key'
    (which would run the command again)."""
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        from idemlink.gateway.calls import RETENTION_SECONDS

        key = new_key(time.time() - RETENTION_SECONDS + scaled(2))
        first = _write(gw, key, {"threshold": 340})
        assert first.status == 200, first.body
        wait_until(lambda: time.time() - int(key[:8] + key[9:13], 16) / 1000
                   > RETENTION_SECONDS + 0.5, what="the key to pass retention")
        _write(gw, new_key(time.time()), {"threshold": 341})  # prunes what is past retention
        again = _write(gw, key, {"threshold": 340})
        assert (again.status, again.body["replayed"]) == (200, True), again.body
        assert len(sim.executions_of(_pdu_of(340))) == 1
        new = _write(gw, new_key(time.time() - RETENTION_SECONDS - 1), {"threshold": 342})
        assert new.body["reason"] == "KEY_OUTSIDE_RETENTION"


class _Proxy502(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._html()

    def do_POST(self) -> None:
        self._html()

    def _html(self) -> None:
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><body>502 Bad Gateway</body></html>")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("words", [
    ["--gateway-port", "dev", "write", "threshold=40"],
    pytest.param(["--gateway-port", "dev", "read", "threshold"], marks=pytest.mark.slow),
    pytest.param(["read", "threshold"], marks=pytest.mark.slow)], ids=["write", "read", "ports"])
def test_cli_through_a_proxy_answering_html_is_one_line(words: list[str]) -> None:
    """Each command retries under its key (about 3 s) and ends in one line: the write in the
    default run, the read and the port listing with the long campaigns."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy502)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        env = {**os.environ, "IDEMLINK_GATEWAY_TOKEN": TOKEN}
        r = subprocess.run([*CLI, "--gateway", url, *words], capture_output=True, text=True,
                           env=env, timeout=scaled(60))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.count("\n") <= 2 and "502" in r.stderr, r.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_cli_with_a_wrong_token_says_so(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        env = {**os.environ, "IDEMLINK_GATEWAY_TOKEN": "not-a-token-of-this-gateway"}
        r = subprocess.run([*CLI, "--gateway", gw.url, "read", "threshold"], capture_output=True,
                           text=True, env=env, timeout=scaled(60))
        assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr
        assert "0 ports" not in r.stderr


@pytest.mark.slow  # default-suite budget; see CONTRIBUTING.md's slow/default table
def test_roles_forbid_and_every_refusal_is_audited(tmp_path: Path) -> None:
    """A viewer reads but may not write (403, nothing sent); an operator (the default role)
    writes but may not acknowledge or read the audit log; every refusal — 401, 403, a malformed
    body, a bad If-Match — is in the audit log with who and what."""
    from support.gateway import TOKEN_OPERATOR, TOKEN_VIEWER

    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"],
                                                      "--max-calls", "3") as gw:
        assert gw.call("GET", "/v1/ports/dev/registers?names=threshold",
                       token=TOKEN_VIEWER).status == 200
        w = _write(gw, new_key(time.time()), {"threshold": 371}, token=TOKEN_VIEWER)
        assert (w.status, w.body["reason"]) == (403, "FORBIDDEN")
        assert sim.executions_of(_pdu_of(371)) == []
        assert _write(gw, new_key(time.time()), {"threshold": 372},
                      token=TOKEN_OPERATOR).status == 200
        assert gw.call("GET", "/v1/audit", token=TOKEN_OPERATOR).status == 403
        ack = gw.call("POST", f"/v1/open-items/{new_key(time.time())}/acknowledge",
                      {"reason": "x"}, token=TOKEN_OPERATOR)
        assert ack.status == 403
        assert gw.call("GET", "/v1/ports", token="nobody-0123456789abcdef").status == 401
        bad_key = new_key(time.time())
        assert _raw(gw, "/v1/ports/dev/write", b"[1]", key=bad_key)[0] == 422
        assert gw.call("POST", "/v1/ports/dev/write", {"values": {"threshold": 1}},
                       headers={"Idempotency-Key": new_key(time.time()),
                                "If-Match": "W/\"3\""}).status == 400
        audit = gw.call("GET", "/v1/audit?limit=20").body["entries"]
        seen = [(e["caller"], e["http"]) for e in audit]
        assert seen[:6] == [("alice", 400), ("alice", 422), ("-", 401), ("olga", 403),
                            ("olga", 403), ("olga", 200)], seen
        assert ("vic", 403) in seen
        assert audit[1]["key"] == bad_key and audit[1]["content"]["body"] == "[1]"
        # the store's bound is a setting (--max-calls 3): the fourth call is refused, not run
        assert _write(gw, new_key(time.time()), {"threshold": 373}).status == 200
        assert _write(gw, new_key(time.time()), {"threshold": 374}).status == 200
        full = _write(gw, new_key(time.time()), {"threshold": 375})
        assert (full.status, full.body["reason"], full.body["action"]) == (
            503, "STORE_FULL", "safe to retry")
        assert sim.executions_of(_pdu_of(375)) == []
