"""``idemlink soak --device-cmd``: any device program, spawned on a pty and restarted for reboots,
judged only from the effects file it appends (docs/SOAK.md); the soak's verdict line, progress
line and Ctrl-C report."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idemlink.campaign import CampaignConfig
from idemlink.output import PROGRESS_SECONDS_ENV
from idemlink.soak_device import run_device_campaign

SIM = (f"{shlex.quote(sys.executable)} -m idemlink sim --port {{port}} --effects {{effects}} "
       "--trigger-duration 0.2 --seed 3")
DEVICE_SOAK = CampaignConfig(commands=150, loss=0.03, dup=0.02, corrupt=0.02, reboot_every=40,
                             restart_every=40, seed=4, trigger_duration=0.2)


def test_the_simulator_as_a_device_command_passes_with_reboots_and_host_restarts() -> None:
    rep = run_device_campaign(DEVICE_SOAK, SIM + " --flash-dir {flash}")
    assert rep.passed, rep.problems[:5]
    assert rep.commands == 150 and rep.reboots > 0 and rep.host_restarts > 0
    assert rep.executions > 100


def test_a_device_command_that_forgets_its_configuration_loses_acknowledged_writes() -> None:
    rep = run_device_campaign(DEVICE_SOAK, SIM, fail_fast=True)  # no {flash}: amnesia at reboot
    assert rep.lost_acknowledged_writes > 0, rep.problems[:5]


def _soak(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idemlink", "soak", *args],
                          capture_output=True, text=True, check=False, timeout=timeout,
                          env={**os.environ, PROGRESS_SECONDS_ENV: "0"})


@pytest.mark.parametrize(("template", "says"), [
    ("idemlink sim --port {port}", "must contain {effects}"),
    (f"{shlex.quote(sys.executable)} -c 'raise SystemExit(3)' {{port}} {{effects}}",
     "exited (3)"),
    ("/nonexistent/device {port} {effects}", "cannot start"),
])
def test_a_device_command_that_cannot_serve_is_one_line_exit_1(template: str, says: str) -> None:
    r = _soak("--commands", "10", "--device-cmd", template)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and says in r.stderr and "Traceback" not in r.stderr


def test_soak_prints_progress_off_a_terminal_and_a_verdict_line() -> None:
    r = _soak("--commands", "400", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert "idemlink soak: 40/400 commands" in r.stderr
    assert r.stdout.splitlines()[-1].startswith("PASS: 400 commands, 0 duplicated effects")


def test_ctrl_c_stops_after_the_batch_and_prints_the_counts_so_far_as_json() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "soak", "--commands", "30000",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, PROGRESS_SECONDS_ENV: "0"})
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    while time.monotonic() < deadline:  # the first progress line: the campaign is running
        if proc.stderr.readline().startswith("idemlink soak: "):
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    [d] = [json.loads(line) for line in out.splitlines()]
    assert d["schema"] == "idemlink.error/1" and 0 < d["commands_run"] < 30_000
    report = d["report"]
    assert report["interrupted"] is True and report["passed"] is True
    assert report["commands"] == d["commands_run"] and report["executions"] > 0
    last = err.splitlines()[-2:]
    assert last[0].startswith("interrupted: no verdict (")
    assert last[1].startswith("idemlink soak: interrupted after ")


@pytest.mark.parametrize(("args", "says"), [
    (["--effects", "/nonexistent/dir/effects.jsonl"], "--effects /nonexistent/dir/effects.jsonl"),
    (["--modbus-rtu", "--effects", "e.jsonl"], "does not apply to --modbus-rtu"),
])
def test_sim_effects_that_cannot_be_written_is_one_line_exit_1(args: list[str], says: str) -> None:
    r = subprocess.run([sys.executable, "-m", "idemlink", "sim", *args], capture_output=True,
                       text=True, check=False, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert r.stdout == ""


RESTLESS_SIM = '''
import sys
from idemlink.protocol.device_core import DeviceCore
real = DeviceCore._apply
def restless(self, plan, now, request, tag):  # the generation moves on a no-op write too
    before = self._generation
    real(self, plan, now, request, tag)
    if plan.holdings and self._generation == before:
        self._generation = (before + 1) & 0xFFFF
DeviceCore._apply = restless
from idemlink.cli import main
sys.exit(main(sys.argv[1:]))
'''


def test_a_device_command_breaking_the_maps_semantics_fails_the_soak(tmp_path: Path) -> None:
    script = tmp_path / "restless_sim.py"
    script.write_text(RESTLESS_SIM)
    template = (f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} sim --port {{port}} "
                "--effects {effects} --flash-dir {flash} --trigger-duration 0.2 --seed 3")
    rep = run_device_campaign(DEVICE_SOAK, template, fail_fast=True)
    assert rep.register_semantics > 0, rep.problems[:3]
