"""The gateway's MQTT bridge against a real Mosquitto (started and stopped here, its own config,
passwords and access list): commands carry the call layer's keys, a QoS 1 redelivery acts once,
one outcome message per key, values on change, presence by last will. Ground truth from the
simulated device's execution log."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from pathlib import Path

import pytest
from support.gateway import TOKEN, running_gateway, served_sim
from support.mqtt import (
    DOC,
    LONG_USER,
    PASSWORDS,
    Caller,
    CuttingProxy,
    broker,
    need_mosquitto,
    password_file,
)
from support.timing import scaled, wait_until

from idemlink.gateway import calls, mqtt_topics
from idemlink.gateway.mqtt_topics import Refused, Topics
from idemlink.host.keys import new_key


def _pdu_of(threshold: int) -> bytes:
    from idemlink.host.command import CommandBuilder
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    return CommandBuilder(DEFAULT_MAP).write_command({"threshold": threshold}).pdu()


def mqtt_args(tmp_path: Path, port: int, gw: str = "gw1") -> list[str]:
    return ["--mqtt", f"mqtt://{gw}@127.0.0.1:{port}", "--mqtt-id", gw,
            "--mqtt-password-file", str(password_file(tmp_path, gw)), "--watch", "0.2"]


def test_topics_and_payloads() -> None:
    """The pure rules: what a command topic and payload ask for, what is refused."""
    t = Topics("gw1")
    now = time.time()
    key = new_key(now)
    body = json.dumps({"key": key, "values": {"threshold": 42}}).encode()
    cmd = t.parse("idemlink/cmd/alice/gw1/oven/write", body, now)
    assert (cmd.caller, cmd.port, cmd.op, cmd.key) == ("alice", "oven", "write", key)
    # the same content as the HTTP call's: one key, one call, whichever carried it
    assert cmd.digest == calls.digest("oven", "write", calls.args_for(
        "write", {"values": {"threshold": 42}}))
    assert t.parse("idemlink/cmd/alice/gw1/oven/write", json.dumps(
        {"key": key, "values": {"threshold": 42}, "if_match": 7}).encode(), now).args == {
        "values": {"threshold": 42}, "if_match": 7}
    assert t.caller_of("idemlink/cmd/alice/gw1/oven/write") == "alice"
    assert t.caller_of("idemlink/outcome/alice/x") is None
    bad = [("idemlink/cmd/alice/gw2/oven/write", body),  # another gateway's
           ("idemlink/cmd/alice/gw1/oven/reboot", body),  # no such operation
           ("idemlink/cmd/alice/gw1/oven", body),
           ("idemlink/cmd/alice/gw1/oven/write", b"[1]"),
           ("idemlink/cmd/alice/gw1/oven/write", b'{"key": "' + key.encode() + b'", "x": NaN}'),
           ("idemlink/cmd/alice/gw1/oven/write", b"x" * (mqtt_topics.MAX_PAYLOAD + 1)),
           ("idemlink/cmd/alice/gw1/oven/write", json.dumps({"key": key, "wait": -1}).encode()),
           ("idemlink/cmd/alice/gw1/oven/clear", json.dumps({"key": key, "if_match": 1}).encode())]
    for topic, data in bad:
        with pytest.raises(Refused):
            t.parse(topic, data, now)
    # the payload's "key" is named, not the HTTP header
    for no_key in (b'{"values": {}}', b'{"key": 5}', b'{"key": "01A2-not-a-key"}'):
        with pytest.raises(calls.MalformedIdempotencyKey, match='"key"'):
            t.parse("idemlink/cmd/alice/gw1/oven/write", no_key, now)
    with pytest.raises(calls.KeyOutsideRetention):
        t.parse("idemlink/cmd/alice/gw1/oven/write",
                json.dumps({"key": new_key(now - 2 * 86400)}).encode(), now)
    with pytest.raises(ValueError):
        Topics("gw/1")
    with pytest.raises(ValueError):
        Topics("gw1", "a/#")
    assert mqtt_topics.payload({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


def run_the_doc_example(url: str, broker_port: int) -> None:
    """docs/GATEWAY.md's ``<!-- fleet-python -->`` block, run; a value announced in a ``#
    comment`` after a ``print`` must be printed."""
    m = re.search(r"<!-- fleet-python -->\n```python\n(.*?)```", DOC.read_text("utf-8"), re.S)
    assert m is not None, "docs/GATEWAY.md lost its MQTT example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(m.group(1), str(DOC), "exec"), {
            "GW": url, "TOKEN": TOKEN, "BROKER_PORT": broker_port,
            "ALICE_PASSWORD": PASSWORDS["alice"]})
    for line in m.group(1).splitlines():
        if "print(" in line and "# " in line:
            want = line.split("# ", 1)[1].strip()
            assert want in out.getvalue(), f"{want!r} not in {out.getvalue()!r}"


def test_a_command_acts_once_under_redelivery(tmp_path: Path) -> None:
    """The gateway's PUBACK is lost (its connection cut with it): the broker delivers the command
    again, the gateway takes the copy for what it is: executed once, one outcome message. Also:
    a conflict is refused, a value is published on change, an unknown caller and a caller
    writing under another's name are refused, and the last will says offline after SIGKILL."""
    need_mosquitto()
    with broker(tmp_path) as b, served_sim(tmp_path) as sim:
        proxy = CuttingProxy(b.port)
        alice = Caller(b.port, "alice", observe=("idemlink/gateway/gw1",
                                                 "idemlink/value/gw1/oven/threshold"))
        with running_gateway(tmp_path, [f"{sim.link}=oven"],
                             *mqtt_args(tmp_path, proxy.port)) as gw:
            wait_until(lambda: alice.seen("gateway/gw1", lambda p: p["state"] == "online"),
                       timeout=20, what="the gateway online")
            run_the_doc_example(gw.url, b.port)
            # run again, as a user does: alice's retained outcome of the first run arrives on
            # subscribing, before this run's own
            run_the_doc_example(gw.url, b.port)
            # the gateway's PUBACK of the next command is lost with its connection
            proxy.cut(1, "client", "/cmd/")
            key = new_key(time.time())
            alice.command("oven", "write", {"key": key, "values": {"threshold": 444}})
            out = alice.outcome(key)
            assert (out["outcome"], out["reason"], out["key"], out["port"]) == (
                "OK", "OK", key, "oven"), out
            assert proxy.cuts == 1
            wait_until(lambda: len(sim.executions_of(_pdu_of(444))) == 1, what="the write")
            # the value, published retained on change
            wait_until(lambda: alice.seen("value/gw1/oven/threshold",
                                          lambda p: p["value"] == 44.4),
                       timeout=20, what="the new value published")
            # the broker's PUBACK of the next outcome is lost with the connection: the gateway
            # finds it on the broker (retained) and does not publish it again
            proxy.cut(1, "broker", "/outcome/")
            second = new_key(time.time())
            alice.command("oven", "write", {"key": second, "values": {"threshold": 443}})
            assert alice.outcome(second)["outcome"] == "OK"
            # (its copy to alice may overtake the broker's PUBACK to the gateway in the proxy)
            wait_until(lambda: proxy.cuts == 2, what="the outcome's PUBACK cut")

            # the same key again (a caller's retry) and other content under it
            alice.command("oven", "write", {"key": key, "values": {"threshold": 444}})
            alice.command("oven", "write", {"key": key, "values": {"threshold": 445}})
            conflict = wait_until(lambda: [r for r in alice.refused
                                           if r.get("reason") == "IDEMPOTENCY_CONFLICT"],
                                  what="the conflict refused")
            assert (conflict[0]["key"], conflict[0]["outcome"]) == (key, "NOT_EXECUTED")
            # one key, one call, whichever carries it: alice's HTTP retry replays her MQTT
            # command; an HTTP call's key reused over MQTT with other content is a conflict
            again = gw.call("POST", "/v1/ports/oven/write", {"values": {"threshold": 444}},
                            headers={"Idempotency-Key": key})
            assert (again.status, again.body["replayed"]) == (200, True)
            by_http = new_key(time.time())
            assert gw.call("POST", "/v1/ports/oven/write", {"values": {"threshold": 442}},
                           headers={"Idempotency-Key": by_http}).status == 200
            alice.command("oven", "write", {"key": by_http, "values": {"threshold": 441}})
            wait_until(lambda: [r for r in alice.refused if r.get("key") == by_http
                                and r.get("reason") == "IDEMPOTENCY_CONFLICT"],
                       what="the HTTP key's conflict refused")
            alice.command("oven", "write", {"key": by_http, "values": {"threshold": 442}})
            replayed = alice.outcome(by_http)  # the HTTP call's own outcome, not run again
            assert (replayed["outcome"], replayed["key"]) == ("OK", by_http)
            # an unknown caller (not in the tokens file): refused, nothing run
            mallory = Caller(b.port, "mallory")
            mallory.command("oven", "write", {"key": new_key(time.time()),
                                              "values": {"threshold": 446}})
            wait_until(lambda: [r for r in mallory.refused if r["reason"] == "UNKNOWN_CALLER"],
                       what="mallory refused")
            # so is a broker user whose name can be no caller id (over 64 characters): told
            # on its own refusal topic, audited — not dropped without a word
            lone = Caller(b.port, LONG_USER)
            lone.command("oven", "write", {"key": new_key(time.time()),
                                           "values": {"threshold": 446}})
            wait_until(lambda: [r for r in lone.refused if r["reason"] == "UNKNOWN_CALLER"],
                       what="the long-named user refused")
            lone.close()
            # a viewer (the tokens file's third word) may not write: refused as over HTTP
            # (403 FORBIDDEN), published, audited, nothing run
            vic = Caller(b.port, "vic")
            vics = new_key(time.time())
            vic.command("oven", "write", {"key": vics, "values": {"threshold": 449}})
            no = wait_until(lambda: [r for r in vic.refused if r["reason"] == "FORBIDDEN"],
                            what="vic refused")[0]
            assert (no["outcome"], no["http"], no["key"]) == ("REJECTED", 403, vics), no
            # bob under alice's name: the broker's access list drops it (MQTT 5: not authorized)
            bob = Caller(b.port, "bob")
            info = bob.command("oven", "write", {"key": new_key(time.time()),
                                                 "values": {"threshold": 447}}, as_user="alice")
            info.wait_for_publish(scaled(10))
            # a retained command would be handed to every later subscription (a reconnect, a
            # new session): refused, never run; the empty retained message clearing it is
            # not a command
            kept = new_key(time.time())
            alice.client.publish("idemlink/cmd/alice/gw1/oven/write", json.dumps(
                {"key": kept, "values": {"threshold": 450}}), qos=1, retain=True)
            no = wait_until(lambda: [r for r in alice.refused if r.get("key") == kept],
                            what="the retained command refused")[0]
            assert (no["reason"], no["outcome"], no["http"]) == ("RETAINED_COMMAND",
                                                                "REJECTED", 400), no
            alice.client.publish("idemlink/cmd/alice/gw1/oven/write", b"", qos=1, retain=True)
            # a payload over 64 KiB is refused; one over the gateway's MQTT 5 Maximum Packet
            # Size (1 MiB) is dropped by the broker, never read into the gateway's memory
            big, huge = new_key(time.time()), new_key(time.time())
            for k, size in ((big, 100_000), (huge, 2_000_000)):
                alice.client.publish("idemlink/cmd/alice/gw1/oven/write", json.dumps(
                    {"key": k, "values": {"threshold": 451}, "pad": "x" * size}), qos=1)
            # a later command of alice's is answered, so the ones before it were seen and dropped
            last = new_key(time.time())
            alice.command("oven", "write", {"key": last, "values": {"threshold": 448}})
            assert alice.outcome(last)["outcome"] == "OK"
            assert [len(sim.executions_of(_pdu_of(v))) for v in (
                441, 442, 443, 444, 445, 446, 447, 448, 449, 450, 451)] == [
                0, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0]
            assert [(r["reason"], r.get("key")) for r in alice.refused if r.get("reason") not in (
                "IDEMPOTENCY_CONFLICT",)] == [("RETAINED_COMMAND", kept),  # the clear: none
                                              ("MALFORMED_COMMAND", big)]  # huge: never read
            # one outcome message per key (the doc's example's keys, each sent twice, among them)
            assert len(sim.executions_of(_pdu_of(425))) == 2
            assert sorted(map(len, alice.outcomes.values())) == [1, 1, 1, 1, 1, 1]
            assert {key, second, last, by_http} < set(alice.outcomes)
            audit = gw.call("GET", "/v1/audit?limit=30").body["entries"]
            assert {(e["caller"], e["method"], e["key"]) for e in audit} >= {
                ("alice", "MQTT", key), ("alice", "MQTT", last)}
            assert [(e["outcome"], e["http"], e["path"]) for e in audit if e["key"] == vics] == [
                ("REJECTED", 403, "idemlink/cmd/vic/gw1/oven/write")]
            gw.kill()
            wait_until(lambda: alice.seen("gateway/gw1", lambda p: p["state"] == "offline"),
                       timeout=30, what="the last will: offline")
        for c in (alice, mallory, bob, vic):
            c.close()
        proxy.close()


