"""A small end-to-end soak of the gateway: concurrent HTTP clients, each call's key sent up to
three times (and sometimes once more with other content), a lossy line, the gateway killed
with SIGKILL and restarted (once by default, three times in the slow run), and the device
rebooted once.

The oracle is independent of the code under test: it decodes the device's own execution log
(FC06 writes of one register, the value naming the call) and judges each key by the answers the
clients got: 0 duplicated effects (never twice in one boot epoch; a set-only write re-issued
after the reboot may run once in each), every key one final outcome that agrees with the device
(OK: it ran; NOT_EXECUTED / REJECTED: never ran), every reuse of a key with other content
refused as IDEMPOTENCY_CONFLICT and never run, every key in the audit log."""

from __future__ import annotations

import random
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.gateway import READY, TOKEN, gateway_args, served_sim
from support.timing import read_line, scaled, wait_until

from idemlink.host.gateway_client import GatewayClient
from idemlink.host.keys import new_key
from idemlink.protocol.regmap_file import DEFAULT_MAP

THRESHOLD = DEFAULT_MAP.named("threshold").address  # the map is data: where the register is


Plan = list[list[tuple[str, int, "int | None", int]]]


def judge(plan: Plan, answers: dict[str, list[dict[str, Any]]],
          conflicts: dict[str, list[dict[str, Any]]], by_epoch: Counter[tuple[int, int]],
          audit: list[dict[str, Any]]) -> list[str]:
    """What went wrong, judged from the device's record (``by_epoch``: executions per (boot
    epoch, value)) and the answers the clients got; empty when nothing did. A set-only write
    (all of these are) may run once in each boot epoch — re-issued after a reboot, as the
    project's oracle allows — never twice in one."""
    wrong: list[str] = []
    if by_epoch and max(by_epoch.values()) > 1:
        wrong.append(f"duplicated effects: {[v for v, n in by_epoch.items() if n > 1]}")
    ran = Counter[int]()
    for (_epoch, value), n in by_epoch.items():
        ran[value] += n
    audited = {e["key"] for e in audit}
    for calls in plan:
        for key, value, other, _times in calls:
            got = answers.get(key, [])
            outcomes = {a["outcome"] for a in got}
            if len(outcomes) != 1:
                wrong.append(f"key {key}: outcomes {sorted(outcomes)}, not one")
                continue
            (outcome,) = outcomes
            if outcome == "OK" and ran[value] < 1:
                wrong.append(f"key {key}: OK but it never ran")
            if outcome == "OK" and len({(a["result"]["epoch"], a["result"]["seq"])
                                        for a in got}) != 1:
                wrong.append(f"key {key}: OK under several numbers")
            if outcome in ("NOT_EXECUTED", "REJECTED") and ran[value] != 0:
                wrong.append(f"key {key}: {outcome} but it ran")
            if outcome == "UNKNOWN" and got[-1]["action"] != "reconcile first":
                wrong.append(f"key {key}: UNKNOWN without 'reconcile first'")
            if other is not None:
                if any((c.get("http"), c.get("reason")) != (409, "IDEMPOTENCY_CONFLICT")
                       for c in conflicts.get(key, [])):
                    wrong.append(f"key {key}: other content not refused as a conflict")
                if ran[other]:
                    wrong.append(f"key {key}: other content ran")
            if key not in audited:
                wrong.append(f"key {key}: not in the audit log")
    return wrong


def test_the_oracle_catches_what_it_must() -> None:
    """Mutants: each lie the oracle exists for, fed to it, is caught."""
    k1, k2 = new_key(time.time()), new_key(time.time())
    plan: Plan = [[(k1, 300, 900, 2), (k2, 301, None, 1)]]
    ok = {"outcome": "OK", "result": {"epoch": 1, "seq": 5}, "action": "none"}
    good_answers = {k1: [ok, {**ok, "replayed": True}],
                    k2: [{**ok, "result": {"epoch": 1, "seq": 6}}]}
    refused = {k1: [{"http": 409, "reason": "IDEMPOTENCY_CONFLICT"}]}
    audit = [{"key": k1}, {"key": k2}]
    good = Counter({(1, 300): 1, (1, 301): 1})
    assert judge(plan, good_answers, refused, good, audit) == []
    assert judge(plan, good_answers, refused, good + Counter({(2, 301): 1}), audit) == []
    assert judge(plan, good_answers, refused, good + Counter({(1, 300): 1}), audit)  # twice
    assert judge(plan, good_answers, refused, Counter({(1, 300): 1}), audit)  # OK, never ran
    assert judge(plan, good_answers, refused, good + Counter({(1, 900): 1}), audit)
    assert judge(plan, good_answers, {k1: [ok]}, good, audit)
    assert judge(plan, {**good_answers, k2: [ok, {"outcome": "UNKNOWN"}]}, refused, good,
                 audit)
    assert judge(plan, good_answers, refused, good, audit[:1])
    nothing = {**good_answers, k2: [{"outcome": "NOT_EXECUTED"}]}
    assert judge(plan, nothing, refused, good, audit)  # NOT_EXECUTED, yet it ran


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(tmp_path: Path, link: Path, port: int) -> subprocess.Popen[bytes]:
    args = gateway_args(tmp_path, [f"{link}=dev"])
    args[args.index("127.0.0.1:0")] = f"127.0.0.1:{port}"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert read_line(proc.stdout, proc, timeout=30).startswith(READY)
    return proc


