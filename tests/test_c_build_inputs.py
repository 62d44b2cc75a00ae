"""firmware_ref's build tracks its inputs: ``IDL_OPTS`` reaches the device, and changing it (or
the map header) rebuilds — a stale binary never keeps serving the old options or map.

Slow (builds of the posix device in a fresh build directory, a few seconds each); the last one
checks IDL_FILE_INFO=0 reaches the device. The refusals before any build (a path with a space, a
missing Arm toolchain) are instant and run by default.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import firmware

from idemlink.host.device import Device


def _replay_slots(build: Path, tmp: Path) -> int:
    dev = firmware.RunningDevice(build / "posix" / "idemlink-device", tmp / "flash")
    try:
        with Device.open(dev.path) as host:
            info = host.ops.info
            assert info is not None
            return info.replay_slots
    finally:
        dev.stop()


@pytest.mark.slow
def test_the_options_reach_the_device_and_a_change_rebuilds(tmp_path: Path) -> None:
    build = tmp_path / "build"
    firmware.make("device", f"BUILD={build}", "IDL_OPTS=-DIDL_REPLAY_SLOTS=4u")
    assert _replay_slots(build, tmp_path) == 4
    assert "IDL_REPLAY_SLOTS=4u" in (build / "inputs.txt").read_text()
    stamp = (build / "posix" / "idemlink-device").stat().st_mtime_ns
    firmware.make("device", f"BUILD={build}", "IDL_OPTS=-DIDL_REPLAY_SLOTS=4u")  # unchanged
    assert (build / "posix" / "idemlink-device").stat().st_mtime_ns == stamp
    firmware.make("device", f"BUILD={build}")  # the options changed: rebuilt with K = 8
    assert _replay_slots(build, tmp_path) == 8


@pytest.mark.slow
def test_a_new_map_header_rebuilds(tmp_path: Path) -> None:
    """The header's content is an input too (REGMAP_H): touched, the device is rebuilt."""
    import os
    import subprocess
    import sys

    out = tmp_path / "map"
    subprocess.run([sys.executable, "-m", "idemlink", "contract", "--regmap",
                    str(firmware.ROOT / "protocol" / "maps" / "pump-controller.toml"),
                    "--out", str(out)], check=True, capture_output=True)
    header = out / "idemlink_regmap.h"
    build = tmp_path / "build"
    firmware.make("device", f"BUILD={build}", f"REGMAP_H={header}")
    binary = build / "posix" / "idemlink-device"
    stamp = binary.stat().st_mtime_ns
    later = stamp + 10**9
    os.utime(header, ns=(later, later))
    firmware.make("device", f"BUILD={build}", f"REGMAP_H={header}")
    assert binary.stat().st_mtime_ns > stamp


@pytest.mark.slow
def test_a_device_without_file_info_answers_0x45_illegal_function(tmp_path: Path) -> None:
    """IDL_FILE_INFO=0 (the framed device's smallest build): 0x45 goes to the register core,
    which answers exception 01 like any function it does not serve; reads still work."""
    build = tmp_path / "build"
    firmware.make("device", f"BUILD={build}", "IDL_OPTS=-DIDL_FILE_INFO=0 -DIDL_FILE_RECEIVE=0")
    dev = firmware.RunningDevice(build / "posix" / "idemlink-device", tmp_path / "flash")
    try:
        with Device.open(dev.path) as host:
            r = host.file_info("a.bin")
            assert not r.ok and r.exception_code == 1, r
            assert host.execute(host.read_command("faults")).ok
    finally:
        dev.stop()


def test_check_takes_a_crc_table_mode_from_idl_opts(tmp_path: Path) -> None:
    """``make check IDL_OPTS=-DIDL_CRC32C_TABLE=2`` (a part's chosen CRC mode, README): the loop
    over the other table modes sets the mode itself, so no compiler line may get two values (it
    once did: "IDL_CRC32C_TABLE redefined", an error under -Werror). ``make -n``: nothing built."""
    firmware.need()
    out = subprocess.run(["make", "-n", "-C", str(firmware.FW), "check", f"BUILD={tmp_path}",
                          "IDL_OPTS=-DIDL_CRC32C_TABLE=2"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    lines = [ln for ln in out.splitlines() if "-DIDL_CRC32C_TABLE=" in ln]
    assert any("-DIDL_CRC32C_TABLE=$t" in ln for ln in lines)  # the loop is there
    assert all(ln.count("-DIDL_CRC32C_TABLE=") == 1 for ln in lines
               if "echo" not in ln), [ln for ln in lines if ln.count("-DIDL_CRC32C_TABLE=") > 1]


@pytest.mark.parametrize("var", ["REGMAP_H", "BUILD"])
def test_a_path_with_a_space_is_refused_in_one_line(var: str, tmp_path: Path) -> None:
    """make splits a file name at its spaces: REGMAP_H or BUILD with one is refused before any
    build, in one line naming it (it failed later on a mangled path, ``/tmp/my
    /.../firmware_ref/map/idemlink_regmap.h``, or with make's "No rule to make target")."""
    firmware.need()
    spaced = tmp_path / "my map"
    spaced.mkdir()
    header = spaced / "idemlink_regmap.h"
    header.write_text((firmware.FW / "tests" / "typed_regmap.h").read_text())
    args = {"REGMAP_H": [f"BUILD={tmp_path / 'build'}", f"REGMAP_H={header}"],
            "BUILD": [f"BUILD={spaced / 'build'}"]}[var]
    for target in ("device", "size-device", "lib"):
        proc = subprocess.run(["make", "-s", "-C", str(firmware.FW), target, *args],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2 and proc.stdout == "", proc
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and f'{var}="' in lines[0] and "has a space" in lines[0], lines
    assert not (tmp_path / "build").exists() and not (spaced / "build").exists()


@pytest.mark.parametrize("goal", ["size-device", "board-m0plus", "qemu-device"])
def test_a_missing_arm_toolchain_is_one_line(goal: str, tmp_path: Path) -> None:
    """Without arm-none-eabi-gcc (here ARM_CC names none) the Arm goals stop before building,
    in one line naming the compiler and how to get it (it was the shell's ``not found`` halfway
    through, after the report's first rows had been printed)."""
    firmware.need()
    proc = subprocess.run(["make", "-s", "-C", str(firmware.FW), goal, f"BUILD={tmp_path / 'b'}",
                           f"ARM_CC={tmp_path / 'no-arm-gcc'}"],
                          capture_output=True, text=True, timeout=60, check=False)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1, proc
    assert f"{tmp_path / 'no-arm-gcc'} not found (ARM_CC)" in lines[0], lines
    assert "gcc-arm-none-eabi" in lines[0] and not (tmp_path / "b").exists()


@pytest.mark.parametrize("budget", ["BUDGET_RAM=4k", "BUDGET_FLASH=32 768", "BUDGET_TEXT_FRAMED="])
def test_a_budget_that_is_not_a_number_is_refused_in_one_line(budget: str, tmp_path: Path) -> None:
    """size-device's budgets are bytes: ``BUDGET_RAM=4k`` was the shell's ``Illegal number`` and
    then "RAM ... over budget", after the whole report; now one line naming it, before any build."""
    firmware.need("arm-none-eabi-gcc")
    proc = subprocess.run(["make", "-s", "-C", str(firmware.FW), "size-device",
                           f"BUILD={tmp_path / 'b'}", budget],
                          capture_output=True, text=True, timeout=60, check=False)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1, proc
    name = budget.split("=")[0]
    assert f"{budget} is not a number of bytes" in lines[0] and f"{name}=4096" in lines[0], lines
    assert not (tmp_path / "b").exists()
