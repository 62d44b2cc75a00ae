"""``idemlink sim``: run the simulated device on a pseudo-terminal, a port or a pyserial URL.

Contract: by default the device speaks the framed idemlink protocol (``SimulatedDevice`` served
by ``device_sim.serve``); with ``--modbus-rtu`` it is a plain Modbus RTU slave
(``device_sim.rtu_server``). Without ``--port`` a pty is created. The port path is the FIRST line of
stdout (flushed), then the simulator serves until SIGINT or SIGTERM, closes what it opened and
exits 0. A port that cannot be opened or a bad flash directory is a one-line error (exit 1).
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from types import FrameType
from typing import Any

from host.cli import EXIT_OK, UserError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sim", help="run the simulated device (prints its port path first)"
    )
    p.add_argument("--modbus-rtu", action="store_true", help="serve as a plain Modbus RTU slave")
    p.add_argument("--port", help="serve on this port or pyserial URL instead of a new pty")
    p.add_argument("--unit", type=int, default=1, help="Modbus unit id (default 1)")
    p.add_argument("--flash-dir", help="directory keeping the configuration across runs")
    p.add_argument("--baudrate", type=int, default=115200, help="baud rate for --port")
    p.add_argument("--trigger-duration", "--trigger-seconds", dest="trigger_duration",
                   type=float, default=5.0, help="seconds a trigger stays RUNNING (default 5)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the framed simulator's boot epochs (default: random)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.trigger_duration < 0:
        raise UserError(f"trigger duration {args.trigger_duration} is negative")
    if not args.modbus_rtu:
        return run_framed(args)
    if not 1 <= args.unit <= 247:
        raise UserError(f"unit id {args.unit} outside 1..247")

    import serial

    from device_sim.pty import PtyPair, open_pty
    from device_sim.rtu_server import ConfigFlash, RtuServer, SerialTransport, Transport
    from protocol.device_core import DeviceCore, SnapshotError

    core = DeviceCore(trigger_duration=args.trigger_duration)
    try:
        flash = ConfigFlash(args.flash_dir) if args.flash_dir else None
        server = RtuServer(core, unit=args.unit, flash=flash)
    except (OSError, SnapshotError) as exc:
        raise UserError(f"flash directory: {exc}") from None

    pair: PtyPair | None = None
    transport: Transport
    serial_transport: SerialTransport | None = None
    if args.port:
        try:
            serial_transport = SerialTransport.open(args.port, args.baudrate)
        except (serial.SerialException, ValueError) as exc:
            raise UserError(f"cannot open {args.port}: {exc}") from None
        transport = serial_transport
        path = args.port
    else:
        pair = open_pty()
        transport = pair.transport()
        path = pair.slave_path

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(path, flush=True)
    try:
        server.serve(transport, stop)
    finally:
        if serial_transport is not None:
            serial_transport.close()
        if pair is not None:
            pair.close()
    return EXIT_OK


def run_framed(args: argparse.Namespace) -> int:
    """The framed simulator (``SimulatedDevice``) on a new pty or on ``--port``."""
    import serial

    from device_sim.device import SimulatedDevice
    from device_sim.pty import PtyPair, open_pty
    from device_sim.serve import PortTransport, ServeTransport, install_stop_signals, open_port
    from device_sim.serve import serve as serve_device
    from protocol.device_core import SnapshotError

    try:
        device = SimulatedDevice(seed=args.seed, trigger_duration=args.trigger_duration,
                                 flash_dir=args.flash_dir, now=time.monotonic())
    except (OSError, SnapshotError) as exc:
        raise UserError(f"flash directory {args.flash_dir}: {exc}") from None

    pair: PtyPair | None = None
    port: PortTransport | None = None
    transport: ServeTransport
    if args.port:
        try:
            port = open_port(args.port, args.baudrate)
        except (serial.SerialException, ValueError, OSError) as exc:
            raise UserError(f"cannot open {args.port}: {exc}") from None
        transport = port
        path = args.port
    else:
        pair = open_pty()
        transport = pair.transport()
        path = pair.slave_path

    stop = threading.Event()
    restore = install_stop_signals(stop)
    try:
        print(path, flush=True)
        serve_device(device, transport, stop)
    finally:
        restore()
        if port is not None:
            port.close()
        if pair is not None:
            pair.close()
    return EXIT_OK
