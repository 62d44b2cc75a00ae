"""The C device (firmware_ref/) as the device under test of ``idemlink soak --device-cmd``.

- The posix build's ``--effects FILE`` writes the record the simulator's ``--effects`` writes (the
  same keys in the same order, hex PDUs, a boot line before serving, one line per execution and
  none for a replay), appended across restarts; ``--effects`` and ``--trigger-duration`` are
  refused like the simulator's, and a trigger runs for the given duration as ``DeviceCore``'s.
- The soak: 20,000 commands against the posix device (10 % frame loss, 2 % duplication and
  corruption each way, reboots every ~500 commands, host-process crashes every ~250), and 2,000
  against the firmware on QEMU's Cortex-M3 and on QEMU's micro:bit (Cortex-M0) through
  ``firmware_ref/tools/qemu-device`` (a reboot is QEMU stopped and started again, the
  configuration kept through semihosting); each must PASS
  with 0 duplicated effects, 0 lost acknowledged writes, 0 misclassified. Those two campaigns
  are ``slow`` (``--run-slow``); the default run soaks each device with a few hundred commands
  and reboots and host crashes more often, so every kind of event still happens.

The line between host and device is a real-time pty proxy with the emulator's faults but no baud
pacing or latency, and the host retries quickly (``_fast``, ``POSIX_RETRY``, ``QEMU_RETRY``): a
C device answers in well under a millisecond, so the run's time is spent waiting out lost frames,
and a retry sent too early is answered by replay (harmless; counted as a retry). The retry
timeouts are real time, so they scale with the machine (``support.timing.scaled``): a host that
gives up on HELLO while a loaded machine has not yet scheduled the device (or QEMU) fails the
run for nothing. Builds with make (once per session, ``support.firmware``); skips when make or a
C compiler (or, for QEMU, arm-none-eabi-gcc or qemu-system-arm) is missing.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import serial
from support import firmware
from support.firmware import QEMU_TOOL
from support.timing import read_line, scaled

from idemlink.campaign import CampaignConfig, CampaignReport
from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.device import Device
from idemlink.oracle import Boot, Run, parse_effects_line
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.soak_device import run_device_campaign

TRIGGER_S = 0.05
POSIX_RETRY = 0.01
"""Seconds (before ``scaled``) the host waits for the posix device: it answers in well under a
millisecond, so this is scheduling margin; 21 HELLO rounds of 6 attempts span 1.3 s idle."""
QEMU_RETRY = 0.05
"""The same for the firmware on QEMU: an emulator's UART and a restarted QEMU need more."""


def _fast(commands: int, seed: int, reboot_every: int = 500,
          restart_every: int = 250) -> CampaignConfig:
    """The soak's defaults (faults, reboots, host crashes) on an unpaced line."""
    return CampaignConfig(commands=commands, seed=seed, reboot_every=reboot_every,
                          restart_every=restart_every, baud=None, latency=0.0, max_batch=8,
                          trigger_duration=TRIGGER_S)


def _start(argv: list[str], cwd: Path | None = None,
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env)
    return proc, read_line(proc.stdout, proc)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=scaled(10))
    assert proc.returncode == 0, err
    return err


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _simulator_keys(tmp_path: Path) -> tuple[list[str], list[str]]:
    """The keys, in order, of the simulator's boot line and execution line."""
    effects = tmp_path / "sim-effects.jsonl"
    sim = SimulatedDevice(seed=1, effects=effects)
    sim.receive_data(encode_frame(FrameType.REQUEST, 1, sim.epoch, bytes.fromhex("0300040001")),
                     0.5)
    sim.close()
    boot, run = _lines(effects)
    return list(boot), list(run)


