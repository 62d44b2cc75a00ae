"""``idemlink watch`` against a simulator whose values change: changes printed, honest per-poll
outcomes when answers are lost, a summary at the end."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from idemlink.device_sim.link import LinkConfig
from idemlink.pytest_plugin import start_pty_sim

CLI = [sys.executable, "-m", "idemlink", "watch"]


def test_watch_prints_first_values_then_only_changes() -> None:
    sim = start_pty_sim()
    stop = threading.Event()

    def warm_up() -> None:  # the physical world: temperature rises 0.5 °C every 0.15 s
        t = 250
        while not stop.wait(0.15):
            t += 5
            with sim._shared.lock:
                sim.device.core.set_input("temperature", t, time.monotonic())

    th = threading.Thread(target=warm_up, daemon=True)
    th.start()
    try:
        r = subprocess.run([*CLI, "--port", sim.path, "--interval", "0.1", "--count", "12",
                            "--json"], capture_output=True, text=True, check=False, timeout=60)
    finally:
        stop.set()
        th.join()
        sim.close()
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    first = [x for x in rows if x["poll"] == 1]
    assert {x["name"] for x in first} == {s.name for s in sim.device.core.regmap}
    later = [x for x in rows if x["poll"] > 1]
    assert later and {x["name"] for x in later} == {"temperature"}
    temps = [x["raw"] for x in rows if x["name"] == "temperature"]
    assert temps == sorted(temps) and len(set(temps)) == len(temps) >= 4
    assert all(x["schema"] == "idemlink.watch/1" and x["outcome"] == "OK" for x in rows)
    assert rows[0]["name"] == "temperature" and rows[0]["unit"] == "°C"
    assert rows[0]["value"] == rows[0]["raw"] / 10
    assert "12 poll(s)" in r.stderr and f"{len(temps) - 1} change(s)" in r.stderr


def test_watch_reports_polls_that_got_no_answer_and_goes_on() -> None:
    # Every answer lost for a while: those polls say UNKNOWN (NO_ANSWER); the rest read values.
    sim = start_pty_sim(link=LinkConfig(frame_loss=0.5, seed=3))
    try:
        r = subprocess.run([*CLI, "--port", sim.path, "--interval", "0.05", "--count", "15",
                            "--timeout", "0.05", "--attempts", "1", "mode"],
                           capture_output=True, text=True, check=False, timeout=60)
    finally:
        sim.close()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.endswith("mode : UNKNOWN (NO_ANSWER)") for line in lines), lines
    assert any(line.endswith("mode = auto (1)") for line in lines), lines
    assert "Traceback" not in r.stderr
    assert "with a read that got no answer" in r.stderr
