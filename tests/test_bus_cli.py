"""The bus on the command line (issue 22 items 3 and 4; docs/CLI.md): ``--echo`` and ``--guard``
on the device commands against ``idemlink sim --bus 3 --echo`` (a simulated RS-485 line whose
adapter echoes the master's bytes, served on a pty), and ``idemlink broadcast``: UNKNOWN per
device until read back, OK / NOT_EXECUTED with ``--verify``, the exit status the worst."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from support.timing import read_line, scaled

from idemlink.cli import main


def sim_bus(*extra: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--bus", "3", "--seed",
                             "1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield read_line(proc.stdout, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture(scope="module")
def echoing() -> Iterator[str]:
    yield from sim_bus("--echo")


@pytest.fixture(scope="module")
def plain() -> Iterator[str]:
    yield from sim_bus()


def answers(port: str) -> list[str]:
    return ["--port", port, "--timeout", str(scaled(0.1)), "--attempts", "3"]


def test_device_commands_with_echo_and_guard_on_an_echoing_bus(
        echoing: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = [*answers(echoing), "--echo", "--guard", "0.002"]
    assert main(["write", *line, "--address", "1-3", "mode=2"]) == 0
    assert "3 devices: 3 OK; exit 0" in capsys.readouterr().out
    assert main(["read", *line, "--address", "2", "mode", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["values"]["mode"] == 2
    assert main(["info", *line, "--address", "3"]) == 0
    assert "bus address   3" in capsys.readouterr().out


def test_echo_on_a_line_that_does_not_echo_is_one_clear_line(
        plain: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["read", *answers(plain), "--address", "1", "--echo", "mode"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the line's echo differs from what was sent" in err[0]
    assert "an adapter that does not echo" in err[0] and "nothing was out" in err[0]
    assert main(["read", *answers(plain), "--address", "1", "--guard", "2", "mode"]) == 1
    assert "--guard 2.0: a turnaround guard is 0..1 s" in capsys.readouterr().err


def test_broadcast_is_unknown_until_verified(echoing: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    line = [*answers(echoing), "--echo"]
    # address 4 is nobody: it did not answer its HELLO, so it stays UNKNOWN (it may have heard)
    assert main(["broadcast", *line, "--address", "1-4", "threshold=31.5"]) == 5
    out = capsys.readouterr().out
    assert out.count("UNKNOWN (BROADCAST_SENT") == 4 and "4 devices: 4 UNKNOWN; exit 5" in out
    assert main(["broadcast", *line, "--address", "1-3", "threshold=32.5", "--verify",
                 "--repeat", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "idemlink.devices/1" and doc["exit"] == 0
    results = [d["result"] for d in doc["devices"]]
    assert [(r["address"], r["outcome"]) for r in results] == [(1, "OK"), (2, "OK"), (3, "OK")]
    assert len({r["broadcast_seq"] for r in results}) == 1
    assert main(["read", *line, "--address", "1-3", "threshold"]) == 0
    assert capsys.readouterr().out.count("threshold = 32.5") == 3


@pytest.mark.parametrize(("args", "code", "says"), [
    (["self_clean=1"], 1, "is a trigger"),
    (["threshold=32", "fan_setpoint=1"], 1, "one set-only write of HOLDING registers"),
    (["threshold=333"], 4, "outside"),
    (["threshold=32", "--repeat", "0"], 1, "--repeat 0"),
])
def test_broadcast_refuses_what_it_cannot_send_before_sending(
        args: list[str], code: int, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broadcast", "--port", "loop://", "--address", "1", *args]) == code
    got = capsys.readouterr()
    assert says in got.err + got.out


def test_a_broadcast_too_large_for_a_device_is_one_line_and_nothing_sent(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Devices whose HELLO_REPLY says ``max_payload`` 8: a 12-byte broadcast is refused before
    sending, one line, exit 1 (it was a traceback once the bus refused it); a 5-byte one goes."""
    small = ("import sys; from idemlink.protocol import device_session; "
             "device_session.MAX_PAYLOAD = 8; from idemlink.cli import main; "
             "sys.exit(main(['sim', '--bus', '2', '--seed', '1']))")
    proc = subprocess.Popen([sys.executable, "-c", small], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        port = read_line(proc.stdout, proc)
        line = [*answers(port), "--address", "1,2"]
        assert main(["broadcast", *line, "threshold=37", "mode=1", "fan_setpoint=41"]) == 1
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, err
        assert "device 1: a 12-byte request; the device takes at most 8" in err
        assert "nothing was sent" in err
        assert main(["read", *line, "threshold"]) == 0  # unchanged: 35.0 at start
        assert capsys.readouterr().out.count("threshold = 35.0") == 2
        assert main(["broadcast", *line, "mode=2", "--verify"]) == 0
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
