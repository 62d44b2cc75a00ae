"""``idemlink send`` and ``idemlink receive``: YMODEM batch transfers over any pyserial port URL.

``send --plain`` speaks plain YMODEM to any receiver (lrzsz ``rb``, a bootloader); ``send`` without
``--plain`` is the framed hand-over to an idemlink device: a FILE_RECEIVE command (run once, like
every command) switches the device's port to a YMODEM receive batch, which returns to framed mode
at the end of the batch, on abort or on timeout; then every file is read back in frames (FILE_INFO:
size and CRC-32C of what the device stored) and is ok only when verified.
``receive --dir D`` is a plain YMODEM receiver for any sender (``sb``). Both print one line per
file and the throughput; exit 0 only when every file arrived and the batch ended (framed: when
every file is verified on the device; 5 when a read-back got no answer and nothing failed).
``send --plain`` and ``receive``: a port that dies mid-transfer is one line on stderr and exit 5
(what the peer kept is unknown; the receiver's file in progress is discarded, committed files
stay); SIGTERM or SIGHUP unwind like Ctrl-C (CAN CAN, temporary deleted) and exit 128 + signal.
``receive --timeout`` bounds both the wait for a sender and any silence of a sender mid-batch.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from idemlink.cli import EXIT_LOCAL_ERROR, EXIT_OK, EXIT_UNKNOWN, UserError

if TYPE_CHECKING:
    from idemlink.protocol.ymodem import ReceiverConfig, SenderConfig


def register(sub: Any) -> None:
    s: argparse.ArgumentParser = sub.add_parser("send", help="send files by YMODEM")
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--port", required=True, help="serial port or pyserial URL")
    s.add_argument("--baud", type=int, default=115200)
    s.add_argument("--plain", action="store_true",
                   help="plain YMODEM to any receiver (no framed hand-over)")
    s.add_argument("--block-128", action="store_true", help="128-byte blocks only")
    s.add_argument("--overwrite", action="store_true",
                   help="to an idemlink device: allow replacing files it already has")
    s.add_argument("--turnaround-ms", type=float, default=0.0,
                   help="pause after each answer before sending, always (half-duplex RS-485); "
                        "default 0: none until the receiver loses a frame, then 2 ms (rb "
                        "flushes its input after each answer)")
    s.add_argument("--timeout", type=float, default=60.0, help="wait for the receiver (s)")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(handler=run_send)

    r: argparse.ArgumentParser = sub.add_parser("receive", help="receive files by YMODEM")
    r.add_argument("--port", required=True, help="serial port or pyserial URL")
    r.add_argument("--baud", type=int, default=115200)
    r.add_argument("--dir", required=True, help="target directory")
    r.add_argument("--overwrite", action="store_true", help="replace existing files")
    r.add_argument("--quota", type=int, default=None, help="byte limit for the batch")
    r.add_argument("--timeout", type=float, default=60.0,
                   help="wait for the sender, and longest silence mid-batch (s); default 60")
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(handler=run_receive)


class _Bar:
    """A tqdm bar per file, only on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._name = ""

    def __call__(self, name: str, done: int, size: int | None) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if name != self._name:
            self.close()
            self._name = name
            self._bar = tqdm(total=size, desc=name, unit="B", unit_scale=True, leave=True)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a transfer: unwinds like Ctrl-C (CAN CAN to the peer, the
    uncommitted temporary deleted), then exits 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Make SIGTERM and SIGHUP raise ``Terminated`` (their default would kill the process
    without cleaning up); the previous handlers come back on exit."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _close_quietly(port: Any) -> None:
    with contextlib.suppress(OSError):
        port.close()


def _open(url: str, baud: int) -> Any:
    import serial

    try:
        return serial.serial_for_url(url, baudrate=baud, timeout=0.002)
    except (serial.SerialException, ValueError) as exc:
        raise UserError(f"cannot open {url}: {exc}") from exc


def _print_report(report: Any, verb: str, *, framed: bool = False) -> None:
    for f in report.files:
        if f.identical:
            print(f"{f.name}: already on the device, identical ({f.size} bytes, size and "
                  "CRC-32C read back): not sent")
            continue
        state = "ok" if f.ok else "FAILED"
        extra = f" ({f.detail})" if f.detail and (not f.ok or framed) else ""
        check = ""
        if framed and f.verified is True:
            check = ", verified"
        elif framed and f.verified is None and (f.ok or f.unconfirmed):
            check = ", not verified"
        print(f"{f.name}: {state}, {f.size} bytes{check}{extra}")
    status = "complete" if report.ok else f"aborted: {report.reason}"
    note = "" if report.final_ack else " (receiver's final ACK not seen)"
    print(f"{verb} {report.bytes} bytes in {report.seconds:.2f} s, "
          f"{report.throughput / 1000:.1f} kB/s, batch {status}{note}")


def sender_config(args: argparse.Namespace) -> SenderConfig:
    """The sender's settings as ``send`` takes them from its options (the benchmark uses it)."""
    from idemlink.protocol.ymodem import BLOCK_LARGE, BLOCK_SMALL, SenderConfig

    return SenderConfig(
        block_size=BLOCK_SMALL if args.block_128 else BLOCK_LARGE,
        turnaround=args.turnaround_ms / 1000.0,
        start_timeout=args.timeout,
    )


