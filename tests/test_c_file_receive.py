"""FILE_RECEIVE (0x44) on the posix C device (firmware_ref/port/posix): the framed hand-over, a
YMODEM batch into ``<flash-dir>/files`` through the C receiver, back to frames.

- ``Device.send_files`` (what ``idemlink send`` runs) into the C device: every file arrives byte
  for byte, the read-back (FILE_INFO) matches size and CRC-32C, registers answer afterwards;
  the same files again are "already on the device, identical" (nothing handed over); a changed
  file is refused without overwrite and replaced with it; nothing temporary is left.
- The request's forms answer like the simulator: ``44``, ``44 00``, ``44 01`` -> ``44 00`` and the
  hand-over; any other -> exception 03.
- A batch cut short (the sender's CAN CAN, or the device stopped) leaves no temporary behind.
- lrzsz ``sb`` into the C receiver: the host hands the line over, closes, and sb sends a batch on
  the same pty (as ``tests/test_ymodem_lrzsz.py`` drives sb against the Python receiver).
- The same hand-over and batch into the QEMU build (Cortex-M3 code, files kept in RAM).
- ``make -C firmware_ref size-device`` lists the receiver as its own module within the budget.

Skips, naming the reason, when make, a C compiler, lrzsz or the ARM toolchain is missing.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import firmware
from support.firmware import QemuDevice, RunningDevice
from support.timing import scaled, wait_until

from idemlink.host.command import Command, CommandKind
from idemlink.host.device import Device
from idemlink.protocol.frame import crc32c
from idemlink.protocol.modbus import FileInfoResponse, FileInfoStatus
from idemlink.protocol.outcome import ModbusException, Outcome
from idemlink.protocol.ymodem_wire import build_block, build_header


@pytest.fixture
def cdev(device_bin: Path, tmp_path: Path) -> Iterator[RunningDevice]:
    dev = RunningDevice(device_bin, tmp_path / "flash")
    try:
        yield dev
    finally:
        dev.kill()


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def make_files(d: Path) -> list[Path]:
    d.mkdir()
    files = {"image.bin": bytes(range(256)) * 41 + b"tail", "conf with spaces.txt":
             b"threshold=420\n", "empty": b"", "big.bin": random.Random(5).randbytes(70000)}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return [d / name for name in files]


def test_send_into_the_c_device_then_frames_again(cdev: RunningDevice, tmp_path: Path) -> None:
    files = make_files(tmp_path / "src")
    with Device.open(cdev.path) as dev:
        res, report = dev.send_files([str(f) for f in files])
        assert res.outcome is Outcome.OK
        assert report is not None and report.ok, report
        assert [(f.ok, f.verified, f.identical) for f in report.files] == [(True, True, False)] * 4
        assert dev.write({"threshold": 420}).ok  # back in framed mode
        for f in files:
            back = dev.file_info(f.name)
            data = f.read_bytes()
            assert back.file == FileInfoResponse(FileInfoStatus.PRESENT, len(data), crc32c(data))
        _, again = dev.send_files([str(f) for f in files])
        assert again is not None and again.ok
        assert [(f.identical, f.detail) for f in again.files] == [
            (True, "already on the device, identical")] * 4
    for f in files:
        assert sha(cdev.files / f.name) == sha(f)
    assert sorted(p.name for p in cdev.files.iterdir()) == sorted(f.name for f in files)
    cdev.stop()


def test_a_changed_file_is_replaced_only_when_asked(cdev: RunningDevice, tmp_path: Path) -> None:
    f = tmp_path / "settings.bin"
    f.write_bytes(b"first version\n")
    stored = cdev.files / "settings.bin"
    with Device.open(cdev.path) as dev:
        _, first = dev.send_files([str(f)])
        assert first is not None and first.ok
        f.write_bytes(b"second version, longer\n")
        with pytest.raises(ValueError, match="send with --overwrite"):
            dev.send_files([str(f)])
        assert stored.read_bytes() == b"first version\n"
        _, replaced = dev.send_files([str(f)], overwrite=True)
        assert replaced is not None and replaced.ok and replaced.files[0].verified
    assert stored.read_bytes() == b"second version, longer\n"
    assert [p.name for p in cdev.files.iterdir()] == ["settings.bin"]  # no leftovers
    cdev.stop()


def test_the_requests_forms_answer_like_the_simulator(cdev: RunningDevice) -> None:
    """``44 02`` and ``44 00 00`` are exception 03 and hand nothing over; registers still answer."""
    with Device.open(cdev.path) as dev:
        for values in ((2,), (0, 0)):
            res = dev.execute(Command(CommandKind.FILE_RECEIVE, 0, values=values))
            assert res.outcome is Outcome.REJECTED, res
            assert res.exception is ModbusException.ILLEGAL_DATA_VALUE, res
        assert dev.read("threshold").ok
    cdev.stop()


def test_a_batch_cut_short_leaves_nothing(cdev: RunningDevice) -> None:
    """Mid-file, the sender cancels (CAN CAN): the temporary is deleted, frames resume. Mid-file
    again, the device is stopped (SIGTERM): the temporary is deleted too."""
    _, header = build_header("half.bin", 3000, 0, 0o644)
    with Device.open(cdev.path) as dev:
        port = dev.transport.port  # type: ignore[attr-defined]
        port.timeout = 2
        for ending in (b"\x18\x18", None):
            assert dev.execute(Command(CommandKind.FILE_RECEIVE, 0)).outcome is Outcome.OK
            assert port.read(1) == b"C"
            port.write(build_block(0, header))
            assert port.read(2) == b"\x06C"
            port.write(build_block(1, bytes(1024)))
            assert port.read(1) == b"\x06"
            assert [p.name[:8] for p in cdev.files.iterdir()] == [".ymodem-"]
            if ending is None:
                cdev.stop()  # its CANs go out as it closes the pty (the differential test
                break  # checks them): what matters here is the flash
            port.write(ending)
            wait_until(lambda: not any(cdev.files.iterdir()), what="the temporary deleted")
            dev.session.resync()
            assert dev.read("threshold").ok  # back in framed mode
            assert list(cdev.files.iterdir()) == []
    assert list(cdev.files.iterdir()) == []


@pytest.mark.skipif(not (shutil.which("sb")), reason="needs lrzsz (sb)")
@pytest.mark.parametrize("k", [True, False], ids=["sb-k", "sb-128"])
def test_sb_into_the_c_receiver(cdev: RunningDevice, tmp_path: Path, k: bool) -> None:
    files = make_files(tmp_path / "src")
    with Device.open(cdev.path) as dev:
        res = dev.execute(Command(CommandKind.FILE_RECEIVE, 0))
        assert res.outcome is Outcome.OK, res
    args = ["sb", "--ymodem", "-t", "30"] + (["-k"] if k else []) + [p.name for p in files]
    with open(cdev.path, "r+b", buffering=0) as tty, open(tmp_path / "sb.log", "wb") as log:
        rc = subprocess.run(args, stdin=tty, stdout=tty, stderr=log, cwd=tmp_path / "src",
                            timeout=60, check=False).returncode
    assert rc == 0, (tmp_path / "sb.log").read_text(errors="replace")[-500:]
    for f in files:
        assert sha(cdev.files / f.name) == sha(f)
    with Device.open(cdev.path) as dev:  # back in framed mode
        data = files[0].read_bytes()
        back = dev.file_info(files[0].name)
        assert back.file == FileInfoResponse(FileInfoStatus.PRESENT, len(data), crc32c(data))
    assert not [p for p in cdev.files.iterdir() if p.name.startswith(".ymodem-")]
    cdev.stop()


def test_send_into_the_qemu_device(qemu_elf: Path, tmp_path: Path) -> None:
    """The receiver as Cortex-M3 code: files stored in the board's RAM, read back by FILE_INFO."""
    files = make_files(tmp_path / "src")
    qemu = QemuDevice(qemu_elf, tmp_path)
    try:
        with Device.open(qemu.path, timeout=scaled(0.5)) as dev:
            _, report = dev.send_files([str(f) for f in files])
            assert report is not None and report.ok, report
            assert [(f.ok, f.verified) for f in report.files] == [(True, True)] * 4
            _, again = dev.send_files([str(f) for f in files])
            assert again is not None and all(f.identical for f in again.files)
            assert dev.read("threshold").ok
    finally:
        qemu.stop()


