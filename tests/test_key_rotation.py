"""Key rotation with a stated window, provisioning only while the button is held, factory reset
(issue 23 item 4): the simulator on a simulated clock, a host holding the old key, the new one or
both; the window counted in authenticated sessions (docs/SECURITY.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from idemlink.device_sim.control import ControlError
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.provisioning import provisioning_line
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice
from idemlink.protocol.auth import key_id
from idemlink.protocol.frame import Frame, FrameType, decode_frames
from idemlink.protocol.key_rotation import (
    BUTTON_TABLE,
    ButtonEvent,
    ButtonState,
    KeyRing,
    ProvisioningRefused,
)
from idemlink.protocol.outcome import Outcome

OLD = bytes(range(32))
NEW = bytes(range(1, 33))
THIRD = bytes(range(2, 34))


def session(sim: SimulatedDevice, key: bytes | tuple[bytes, ...], *, write: bool = True,
            value: int = 1) -> Device:
    """One host session (HELLO, and a write unless told otherwise) on the device's clock."""
    dev = Device(SimTransport(sim), timeout=0.02, attempts=3, key=key)
    dev.connect()
    if write:
        assert dev.write({"mode": value % 3}).outcome is Outcome.OK
    return dev


def test_the_ring_counts_sessions_and_drops_the_old_key_at_the_end() -> None:
    ring = KeyRing((OLD,)).provision(NEW, 2)
    assert ring.keys == (NEW, OLD) and ring.accepted() == (NEW, OLD)
    ring = ring.session_used()
    assert ring.old_sessions_left == 1 and ring.accepted() == (NEW, OLD)
    ring = ring.session_used()
    assert ring.keys == (NEW,) and ring.accepted() == (NEW,)
    again = KeyRing.from_lines((NEW, OLD), KeyRing((NEW, OLD), 7).to_lines())
    assert again == KeyRing((NEW, OLD), 7)
    assert OLD.hex() not in repr(ring) and NEW.hex() not in repr(KeyRing((NEW, OLD), 3))
    with pytest.raises(ProvisioningRefused):
        KeyRing((OLD,)).provision(NEW, -1)


def test_provisioning_and_reset_need_the_button_held() -> None:
    assert [k for k, (_, ok) in BUTTON_TABLE.items() if not ok] == [
        (ButtonState.RELEASED, ButtonEvent.PROVISION),
        (ButtonState.RELEASED, ButtonEvent.FACTORY_RESET)]
    sim = SimulatedDevice(seed=1, keys=(OLD,))
    epochs = list(sim.epochs)
    with pytest.raises(ProvisioningRefused, match="button held"):
        sim.provision_key(NEW, 0.0)
    with pytest.raises(ProvisioningRefused, match="button held"):
        sim.factory_reset(0.0)
    assert sim.key_ring == KeyRing((OLD,)) and sim.epochs == epochs and sim.button.refused == 2


