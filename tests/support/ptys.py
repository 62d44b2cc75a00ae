"""A pair of linked pseudo-terminals (socat), ready when it is returned."""

from __future__ import annotations

import os
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


def holds_open(pid: int, path: str) -> bool:
    """Whether process ``pid`` has the terminal ``path`` (a link is followed) open, read from
    ``/proc/PID/fd``: the readiness of a child that opens a port and then waits on it. False
    where ``/proc`` does not say (not Linux): the caller's waits then fall back to the
    protocol's own retries."""
    target = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False
