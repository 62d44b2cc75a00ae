"""The ``idemlink`` console script's start-up: a Ctrl-C while Python is still importing the command
modules is one line on stderr and exit 130, never a traceback (``idemlink.console``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# What the generated console script does (``from MODULE import main; sys.exit(main())``), with a
# Ctrl-C landing at the moment the module named in argv[1] is imported.
SCRIPT = """
import sys
from importlib.metadata import entry_points

TARGET = sys.argv[1]


class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == TARGET:
            raise KeyboardInterrupt
        return None

(entry,) = entry_points(group="console_scripts", name="idemlink")
sys.meta_path.insert(0, CtrlC())
sys.argv[1:] = ["read", "--port", "loop://", "mode"]
sys.exit(entry.load()())
"""


@pytest.mark.parametrize("module", ["idemlink.cli", "idemlink.commands.sim_cmd",
                                    "idemlink.host.device"])
def test_ctrl_c_while_importing_is_one_line_and_exit_130(module: str) -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT, module], capture_output=True, text=True,
                       check=False, timeout=60)
    assert r.returncode == 130, r.stderr
    assert r.stderr.splitlines() == ["idemlink: interrupted while starting; nothing was sent"]
    assert r.stdout == ""


def test_python_m_idemlink_uses_the_same_guard() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT.replace(
        'sys.exit(entry.load()())', 'import runpy; runpy.run_module("idemlink", run_name="__main__")'),
        "idemlink.cli"], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 130, r.stderr
    assert r.stderr.splitlines() == ["idemlink: interrupted while starting; nothing was sent"]
