"""The ``idemlink`` console script's start-up: a Ctrl-C while Python is still importing the command
modules is one line on stderr and exit 130, never a traceback (``idemlink.console``)."""

from __future__ import annotations

import json
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
sys.argv[1:] = ["read", "--port", "loop://", "mode", *sys.argv[2:]]
sys.exit(entry.load()())
"""


@pytest.mark.parametrize("module", ["idemlink.cli", "idemlink.commands.read_cmd",
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


@pytest.mark.parametrize("module", ["idemlink.cli", "idemlink.commands.read_cmd",
                                    "idemlink.host.device"])
def test_ctrl_c_while_importing_with_json_also_prints_the_error_object(module: str) -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT, module, "--json"], capture_output=True,
                       text=True, check=False, timeout=60)
    assert r.returncode == 130, r.stderr
    assert r.stderr.splitlines() == ["idemlink: interrupted while starting; nothing was sent"]
    doc = json.loads(r.stdout)
    assert doc["schema"] == "idemlink.error/1" and doc["exit"] == 130
    assert doc["message"] == "interrupted while starting; nothing was sent"


# The command finishes, then a Ctrl-C lands while the process is on its way out (Python would
# die of it silently during shutdown, exit 130 although everything was done).
LATE_CTRL_C = """
import os, signal, sys, time
from importlib.metadata import entry_points

(entry,) = entry_points(group="console_scripts", name="idemlink")
sys.argv[1:] = ["regmap"]
status = entry.load()()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.2)
sys.exit(status)
"""


def test_ctrl_c_after_the_command_finished_keeps_its_exit_status() -> None:
    r = subprocess.run([sys.executable, "-c", LATE_CTRL_C], capture_output=True, text=True,
                       check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "thermal-controller" in r.stdout


def test_command_names_are_what_each_module_registers() -> None:
    """``COMMAND_NAMES`` (which module ``main`` imports for a command named on the command line)
    says what the modules register; a parser built for one command parses it as the full one."""
    import argparse
    import importlib

    from idemlink.cli import build_parser, command_named
    from idemlink.commands import COMMAND_MODULES, COMMAND_NAMES

    registered: dict[str, str] = {}
    for module in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        registered.update(dict.fromkeys(sub.choices, module))
    assert registered == COMMAND_NAMES
    argv = ["-v", "--log-level", "debug", "read", "--port", "loop://", "mode"]
    assert command_named(argv) == "read"
    assert vars(build_parser(argv).parse_args(argv)).keys() == vars(build_parser().parse_args(argv)).keys()
    for words in (["--help", "read"], ["--log-level", "read"], ["nosuch"], ["--version"], []):
        assert command_named(words) is None


def test_a_command_alone_still_opens_faulty_urls() -> None:
    """``faulty://`` is registered by ``idemlink.device_sim``, which a command importing only its
    own module (``read``) would not load: the CLI registers it for every command."""
    r = subprocess.run([sys.executable, "-m", "idemlink", "read", "--port",
                        "faulty://loop://?loss=0", "mode", "--timeout", "0.01", "--attempts", "1"],
                       capture_output=True, text=True, check=False, timeout=60)
    assert "no idemlink device answered" in r.stderr, r.stderr