def _executed_values(sim: Any) -> Counter[tuple[int, int]]:
    """The oracle's reading of the device's record: how often each value was written to the
    threshold register by FC06 (function, address, value: big-endian words), per boot epoch."""
    with sim.shared.lock:
        runs = list(sim.device.executions)
    return Counter((e.epoch, int.from_bytes(e.request[3:5], "big")) for e in runs
                   if e.request[:1] == b"\x06" and int.from_bytes(e.request[1:3], "big")
                   == THRESHOLD)


@pytest.mark.parametrize(("clients", "keys_each", "kills"), [
    (4, 12, 1), pytest.param(8, 100, 3, marks=pytest.mark.slow)])
def test_soak_repeated_keys_lossy_line_sigkills(tmp_path: Path, clients: int, keys_each: int,
                                                kills: int) -> None:
    rng = random.Random(25)
    # (key, value, conflicting value or None, times sent): every value names one call (the
    # register takes 0..1000: values 0.. for the keys, the conflicting ones after them)
    total = clients * keys_each
    others = iter(range(total, 1001))
    plan: Plan = [
        [(new_key(time.time()), c * keys_each + i, next(others) if rng.random() < 0.2 else None,
          rng.randint(1, 3)) for i in range(keys_each)] for c in range(clients)]
    answers: dict[str, list[dict[str, Any]]] = {}
    conflicts: dict[str, list[dict[str, Any]]] = {}
    progress = Counter[str]()
    lock = threading.Lock()
    with served_sim(tmp_path) as sim:
        assert sim.line is not None
        sim.line.loss = 0.1
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = _start(tmp_path, sim.link, port)

        def client(calls: list[tuple[str, int, int | None, int]]) -> None:
            gw = GatewayClient(url, TOKEN, attempts=40)
            for key, value, other, times in calls:
                for _ in range(times):
                    while True:
                        a = gw.write("dev", {"threshold": value}, key=key)
                        if a.get("reason") != "UNKNOWN_OUTSTANDING":
                            break
                        for item in gw.open_items():  # the operator's part, in the soak
                            gw.acknowledge(item["key"], "soak: judged by the oracle")
                    with lock:
                        answers.setdefault(key, []).append(a)
                if other is not None:
                    c = gw.write("dev", {"threshold": other}, key=key)
                    with lock:
                        conflicts.setdefault(key, []).append(c)
                with lock:
                    progress["calls"] += 1

        threads = [threading.Thread(target=client, args=(p,)) for p in plan]
        for t in threads:
            t.start()
        for k in range(1, kills + 1):
            wait_until(lambda k=k: progress["calls"] >= total * k // (kills + 2), timeout=120,
                       what=f"kill {k}'s share of the calls")
            proc.kill()  # SIGKILL, calls in flight
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            proc = _start(tmp_path, sim.link, port)
        wait_until(lambda: progress["calls"] >= total * (kills + 1) // (kills + 2), timeout=120,
                   what="the calls before the reboot")
        sim.reboot()  # the device restarts under the callers
        try:
            for t in threads:
                t.join(scaled(120))
            assert not any(t.is_alive() for t in threads)
            gw = GatewayClient(url, TOKEN)
            audit: list[dict[str, Any]] = []
            while page := gw._once("GET", f"/v1/audit?limit=1000&after="
                                          f"{audit[-1]['id'] if audit else 0}")["entries"]:
                audit.extend(page)
            items = gw.open_items()
        finally:
            proc.terminate()
            proc.wait(scaled(10))
            proc.stdout.close()  # type: ignore[union-attr]
        ran = _executed_values(sim)
        lost = sim.line.lost
        epochs = {e for e, _ in ran}

    assert judge(plan, answers, conflicts, ran, audit) == []
    all_keys = [k for p in plan for k, *_ in p]
    open_keys = {i["key"] for i in items}
    assert open_keys <= set(all_keys)
    finals = Counter(v[-1]["outcome"] for v in answers.values())
    assert finals["OK"] >= len(all_keys) * 0.8, finals
    assert sum(len(v) for v in conflicts.values()) >= 1
    replayed = sum(a["replayed"] for v in answers.values() for a in v)
    assert replayed >= 1 and lost >= 1 and len(epochs) == 2
    print(f"soak: {len(all_keys)} keys, {sum(map(len, answers.values()))} answers "
          f"({replayed} replayed), {dict(finals)}, {len(open_keys)} open, "
          f"{sum(map(len, conflicts.values()))} conflicts refused, {lost} reads/writes lost, "
          f"{sum(ran.values())} executions")
