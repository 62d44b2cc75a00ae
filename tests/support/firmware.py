"""The C reference (firmware_ref/) as tests build and run it.

``make`` runs once per session per target and arguments (``make_once``): the artefacts go to the
checkout's ``firmware_ref/build`` (make's own incrementality skips what is up to date, also
across sessions), and a target every test module asks for (``device``, ``lib``, ``size-device``)
costs one make for the whole run. A missing tool skips the test, naming it; a failing build fails
it with make's output.
"""

from __future__ import annotations

import ctypes
import fcntl
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from idemlink.protocol.device_core import ConfigSnapshot
from support.timing import read_line, scaled

ROOT = Path(__file__).resolve().parents[2]
FW = ROOT / "firmware_ref"
BUILD = FW / "build"
DEVICE_BINARY = BUILD / "posix" / "idemlink-device"
QEMU_ELF = BUILD / "qemu" / "idemlink-device.elf"
QEMU_M0_ELF = BUILD / "qemu-microbit" / "idemlink-device.elf"
CORE_LIBRARY = BUILD / "libidl_core.so"
QEMU_TOOL = FW / "tools" / "qemu-device"
MAKE_TIMEOUT = 600.0

_made: dict[tuple[str, ...], str | BaseException] = {}
_lock = threading.Lock()


def missing(*tools: str) -> str | None:
    """Why the C builds cannot run here (make, a C compiler, then ``tools``), or None."""
    if shutil.which("make") is None:
        return "make is not installed"
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        return "no C compiler (gcc or cc)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def need(*tools: str) -> None:
    """Skip the calling test unless make, a C compiler and ``tools`` are installed."""
    why = missing(*tools)
    if why is not None:
        pytest.skip(f"cannot build firmware_ref: {why}")


def need_libfuzzer() -> None:
    """Skip the calling test unless clang links a libFuzzer target."""
    need("clang")
    probe = subprocess.run(
        ["clang", "-fsanitize=fuzzer", "-x", "c", "-", "-o", "/dev/null"],
        input="#include <stdint.h>\n#include <stddef.h>\n"
              "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)"
              "{(void)d;(void)n;return 0;}\n",
        capture_output=True, text=True, check=False,
    )
    if probe.returncode != 0:
        pytest.skip("clang without libFuzzer (libclang-rt-dev)")


