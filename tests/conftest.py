"""Suite-wide options: ``--run-slow`` enables the long campaigns marked ``slow``.

Tests that press Ctrl-C on a CLI child (SIGINT) need the child to take it as a user's terminal
would: a suite started as a background job of a script inherits SIGINT *ignored* (POSIX), and so
would every child, so the suite restores the default handling before any test runs.
"""

from __future__ import annotations

import signal

import pytest

#: the session-scoped fixtures over the C builds (device_bin, qemu_elf, lib_path, pump_build)
pytest_plugins = ["support.fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # children: SIG_DFL again


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="run long campaigns (marked slow), e.g. the million-command soak")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long campaign: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
