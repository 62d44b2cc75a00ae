"""Key files and variables (issue 23): private files only, one-line refusals that never show key
material, the simulator keeping its keys in its flash and a factory reset erasing them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.flash import ConfigFlash
from idemlink.protocol.key_file import (
    KeyFileError,
    key_from_environment,
    read_key_file,
)
from idemlink.protocol.outcome import IdemlinkError

KEY = bytes(range(32))
OLD = bytes(range(1, 33))


def key_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "k"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_private_file_gives_its_keys_current_first(tmp_path: Path) -> None:
    path = key_file(tmp_path, f"# rotation\n{KEY.hex()}\n{OLD.hex()}  # until 2027-01-01\n")
    assert read_key_file(path) == (KEY, OLD)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620])
def test_a_group_or_world_accessible_file_is_refused_unread(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, KEY.hex(), mode)
    with pytest.raises(KeyFileError, match="0600 or stricter") as info:
        read_key_file(path)
    assert isinstance(info.value, IdemlinkError) and "\n" not in str(info.value)
    assert KEY.hex() not in str(info.value)


@pytest.mark.parametrize("text", ["zz" * 32, KEY.hex()[:-2], "", KEY.hex() + "\n" * 2 + "00"])
def test_bad_content_is_refused_without_showing_it(tmp_path: Path, text: str) -> None:
    with pytest.raises(KeyFileError) as info:
        read_key_file(key_file(tmp_path, text))
    assert KEY.hex()[:16] not in str(info.value)


def test_environment(tmp_path: Path) -> None:
    path = key_file(tmp_path, KEY.hex())
    assert key_from_environment({"IDEMLINK_KEY_FILE": str(path)}) == KEY
    assert key_from_environment({"IDEMLINK_KEY": KEY.hex()}) == KEY
    assert key_from_environment({}) is None
    with pytest.raises(KeyFileError, match="keep one"):
        key_from_environment({"IDEMLINK_KEY": KEY.hex(), "IDEMLINK_KEY_FILE": str(path)})
    with pytest.raises(KeyFileError, match="no such key file"):
        key_from_environment({"IDEMLINK_KEY_FILE": str(tmp_path / "absent")})


def test_the_simulator_keeps_its_keys_and_a_factory_reset_erases_them(tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    sim = SimulatedDevice(seed=1, flash_dir=flash, keys=(KEY,))
    assert sim.keyed and os.stat(flash / "keys").st_mode & 0o777 == 0o600
    assert KEY.hex() not in repr(sim.session.auth)
    again = SimulatedDevice(seed=1, flash_dir=flash)
    assert again.keyed  # provisioned once, kept like configuration
    ConfigFlash(flash).factory_reset()
    assert not SimulatedDevice(seed=1, flash_dir=flash).keyed
