"""The keyed C device on POSIX (issue 23, docs/SECURITY.md): ``idemlink-device --key-file F``
(``make device`` builds IDL_AUTH=1 in) driven by the keyed host: writes, reads and a trigger run
signed; an unkeyed host's request is answered AUTHENTICATION_REQUIRED and never runs; a host with
another key refuses the device (no downgrade); ``idemlink info`` says "authenticated: yes, key id
…"; a key file that group or others can read is refused in one line, before the device serves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import firmware

from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice
from idemlink.protocol.auth import key_id
from idemlink.protocol.outcome import Outcome, Status

KEY = bytes(range(1, 33))
OTHER = bytes(range(33, 65))


def _key_file(path: Path, *keys: bytes, mode: int = 0o600) -> Path:
    path.write_text("".join(k.hex() + "\n" for k in keys), encoding="ascii")
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def device_bin() -> Path:
    return firmware.device_binary()


def test_the_keyed_c_device_runs_signed_commands_and_refuses_the_rest(device_bin: Path,
                                                                     tmp_path: Path) -> None:
    keys = _key_file(tmp_path / "key", KEY)
    flash = tmp_path / "flash"
    flash.mkdir()
    dev = firmware.RunningDevice(device_bin, flash, "--key-file", str(keys))
    try:
        with Device.open(dev.path, key=keys, timeout=0.3) as d:
            d.connect()
            info = d.session.info
            assert info is not None and info.key_id == key_id(KEY)
            assert d.write({"mode": 2}).ok
            assert d.read("mode").values == (2,)
            assert d.trigger().code == 0
        with Device.open(dev.path, timeout=0.2, attempts=2) as d:  # an unkeyed host
            r = d.write({"mode": 3})
            assert (r.outcome, r.status) == (Outcome.NOT_EXECUTED,
                                              Status.AUTHENTICATION_REQUIRED)
        with pytest.raises(IncompatibleDevice, match="key id"), \
                Device.open(dev.path, key=OTHER, timeout=0.2, attempts=2) as d:
            d.connect()
        with Device.open(dev.path, key=KEY, timeout=0.3) as d:
            assert d.read("mode").values == (2,)  # the unkeyed write never ran
        out = subprocess.run([sys.executable, "-m", "idemlink", "info", "--port", dev.path,
                              "--key-file", str(keys)], capture_output=True, text=True,
                             timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert f"yes, key id {key_id(KEY):08x}" in out.stdout
        assert KEY.hex() not in out.stdout + out.stderr
    finally:
        stats = dev.stop()
    assert stats["executed"] == 4 and stats["unauthenticated"] >= 1


def test_a_key_file_others_can_read_is_refused_in_one_line(device_bin: Path,
                                                          tmp_path: Path) -> None:
    for mode in (0o644, 0o640, 0o604):
        keys = _key_file(tmp_path / f"key{mode:o}", KEY, mode=mode)
        proc = subprocess.run([str(device_bin), "--key-file", str(keys)], capture_output=True,
                              text=True, timeout=10, check=False)
        assert proc.returncode == 1 and "0600" in proc.stderr and "refused" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and KEY.hex() not in proc.stderr
    bad = tmp_path / "bad"
    bad.write_text("zz\n", encoding="ascii")
    os.chmod(bad, 0o600)
    proc = subprocess.run([str(device_bin), "--key-file", str(bad)], capture_output=True,
                          text=True, timeout=10, check=False)
    assert proc.returncode == 1 and "line 1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
