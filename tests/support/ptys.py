"""A pair of linked pseudo-terminals (socat), ready when it is returned."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.timing import read_line, scaled


@contextmanager
def socat_pair(directory: Path, name: str = "tty") -> Iterator[tuple[str, str]]:
    """Two ptys joined by socat, as symbolic links ``directory/NAMEA`` and ``directory/NAMEB``;
    yielded once socat says it moves bytes (its own readiness line, not a sleep). Skips the test
    when socat is missing."""
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed")
    a, b = str(directory / f"{name}A"), str(directory / f"{name}B")
    proc = subprocess.Popen(
        ["socat", "-d", "-d", f"pty,raw,echo=0,link={a}", f"pty,raw,echo=0,link={b}"],
        stderr=subprocess.PIPE)
    try:
        while "starting data transfer loop" not in read_line(proc.stderr, proc):
            pass
        yield a, b
    finally:
        proc.terminate()
        try:
            proc.wait(scaled(5))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