def test_the_bridge_judges_roles_and_a_full_store(tmp_path: Path) -> None:
    """The default run's look at what the slow test below drives through a broker: a caller's
    role is the HTTP route's (a viewer may not write; an operator — the default — may), and a
    call the store refuses as full is refused at once: a refusal waiting for the broker, the
    command's row dropped (its key free again), not asked again. Audited as HTTP's refusals."""
    from idemlink.gateway.mqtt_bridge import Bridge, Forbidden, MqttConfig, UnknownCaller
    from idemlink.gateway.service import Gateway, PortSpec
    from idemlink.gateway.store import PRUNE_GRACE_SECONDS, CallStore, StoreLimits
    from idemlink.gateway.watch import Watcher
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    store = CallStore.open(tmp_path / "calls.db", StoreLimits(retention_seconds=3600))
    gateway = Gateway(store, [PortSpec("oven", "unused", DEFAULT_MAP)])
    bridge = Bridge(gateway, Watcher(gateway, 0), MqttConfig("127.0.0.1", 1, "gw1"),
                    {"alice", "vic", "olga"}, {"alice": "admin", "vic": "viewer"})
    try:
        bridge._check_caller("alice", "write")
        bridge._check_caller("olga", "trigger")  # no role named: the default, operator
        for caller, op, error in (("vic", "write", Forbidden), ("vic", "clear", Forbidden),
                                  ("mallory", "write", UnknownCaller)):
            with pytest.raises(error):
                bridge._check_caller(caller, op)
        # the store's retention setting, not the default day, judges a command's key
        old = json.dumps({"key": new_key(time.time() - 7200), "values": {}}).encode()
        with pytest.raises(calls.KeyOutsideRetention):
            bridge.topics.parse("idemlink/cmd/alice/gw1/oven/write", old, time.time(),
                                bridge.limits.retention_seconds)
        assert mqtt_topics.outcome_expiry(3600) == 3600 + PRUNE_GRACE_SECONDS
        key = new_key(time.time())
        cmd = bridge.topics.parse("idemlink/cmd/alice/gw1/oven/write", json.dumps(
            {"key": key, "values": {"threshold": 1}}).encode(), time.time())
        bridge.inbox.add(cmd, int(time.time() * 1000))
        (entry,) = bridge.inbox.pending("oven")
        assert bridge._resolve(entry, {"outcome": "NOT_EXECUTED", "reason": "STORE_FULL",
                                       "action": "safe to retry", "http": 503, "key": key})
        assert bridge.inbox.get("alice", key) is None  # the key is free for a later retry
        ((_, topic, data),) = bridge.inbox.refusals()
        said = json.loads(data)
        assert (topic, said["reason"], said["key"], said["topic"]) == (
            "idemlink/refused/alice", "STORE_FULL", key, "idemlink/cmd/alice/gw1/oven/write")
        # a call that never ran ("safe to retry", its wait over) frees the key: the same
        # command again is the caller's retry, run again — a copy of one that ran is not
        topic = "idemlink/cmd/alice/gw1/oven/write"
        down = json.dumps({"key": new_key(time.time()), "values": {"threshold": 2},
                           "wait": 0}).encode()
        bridge._command(None, topic, down)
        (entry,) = bridge.inbox.pending("oven")
        assert bridge._resolve(entry, {"outcome": "NOT_EXECUTED", "reason": "PORT_DOWN",
                                       "action": "safe to retry", "http": 503})
        assert bridge.inbox.pending("oven") == []
        bridge._command(None, topic, down)
        assert [e.key for e in bridge.inbox.pending("oven")] == [entry.key]
        # a full inbox (a flood) refuses the command on arrival — INBOX_FULL, safe to retry —
        # naming its key, and audits it with its payload; the message is acknowledged
        from types import SimpleNamespace

        from idemlink.gateway import mqtt_inbox

        acked: list[int] = []
        bridge._client = SimpleNamespace(ack=lambda mid, qos: acked.append(mid))
        flood = new_key(time.time())
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(mqtt_inbox, "MAX_OPEN", 1)
            bridge._on_message(bridge._client, topic, json.dumps(
                {"key": flood, "values": {"threshold": 3}}).encode(), 7, 1)
        assert acked == [7]
        said = json.loads(bridge.inbox.refusals()[-1][2])
        assert (said["reason"], said["outcome"], said["action"], said.get("key")) == (
            "INBOX_FULL", "NOT_EXECUTED", "safe to retry", flood), said
        (audited,) = [e for e in store.audit_entries(10, None) if e["key"] == flood]
        assert flood in audited["content"]["body"]
    finally:
        bridge.inbox.close()
        store.close()