def test_the_effects_file_is_the_simulators_record(device_bin: Path, tmp_path: Path) -> None:
    effects = tmp_path / "effects.jsonl"
    argv = [str(device_bin), "--flash-dir", str(tmp_path / "flash"), "--effects", str(effects),
            "--stats"]
    proc, port = _start(argv)
    try:
        with Device.open(port) as dev:
            epoch = dev.session.epoch
            assert dev.read("threshold").values == (350,)
            assert dev.write({"threshold": 420}).ok
            assert dev.write_if_generation(99, {"threshold": 1}).code is not None
            assert dev.trigger().code == 0
    finally:
        err = _stop(proc)
    executed = int(err.split("executed=")[1].split()[0])
    boot_keys, run_keys = _simulator_keys(tmp_path)
    lines = _lines(effects)
    assert list(lines[0]) == boot_keys and lines[0]["boot"] == epoch
    runs = lines[1:]
    assert len(runs) == executed == 4 and all(list(r) == run_keys for r in runs)
    records = [parse_effects_line(line) for line in effects.read_text().splitlines()]
    assert isinstance(records[0], Boot)
    assert all(isinstance(r, Run) and r.epoch == epoch for r in records[1:])
    requests = [r.request.hex() for r in records[1:] if isinstance(r, Run)]
    assert [requests[i] for i in (0, 1, 3)] == ["0300040001", "06000401a4", "4200080001"]
    assert requests[2].startswith("41")  # the conditional write, refused by its guard
    assert [r.response.hex() for r in records[1:] if isinstance(r, Run)][:2] == [
        "0302015e", "06000401a4"]
    times = [r.time for r in records]
    assert times == sorted(times) and 0 <= times[0] < 5
    proc, _ = _start(argv)  # a restart appends a new boot
    _stop(proc)
    again = _lines(effects)
    assert again[:5] == lines and list(again[5]) == boot_keys and again[5]["boot"] != epoch


def test_a_retransmission_answered_by_replay_is_not_an_execution(device_bin: Path,
                                                                 tmp_path: Path) -> None:
    effects = tmp_path / "effects.jsonl"
    proc, port = _start([str(device_bin), "--effects", str(effects)])
    try:
        with Device.open(port) as dev:
            epoch = dev.session.epoch
        line = serial.Serial(port, timeout=0.5)
        try:
            frame = encode_frame(FrameType.REQUEST, 5000, epoch, struct.pack(">BHH", 6, 4, 400))
            for _ in range(3):
                line.write(frame)
                assert line.read_until(b"\x00") == b"\x00"  # the leading delimiter
                line.read_until(b"\x00")
        finally:
            line.close()
    finally:
        _stop(proc)
    runs = [parse_effects_line(x) for x in effects.read_text().splitlines()][1:]
    assert [(r.seq, r.request.hex()) for r in runs if isinstance(r, Run)] == [(5000, "0600040190")]


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--effects", "/nonexistent/dir/effects.jsonl"], 1, "--effects /nonexistent/dir/effects.jsonl"),
    (["--modbus-rtu", "--effects", "e.jsonl"], 1, "does not apply to --modbus-rtu"),
    (["--trigger-duration", "-1"], 1, "must be a finite number of seconds >= 0"),
    (["--trigger-duration", "inf"], 1, "must be a finite number of seconds >= 0"),
    (["--trigger-duration", "nan"], 1, "must be a finite number of seconds >= 0"),
    (["--trigger-duration", "soon"], 2, "is not a number"),
])
def test_bad_effects_or_trigger_duration_is_one_line_like_the_sim(
        device_bin: Path, tmp_path: Path, args: list[str], code: int, says: str) -> None:
    r = subprocess.run([str(device_bin), *args], capture_output=True, text=True, timeout=10,
                       check=False, cwd=tmp_path)
    assert r.returncode == code and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert r.stdout == "" and not (tmp_path / "e.jsonl").exists()


