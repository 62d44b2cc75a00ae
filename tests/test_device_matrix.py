"""One host test suite, three device implementations: the host's own tests over a real line.

The ``line_device`` fixture starts a device that owns a pty (its path is ``.path``) and is
parameterised over the implementations idemlink ships:

- ``sim``   — the Python simulator (``SimulatedDevice`` with a flash directory) served on a pty
  by ``idemlink.pytest_plugin.start_pty_sim``, as ``idemlink sim --flash-dir D`` serves it;
- ``posix`` — the C device core on the posix port, ``firmware_ref/build/posix/idemlink-device``
  (``make -C firmware_ref device``);
- ``qemu``  — the C device core on QEMU's mps2-an385 (Cortex-M3, UART0 on a pty, the
  configuration kept through semihosting in the work directory), ``make -C firmware_ref
  qemu-device``. Boots take a second or more, so only the tests marked ``@on_qemu`` run it in
  the default suite (identity, reads/writes and refusals through ``Device``, every outcome
  class, a reboot); its legs of triggers and fault clears, pipelined commands through a lossy
  link, the YMODEM transfer and the CLI (``@on_qemu_slow``) run with ``--run-slow``.
- ``microbit`` — the same core on an M0-class CPU: QEMU's micro:bit (nRF51822, Cortex-M0, 16 KiB
  RAM; the RX interrupt fills a ring, the configuration in two A/B pages through semihosting),
  ``make -C firmware_ref qemu-device BOARD=microbit``; in the ``@on_qemu`` tests beside ``qemu``.

Every C leg is a separate process on its own pty; ``restart()`` kills it (SIGKILL: no chance to
save anything late; the simulator's serving thread is stopped) and starts it again on the same
flash directory: the configuration must come
back and the boot epoch must be new. The C legs skip, naming the tool, only when make/gcc (or
arm-none-eabi-gcc/qemu-system-arm) are missing.

What the matrix checks, on every leg: reads, set-only writes, refusals, conditional writes,
triggers and W1C fault clears through ``idemlink.host.device.Device`` and through the CLI
(``idemlink read/write/trigger/faults/clear --json``); each session outcome class for its own
reason (EXECUTED, REPLAYED, IDEMPOTENCY_CONFLICT, ANSWER_EVICTED, TOO_OLD, EPOCH_MISMATCH) with
the host outcome it maps to (OK, NOT_EXECUTED, UNKNOWN; REJECTED from a Modbus exception);
sessions through a lossy ``faulty://`` link (loss, duplication, corruption), one command at a
time and eight in flight, with every command acting exactly once; reboots, and one host session
across a power cut on a fixed port (socat; sim and posix). The C device's RTU face on a shared
bus (another slave's answers skipped by their length) is checked against the shared vectors
``tests/vectors/rtu_shared_bus.json`` and on a two-slave bus of real processes.

- ``bus`` — the posix C device at address 2 of a mixed half-duplex bus (issue 22 item 6), between
  two simulated devices (addresses 1 and 3) on the simulated medium (``idemlink.device_sim.bus``
  with a ``ProcessStation``), served on one pty by a thread of this process, every command
  addressed; ``restart()`` is the C process restarted on its flash directory (a single-device
  reboot). ``bus-qemu`` is the same with the micro:bit image built with the bus (``make
  qemu-device-m0 IDL_OPTS=-DIDL_BUS=1 BUILD=build/bus``), in the slow set. On a bus: identity,
  reads, writes and refusals, triggers and fault clears, a reboot, and (slow: 3 s of retries;
  tests/test_bus_mixed.py's soak keeps loss on a mixed bus in the default run) a lossy link; not the
  hand-made unaddressed frames of the outcome-class test (every device on a bus would answer).

File transfers (YMODEM, 0x44 FILE_RECEIVE): ``test_file_transfer_ymodem`` on all three.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import serial
from support import firmware, ptys
from support.timing import read_line

import idemlink.device_sim  # noqa: F401  (registers the faulty:// handler with pyserial)
from idemlink.cli import main as cli_main
from idemlink.device_sim.bus import Bus as Medium
from idemlink.device_sim.bus import BusConfig
from idemlink.device_sim.bus_station import ProcessStation, c_device_command, qemu_device_command
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.device_sim.serve import serve_bus
from idemlink.host.device import Device
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import GENERATION_RESERVE, DeviceCore
from idemlink.protocol.frame import Flags, Frame, FrameDecoder, FrameType, crc32c, encode_frame
from idemlink.protocol.modbus import FileInfoResponse, FileInfoStatus
from idemlink.protocol.outcome import STATUS_TABLE, ModbusException, Outcome, Status
from idemlink.protocol.payloads import DeviceInfo
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.pytest_plugin import start_pty_sim

VECTORS = Path(__file__).resolve().parent / "vectors" / "rtu_shared_bus.json"
NO_FLAGS = Flags(0)
QEMU_CMD = ["qemu-system-arm", "-machine", "mps2-an385", "-nographic", "-monitor", "none",
            "-serial", "pty", "-semihosting-config", "enable=on,target=native", "-kernel"]


# ---- building the C legs --------------------------------------------------------------------------


def posix_binary() -> Path:
    return firmware.device_binary()


def qemu_elf() -> Path:
    return firmware.qemu_device_elf()


# ---- the three implementations --------------------------------------------------------------------


class LineDevice:
    """A device process serving a pty; ``kind`` is ``sim``, ``posix`` or ``qemu``."""

    kind = ""
    device_id: str | None = None  #: the id it advertises when fixed by the build (QEMU)
    timeout = 0.2  #: seconds ``open()`` waits for each answer

    def __init__(self, flash: Path) -> None:
        self.flash = flash
        flash.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[str] | None = None
        self.path = ""
        self.start()

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command(), cwd=self.flash, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = read_line(self.proc.stdout, self.proc)
        match = re.search(r"(/dev/\S+?)(?:\s|$)", line)
        self.path = match.group(1) if match else line
        assert self.path.startswith("/dev/"), line

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Power cut and boot on the same flash directory."""
        self.kill()
        self.start()

    def stop(self) -> int:
        """SIGTERM; returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=10)
        rc = self.proc.returncode
        self.proc = None
        return rc

    def open(self, url: str | None = None, *, timeout: float | None = None,
             attempts: int = 5) -> Device:
        return Device.open(url or self.path, regmap=DEFAULT_MAP,
                           timeout=self.timeout if timeout is None else timeout,
                           attempts=attempts)


class SimLine(LineDevice):
    """The Python simulator served on a pty by a thread of this process (``idemlink sim`` does
    the same in its own process; starting Python again would cost a second per device)."""

    kind = "sim"

    def start(self) -> None:
        self.served = start_pty_sim(SimulatedDevice(flash_dir=self.flash, trigger_duration=60))
        self.path = self.served.path

    def kill(self) -> None:
        if self.path:
            self.served.close()
            self.path = ""

    def stop(self) -> int:
        self.kill()
        return 0


class PosixLine(LineDevice):
    kind = "posix"

    def __init__(self, flash: Path, binary: Path) -> None:
        self.binary = binary
        super().__init__(flash)

    def command(self) -> list[str]:
        return [str(self.binary), "--flash-dir", str(self.flash), "--trigger-duration", "60"]


class QemuLine(LineDevice):
    kind = "qemu"
    device_id = "qemu-mps2-an385"
    #: QEMU looks again at a pty whose other end was closed once a second: the first HELLO after
    #: a reopen may wait that long
    timeout = 0.5

    def __init__(self, flash: Path, elf: Path) -> None:
        self.elf = elf
        super().__init__(flash)

    def command(self) -> list[str]:
        return [*QEMU_CMD, str(self.elf)]

    def start(self) -> None:
        """The pty exists before the emulated MCU runs: wait for its first HELLO_REPLY."""
        super().start()
        with Device.open(self.path, timeout=0.5, attempts=10):
            pass


class MicrobitLine(QemuLine):
    """The Cortex-M0 build on QEMU's micro:bit, run directly (no id= on its command line: the
    build's default id)."""

    kind = "microbit"
    device_id = "qemu-microbit"

    def command(self) -> list[str]:
        return ["qemu-system-arm", "-machine", "microbit", "-display", "none", "-monitor",
                "none", "-serial", "pty", "-semihosting-config", "enable=on,target=native",
                "-kernel", str(self.elf)]


