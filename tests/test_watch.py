"""``idemlink watch`` against a simulator whose values change: changes printed, honest per-poll
outcomes when answers are lost, a summary at the end."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemlink.device_sim.link import LinkConfig
from idemlink.pytest_plugin import start_pty_sim

CLI = [sys.executable, "-m", "idemlink", "watch"]


def test_watch_prints_first_values_then_only_changes() -> None:
    sim = start_pty_sim()
    stop = threading.Event()

    def warm_up() -> None:
        """The physical world: temperature rises 0.5 °C after each poll that read it. (Paced by
        the polls, not the wall clock: a slow watch on a busy machine must not see it climb
        past the threshold, where the over-temperature fault would change too.)"""
        t, seen = 250, 0
        while not stop.wait(0.01):
            with sim._shared.lock:
                reads = sum(e.request[:1] == b"\x04" for e in sim.device.executions[seen:])
                seen = len(sim.device.executions)
                if reads:
                    t += 5 * reads
                    sim.device.core.set_input("temperature", t, time.monotonic())

    th = threading.Thread(target=warm_up, daemon=True)
    th.start()
    try:
        r = subprocess.run([*CLI, "--port", sim.path, "--interval", "0.1", "--count", "12",
                            "--json"], capture_output=True, text=True, check=False, timeout=60)
    finally:
        stop.set()
        th.join()
        sim.close()
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    first = [x for x in rows if x["poll"] == 1]
    assert {x["name"] for x in first} == {s.name for s in sim.device.core.regmap}
    later = [x for x in rows if x["poll"] > 1]
    assert later and {x["name"] for x in later} == {"temperature"}
    temps = [x["raw"] for x in rows if x["name"] == "temperature"]
    assert temps == sorted(temps) and len(set(temps)) == len(temps) >= 4
    assert all(x["schema"] == "idemlink.watch/1" and x["outcome"] == "OK" for x in rows)
    assert rows[0]["name"] == "temperature" and rows[0]["unit"] == "°C"
    assert rows[0]["value"] == rows[0]["raw"] / 10
    assert "12 poll(s)" in r.stderr and f"{len(temps) - 1} change(s)" in r.stderr


def test_watch_reports_polls_that_got_no_answer_and_goes_on() -> None:
    # Every answer lost for a while: those polls say UNKNOWN (NO_ANSWER); the rest read values.
    sim = start_pty_sim(link=LinkConfig(frame_loss=0.5, seed=3))
    try:
        r = subprocess.run([*CLI, "--port", sim.path, "--interval", "0.05", "--count", "15",
                            "--timeout", "0.05", "--attempts", "1", "mode"],
                           capture_output=True, text=True, check=False, timeout=60)
    finally:
        sim.close()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.endswith("mode : UNKNOWN (NO_ANSWER)") for line in lines), lines
    assert any(line.endswith("mode = auto (1)") for line in lines), lines
    assert "Traceback" not in r.stderr
    counts = r.stderr.splitlines()[-1].split("readings: ")[1].split(";")[0]
    unknown = int(counts.split(", ")[-1].split()[0])
    assert counts.endswith(" UNKNOWN") and unknown >= 1, r.stderr
    assert unknown == sum(" mode : UNKNOWN (" in line for line in lines)  # each one printed


def test_watch_opens_a_new_session_when_its_numbers_fall_behind_the_window() -> None:
    """Another host drove the device's window far ahead (a second port on an RS-485 bus): our
    reads come back TOO_OLD; watch says so for that poll, then says HELLO again and goes on."""
    sim = start_pty_sim()
    proc = subprocess.Popen([*CLI, "--port", sim.path, "--interval", "0.1", "--count", "20",
                             "--every", "mode"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # watch has its session: now another host moves ahead
        with sim._shared.lock:  # the other host's numbers, far ahead of ours
            window = sim.device.session.window
            window.commit(((window.highest or 0) + (1 << 20)) & 0xFFFFFFFF)
        out, err = proc.communicate(timeout=60)
        out = first + out
    finally:
        if proc.poll() is None:
            proc.kill()
        sim.close()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    too_old = [i for i, line in enumerate(lines) if "TOO_OLD" in line]
    assert too_old, lines
    assert any(line.endswith("mode = auto (1)") for line in lines[too_old[-1] + 1:]), lines
    assert "1 reconnection(s)" in err or "2 reconnection(s)" in err, err


def test_a_port_that_fails_is_said_once_without_may_have_run(tmp_path: Path) -> None:
    """The port dies mid-watch: one line with the root cause (only reads were out: nothing may
    have run), not one per interval nor the cause repeated by every layer."""
    sim = start_pty_sim()
    # watch reopens its port at every poll. Through /dev/pts/N itself it could reach another
    # process's pty given the same number meanwhile (another device, another map: exit 1); this
    # name for our pty goes away with it.
    port = tmp_path / "ttyWATCHED"
    port.symlink_to(sim.path)
    proc = subprocess.Popen([*CLI, "--port", str(port), "--interval", "0.1", "--count", "25",
                             "mode"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first poll read a value: the port is open
        assert first.endswith("mode = auto (1)\n"), first
        port.unlink()
        sim.close()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = err.splitlines()
    # One line per streak of failed polls; each reconnection would start a streak.
    reconnects = int(lines[-1].split(", ")[-1].split()[0])
    trouble = [line for line in lines if "trying again" in line]
    assert 1 <= len(trouble) <= 1 + reconnects, lines
    assert "may have run" not in err
    assert not any("UNKNOWN" in line for line in lines[:-1])  # the summary counts the four words
    assert "no values; trying again at every poll" in trouble[0]
    words = trouble[0].split()
    assert all(words[i:i + 2] != words[i + 2:i + 4] for i in range(len(words) - 3)), trouble


def test_a_port_failing_without_an_errno_is_said_by_its_root_cause_not_may_have_run() -> None:
    """pyserial reports a pty whose other end went away as "device reports readiness to read but
    returned no data", without an errno (now and then, instead of EIO): the watch line says
    that, not the lost link's "1 request(s) may have run" (only reads were out)."""
    from serial import SerialException

    from idemlink.commands.watch_cmd import poll_failure
    from idemlink.host.errors import LinkLost, PortError

    root = SerialException("device reports readiness to read but returned no data")
    port = PortError(f"/dev/pts/0: read failed: {root}")
    port.__cause__ = root
    lost = LinkLost(f"the port failed: {port}; 1 request(s) may have run (UNKNOWN)")
    lost.__cause__ = port
    assert poll_failure(lost) == "device reports readiness to read but returned no data"
    io_error = OSError(5, "Input/output error")
    port.__cause__ = io_error
    assert poll_failure(lost) == os.strerror(5)


