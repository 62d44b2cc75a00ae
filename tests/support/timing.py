"""Real time in tests: deadlines that scale with the machine, and waits on conditions, not sleeps.

- A test that waits *for something* (a child's first line, a file, another thread's progress)
  waits on that thing with ``wait_until`` or ``read_line``: it returns as soon as the thing
  happens, and the deadline is only there so a broken build fails instead of hanging, so it is
  generous (and scaled).
- A real-time protocol figure a test chooses (a retry timeout against a device process, the time
  a device gets to answer) goes through ``scaled``: a figure that is right on an idle machine is
  multiplied by how loaded the machine is now (``load_factor``) and by
  ``IDEMLINK_TEST_TIME_SCALE`` (default 1), for a machine known to be slow (an emulated CI
  runner, valgrind).
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "IDEMLINK_TEST_TIME_SCALE"
MAX_LOAD_FACTOR = 8.0


def env_scale() -> float:
    """``IDEMLINK_TEST_TIME_SCALE`` (a number >= 1; 1 when unset)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a number") from None
    if not value >= 1.0 or value == float("inf"):
        raise ValueError(f"{ENV}={raw!r} must be a finite number >= 1")
    return value


def load_factor() -> float:
    """The runnable tasks per core right now (the 1-minute load average over the core count), at
    least 1 and at most ``MAX_LOAD_FACTOR``: on a machine whose cores are shared with other
    CPU-bound work, a real-time step of a child process takes about this much longer."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 1.0
    return min(MAX_LOAD_FACTOR, max(1.0, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """``seconds`` as this machine needs it now (see the module's docstring)."""
    return seconds * env_scale() * load_factor()


def wait_until(condition: Callable[[], T], timeout: float = 10.0, *, what: str = "the condition",
               poll: float = 0.005) -> T:
    """``condition()`` once it is true (returned), checked every ``poll`` seconds; an
    AssertionError naming ``what`` after ``scaled(timeout)`` seconds."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {scaled(timeout):.1f} s waiting for {what}")
        time.sleep(poll)


def read_line(stream: Any, proc: subprocess.Popen[Any], timeout: float = 20.0) -> str:
    """One line from a child's pipe (stripped), waiting for readiness, not sleeping, up to
    ``scaled(timeout)`` seconds; an AssertionError if the child exits or closes the pipe first.
    Reads the file descriptor byte by byte, so nothing after the line is consumed (the pipe's
    Python buffer must not have been read from before)."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + scaled(timeout)
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line from the child in {scaled(timeout):.1f} s "
                                 f"(got {buf!r}, rc={proc.poll()})")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1)
        if not chunk:
            raise AssertionError(f"the child closed its pipe (got {buf!r}, rc={proc.poll()})")
        buf += chunk
    return buf.decode().strip()