class BusLine(LineDevice):
    """The C device at ``ADDRESS`` on a mixed simulated bus served on a pty by a thread."""

    kind = "bus"
    ADDRESS = 2
    timeout = 0.3

    def __init__(self, flash: Path, command: str) -> None:
        self.command_text = command
        self.station: ProcessStation | None = None
        super().__init__(flash)

    def start(self) -> None:
        from idemlink.device_sim.pty import open_pty

        now = time.monotonic()
        self.station = ProcessStation(self.command_text, self.ADDRESS, self.flash)
        sims = [SimulatedDevice(seed=a, address=a, now=now, trigger_duration=60) for a in (1, 3)]
        self.medium = Medium([sims[0], self.station, sims[1]], BusConfig(), start=now)
        self.pty = open_pty()
        self.transport = self.pty.transport()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=serve_bus, daemon=True,
                                       args=(self.medium, self.transport, self.stopping))
        self.thread.start()
        self.path = self.pty.slave_path

    def kill(self) -> None:
        if self.station is not None:
            self.stopping.set()
            self.thread.join(10)
            self.station.close()
            self.transport.close()
            self.pty.close()
            self.station = None

    def restart(self) -> None:
        """One device's power cycle: the C process restarted on its flash directory."""
        assert self.station is not None
        self.station.reboot(time.monotonic())
        self.station.wait_up()

    def stop(self) -> int:
        self.kill()
        return 0

    def open(self, url: str | None = None, *, timeout: float | None = None,
             attempts: int = 5) -> Device:
        # one request in flight, as docs/BUS.md tells a user of a half-duplex bus: pipelined
        # reads collided with the previous read's answer on the medium, and under load one read
        # lost all its 12 attempts that way (an honest UNKNOWN, but not what this leg tests)
        return Device.open(url or self.path, regmap=DEFAULT_MAP, address=self.ADDRESS,
                           timeout=self.timeout if timeout is None else timeout,
                           attempts=attempts, max_inflight=1)


