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


def test_loading_the_plugin_imports_nothing_of_idemlink_yet(tmp_path: Path) -> None:
    """A suite that never asks for a fixture pays nothing and cannot be broken by the simulator."""
    code = ("import sys, idemlink.pytest_plugin; "
            "print(sorted(m for m in sys.modules if m.startswith('idemlink.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       timeout=60, check=True)
    assert r.stdout.strip() == "['idemlink.pytest_plugin']"


BROKEN_IMPORT = '''
import sys

sys.modules["idemlink.device_sim.simlink"] = None  # importing it now raises ImportError

def test_uses_the_sim(idemlink_sim):
    pass
'''


def test_an_import_error_names_the_plugin_and_how_to_disable_it(tmp_path: Path) -> None:
    (tmp_path / "test_broken.py").write_text(BROKEN_IMPORT)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "idemlink pytest plugin: cannot import the simulator" in r.stdout
    assert "(disable with -p no:idemlink)" in r.stdout


def test_the_plugin_is_disabled_with_p_no_idemlink(tmp_path: Path) -> None:
    (tmp_path / "test_no_plugin.py").write_text(
        "import pytest\n\n"
        "def test_without(request):\n"
        "    assert request.config.pluginmanager.get_plugin('idemlink') is None\n"
        "    with pytest.raises(pytest.FixtureLookupError):\n"
        "        request.getfixturevalue('idemlink_sim')\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:idemlink", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, check=False)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_marker_path_is_relative_to_the_test_file_and_errors_are_one_line(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "pump.toml").write_text(
        (Path(__file__).resolve().parent.parent / "protocol" / "maps" / "pump-controller.toml")
        .read_text())
    (tests / "test_my_pump.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.idemlink_regmap('pump.toml')\n"
        "def test_beside(idemlink_sim):\n"
        "    assert idemlink_sim.regmap.name == 'pump-controller'\n\n"
        "@pytest.mark.idemlink_regmap('missing.toml')\n"
        "def test_missing(idemlink_sim):\n"
        "    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/test_my_pump.py"], capture_output=True, text=True, cwd=tmp_path,
                       check=False, timeout=120)
    assert "1 passed" in r.stdout and "1 error" in r.stdout, r.stdout
    assert "idemlink pytest plugin: idemlink_regmap('missing.toml')" in r.stdout
    assert "Traceback" not in r.stdout
