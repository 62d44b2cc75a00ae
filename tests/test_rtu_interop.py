"""``idemlink sim --modbus-rtu`` and the C device's ``idemlink-device --modbus-rtu``
(firmware_ref/, posix port) driven by real Modbus peers over a socat pty pair: pymodbus,
minimalmodbus and mbpoll (reads, writes, the atomic FC16 rejection, W1C, exceptions), plus raw
bytes for what clients cannot show (silence on another unit or a bad CRC, resync after garbage).
The ``device`` fixture runs every peer test on both slaves (the C leg skips without make/gcc).
The socat cases skip when socat is missing, the mbpoll case when mbpoll is missing; the
server's sans-I/O ``receive`` is tested directly too."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import serial
from support import firmware
from support.rtu import rtu_reply, start_sim, stop_sim
from support.timing import read_line, scaled

from idemlink.device_sim.flash import ConfigFlash
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.protocol.device_core import DeviceCore, EffectKind
from idemlink.protocol.modbus_rtu import encode_rtu

needs_mbpoll = pytest.mark.skipif(shutil.which("mbpoll") is None, reason="mbpoll not installed")

UNIT = 1



@pytest.fixture(scope="module")
def pty_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    if shutil.which("socat") is None:
        pytest.skip("socat not installed")
    d = tmp_path_factory.mktemp("pty")
    a, b = str(d / "devA"), str(d / "devB")
    proc = subprocess.Popen(
        ["socat", "-d", "-d", f"pty,raw,echo=0,link={a}", f"pty,raw,echo=0,link={b}"],
        stderr=subprocess.PIPE)
    while "starting data transfer loop" not in read_line(proc.stderr, proc):
        pass
    yield a, b
    proc.terminate()
    proc.wait(5)


def start_c_device(port: str, flash: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The C device (``make -C firmware_ref device``) as an RTU slave on ``port``."""
    proc = subprocess.Popen([str(firmware.device_binary()), "--port", port,
                             "--modbus-rtu", "--unit", str(UNIT), "--trigger-duration", "0.3",
                             "--flash-dir", str(flash)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, read_line(proc.stdout, proc)


@pytest.fixture(scope="module", params=["sim", "c-device"])
def device(request: pytest.FixtureRequest, pty_pair: tuple[str, str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Python simulator or the C device on one end of the pair (trigger RUNNING 0.3 s);
    yields the client's end."""
    a, b = pty_pair
    if request.param == "sim":
        proc, path = start_sim("--port", a, "--unit", str(UNIT), "--trigger-duration", "0.3")
    else:
        proc, path = start_c_device(a, tmp_path_factory.mktemp("c-flash"))
    assert path == a
    yield b
    assert stop_sim(proc) == 0


@pytest.fixture
def raw(device: str) -> Iterator[serial.Serial]:
    port = serial.Serial(device, 115200, timeout=0.3)
    yield port
    port.close()


def ask(port: serial.Serial, frame: bytes, expect: int) -> bytes:
    port.reset_input_buffer()
    port.write(frame)
    return bytes(port.read(expect))


# ------------------------------------------------------------------------------------ pymodbus


@pytest.fixture
def pym(device: str) -> Iterator[Any]:
    from pymodbus import FramerType
    from pymodbus.client import ModbusSerialClient

    client: Any = ModbusSerialClient(device, framer=FramerType.RTU, baudrate=115200, timeout=1,
                                     retries=0)
    assert client.connect()
    yield client
    client.close()


def test_pymodbus_reads_writes_and_atomic_fc16(pym: Any) -> None:
    c = pym
    r = c.write_registers(4, [350, 1, 50], device_id=UNIT)
    assert not r.isError()
    r = c.read_input_registers(0, count=9, device_id=UNIT)
    assert r.registers[:3] == [250, 450, 1200]  # the simulated world's inputs
    gen = r.registers[3]
    r = c.write_register(4, 420, device_id=UNIT)
    assert (r.address, r.registers) == (4, [420])
    r = c.write_register(4, 420, device_id=UNIT)  # a retry: same state, no new generation
    r = c.read_holding_registers(3, count=4, device_id=UNIT)
    assert r.registers == [gen + 1, 420, 1, 50]
    # FC16 whose last value is out of range: exception 03, and not even the first one changed.
    r = c.write_registers(4, [100, 2, 101], device_id=UNIT)
    assert r.isError() and r.exception_code == 3
    r = c.read_holding_registers(3, count=4, device_id=UNIT)
    assert r.registers == [gen + 1, 420, 1, 50]


def test_pymodbus_exceptions(pym: Any) -> None:
    c = pym
    r = c.read_holding_registers(8, count=2, device_id=UNIT)
    assert r.isError() and r.exception_code == 2  # 9 is unmapped
    r = c.write_register(0, 1, device_id=UNIT)
    assert r.isError() and r.exception_code == 2  # input register
    r = c.write_register(5, 3, device_id=UNIT)
    assert r.isError() and r.exception_code == 3  # mode max 2
    r = c.read_coils(0, count=1, device_id=UNIT)
    assert r.isError() and r.exception_code == 1


def test_pymodbus_w1c_and_trigger(pym: Any) -> None:
    c = pym
    assert not c.write_register(4, 100, device_id=UNIT).isError()
    assert c.read_holding_registers(7, count=1,
                                    device_id=UNIT).registers == [1]  # over-temperature
    assert c.write_register(7, 1, device_id=UNIT).registers == [1]
    # Condition persists (250 > 100): still latched. Reading never clears.
    for _ in range(2):
        assert c.read_holding_registers(7, count=1,
                                        device_id=UNIT).registers == [1]
    assert not c.write_register(4, 350, device_id=UNIT).isError()
    assert c.read_holding_registers(7, count=1,
                                    device_id=UNIT).registers == [1]
    assert not c.write_register(7, 0, device_id=UNIT).isError()
    assert c.read_holding_registers(7, count=1,
                                    device_id=UNIT).registers == [1]  # 0s do nothing
    assert not c.write_register(7, 1, device_id=UNIT).isError()
    assert c.read_holding_registers(7, count=1,
                                    device_id=UNIT).registers == [0]
    # Trigger: reset, start, retry while RUNNING (echo, nothing new), then DONE after 0.3 s.
    assert not c.write_register(8, 0, device_id=UNIT).isError()
    assert not c.write_register(8, 1, device_id=UNIT).isError()
    assert c.read_holding_registers(8, count=1,
                                    device_id=UNIT).registers == [1]
    r = c.write_register(8, 2, device_id=UNIT)
    assert r.isError() and r.exception_code == 3
    deadline = time.monotonic() + scaled(10)
    while c.read_holding_registers(8, count=1,
                                   device_id=UNIT).registers != [2]:
        assert time.monotonic() < deadline, "trigger never reached DONE"


# ------------------------------------------------------------------------------- minimalmodbus


def test_minimalmodbus(device: str) -> None:
    import minimalmodbus

    inst = minimalmodbus.Instrument(device, UNIT)
    inst.serial.baudrate = 115200
    inst.serial.timeout = 0.5
    inst.close_port_after_each_call = True
    inst.write_register(5, 2, functioncode=6)  # verifies the FC06 echo itself
    assert inst.read_register(5, functioncode=3) == 2
    assert inst.read_registers(0, 3, functioncode=4) == [250, 450, 1200]
    inst.write_registers(4, [300, 0, 75])
    assert inst.read_registers(4, 3) == [300, 0, 75]
    with pytest.raises(minimalmodbus.IllegalRequestError):
        inst.write_registers(4, [301, 0, 200])  # fan_setpoint 200 > 100: nothing changes
    assert inst.read_registers(4, 3) == [300, 0, 75]
    with pytest.raises(minimalmodbus.IllegalRequestError):
        inst.read_register(20)
    inst.write_registers(4, [350, 1, 50])


# ------------------------------------------------------------------------------------- mbpoll


def mbpoll(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mbpoll", "-m", "rtu", "-a", str(UNIT), "-b", "115200", "-P", "none",
                           "-0", "-1", "-o", "1", *args, path],
                          capture_output=True, text=True, timeout=20)


def _values(out: str) -> dict[int, int]:
    return {int(a): int(v) for a, v in re.findall(r"^\[(\d+)\]:\s+(-?\d+)", out, re.M)}


@needs_mbpoll
def test_mbpoll(device: str) -> None:
    r = mbpoll(device, "-t", "3", "-r", "0", "-c", "3")
    assert r.returncode == 0 and _values(r.stdout) == {0: 250, 1: 450, 2: 1200}
    r = subprocess.run(["mbpoll", "-m", "rtu", "-a", str(UNIT), "-b", "115200", "-P", "none",
                        "-0", "-1", "-o", "1", "-t", "4", "-r", "6", device, "80"],
                       capture_output=True, text=True, timeout=20)  # one value: FC06
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["mbpoll", "-m", "rtu", "-a", str(UNIT), "-b", "115200", "-P", "none",
                        "-0", "-1", "-o", "1", "-t", "4", "-r", "4", device, "360", "2"],
                       capture_output=True, text=True, timeout=20)  # two values: FC16
    assert r.returncode == 0, r.stdout + r.stderr
    r = mbpoll(device, "-t", "4", "-r", "4", "-c", "3")
    assert r.returncode == 0 and _values(r.stdout) == {4: 360, 5: 2, 6: 80}
    r = subprocess.run(["mbpoll", "-m", "rtu", "-a", str(UNIT), "-b", "115200", "-P", "none",
                        "-0", "-1", "-o", "1", "-t", "4", "-r", "5", device, "1", "500"],
                       capture_output=True, text=True, timeout=20)  # FC16 with 500 > 100
    assert r.returncode != 0 and "Illegal data value" in r.stdout + r.stderr
    r = mbpoll(device, "-t", "4", "-r", "4", "-c", "3")
    assert _values(r.stdout) == {4: 360, 5: 2, 6: 80}  # atomic: mode untouched
    r = mbpoll(device, "-t", "4", "-r", "20", "-c", "4")
    assert r.returncode == 1 and "Illegal data address" in r.stdout + r.stderr
    r = subprocess.run(["mbpoll", "-m", "rtu", "-a", str(UNIT), "-b", "115200", "-P", "none",
                        "-0", "-1", "-o", "1", "-t", "4", "-r", "4", device, "350", "1", "50"],
                       capture_output=True, text=True, timeout=20)  # values after the port
    assert r.returncode == 0, r.stdout + r.stderr


# --------------------------------------------------------------------- idemlink's own CLI


def test_idemlink_cli_over_modbus_rtu(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.cli import main

    def cli(*argv: str) -> dict[str, Any]:
        assert main([argv[0], "--port", device, "--modbus-rtu", "--unit", str(UNIT), "--json",
                     *argv[1:]]) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        return out

    assert cli("write", "mode=2", "threshold=35.0")["outcome"] == "OK"
    assert cli("read", "threshold", "mode")["values"] == {"threshold": 350, "mode": 2}
    assert cli("write", "mode=1")["outcome"] == "OK"


# ---------------------------------------------------------------------------------- raw bytes


def test_fc06_echo_and_exception_frames_byte_exact(raw: serial.Serial) -> None:
    req = encode_rtu(UNIT, bytes.fromhex("0600060028"))
    assert ask(raw, req, len(req)) == req
    assert ask(raw, encode_rtu(UNIT, bytes.fromhex("0600000001")), 5) == encode_rtu(
        UNIT, bytes.fromhex("8602"))
    assert ask(raw, encode_rtu(UNIT, bytes.fromhex("0300000000")), 5) == encode_rtu(
        UNIT, bytes.fromhex("8303"))  # count 0
    assert ask(raw, encode_rtu(UNIT, bytes.fromhex("03fffe0003")), 5) == encode_rtu(
        UNIT, bytes.fromhex("8302"))  # past 0xFFFF
    assert ask(raw, encode_rtu(UNIT, bytes.fromhex("2b0e0100")), 5) == encode_rtu(
        UNIT, bytes.fromhex("ab01"))  # unknown function: answered after the line goes quiet


def test_silence_on_other_unit_and_bad_crc(raw: serial.Serial) -> None:
    """Order-free: the test writes 40 itself (the module's device is shared, and under xdist the
    module's tests run in any order and split across workers)."""
    good = encode_rtu(UNIT, bytes.fromhex("0600060028"))
    assert ask(raw, good, len(good)) == good
    assert ask(raw, encode_rtu(UNIT + 1, bytes.fromhex("0300000001")), 1) == b""
    bad = bytearray(encode_rtu(UNIT, bytes.fromhex("0600060000")))
    bad[-1] ^= 0x55
    assert ask(raw, bytes(bad), 1) == b""
    read = encode_rtu(UNIT, bytes.fromhex("0300060001"))
    assert ask(raw, read, 7) == encode_rtu(UNIT, bytes.fromhex("0302") + (40).to_bytes(2, "big"))


def _garbage_then_pause(port: serial.Serial, garbage: bytes) -> None:
    """Send ``garbage``, then leave the line idle for 50 ms (t3.5 is 1.75 ms at 115200 Bd; the
    margin is for socat and a loaded machine, which may hold the garbage back until the next
    bytes). The pause is the stimulus under test (a frame boundary), not a wait for a result."""
    port.reset_input_buffer()
    port.write(garbage)
    port.flush()
    time.sleep(scaled(0.05))  # longer on a loaded machine: still a pause, never a sync


def test_resync_after_garbage(raw: serial.Serial) -> None:
    read = encode_rtu(UNIT, bytes.fromhex("0300040001"))
    for garbage in (b"\x00", b"\xff\xfe\x01", b"\x01\x03\x00", bytes(range(40)),
                    b"\x01\x10\x00\x00\x00\x01\xf6"):  # the last promises a 255-byte frame
        _garbage_then_pause(raw, garbage)
        answer = ask(raw, read, 7)
        assert answer[:3] == bytes([UNIT, 3, 2]), (garbage, answer)
    # Garbage and a request in one burst are one damaged frame (Modbus over serial line 2.5.1.1).
    assert ask(raw, b"\x00" + read, 1) == b""
    # Garbage, a pause, then a write twice in one burst: the write happens exactly once.
    write = encode_rtu(UNIT, bytes.fromhex("060006002d"))
    _garbage_then_pause(raw, b"\x55\xaa")
    assert ask(raw, write + write, 16) == write + write
    assert ask(raw, encode_rtu(UNIT, bytes.fromhex("0300060001")), 7) == encode_rtu(
        UNIT, bytes.fromhex("0302002d"))


# ------------------------------------------------------------------------- the command itself


def test_sim_on_its_own_pty_and_clean_exit_on_sigint(tmp_path: Path) -> None:
    """No socat needed: the simulator makes its own pty."""
    from pymodbus import FramerType
    from pymodbus.client import ModbusSerialClient

    flash = tmp_path / "flash"
    proc, path = start_sim("--flash-dir", str(flash))
    assert path.startswith("/dev/")
    client: Any = ModbusSerialClient(path, framer=FramerType.RTU, baudrate=115200, timeout=1,
                                     retries=0)
    assert client.connect()
    assert not client.write_register(4, 123, device_id=1).isError()
    client.close()
    assert stop_sim(proc, signal.SIGINT) == 0
    assert oct((flash / "config.json").stat().st_mode & 0o777) == "0o600"
    # Power cycle: the configuration (and its generation) came back from the flash directory.
    proc, path = start_sim("--flash-dir", str(flash))
    client = ModbusSerialClient(path, framer=FramerType.RTU, baudrate=115200, timeout=1,
                                retries=0)
    assert client.connect()
    # the generation boots at the ceiling the write saved (1 + GENERATION_RESERVE)
    assert client.read_holding_registers(3, count=2, device_id=1).registers == [65, 123]
    client.close()
    assert stop_sim(proc) == 0


# --------------------------------------------------------------------- the shell without I/O


def test_server_receive_broadcast_other_unit_and_split_frames(tmp_path: Path) -> None:
    flash = ConfigFlash(tmp_path)
    server = RtuServer(DeviceCore(), unit=5, flash=flash)
    write = encode_rtu(0, bytes.fromhex("0600050002"))  # broadcast: executes, no answer
    assert rtu_reply(server, write, 1.0) == b""
    assert server.core.value("mode") == 2
    assert rtu_reply(server, encode_rtu(6, bytes.fromhex("0600050000")), 1.1) == b""
    assert server.core.value("mode") == 2 and server.ignored == 1
    read = encode_rtu(5, bytes.fromhex("0300050001"))
    assert rtu_reply(server, read[:3], 1.2) == b""
    assert rtu_reply(server, read[3:], 1.2) == encode_rtu(5, bytes.fromhex("03020002"))
    assert server.core.count(EffectKind.SET) == 1
    again = RtuServer(DeviceCore(), unit=5, flash=ConfigFlash(tmp_path))
    assert (again.core.value("mode"), again.core.generation) == (2, 65)  # boots at the ceiling
    assert oct((tmp_path / "config.json").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(ValueError):
        RtuServer(DeviceCore(), unit=0)


def test_server_keeps_a_frame_split_by_a_short_pause_and_drops_a_stale_head() -> None:
    server = RtuServer(DeviceCore(), unit=1)
    read = encode_rtu(1, bytes.fromhex("0300040001"))
    assert rtu_reply(server, read[:4], 10.0) == b""
    assert rtu_reply(server, b"", 10.05) == b""  # a scheduling hiccup inside the frame
    assert rtu_reply(server, read[4:], 10.06) == encode_rtu(1, bytes.fromhex("0302015e"))
    assert rtu_reply(server, read[:4], 11.0) == b""  # the rest never comes
    assert rtu_reply(server, b"", 11.2) == b""
    assert server.decoder.pending == 0  # given up after the silence
    assert rtu_reply(server, read, 11.3) == encode_rtu(1, bytes.fromhex("0302015e"))


def test_server_garbage_then_a_duplicated_write_acts_once() -> None:
    server = RtuServer(DeviceCore(), unit=1)
    write = encode_rtu(1, bytes.fromhex("060006002d"))
    assert rtu_reply(server, b"\x55\xaa", 1.0) == b""
    assert rtu_reply(server, write + write, 1.01) == write + write  # after a pause
    assert rtu_reply(server, b"\x55\xaa" + write, 2.0) == b""  # one damaged burst: dropped
    assert server.core.count(EffectKind.SET, "fan_setpoint") == 1
    assert server.core.generation == 1


# ------------------------------------------------------------------- your map, plain Modbus RTU


def test_rtu_simulator_serves_a_map_file_to_minimalmodbus() -> None:
    """``sim --modbus-rtu --regmap`` serves the pump's layout (0x0100..) to a real master."""
    import minimalmodbus

    proc, path = start_sim("--regmap", "pump-controller")
    try:
        inst = minimalmodbus.Instrument(path, 1)
        inst.serial.timeout = 0.5
        assert inst.read_registers(0x0200, 5) == [0, 1450, 60, 0, 0]  # generation, holdings
        inst.write_register(0x0201, 1700, functioncode=16)
        assert inst.read_register(0x0201) == 1700
        assert inst.read_register(0x0100, functioncode=4) == 1250  # flow, an input
        with pytest.raises(minimalmodbus.IllegalRequestError):
            inst.read_register(0x0004)  # the thermal map's threshold: not in this map
        inst.serial.close()
    finally:
        assert stop_sim(proc) == 0