def make_line_device(kind: str, flash: Path) -> LineDevice:
    if kind == "bus":
        return BusLine(flash, c_device_command(posix_binary(), 60))
    if kind == "bus-qemu":
        firmware.make_once("qemu-device-m0", "IDL_OPTS=-DIDL_BUS=1", "BUILD=build/bus",
                           tools=("arm-none-eabi-gcc", "qemu-system-arm"))
        return BusLine(flash, qemu_device_command(
            firmware.QEMU_TOOL, "microbit", firmware.BUILD / "bus" / "qemu-microbit" /
            "idemlink-device.elf", 60))
    if kind == "posix":
        return PosixLine(flash, posix_binary())
    if kind == "qemu":
        return QemuLine(flash, qemu_elf())
    if kind == "microbit":
        return MicrobitLine(flash, firmware.qemu_m0_device_elf())
    return SimLine(flash)


#: the implementations of a test, and the QEMU subset (both boards)
ALL = ["sim", "posix", "qemu", "microbit"]
FAST = ["sim", "posix"]
on_qemu = pytest.mark.parametrize("line_device", ALL, indirect=True)
#: the QEMU leg in the slow set only: its boot costs seconds and the behaviour is the C core's,
#: which the posix leg runs in the default suite (with the QEMU leg of identity, every outcome
#: class and a reboot, and tests/test_c_file_receive.py's transfer into the QEMU device)
on_qemu_slow = pytest.mark.parametrize(
    "line_device", ["sim", "posix", pytest.param("qemu", marks=pytest.mark.slow)], indirect=True)
not_on_qemu = pytest.mark.parametrize("line_device", FAST, indirect=True)
#: the mixed bus leg (issue 22 item 6): the posix C device among simulated ones; its QEMU
#: representative (micro:bit) in the slow set
ON_BUS = ["bus", pytest.param("bus-qemu", marks=pytest.mark.slow)]
on_qemu_and_bus = pytest.mark.parametrize("line_device", [*ALL, *ON_BUS], indirect=True)
on_qemu_slow_and_bus = pytest.mark.parametrize(
    "line_device", ["sim", "posix", pytest.param("qemu", marks=pytest.mark.slow), "bus"],
    indirect=True)
not_on_qemu_but_bus = pytest.mark.parametrize(
    "line_device", [*FAST, pytest.param("bus", marks=pytest.mark.slow)], indirect=True)


@pytest.fixture
def line_device(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LineDevice]:
    """A fresh device of the requested implementation on its own pty and flash directory."""
    dev = make_line_device(str(request.param), tmp_path / "flash")
    try:
        yield dev
    finally:
        dev.kill()


# ---- through Device --------------------------------------------------------------------------------


