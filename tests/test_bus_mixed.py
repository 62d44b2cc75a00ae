"""Mixed buses (issue 22 items 2 and 7, docs/BUS.md "Mixed buses", docs/SOAK.md "On a bus"):
the posix C device and the QEMU device as processes on the simulated half-duplex medium beside
simulated devices.

- Per-device faults apply to a device in another process as to a simulated one: through its
  own lossy ears and mouth every write runs once, judged from the C device's effects file.
- ``idemlink sim --bus 3 --c-devices 1``: one pty, every address answers; SIGTERM stops the
  C processes too.
- ``soak --bus`` with C devices (the real clock): 10 % loss, single-device reboots (a C reboot
  restarts its process on its flash directory), one device dead for a stretch, broadcasts:
  0 duplicated effects, 0 lost acknowledged writes, 0 misclassified per device, each judged from
  its own record. Default: 2 + 2 devices, 40 commands; a mutant C record (a broadcast run twice)
  is caught. Slow: 4 + 4 devices, 2,000 commands; and a leg with the QEMU micro:bit device.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import firmware
from support.timing import read_line, scaled

from idemlink.bus_campaign import BusCampaignConfig, _ProcessMember, run_bus_campaign
from idemlink.device_sim.bus import Bus as Medium
from idemlink.device_sim.bus import BusConfig, LiveBusTransport
from idemlink.device_sim.bus_station import ProcessStation, c_device_command
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.host.bus import Bus
from idemlink.oracle import Record, Run
from idemlink.protocol.outcome import Outcome


def test_a_c_device_on_the_medium_hears_and_speaks_through_its_own_faults(
        device_bin: Path, tmp_path: Path) -> None:
    station = ProcessStation(c_device_command(device_bin), 2, tmp_path / "c")
    try:
        now = time.monotonic()
        lossy = LinkConfig(baud=None, latency=0.0, frame_loss=0.3, frame_dup=0.2, seed=4)
        medium = Medium([SimulatedDevice(seed=1, address=1, now=now), station], BusConfig(),
                        faults={2: lossy}, start=now)
        with Bus(LiveBusTransport(medium), timeout=0.05, attempts=12) as bus:
            results = [bus.device(2).write({"threshold": 300 + i}) for i in range(8)]
            assert [r.outcome for r in results] == [Outcome.OK] * 8
            assert bus.device(1).write({"threshold": 1}).ok
            assert bus.device(2).read("threshold").values == (307,)
        m = medium.members[2]
        assert m.ears.stats.faults > 0 and m.mouth.stats.faults > 0
    finally:
        station.close()
    runs = [json.loads(line) for line in station.effects.read_text().splitlines()
            if '"seq"' in line]
    writes = [r for r in runs if r["request"].startswith("06")]
    assert len(writes) == 8 and len({r["seq"] for r in writes}) == 8  # each once


def test_sim_serves_a_mixed_bus_on_one_pty(device_bin: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemlink", "sim", "--bus", "3", "--c-devices", "1",
         "--c-binary", str(device_bin)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    children: list[int] = []
    try:
        assert proc.stdout is not None
        path = read_line(proc.stdout, proc)
        with Bus.open(path, timeout=0.2) as bus:
            for a in (1, 2, 3):
                assert bus.device(a).write({"mode": 2}).ok
            info1, info3 = bus.device(1).session.info, bus.device(3).session.info
            assert info1 is not None and info1.name == "idemlink-sim-1"
            assert info3 is not None and info3.name == "idemlink-c"  # the C device is last
        children = [int(p) for p in subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True,
            check=False).stdout.split()]
        assert len(children) == 1  # the C device's process
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=scaled(20))
    assert proc.returncode == 0, err
    for pid in children:  # stopped with the simulator
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def _mixed(device_bin: Path, **kw: object) -> BusCampaignConfig:
    base: dict[str, object] = dict(devices=4, commands=40, c_devices=2, c_binary=str(device_bin),
                                   seed=1, reboot_every=8, broadcast_every=5)
    base.update(kw)
    return BusCampaignConfig(**base)  # type: ignore[arg-type]


def test_the_mixed_bus_soak_passes_per_device(device_bin: Path) -> None:
    report = run_bus_campaign(_mixed(device_bin))
    assert report.passed, report.verdict()
    assert report.commands == 40 and report.dead_stretch is not None
    c_reboots = sum(report.devices[a].reboots for a in (3, 4))
    assert c_reboots > 0 and report.broadcasts > 0
    assert report.broadcast_executions > 0
    assert report.config["loss"] == 0.1


def test_a_c_device_record_with_a_broadcast_run_twice_fails(device_bin: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    original = _ProcessMember.records

    def twice(self: _ProcessMember) -> list[Record]:
        got = original(self)
        return got + [r for r in got if isinstance(r, Run) and r.epoch == 0]

    monkeypatch.setattr(_ProcessMember, "records", twice)
    report = run_bus_campaign(_mixed(device_bin, commands=16, reboot_every=0, dead=None,
                                     broadcast_every=3))
    assert report.broadcasts > 0
    assert not report.passed
    assert sum(report.devices[a].duplicated_effects for a in (3, 4)) > 0
    assert all(report.devices[a].passed for a in (1, 2))


@pytest.mark.slow
def test_the_mixed_bus_soak_of_2000_commands(device_bin: Path) -> None:
    report = run_bus_campaign(_mixed(device_bin, devices=8, commands=2000, c_devices=4,
                                     reboot_every=60, broadcast_every=25, seed=7))
    assert report.passed, report.verdict()
    assert sum(report.devices[a].reboots for a in range(5, 9)) > 0
    assert report.dead_stretch is not None and report.broadcast_executions > 0


@pytest.mark.slow
def test_the_mixed_bus_soak_with_a_qemu_device(device_bin: Path) -> None:
    firmware.make_once("qemu-device-m0", "IDL_OPTS=-DIDL_BUS=1", "BUILD=build/bus",
                       tools=("arm-none-eabi-gcc", "qemu-system-arm"))
    elf = firmware.BUILD / "bus" / "qemu-microbit" / "idemlink-device.elf"
    cfg = _mixed(device_bin, commands=200, c_devices=1, qemu_devices=1, qemu_board="microbit",
                 qemu_tool=str(firmware.QEMU_TOOL), qemu_elf=str(elf), seed=3)
    assert "--board microbit" in cfg.commands_of_processes()[-1][1]  # the last address
    report = run_bus_campaign(cfg)
    assert report.passed, report.verdict()
