"""`idemlink send` to the device: the framed FILE_RECEIVE hand-over, a YMODEM batch, back to frames."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.host import command
from idemlink.host.device import Device
from idemlink.protocol.outcome import Outcome
from idemlink.pytest_plugin import start_pty_sim


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def make_files(tmp: Path) -> list[Path]:
    a = tmp / "image.bin"
    a.write_bytes(bytes(range(256)) * 41 + b"tail")  # not a multiple of 128 or 1024
    b = tmp / "conf with spaces.txt"
    b.write_text("threshold=420\n")
    c = tmp / "empty"
    c.write_bytes(b"")
    return [a, b, c]


def test_send_to_the_device_then_frames_again(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    sim = start_pty_sim(SimulatedDevice(seed=1, flash_dir=tmp_path / "flash"))
    try:
        with Device.open(sim.path) as dev:
            res, report = dev.send_files([str(f) for f in files])
            assert res.outcome is Outcome.OK
            assert report is not None and report.ok
            assert [(f.ok, f.verified) for f in report.files] == [(True, True)] * 3
            assert dev.write({"threshold": 420}).ok  # back in framed mode
        received = tmp_path / "flash" / "files"
        for f in files:
            assert sha(received / f.name) == sha(f)
        handovers = [e for e in sim.device.executions if e.request == b"\x44"]
        assert len(handovers) == 1
    finally:
        sim.close()


@pytest.mark.parametrize("image_size", [2100, pytest.param(None, marks=pytest.mark.slow)],
                         ids=["2-kib-image", "whole-batch"])
def test_send_through_a_lossy_line(tmp_path: Path, image_size: int | None) -> None:
    """Each byte lost on the line costs the receiver's one-second block timeout, so the default
    run sends a 2 KiB image (the line, seed 4, still drops or flips bytes in it three times), the
    slow one the 10 KiB image and the text file."""
    files = make_files(tmp_path)[:2]
    if image_size is not None:
        files[0].write_bytes(files[0].read_bytes()[:image_size])
        files = files[:1]
    # Byte faults: the line does not know where frames end once the port carries YMODEM.
    line = LinkConfig(baud=115200, latency=0.001, loss=0.0003, corrupt=0.0003, seed=4)
    sim = start_pty_sim(SimulatedDevice(seed=2, flash_dir=tmp_path / "flash"), line)
    try:
        with Device.open(sim.path, timeout=0.05, attempts=10) as dev:
            res, report = dev.send_files([str(f) for f in files])
            assert report is not None and report.ok, (res, report)
            assert dev.read("threshold").ok
        for f in files:
            assert sha(tmp_path / "flash" / "files" / f.name) == sha(f)
        # However many times the line made the host resend it, the hand-over ran once.
        assert sum(1 for e in sim.device.executions if e.request == b"\x44") == 1
    finally:
        sim.close()


def test_cli_send_shows_per_file_results(tmp_path: Path) -> None:
    files = make_files(tmp_path)[:2]
    flash = tmp_path / "flash"
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--flash-dir", str(flash)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        r = subprocess.run([sys.executable, "-m", "idemlink", "send", "--port", port,
                            *map(str, files)], capture_output=True, text=True, timeout=60,
                           check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "image.bin: ok, 10500 bytes, verified" in r.stdout
        assert "conf with spaces.txt: ok, 14 bytes, verified" in r.stdout
        assert "batch complete" in r.stdout
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    assert sha(flash / "files" / "image.bin") == sha(files[0])


def test_existing_file_is_replaced_only_when_asked(tmp_path: Path) -> None:
    f = tmp_path / "settings.bin"
    f.write_bytes(b"first version\n")
    sim = start_pty_sim(SimulatedDevice(seed=3, flash_dir=tmp_path / "flash"))
    stored = tmp_path / "flash" / "files" / "settings.bin"
    try:
        with Device.open(sim.path) as dev:
            _, first = dev.send_files([str(f)])
            assert first is not None and first.ok
            f.write_bytes(b"second version\n")
            with pytest.raises(ValueError, match="send with --overwrite"):
                dev.send_files([str(f)])  # asked first: refused before any hand-over
            assert stored.read_bytes() == b"first version\n"
            assert dev.read("threshold").ok
            _, replaced = dev.send_files([str(f)], overwrite=True)
            assert replaced is not None and replaced.ok
        assert stored.read_bytes() == b"second version\n"
        assert not [p for p in stored.parent.iterdir() if p.name.startswith(".")]  # no leftovers
    finally:
        sim.close()


def test_the_devices_flash_is_finite_a_batch_over_its_quota_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(5000))
    sim = start_pty_sim(SimulatedDevice(seed=6, flash_dir=tmp_path / "flash", file_quota=4096))
    try:
        with Device.open(sim.path) as dev:
            _, report = dev.send_files([str(big)])
            assert report is not None and not report.ok  # refused at the header: 5000 > 4096
            assert dev.read("threshold").ok
        assert not (tmp_path / "flash" / "files" / "big.bin").exists()
        assert list((tmp_path / "flash" / "files").iterdir()) == []  # nothing partial either
    finally:
        sim.close()


def test_cli_send_exits_unknown_when_the_hand_over_is_unknown_and_the_batch_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The hand-over's answer was lost and no receiver answered the batch: the device may yet
    switch (or did and gave up) — exit 5 (UNKNOWN), not 1 ("local error, nothing sent")."""
    import idemlink.host.device as hd
    from idemlink.cli import EXIT_UNKNOWN, main
    from idemlink.protocol.outcome import Status
    from idemlink.protocol.ymodem_files import FileResult, TransferReport

    f = tmp_path / "fw.bin"
    f.write_bytes(b"x" * 100)

    class StalledDevice:
        def __enter__(self) -> StalledDevice:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def send_files(self, paths: list[str], **kw: object) -> tuple[command.Result, TransferReport]:
            res = command.Result(command.Command(command.CommandKind.FILE_RECEIVE, 0), Outcome.UNKNOWN,
                            Status.NO_ANSWER)
            report = TransferReport([FileResult("fw.bin", 100, False, 2.0, "no receiver")],
                                    ok=False, reason="no receiver ('C') before the start timeout")
            return res, report

    monkeypatch.setattr(hd.Device, "open", classmethod(lambda cls, *a, **k: StalledDevice()))
    assert main(["send", "--no-progress", "--port", "/dev/null", str(f)]) == EXIT_UNKNOWN
    assert "UNKNOWN (NO_ANSWER)" in capsys.readouterr().err


def test_device_send_files_refuses_a_repeated_basename_before_switching(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "x.bin").write_bytes(d.encode())
    sim = start_pty_sim(SimulatedDevice(seed=1, flash_dir=tmp_path / "flash"))
    try:
        with Device.open(sim.path) as dev:
            with pytest.raises(ValueError, match="same file name twice"):
                dev.send_files([str(tmp_path / "a" / "x.bin"), str(tmp_path / "b" / "x.bin")])
            assert dev.read("threshold").ok  # still framed: the device was never switched
        assert not [e for e in sim.device.executions if e.request[:1] == b"\x44"]
    finally:
        sim.close()
