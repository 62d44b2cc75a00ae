"""The tree stays ruff-clean and mypy-clean (strict), with the configuration in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff not installed (it is in the test extra)")
    r = _run("ruff", "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_clean() -> None:
    """``mypy -p idemlink`` in the checkout, as a contributor runs it (CONTRIBUTING.md): the links
    idemlink/protocol, idemlink/host, idemlink/device_sim lay the tree out as installed."""
    pytest.importorskip("mypy")
    r = _run(sys.executable, "-m", "mypy", "-p", "idemlink")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout, r.stdout
