"""The README's main job: ``idemlink demo`` finishes, prints the summary, duplicates nothing."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_runs_and_reports_zero_duplicated_effects() -> None:
    r = subprocess.run([sys.executable, "-m", "idemlink", "demo", "--burst", "60"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"duplicated effects\s+0\b", out)
    assert re.search(r"outcome NOT_EXECUTED\s+1\b", out)  # the stale conditional write
    assert re.search(r"outcome REJECTED\s+1\b", out)  # the out-of-range write
    assert re.search(r"faults injected by the line\s+[1-9]", out)
    assert "code=0x0101" in out  # the second trigger did not start the action again
    assert "complete, identical on the device" in out  # the YMODEM hand-over