@on_qemu_and_bus
def test_identity_reads_writes_refusals(line_device: LineDevice) -> None:
    with line_device.open() as dev:
        info = dev.info
        assert info is not None and info.map_hash == DEFAULT_MAP.hash
        assert info.map_name == DEFAULT_MAP.name and info.contract_hash == contract_hash()
        if line_device.device_id is not None:
            assert info.device_id == line_device.device_id
        assert dev.read("temperature", 3).values == (250, 450, 1200)
        assert dev.write({"threshold": 420, "mode": 2, "fan_setpoint": 75}).ok
        assert dev.read("threshold", 3).values == (420, 2, 75)
        assert dev.read("generation").values == (1,)
        assert dev.write({"threshold": 420}).ok  # set-only: the same value changes nothing
        assert dev.read("generation").values == (1,)
        bad = dev.write({"fan_setpoint": 101})
        assert bad.outcome is Outcome.REJECTED
        assert bad.exception is ModbusException.ILLEGAL_DATA_VALUE
        assert dev.read("fan_setpoint").values == (75,)
        stale = dev.write_if_generation(7, {"threshold": 1})
        assert stale.outcome is Outcome.NOT_EXECUTED
        assert dev.write_if_generation(1, {"threshold": 430}).ok
        assert dev.read("threshold", 2).values == (430, 2)


@on_qemu_slow_and_bus
def test_trigger_and_fault_clears(line_device: LineDevice) -> None:
    with line_device.open() as dev:
        assert [dev.trigger().code, dev.trigger().code] == [0, 0x0101]  # started, then RUNNING
        assert dev.trigger_status().values == (1,)
        assert dev.trigger_reset().code == 0
        assert dev.trigger_status().values == (0,)
        assert dev.write({"threshold": 100}).ok  # temperature 250 > 100: over-temperature
        assert dev.read("faults").values == (1,)
        assert dev.clear_faults(1).ok
        assert dev.read("faults").values == (1,)  # the condition holds: still latched
        assert dev.write({"threshold": 300}).ok
        assert dev.clear_faults(1).ok
        assert dev.read("faults").values == (0,)
        assert dev.clear_faults(8).exception is ModbusException.ILLEGAL_DATA_VALUE


# ---- every outcome class, for its reason ----------------------------------------------------------


def _exchange(port: serial.Serial, wire: bytes) -> Frame:
    """Send one frame; return the answer with its sequence number (answers to earlier frames,
    e.g. a boot probe's HELLOs answered late, and the cut tail of one, are passed over)."""
    probe = FrameDecoder()
    probe.receive_data(wire)
    sent = probe.next_event()
    assert isinstance(sent, Frame)
    want = FrameType.HELLO_REPLY if sent.type is FrameType.HELLO else FrameType.RESPONSE
    port.write(wire)
    decoder = FrameDecoder()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        decoder.receive_data(port.read(port.in_waiting or 1))
        for event in iter(decoder.next_event, None):
            if isinstance(event, Frame) and event.type is want and event.seq == sent.seq:
                return event
    raise AssertionError("no answer")


def _outcome(frame: Frame) -> Outcome:
    return STATUS_TABLE[Status(frame.payload[0])].outcome


@on_qemu
def test_every_outcome_class_for_its_reason(line_device: LineDevice) -> None:
    """Hand-made frames, one reason each; the status on the wire and the host outcome it maps
    to. Sequence numbers: the device's own hand-out starts at HELLO's next_seq."""
    port = serial.serial_for_url(line_device.path, timeout=0.05)
    try:
        hello = _exchange(port, encode_frame(FrameType.HELLO, 1, 0, bytes([1]) + contract_hash()))
        info = DeviceInfo.decode(hello.payload)
        epoch, base = hello.epoch, info.next_seq

        def ask(seq: int, pdu: bytes, flags: Flags = NO_FLAGS, ep: int | None = None) -> Frame:
            return _exchange(port, encode_frame(FrameType.REQUEST, seq, epoch if ep is None
                                                else ep, pdu, flags))

        def write(value: int) -> bytes:
            return struct.pack(">BHH", 6, 4, value)

        executed = ask(base, write(500))
        assert executed.payload == b"\x00" + write(500) and not executed.flags & Flags.REPLAY
        replayed = ask(base, write(500), Flags.RETRANSMIT)
        assert replayed.payload == executed.payload and replayed.flags & Flags.REPLAY
        conflict = ask(base, write(501))
        assert conflict.payload == bytes([Status.IDEMPOTENCY_CONFLICT])
        for i in range(1, info.replay_slots + 1):  # K newer answers push the first one out
            assert ask(base + i, write(600 + i)).payload[0] == Status.OK
        evicted = ask(base, write(500), Flags.RETRANSMIT)
        assert evicted.payload == bytes([Status.ANSWER_EVICTED])
        far = base + info.window + 10
        assert ask(far, write(700)).payload[0] == Status.OK
        too_old = ask(base + 1, write(601), Flags.RETRANSMIT)
        assert too_old.payload == bytes([Status.TOO_OLD])
        wrong = ask(far + 1, write(701), ep=epoch ^ 1)
        assert wrong.payload == bytes([Status.EPOCH_MISMATCH]) + (epoch ^ 1).to_bytes(4, "little")
        read = ask(far + 2, struct.pack(">BHH", 3, 3, 2))
        # executions: base, K newer ones, far: the generation moved once per execution
        assert read.payload == b"\x00\x03\x04" + struct.pack(
            ">HH", info.replay_slots + 2, 700)
        assert [_outcome(f) for f in (executed, replayed, conflict, evicted, too_old, wrong)] == [
            Outcome.OK, Outcome.OK, Outcome.NOT_EXECUTED, Outcome.UNKNOWN, Outcome.UNKNOWN,
            Outcome.NOT_EXECUTED]
    finally:
        port.close()
    with line_device.open() as dev:  # REJECTED: a Modbus exception, nothing changed
        bad = dev.write({"mode": 3})
        assert bad.outcome is Outcome.REJECTED and dev.read("mode").values == (1,)


