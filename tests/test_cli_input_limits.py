"""Input a user can get wrong is refused in one line before anything is sent: a baud rate out of
range, a FIFO or a too-deeply nested plan, a non-finite start timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "idemlink"]


def run(*argv: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, check=False,
                          timeout=timeout)


def test_baud_rate_out_of_range_is_a_usage_error_not_a_traceback() -> None:
    for value in ("0", "99999999999999", "-5"):
        r = run("read", "--port", "loop://", "--baudrate", value)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "--baudrate" in r.stderr


def test_a_fifo_or_deeply_nested_plan_is_refused_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    r = run("apply", "--port", "loop://", str(fifo), timeout=10)
    assert r.returncode == 1 and "not a regular file" in r.stderr and r.stderr.count("\n") == 1
    deep = tmp_path / "deep.json"
    deep.write_text('{"steps": ' + "[" * 100_000)
    r = run("apply", "--port", "loop://", str(deep))
    assert r.returncode == 1 and "nested too deeply" in r.stderr and "Traceback" not in r.stderr


def test_send_start_timeout_must_be_finite_and_positive(tmp_path: Path) -> None:
    f = tmp_path / "fw.bin"
    f.write_bytes(b"x")
    for value in ("-1", "nan", "inf"):
        r = run("send", "--port", "loop://", "--start-timeout", value, str(f))
        assert r.returncode == 1 and "--start-timeout" in r.stderr, r.stderr


def test_transfer_report_lines_never_carry_control_characters() -> None:
    from idemlink.commands.ymodem_cmd import _report_lines
    from idemlink.protocol.ymodem_files import FileResult, TransferReport

    name = "esc\x1b[31mred.bin"
    report = TransferReport(files=[FileResult(name, 0, False, 0.0, detail=f"{name} refused")])
    lines = _report_lines(report, "received")
    assert all(line.isprintable() for line in lines)
    assert lines[0].startswith("esc\\x1b[31mred.bin: FAILED")
