"""The fleet's soak: MQTT callers through a real Mosquitto, everything that can go wrong at once.

Several MQTT clients (two per caller id) publish commands with QoS 1, each key up to three times
and sometimes once more with other content; the broker is forced to redeliver (a proxy drops
the gateway's PUBACK with its connection, and the broker's PUBACK to a caller, whose client sends
again); the gateway is SIGKILLed and restarted, the broker restarted, the line loses a tenth of
its reads and writes, the device reboots; an operator acknowledges open UNKNOWNs over HTTP.

The oracle is independent of the code under test: it decodes the device's own execution log
(FC06 writes of one register, the value naming the call) and counts the outcome messages every
client was sent: 0 duplicated effects (never twice in one boot epoch), exactly one outcome
message per key on every client of its caller, each agreeing with the device (OK: it ran;
NOT_EXECUTED / REJECTED: it never ran), every reuse of a key with other content refused as
IDEMPOTENCY_CONFLICT and never run, every key in the audit log as an MQTT call. The long run is
``--run-slow``; the default run keeps test_gateway_mqtt's command under a redelivery and the
oracle's mutants here."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.gateway import READY, TOKEN, gateway_args, served_sim
from support.mqtt import Caller, CuttingProxy, broker, free_port, need_mosquitto, password_file
from support.timing import read_line, scaled, wait_until

from idemlink.host.gateway_client import GatewayClient
from idemlink.host.keys import new_key
from idemlink.protocol.regmap_file import DEFAULT_MAP

THRESHOLD = DEFAULT_MAP.named("threshold").address

#: per client: its caller id and its calls (key, value, conflicting value or None, times sent)
Plan = list[tuple[str, list[tuple[str, int, "int | None", int]]]]


def judge(plan: Plan, outcomes: list[dict[str, list[dict[str, Any]]]],
          refused: list[list[dict[str, Any]]], by_epoch: Counter[tuple[int, int]],
          audited: set[tuple[str, str]]) -> list[str]:
    """What went wrong, judged from the device's record (``by_epoch``: executions per (boot
    epoch, value)) and the messages each client was sent (``outcomes[i]``: key -> outcome
    messages of client i; ``refused[i]``); empty when nothing did."""
    wrong: list[str] = []
    if by_epoch and max(by_epoch.values()) > 1:
        wrong.append(f"duplicated effects: {[v for v, n in by_epoch.items() if n > 1]}")
    ran = Counter[int]()
    for (_epoch, value), n in by_epoch.items():
        ran[value] += n
    for i, (user, _calls) in enumerate(plan):
        for user2, calls in plan:
            if user2 != user:
                continue
            for key, value, other, _times in calls:
                got = outcomes[i].get(key, [])
                if len(got) != 1:
                    wrong.append(f"client {i}: key {key}: {len(got)} outcome messages, not one")
                    continue
                outcome = got[0]["outcome"]
                if outcome == "OK" and ran[value] < 1:
                    wrong.append(f"key {key}: OK but it never ran")
                if outcome in ("NOT_EXECUTED", "REJECTED") and ran[value]:
                    wrong.append(f"key {key}: {outcome} but it ran")
                if outcome == "UNKNOWN" and got[0]["action"] != "reconcile first":
                    wrong.append(f"key {key}: UNKNOWN without 'reconcile first'")
                if other is not None:
                    if ran[other]:
                        wrong.append(f"key {key}: other content ran")
                    if not any(r.get("key") == key and r.get("reason") == "IDEMPOTENCY_CONFLICT"
                               for r in refused[i]):
                        wrong.append(f"client {i}: key {key}: other content not refused as a "
                                     "conflict")
                if (user, key) not in audited:
                    wrong.append(f"key {key}: not in the audit log as {user}'s MQTT call")
    return wrong


def test_the_oracle_catches_what_it_must() -> None:
    """Mutants: each lie the oracle exists for, fed to it, is caught."""
    k1, k2 = new_key(time.time()), new_key(time.time())
    plan: Plan = [("alice", [(k1, 300, 900, 2)]), ("alice", [(k2, 301, None, 1)])]
    ok = {"outcome": "OK", "action": "none"}
    good_out = [{k1: [ok], k2: [ok]}, {k1: [ok], k2: [ok]}]
    conflict = {"key": k1, "reason": "IDEMPOTENCY_CONFLICT"}
    refused = [[conflict], [conflict]]
    audited = {("alice", k1), ("alice", k2)}
    ran = Counter({(1, 300): 1, (1, 301): 1})
    assert judge(plan, good_out, refused, ran, audited) == []
    assert judge(plan, good_out, refused, ran + Counter({(2, 301): 1}), audited) == []
    assert judge(plan, good_out, refused, ran + Counter({(1, 300): 1}), audited)  # twice
    assert judge(plan, good_out, refused, Counter({(1, 300): 1}), audited)  # OK, never ran
    assert judge(plan, good_out, refused, ran + Counter({(1, 900): 1}), audited)  # other ran
    assert judge(plan, [good_out[0], {k1: [ok, ok], k2: [ok]}], refused, ran, audited)  # 2 msgs
    assert judge(plan, [good_out[0], {k2: [ok]}], refused, ran, audited)  # none
    assert judge(plan, good_out, [[conflict], []], ran, audited)  # conflict not refused
    assert judge(plan, good_out, refused, ran, {("alice", k1)})  # not audited
    nothing = [{k1: [ok], k2: [{"outcome": "NOT_EXECUTED"}]}, good_out[1]]
    assert judge(plan, nothing, refused, ran, audited)  # NOT_EXECUTED, yet it ran


def _executed_values(sim: Any) -> Counter[tuple[int, int]]:
    with sim.shared.lock:
        runs = list(sim.device.executions)
    return Counter((e.epoch, int.from_bytes(e.request[3:5], "big")) for e in runs
                   if e.request[:1] == b"\x06" and int.from_bytes(e.request[1:3], "big")
                   == THRESHOLD)


class Gateway:
    """The gateway process, killed and restarted on the same HTTP port and store."""

    def __init__(self, tmp_path: Path, link: Path, mqtt_port: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = gateway_args(tmp_path, [f"{link}=dev"], "--mqtt",
                            f"mqtt://gw1@127.0.0.1:{mqtt_port}", "--mqtt-id", "gw1",
                            "--mqtt-password-file", str(password_file(tmp_path, "gw1")),
                            "--watch", "0.5")
        args[args.index("127.0.0.1:0")] = f"127.0.0.1:{self.port}"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert read_line(self.proc.stdout, self.proc, timeout=30).startswith(READY)

    def stop(self, kill: bool = False) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(scaled(20))
        self.proc.stdout.close()
        self.proc = None


@pytest.mark.slow
@pytest.mark.parametrize(("clients", "keys_each", "kills", "broker_restarts"), [(4, 40, 3, 2)])
def test_mqtt_soak_redelivery_kills_broker_restarts_lossy_line(
        tmp_path: Path, clients: int, keys_each: int, kills: int, broker_restarts: int) -> None:
    need_mosquitto()
    rng = random.Random(26)
    total = clients * keys_each
    others = iter(range(total, 1001))
    users = ["alice", "bob"]
    plan: Plan = [(users[c % 2], [
        (new_key(time.time()), c * keys_each + i, next(others) if rng.random() < 0.2 else None,
         rng.randint(1, 3)) for i in range(keys_each)]) for c in range(clients)]
    progress = Counter[str]()
    lock = threading.Lock()
    failures: list[str] = []
    with broker(tmp_path, debug=True) as b, served_sim(tmp_path) as sim:
        assert sim.line is not None
        sim.line.loss = 0.1
        gw_side = CuttingProxy(b.port)  # drops the gateway's PUBACKs: the broker redelivers
        caller_side = CuttingProxy(b.port)  # drops the broker's PUBACKs: a caller sends again
        gateway = Gateway(tmp_path, sim.link, gw_side.port)
        gateway.start()
        callers = [Caller(caller_side.port, user, client_id=f"soak-{i}")
                   for i, (user, _) in enumerate(plan)]

        def client(i: int) -> None:
            me = callers[i]
            try:
                for key, value, other, times in plan[i][1]:
                    for _ in range(times):
                        me.command("dev", "write", {"key": key, "values": {"threshold": value},
                                                    "wait": 300})
                    if other is not None:
                        me.command("dev", "write", {"key": key, "values": {"threshold": other},
                                                    "wait": 300})
                    me.outcome(key, timeout=240)
                    with lock:
                        progress["calls"] += 1
            except AssertionError as exc:
                failures.append(f"client {i}: {exc}")

        stop_operator = threading.Event()

        def operator() -> None:  # acknowledges open UNKNOWNs, as a person would
            gw = GatewayClient(gateway.url, TOKEN, attempts=1)
            while not stop_operator.wait(0.2):
                try:
                    for item in gw.open_items():
                        gw._once("POST", f"/v1/open-items/{item['key']}/acknowledge?caller="
                                 f"{item['caller']}", {"reason": "soak: judged by the oracle"})
                        with lock:
                            progress["acknowledged"] += 1
                except Exception:  # the gateway is being killed: next round
                    continue

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        op = threading.Thread(target=operator)
        for t in (*threads, op):
            t.start()
        events = ["kill"] * kills + ["broker"] * broker_restarts + ["reboot"]
        rng.shuffle(events)
        try:
            for n, event in enumerate(events, 1):
                wait_until(lambda n=n: progress["calls"] >= total * n // (len(events) + 1),
                           timeout=240, what=f"event {n}'s share of the calls ({event})")
                gw_side.cut(1, "client")
                caller_side.cut(2, "broker")
                if event == "kill":
                    gateway.stop(kill=True)  # SIGKILL, commands in flight
                    gateway.start()
                elif event == "broker":
                    b.restart()  # SIGTERM: Mosquitto saves its sessions and retained messages
                else:
                    sim.reboot()
            for t in threads:
                t.join(scaled(300))
            assert not any(t.is_alive() for t in threads), "a client never got its outcomes"
            assert failures == []
            # a last restart, then one more command per caller: an outcome republished by the
            # restart would arrive before this command's
            gateway.stop()
            gateway.start()
            for i, (user, _) in enumerate(plan[:2]):
                last = new_key(time.time())
                callers[i].command("dev", "write", {"key": last, "values": {"threshold": 1000 - i}})
                assert callers[i].outcome(last)["outcome"] == "OK"
                plan.append((user, [(last, 1000 - i, None, 1)]))
            gw = GatewayClient(gateway.url, TOKEN)
            audit: list[dict[str, Any]] = []
            while page := gw._once("GET", f"/v1/audit?limit=1000&after="
                                          f"{audit[-1]['id'] if audit else 0}")["entries"]:
                audit.extend(page)
        finally:
            stop_operator.set()
            op.join(scaled(30))
            if gateway.proc is not None:
                gateway.stop()
            for c in callers:
                c.close()
            gw_side.close()
            caller_side.close()
        ran = _executed_values(sim)
        lost = sim.line.lost
        # what the broker received from the gateway: one outcome publish per key
        sent = b.published("idemlink-gw-gw1", "/outcome/")
    # the two last commands' clients were not in the plan's per-client lists: give each client
    # of the same caller its messages for them too
    outcomes = [dict(c.outcomes) for c in callers] + [dict(callers[0].outcomes),
                                                      dict(callers[1].outcomes)]
    refused = [list(c.refused) for c in callers] + [list(callers[0].refused),
                                                    list(callers[1].refused)]
    audited = {(e["caller"], e["key"]) for e in audit if e["method"] == "MQTT"}
    assert judge(plan, outcomes, refused, ran, audited) == []
    keys = {f"idemlink/outcome/{user}/{k}" for user, calls in plan for k, *_ in calls}
    assert set(sent) == keys and set(sent.values()) == {1}, {t: n for t, n in sent.items()
                                                             if n != 1}
    finals = Counter(v[0]["outcome"] for v in outcomes[0].values())
    conflicts = sum(1 for r in refused[0] if r.get("reason") == "IDEMPOTENCY_CONFLICT")
    assert gw_side.cuts >= 1 and caller_side.cuts >= 1 and lost >= 1 and conflicts >= 1
    assert len({e for e, _ in ran}) == 2  # the reboot happened under the callers
    print(f"mqtt soak: {total + 2} keys over {clients} clients, "
          f"{sum(t for _, c in plan for *_, t in c)} command messages, outcomes {dict(finals)} "
          f"(client 0), {conflicts} conflicts refused (client 0), {gw_side.cuts} gateway PUBACKs "
          f"and {caller_side.cuts} broker PUBACKs dropped, {kills} SIGKILLs, {broker_restarts} "
          f"broker restarts, {lost} line reads/writes lost, {progress['acknowledged']} "
          f"UNKNOWNs acknowledged, {sum(ran.values())} executions, "
          f"{sum(c.redelivered for c in callers)} outcome deliveries repeated by the broker "
          "(QoS 1, DUP) and counted once")