def make(target: str, *args: str, tools: tuple[str, ...] = (),
         timeout: float = MAKE_TIMEOUT) -> str:
    """``make -s -C firmware_ref TARGET ARGS...`` now; its stdout. Skips when a tool is missing;
    fails the test with make's output when the build fails."""
    need(*tools)
    BUILD.mkdir(parents=True, exist_ok=True)
    # one make at a time across processes (pytest-xdist workers share firmware_ref/build)
    with (BUILD / ".make.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["make", "-s", "-C", str(FW), target, *args], capture_output=True,
                              text=True, check=False, timeout=scaled(timeout))
    if proc.returncode != 0:
        pytest.fail(f"make {target} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def make_once(target: str, *args: str, tools: tuple[str, ...] = ()) -> str:
    """``make`` once per session for this target and arguments (the same stdout for every
    caller; a build that failed fails every caller, without running make again)."""
    need(*tools)
    key = (target, *args)
    with _lock:
        if key not in _made:
            try:
                _made[key] = make(target, *args, tools=tools)
            except BaseException as exc:  # pytest's Failed is a BaseException
                _made[key] = exc
                raise
        done = _made[key]
    if isinstance(done, BaseException):
        pytest.fail(f"make {' '.join(key)} failed earlier in this session: {done}")
    return done


def device_binary() -> Path:
    """``build/posix/idemlink-device``: the posix port, the built-in map."""
    make_once("device")
    return DEVICE_BINARY


def qemu_device_elf() -> Path:
    """``build/qemu/idemlink-device.elf``: the device on QEMU's mps2-an385 (Cortex-M3)."""
    make_once("qemu-device", tools=("arm-none-eabi-gcc", "qemu-system-arm"))
    return QEMU_ELF


def qemu_m0_device_elf() -> Path:
    """``build/qemu-microbit/idemlink-device.elf``: the device on QEMU's micro:bit (nRF51822,
    Cortex-M0), ``make qemu-device BOARD=microbit``."""
    make_once("qemu-device-m0", tools=("arm-none-eabi-gcc", "qemu-system-arm"))
    return QEMU_M0_ELF


def core_library() -> Path:
    """``build/libidl_core.so``: the core and its test shim, for ctypes."""
    make_once("lib")
    return CORE_LIBRARY


def shim_library(path: Path | None = None) -> ctypes.CDLL:
    """The core library (``path``: one built for another map; default ``core_library()``) with
    the shim's signatures declared (``idl_shim_*`` of firmware_ref/tests/core_shim.c): one place
    for every test that drives the C core through ctypes."""
    lib = ctypes.CDLL(str(core_library() if path is None else path))
    p, u32, size = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t
    lib.idl_shim_sizeof.restype = size
    lib.idl_shim_init.argtypes = [p, u32, u32, ctypes.c_char_p, u32]
    lib.idl_shim_init.restype = None
    lib.idl_shim_execute.argtypes = [p, ctypes.c_char_p, ctypes.c_uint16, u32, p]
    lib.idl_shim_execute.restype = ctypes.c_uint16
    lib.idl_shim_restore.argtypes = [p, ctypes.POINTER(ctypes.c_uint16), ctypes.c_uint16, u32]
    lib.idl_shim_restore.restype = ctypes.c_int
    lib.idl_shim_feed.argtypes = [p, ctypes.c_char_p, size, u32, p, size]
    lib.idl_shim_feed.restype = size
    lib.idl_shim_bus.argtypes = [p, ctypes.c_uint8]
    lib.idl_shim_counter.argtypes = [p, ctypes.c_uint]
    lib.idl_shim_counter.restype = u32
    lib.idl_shim_decoder_counter.argtypes = [p, ctypes.c_uint]
    lib.idl_shim_decoder_counter.restype = u32
    lib.idl_shim_get.argtypes = [p, ctypes.c_uint16]
    lib.idl_shim_get.restype = ctypes.c_int32
    lib.idl_shim_auth_keys.argtypes = [ctypes.c_char_p, ctypes.c_uint]
    lib.idl_shim_auth_tape.argtypes = [ctypes.c_char_p, size]
    lib.idl_shim_blake2s.argtypes = [p, ctypes.c_uint, ctypes.c_char_p, ctypes.c_char_p, size,
                                     size, size]
    lib.idl_shim_key_id.argtypes = [ctypes.c_char_p]
    lib.idl_shim_key_id.restype = u32
    return lib


class RunningDevice:
    """``idemlink-device`` on a new pty (its path is the first line of stdout)."""

    def __init__(self, binary: Path, flash: Path, *args: str) -> None:
        self.flash = flash
        self.proc = subprocess.Popen(
            [str(binary), "--flash-dir", str(flash), "--stats", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.path = read_line(self.proc.stdout, self.proc)
        port = args[args.index("--port") + 1] if "--port" in args else None
        assert self.path == port if port else self.path.startswith("/dev/"), self.path

    def stop(self) -> dict[str, int]:
        """SIGTERM; the exit must be clean. Returns the device's counters."""
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=scaled(10))
        assert self.proc.returncode == 0, err
        line = err.strip().splitlines()[-1]
        return {k: int(v) for k, v in (w.split("=") for w in line.split() if "=" in w)}

    def kill(self) -> None:
        """SIGKILL if it still runs (a fixture's cleanup)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def config(self) -> ConfigSnapshot:
        return ConfigSnapshot.from_json((self.flash / "config.json").read_text(encoding="utf-8"))

    @property
    def files(self) -> Path:
        """Where FILE_RECEIVE stores (``<flash-dir>/files``)."""
        return self.flash / "files"


class QemuDevice:
    """``build/qemu/idemlink-device.elf`` on QEMU's mps2-an385; UART0 is a host pty. The
    configuration file lives in ``workdir`` (semihosting)."""

    def __init__(self, elf: Path, workdir: Path) -> None:
        self.proc = subprocess.Popen(
            ["qemu-system-arm", "-machine", "mps2-an385", "-nographic", "-monitor", "none",
             "-serial", "pty", "-semihosting-config", "enable=on,target=native", "-kernel",
             str(elf)], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = read_line(self.proc.stdout, self.proc)
        match = re.search(r"(/dev/pts/\d+)", line)
        assert match, line
        self.path = match.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=scaled(10))
