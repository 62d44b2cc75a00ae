"""The pytest plugin works in a foreign test suite (run through pytester-like subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FOREIGN = '''
from idemlink.device_sim.link import LinkConfig

def test_in_process(idemlink_sim):
    dev = idemlink_sim.connect()
    assert dev.write({"threshold": 420}).ok
    assert idemlink_sim.device.core.value("threshold") == 420
    idemlink_sim.reboot()
    assert dev.read("threshold").values == (420,)  # configuration survives a reboot

def test_in_process_lossy(idemlink_sim):
    idemlink_sim.set_link(LinkConfig(frame_loss=0.3, seed=3))
    dev = idemlink_sim.connect(attempts=10)
    assert dev.trigger().ok
    assert len(idemlink_sim.device.executions) == 1

def test_pty(idemlink_sim_pty):
    dev = idemlink_sim_pty.open()
    assert dev.write({"mode": 2}).ok
    assert idemlink_sim_pty.device.core.value("mode") == 2

def test_pty_lossy(idemlink_pty_factory):
    sim = idemlink_pty_factory(link=LinkConfig(baud=115200, frame_loss=0.2, seed=1))
    dev = sim.open(timeout=0.05, attempts=10)
    assert dev.write({"fan_setpoint": 33}).ok
'''


def test_plugin_fixtures_in_a_foreign_suite(tmp_path: Path) -> None:
    (tmp_path / "test_foreign.py").write_text(FOREIGN)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 passed" in r.stdout