def test_a_trigger_runs_for_the_trigger_duration_like_device_core(device_bin: Path,
                                                                   tmp_path: Path) -> None:
    duration = round(scaled(0.3), 3)  # the read below must land in its first half
    core = DeviceCore(DEFAULT_MAP, trigger_duration=duration)
    proc, port = _start([str(device_bin), "--trigger-duration", str(duration)])
    try:
        with Device.open(port) as dev:
            assert dev.trigger().code == 0
            t0 = time.monotonic()
            core.execute(struct.pack(">BHH", 0x42, 8, 1), 0.0)
            running = dev.read("self_clean").values
            assert time.monotonic() - t0 < duration / 2
            expected_running = core.value("self_clean")
            time.sleep(duration + 0.1)  # the stimulus: the trigger's duration passes
            core.tick(duration + 0.1)
            assert (running, dev.read("self_clean").values) == (
                (expected_running,), (core.value("self_clean"),)) == ((1,), (2,))
    finally:
        _stop(proc)


def _assert_passed(rep: CampaignReport, commands: int) -> None:
    assert rep.passed, rep.problems[:5]
    assert rep.commands == commands and not rep.interrupted
    assert (rep.duplicated_effects, rep.lost_acknowledged_writes, rep.misclassified,
            rep.register_semantics) == (0, 0, 0, 0)
    assert rep.executions > 0.9 * commands and rep.retries > 0 and rep.replays > 0


def test_the_posix_device_passes_a_500_command_soak(device_bin: Path) -> None:
    """The 20,000-command soak below in small: reboots and host crashes every ~100 commands."""
    template = (f"{device_bin} --port {{port}} --flash-dir {{flash}} --effects {{effects}} "
                f"--trigger-duration {TRIGGER_S}")
    cfg = _fast(500, seed=11, reboot_every=100, restart_every=100)
    rep = run_device_campaign(cfg, template, retry_timeout=scaled(POSIX_RETRY))
    _assert_passed(rep, 500)
    assert rep.config["loss"] == 0.1 and rep.reboots >= 2 and rep.host_restarts >= 2


@pytest.mark.slow
def test_the_posix_device_passes_a_20000_command_soak(device_bin: Path) -> None:
    template = (f"{device_bin} --port {{port}} --flash-dir {{flash}} --effects {{effects}} "
                f"--trigger-duration {TRIGGER_S}")
    cfg = _fast(20_000, seed=11)
    t0 = time.monotonic()
    rep = run_device_campaign(cfg, template, retry_timeout=scaled(POSIX_RETRY))
    _assert_passed(rep, 20_000)
    assert rep.config["loss"] == 0.1 and rep.reboots >= 20 and rep.host_restarts >= 40
    print(f"\nposix soak: {time.monotonic() - t0:.1f} s, {rep.verdict()}", file=sys.stderr)


def test_the_documented_template_passes_with_the_devices_own_trigger_duration(
        device_bin: Path) -> None:
    """No --trigger-duration in the template: the device runs its default 5 s triggers, the soak
    assumes its own 0.05 s, and the boot line's declared duration settles it (the oracle judges
    by the device's record, not by what the soak was told)."""
    template = f"{device_bin} --port {{port}} --flash-dir {{flash}} --effects {{effects}}"
    cfg = _fast(500, seed=13, reboot_every=100)
    rep = run_device_campaign(cfg, template, retry_timeout=scaled(POSIX_RETRY))
    _assert_passed(rep, 500)


def _qemu_template(qemu_elf: Path, board: str = "mps2") -> str:
    return (f"{sys.executable} {QEMU_TOOL} --board {board} --elf {qemu_elf} --port {{port}} "
            f"--flash-dir {{flash}} --effects {{effects}} --trigger-duration {TRIGGER_S}")


@pytest.fixture(scope="session")
def qemu_m0_elf() -> Path:
    """The C device for QEMU's micro:bit (Cortex-M0): ``make qemu-device BOARD=microbit``."""
    return firmware.qemu_m0_device_elf()


@pytest.mark.slow  # default-suite budget; see CONTRIBUTING.md's slow/default table
def test_the_qemu_device_passes_a_200_command_soak(qemu_elf: Path) -> None:
    """The 2,000-command soak below in small: QEMU (each boot about a second) restarted every
    ~70 commands."""
    cfg = _fast(200, seed=12, reboot_every=100, restart_every=70)
    rep = run_device_campaign(cfg, _qemu_template(qemu_elf), retry_timeout=scaled(QEMU_RETRY))
    _assert_passed(rep, 200)
    assert rep.reboots >= 1


