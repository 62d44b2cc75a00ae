"""The simulator's boots and its flash directory.

- Every boot gets a new epoch, a process start included, even with ``--seed`` (otherwise a host
  reconnecting after a restart sees the old epoch and the epoch rule cannot fire); the same seed on
  a fresh flash directory stays reproducible.
- A hostile flash directory (``config.json`` as a FIFO, a huge sparse file, a symbolic link) is
  refused before anything is read: one line on stderr, exit 1, nothing changed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from idemlink.cli import EXIT_LOCAL_ERROR, main
from idemlink.device_sim import serve as serve_mod
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.flash import ConfigFlash, UnsafeFlashFileError
from idemlink.protocol.device_core import ConfigSnapshot


def test_a_process_start_on_the_same_flash_is_a_new_epoch(tmp_path: Path) -> None:
    first = SimulatedDevice(seed=7, flash_dir=tmp_path / "a")
    restarted = SimulatedDevice(seed=7, flash_dir=tmp_path / "a")
    assert first.epoch != restarted.epoch
    assert SimulatedDevice(seed=7, flash_dir=tmp_path / "b").epoch == first.epoch, \
        "same seed, fresh flash directory: reproducible"
    epochs = {restarted.epoch}
    for _ in range(5):
        restarted.reboot(0.0)
        epochs.add(restarted.epoch)
    assert len(epochs) == 6


def test_a_seeded_device_without_flash_is_still_reproducible_in_process() -> None:
    a, b = SimulatedDevice(seed=3), SimulatedDevice(seed=3)
    a.reboot(1.0)
    b.reboot(1.0)
    assert a.epochs == b.epochs


def _epoch_of_cli_sim(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    seen: list[int] = []

    def fake_serve(device: Any, transport: Any, stop: threading.Event, **_: Any) -> None:
        seen.append(device.epoch)

    monkeypatch.setattr(serve_mod, "serve", fake_serve)
    assert main(["sim", *argv]) == 0
    return seen[0]


def test_cli_sim_with_a_seed_and_no_flash_draws_a_new_epoch_per_process(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    first = _epoch_of_cli_sim(["--seed", "5"], monkeypatch)
    second = _epoch_of_cli_sim(["--seed", "5"], monkeypatch)
    assert first != second


def test_cli_sim_with_a_seed_and_flash_dir_draws_a_new_epoch_per_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--seed", "5", "--flash-dir", str(tmp_path)]
    assert _epoch_of_cli_sim(argv, monkeypatch) != _epoch_of_cli_sim(argv, monkeypatch)


def _hostile(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse":
        with path.open("wb") as f:
            f.truncate(3 << 30)
    else:
        target = tmp_path / "elsewhere.json"
        target.write_text(ConfigSnapshot(((4, 500),), 1).to_json())
        path.symlink_to(target)


@pytest.mark.parametrize("kind", ["fifo", "sparse", "symlink"])
@pytest.mark.parametrize("mode", [[], ["--modbus-rtu"]])
def test_a_hostile_config_file_is_refused_in_one_line(
        kind: str, mode: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flash = tmp_path / "flash"
    flash.mkdir()
    config = flash / "config.json"
    _hostile(kind, config, tmp_path)
    before = sorted(os.listdir(flash))
    assert main(["sim", *mode, "--flash-dir", str(flash)]) == EXIT_LOCAL_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused" in err and "Traceback" not in err
    assert sorted(os.listdir(flash)) == before, "nothing created, nothing replaced"
    assert config.is_symlink() if kind == "symlink" else config.exists()


def test_flash_refusals_are_typed(tmp_path: Path) -> None:
    flash = ConfigFlash(tmp_path)
    (tmp_path / "boots").write_text("many\n")
    with pytest.raises(UnsafeFlashFileError):
        flash.count_boot()
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(UnsafeFlashFileError, match="FIFO"):
        flash.load()