@pytest.mark.slow
def test_a_full_store_refuses_commands_at_once(tmp_path: Path) -> None:
    """The store's limits hold for MQTT as for HTTP: with ``--max-calls 1`` the second command
    is refused ``STORE_FULL`` (NOT_EXECUTED, safe to retry) on ``P/refused/CALLER`` at once —
    not asked again for its ``wait`` — nothing run, and its row is dropped: the same command
    again is refused again (a row kept would take it for a copy and say nothing)."""
    need_mosquitto()
    with broker(tmp_path) as b, served_sim(tmp_path) as sim:
        alice = Caller(b.port, "alice", observe=("idemlink/gateway/gw1",))
        with running_gateway(tmp_path, [f"{sim.link}=oven"], *mqtt_args(tmp_path, b.port),
                             "--max-calls", "1", "--watch", "0"):
            wait_until(lambda: alice.seen("gateway/gw1", lambda p: p["state"] == "online"),
                       timeout=20, what="the gateway online")
            first = new_key(time.time())
            alice.command("oven", "write", {"key": first, "values": {"threshold": 451}})
            assert alice.outcome(first)["outcome"] == "OK"
            full = new_key(time.time())
            for n in (1, 2):
                start = time.monotonic()
                alice.command("oven", "write", {"key": full, "values": {"threshold": 452},
                                                "wait": 600})
                got = wait_until(lambda n=n: [r for r in alice.refused
                                              if r.get("key") == full][n - 1:],
                                 what=f"refusal {n} of the full store")[0]
                assert time.monotonic() - start < scaled(20)  # not retried for its wait
                assert (got["outcome"], got["reason"], got["action"], got["http"]) == (
                    "NOT_EXECUTED", "STORE_FULL", "safe to retry", 503), got
            assert full not in alice.outcomes
        assert [len(sim.executions_of(_pdu_of(v))) for v in (451, 452)] == [1, 0]
        alice.close()


