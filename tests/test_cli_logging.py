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
