"""Interoperability with lrzsz over socat pty pairs: our sender -> ``rb``, ``sb`` -> our receiver,
and our CLI to our CLI. sha256 of every file is compared on arrival. Skipped when socat or lrzsz
is missing. The receiving side always starts first (pyserial discards input when it opens).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import serial
from support.ptys import holds_open
from support.timing import scaled, wait_until

from idemlink.host.ymodem_io import receive_files, send_files
from idemlink.protocol.ymodem_files import DirectorySink, TransferReport
from idemlink.protocol.ymodem_receiver import ReceiverConfig
from idemlink.protocol.ymodem_sender import SenderConfig

pytestmark = pytest.mark.skipif(
    not (shutil.which("socat") and shutil.which("sb") and shutil.which("rb")),
    reason="needs socat and lrzsz (sb/rb)",
)


@pytest.fixture
def pty_pair(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with socat_ptys(tmp_path) as pair:
        yield pair


@contextmanager
def socat_ptys(tmp_path: Path, tag: str = "") -> Iterator[tuple[str, str]]:
    a, b = str(tmp_path / f"ttyA{tag}"), str(tmp_path / f"ttyB{tag}")
    proc = subprocess.Popen(
        ["socat", "-d", "-d", f"pty,raw,echo=0,link={a}", f"pty,raw,echo=0,link={b}"],
        stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # readiness: socat says so once both ptys exist
        if "starting data transfer loop" in line:
            break
    else:
        pytest.fail("socat did not start")
    try:
        yield a, b
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def make_files(d: Path, spec: dict[str, int], seed: int = 1) -> list[Path]:
    rnd = random.Random(seed)
    d.mkdir()
    out = []
    for name, size in spec.items():
        p = d / name
        p.write_bytes(rnd.randbytes(size))
        out.append(p)
    return out


BATCH_1K = {"empty": 0, "one MiB.bin": 1 << 20, "odd 1000.bin": 1000, "UPPER.BIN": 130,
            "name with spaces.txt": 2049}
BATCH_128 = {"wrap.bin": 128 * 260 + 77, "small one.txt": 5}
LONG_NAME = "long " + "n" * 140 + ".bin"  # block 0 does not fit 128 bytes: we send a 1K block 0

def assert_same(src: list[Path], dst: Path) -> None:
    got = {p.name: sha(p) for p in dst.iterdir()}
    assert got == {p.name: sha(p) for p in src}


#: the 1K batch's empty file, and block numbers wrapping (300 KiB) under a name whose case is kept;
#: the 128 batch's wrap and the name too long for a 128-byte block 0. Every file costs rb two
#: seconds of silence (it answers each EOT after a second), so the whole batches (1 MiB, odd
#: sizes, spaces) are slow
BATCH_1K_SHORT = {"empty": 0, "WRAPS At 256.BIN": 1024 * 300 + 3}
BATCH_128_SHORT = {"wrap.bin": BATCH_128["wrap.bin"], LONG_NAME: 300}


@pytest.mark.parametrize(("spec", "block"),
                         [(BATCH_1K_SHORT, 1024),
                          pytest.param(BATCH_1K, 1024, marks=pytest.mark.slow),
                          (BATCH_128_SHORT, 128),
                          pytest.param({**BATCH_128, LONG_NAME: 300}, 128, marks=pytest.mark.slow)],
                         ids=["1k-blocks", "1k-blocks-whole-batch", "128-blocks-long-name",
                              "128-blocks-whole-batch"])
def test_our_sender_to_rb(tmp_path: Path, pty_pair: tuple[str, str], caplog: pytest.LogCaptureFixture,
                          spec: dict[str, int], block: int) -> None:
    caplog.set_level(logging.DEBUG, logger="idemlink.host.ymodem_io")
    a, b = pty_pair
    src = make_files(tmp_path / "src", spec)
    dst = tmp_path / "dst"
    dst.mkdir()
    port = serial.serial_for_url(a)  # our side opens first, then rb starts and sends 'C'
    with open(b, "r+b", buffering=0) as tty, open(tmp_path / "rb.log", "wb") as log:
        rb = subprocess.Popen(["rb", "--ymodem", "-y"], stdin=tty, stdout=tty, stderr=log, cwd=dst)
        try:
            report = send_files(port, src, SenderConfig(
                block_size=block, end_timeout=1.0, end_retries=1, start_timeout=20.0),
                overall_timeout=60)
            rc = rb.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = -1
        finally:
            if rb.poll() is None:
                rb.kill()
            port.close()
    trail = "\n".join(r.getMessage() for r in caplog.records[-40:])
    assert rc == 0, (tmp_path / "rb.log").read_text(errors="replace")[-500:] + "\n" + trail
    assert report.ok and all(f.ok for f in report.files), f"{report}\n{trail}"
    assert_same(src, dst)  # UPPER.BIN keeps its case: we send the mode with S_IFREG


def _receive_in_thread(port_path: str, dst: Path, overall_timeout: float = 90
                       ) -> tuple[threading.Thread, list[TransferReport]]:
    result: list[TransferReport] = []
    port = serial.serial_for_url(port_path)  # opened before the sender starts

    def work() -> None:
        try:
            result.append(receive_files(port, DirectorySink(dst),
                                        ReceiverConfig(header_retries=10),
                                        overall_timeout=overall_timeout))
        finally:
            port.close()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t, result


@pytest.mark.parametrize(("spec", "k"), [(BATCH_1K, True), (BATCH_128, False)],
                         ids=["sb-k", "sb-128"])
def test_sb_to_our_receiver(tmp_path: Path, pty_pair: tuple[str, str],
                            spec: dict[str, int], k: bool) -> None:
    a, b = pty_pair
    src = make_files(tmp_path / "src", spec)
    dst = tmp_path / "dst"
    dst.mkdir()
    thread, result = _receive_in_thread(b, dst)  # our receiver first: it sends 'C'
    args = ["sb", "--ymodem", "-t", "30"] + (["-k"] if k else []) + [p.name for p in src]
    with open(a, "r+b", buffering=0) as tty, open(tmp_path / "sb.log", "wb") as log:
        rc = subprocess.run(args, stdin=tty, stdout=tty, stderr=log, cwd=tmp_path / "src",
                            timeout=60).returncode
    thread.join(30)
    assert rc == 0, (tmp_path / "sb.log").read_text(errors="replace")[-500:]
    assert not thread.is_alive() and result
    report = result[0]
    assert report.ok and [f.name for f in report.files] == list(spec), report
    assert_same(src, dst)
    assert not [p for p in dst.iterdir() if p.name.startswith(".ymodem-")]


def test_sb_the_same_file_twice_is_accepted_as_identical(tmp_path: Path,
                                                          pty_pair: tuple[str, str]) -> None:
    """``sb fw.bin`` a second time into the same directory: ACKed (sb exits 0), reported
    identical, the first copy kept."""
    a, b = pty_pair
    src = make_files(tmp_path / "src", {"fw.bin": 3000})
    dst = tmp_path / "dst"
    dst.mkdir()
    for attempt in range(2):
        thread, result = _receive_in_thread(b, dst)
        with open(a, "r+b", buffering=0) as tty, open(tmp_path / "sb.log", "wb") as log:
            rc = subprocess.run(["sb", "--ymodem", "-t", "30", "fw.bin"], stdin=tty, stdout=tty,
                                stderr=log, cwd=tmp_path / "src", timeout=60).returncode
        thread.join(30)
        assert rc == 0, (tmp_path / "sb.log").read_text(errors="replace")[-500:]
        assert result and result[0].ok
        assert [f.identical for f in result[0].files] == [attempt == 1]
    assert_same(src, dst)


def test_cli_send_plain_to_cli_receive(tmp_path: Path, pty_pair: tuple[str, str]) -> None:
    a, b = pty_pair
    src = make_files(tmp_path / "src", {"cli one.bin": 5000, "cli-two": 0})
    dst = tmp_path / "dst"
    dst.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The sender first, waiting for 'C' with its port open; then the receiver, whose first 'C'
    # the sender cannot miss (a receiver started first may say 'C' before the sender's port is
    # open, and its next 'C' comes 3 s later). Where /proc cannot tell, that retry still works.
    send = subprocess.Popen(
        [sys.executable, "-m", "idemlink", "send", "--plain", "--port", a, *map(str, src)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if os.path.isdir("/proc/self/fd"):
        wait_until(lambda: holds_open(send.pid, a) or send.poll() is not None, 20,
                   what="the sender's port")
    recv = subprocess.Popen(
        [sys.executable, "-m", "idemlink", "receive", "--port", b, "--dir", str(dst),
         "--timeout", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    send_out, send_err = send.communicate(timeout=scaled(60))
    out, err = recv.communicate(timeout=scaled(30))
    assert send.returncode == 0, send_out + send_err
    assert recv.returncode == 0, out + err
    assert "cli one.bin: ok, 5000 bytes" in send_out and "batch complete" in send_out
    assert "cli one.bin: ok, 5000 bytes" in out and "kB/s" in out
    assert_same(src, dst)


def test_sb_long_names_119_to_127_arrive_whole_or_are_refused(tmp_path: Path) -> None:
    """sb keeps block 0 at 128 bytes: from 123 characters on the size no longer fits (cut, or
    overwritten by sb's block count in 126-127 for 125, or absent for 127). Each name either
    arrives byte-exact (the size ended inside the block) or is refused with no file at all:
    never a file with its 0x1A padding reported ok."""
    outcomes: dict[int, str] = {}
    for n in range(119, 128):
        name = "n" * (n - 4) + ".bin"
        src, dst = tmp_path / f"src{n}", tmp_path / f"dst{n}"
        files = make_files(src, {name: 5000}, seed=n)
        dst.mkdir()
        with socat_ptys(tmp_path, str(n)) as (a, b):
            thread, result = _receive_in_thread(b, dst, overall_timeout=20)
            with open(a, "r+b", buffering=0) as tty:
                rc = subprocess.run(["sb", "--ymodem", "-k", "-t", "30", name], stdin=tty,
                                    stdout=tty, stderr=subprocess.DEVNULL, cwd=src,
                                    timeout=30).returncode
            thread.join(30)
        assert not thread.is_alive() and result, n
        report = result[0]
        if report.ok:
            assert rc == 0 and [f.name for f in report.files] == [name], (n, report)
            assert_same(files, dst)
            outcomes[n] = "ok"
        else:
            assert "size unknown" in report.reason, (n, report)
            assert rc != 0 and list(dst.iterdir()) == [], n  # cancelled: nothing left, sb fails
            outcomes[n] = "refused"
    assert outcomes == {**{n: "ok" for n in range(119, 123)},
                        **{n: "refused" for n in range(123, 128)}}
