"""The flash directory's rules, one for the Python simulator (``idemlink sim``) and the posix C
device (``firmware_ref/port/posix``): each case runs against both.

- ``files`` (where FILE_RECEIVE stores) as a symbolic link is refused at start like every other
  flash file (one line, exit 1, nothing changed, the link's target untouched), and so is a
  ``files`` that is not a directory; a link put there while the device serves is never followed:
  FILE_INFO finds nothing through it and a batch is cancelled at its header.
- ``tests/vectors/flash_files.json``: the flash files' content rules as shared cases. ``boots``:
  each accepted counter is written back incremented (the C device's 64-bit counter and the
  simulator's agree up to 2^64 - 2), each refused one gives the same reason in one line, exit 1,
  with nothing in the directory changed (the counter is judged before anything is written).
  ``config``: bad configuration files, each refused by both with the same words (bytes that are
  not text: ``not UTF-8 text``, where the C device used to say ``generation is not an
  integer``), one line, exit 1, nothing changed; good ones start with the same registers.

Skips the C half, naming the reason, when make or a C compiler is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemlink.cli import EXIT_LOCAL_ERROR, main
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.flash import MAX_BOOTS, ConfigFlash, UnsafeFlashFileError, parse_boots
from idemlink.host.device import Device
from idemlink.protocol.modbus import FileInfoResponse, FileInfoStatus
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.ymodem_events import FileStarted
from idemlink.protocol.ymodem_files import DirectorySink, SinkRefused

ROOT = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ["sim", "sim-rtu", "c", "c-rtu"]
VECTORS = json.loads((ROOT / "tests" / "vectors" / "flash_files.json").read_text(encoding="utf-8"))


def content(case: dict[str, object]) -> bytes:
    """A vector case's file content (``text`` as UTF-8, or ``hex``)."""
    if "text" in case:
        return str(case["text"]).encode("utf-8")
    return bytes.fromhex(str(case["hex"]))


def snapshot(d: Path) -> dict[str, bytes | None]:
    """Every entry of ``d`` and its bytes (None: not a regular file)."""
    return {p.name: p.read_bytes() if p.is_file() and not p.is_symlink() else None
            for p in d.iterdir()}


@pytest.fixture(scope="module")
def c_device(device_bin: Path) -> Path:
    return device_bin  # make -C firmware_ref device, once per session (support.fixtures)


def _command(kind: str, flash: Path, request: pytest.FixtureRequest) -> list[str]:
    """The command line of one implementation serving ``flash``."""
    rtu = ["--modbus-rtu"] if kind.endswith("-rtu") else []
    if kind.startswith("c"):
        binary: Path = request.getfixturevalue("c_device")
        return [str(binary), "--flash-dir", str(flash), *rtu]
    return [sys.executable, "-m", "idemlink", "sim", "--flash-dir", str(flash), *rtu]


def refused(kind: str, flash: Path, request: pytest.FixtureRequest) -> str:
    """Start ``kind`` on ``flash``: it must refuse with one line and exit 1; that line."""
    proc = subprocess.run(_command(kind, flash, request), capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 1 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip()


class Serving:
    """One implementation serving ``flash`` on a new pty (its path: the first line of stdout)."""

    def __init__(self, command: list[str]) -> None:
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.path = self.proc.stdout.readline().strip()
        assert self.path.startswith("/dev/"), (self.path, self.proc.stderr)

    def stop(self) -> str:
        """SIGTERM; the exit must be clean. Returns what it said on stderr."""
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0, err
        return err


@pytest.fixture
def serving() -> Iterator[list[Serving]]:
    started: list[Serving] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


# ------------------------------------------------------------------ files: a symbolic link


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_a_symlinked_files_directory_is_refused_at_start(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    flash, elsewhere = tmp_path / "flash", tmp_path / "elsewhere"
    flash.mkdir()
    elsewhere.mkdir()
    (flash / "files").symlink_to(elsewhere)
    line = refused(kind, flash, request)
    assert line.endswith(f"{flash}/files: is a symbolic link; refused"), line
    assert sorted(p.name for p in flash.iterdir()) == ["files"], "nothing created"
    assert (flash / "files").is_symlink() and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_a_files_entry_that_is_no_directory_is_refused_at_start(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "files").write_bytes(b"not a directory")
    line = refused(kind, flash, request)
    assert line.endswith(f"{flash}/files: not a directory; refused"), line
    assert sorted(p.name for p in flash.iterdir()) == ["files"]


def test_config_flash_refuses_a_symlinked_files_directory(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "flash").mkdir()
    (tmp_path / "flash" / "files").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFlashFileError, match="is a symbolic link; refused"):
        ConfigFlash(tmp_path / "flash")
    with pytest.raises(UnsafeFlashFileError, match="is a symbolic link; refused"):
        SimulatedDevice(flash_dir=tmp_path / "flash")


@pytest.mark.parametrize("kind", ["sim", "c"])
def test_a_link_put_in_place_of_files_while_serving_is_not_followed(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest,
        serving: list[Serving]) -> None:
    flash, elsewhere = tmp_path / "flash", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "there.bin").write_bytes(b"outside the flash directory")
    payload = tmp_path / "firmware.bin"
    payload.write_bytes(b"\x01\x02\x03" * 500)
    dev = Serving(_command(kind, flash, request))
    serving.append(dev)
    shutil.rmtree(flash / "files", ignore_errors=True)
    (flash / "files").symlink_to(elsewhere)
    with Device.open(dev.path) as host:
        info = host.file_info("there.bin")
        assert info.ok and info.file == FileInfoResponse(FileInfoStatus.ABSENT, 0, 0)
        res, report = host.send_files([str(payload)])
        assert res.outcome is Outcome.OK  # the hand-over ran; the batch itself was refused
        assert report is not None and not report.ok, report
    dev.stop()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["there.bin"], "nothing written there"


