"""The posix C device (firmware_ref/port/posix) under hostile use of its flash directory.

- One device per ``--flash-dir``: a second ``idemlink-device`` on the same directory is refused
  with one line before it reads or changes anything (the boot counter is not counted twice), and
  the lock is the one ``idemlink sim`` takes (``flock`` on the directory), so a C device and the
  Python simulator exclude each other too; ``tools/qemu-device`` takes the same lock.
- A ``--flash-dir`` whose parents do not exist yet is created with them, as ``idemlink sim``
  does.
- The flash files' size limits are the simulator's (``device_sim/flash.py``): a 128-byte
  ``device_id`` file and a whitespace-padded ``config.json`` of 100 KiB are read, not refused.
- ``config.json`` is read as strictly as ``ConfigSnapshot.from_json``: an address given twice or
  a generation that is not a plain integer is refused at start (one line, exit 1, the file kept),
  never served with one HOLDING silently at its default.
- A YMODEM batch on a line that never goes quiet (the host gave up on the batch and is back to
  sending frames, here a HELLO every 0.1 s, less than ``purge_quiet`` apart) ends with CAN CAN
  within about ``max_errors`` x ``block_timeout``, the C receiver and ``protocol.ymodem.Receiver``
  answering byte for byte alike (simulated clock): a purge lasts at most ``block_timeout``.
- Temporaries a killed device left behind (``.config.json.XXXXXX`` of an interrupted
  configuration write, ``.<stem>.<random>.tmp`` of the simulator, ``files/.ymodem-*.part`` of an
  interrupted batch) are deleted at the next start, under the lock; nothing else is touched.

Skips, naming the reason, when make or a C compiler is missing.
"""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.c_ymodem import DEVICE, Pair, load_library
from support.firmware import QEMU_TOOL, RunningDevice

from idemlink.device_sim.flash import (
    DEVICE_ID_FILE_BYTES,
    ConfigFlash,
    FlashBusyError,
    lock_flash_dir,
)
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import ConfigSnapshot, SnapshotError
from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.ymodem_tables import RxState
from idemlink.protocol.ymodem_wire import build_block, build_header


@pytest.fixture
def serving(device_bin: Path, tmp_path: Path) -> Iterator[RunningDevice]:
    dev = RunningDevice(device_bin, tmp_path / "flash")
    try:
        yield dev
    finally:
        dev.kill()


def _run(binary: Path, flash: Path) -> subprocess.CompletedProcess[str]:
    """Start a device that is expected to refuse at once (a server would hit the timeout)."""
    return subprocess.run([str(binary), "--flash-dir", str(flash)], capture_output=True,
                          text=True, timeout=5, check=False)