@pytest.mark.slow
def test_the_qemu_device_passes_a_2000_command_soak(qemu_elf: Path) -> None:
    cfg = _fast(2_000, seed=12, reboot_every=200)
    t0 = time.monotonic()
    rep = run_device_campaign(cfg, _qemu_template(qemu_elf), retry_timeout=scaled(QEMU_RETRY))
    _assert_passed(rep, 2_000)
    assert rep.reboots >= 5
    print(f"\nqemu soak: {time.monotonic() - t0:.1f} s, {rep.verdict()}", file=sys.stderr)


def test_the_m0_qemu_device_passes_a_200_command_soak(qemu_m0_elf: Path) -> None:
    """The whole device on a Cortex-M0 (QEMU's micro:bit): the 2,000-command soak below in
    small, with reboots and host crashes as often as the Cortex-M3's short soak."""
    cfg = _fast(200, seed=14, reboot_every=100, restart_every=70)
    rep = run_device_campaign(cfg, _qemu_template(qemu_m0_elf, "microbit"),
                              retry_timeout=scaled(QEMU_RETRY))
    _assert_passed(rep, 200)
    assert rep.reboots >= 1


@pytest.mark.slow
def test_the_m0_qemu_device_passes_a_2000_command_soak(qemu_m0_elf: Path) -> None:
    cfg = _fast(2_000, seed=14, reboot_every=200)
    t0 = time.monotonic()
    rep = run_device_campaign(cfg, _qemu_template(qemu_m0_elf, "microbit"),
                              retry_timeout=scaled(QEMU_RETRY))
    _assert_passed(rep, 2_000)
    assert rep.reboots >= 5
    print(f"\nqemu m0 soak: {time.monotonic() - t0:.1f} s, {rep.verdict()}", file=sys.stderr)


@pytest.mark.parametrize(("board", "config_file"), [("mps2", "idemlink-config.bin"),
                                                    ("microbit", "idemlink-flash.bin")])
def test_qemu_device_tool_prints_the_port_first_and_stops_on_sigterm(
        board: str, config_file: str, qemu_elf: Path, qemu_m0_elf: Path, tmp_path: Path) -> None:
    """Either board: the port first, a stop by request (the frame in hand finished: the effect
    and its record), the counters with --stats (one configuration save for one write), and the
    device id kept in the flash directory: another start there is the same device."""
    effects = tmp_path / "effects.jsonl"
    flash = tmp_path / "flash"
    elf = qemu_elf if board == "mps2" else qemu_m0_elf
    ids = []
    for _ in range(2):
        proc, port = _start([sys.executable, str(QEMU_TOOL), "--board", board, "--elf", str(elf),
                             "--flash-dir", str(flash), "--effects", str(effects),
                             "--trigger-duration", "0.2", "--stats"])
        try:
            assert port.startswith("/dev/pts/")
            with Device.open(port, timeout=scaled(0.5)) as dev:
                assert dev.info is not None
                ids.append(dev.info.device_id)
                if len(ids) == 1:
                    assert dev.write({"threshold": 430}).ok
                    epoch = dev.session.epoch
        finally:
            err = _stop(proc)
        saves = re.search(r"qemu-device: stopped: flash_writes=(\d+)", err)
        assert saves is not None and int(saves.group(1)) == (1 if len(ids) == 1 else 0), err
    assert ids[0] == ids[1] == (flash / "device_id").read_text().strip()
    assert ids[0].startswith(f"qemu-{board}-")
    records = [parse_effects_line(x) for x in effects.read_text().splitlines()]
    assert records[0] == Boot(epoch, records[0].time, 0.2)
    assert [(r.request.hex(), r.response.hex()) for r in records[1:] if isinstance(r, Run)] == [
        ("06000401ae", "06000401ae")]
    assert sorted(p.name for p in flash.iterdir()) == sorted([config_file, "device_id"])