# ---- a lossy line ----------------------------------------------------------------------------------


@not_on_qemu_but_bus  # QEMU: the pipelined case below (and tests/test_c_device.py, one at a time)
def test_every_command_acts_once_over_a_lossy_link(line_device: LineDevice) -> None:
    url = (f"faulty://{line_device.path}?frame_loss=0.2&frame_dup=0.1&frame_corrupt=0.05"
           "&baud=115200&latency_ms=1&seed=11")
    n = 10
    # the line's own answer time at least (the bus: a C process behind the medium's turnaround;
    # 0.1 s made a read UNKNOWN after 12 attempts on a machine at load 5)
    with line_device.open(url, timeout=max(0.1, line_device.timeout), attempts=12) as dev:
        results = [dev.write({"threshold": 300 + i}) for i in range(n)]
        results += dev.run([dev.read_command("threshold")] * 4)
        results.append(dev.trigger())
        results.append(dev.clear_faults(1))
        assert [r.outcome for r in results] == [Outcome.OK] * len(results)
        assert results[-3].values == (300 + n - 1,)
        assert results[-2].code == 0
        assert dev.session.counters.retries > 0
        assert dev.read("generation").values == (n,)  # one execution per write
        assert dev.trigger().code == 0x0101  # the trigger ran once: RUNNING, not restarted


@on_qemu_slow
def test_pipelined_commands_over_a_lossy_link(line_device: LineDevice) -> None:
    """Eight commands in flight at once through loss, duplication and corruption: each write
    acts once, and the conditional write that follows finds the generation they made."""
    url = (f"faulty://{line_device.path}?frame_loss=0.15&frame_dup=0.1&frame_corrupt=0.05"
           "&baud=115200&latency_ms=1&seed=29")
    with line_device.open(url, timeout=0.15, attempts=12) as dev:
        commands = [dev.write_command({"threshold": 200 + i}) for i in range(16)]
        commands += [dev.write_command({"fan_setpoint": i}) for i in range(8)]
        results = dev.run(commands)
        assert [r.outcome for r in results] == [Outcome.OK] * len(results)
        assert dev.read("threshold", 3).values == (215, 1, 7)
        assert dev.read("generation").values == (24,)
        assert dev.write_if_generation(24, {"mode": 0}).ok
        assert dev.read("generation").values == (25,)


# ---- reboots ---------------------------------------------------------------------------------------


@on_qemu_and_bus
def test_a_reboot_keeps_the_configuration_and_draws_a_new_epoch(line_device: LineDevice) -> None:
    with line_device.open() as dev:
        assert dev.write({"threshold": 440, "mode": 1, "fan_setpoint": 9}).ok
        assert dev.trigger().code == 0
        ident = dev.info.device_id if dev.info else None
        epoch = dev.session.epoch
    ceiling = 1 + GENERATION_RESERVE  # saved by the write: the generation the next boot shows
    line_device.restart()
    with line_device.open() as dev:
        assert dev.read("threshold", 4).values == (440, 1, 9, 0)
        assert dev.read("generation").values == (ceiling,)
        assert dev.read("self_clean").values == (0,)  # volatile: IDLE after a boot
        assert dev.info is not None and dev.info.device_id == ident
        assert dev.session.epoch != epoch
        assert dev.write({"mode": 0}).ok  # reaches the ceiling: a new one saved
    line_device.restart()
    with line_device.open() as dev:
        assert dev.read("threshold", 3).values == (440, 0, 9)
        assert dev.read("generation").values == (ceiling + 1 + GENERATION_RESERVE,)