def _listing(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_a_second_device_on_the_same_flash_dir_is_refused(device_bin: Path,
                                                          serving: RunningDevice,
                                                          tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    before = _listing(flash)
    second = _run(device_bin, flash)
    assert second.returncode == 1 and second.stdout == ""
    assert len(second.stderr.splitlines()) == 1 and "in use" in second.stderr, second.stderr
    assert _listing(flash) == before  # nothing read and rewritten: the boots are still 1
    assert (flash / "boots").read_text() == "1\n"
    with pytest.raises(FlashBusyError):  # the simulator sees the C device's lock
        lock_flash_dir(flash)
    serving.stop()


def test_the_simulators_lock_keeps_the_c_device_out(device_bin: Path, tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    with lock_flash_dir(flash):
        refused = _run(device_bin, flash)
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1
    assert "in use" in refused.stderr and refused.stdout == ""
    assert list(flash.iterdir()) == []


def test_qemu_device_takes_the_same_lock(qemu_elf: Path, tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    with lock_flash_dir(flash):
        refused = subprocess.run([str(QEMU_TOOL), "--flash-dir", str(flash)],
                                 capture_output=True, text=True, timeout=10, check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1 and "in use" in refused.stderr
    assert list(flash.iterdir()) == []


def test_a_nested_flash_dir_is_created_with_its_parents(device_bin: Path,
                                                        tmp_path: Path) -> None:
    flash = tmp_path / "not" / "yet" / "flash"
    dev = RunningDevice(device_bin, flash)
    dev.stop()
    assert sorted(p.name for p in flash.iterdir()) == ["boots", "device_id", "map"]


def test_flash_files_as_large_as_the_simulator_reads_are_read(device_bin: Path,
                                                              tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    flash.mkdir()
    ident = "a" * 64
    (flash / "device_id").write_text(ident.ljust(DEVICE_ID_FILE_BYTES - 1) + "\n")
    assert (flash / "device_id").stat().st_size == DEVICE_ID_FILE_BYTES
    config = '{"generation": 7, "holdings": [[4, 600], [5, 1], [6, 50]]' + " " * 100_000 + "}"
    (flash / "config.json").write_text(config)
    assert ConfigFlash(flash).load() == ConfigSnapshot(((4, 600), (5, 1), (6, 50)), 7)
    assert ConfigFlash(flash).device_id() == ident
    dev = RunningDevice(device_bin, flash)
    dev.stop()
    assert (flash / "config.json").read_text() == config  # read, not rewritten


@pytest.mark.parametrize("text", [
    '{"generation": 3, "holdings": [[4, 600], [4, 700], [5, 1]]}',
    '{"generation": 1.5, "holdings": [[4, 600], [5, 1], [6, 50]]}',
    '{"generation": 2e1, "holdings": [[4, 600], [5, 1], [6, 50]]}',
], ids=["address-twice", "fractional-generation", "exponent-generation"])
def test_a_config_the_simulator_refuses_is_refused(device_bin: Path, tmp_path: Path,
                                                   text: str) -> None:
    with pytest.raises(SnapshotError):
        ConfigSnapshot.from_json(text)
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "config.json").write_text(text)
    refused = _run(device_bin, flash)
    assert refused.returncode == 1 and refused.stdout == "", refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "config.json" in refused.stderr
    assert _listing(flash) == {"config.json": text.encode()}


def test_a_killed_devices_temporaries_are_removed_at_the_next_start(device_bin: Path,
                                                                     tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    (flash / "files").mkdir(parents=True)
    stale = [flash / ".config.json.Ab12Cd", flash / ".boots.x1y2z3", flash / ".map.q9w8e7",
             flash / ".device_id.abcdef", flash / ".config.k3j2h1.tmp",
             flash / "files" / ".ymodem-0a1b2c3d.part"]
    kept = [flash / "files" / "report.txt", flash / "files" / ".hidden", flash / "notes",
            flash / "files" / ".ymodem-x.bin", flash / ".config.backup", flash / ".map.old.bak",
            flash / ".boots.tmp", flash / ".config.json.orig", flash / ".ymodem-1.part"]
    for p in stale + kept:
        p.write_bytes(b"half")
    dev = RunningDevice(device_bin, flash)
    try:
        assert [p for p in stale if p.exists()] == []
        assert all(p.read_bytes() == b"half" for p in kept)
    finally:
        dev.stop()


def test_a_refused_flash_dir_keeps_its_temporaries(device_bin: Path, tmp_path: Path) -> None:
    """Refused at start (here: another map's directory), nothing in it changes at all."""
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "map").write_text("other-map 0123456789abcdef\n")
    (flash / ".config.json.Ab12Cd").write_bytes(b"half")
    before = _listing(flash)
    refused = _run(device_bin, flash)
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1
    assert _listing(flash) == before


@pytest.fixture(scope="module")
def ymlib(lib_path: Path) -> ctypes.CDLL:
    return load_library(lib_path)


@pytest.mark.parametrize("after_data", [False, True], ids=["before-the-header", "mid-file"])
def test_a_host_back_to_frames_ends_the_batch(ymlib: ctypes.CDLL, after_data: bool) -> None:
    rx = Pair(ymlib, DEVICE)
    assert rx.start(0) == b"C"
    if after_data:
        _, header = build_header("half.bin", 3000, 0, 0o644)
        assert rx.feed(build_block(0, header), 10) == b"\x06C"
        assert rx.feed(build_block(1, bytes(1024)), 20) == b"\x06"
    hello = encode_frame(FrameType.HELLO, 1, 0, bytes([1]) + contract_hash())
    # per error: the purge's block_timeout plus the 0.5 s the frames take to fill a 133-byte block
    bound = round(DEVICE.max_errors * (DEVICE.block_timeout + 2) * 1000)
    ms = 20
    answers = b""
    while not rx.finished and ms < 3 * bound:
        ms += 20
        answers += rx.feed(hello if ms % 100 == 0 else b"", ms)
    assert rx.finished and ms <= bound, f"still receiving after {ms} ms"
    assert rx.py.outcome().state is RxState.ABORTED and answers.endswith(b"\x18" * 8)
