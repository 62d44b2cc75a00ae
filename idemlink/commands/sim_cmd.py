"""``idemlink sim``: run the simulated device on a pseudo-terminal, a port or a pyserial URL.

Contract: by default the device speaks the framed idemlink protocol (``SimulatedDevice`` served by
``idemlink.device_sim.serve``); with ``--modbus-rtu`` it is a plain Modbus RTU slave
(``idemlink.device_sim.rtu_server``); with ``--modbus-tcp [HOST:]PORT`` that slave is served over
Modbus TCP instead (``idemlink.device_sim.tcp_server``; the first line is the address it listens
on, ``HOST:PORT``, the port the system picked for 0). Without ``--port`` a pty is created. The
port path is the FIRST line of stdout (flushed; with ``--json`` that line is ``{"schema":
"idemlink.sim/1", "port", "mode"}``), then the simulator serves until SIGINT or SIGTERM, closes
what it opened and exits 0 (a Ctrl-C while it is still opening its port or flash directory too: it
had served nothing).
A port that cannot be opened or a bad flash directory is a one-line error (exit 1). A flash
directory serves one simulator at a time (an exclusive ``flock`` on the directory, held while it
serves): a second one on the same directory is refused with one line, exit 1, nothing changed.
``--effects FILE`` appends the framed device's boots and executions to FILE (docs/SOAK.md).
``--port`` is served with ``--baudrate`` and the character format (``--bytesize``, ``--parity``,
``--stopbits``: 8N1, 8E1 with ``--modbus-rtu``); with ``--modbus-rtu`` the format and the baud rate
also set t3.5 (``rtu_timing``). Those, the unit, ``--modbus-rtu`` and the map may come from the
environment, a profile or the map's ``[link]`` (``idemlink.commands.connection``) — the port never
does: the simulator serves a new pty unless ``--port`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from idemlink.cli import (
    EXIT_OK,
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_regmap_option,
    regmap_from,
)
from idemlink.commands.connection import LINE_KEYS, add_connection_options
from idemlink.host.errors import PortError
from idemlink.output import add_json_option, print_json, wants_json

if TYPE_CHECKING:
    from idemlink.device_sim.rtu_server import RtuServer
    from idemlink.device_sim.serve import ServeTransport
    from idemlink.host.transport import SerialTransport
    from idemlink.protocol.device_core import DeviceCore


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sim", help="run the simulated device (prints its port path first)"
    )
    p.add_argument("--modbus-rtu", action="store_true", default=None,
                   help="serve as a plain Modbus RTU slave")
    p.add_argument("--plain", action="store_true",
                   help="with --modbus-rtu: a plain third-party slave (no idemlink functions: "
                        "0x41/0x42 answer exception 01); --control takes fault lines "
                        "('fault drop', 'fault late S', 'fault echo', 'fault mute', 'fault unit', "
                        "'fault clear', 'finish ADDRESS') and --effects records every request "
                        "it executed")
    p.add_argument("--modbus-tcp", metavar="[HOST:]PORT", default=None,
                   help="serve the --modbus-rtu slave over Modbus TCP instead, listening on "
                        "HOST:PORT (127.0.0.1 when only PORT is given; 0: a free port); the "
                        "first line of stdout is the address it listens on")
    p.add_argument("--port", help="serve on this port or pyserial URL instead of a new pty")
    p.add_argument("--unit", type=int, default=None, help="Modbus unit id (default 1)")
    p.add_argument("--flash-dir", help="directory keeping the configuration (and the device id) "
                   "across runs")
    p.add_argument("--device-id", default=None,
                   help="the id HELLO advertises (default: kept in --flash-dir, else drawn anew)")
    p.add_argument("--address", type=int, default=None, metavar="N",
                   help="the framed device's bus address, 1..247 (kept in --flash-dir): it also "
                        "answers frames addressed to N, acts on broadcast set-only writes and "
                        "ignores other addresses (docs/BUS.md; default: kept, else none)")
    p.add_argument("--key-file", metavar="F", default=None,
                   help="a keyed device (docs/SECURITY.md): its long-term key(s) from F (0600; "
                        "hex, the current key first, older ones accepted during a rotation "
                        "window), kept in --flash-dir for the next start; it then refuses every "
                        "frame without a valid MAC but HELLO")
    add_regmap_option(p)
    add_baudrate_option(p, default=None,
                        text="baud rate for --port (with --modbus-rtu it also sets t3.5; "
                             "default 115200)")
    add_char_format_options(p, modbus=True)
    add_json_option(p, "idemlink.sim/1")
    p.add_argument("--trigger-duration", "--trigger-seconds", dest="trigger_duration",
                   type=float, default=5.0, help="seconds a trigger stays RUNNING (default 5)")
    p.add_argument("--effects", metavar="FILE",
                   help="append every boot and execution to FILE as JSON lines (docs/SOAK.md), "
                        "the record `idemlink soak --device-cmd` judges")
    p.add_argument("--control", metavar="FIFO",
                   help="read the world's changes from this named pipe (created if absent): "
                        "'input ADDRESS VALUE', 'condition ADDRESS BITS' (docs/CLI.md); the framed "
                        "device also takes its provisioning steps: 'button press', 'button "
                        "release', 'provision-key PATH [SESSIONS]', 'factory-reset' "
                        "(docs/SECURITY.md)")
    p.add_argument("--bus", type=int, default=None, metavar="N",
                   help="serve N framed devices (addresses 1..N, or from --address) on one "
                        "simulated half-duplex bus (docs/BUS.md)")
    p.add_argument("--c-devices", type=int, default=0, metavar="K",
                   help="with --bus: K of the N devices are the posix C device, each its own "
                        "process on the same simulated medium (the last addresses; docs/BUS.md)")
    p.add_argument("--c-binary", metavar="PATH", default=None,
                   help="the posix C device for --c-devices (default: "
                        "firmware_ref/build/posix/idemlink-device of the checkout)")
    p.add_argument("--qemu-devices", type=int, default=0, metavar="K",
                   help="with --bus: K of the N devices are the C device on QEMU "
                        "(firmware_ref/tools/qemu-device; after the C devices)")
    p.add_argument("--qemu-board", choices=("mps2", "microbit"), default="mps2",
                   help="the QEMU board of --qemu-devices (default mps2)")
    p.add_argument("--qemu-elf", metavar="ELF", default=None,
                   help="the image for --qemu-devices, built with IDL_OPTS=-DIDL_BUS=1 (default: "
                        "firmware_ref/build/bus/qemu[-microbit]/idemlink-device.elf)")
    p.add_argument("--bus-device", metavar="CMD", action="append", default=[],
                   help="with --bus: one more device of the N given as a command with {port}, "
                        "{flash}, {effects} and {address} (repeatable; the last addresses)")
    p.add_argument("--turnaround", type=float, default=None, metavar="S",
                   help="with --bus: seconds a device waits after a request before answering "
                        "(default 0.001)")
    p.add_argument("--echo", action="store_true",
                   help="with --bus: the master hears its own bytes back, as through an RS-485 "
                        "adapter without echo suppression")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the framed simulator's boot epochs, mixed with the flash "
                        "directory's boot counter or fresh entropy (default: random)")
    add_connection_options(p, (*LINE_KEYS, "unit", "modbus_rtu", "regmap"))
    p.set_defaults(handler=run)


@contextlib.contextmanager
def _serving_end(args: argparse.Namespace) -> Iterator[tuple[ServeTransport, str]]:
    """The port to serve (``--port``, DTR/RTS low) or a new pty; closed on exit."""
    from idemlink.device_sim.pty import WRITE_STALL, open_pty
    from idemlink.host.errors import PortError
    from idemlink.host.transport import SerialTransport

    if args.port:
        try:
            port = SerialTransport(args.port, baudrate=args.baudrate, bytesize=args.bytesize,
                                   parity=args.parity, stopbits=args.stopbits)
            port.port.write_timeout = WRITE_STALL
        except PortError as exc:
            raise UserError(str(exc)) from None
        except (OSError, ValueError) as exc:  # the port refused the write timeout
            port.close()
            raise UserError(f"{args.port}: {exc}") from None
        try:
            yield _DroppingPort(port), args.port
        finally:
            port.close()
    else:
        pair = open_pty()
        try:
            yield pair.transport(), pair.slave_path
        finally:
            pair.close()


class _DroppingPort:
    """A ``--port`` whose writes give up after ``WRITE_STALL`` (a peer that stopped reading, a
    flow-controlled line): the timed-out write is ``WriteStalled``, which the serving loops drop
    and count, as on a pty."""

    def __init__(self, port: SerialTransport) -> None:
        self.port = port

    def read(self, timeout: float) -> bytes:
        return self.port.read(timeout)

    def write(self, data: bytes) -> None:
        import serial

        from idemlink.device_sim.pty import WriteStalled
        from idemlink.host.errors import PortError

        try:
            self.port.write(data)
        except PortError as exc:
            if isinstance(exc.__cause__, serial.SerialTimeoutException):
                raise WriteStalled(len(data)) from None
            raise


@contextlib.contextmanager
def _control(args: argparse.Namespace, core: DeviceCore,
             extra: Callable[[str, float], bool] | None = None,
             made: list[Any] | None = None,
             ) -> Iterator[Callable[[float], None] | None]:
    """``--control FIFO``: a ``between(now)`` hook for the serve loop that applies the pipe's
    lines to ``core`` and says each refused one on stderr (the device goes on serving)."""
    if not getattr(args, "control", None):
        yield None
        return
    from idemlink.device_sim.control import Control, ControlError

    try:
        control = Control(args.control, core, extra)
        if made is not None:
            made.append(control)
    except ControlError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"--control {args.control}: {exc.strerror or exc}") from None

    def between(now: float) -> None:
        for problem in control.apply_pending(now):
            print(f"idemlink sim: {problem}", file=sys.stderr, flush=True)

    try:
        yield between
    finally:
        control.close()


def _serve_until_signal(args: argparse.Namespace, serve: Callable[[ServeTransport,
                        threading.Event], object]) -> int:
    from idemlink.device_sim.serve import install_stop_signals

    with _serving_end(args) as (transport, path):
        stop = threading.Event()
        restore = install_stop_signals(stop)
        try:
            if wants_json(args):
                print_json("idemlink.sim/1", {
                    "port": path, "mode": ("modbus-rtu-plain" if getattr(args, "plain", False)
                                           else "modbus-rtu" if args.modbus_rtu else "framed")})
            else:
                print(path, flush=True)
            serve(transport, stop)
        except OSError as exc:  # includes host.device.PortError's pyserial/OS causes
            raise UserError(f"the port failed while serving: {exc}") from None
        except PortError as exc:  # the serial wrapper's typed failure
            raise UserError(f"the port failed while serving: {exc}") from None
        finally:
            restore()
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if not math.isfinite(args.trigger_duration) or args.trigger_duration < 0:
        raise UserError(f"trigger duration {args.trigger_duration} must be a finite number of "
                        "seconds >= 0")
    effects = getattr(args, "effects", None)
    if getattr(args, "address", None) is not None and (
            args.modbus_rtu or getattr(args, "modbus_tcp", None) is not None):
        raise UserError("--address is a framed idemlink device's bus address; a Modbus "
                        "slave's is --unit N")
    if getattr(args, "key_file", None) is not None and (
            args.modbus_rtu or getattr(args, "modbus_tcp", None) is not None):
        # keyed, yet serving everyone: a plain slave has no frames to sign (docs/SECURITY.md)
        raise UserError("--key-file keys the framed simulator; a plain Modbus slave has no "
                        "frames to sign, so it does not apply to --modbus-rtu / --modbus-tcp")
    bus_refusal = _bus_refusal(args)
    if bus_refusal:
        raise UserError(bus_refusal)
    if getattr(args, "modbus_tcp", None) is not None:
        return run_tcp(args)
    if getattr(args, "plain", False) and not args.modbus_rtu:
        raise UserError("--plain is a plain Modbus RTU slave: give it with --modbus-rtu")
    if getattr(args, "bus", None) is not None:
        try:
            return run_bus(args)
        except KeyboardInterrupt:
            return EXIT_OK
    if effects is not None:
        if args.modbus_rtu and not getattr(args, "plain", False):
            raise UserError("--effects records the framed simulator's executions, or with "
                            "--modbus-rtu --plain the requests the plain slave executed; it does "
                            "not apply to --modbus-rtu alone")
        try:
            open(effects, "a", encoding="utf-8").close()
        except OSError as exc:
            raise UserError(f"--effects {effects}: {exc.strerror}") from None
    try:
        with _flash_lock(args):
            if args.modbus_rtu:
                return run_rtu(args)
            return run_framed(args)
    except KeyboardInterrupt:  # still opening its port: stopping is the simulator's normal end
        return EXIT_OK


def _bus_refusal(args: argparse.Namespace) -> str | None:
    """Why these options cannot serve (None: they can): ``--bus`` with what it does not take,
    or ``--turnaround``/``--echo`` without it."""
    bus: int | None = getattr(args, "bus", None)
    turnaround: float | None = getattr(args, "turnaround", None)
    if bus is None:
        if turnaround is not None or getattr(args, "echo", False):
            return "--turnaround and --echo are the simulated bus's: give them with --bus N"
        return None
    from idemlink.protocol.frame import MAX_ADDRESS

    address: int | None = getattr(args, "address", None)
    first = address if address is not None else 1
    if not 1 <= bus <= MAX_ADDRESS or not 1 <= first <= MAX_ADDRESS + 1 - bus:
        return f"--bus {bus} from address {first}: the addresses must fit in 1..{MAX_ADDRESS}"
    given = [o for o, k in (("--modbus-rtu", "modbus_rtu"), ("--modbus-tcp", "modbus_tcp"),
                            ("--flash-dir", "flash_dir"),
                            ("--device-id", "device_id"), ("--effects", "effects"),
                            ("--control", "control")) if getattr(args, k, None)]
    if given:
        return (f"--bus serves simulated devices without {', '.join(given)} (each device's "
                "state lives in the process)")
    if turnaround is not None and not (math.isfinite(turnaround) and 0 <= turnaround < 10):
        return f"--turnaround {turnaround} must be 0..10 seconds"
    external = _external_count(args)
    if min(getattr(args, "c_devices", 0), getattr(args, "qemu_devices", 0)) < 0 or \
            external > bus:
        return (f"--bus {bus} has room for at most {bus} devices in other processes, not "
                f"{external} (--c-devices, --qemu-devices, --bus-device)")
    return None


def _external_count(args: argparse.Namespace) -> int:
    return (getattr(args, "c_devices", 0) + getattr(args, "qemu_devices", 0)
            + len(getattr(args, "bus_device", None) or ()))


def checkout_file(given: str | None, relative: str, what: str) -> str:
    """``given``, else ``relative`` in the current directory or in the checkout idemlink runs
    from; ``UserError`` naming how to build it when there is none."""
    from pathlib import Path

    if given is not None:
        if not Path(given).is_file():
            raise UserError(f"{what} {given}: no such file")
        return given
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / relative).is_file():
            return str(root / relative)
    raise UserError(f"no {what} at {relative}: build it (docs/BUS.md, \"Mixed buses\") or name it")


def external_commands(args: argparse.Namespace, first: int) -> list[tuple[int, str]]:
    """(address, command) of the bus's devices in other processes, from ``first`` on: the C
    devices, then the QEMU devices, then ``--bus-device`` commands."""
    from idemlink.device_sim.bus_station import c_device_command, qemu_device_command

    commands: list[str] = []
    if args.c_devices:
        binary = checkout_file(args.c_binary, "firmware_ref/build/posix/idemlink-device",
                                "posix C device (make -C firmware_ref device)")
        commands += [c_device_command(binary, args.trigger_duration)] * args.c_devices
    if args.qemu_devices:
        tool = checkout_file(None, "firmware_ref/tools/qemu-device", "QEMU device tool")
        sub = "qemu" if args.qemu_board == "mps2" else "qemu-microbit"
        elf = checkout_file(args.qemu_elf, f"firmware_ref/build/bus/{sub}/idemlink-device.elf",
                             "QEMU image with the bus (make -C firmware_ref qemu-device "
                             "IDL_OPTS=-DIDL_BUS=1 BUILD=build/bus)")
        commands += [qemu_device_command(tool, args.qemu_board, elf,
                                         args.trigger_duration)] * args.qemu_devices
    commands += list(args.bus_device)
    return list(zip(range(first, first + len(commands)), commands, strict=True))


def run_bus(args: argparse.Namespace) -> int:
    """``--bus N``: N framed devices on one simulated half-duplex bus, served on a new pty or on
    ``--port`` (``idemlink.device_sim.bus.Bus``, real time)."""
    import tempfile
    from pathlib import Path

    from idemlink.device_sim.bus import Bus, BusConfig, Station
    from idemlink.device_sim.bus_station import StationError, start_stations
    from idemlink.device_sim.device import MapNotServed, SimulatedDevice
    from idemlink.device_sim.serve import serve_bus

    regmap = regmap_from(args)
    first = args.address if args.address is not None else 1
    python = args.bus - _external_count(args)
    commands = external_commands(args, first + python)
    now = time.monotonic()
    salt = secrets.randbits(64)
    try:
        devices: list[Station] = [
            SimulatedDevice(seed=None if args.seed is None else args.seed + a,
                            trigger_duration=args.trigger_duration, now=now, regmap=regmap,
                            epoch_salt=salt, address=a, name=f"idemlink-sim-{a}")
            for a in range(first, first + python)]
    except MapNotServed as exc:
        raise UserError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="idemlink-bus-") as work:
        try:
            stations = start_stations(commands, Path(work))
        except StationError as exc:
            raise UserError(str(exc)) from None
        try:
            bus = Bus([*devices, *stations],
                      BusConfig(baud=args.baudrate or 115200,
                                turnaround=0.001 if args.turnaround is None else args.turnaround,
                                echo=args.echo), start=time.monotonic())
            return _serve_until_signal(args,
                                       lambda transport, stop: serve_bus(bus, transport, stop))
        finally:
            for station in stations:
                station.close()


@contextlib.contextmanager
def _flash_lock(args: argparse.Namespace) -> Iterator[None]:
    """Hold ``--flash-dir``'s exclusive lock while serving: a second simulator on the same
    directory is refused with one line before it reads or changes anything there."""
    if not args.flash_dir:
        yield
        return
    from idemlink.device_sim.flash import FlashBusyError, lock_flash_dir

    try:
        lock = lock_flash_dir(args.flash_dir)
    except FlashBusyError as exc:
        raise UserError(f"flash directory {exc}") from None
    except OSError as exc:
        raise UserError(f"flash directory {args.flash_dir}: {exc.strerror or exc}") from None
    with lock:
        yield


def _rtu_server(args: argparse.Namespace, *, port: bool) -> RtuServer:
    """The map's plain Modbus slave (``--plain``: with its faults and ground truth), its
    configuration in ``--flash-dir``; ``port``: served on a serial line (t3.5 from its rate)."""
    if not 1 <= args.unit <= 247:
        raise UserError(f"unit id {args.unit} outside 1..247")
    from idemlink.device_sim.flash import ConfigFlash
    from idemlink.device_sim.rtu_server import RtuServer
    from idemlink.protocol.char_format import CharFormat
    from idemlink.protocol.device_core import DeviceCore, SnapshotError

    regmap = regmap_from(args)
    core = DeviceCore(regmap, trigger_duration=args.trigger_duration, now=time.monotonic())
    try:
        flash = ConfigFlash(args.flash_dir) if args.flash_dir else None
        # t3.5 follows the line's baud rate and character format; a pty has no rate (1.75 ms)
        options: dict[str, Any] = dict(
            unit=args.unit, flash=flash, baudrate=args.baudrate if port else None,
            char_format=CharFormat(args.bytesize, args.parity, args.stopbits))
        if getattr(args, "plain", False):
            from idemlink.device_sim.plain_slave import PlainRtuServer

            server: RtuServer = PlainRtuServer(core, on_executed=_executed_writer(args),
                                               **options)
        else:
            server = RtuServer(core, **options)
        if flash is not None:  # after the saved configuration was read and checked
            flash.claim_map(regmap.name, regmap.hash.hex())
    except (OSError, SnapshotError) as exc:
        raise UserError(f"flash directory: {exc}") from None
    return server


def run_rtu(args: argparse.Namespace) -> int:
    """The same register map as a plain Modbus RTU slave."""
    server = _rtu_server(args, port=bool(args.port))
    extra: Callable[[str, float], bool] | None = None
    if getattr(args, "plain", False):
        from idemlink.device_sim.plain_slave import PlainRtuServer, parse_fault_line

        assert isinstance(server, PlainRtuServer)
        plain_server = server

        def extra(line: str, now: float) -> bool:
            return parse_fault_line(line, plain_server, now)
    with _control(args, server.core, extra) as between:
        return _serve_until_signal(args, functools.partial(server.serve, between=between))


def run_tcp(args: argparse.Namespace) -> int:
    """``--modbus-tcp [HOST:]PORT``: the ``--modbus-rtu`` slave served over Modbus TCP."""
    import socket

    from idemlink.device_sim.serve import install_stop_signals
    from idemlink.device_sim.tcp_server import parse_listen_address, serve_tcp
    from idemlink.protocol.modbus_tcp import TcpAddressError

    sources = getattr(args, "settings_from", {})
    for given, option in (("port", "--port"), ("plain", "--plain"), ("effects", "--effects")):
        if getattr(args, given, None) and sources.get(given, "command line") == "command line":
            raise UserError(f"{option} does not apply to --modbus-tcp (a TCP server has no "
                            "serial port; --plain and --effects are the serial slave's)")
    if args.modbus_rtu and sources.get("modbus_rtu") == "command line":
        raise UserError("--modbus-rtu and --modbus-tcp: give one (a serial line or a TCP server)")
    try:
        host, port = parse_listen_address(args.modbus_tcp)
    except TcpAddressError as exc:
        raise UserError(f"--modbus-tcp {exc}") from None
    try:
        with _flash_lock(args):
            server = _rtu_server(args, port=False)
            try:
                listener = socket.create_server((host, port))
            except OSError as exc:
                raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
            with listener, _control(args, server.core) as between:
                bound = listener.getsockname()
                address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else \
                    f"{bound[0]}:{bound[1]}"
                stop = threading.Event()
                restore = install_stop_signals(stop)
                try:
                    if wants_json(args):
                        print_json("idemlink.sim/1", {"port": address, "mode": "modbus-tcp"})
                    else:
                        print(address, flush=True)
                    serve_tcp(listener, server, stop, between=between)
                finally:
                    restore()
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _executed_writer(args: argparse.Namespace) -> Callable[[Any], None] | None:
    """``--effects FILE`` with ``--plain``: each executed request appended as one JSON line."""
    if not getattr(args, "effects", None):
        return None
    import json

    path = args.effects

    def write(done: Any) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(done.to_json(), sort_keys=True) + "\n")

    return write


def run_framed(args: argparse.Namespace) -> int:
    """The framed simulator (``SimulatedDevice``) on a new pty or on ``--port``."""
    from idemlink.device_sim.device import MapNotServed, SimulatedDevice
    from idemlink.device_sim.flash import DeviceIdError
    from idemlink.device_sim.serve import serve
    from idemlink.protocol.device_core import SnapshotError
    from idemlink.protocol.frame import FrameEncodeError
    from idemlink.protocol.key_file import KeyFileError

    regmap = regmap_from(args)
    try:
        # without a flash directory nothing counts process starts: fresh entropy makes this
        # process's epochs differ from a previous run's with the same seed
        salt = None if args.flash_dir else secrets.randbits(64)
        device = SimulatedDevice(seed=args.seed, trigger_duration=args.trigger_duration,
                                 flash_dir=args.flash_dir, now=time.monotonic(), regmap=regmap,
                                 device_id=getattr(args, "device_id", None), epoch_salt=salt,
                                 effects=getattr(args, "effects", None),
                                 address=getattr(args, "address", None),
                                 keys=_keys(args))
    except (DeviceIdError, MapNotServed, FrameEncodeError, KeyFileError) as exc:
        raise UserError(str(exc)) from None
    except (OSError, SnapshotError) as exc:
        raise UserError(f"flash directory {args.flash_dir}: {exc}") from None
    def provisioning(line: str, now: float) -> bool:
        from idemlink.device_sim.provisioning import provisioning_line

        handled = provisioning_line(device, line, now)
        if handled and control_core:
            control_core[0].core = device.core  # a factory reset makes a new core
        if handled and line.split()[0] != "button":
            ring = device.key_ring  # key ids only, never a key
            print(f"idemlink sim: {line.split()[0]} done, rebooted (epoch "
                  f"0x{device.epoch:08x}); keys: {ring!r}" if ring is not None else
                  f"idemlink sim: {line.split()[0]} done, rebooted (epoch 0x{device.epoch:08x}); "
                  "unkeyed", file=sys.stderr, flush=True)
        return handled

    control_core: list[Any] = []
    with _control(args, device.core, provisioning, control_core) as between:
        return _serve_until_signal(
            args, lambda transport, stop: serve(device, transport, stop, between=between))


def _keys(args: argparse.Namespace) -> tuple[bytes, ...] | None:
    """The keys of ``--key-file`` (None without it: the flash's, else an unkeyed device)."""
    path = getattr(args, "key_file", None)
    if path is None:
        return None
    from idemlink.protocol.key_file import read_key_file

    return read_key_file(path)