@pytest.mark.slow
def test_two_gateways_serve_one_fleet(tmp_path: Path) -> None:
    """Two gateways on one broker, each its own device: a command runs on the gateway its topic
    names and nowhere else; each says it is online and publishes its own values."""
    need_mosquitto()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with broker(tmp_path, ("gw1", "gw2")) as b, served_sim(tmp_path / "a") as one, \
            served_sim(tmp_path / "b") as two:
        alice = Caller(b.port, "alice", observe=("idemlink/gateway/#", "idemlink/value/#"))
        with running_gateway(tmp_path / "a", [f"{one.link}=oven"],
                             *mqtt_args(tmp_path, b.port, "gw1")), \
                running_gateway(tmp_path / "b", [f"{two.link}=oven"],
                                *mqtt_args(tmp_path, b.port, "gw2")):
            for gw in ("gw1", "gw2"):
                wait_until(lambda gw=gw: alice.seen(f"gateway/{gw}",
                                                    lambda p: p["state"] == "online"),
                           timeout=20, what=f"{gw} online")
            k1, k2 = new_key(time.time()), new_key(time.time())
            alice.command("oven", "write", {"key": k1, "values": {"threshold": 401}},
                          gateway="gw1")
            alice.command("oven", "write", {"key": k2, "values": {"threshold": 402}},
                          gateway="gw2")
            assert (alice.outcome(k1)["gateway"], alice.outcome(k2)["gateway"]) == ("gw1", "gw2")
            assert [len(one.executions_of(_pdu_of(v))) for v in (401, 402)] == [1, 0]
            assert [len(two.executions_of(_pdu_of(v))) for v in (401, 402)] == [0, 1]
            for gw, value in (("gw1", 40.1), ("gw2", 40.2)):
                wait_until(lambda gw=gw, value=value: alice.seen(
                    f"value/{gw}/oven/threshold", lambda p: p["value"] == value), timeout=20,
                    what=f"{gw}'s value")
        alice.close()


