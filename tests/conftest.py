"""Suite-wide options: ``--run-slow`` enables the long campaigns marked ``slow``.

The default run (``python3 -m pytest -q``) is the suite a maintainer runs after every edit: every
rule, with short versions of the long campaigns. ``python3 -m pytest -q --run-slow -m slow`` runs
only the long campaigns (what ``.ci/run`` adds after the default run, so nothing runs twice);
``--run-slow`` alone runs everything. ``-m slow`` without ``--run-slow`` would skip every test it
selects and pass having run nothing, so it is refused as a usage error.

Tests that press Ctrl-C on a CLI child (SIGINT) need the child to take it as a user's terminal
would: a suite started as a background job of a script inherits SIGINT *ignored* (POSIX), and so
would every child, so the suite restores the default handling before any test runs.

The suite starts a few hundred Python children (``python -m idemlink ...``). Where
``PYTHONDONTWRITEBYTECODE`` is set, each of them would compile every module it imports again
(about a third of a CLI child's CPU time); the children get a byte-code cache of their own
instead, in a temporary directory (``PYTHONPYCACHEPREFIX``), so nothing is written next to the
sources and the directory goes away with the session.

Property tests (Hypothesis) run without a per-example deadline and without the "too slow" health
check: both measure wall-clock time, which a busy machine (two cores, another suite running)
stretches past Hypothesis's defaults, and a test must not fail for the machine's load. What a
property test checks is the property; speed is measured in bench/.

``-n auto`` (pyproject's addopts) starts one worker more than the machine has cores, at most four
(``--maxprocesses``): about half of the suite's wall time is waiting (a child process, a pty, an
answer's timeout), not computing — on two cores a default run used 290 s of CPU in 266 s — so a
third worker fills the gaps. Every real-time test waits on readiness with deadlines scaled to the
machine's load (``support.timing``), so the extra worker is no harder on it than a busy laptop.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("idemlink", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("idemlink")

_PYCACHE_ENV = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
_saved_env: dict[str, str | None] = {}

#: the session-scoped fixtures over the C builds (device_bin, qemu_elf, lib_path, pump_build)
pytest_plugins = ["support.fixtures"]


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores (the suite waits about half the time)."""
    return (os.cpu_count() or 1) + 1


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # children: SIG_DFL again
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        _saved_env.update({k: os.environ.get(k) for k in _PYCACHE_ENV})
        os.environ.pop("PYTHONDONTWRITEBYTECODE")
        os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="idemlink-tests-pycache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _saved_env:
        shutil.rmtree(os.environ["PYTHONPYCACHEPREFIX"], ignore_errors=True)
        for key, value in _saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _saved_env.clear()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="run long campaigns (marked slow), e.g. the million-command soak")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow and len(slow) == len(items) and config.getoption("markexpr"):
        raise pytest.UsageError(
            f"-m {config.getoption('markexpr')!r} selects only long campaigns (marked slow), which "
            "are skipped without --run-slow: add --run-slow to run them")
    skip = pytest.mark.skip(reason="long campaign: run with --run-slow")
    for item in slow:
        item.add_marker(skip)
