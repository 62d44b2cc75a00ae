"""The C device's Modbus RTU timing and character format are the Python ones.

- ``idl_rtu_char_us`` / ``idl_rtu_t15_us`` / ``idl_rtu_t35_us`` (firmware_ref/src/idl_rtu.c,
  through ctypes) equal ``idemlink.protocol.modbus_rtu.rtu_timing`` rounded up to the microsecond,
  for every usual baud rate and every character format the C port takes (7/8 data bits, N/E/O,
  1/2 stop bits): a firmware port sets its pause timer from them.
- The posix device takes ``--bytesize/--parity/--stopbits`` (8N1 by default, 8E1 with
  ``--modbus-rtu``, as ``idemlink sim``), serves with them, and refuses a value it cannot set in
  one line on stderr, exit 1.
"""

from __future__ import annotations

import ctypes
import math
import subprocess
from pathlib import Path

import pytest

from idemlink.protocol.char_format import CharFormat
from idemlink.protocol.modbus_rtu import rtu_timing

BAUDS = [1200, 2400, 4800, 9600, 14400, 19200, 19201, 38400, 57600, 115200, 1_000_000, 20_000_000]
FORMATS = [CharFormat(b, p, s) for b in (7, 8) for p in "NEO" for s in (1, 2)]


@pytest.fixture(scope="module")
def timing(lib_path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_path))
    for name in ("idl_rtu_char_us", "idl_rtu_t15_us", "idl_rtu_t35_us"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
        fn.restype = ctypes.c_uint32
    return lib


def _us(seconds: float) -> int:
    return math.ceil(round(seconds * 1e6, 6))  # 3.5 * 11 / 9600 s is 4010.416... us: 4011


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_the_c_timing_is_the_python_timing(timing: ctypes.CDLL, fmt: CharFormat) -> None:
    for baud in BAUDS:
        py = rtu_timing(baud, fmt)
        got = (timing.idl_rtu_char_us(baud, fmt.char_bits), timing.idl_rtu_t15_us(baud, fmt.char_bits),
               timing.idl_rtu_t35_us(baud, fmt.char_bits))
        assert got == (_us(py.char_time), _us(py.t15), _us(py.t35)), (baud, fmt)


def test_8e1_is_eleven_bits_and_8n1_ten(timing: ctypes.CDLL) -> None:
    """The example from the Modbus serial-line spec's numbers: at 9600 Bd t3.5 is 4.01 ms for
    an 11-bit character and 3.65 ms for a 10-bit one."""
    assert timing.idl_rtu_t35_us(9600, CharFormat(8, "E", 1).char_bits) == 4011
    assert timing.idl_rtu_t35_us(9600, CharFormat(8, "N", 1).char_bits) == 3646


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--parity", "X", "parity 'X' must be N, E or O"),
    ("--parity", "EE", "parity 'EE' must be N, E or O"),
    ("--bytesize", "9", "byte size 9 must be 7 or 8"),
    ("--stopbits", "3", "stop bits 3 must be 1 or 2"),
    ("--baudrate", "20000001", "baud rate 20000001 must be 1..20000000"),
])
def test_the_device_refuses_a_format_it_cannot_set(device_bin: Path, option: str, value: str,
                                                    message: str) -> None:
    run = subprocess.run([str(device_bin), "--modbus-rtu", option, value], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [f"idemlink-device: {message}"]
    assert run.stdout == ""


@pytest.mark.parametrize("args", [["--parity", "e", "--bytesize", "7", "--stopbits", "2"],
                                  ["--parity", "N"]])
def test_the_device_serves_with_a_given_format(device_bin: Path, args: list[str]) -> None:
    """On its pty (which has no line rate) the device answers a read with any format it takes."""
    from idemlink.host.rtu_device import RtuDevice

    proc = subprocess.Popen([str(device_bin), "--modbus-rtu", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        assert path.startswith("/dev/"), proc.stderr.read() if proc.stderr else ""
        with RtuDevice.open(path, unit=1) as dev:
            assert dev.read(0, 1).outcome.name == "OK"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
