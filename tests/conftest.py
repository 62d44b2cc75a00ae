"""Suite-wide options: ``--run-slow`` enables the long campaigns marked ``slow``."""

from __future__ import annotations

import pytest


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
