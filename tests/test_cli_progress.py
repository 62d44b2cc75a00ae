"""Progress on stderr and Ctrl-C in the long commands (``idemlink.output.Progress``).

Off a terminal, progress is a line every ``IDEMLINK_PROGRESS_SECONDS`` (or each further 10 %) once
that long has passed; a short command prints none. Ctrl-C mid-transfer or mid-soak is one line
saying where it stopped (an ``idemlink.error/1`` object with the counts with ``--json``), exit 130.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.device_sim.link import LinkConfig
from idemlink.output import PROGRESS_SECONDS_ENV, Progress
from idemlink.pytest_plugin import start_pty_sim

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())"]
needs_pty = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pty")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_off_a_terminal_a_line_every_period_or_ten_percent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRESS_SECONDS_ENV, "5")
    out, clock = io.StringIO(), Clock()
    p = Progress("send", "B", stream=out, clock=clock)
    for t, done in [(1.0, 100), (4.9, 300)]:  # a command shorter than the period: nothing
        clock.t = t
        p.update(done, 1000, "a.bin")
    assert out.getvalue() == ""
    clock.t = 5.0
    p.update(310, 1000, "a.bin")
    clock.t = 5.5
    p.update(350, 1000, "a.bin")  # neither 5 s nor 10 % since the last line
    clock.t = 6.0
    p.update(420, 1000, "a.bin")  # 11 % more
    clock.t = 11.0
    p.update(430, 1000, "a.bin")  # 5 s more
    assert out.getvalue().splitlines() == [
        "idemlink send: a.bin 310/1000 B (31%)", "idemlink send: a.bin 420/1000 B (42%)",
        "idemlink send: a.bin 430/1000 B (43%)"]
    p.close()


def test_disabled_progress_prints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRESS_SECONDS_ENV, "0")
    out = io.StringIO()
    p = Progress("soak", "commands", enabled=False, stream=out)
    p.update(5, 10)
    assert out.getvalue() == "" and p.done == 5


@needs_pty
def test_send_reports_progress_off_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    monkeypatch.setenv(PROGRESS_SECONDS_ENV, "0")
    f = tmp_path / "a.bin"
    f.write_bytes(bytes(range(256)) * 16)
    sim = start_pty_sim()
    try:
        assert main(["send", "--port", sim.path, str(f)]) == 0
    finally:
        sim.close()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines and all(line.startswith("idemlink send: a.bin ") for line in lines), err
    assert lines[-1] == "idemlink send: a.bin 4096/4096 B (100%)"
    assert "a.bin: ok, 4096 bytes, verified" in out


def wait_for_stderr_line(proc: subprocess.Popen[bytes], needle: bytes, deadline: float) -> bytes:
    assert proc.stderr is not None
    buf = b""
    while needle not in buf and time.monotonic() < deadline:
        if select.select([proc.stderr], [], [], 0.1)[0]:
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    return buf


def interrupt(argv: list[str], needle: bytes) -> tuple[int, str, str]:
    """Run the CLI, Ctrl-C it once its stderr shows ``needle``; (exit, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), PROGRESS_SECONDS_ENV: "0"}
    proc = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    try:
        head = wait_for_stderr_line(proc, needle, time.monotonic() + 30)
        assert needle in head, head
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out.decode(), (head + err).decode()


@needs_pty
@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_mid_send_is_one_line_and_exit_130(tmp_path: Path, as_json: bool) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(300_000))  # ~26 s at 115200 baud: interrupted long before
    sim = start_pty_sim(link=LinkConfig(baud=115200))
    try:
        rc, out, err = interrupt(["send", "--port", sim.path, str(big),
                                  *(["--json"] if as_json else [])], b"big.bin ")
    finally:
        sim.close()
    assert rc == 130, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith("idemlink send: big.bin ")]
    assert len(lines) == 1 and lines[0].startswith("idemlink send: interrupted in big.bin at "), err
    assert "/300000 bytes; the device was told to cancel" in lines[0]
    if as_json:
        [doc] = [json.loads(line) for line in out.splitlines()]
        assert doc["schema"] == "idemlink.error/1" and doc["exit"] == 130
        assert doc["file"] == "big.bin" and 0 < doc["bytes"] < 300_000
    else:
        assert out == ""


def test_ctrl_c_mid_soak_says_how_far_it_got() -> None:
    rc, out, err = interrupt(["soak", "--commands", "1000000", "--json"], b"idemlink soak: ")
    assert rc == 130 and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("idemlink soak: interrupted after ") and "of 1000000 commands" in last
    [doc] = [json.loads(line) for line in out.splitlines()]
    assert doc["schema"] == "idemlink.error/1" and doc["commands"] == 1000000
    assert 0 < doc["commands_run"] < 1000000
