"""The world outside a device, from another process: ``--control FIFO`` on the simulator, on
the C posix device and on the QEMU device (tools/qemu-device), the same lines for all
(device_sim/control.py; the C rule port/control_lines.c).

With a map of the user's own (the built-in pump controller: two fault words, no thermal rule),
faults latch only from conditions set through the pipe; a W1C clear clears a bit only once its
condition has gone; inputs change; a wrong line changes nothing and is said in one stderr line
while the device goes on serving. Judged from the device's registers read over the protocol.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import firmware
from support.timing import read_line, scaled, wait_until

from idemlink.device_sim.control import ControlError, parse_control_line
from idemlink.host.device import Device
from idemlink.protocol.regmap_file import builtin_map

PUMP = builtin_map("pump-controller")
PUMP_FILE = Path(__file__).resolve().parent.parent / "protocol" / "maps" / "pump-controller.toml"
MOTOR, HYDRAULIC, FLOW = 0x0300, 0x0301, 0x0100
OVERHEAT = 1 << 1  # motor_faults bit 1


@pytest.fixture(params=["sim", "c"])
def device(request: pytest.FixtureRequest,
           tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    fifo = tmp_path / "control"
    if request.param == "c":
        build: Path = request.getfixturevalue("pump_build")
        cmd = [str(build / "posix" / "idemlink-device")]
    else:
        cmd = [sys.executable, "-m", "idemlink", "sim", "--regmap", str(PUMP_FILE)]
    proc = subprocess.Popen([*cmd, "--control", str(fifo), "--flash-dir", str(tmp_path / "flash")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        path = read_line(proc.stdout, proc)
        yield path, fifo, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=scaled(10))


def say(fifo: Path, *lines: str) -> None:
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, "".join(f"{line}\n" for line in lines).encode())
    finally:
        os.close(fd)


def raw(dev: Device, address: int) -> int:
    r = dev.execute(dev.read_command(PUMP.at(address).name))  # type: ignore[union-attr]
    assert r.ok, r
    return r.values[0]


def test_faults_of_any_map_latch_and_clear_from_outside(
        device: tuple[str, Path, subprocess.Popen[str]]) -> None:
    path, fifo, proc = device
    with Device.open(path, regmap=PUMP) as dev:
        assert raw(dev, MOTOR) == 0
        say(fifo, "# the motor runs hot", "condition 0x300 2", "input 256 777")
        wait_until(lambda: raw(dev, MOTOR) == OVERHEAT, what="overheat latched")
        assert raw(dev, FLOW) == 777
        assert dev.clear_faults(OVERHEAT, "motor_faults").ok  # the condition still holds...
        assert raw(dev, MOTOR) == OVERHEAT  # ...so the bit stays latched
        say(fifo, "condition 768 0")  # it has gone
        wait_until(lambda: dev.clear_faults(OVERHEAT, "motor_faults").ok
                   and raw(dev, MOTOR) == 0, what="overheat cleared once its condition went")
        assert raw(dev, HYDRAULIC) == 0  # nothing else moved
        bad = ["bogus 1 2", "input 0x300 1", "condition 0x300 4", "condition 768", "input 256 70000",
               "input 0x 1", "x" * 300]
        say(fifo, *bad)
        say(fifo, "input 256 5")
        wait_until(lambda: raw(dev, FLOW) == 5, what="the device went on after wrong lines")
        assert raw(dev, MOTOR) == 0 and raw(dev, HYDRAULIC) == 0
    proc.terminate()
    _, err = proc.communicate(timeout=scaled(10))
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if "control:" in line]
    assert len(lines) == len(bad), err
    assert "Traceback" not in err


def test_something_else_at_the_control_path_is_refused(tmp_path: Path, pump_build: Path) -> None:
    (tmp_path / "control").write_text("a regular file")
    for cmd in ([str(pump_build / "posix" / "idemlink-device")],
                [sys.executable, "-m", "idemlink", "sim", "--regmap", str(PUMP_FILE)]):
        run = subprocess.run([*cmd, "--control", str(tmp_path / "control")], capture_output=True,
                             text=True, timeout=scaled(30))
        assert run.returncode == 1, run
        assert run.stderr.strip().endswith("exists and is not a FIFO; refused"), run.stderr
        assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == ""
    assert (tmp_path / "control").read_text() == "a regular file"


@pytest.mark.parametrize(("line", "why"), [
    ("input 0x300 1", "not an INPUT register"),
    ("condition 0x300 4", "not declared fault bits"),
    ("condition 0x300", "takes an address and a value"),
    ("input 256 -1", "is not a number"),
    ("input 256 65536", "outside 0..65535"),
    ("sensor 256 1", "say 'input ADDRESS VALUE'"),
])
def test_the_rule_refuses_a_wrong_line(line: str, why: str) -> None:
    with pytest.raises(ControlError, match=why):
        parse_control_line(line, PUMP)


def test_the_rule_reads_numbers_both_ways() -> None:
    a = parse_control_line("condition 0x300 0x3", PUMP)
    b = parse_control_line("  condition 768 3  ", PUMP)
    assert a == b and a is not None and a.value == 3
    assert parse_control_line("", PUMP) is None and parse_control_line("# x", PUMP) is None


def test_a_typed_input_takes_its_raw_value_at_its_first_address(tmp_path: Path) -> None:
    """A u32 input (two registers) takes all its words at its first address; its second address
    is inside it, not a register of its own."""
    from idemlink.protocol.regmap_file import load_regmap

    path = tmp_path / "m.toml"
    path.write_text('name = "m"\n[[registers]]\naddress = 3\nname = "run_hours"\nkind = "input"\n'
                    'type = "u32"\nword_order = "big"\n', encoding="utf-8")
    regmap = load_regmap(path)
    command = parse_control_line("input 3 70000", regmap)
    assert command is not None and command.value == 70000
    with pytest.raises(ControlError, match=r"inside run_hours, at 3"):
        parse_control_line("input 4 1", regmap)
    with pytest.raises(ControlError, match=r"outside 0\.\.4294967295"):
        parse_control_line("input 3 0x100000000", regmap)


def test_the_qemu_device_takes_the_same_lines(tmp_path: Path, qemu_elf: Path) -> None:
    """``qemu-device --control FIFO``: the lines reach the emulated MCU's firmware (mps2-an385,
    the built-in thermal controller) through the wrapper and semihosting; a sensor fault set from
    outside latches, an input changes, a wrong line is one stderr line while it goes on serving.
    Skipped without qemu-system-arm or arm-none-eabi-gcc (the fixture says so)."""
    _qemu_control(tmp_path, "mps2", qemu_elf)


@pytest.mark.slow  # a second emulated board boot; the same shared code (port/qemu_host.c)
def test_the_microbit_device_takes_the_same_lines(tmp_path: Path) -> None:
    _qemu_control(tmp_path, "microbit", firmware.qemu_m0_device_elf())


def _qemu_control(tmp_path: Path, board: str, elf: Path) -> None:
    fifo = tmp_path / "control"
    proc = subprocess.Popen([sys.executable, str(firmware.QEMU_TOOL), "--board", board,
                             "--elf", str(elf), "--control", str(fifo),
                             "--flash-dir", str(tmp_path / "flash")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        path = read_line(proc.stdout, proc)
        with Device.open(path) as dev:
            def read(name: str) -> int:
                r = dev.execute(dev.read_command(name))
                assert r.ok, r
                return r.values[0]

            assert read("faults") == 0
            say(fifo, "condition 7 2", "bogus 1 2", "input 2 1234")
            wait_until(lambda: read("faults") == 2, what="sensor fault latched")  # bit 1
            wait_until(lambda: read("fan_speed") == 1234, what="fan speed set from outside")
    finally:
        if proc.poll() is None:
            proc.terminate()
        _, err = proc.communicate(timeout=scaled(10))
    assert proc.returncode == 0, err
    assert [line for line in err.splitlines() if "control:" in line] == [
        "qemu-device: control: 'bogus ...': say 'input ADDRESS VALUE' or 'condition ADDRESS BITS'"]


def test_a_nul_byte_refuses_its_line(device: tuple[str, Path, subprocess.Popen[str]]) -> None:
    """A line with a NUL byte is refused whole on both devices, like any word that is not a
    number (the C rule once cut the line at the NUL and applied its head)."""
    path, fifo, proc = device
    with Device.open(path, regmap=PUMP) as dev:
        say(fifo, "input 256 9\x00junk", "\x00 condition 0x300 2")
        say(fifo, "input 256 5")
        wait_until(lambda: raw(dev, FLOW) == 5, what="the line after the NUL lines")
        assert raw(dev, MOTOR) == 0
    proc.terminate()
    _, err = proc.communicate(timeout=scaled(10))
    assert proc.returncode == 0, err
    assert len([line for line in err.splitlines() if "control:" in line]) == 2, err


def test_a_refused_line_shows_only_its_first_word(
        device: tuple[str, Path, subprocess.Popen[str]]) -> None:
    """A key pasted after a command this device does not serve (the C device has no
    ``provision-key``) is refused without repeating it: stderr shows the line's first word."""
    path, fifo, proc = device
    secret = "a5" * 32
    with Device.open(path, regmap=PUMP) as dev:
        say(fifo, f"provision-key {secret}", "input 256 7")
        wait_until(lambda: raw(dev, FLOW) == 7, what="the line after the refused one")
    proc.terminate()
    _, err = proc.communicate(timeout=scaled(10))
    assert proc.returncode == 0, err
    assert secret[:8] not in err
    assert "control: 'provision-key ...':" in err, err
