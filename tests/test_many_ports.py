"""Device commands and ``apply`` on several ports at once: one block per device, a summary, the
worst exit status; ``--json`` a per-device list; ``apply`` shares its journal across the devices."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.timing import scaled, wait_until

from idemlink.cli import main
from idemlink.device_sim.device import SimulatedDevice
from idemlink.protocol.device_core import EffectKind
from idemlink.protocol.frame import Frame, FrameType, decode_frames
from idemlink.pytest_plugin import PtySim, start_pty_sim


class MuteOnWrites(SimulatedDevice):
    """Runs everything, but the answers to anything other than a read are lost."""

    def receive_data(self, data: bytes, now: float) -> None:
        super().receive_data(data, now)
        frames = decode_frames(data)  # the serve loop hands over whole frames
        if any(isinstance(f, Frame) and f.type is FrameType.REQUEST
               and f.payload[:1] not in (b"\x03", b"\x04") for f in frames):
            self.data_to_send()  # lost; retries too: their replayed answers are lost as well


@pytest.fixture
def rack() -> Iterator[list[PtySim]]:
    sims = [start_pty_sim(SimulatedDevice(seed=i)) for i in range(3)]
    yield sims
    for s in sims:
        s.close()


def ports(sims: list[PtySim]) -> list[str]:
    return [a for s in sims for a in ("--port", s.path)]


def test_write_then_read_on_three_devices(rack: list[PtySim],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["write", *ports(rack), "threshold=41.5"]) == 0
    assert all(s.device.core.value("threshold") == 415 for s in rack)
    capsys.readouterr()
    assert main(["read", *ports(rack), "threshold"]) == 0
    out = capsys.readouterr().out.splitlines()
    for s in rack:
        i = out.index(f"== {s.path}: OK (exit 0)")
        assert out[i + 1] == "threshold = 41.5 °C (raw 415)"
    assert out[-1] == "3 devices: 3 OK; exit 0"


def test_json_is_a_list_and_the_exit_status_is_the_worst(
        rack: list[PtySim], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mute = start_pty_sim(MuteOnWrites(seed=9))
    missing = str(tmp_path / "no-such-port")
    try:
        argv = ["write", *ports(rack[:1]), "--port", missing, "--port", mute.path,
                "mode=1", "--timeout", "0.05", "--attempts", "2", "--json"]
        assert main(argv) == 5  # UNKNOWN on the mute line outranks the missing port's error
    finally:
        mute.close()
    doc = json.loads(capsys.readouterr().out)  # one object per line, like every command's --json
    assert doc["schema"] == "idemlink.devices/1" and doc["exit"] == 5
    docs = doc["devices"]
    assert [(d["port"], d["outcome"], d["exit"]) for d in docs] == [
        (rack[0].path, "OK", 0), (missing, "ERROR", 1), (mute.path, "UNKNOWN", 5)]
    assert docs[0]["result"]["outcome"] == "OK" and docs[0]["error"] is None
    assert docs[1]["result"] is None and missing in docs[1]["error"]
    assert docs[2]["result"]["outcome"] == "UNKNOWN"


def test_a_ports_file_and_a_port_named_twice(rack: list[PtySim], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "bench.ports"
    listing.write_text("# the rack\n" + "\n".join(s.path for s in rack) + "\n\n")
    assert main(["read", "--ports-file", str(listing), "mode"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "3 devices: 3 OK; exit 0"
    assert main(["read", "--ports-file", str(listing), "--port", rack[0].path]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"idemlink read: port {rack[0].path} is named twice"


def test_apply_on_several_devices_shares_one_journal(rack: list[PtySim], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [{"write": {"threshold": "40.0"}},
                                          {"trigger": "self_clean"}]}))
    assert main(["apply", *ports(rack), str(plan)]) == 0
    assert main(["apply", *ports(rack), str(plan)]) == 0  # receipts: the trigger does not rerun
    for s in rack:
        assert s.device.core.value("threshold") == 400
        assert s.device.core.count(EffectKind.TRIGGER_STARTED, "self_clean") == 1
    assert capsys.readouterr().out.splitlines()[-1] == "3 devices: 3 OK; exit 0"


def test_monitor_watches_one_port(rack: list[PtySim], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", *ports(rack[:2]), "--count", "1"]) == 1
    assert "monitor watches one port" in capsys.readouterr().err


def test_the_devices_run_concurrently(capsys: pytest.CaptureFixture[str]) -> None:
    """Three devices behind 200 ms lines: together they take less than any serial run could."""
    import time

    from idemlink.device_sim.link import LinkConfig

    latency = scaled(0.2)  # long next to what a busy machine adds to a run
    timeout = f"{5 * latency:.3f}"
    sims = [start_pty_sim(SimulatedDevice(seed=i), LinkConfig(latency=latency)) for i in range(3)]
    try:
        t0 = time.monotonic()
        assert main(["read", *ports(sims[:1]), "mode", "--timeout", timeout]) == 0
        one = time.monotonic() - t0
        t0 = time.monotonic()
        assert main(["read", *ports(sims), "mode", "--timeout", timeout]) == 0
        three = time.monotonic() - t0
    finally:
        for s in sims:
            s.close()
    # Each device takes at least 4 latencies (HELLO, its reply, the read, its answer): one after
    # the other, three could never finish in under 12. (Against that bound, not against
    # ``one``: a busy machine slows every run, and ``one`` is a single sample of it.)
    serial_floor = 3 * 4 * latency
    assert one >= 4 * latency and three < serial_floor, (one, three, latency)


def test_ctrl_c_stops_every_device_and_says_what_may_have_run(rack: list[PtySim]) -> None:
    """SIGINT while a write is out on a line that loses write answers, once the other device has
    finished: each device settles what it had out (the mute one's write is UNKNOWN/CANCELLED and
    says so), the blocks are printed, exit 130."""
    import os
    import signal
    import subprocess
    import sys

    from idemlink.output import PROGRESS_SECONDS_ENV

    mute = start_pty_sim(MuteOnWrites(seed=9))
    try:
        argv = [sys.executable, "-m", "idemlink", "write", "--port", rack[0].path, "--port",
                mute.path, "mode=1", "--timeout", "1", "--attempts", "20"]
        env = {**os.environ, PROGRESS_SECONDS_ENV: "0"}  # a progress line at every change
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        assert proc.stderr is not None
        progress = ""
        while "write: 1/2 devices" not in progress:  # the good device has finished
            line = proc.stderr.readline()
            assert line, (progress, proc.communicate())
            progress += line
        def write_arrived() -> bool:
            assert proc.poll() is None, proc.communicate()
            return any(e.request[:1] == b"\x06" for e in mute.device.executions)

        wait_until(write_arrived, timeout=20, what="the write to reach the mute device")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        err = progress + err
    finally:
        mute.close()
    assert proc.returncode == 130, (out, err)
    assert f"== {rack[0].path}: OK (exit 0)" in out
    assert f"== {mute.path}: INTERRUPTED (exit 130)" in out
    assert f"{mute.path}: idemlink write: interrupted; 1 request(s) may have run" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_before_anything_was_sent_says_so_in_one_line(as_json: bool) -> None:
    """SIGINT while every device is still being opened (no answer to HELLO yet): one stderr line
    saying nothing that may have had an effect was out (it used to print nothing on stderr)."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    from idemlink.device_sim.pty import open_pty

    pairs = [open_pty(), open_pty()]  # nobody answers on these
    try:
        argv = [sys.executable, "-m", "idemlink", "write", *(
            a for p in pairs for a in ("--port", p.slave_path)), "mode=1", "--timeout", "2",
            *(["--json"] if as_json else [])]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        heard: set[int] = set()
        deadline = time.monotonic() + 20
        while len(heard) < len(pairs):  # each device's HELLO went out: both are opening
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            ready, _, _ = select.select([p.master_fd for p in pairs], [], [], 0.1)
            for fd in ready:
                os.read(fd, 4096)
                heard.add(fd)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        for p in pairs:
            p.close()
    assert proc.returncode == 130, (out, err)
    assert err.splitlines() == ["idemlink write: interrupted: 0 of 2 devices finished; nothing "
                                "that may have had an effect was out on the 2 other(s)"], err
    if as_json:
        devices, error = (json.loads(line) for line in out.splitlines())
        assert devices["schema"] == "idemlink.devices/1" and devices["exit"] == 130
        assert error == {"schema": "idemlink.error/1", "command": "write", "exit": 130,
                         "message": err.splitlines()[0].removeprefix("idemlink write: "),
                         "devices_run": 2, "devices_finished": 0, "devices_may_have_run": 0}


IMPORT_PROBE = """
import sys, threading
late = []
sys.addaudithook(lambda ev, a: late.append(a[0]) if ev == 'import'
                 and threading.current_thread() is not threading.main_thread() else None)
import argparse
from idemlink.commands.many import run_on_ports
from idemlink.protocol.contract import contract_hash

def handler(ns):
    contract_hash()  # what each Device's construction does first in its thread
    return 0

run_on_ports(argparse.Namespace(command='read', json=False), handler, ['a', 'b'])
print('LATE', sorted(set(late)), file=sys.__stderr__)
"""


def test_device_threads_import_nothing_a_ctrl_c_could_interrupt() -> None:
    """Ctrl-C reaches each device thread as an asynchronous KeyboardInterrupt; one landing
    inside a thread's first import of a module left that module's import lock held, and
    ``read --address 1-8`` interrupted in its first second hung for ever (every other thread
    waiting on the lock). The modules a device's construction imports are imported before the
    threads start: none is imported first inside a device thread (a fresh interpreter, where
    nothing is imported yet)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "LATE []" in done.stderr, done.stderr