def receiver_config(args: argparse.Namespace) -> ReceiverConfig:
    """The receiver's settings as ``receive`` takes them from its options."""
    from idemlink.protocol.ymodem import ReceiverConfig

    # 'C' every few seconds for as long as --timeout says (the spec's cadence is 3 s).
    c_interval = min(3.0, args.timeout)
    return ReceiverConfig(c_interval=c_interval,
                          header_retries=max(1, round(args.timeout / c_interval)),
                          silence_timeout=args.timeout, max_file_size=args.quota)


def run_send(args: argparse.Namespace) -> int:
    from idemlink.host.ymodem_io import check_batch_names, send_files
    from idemlink.protocol.ymodem import build_header

    for f in args.files:
        if not Path(f).is_file():
            raise UserError(f"not a regular file: {f}")
    try:
        check_batch_names(args.files)  # before the device is switched to file receive
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    config = sender_config(args)
    for f in args.files:
        try:
            build_header(Path(f).name, 0, 0, 0)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    if not args.plain:
        return _send_framed(args, config)
    port = _open(args.port, args.baud)
    bar = _Bar(not args.no_progress)
    try:
        with _signals_interrupt():
            report = send_files(port, args.files, config, bar)
    except Terminated as exc:
        print(f"idemlink send: {exc}; the receiver was told to cancel", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # serial.SerialException is one: the line died mid-transfer
        print(f"idemlink send: the port failed mid-transfer ({_one_line(exc)}); what the "
              "receiver kept is unknown", file=sys.stderr)
        return EXIT_UNKNOWN
    finally:
        bar.close()
        _close_quietly(port)
    _print_report(report, "sent")
    return EXIT_OK if report.ok and all(f.ok for f in report.files) else EXIT_LOCAL_ERROR


def _send_framed(args: argparse.Namespace, config: Any) -> int:
    from idemlink.cli import EXIT_NOT_EXECUTED, EXIT_REJECTED, EXIT_UNKNOWN
    from idemlink.host.device import Device
    from idemlink.protocol.outcome import IdemlinkError, Outcome

    bar = _Bar(not args.no_progress)
    try:
        with Device.open(args.port, baudrate=args.baud) as dev:
            res, report = dev.send_files(args.files, progress=bar, config=config,
                                         overwrite=args.overwrite)
    except (IdemlinkError, ValueError) as exc:  # ValueError: a batch refused before the hand-over
        raise UserError(str(exc)) from exc
    finally:
        bar.close()
    if report is None:
        print(f"device did not switch to file receive: {res.describe()}", file=sys.stderr)
        return {Outcome.NOT_EXECUTED: EXIT_NOT_EXECUTED, Outcome.REJECTED: EXIT_REJECTED}.get(
            res.outcome, EXIT_UNKNOWN)
    _print_report(report, "sent", framed=True)
    named = {f.name for f in report.files}
    if all(f.verified for f in report.files) and all(Path(p).name in named for p in args.files):
        return EXIT_OK  # every file is on the device, byte for byte (even if the batch's end
        # was not clean: what was promised is there)
    undecided = [f for f in report.files if f.verified is None and (f.ok or f.unconfirmed)]
    failed = [f for f in report.files if not f.ok and not (f.unconfirmed and f.verified is None)]
    if undecided and not failed:
        print(f"{len(undecided)} file(s) not verified: the read-back got no answer; read them "
              "back before relying on them", file=sys.stderr)
        return EXIT_UNKNOWN
    if res.outcome is Outcome.UNKNOWN:
        # The hand-over's answer was lost and the batch did not go through: the device may yet
        # switch to file receive (or may have and given up). That is an UNKNOWN, not a local error.
        print(f"hand-over to file receive: {res.describe()}; the device may still be waiting for "
              "a sender or may have switched back: read it back before sending again",
              file=sys.stderr)
        return EXIT_UNKNOWN
    return EXIT_LOCAL_ERROR


def run_receive(args: argparse.Namespace) -> int:
    from idemlink.host.ymodem_io import receive_files
    from idemlink.protocol.ymodem_files import DirectorySink, SinkRefused

    try:
        sink = DirectorySink(args.dir, overwrite=args.overwrite, quota=args.quota)
    except SinkRefused as exc:
        raise UserError(str(exc)) from exc
    if args.timeout <= 0 or (args.quota is not None and args.quota < 0):
        raise UserError("--timeout must be > 0 and --quota >= 0")
    config = receiver_config(args)
    port = _open(args.port, args.baud)
    bar = _Bar(not args.no_progress)
    try:
        with _signals_interrupt():
            report = receive_files(port, sink, config, bar)
    except Terminated as exc:
        print(f"idemlink receive: {exc}; the file in progress was discarded", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # serial.SerialException is one: the line died mid-transfer
        print(f"idemlink receive: the port failed mid-transfer ({_one_line(exc)}); the file in "
              "progress was discarded, files reported before were committed", file=sys.stderr)
        return EXIT_UNKNOWN
    finally:
        bar.close()
        _close_quietly(port)
    _print_report(report, "received")
    return EXIT_OK if report.ok and all(f.ok for f in report.files) else EXIT_LOCAL_ERROR