@pytest.fixture
def socat_pair(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two linked ptys that outlive the devices started on one end (a fixed port path)."""
    with ptys.socat_pair(tmp_path, "line") as pair:
        yield pair


def _on_port(kind: str, port: str, flash: Path) -> subprocess.Popen[str]:
    if kind == "posix":
        cmd = [str(posix_binary()), "--port", port, "--flash-dir", str(flash)]
    else:
        cmd = [sys.executable, "-m", "idemlink", "sim", "--port", port, "--flash-dir", str(flash)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert read_line(proc.stdout, proc) == port
    return proc


@pytest.mark.parametrize("kind", FAST)
def test_one_host_session_rides_over_a_power_cut(kind: str, socat_pair: tuple[str, str],
                                                 tmp_path: Path) -> None:
    """The device is killed and booted again on the same port and flash while the host keeps
    its ``Device`` open: the next command meets EPOCH_MISMATCH (not executed), the host says
    HELLO again and the command runs once; the configuration written before the cut is there."""
    device_end, host_end = socat_pair
    proc = _on_port(kind, device_end, tmp_path / "flash")
    try:
        with Device.open(host_end, regmap=DEFAULT_MAP, timeout=0.3, attempts=8) as dev:
            assert dev.write({"threshold": 450}).ok
            epoch = dev.session.epoch
            proc.kill()
            proc.communicate(timeout=10)
            proc = _on_port(kind, device_end, tmp_path / "flash")
            after = dev.write({"mode": 2})
            assert after.ok, after
            assert dev.session.epoch != epoch
            assert dev.read("threshold", 2).values == (450, 2)
            # each write ran once: the first saved the ceiling 1 + 64, the boot started there
            assert dev.read("generation").values == (2 + GENERATION_RESERVE,)
            assert dev.trigger().code == 0
    finally:
        proc.kill()
        proc.communicate(timeout=10)


# ---- through the CLI -------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str,
         timeout: float = 0.2) -> tuple[int, dict[str, object]]:
    rc = cli_main([argv[0], "--port", argv[1], "--json", "--timeout", str(timeout), *argv[2:]])
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1]) if out else {}


@on_qemu_slow
def test_cli_read_write_trigger_faults_clear(line_device: LineDevice,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    p = line_device.path
    wait = line_device.timeout  # each command opens the port anew

    def cli(*argv: str) -> tuple[int, dict[str, object]]:
        return _cli(capsys, *argv, timeout=wait)

    rc, out = cli("write", p, "threshold=raw:100", "mode=2")
    assert rc == 0 and out["outcome"] == "OK"
    rc, out = cli("read", p, "threshold", "mode", "generation")
    assert rc == 0 and out["values"] == {"threshold": 100, "mode": 2, "generation": 1}
    rc, out = cli("write", p, "fan_setpoint=raw:101")
    assert rc != 0 and out["outcome"] == "REJECTED"
    rc, out = cli("trigger", p)
    assert rc == 0 and out["code"] == 0 and out["code_name"] == "ACCEPTED", out
    rc, out = cli("faults", p)
    assert rc == 0 and out["faults"] == {"faults": {
        "bits": {"fan_stall": False, "over_temperature": True, "sensor_fault": False},
        "latched": ["over_temperature"], "value": 1}}
    rc, out = cli("write", p, "threshold=raw:300")
    assert rc == 0
    rc, out = cli("clear", p, "over_temperature")
    assert rc == 0 and out["outcome"] == "OK"
    rc, out = cli("read", p, "faults", "generation")
    assert rc == 0 and out["values"] == {"faults": 0, "generation": 2}


@not_on_qemu
def test_cli_through_a_lossy_url(line_device: LineDevice,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = (f"faulty://{line_device.path}?frame_loss=0.3&frame_dup=0.2&baud=115200"
           "&latency_ms=1&seed=3")
    for value in (301, 302, 303):
        rc, out = _cli(capsys, "write", url, f"threshold=raw:{value}", "--attempts", "15")
        assert rc == 0 and out["outcome"] == "OK", out
    rc, out = _cli(capsys, "read", line_device.path, "threshold", "generation")
    assert out["values"] == {"threshold": 303, "generation": 3}


# ---- file transfers: YMODEM (0x44 FILE_RECEIVE) -------------------------------------------------


@on_qemu_slow
def test_file_transfer_ymodem(line_device: LineDevice, tmp_path: Path) -> None:
    """FILE_RECEIVE hands the line to YMODEM on every implementation: a batch arrives and reads
    back by FILE_INFO (size and CRC-32C), the same files again are "already on the device,
    identical" (nothing sent), a different file under a stored name is refused before sending
    without ``overwrite`` (the stored file unchanged) and replaces it with; then frames again. The C
    receiver byte for byte against Python: tests/test_c_ymodem.py."""
    src = tmp_path / "src"
    src.mkdir()
    first = src / "app.bin"
    first.write_bytes(bytes(range(256)) * 13 + b"tail")  # 3332 B: 1K blocks and a short one
    second = src / "notes.txt"
    second.write_bytes(b"retries are harmless\n" * 7)
    names = [str(first), str(second)]
    with line_device.open() as dev:
        _, report = dev.send_files(names)
        assert report is not None and report.ok, report
        assert [(f.ok, f.verified) for f in report.files] == [(True, True)] * 2
        for f in (first, second):
            data = f.read_bytes()
            assert dev.file_info(f.name).file == FileInfoResponse(
                FileInfoStatus.PRESENT, len(data), crc32c(data))
        _, again = dev.send_files(names)
        assert again is not None and [f.identical for f in again.files] == [True, True]
        first.write_bytes(b"version 2 " * 50)
        with pytest.raises(ValueError, match=r"different app\.bin .*--overwrite"):
            dev.send_files([str(first)])  # asked by FILE_INFO first: nothing is sent
        old = bytes(range(256)) * 13 + b"tail"
        assert dev.file_info(first.name).file == FileInfoResponse(
            FileInfoStatus.PRESENT, len(old), crc32c(old))
        _, replaced = dev.send_files([str(first)], overwrite=True)
        assert replaced is not None and replaced.ok, replaced
        new = first.read_bytes()
        assert dev.file_info(first.name).file == FileInfoResponse(
            FileInfoStatus.PRESENT, len(new), crc32c(new))
        assert dev.read("threshold").ok  # framed again after every batch


# ---- the C RTU face on a shared bus ---------------------------------------------------------------


def _shim() -> ctypes.CDLL:
    lib_path = firmware.core_library()
    lib = ctypes.CDLL(str(lib_path))
    p = ctypes.c_void_p
    lib.idl_shim_sizeof.restype = ctypes.c_size_t
    lib.idl_shim_init.argtypes = [p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p,
                                  ctypes.c_uint32]
    lib.idl_shim_rtu_feed.argtypes = [p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_uint32, p, ctypes.c_size_t]
    lib.idl_shim_rtu_feed.restype = ctypes.c_size_t
    lib.idl_shim_rtu_counter.argtypes = [p, ctypes.c_uint]
    lib.idl_shim_rtu_counter.restype = ctypes.c_uint32
    return lib


RTU_OTHER_UNIT, RTU_BAD_CRC, RTU_OTHER_ANSWER = 2, 3, 5  #: idl_rtu_counter_t


def _cases() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]
    return cases


@pytest.mark.parametrize("case", _cases(), ids=lambda c: str(c["name"]))
def test_c_rtu_face_skips_other_slaves_answers(case: dict[str, object]) -> None:
    """The shared vectors through the C RTU face (ctypes): the same answers as ``RtuServer``
    (``tests/test_rtu_server.py`` runs them there), and the same count of skipped answers."""
    lib = _shim()
    state = ctypes.create_string_buffer(lib.idl_shim_sizeof())
    lib.idl_shim_init(state, 1, 0, b"bus", 2000)
    out = ctypes.create_string_buffer(1024)
    now = 0
    answers = []
    for read in case["reads"]:  # type: ignore[attr-defined]
        now += 1000
        data = bytes.fromhex(str(read))
        n = lib.idl_shim_rtu_feed(state, data, len(data), 1, now, out, len(out))
        answers.append(out.raw[:n].hex())
    assert answers == case["answers"]
    assert lib.idl_shim_rtu_counter(state, RTU_OTHER_ANSWER) == case["skipped"]


class Bus:
    """A multi-drop RS-485 line between ptys: what any station sends reaches every other one.
    ``coalesce``: a slave's answer reaches the other slaves together with the master's next
    bytes, in one burst (a line too fast for the slaves to see the pause between them)."""

    def __init__(self, master: str, slaves: list[str], coalesce: bool) -> None:
        self.ports = [serial.Serial(p, 115200, timeout=0) for p in [master, *slaves]]
        self.coalesce = coalesce
        self.stop = threading.Event()
        self.held: list[bytearray] = [bytearray() for _ in self.ports]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        fds = {p.fileno(): i for i, p in enumerate(self.ports)}
        while not self.stop.is_set():
            ready, _, _ = select.select(list(fds), [], [], 0.01)
            for fd in ready:
                i = fds[fd]
                data = self.ports[i].read(4096)
                for j, port in enumerate(self.ports):
                    if j == i:
                        continue
                    if self.coalesce and i != 0 and j != 0:
                        self.held[j] += data  # delivered with the master's next bytes
                    else:
                        port.write(bytes(self.held[j]) + data)
                        self.held[j].clear()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for p in self.ports:
            p.close()


@pytest.fixture
def rtu_bus(tmp_path: Path) -> Iterator[Callable[[bool], tuple[str, list[subprocess.Popen[str]]]]]:
    """Two C RTU slaves (units 1 and 2) and a master end on one bus: ``factory(coalesce)``
    returns the master's port and the two devices (stop them to read their counters)."""
    binary = posix_binary()
    pairs = contextlib.ExitStack()
    devices: list[subprocess.Popen[str]] = []
    buses: list[Bus] = []

    def factory(coalesce: bool) -> tuple[str, list[subprocess.Popen[str]]]:
        ends = [pairs.enter_context(ptys.socat_pair(tmp_path, name))
                for name in ("master", "s1", "s2")]
        for unit, (a, _) in ((1, ends[1]), (2, ends[2])):
            dev = subprocess.Popen([str(binary), "--port", a, "--modbus-rtu", "--unit", str(unit),
                                    "--stats", "--flash-dir", str(tmp_path / f"flash{unit}")],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert read_line(dev.stdout, dev) == a
            devices.append(dev)
        buses.append(Bus(ends[0][1], [ends[1][1], ends[2][1]], coalesce))
        return ends[0][0], devices

    yield factory
    for bus in buses:
        bus.close()
    for dev in devices:
        if dev.poll() is None:
            dev.kill()
            dev.communicate(timeout=5)
    pairs.close()


def _stats(dev: subprocess.Popen[str]) -> dict[str, int]:
    dev.send_signal(signal.SIGTERM)
    _, err = dev.communicate(timeout=5)
    assert dev.returncode == 0, err
    line = err.strip().splitlines()[-1]
    return {k: int(v) for k, v in (w.split("=") for w in line.split() if "=" in w)}


@pytest.mark.parametrize("coalesce", [False, True], ids=["paced", "answers-run-into-requests"])
def test_two_c_slaves_on_one_bus_answer_only_their_own_requests(
        rtu_bus: Callable[[bool], tuple[str, list[subprocess.Popen[str]]]],
        coalesce: bool) -> None:
    """minimalmodbus as the master of a bus with two C slaves: each unit answers its own
    requests only, every time (a slave that took the other's answer for a damaged request would
    drop our next request with it); each slave counts the other's answers as skipped, not as
    bad CRCs."""
    import minimalmodbus

    master, devices = rtu_bus(coalesce)
    insts = {}
    for unit in (1, 2):
        inst = minimalmodbus.Instrument(master, unit)
        inst.serial.baudrate = 115200
        inst.serial.timeout = 0.5
        insts[unit] = inst
    rounds = 10
    try:
        for i in range(rounds):
            insts[1].write_register(4, 300 + i, functioncode=6)
            insts[2].write_register(4, 600 + i, functioncode=6)
            assert insts[1].read_registers(4, 3) == [300 + i, 1, 50]
            assert insts[2].read_registers(4, 3) == [600 + i, 1, 50]
        assert insts[1].read_register(4) == 300 + rounds - 1  # brings unit 2's last answer along
    finally:
        for inst in insts.values():
            inst.serial.close()
    one, two = (_stats(d) for d in devices)
    assert (one["answered"], two["answered"]) == (2 * rounds + 1, 2 * rounds)
    for mine in (one, two):
        # FC06 answers are echoes, read as requests to the other unit; FC03 answers are skipped.
        # The last request and answer may still be on their way to the other slave at the stop.
        assert mine["other_unit"] in (3 * rounds, 3 * rounds + 1), mine
        assert mine["other_answer"] in (rounds, rounds + 1), mine
        assert mine["bad_crc"] == mine["dropped"] == 0, mine


def test_shared_bus_vectors_through_rtu_server() -> None:
    """The same vectors through the Python ``RtuServer`` (the reference the C face follows)."""
    for case in _cases():
        server = RtuServer(DeviceCore(DEFAULT_MAP), unit=1)
        now = 0.0
        answers = []
        for read in case["reads"]:  # type: ignore[attr-defined]
            now += 1.0
            server.receive_data(bytes.fromhex(str(read)), now)
            server.tick(now + 0.2)
            answers.append(server.data_to_send().hex())
        assert answers == case["answers"], case["name"]
        assert server.decoder.skipped == case["skipped"], case["name"]