def test_mqtt_options_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    """A bad --mqtt (URL, a password in it, no --mqtt-id, a password file others may read):
    exit 1, one line on stderr, before any port is opened."""
    from support.gateway import tokens_file

    from idemlink.cli import main

    loose = tmp_path / "loose.password"
    loose.write_text("secret\n")
    loose.chmod(0o644)
    base = ["gateway", "--port", "/dev/null", "--tokens", str(tokens_file(tmp_path)),
            "--store", str(tmp_path / "calls.db")]
    for extra, said in ((["--mqtt", "http://h", "--mqtt-id", "g"], "mqtt://"),
                        (["--mqtt", "mqtt://u:pw@h", "--mqtt-id", "g"], "--mqtt-password-file"),
                        (["--mqtt", "mqtt://h"], "--mqtt-id"),
                        (["--mqtt", "mqtt://h", "--mqtt-id", "a/b"], "gateway id"),
                        (["--mqtt", "mqtt://h", "--mqtt-id", "g", "--mqtt-prefix", "x/#"],
                         "prefix"),
                        (["--mqtt", "mqtt://u@h", "--mqtt-id", "g", "--mqtt-password-file",
                          str(loose)], "chmod 600"),
                        (["--watch", "-1"], "--watch")):
        assert main([*base, *extra]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "Traceback" not in err, err


@pytest.mark.slow
def test_a_command_taken_before_a_sigkill_runs_after_the_restart(tmp_path: Path) -> None:
    """The gateway acknowledged a command to the broker (it is in the inbox on disk) but could
    not run it yet — an UNKNOWN blocks the port — and is SIGKILLed. The broker has nothing to
    send again: the restarted gateway runs it from its inbox once the UNKNOWN is acknowledged,
    once, and publishes its one outcome."""
    need_mosquitto()
    with broker(tmp_path) as b, served_sim(tmp_path) as sim:
        assert sim.line is not None
        alice = Caller(b.port, "alice")
        args = [f"{sim.link}=oven"], *mqtt_args(tmp_path, b.port), "--timeout", "0.05"
        with running_gateway(tmp_path, *args) as gw:
            sim.line.mute = True
            lost = gw.call("POST", "/v1/ports/oven/write", {"values": {"threshold": 432}},
                           headers={"Idempotency-Key": new_key(time.time())})
            sim.line.mute = False
            assert lost.body["outcome"] == "UNKNOWN"
            key = new_key(time.time())
            alice.command("oven", "write", {"key": key, "values": {"threshold": 431},
                                            "wait": 120})
            # refused for now (audited), so it was taken — and acknowledged — before
            wait_until(lambda: any(e["key"] == key and e["method"] == "MQTT" for e in gw.call(
                "GET", "/v1/audit?limit=20").body["entries"]), what="the command tried")
            gw.kill()
        assert sim.executions_of(_pdu_of(431)) == []
        with running_gateway(tmp_path, *args) as gw:
            ack = gw.call("POST", f"/v1/open-items/{lost.body['key']}/acknowledge",
                          {"reason": "read back 43.2: it ran"})
            assert ack.status == 200
            out = alice.outcome(key)
            assert (out["outcome"], out["key"]) == ("OK", key)
        assert len(sim.executions_of(_pdu_of(431))) == 1
        assert list(map(len, alice.outcomes.values())) == [1]
        alice.close()


@pytest.mark.slow
def test_a_flood_waits_on_the_broker(tmp_path: Path) -> None:
    """The gateway tells the broker how many commands it may have out unacknowledged (MQTT 5
    Receive Maximum): with a broker that sets no limit of its own, a gateway that takes nothing
    (stopped) is sent that many and no more — the flood waits on the broker, not in the
    gateway's memory — and once it runs again every command is answered once."""
    import signal

    from idemlink.gateway.mqtt_bridge import RECEIVE_MAXIMUM

    need_mosquitto()
    with broker(tmp_path, extra="max_inflight_messages 0\n") as b, served_sim(tmp_path) as sim:
        proxy = CuttingProxy(b.port)
        alice = Caller(b.port, "alice", observe=("idemlink/gateway/gw1",))
        with running_gateway(tmp_path, [f"{sim.link}=oven"],
                             *mqtt_args(tmp_path, proxy.port), "--watch", "0") as gw:
            wait_until(lambda: alice.seen("gateway/gw1", lambda p: p["state"] == "online"),
                       timeout=20, what="the gateway online")
            gw.proc.send_signal(signal.SIGSTOP)
            keys = [new_key(time.time()) for _ in range(4 * RECEIVE_MAXIMUM)]
            for n, key in enumerate(keys):
                alice.command("oven", "write", {"key": key, "values": {"threshold": 300 + n}}
                              ).wait_for_publish(scaled(10))
            wait_until(lambda: proxy.commands >= RECEIVE_MAXIMUM, what="the first commands")
            time.sleep(scaled(0.5))  # what a broker without the limit would send meanwhile
            assert proxy.commands == RECEIVE_MAXIMUM
            gw.proc.send_signal(signal.SIGCONT)
            for key in keys:
                assert alice.outcome(key)["outcome"] == "OK"
            assert sorted(map(len, alice.outcomes.values())) == [1] * len(keys)
        alice.close()
        proxy.close()


def test_a_refused_connection_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A wrong broker password — the usual mistake when a gateway joins a fleet — is logged
    with the broker's reason and the user, not only "refused"; the gateway tries again."""
    import asyncio
    import logging

    from idemlink.gateway.mqtt_bridge import Bridge, MqttConfig
    from idemlink.gateway.service import Gateway, PortSpec
    from idemlink.gateway.store import CallStore
    from idemlink.gateway.watch import Watcher
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    wrong = tmp_path / "gw1.password"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    with broker(tmp_path) as b:
        store = CallStore.open(tmp_path / "calls.db")
        gateway = Gateway(store, [PortSpec("oven", "unused", DEFAULT_MAP)])
        config = MqttConfig.parse(f"mqtt://gw1@127.0.0.1:{b.port}", "gw1",
                                  password_file=str(wrong))
        bridge = Bridge(gateway, Watcher(gateway, 0), config, {"alice"})

        async def run() -> None:
            bridge.start()
            loop = asyncio.get_running_loop()
            end = loop.time() + scaled(10)
            while loop.time() < end and "refused" not in caplog.text:
                await asyncio.sleep(0.01)
            await bridge.close()

        with caplog.at_level(logging.WARNING, "idemlink.gateway.mqtt_bridge"):
            asyncio.run(run())
        store.close()
    # (Mosquitto answers a wrong password "Not authorized", MQTT 5 reason 135)
    assert "refused the connection of user gw1: Not authorized" in caplog.text, (
        caplog.text)


@pytest.mark.slow
def test_a_retry_of_a_command_that_did_not_run_runs(tmp_path: Path) -> None:
    """A command that did not run ("safe to retry": its port was down past its wait) frees its
    key, as over HTTP: the caller's retry under the same key runs once the port is back, and
    is answered (a second outcome message under the key, the first said nothing ran)."""
    need_mosquitto()
    with broker(tmp_path) as b, served_sim(tmp_path) as sim:
        alice = Caller(b.port, "alice", observe=("idemlink/gateway/gw1",))
        with running_gateway(tmp_path, [f"{sim.link}=oven"], *mqtt_args(tmp_path, b.port)
                             ) as gw:
            wait_until(lambda: alice.seen("gateway/gw1", lambda p: p["state"] == "online"),
                       timeout=20, what="the gateway online")
            # a command that did not run ("safe to retry": here its port was down past its
            # wait) frees its key: the caller's retry under it runs, and is answered
            sim.unplug()
            wait_until(lambda: gw.call("GET", "/v1/ports/oven").body["state"] == "down",
                       what="the port down")
            retry = new_key(time.time())
            alice.command("oven", "write", {"key": retry, "values": {"threshold": 452},
                                            "wait": 0})
            first = alice.outcome(retry)
            assert (first["outcome"], first["reason"], first["action"]) == (
                "NOT_EXECUTED", "PORT_DOWN", "safe to retry"), first
            sim.serve()
            wait_until(lambda: gw.call("GET", "/v1/ports/oven").body["state"] == "up",
                       timeout=20, what="the port up again")
            alice.command("oven", "write", {"key": retry, "values": {"threshold": 452}})
            wait_until(lambda: len(alice.outcomes[retry]) == 2, what="the retry answered")
            assert alice.outcomes[retry][1]["outcome"] == "OK", alice.outcomes[retry]
            assert len(sim.executions_of(_pdu_of(452))) == 1
        alice.close()


@pytest.mark.slow
def test_a_sigkill_between_running_and_publishing_publishes_once(tmp_path: Path) -> None:
    """The gateway killed after a command ran and before the broker acknowledged its outcome:
    the outcome never reached the broker (swallowed on the way) — published after the restart;
    or it did and only the acknowledgement was lost — found on the broker after the restart,
    not published again. Each command ran once, each outcome reached alice once, and the
    broker's own log shows each received from the gateway once."""
    need_mosquitto()
    with broker(tmp_path, debug=True) as b, served_sim(tmp_path) as sim:
        proxy = CuttingProxy(b.port)
        alice = Caller(b.port, "alice", observe=("idemlink/gateway/gw1",))
        ports, args = [f"{sim.link}=oven"], [*mqtt_args(tmp_path, proxy.port), "--watch", "0"]


        with running_gateway(tmp_path, ports, *args) as gw:
            wait_until(lambda: alice.seen("gateway/gw1", lambda p: p["state"] == "online"),
                       timeout=20, what="the gateway online")
            proxy.hold = "/outcome/"
            lost = new_key(time.time())
            alice.command("oven", "write", {"key": lost, "values": {"threshold": 461}})
            wait_until(lambda: proxy.held >= 1, what="the outcome on its way, swallowed")
            gw.kill()
        proxy.hold = None
        assert len(sim.executions_of(_pdu_of(461))) == 1 and lost not in alice.outcomes
        with running_gateway(tmp_path, ports, *args) as gw:
            assert alice.outcome(lost)["outcome"] == "OK"  # published after the restart
            proxy.cut(1, "broker", "/outcome/")
            unheard = new_key(time.time())
            alice.command("oven", "write", {"key": unheard, "values": {"threshold": 462}})
            wait_until(lambda: proxy.cuts == 1, what="the outcome's PUBACK cut")
            gw.kill()
        with running_gateway(tmp_path, ports, *args) as gw:
            last = new_key(time.time())
            alice.command("oven", "write", {"key": last, "values": {"threshold": 463}})
            assert alice.outcome(last)["outcome"] == "OK"  # after its look at the broker
        assert [len(sim.executions_of(_pdu_of(v))) for v in (461, 462, 463)] == [1, 1, 1]
        assert alice.outcome(unheard)["outcome"] == "OK"
        assert [len(alice.outcomes[k]) for k in (lost, unheard, last)] == [1, 1, 1]
        sent = b.published("idemlink-gw-gw1", "/outcome/alice/")
        assert [sent[f"idemlink/outcome/alice/{k}"] for k in (lost, unheard, last)] == [1, 1, 1]
        alice.close()
        proxy.close()


def test_one_callers_flood_fills_its_own_share(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The inbox holds at most ``MAX_OPEN_PER_CALLER`` commands of one caller not yet answered:
    a caller's flood is refused (INBOX_FULL) while another caller's command is still taken; a
    published outcome, a dropped row or a restart give the share back exactly."""
    from idemlink.gateway import mqtt_inbox
    from idemlink.gateway.mqtt_inbox import Inbox, InboxFull

    monkeypatch.setattr(mqtt_inbox, "MAX_OPEN_PER_CALLER", 2)
    t = Topics("gw1")
    now = time.time()

    def cmd(caller: str) -> mqtt_topics.Command:
        return t.parse(f"idemlink/cmd/{caller}/gw1/oven/write", json.dumps(
            {"key": new_key(now), "values": {"threshold": 1}}).encode(), now)

    inbox = Inbox(str(tmp_path / "calls.db"))
    try:
        first, second = cmd("alice"), cmd("alice")
        for c in (first, second):
            inbox.add(c, int(now * 1000))
        with pytest.raises(InboxFull, match="caller alice"):
            inbox.add(cmd("alice"), int(now * 1000))
        inbox.add(cmd("bob"), int(now * 1000))  # another caller: its own share
        done = inbox.get("alice", first.key)
        assert done is not None
        inbox.finish(done, "idemlink/outcome/alice/x", b"{}", retained=True)
        inbox.published(done.id)  # answered: a place again
        inbox.add(cmd("alice"), int(now * 1000))
        with pytest.raises(InboxFull):
            inbox.add(cmd("alice"), int(now * 1000))
        inbox.close()
        inbox = Inbox(str(tmp_path / "calls.db"))  # counted again from the file
        with pytest.raises(InboxFull):
            inbox.add(cmd("alice"), int(now * 1000))
        dropped = inbox.get("alice", second.key)
        assert dropped is not None and inbox.refuse("idemlink/refused/alice", b"{}", dropped)
        inbox.add(cmd("alice"), int(now * 1000))
    finally:
        inbox.close()