def test_make_size_device_lists_the_receiver_within_the_budget() -> None:
    """Cortex-M0+ and M4, -Os: the framed device <= 6144 B of code, with the YMODEM receiver
    (its own module line) <= 8320 B (8 KiB + 128 since the generation's save policy); the
    receiver's 1 KiB block buffer reported apart; the libc and libgcc bytes each build links
    (from the link's map) on its row, the receiver's division nonzero on the M0+."""
    out = firmware.make_once("size-device",
                             tools=("arm-none-eabi-gcc", "arm-none-eabi-size", "arm-none-eabi-nm"))
    rows = [dict(kv.split("=", 1) for kv in ln.split())
            for ln in out.splitlines() if ln.startswith("cpu=")]
    for cpu in ("cortex-m0plus", "cortex-m4"):
        mine = {r["module"]: r for r in rows if r["cpu"] == cpu}
        total, with_ym = mine.pop("total"), mine.pop("total_ymodem")
        mine.pop("total_framed")  # without FILE_INFO: tests/test_c_device.py
        ymodem = mine.pop("ymodem")
        mine.pop("rtu")
        mine.pop("libc")  # newlib's memcpy/memmove/memset/strlen, listed apart
        mine.pop("libgcc")
        # what the link pulls: the receiver's divisions (no divide instruction on the M0+) and
        # memchr, counted in its flash figure
        assert int(with_ym["libc"]) > int(total["libc"]) > 0
        if cpu == "cortex-m0plus":
            assert int(with_ym["libgcc"]) > 0 == int(total["libgcc"])
        assert int(with_ym["flash"]) == int(with_ym["text"]) + int(with_ym["data"]) \
            + int(with_ym["libc"]) + int(with_ym["libgcc"]) <= int(with_ym["budget_flash"])
        bus = mine.pop("bus")  # the bus option: tests/test_c_device.py
        mine.pop("total_bus")
        both = mine.pop("total_ymodem_bus")
        assert int(both["text"]) == int(with_ym["text"]) + int(bus["text"])
        assert int(both["text"]) <= int(both["budget_text"])
        assert int(total["text"]) == sum(int(r["text"]) for r in mine.values())
        assert int(with_ym["text"]) == int(total["text"]) + int(ymodem["text"])
        assert int(total["text"]) + int(total["data"]) <= 6144
        assert int(with_ym["text"]) + int(with_ym["data"]) <= int(with_ym["budget_text"]) == 8320
        assert int(with_ym["ram_block"]) == 1024


@pytest.mark.slow  # default-suite budget; see CONTRIBUTING.md's slow/default table
def test_size_device_measures_each_option_whatever_idl_opts_says() -> None:
    """``size-device`` builds every row with and without FILE_RECEIVE, FILE_INFO and the bus
    itself: an ``IDL_OPTS`` that names one of them (the small profile's ``-DIDL_FILE_RECEIVE=0``)
    must not turn the YMODEM glue into 0 bytes and ``total_ymodem`` into a device without it."""
    out = firmware.make("size-device", "IDL_OPTS=-DIDL_REPLAY_SLOTS=2u -DIDL_FILE_RECEIVE=0 "
                        "-DIDL_BUS=1", "SIZE_CPUS=cortex-m0plus", "BUDGET_TEXT_FRAMED=8192",
                        tools=("arm-none-eabi-gcc", "arm-none-eabi-size", "arm-none-eabi-nm"))
    rows = {r["module"]: r for r in (dict(kv.split("=", 1) for kv in ln.split())
                                     for ln in out.splitlines() if ln.startswith("cpu="))}
    assert int(rows["ymodem"]["glue"]) > 0
    assert int(rows["bus"]["text"]) > 0
    assert rows["total"]["replay_slots"] == "2"
