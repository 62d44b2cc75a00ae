"""The gateway end to end: a real ``idemlink gateway`` process (port 0, ready on its printed
address) in front of the real simulator on a pty; ground truth from the device's execution log."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.gateway import (
    CLI,
    TOKEN_BOB,
    Gw,
    Reply,
    gateway_args,
    running_gateway,
    served_sim,
    tokens_file,
)
from support.timing import scaled, wait_until

from idemlink.gateway.openapi import openapi_text
from idemlink.host.keys import new_key

ROOT = Path(__file__).resolve().parent.parent


def _write(gw: Gw, key: str | None, values: dict[str, object], *, token: str | None = None,
           if_match: str | None = None, port: str = "dev") -> Reply:
    headers = {} if key is None else {"Idempotency-Key": key}
    if if_match is not None:
        headers["If-Match"] = if_match
    kw = {} if token is None else {"token": token}
    return gw.call("POST", f"/v1/ports/{port}/write", {"values": values}, headers=headers, **kw)


def _pdu_of(threshold: int) -> bytes:
    from idemlink.host.command import CommandBuilder
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    return CommandBuilder(DEFAULT_MAP).write_command({"threshold": threshold}).pdu()


def test_calls_keys_replay_conflict_if_match_and_audit(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        assert gw.call("GET", "/v1/ports", token=None).status == 401
        assert gw.call("GET", "/v1/ports", token="x" * 20).body["reason"] == "UNAUTHENTICATED"
        ident = gw.call("GET", "/v1/ports/dev").body
        assert ident["state"] == "up" and ident["device"]["device_id"] == sim.device.device_id
        r = gw.call("GET", "/v1/ports/dev/registers?names=threshold,mode")
        assert r.status == 200 and r.body["registers"]["threshold"]["value"] == 35.0
        generation = r.headers["ETag"]

        key = new_key(time.time())
        first = _write(gw, key, {"threshold": 420})
        assert (first.status, first.body["outcome"], first.body["replayed"]) == (200, "OK", False)
        again = _write(gw, key, {"threshold": 420})
        assert again.status == 200 and again.body["replayed"] is True
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.body["result"] == first.body["result"]
        assert len(sim.executions_of(_pdu_of(420))) == 1  # the retry ran nothing

        conflict = _write(gw, key, {"threshold": 421})
        assert conflict.status == 409 and conflict.body["reason"] == "IDEMPOTENCY_CONFLICT"
        assert conflict.body["action"] == "do not retry"
        assert sim.executions_of(_pdu_of(421)) == []  # nothing sent
        cond = gw.call("POST", "/v1/ports/dev/clear", {"mask": 1},
                       headers={"Idempotency-Key": new_key(time.time()), "If-Match": '"0"'})
        assert cond.status == 400 and "If-Match" in cond.body["message"]  # refused, not ignored
        fraction = _write(gw, new_key(time.time()), {"threshold": 42.5})  # a JSON number, not
        assert fraction.status == 422 and '"42.5"' in fraction.body["message"]  # text: says so

        # the key is the caller's: bob's call under the same text is his own
        bobs = _write(gw, key, {"threshold": 420}, token=TOKEN_BOB)
        assert bobs.status == 200 and bobs.body["replayed"] is False

        # refused before anything is sent, the key not consumed
        assert _write(gw, None, {"threshold": 400}).status == 400
        assert _write(gw, "not-a-key", {"threshold": 400}).body["reason"] == "MALFORMED_KEY"
        stale = _write(gw, new_key(time.time() - 2 * 86400), {"threshold": 400})
        assert (stale.status, stale.body["reason"]) == (422, "KEY_OUTSIDE_RETENTION")
        assert _write(gw, new_key(time.time()), {"nope": 1}).status == 422
        assert _write(gw, new_key(time.time()), {"threshold": 1}, port="zz").status == 404
        assert sim.executions_of(_pdu_of(400)) == []

        # If-Match: the generation moved on (the writes above): 412, nothing executed
        moved = _write(gw, new_key(time.time()), {"threshold": 430}, if_match=generation)
        assert (moved.status, moved.body["reason"]) == (412, "GUARD_FAILED")
        now = gw.call("GET", "/v1/ports/dev/registers?names=threshold")
        assert now.body["registers"]["threshold"]["value"] == 42.0
        fresh = _write(gw, new_key(time.time()), {"threshold": 430}, if_match=now.headers["ETag"])
        assert fresh.status == 200

        audit = gw.call("GET", "/v1/audit?limit=50").body["entries"]
        assert [(e["caller"], e["http"]) for e in audit[:3]] == [
            ("alice", 200), ("alice", 412), ("alice", 404)]
        assert {e["key"] for e in audit} >= {key}
        assert any(e["caller"] == "bob" for e in audit)
        served = gw.call("GET", "/openapi.json", token=None).body
        assert served == json.loads((ROOT / "docs" / "gateway-openapi.json").read_text())


def test_checked_in_openapi_has_not_drifted() -> None:
    assert (ROOT / "docs" / "gateway-openapi.json").read_text() == openapi_text()


@pytest.mark.slow  # default-suite budget; see CONTRIBUTING.md's slow/default table
def test_same_key_at_once_runs_once(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        key = new_key(time.time())
        replies: list[Reply] = []

        def post() -> None:
            replies.append(_write(gw, key, {"threshold": 377}))

        threads = [threading.Thread(target=post) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.status for r in replies] == [200] * 6
        assert sorted(r.body["replayed"] for r in replies) == [False] + [True] * 5
        assert len(sim.executions_of(_pdu_of(377))) == 1


def test_trigger_is_202_with_a_status_resource(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        key = new_key(time.time())
        r = gw.call("POST", "/v1/ports/dev/trigger", {}, headers={"Idempotency-Key": key})
        assert r.status == 202 and r.headers["Location"] == f"/v1/calls/{key}"
        events = gw.events(f"/v1/calls/{key}/events")  # a watcher: ends with the outcome
        assert events[-1][0] == "done" and events[-1][1]["result"]["outcome"] == "OK"
        done = wait_until(lambda: (s := gw.call("GET", r.headers["Location"])).body["state"]
                          == "done" and s, what="the trigger's outcome")
        assert done.body["result"]["outcome"] == "OK"
        assert done.body["result"]["result"]["code_name"] == "ACCEPTED"
        again = gw.call("POST", "/v1/ports/dev/trigger", {}, headers={"Idempotency-Key": key})
        assert again.status == 200 and again.body["replayed"] is True
        from idemlink.protocol.registers import TriggerStatus
        assert again.body["result"]["code"] == TriggerStatus.ACCEPTED  # not RUNNING: not re-sent
        assert gw.call("GET", "/v1/calls/" + new_key(time.time())).status == 404


def test_unknown_is_an_open_item_until_acknowledged(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"],
                                                      "--timeout", "0.05") as gw:
        assert sim.line is not None
        sim.line.mute = True  # the device runs what it gets; no answer comes back
        lost = _write(gw, new_key(time.time()), {"threshold": 388})
        assert (lost.status, lost.body["outcome"], lost.body["action"]) == (
            504, "UNKNOWN", "reconcile first")
        assert len(sim.executions_of(_pdu_of(388))) == 1  # it did run: UNKNOWN was truthful
        sim.line.mute = False
        items = gw.call("GET", "/v1/open-items").body["open_items"]
        assert [i["key"] for i in items] == [lost.body["key"]]
        blocked = _write(gw, new_key(time.time()), {"threshold": 389})
        assert (blocked.status, blocked.body["reason"]) == (409, "UNKNOWN_OUTSTANDING")
        assert sim.executions_of(_pdu_of(389)) == []
        ack_path = f"/v1/open-items/{lost.body['key']}/acknowledge"
        assert gw.call("POST", ack_path, {"reason": ""}).status == 422
        ack = gw.call("POST", ack_path, {"reason": "read back 38.8: it ran"}, token=TOKEN_BOB)
        assert ack.status == 200 and ack.body["acknowledged_by"] == "bob"
        assert gw.call("GET", "/v1/open-items").body["open_items"] == []
        assert _write(gw, new_key(time.time()), {"threshold": 389}).status == 200
        audit = gw.call("GET", "/v1/audit").body["entries"]
        assert any(e["caller"] == "bob" and e["outcome"] == "ACKNOWLEDGED" for e in audit)


def test_sigkill_between_send_and_answer_retransmits_the_same_number(tmp_path: Path) -> None:
    """The gateway dies with the request out; after restart the same key gets the device's
    replayed answer under the same sequence number: executed once, no UNKNOWN."""
    with served_sim(tmp_path) as sim:
        assert sim.line is not None
        key = new_key(time.time())
        pdu = _pdu_of(395)
        with running_gateway(tmp_path, [f"{sim.link}=dev"], "--timeout", "2") as gw:
            sim.line.mute = True
            caller = threading.Thread(target=lambda: _write_ignoring_reset(gw, key, 395))
            caller.start()
            wait_until(lambda: sim.executions_of(pdu), timeout=20, what="the write to run")
            gw.kill()  # SIGKILL: the answer never left the device's side
            caller.join()
        sim.line.mute = False
        ran = sim.executions_of(pdu)
        assert len(ran) == 1
        with running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
            r = _write(gw, key, {"threshold": 395})
            assert (r.status, r.body["outcome"], r.body["replayed"]) == (200, "OK", True)
            assert r.body["result"]["device_replay"] is True
            assert (r.body["result"]["epoch"], r.body["result"]["seq"]) == (ran[0].epoch,
                                                                            ran[0].seq)
            assert gw.call("GET", "/v1/open-items").body["open_items"] == []
        assert len(sim.executions_of(pdu)) == 1


def _write_ignoring_reset(gw: Gw, key: str, value: int) -> None:
    with contextlib.suppress(OSError):  # the gateway was killed under the request
        _write(gw, key, {"threshold": value})


def test_port_vanishes_and_returns_device_reboots(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        sim.unplug()
        r = gw.call("GET", "/v1/ports/dev/registers?names=threshold")
        assert r.status in (502, 503, 504) and r.body["outcome"] in ("UNKNOWN", "NOT_EXECUTED")
        wait_until(lambda: gw.call("GET", "/v1/ports/dev").body["state"] == "down",
                   what="the port to be seen down")
        refused = _write(gw, new_key(time.time()), {"threshold": 402})
        assert (refused.status, refused.body["reason"], refused.body["action"]) == (
            503, "PORT_DOWN", "safe to retry")
        sim.serve()  # plugged back in
        wait_until(lambda: gw.call("GET", "/v1/ports/dev").body["state"] == "up", timeout=20,
                   what="the port to come back")
        sim.reboot()
        w = _write(gw, new_key(time.time()), {"threshold": 403})  # set-only: re-issued in the
        assert w.status == 200, w.body  # new boot epoch, executed once
        assert len(sim.executions_of(_pdu_of(403))) == 1
        assert gw.call("GET", "/v1/ports/dev").body["device"]["epoch"] == sim.device.epoch


def test_cli_refusals_are_one_line(tmp_path: Path) -> None:
    args = gateway_args(tmp_path, ["/dev/null=dev"])
    tokens_file(tmp_path).chmod(0o644)
    r = subprocess.run(args, capture_output=True, text=True, timeout=scaled(30))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "chmod 600" in r.stderr, r.stderr
    bad = [*CLI, "gateway", "--port", "x", "--listen", "nowhere", "--tokens", "t", "--store", "s"]
    r = subprocess.run(bad, capture_output=True, text=True, timeout=scaled(30))
    assert r.returncode == 1 and "HOST:PORT" in r.stderr and "Traceback" not in r.stderr


def test_one_gateway_per_store(tmp_path: Path) -> None:
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]):
        r = subprocess.run(gateway_args(tmp_path, [f"{sim.link}=dev"]), capture_output=True,
                           text=True, timeout=scaled(30))
        assert r.returncode == 1 and "in use by another gateway" in r.stderr
        assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("argv", [["--openapi"]])
def test_openapi_printed(argv: list[str]) -> None:
    r = subprocess.run([*CLI, "gateway", *argv], capture_output=True, text=True,
                       timeout=scaled(30))
    assert r.returncode == 0 and r.stdout == openapi_text()


def test_cli_through_the_gateway(tmp_path: Path) -> None:
    from support.gateway import TOKEN

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        def cli(*words: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*CLI, "--gateway", gw.url, *words, "--token-file", str(token)],
                                  capture_output=True, text=True, timeout=scaled(30))

        key = new_key(time.time())
        first = cli("write", "threshold=41.0", "--key", key)
        assert (first.returncode, first.stdout) == (0, "OK (OK); action: none\n"), first.stderr
        again = cli("write", "threshold=41.0", "--key", key)
        assert again.returncode == 0 and again.stdout.endswith("(replayed)\n")
        assert len(sim.executions_of(_pdu_of(410))) == 1
        other = cli("write", "threshold=41.5", "--key", key)
        assert other.returncode == 3 and "IDEMPOTENCY_CONFLICT" in other.stdout
        assert f"--key {key}" in other.stderr
        assert "was used for other content" in other.stderr  # why, not only the reason word
        huge = cli("write", "threshold=99999")
        assert huge.returncode == 4 and "outside what a register holds" in huge.stderr
        read = cli("read", "threshold", "--gateway-port", "dev")
        assert read.returncode == 0 and read.stdout.startswith("threshold = 41.0\n")
        trig = cli("trigger", "--json")
        assert trig.returncode == 0 and json.loads(trig.stdout)["answer"]["result"]["code_name"] == (
            "ACCEPTED")
        bad = subprocess.run([*CLI, "--gateway", gw.url, "read", "threshold"],
                             capture_output=True, text=True, timeout=scaled(30),
                             env={k: v for k, v in os.environ.items()
                                  if k != "IDEMLINK_GATEWAY_TOKEN"})
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "token" in bad.stderr


def test_a_plain_modbus_rtu_slave_behind_the_gateway(tmp_path: Path) -> None:
    from support.rtu import rtu_on_pty

    from idemlink.protocol.device_core import DeviceCore

    core = DeviceCore(trigger_duration=60.0)
    with rtu_on_pty(core) as path, running_gateway(tmp_path, [], "--rtu-port",
                                                   f"{path}=pump") as gw:
        assert gw.call("GET", "/v1/ports/pump").body["kind"] == "modbus-rtu"
        key = new_key(time.time())
        assert _write(gw, key, {"threshold": 415}, port="pump").status == 200
        again = _write(gw, key, {"threshold": 415}, port="pump")
        assert again.status == 200 and again.body["replayed"] is True
        r = gw.call("GET", "/v1/ports/pump/registers?names=threshold")
        assert r.body["registers"]["threshold"]["value"] == 41.5
        t = gw.call("POST", "/v1/ports/pump/trigger", {}, headers={"Idempotency-Key": new_key(
            time.time())})
        done = wait_until(lambda: (s := gw.call("GET", t.headers["Location"])).body["state"]
                          == "done" and s, what="the trigger's outcome")
        assert done.body["result"]["outcome"] == "OK"


def test_what_a_stopped_gateway_left_is_settled_at_start(tmp_path: Path) -> None:
    """A call recorded but never sent is released (its key may run); one whose record no longer
    makes a command of the map is an open item — the gateway starts all the same."""
    from idemlink.gateway import calls
    from idemlink.gateway.store import CallStore

    never_sent, unreadable = new_key(time.time()), new_key(time.time())
    store = CallStore.open(tmp_path / "calls.db")
    now_ms = int(time.time() * 1000)
    args = {"values": {"threshold": 366}}
    store.begin("alice", never_sent, calls.key_time_ms(never_sent),
                calls.digest("dev", "write", args), "dev", "write", args, now_ms)
    store.begin("alice", unreadable, calls.key_time_ms(unreadable), "x", "dev", "write",
                {"values": {"gone": 1}}, now_ms)
    store.started("alice", unreadable, (1, 2), b"\x06\x00\x99\x00\x01")
    store.close()
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        items = gw.call("GET", "/v1/open-items").body["open_items"]
        assert [i["key"] for i in items] == [unreadable]
        blocked = _write(gw, never_sent, {"threshold": 366})
        assert blocked.body["reason"] == "UNKNOWN_OUTSTANDING"  # until someone settles it
        ack = f"/v1/open-items/{unreadable}/acknowledge"
        assert gw.call("POST", ack, {"reason": "checked by hand"}).status == 200
        r = _write(gw, never_sent, {"threshold": 366})
        assert (r.status, r.body["replayed"]) == (200, False)  # it runs now, once
        assert len(sim.executions_of(_pdu_of(366))) == 1


def test_triggers_and_clears_are_honest_after_an_idle_reboot_or_a_lost_port(
        tmp_path: Path) -> None:
    """The device reboots while nobody talks to it: the next trigger and fault clear run once in
    the new boot, OK — no UNKNOWN, no open item blocking the port. A trigger accepted (202)
    whose port turns out gone never left: its status says NOT_EXECUTED, safe to retry — not a
    404/REJECTED — and the same key runs it later, once."""
    from idemlink.host.command import CommandBuilder
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    pdu = CommandBuilder(DEFAULT_MAP).trigger_command().pdu()
    # --watch 0: the page's watcher reads the port right after each call and would find it gone
    # before the trigger below is accepted (503 PORT_DOWN at once, honest too, not this case)
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"],
                                                      "--watch", "0") as gw:
        assert _write(gw, new_key(time.time()), {"threshold": 401}).status == 200
        sim.reboot()
        key = new_key(time.time())
        gw.call("POST", "/v1/ports/dev/trigger", {}, headers={"Idempotency-Key": key})
        done = wait_until(lambda: (s := gw.call("GET", f"/v1/calls/{key}")).body["state"]
                          == "done" and s, what="the trigger's outcome")
        assert done.body["result"]["outcome"] == "OK", done.body
        assert len(sim.executions_of(pdu)) == 1
        sim.reboot()
        c = gw.call("POST", "/v1/ports/dev/clear", {"mask": 1},
                    headers={"Idempotency-Key": new_key(time.time())})
        assert (c.status, c.body["outcome"]) == (200, "OK"), c.body
        assert gw.call("GET", "/v1/open-items").body["open_items"] == []
        assert _write(gw, new_key(time.time()), {"threshold": 402}).status == 200

        ran = len(sim.executions_of(pdu))
        sim.unplug()
        key = new_key(time.time())
        r = gw.call("POST", "/v1/ports/dev/trigger", {}, headers={"Idempotency-Key": key})
        assert r.status == 202, r.body
        done = wait_until(lambda: (s := gw.call("GET", f"/v1/calls/{key}")).body.get("state")
                          not in ("accepted", "started") and s, what="the trigger's outcome")
        assert done.status == 200 and done.body["state"] == "done", done.body
        assert (done.body["result"]["outcome"], done.body["result"]["action"]) == (
            "NOT_EXECUTED", "safe to retry")
        audit = gw.call("GET", "/v1/audit?limit=5").body["entries"]
        assert audit[0]["key"] == key and audit[0]["outcome"] == "NOT_EXECUTED"
        sim.serve()
        wait_until(lambda: gw.call("GET", "/v1/ports/dev").body["state"] == "up", timeout=20,
                   what="the port to come back")
        again = gw.call("POST", "/v1/ports/dev/trigger", {}, headers={"Idempotency-Key": key})
        assert again.status == 202
        wait_until(lambda: gw.call("GET", f"/v1/calls/{key}").body.get("result", {}).get(
            "outcome") == "OK", what="the retried trigger's outcome")
        assert len(sim.executions_of(pdu)) == ran + 1  # under its key: once


def test_recorded_calls_share_the_pipeline(tmp_path: Path) -> None:
    """The gateway's calls with an effect go on the device's shared pipeline (``run_recorded``):
    an independent write is recorded and sent while another is out; one to the same register
    waits for it; each travels under the number recorded for it."""
    import asyncio

    from idemlink.host.aio import AsyncDevice
    from idemlink.host.command import SentRequest

    with served_sim(tmp_path) as sim:
        async def main() -> tuple[list[str], list[tuple[object, ...]]]:
            events: list[str] = []
            numbers: dict[str, tuple[int, int] | None] = {}
            async with AsyncDevice.open(str(sim.link)) as dev:
                def recorder(name: str) -> Any:
                    def record(sent: SentRequest) -> None:
                        ran_a = bool(sim.executions_of(_pdu_of(351)))
                        events.append(f"record {name}" + (" after a ran" if ran_a else ""))
                        numbers[name] = sent.number
                    return record

                async def one(name: str, values: dict[str | int, int | str]) -> Any:
                    r = await dev.run_recorded(dev.write_command(values), recorder(name))
                    events.append(f"done {name}")
                    return r

                ra, rb, rc = await asyncio.gather(one("a", {"threshold": 351}),
                                                  one("b", {"mode": 2}),
                                                  one("c", {"threshold": 352}))
            return events, [(r.ok, r.sent_as[-1] == numbers[n]) for r, n in
                            ((ra, "a"), (rb, "b"), (rc, "c"))]

        events, checks = asyncio.run(main())
        assert checks == [(True, True)] * 3
        assert events.index("record b") < events.index("done a")  # shared the line
        assert "record c after a ran" in events  # the same register: it waited for a
        assert len(sim.executions_of(_pdu_of(352))) == 1


def test_several_calls_left_in_flight_are_all_settled_by_the_device_at_start(
        tmp_path: Path) -> None:
    """Two writes a killed gateway left ``started`` under numbers the device never saw: at start
    each is re-sent under its own number and runs now, once — no UNKNOWN. (Found by a SIGKILL
    campaign: the first one's read-back went under the new session's numbers, a window ahead,
    and the second's number was then TOO_OLD: an open item blocking the port.)"""
    from idemlink.gateway import calls
    from idemlink.gateway.store import CallStore

    with served_sim(tmp_path) as sim:
        with running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
            first = _write(gw, new_key(time.time()), {"threshold": 360})
            assert first.status == 200, first.body
        epoch = first.body["result"]["epoch"]
        with sim.shared.lock:  # the device's last number (the gateway may have read since)
            seq = max(e.seq for e in sim.device.executions if e.epoch == epoch)
        store = CallStore.open(tmp_path / "calls.db")
        now_ms = int(time.time() * 1000)
        left: dict[str, int] = {}
        for n, (value, number) in enumerate(((371, seq + 2), (372, seq + 1))):
            key = new_key(time.time())
            args = {"values": {"threshold": value}}
            store.begin("alice", key, calls.key_time_ms(key), calls.digest("dev", "write", args),
                        "dev", "write", args, now_ms + n)  # the higher number is settled first
            store.started("alice", key, (epoch, number), _pdu_of(value))
            left[key] = value
        store.close()
        with running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
            assert gw.call("GET", "/v1/open-items").body["open_items"] == []
            for key, value in left.items():
                r = _write(gw, key, {"threshold": value})
                assert (r.status, r.body["outcome"], r.body["replayed"]) == (200, "OK", True), \
                    r.body
        for value in left.values():
            assert len(sim.executions_of(_pdu_of(value))) == 1