def test_the_device_sink_never_follows_its_directory(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "files"
    link.symlink_to(tmp_path / "elsewhere")
    header = FileStarted("a.bin", 3, None, None)
    with pytest.raises(SinkRefused, match="is a symbolic link; refused"):
        DirectorySink(link, follow_symlink=False).open(header)
    sink = DirectorySink(link)  # a directory the user names (idemlink receive --dir) may be one
    sink.open(header)
    sink.discard()
    assert os.listdir(tmp_path / "elsewhere") == []


# ------------------------------------------------------------------ boots: the shared vectors

BOOTS = VECTORS["boots"]["cases"]


def _ids(cases: list[dict[str, object]]) -> list[str]:
    return [str(c["name"]) for c in cases]


def test_the_vectors_bound_is_the_simulators() -> None:
    assert VECTORS["boots"]["max"] == MAX_BOOTS == (1 << 64) - 2


@pytest.mark.parametrize("case", BOOTS, ids=_ids(BOOTS))
def test_boots_vectors_in_the_simulator(case: dict[str, object], tmp_path: Path) -> None:
    data = content(case)
    if "next" in case:
        assert parse_boots(data) + 1 == case["next"]
        (tmp_path / "boots").write_bytes(data)
        dev = SimulatedDevice(seed=1, flash_dir=tmp_path)
        assert dev.boot_count == case["next"]
        assert (tmp_path / "boots").read_text(encoding="ascii") == f"{case['next']}\n"
        return
    (tmp_path / "boots").write_bytes(data)
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeFlashFileError) as err:
        SimulatedDevice(seed=1, flash_dir=tmp_path)
    assert str(err.value) == f"{tmp_path}/boots: {case['error']}; refused"
    assert snapshot(tmp_path) == before, "nothing written: no map record, device id or counter"


@pytest.mark.parametrize("case", BOOTS, ids=_ids(BOOTS))
def test_boots_vectors_in_the_c_device(case: dict[str, object], tmp_path: Path,
                                       c_device: Path) -> None:
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "boots").write_bytes(content(case))
    if "next" in case:
        Serving([str(c_device), "--flash-dir", str(flash)]).stop()
        assert (flash / "boots").read_text(encoding="ascii") == f"{case['next']}\n"
        return
    before = snapshot(flash)
    proc = subprocess.run([str(c_device), "--flash-dir", str(flash)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr == f"idemlink-device: flash directory: boots: {case['error']}; refused\n"
    assert snapshot(flash) == before, "nothing written: no map record, device id or counter"


# ------------------------------------------------------------------ config.json: the shared vectors

CONFIG = VECTORS["config"]["cases"]
NAMES = ("threshold", "mode", "fan_setpoint")  # the built-in map's HOLDINGs, at 4, 5, 6


def test_the_config_vectors_are_for_the_built_in_map() -> None:
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    assert VECTORS["config"]["map"] == DEFAULT_MAP.name
    assert [DEFAULT_MAP.named(n).address for n in NAMES] == [4, 5, 6]


@pytest.mark.parametrize("mode", [[], ["--modbus-rtu"]], ids=["framed", "rtu"])
@pytest.mark.parametrize("case", CONFIG, ids=_ids(CONFIG))
def test_config_vectors_in_the_simulator(case: dict[str, object], mode: list[str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_bytes(content(case))
    if "error" not in case:
        dev = SimulatedDevice(seed=1, flash_dir=tmp_path)
        assert [list(p) for p in dev.core.snapshot().holdings] == case["holdings"]
        assert dev.core.generation == case["generation"]
        return
    before = snapshot(tmp_path)
    assert main(["sim", *mode, "--flash-dir", str(tmp_path)]) == EXIT_LOCAL_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    if case["error"] == "not JSON":  # the simulator adds Python's reason after a colon
        assert f"{tmp_path}/config.json: not JSON: " in err, err
    else:
        assert err.endswith(f"{tmp_path}/config.json: {case['error']}\n"), err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", CONFIG, ids=_ids(CONFIG))
def test_config_vectors_in_the_c_device(case: dict[str, object], tmp_path: Path,
                                        c_device: Path) -> None:
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "config.json").write_bytes(content(case))
    if "error" not in case:
        dev = Serving([str(c_device), "--flash-dir", str(flash)])
        try:
            with Device.open(dev.path) as host:
                values = host.read(NAMES[0], len(NAMES)).values
                generation = host.read("generation").values
        finally:
            dev.stop()
        holdings = case["holdings"]
        assert isinstance(holdings, list)
        assert [[a, v] for a, v in zip((4, 5, 6), values, strict=True)] == holdings
        assert generation == (case["generation"],)
        return
    before = snapshot(flash)
    proc = subprocess.run([str(c_device), "--flash-dir", str(flash)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr == f"idemlink-device: flash directory: config.json: {case['error']}\n"
    assert snapshot(flash) == before