def test_qemu_device_tool_without_a_flash_dir_writes_nowhere_and_each_instance_is_a_device(
        qemu_m0_elf: Path, tmp_path: Path) -> None:
    """No --flash-dir: a temporary one, deleted at exit; nothing lands in the working directory;
    two instances at once advertise two device ids (the host's journals keep them apart)."""
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    started = [_start([sys.executable, str(QEMU_TOOL), "--board", "microbit", "--elf",
                       str(qemu_m0_elf)], cwd=work, env=env) for _ in range(2)]
    ids = []
    try:
        for _, port in started:
            with Device.open(port, timeout=scaled(0.5)) as dev:
                assert dev.info is not None
                ids.append(dev.info.device_id)
                assert dev.write({"mode": 2}).ok
    finally:
        for proc, _ in started:
            _stop(proc)
    assert ids[0] != ids[1] and all(i.startswith("qemu-microbit-") for i in ids)
    assert list(work.iterdir()) == [] and list(tmp.iterdir()) == []


@pytest.mark.parametrize(("args", "says"), [
    (["--trigger-duration", "-1"], "must be a finite number of seconds >= 0"),
    (["--effects", "/nonexistent/dir/effects.jsonl"], "--effects /nonexistent/dir/effects.jsonl"),
    (["--effects", "with space.jsonl"], "cannot carry whitespace"),
    (["--port", "/nonexistent/tty"], "cannot open port /nonexistent/tty"),
])
def test_qemu_device_tool_refuses_bad_arguments_in_one_line(
        qemu_elf: Path, tmp_path: Path, args: list[str], says: str) -> None:
    r = subprocess.run([sys.executable, str(QEMU_TOOL), "--elf", str(qemu_elf), "--flash-dir",
                        str(tmp_path), *args], capture_output=True, text=True, timeout=30,
                       check=False, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert r.stdout == ""


def test_qemu_device_tool_says_in_one_line_that_it_cannot_save_the_device_id(
        qemu_elf: Path, tmp_path: Path) -> None:
    """A flash directory where ``device_id`` cannot be written (here a dangling link into a
    directory that does not exist; a read-only or full medium alike): one line, exit 1, no
    traceback (it was an uncaught FileNotFoundError)."""
    (tmp_path / "device_id").symlink_to(tmp_path / "missing" / "device_id")
    r = subprocess.run([sys.executable, str(QEMU_TOOL), "--elf", str(qemu_elf), "--flash-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=30, check=False,
                       cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "device_id" in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_the_cli_soak_drives_the_c_device_with_a_short_retry_timeout(device_bin: Path) -> None:
    """The documented template through `idemlink soak`, as a firmware engineer runs it: the
    device declares its own trigger duration, `--retry-timeout` paces retries for a fast device."""
    template = f"{device_bin} --port {{port}} --flash-dir {{flash}} --effects {{effects}}"
    r = subprocess.run([sys.executable, "-m", "idemlink", "soak", "--device-cmd", template,
                        "--commands", "200", "--reboot-every", "50",
                        "--retry-timeout", f"{scaled(POSIX_RETRY):.3f}",
                        "--no-progress", "--json"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    assert report["passed"] is True and report["commands"] == 200


@pytest.mark.parametrize(("args", "says"), [
    (["--retry-timeout", "0"], "must be between 0.001 and 60 seconds"),
    (["--retry-timeout", "nan"], "must be between 0.001 and 60 seconds"),
    (["--retry-timeout", "0.01"], "is for --device-cmd"),
])
def test_a_bad_retry_timeout_is_one_line_exit_1(args: list[str], says: str) -> None:
    r = subprocess.run([sys.executable, "-m", "idemlink", "soak", "--commands", "10", *args],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


def test_a_device_built_for_another_map_is_soaked_with_that_map(pump_build: Path,
                                                                tmp_path: Path) -> None:
    """`soak --regmap`: the campaign, the host and the oracle all take the device's own map
    (without it the device is refused as serving another map, nothing run)."""
    pump_device_bin = pump_build / "posix" / "idemlink-device"
    template = f"{pump_device_bin} --port {{port}} --flash-dir {{flash}} --effects {{effects}}"
    argv = [sys.executable, "-m", "idemlink", "soak", "--device-cmd", template, "--commands",
            "300", "--reboot-every", "75", "--retry-timeout", f"{scaled(POSIX_RETRY):.3f}",
            "--no-progress", "--json"]
    r = subprocess.run([*argv, "--regmap", "pump-controller"], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    assert report["passed"] is True and report["commands"] == 300
    wrong = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert wrong.returncode == 1 and "pump-controller" in wrong.stderr, wrong.stderr


def _pump_template(pump_build: Path, control: str = "--control {control}") -> str:
    device = pump_build / "posix" / "idemlink-device"
    return (f"{device} --port {{port}} --flash-dir {{flash}} --effects {{effects}} "
            f"--trigger-duration {TRIGGER_S} {control}")


def _pump(commands: int, seed: int) -> CampaignConfig:
    """The pump controller (two fault words, no thermal rule: its faults come only from
    outside), a condition coming or going in about a third of the batches."""
    return replace(_fast(commands, seed, reboot_every=100, restart_every=100),
                   regmap="pump-controller", conditions=0.5)


def test_the_c_device_latches_and_clears_a_user_maps_faults_driven_by_the_soak(
        pump_build: Path) -> None:
    """`{control}`: the campaign writes `condition ADDRESS BITS` lines to the device's FIFO at
    random moments; faults latch, clears are tried while the condition holds (the bit stays)
    and after it went (the bit clears), judged by the oracle from the effects file and the
    campaign's own record of the conditions."""
    rep = run_device_campaign(_pump(300, seed=25), _pump_template(pump_build),
                              retry_timeout=scaled(POSIX_RETRY))
    _assert_passed(rep, 300)
    assert rep.conditions_set >= 10 and rep.reboots >= 1, rep.as_dict()
    assert rep.faults_latched >= 1 and rep.faults_cleared >= 1, rep.as_dict()
    assert rep.clears_while_held >= 1, rep.as_dict()
    print(f"\npump soak: {rep.conditions_set} conditions, {rep.faults_latched} latched, "
          f"{rep.faults_cleared} cleared, {rep.clears_while_held} clears while held, "
          f"{rep.wall_seconds:.2f} s", file=sys.stderr)


def test_a_c_device_that_ignores_the_conditions_fails_the_soak(pump_build: Path) -> None:
    """Can fail: the same device run without `--control` (the FIFO named, never read) keeps
    its faults clear while the campaign says a condition holds: register semantics."""
    template = f"env IDEMLINK_UNUSED={{control}} {_pump_template(pump_build, control='')}"
    rep = run_device_campaign(_pump(300, seed=25), template, retry_timeout=scaled(POSIX_RETRY),
                              fail_fast=True)
    assert rep.conditions_set >= 1 and not rep.passed, rep.as_dict()
    assert rep.register_semantics > 0, rep.problems[:3]


@pytest.mark.slow
def test_the_c_device_soak_drives_faults_over_2000_commands(pump_build: Path) -> None:
    cfg = replace(_pump(2_000, seed=23), reboot_every=250, restart_every=250)
    t0 = time.monotonic()
    rep = run_device_campaign(cfg, _pump_template(pump_build),
                              retry_timeout=scaled(POSIX_RETRY))
    _assert_passed(rep, 2_000)
    assert rep.conditions_set >= 100 and rep.faults_latched >= 20, rep.as_dict()
    assert rep.faults_cleared >= 10 and rep.clears_while_held >= 10, rep.as_dict()
    print(f"\npump soak with conditions: {time.monotonic() - t0:.1f} s, {rep.conditions_set} "
          f"conditions, {rep.faults_latched} latched, {rep.faults_cleared} cleared, "
          f"{rep.clears_while_held} clears while held; {rep.verdict()}", file=sys.stderr)