def test_a_port_that_cannot_be_configured_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/null opens but is no serial port: pyserial's reason carries no errno; the line says
    `cannot open PATH` once, then pyserial's own words."""
    from idemlink.cli import main

    assert main(["watch", "--port", "/dev/null", "--count", "1", "mode"]) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("idemlink watch: cannot open /dev/null: "), first
    assert first.count("cannot open") == 1 and "Could not configure port" in first, first


def test_json_watch_that_never_reached_a_device_ends_with_an_error_object(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1 with ``--json``: the stream's last object is ``idemlink.error/1``, as for every
    command's error."""
    from idemlink.cli import main

    assert main(["watch", "--port", "/dev/null", "--count", "1", "--json", "mode"]) == 1
    out = capsys.readouterr().out.splitlines()
    doc = json.loads(out[-1])
    assert doc["schema"] == "idemlink.error/1" and doc["exit"] == 1 and doc["command"] == "watch"


# --------------------------------------------- outcomes in the four words every command uses

EXTRA = """
[[registers]]
address = 200
name = "spare"
kind = "holding"
description = "a register this map has and the slave does not"
"""


@pytest.fixture
def rtu_slave(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Modbus RTU slave serving the built-in map on a pty, and a map file with one register
    more (at 200): reading it is refused by the slave (exception 02, REJECTED)."""
    from importlib import resources

    from idemlink.device_sim.pty import open_pty
    from idemlink.device_sim.rtu_server import RtuServer
    from idemlink.protocol.device_core import DeviceCore
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    text = resources.files("idemlink.protocol").joinpath("maps", "thermal-controller.toml")
    regmap = tmp_path / "plus.toml"
    regmap.write_text(text.read_text("utf-8") + EXTRA, encoding="utf-8")
    pair = open_pty()
    server = RtuServer(DeviceCore(DEFAULT_MAP), unit=1)
    stop = threading.Event()
    th = threading.Thread(target=server.serve, args=(pair.transport(), stop), daemon=True)
    th.start()
    try:
        yield pair.slave_path, regmap
    finally:
        stop.set()
        th.join(5)
        pair.close()


def _watch(capsys: pytest.CaptureFixture[str], port: str, regmap: Path,
           *fmt: str) -> tuple[int, str, str]:
    from idemlink.cli import main

    rc = main(["watch", "--port", port, "--modbus-rtu", "--regmap", str(regmap), "--count", "2",
               "--interval", "0.05", "--every", "mode", "spare", *fmt])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_rejected_read_is_rejected_not_unanswered(rtu_slave: tuple[str, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The slave refuses one read (exception 02): that reading is REJECTED — it got an answer —
    and the summary counts it so, in the four words, not as a read without an answer."""
    rc, out, err = _watch(capsys, *rtu_slave)
    assert rc == 0, err
    lines = out.splitlines()
    assert sum(line.endswith("spare : REJECTED (Modbus exception ILLEGAL_DATA_ADDRESS)")
               for line in lines) == 2, lines
    assert sum(line.endswith("mode = auto (1)") for line in lines) == 2, lines
    summary = err.splitlines()[-1]
    assert "readings: 2 OK, 0 NOT_EXECUTED, 2 REJECTED, 0 UNKNOWN;" in summary, summary
    assert "no answer;" not in summary and "got no answer" not in summary


def test_json_and_csv_outcome_is_one_of_the_four_words(rtu_slave: tuple[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``outcome`` is the word ``read --json`` uses; why is in ``detail`` (JSON and CSV)."""
    rc, out, err = _watch(capsys, *rtu_slave, "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert {(r["name"], r["outcome"], r["detail"]) for r in rows} == {
        ("mode", "OK", "OK"),
        ("spare", "REJECTED", "REJECTED (Modbus exception ILLEGAL_DATA_ADDRESS)")}
    assert all(r["raw"] is None and r["value"] is None for r in rows if r["name"] == "spare")

    rc, out, err = _watch(capsys, *rtu_slave, "--csv")
    assert rc == 0, err
    table = list(csv.DictReader(io.StringIO(out)))
    assert list(table[0]) == ["time", "poll", "name", "address", "raw", "value", "label", "unit",
                              "outcome", "detail"]
    assert {(r["name"], r["outcome"]) for r in table} == {("mode", "OK"), ("spare", "REJECTED")}
    assert {r["raw"] for r in table if r["name"] == "spare"} == {""}


def test_read_and_watch_say_the_same_word(rtu_slave: tuple[str, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.cli import main

    port, regmap = rtu_slave
    assert main(["read", "--port", port, "--modbus-rtu", "--regmap", str(regmap), "spare",
                 "--json"]) == 4
    read = json.loads(capsys.readouterr().out)
    _, out, _ = _watch(capsys, port, regmap, "--json")
    watched = [json.loads(line) for line in out.splitlines()]
    assert read["registers"][0]["outcome"] == read["outcome"] == "REJECTED"
    assert {r["outcome"] for r in watched if r["name"] == "spare"} == {read["outcome"]}