def test_rotation_old_and_new_key_work_for_the_stated_window_then_the_old_is_refused(
        tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    sim = SimulatedDevice(seed=2, flash_dir=flash, keys=(OLD,))
    session(sim, OLD)
    sim.press_button()
    sim.provision_key(NEW, sim.core.now + 1, window=3)
    sim.release_button()
    # a HELLO alone (no request: anyone can send one) spends nothing of the window
    for _ in range(5):
        session(sim, OLD, write=False)
    assert sim.key_ring is not None and sim.key_ring.old_sessions_left == 3
    assert session(sim, OLD).ops.key_id == key_id(OLD)  # 1: the old key still works
    assert session(sim, NEW).ops.key_id == key_id(NEW)  # 2: so does the new one
    # a host holding both (new first) uses the new; the device's restart keeps the count
    sim = SimulatedDevice(seed=2, flash_dir=flash)
    assert sim.key_ring is not None and sim.key_ring.old_sessions_left == 1
    assert session(sim, (NEW, OLD)).ops.key_id == key_id(NEW)  # 3: the window closes
    with pytest.raises(IncompatibleDevice, match="key id"):
        session(sim, OLD)
    runs = len(sim.executions)
    assert session(sim, (OLD, NEW)).ops.key_id == key_id(NEW)  # a host holding both moves on
    assert len(sim.executions) == runs + 1
    assert SimulatedDevice(seed=2, flash_dir=flash).key_ring == KeyRing((NEW,))
    assert os.stat(flash / "keys").st_mode & 0o777 == 0o600


def test_factory_reset_erases_keys_configuration_and_files_and_nothing_old_replays(
        tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    sim = SimulatedDevice(seed=3, flash_dir=flash, keys=(OLD,))
    default = sim.core.value("threshold")
    (sim.files_dir / "fw.bin").write_bytes(b"x")
    tap: list[bytes] = []

    class Tap(SimTransport):
        def write(self, data: bytes) -> None:
            tap.append(data)
            super().write(data)

    dev = Device(Tap(sim), timeout=0.02, key=OLD)
    dev.connect()
    assert dev.write({"threshold": default + 7}).outcome is Outcome.OK
    before = list(sim.epochs)
    sim.press_button()
    sim.factory_reset(sim.core.now + 1)
    assert not sim.keyed and sim.core.value("threshold") == default
    assert not (flash / "keys").exists() and not (sim.files_dir / "fw.bin").exists()
    assert sim.epoch not in before
    # every frame the old host sent, replayed after the reset: nothing runs
    runs = len(sim.executions)
    requests = [f for chunk in tap for f in decode_frames(chunk)
                if isinstance(f, Frame) and f.type is FrameType.REQUEST]
    assert requests
    for chunk in tap:
        sim.receive_data(chunk, sim.core.now + 2)
        sim.data_to_send()
    assert len(sim.executions) == runs and sim.core.value("threshold") == default
    again = SimulatedDevice(seed=3, flash_dir=flash)
    assert not again.keyed and again.epochs[0] not in before


def test_control_lines_provision_only_with_the_button(tmp_path: Path) -> None:
    path = tmp_path / "new.key"
    path.write_text(NEW.hex() + "\n")
    path.chmod(0o600)
    sim = SimulatedDevice(seed=4, keys=(OLD,))
    assert not provisioning_line(sim, "input 1 2", 0.0)
    with pytest.raises(ControlError, match="button held"):
        provisioning_line(sim, f"provision-key {path}", 0.0)
    assert sim.key_ring == KeyRing((OLD,))
    path.chmod(0o644)
    provisioning_line(sim, "button press", 0.0)
    with pytest.raises(ControlError, match="0600") as refused:
        provisioning_line(sim, f"provision-key {path} 5", 0.0)
    assert NEW.hex() not in str(refused.value)
    path.chmod(0o600)
    provisioning_line(sim, f"provision-key {path} 5", 0.0)
    assert sim.key_ring == KeyRing((NEW, OLD), 5)
    provisioning_line(sim, "button release", 0.0)
    with pytest.raises(ControlError, match="button held"):
        provisioning_line(sim, "factory-reset", 0.0)
    assert sim.keyed


def test_idemlink_sim_provisions_through_its_control_fifo(tmp_path: Path) -> None:
    """The real CLI: a keyed simulator, its FIFO, a refused step and an accepted one, each said
    in one stderr line (the readiness signal), then a host on the new key."""
    old_file, new_file = tmp_path / "old.key", tmp_path / "new.key"
    for p, k in ((old_file, OLD), (new_file, NEW)):
        p.write_text(k.hex() + "\n")
        p.chmod(0o600)
    fifo = tmp_path / "control"
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--flash-dir",
                             str(tmp_path / "flash"), "--key-file", str(old_file),
                             "--control", str(fifo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        port = proc.stdout.readline().strip()
        with open(fifo, "w") as control:
            control.write(f"provision-key {new_file} 2\n")
            control.flush()
            refused = proc.stderr.readline()
            assert "button held" in refused and NEW.hex() not in refused
            control.write(f"button press\nprovision-key {new_file} 2\nbutton release\n")
            control.flush()
            done = proc.stderr.readline()
        assert "provision-key done" in done and f"{key_id(NEW):08x}" in done, done
        assert NEW.hex() not in done and OLD.hex() not in done
        with Device.open(port, key=new_file, timeout=0.5) as dev:
            assert dev.ops.authenticated and dev.ops.key_id == key_id(NEW)
            assert dev.write({"mode": 2}).outcome is Outcome.OK
    finally:
        proc.terminate()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
