"""``--version``, ``-v``/``-vv`` and ``--log-level`` on every command; frames logged at DEBUG."""

from __future__ import annotations

import subprocess
import sys

import pytest

from idemlink import __version__
from idemlink.pytest_plugin import start_pty_sim

CLI = [sys.executable, "-m", "idemlink"]


def test_version() -> None:
    r = subprocess.run([*CLI, "--version"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.strip() == f"idemlink {__version__}"


@pytest.mark.parametrize("where", ["before", "after"])
def test_vv_logs_every_frame_with_type_seq_epoch_status(where: str) -> None:
    sim = start_pty_sim()
    try:
        args = ["read", "--port", sim.path, "mode"]
        argv = ["-vv", *args] if where == "before" else [*args, "-vv"]
        r = subprocess.run([*CLI, *argv], capture_output=True, text=True, check=False, timeout=30)
        assert r.returncode == 0, r.stderr
        epoch = f"{sim.device.epoch:08x}"
        assert "idemlink.frames DEBUG tx HELLO" in r.stderr
        assert f"rx HELLO_REPLY epoch={epoch} device={sim.device.device_id}" in r.stderr
        assert f"tx REQUEST epoch={epoch} seq=1 fc=0x03 attempt=1" in r.stderr
        assert f"rx RESPONSE epoch={epoch} seq=1 status=OK" in r.stderr
        assert r.stdout == "mode = auto (1)\n"
        quiet = subprocess.run([*CLI, *args], capture_output=True, text=True, check=False,
                               timeout=30)
        assert quiet.stderr == "" and quiet.stdout == r.stdout
        warn = subprocess.run([*CLI, *args, "-vv", "--log-level", "warning"],
                              capture_output=True, text=True, check=False, timeout=30)
        assert "DEBUG" not in warn.stderr
    finally:
        sim.close()


def test_trace_file_holds_every_frame_both_ways_decoded(tmp_path: object) -> None:
    import json
    from pathlib import Path

    trace = Path(str(tmp_path)) / "trace.jsonl"
    sim = start_pty_sim()
    try:
        for argv in (["write", "threshold=42.5"], ["read", "threshold"]):
            # A generous --timeout: the rows are counted, and a retry (a legitimate extra row)
            # must take a stall of seconds, not a busy machine's 0.2 s.
            r = subprocess.run([*CLI, *argv, "--port", sim.path, "--trace", str(trace),
                                "--timeout", "5"],
                               capture_output=True, text=True, check=False, timeout=30)
            assert r.returncode == 0, r.stderr
        bad = subprocess.run([*CLI, "read", "--port", sim.path, "--trace", "/nonexistent/x"],
                             capture_output=True, text=True, check=False, timeout=30)
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "--trace" in bad.stderr
    finally:
        sim.close()
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["dir"], r["type"]) for r in rows] == [
        ("tx", "HELLO"), ("rx", "HELLO_REPLY"), ("tx", "REQUEST"), ("rx", "RESPONSE")] * 2
    assert all(r["schema"] == "idemlink.trace/1" for r in rows)
    write_req = rows[2]
    assert write_req["registers"] == [{"name": "threshold", "address": 4, "raw": 425,
                                       "value": 42.5, "label": None, "unit": "°C"}]
    read_answer = rows[7]
    assert read_answer["status"] == "OK" and read_answer["registers"][0]["raw"] == 425
    assert rows[1]["device"]["id"] == sim.device.device_id


@pytest.mark.parametrize("level", [["-v"], ["--log-level", "info"]])
def test_v_logs_one_info_line_per_request_and_no_frames(level: list[str]) -> None:
    sim = start_pty_sim()
    try:
        r = subprocess.run([*CLI, *level, "write", "--port", sim.path, "threshold=40"],
                           capture_output=True, text=True, check=False, timeout=30)
        assert r.returncode == 0, r.stderr
        assert "idemlink.cli INFO WRITE threshold(4) [400]: OK after 1 attempt(s)" in r.stderr
        assert "connected to device" in r.stderr
        assert "idemlink.frames" not in r.stderr  # frames are -vv
        r = subprocess.run([*CLI, *level, "read", "--port", sim.path, "threshold", "mode"],
                           capture_output=True, text=True, check=False, timeout=30)
        assert r.returncode == 0, r.stderr
        assert [x.split(" INFO ", 1)[1] for x in r.stderr.splitlines() if " READ " in x] == [
            "READ threshold(4): OK after 1 attempt(s) -> [400]",
            "READ mode(5): OK after 1 attempt(s) -> [1]"]
    finally:
        sim.close()
