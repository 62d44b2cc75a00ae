"""``idemlink send`` and ``idemlink receive``: YMODEM batch transfers over any pyserial port URL.

``send --plain`` speaks plain YMODEM to any receiver (lrzsz ``rb``, a bootloader); ``send`` without
``--plain`` is the framed hand-over to an idemlink device: a FILE_RECEIVE command (run once, like
every command) switches the device's port to a YMODEM receive batch, which returns to framed mode
at the end of the batch, on abort or on timeout; then every file is read back in frames (FILE_INFO:
size and CRC-32C of what the device stored) and is ok only when verified.
``receive --dir D`` is a plain YMODEM receiver for any sender (``sb``). Both print one line per
file and the throughput; exit 0 only when every file arrived and the batch ended (framed: when
every file is verified on the device; 5 when a read-back got no answer and nothing failed).
``send`` takes ``--regmap`` like every device command but needs no map: a file transfer touches
no register, so the framed hand-over goes to a device serving any map (``check_map=False``).
``send --plain`` and ``receive``: a port that dies mid-transfer is one line on stderr and exit 5
(what the peer kept is unknown; the receiver's file in progress is discarded, committed files
stay); SIGTERM or SIGHUP unwind like Ctrl-C (CAN CAN, temporary deleted) and exit 128 + signal.
``receive --idle-timeout`` bounds both the wait for a sender and any silence of a sender
mid-batch; ``send --start-timeout`` the wait for the receiver to start (both were ``--timeout``,
still accepted, hidden, for one release). ``--json`` prints one ``idemlink.send/1`` /
``idemlink.receive/1`` object; progress goes to stderr (``idemlink.output.Progress``); Ctrl-C is
one line saying where the batch stopped, exit 130. The port, its baud rate and character format
(default 8N1) may come from a profile or the environment (``idemlink.commands.connection``);
``send``'s ``--timeout`` is not the answer wait there, so a profile's ``timeout`` does not apply.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from idemlink.cli import (
    EXIT_INTERRUPTED,
    EXIT_LOCAL_ERROR,
    EXIT_OK,
    EXIT_UNKNOWN,
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_hidden_alias,
    mark_reported,
    regmap_from,
)
from idemlink.commands.connection import LINE_KEYS, add_connection_options
from idemlink.output import Progress, add_json_option, emit, error_json

SEND_SCHEMA = "idemlink.send/1"
RECEIVE_SCHEMA = "idemlink.receive/1"
NO_HANDOVER = "NONE"
"""``send``'s JSON ``handover`` when every file was already on the device, identical: the port was
never handed over (otherwise the hand-over command's outcome, ``OK``, ``UNKNOWN``...)."""
MAX_TURNAROUND_MS = 1000.0
"""Upper bound of ``send --turnaround-ms`` (a pause before each block; more is a typo)."""

if TYPE_CHECKING:
    from idemlink.protocol.ymodem_receiver import ReceiverConfig
    from idemlink.protocol.ymodem_sender import SenderConfig


def register(sub: Any) -> None:
    s: argparse.ArgumentParser = sub.add_parser("send", help="send files by YMODEM")
    s.add_argument("files", nargs="+", metavar="FILE", help="the files to send, in this order")
    s.add_argument("--port", help="serial port or pyserial URL (required: here, in the "
                                   "environment or in a --profile)")
    add_baudrate_option(s, default=None)
    add_char_format_options(s)
    s.add_argument("--plain", action="store_true",
                   help="plain YMODEM to any receiver (no framed hand-over)")
    s.add_argument("--block-128", action="store_true", help="128-byte blocks only")
    s.add_argument("--overwrite", action="store_true",
                   help="to an idemlink device: allow replacing files it already has")
    s.add_argument("--turnaround-ms", type=float, default=0.0,
                   help="pause after each answer before sending, always (half-duplex RS-485); "
                        "default 0: none until the receiver loses a frame, then 2 ms (rb "
                        "flushes its input after each answer)")
    s.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for the receiver to start the batch (default 60)")
    add_hidden_alias(s, "--timeout", "start_timeout", float)  # the old spelling, for one release
    s.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line every 5 s)")
    s.add_argument("--regmap", metavar="FILE", default=None,
                   help="accepted like every device command's, checked, not needed: a file "
                        "transfer uses no register, so a device serving any map takes files")
    add_json_option(s, SEND_SCHEMA)
    from idemlink.commands.common import add_key_option

    add_key_option(s)  # the framed hand-over is signed; YMODEM itself carries no MAC
    add_connection_options(s, ("port", *LINE_KEYS, "regmap"), required=("port",))
    s.set_defaults(handler=run_send)

    r: argparse.ArgumentParser = sub.add_parser("receive", help="receive files by YMODEM")
    r.add_argument("--port", help="serial port or pyserial URL (required: here, in the "
                                   "environment or in a --profile)")
    add_baudrate_option(r, default=None)
    add_char_format_options(r)
    r.add_argument("--dir", required=True, help="target directory")
    r.add_argument("--overwrite", action="store_true", help="replace existing files")
    r.add_argument("--quota", type=int, default=None, help="byte limit for the batch")
    r.add_argument("--idle-timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for the sender, and longest silence mid-batch "
                        "(default 60)")
    add_hidden_alias(r, "--timeout", "idle_timeout", float)  # the old spelling, for one release
    r.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line every 5 s)")
    add_json_option(r, RECEIVE_SCHEMA)
    add_connection_options(r, ("port", *LINE_KEYS), required=("port",))
    r.set_defaults(handler=run_receive)


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


def _open(url: str, line: dict[str, Any]) -> Any:
    """The plain YMODEM line (``line``: baud rate and character format, ``line_settings``):
    pyserial's own DTR/RTS, shared like lrzsz's (not locked)."""
    from idemlink.host.errors import PortError
    from idemlink.host.transport import open_port

    try:
        return open_port(url, **line, keep_lines=False, exclusive=False, timeout=0.002)
    except PortError as exc:
        raise UserError(str(exc)) from exc


def _shown_name(name: str) -> str:
    """A file name as the terminal may print it: a name a peer sent with control characters
    (refused, but reported) is escaped, never written raw to the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def _report_lines(report: Any, verb: str, *, framed: bool = False) -> list[str]:
    lines: list[str] = []
    for f in report.files:
        name = _shown_name(f.name)
        if f.identical and verb == "received":
            lines.append(f"{name}: already there, identical ({f.size} bytes): the existing "
                         "file kept")
            continue
        if f.identical:
            lines.append(f"{name}: already on the device, identical ({f.size} bytes, size and "
                         "CRC-32C read back): not sent")
            continue
        state = "ok" if f.ok else "FAILED"
        extra = f" ({f.detail})" if f.detail and (not f.ok or framed) else ""
        check = ""
        if framed and f.verified is True:
            check = ", verified"
        elif framed and f.verified is None and (f.ok or f.unconfirmed):
            check = ", not verified"
        extra = _shown_name(extra)
        lines.append(f"{name}: {state}, {f.size} bytes{check}{extra}")
    if report.files and all(f.identical for f in report.files):
        return lines  # nothing was transferred: no batch to report
    status = "complete" if report.ok else f"aborted: {report.reason}"
    note = "" if report.final_ack else " (receiver's final ACK not seen)"
    lines.append(f"{verb} {report.bytes} bytes in {report.seconds:.2f} s, "
                 f"{report.throughput / 1000:.1f} kB/s, batch {status}{note}")
    return lines


def _report_doc(report: Any, port: str) -> dict[str, Any]:
    """The ``idemlink.send/1`` / ``idemlink.receive/1`` object of a finished batch."""
    return {
        "port": port, "complete": report.ok, "reason": report.reason or None,
        "final_ack": report.final_ack, "bytes": report.bytes,
        "seconds": round(report.seconds, 3), "throughput": round(report.throughput, 1),
        "files": [{"name": f.name, "size": f.size, "ok": f.ok, "detail": f.detail or None,
                   "verified": f.verified, "identical": f.identical,
                   "unconfirmed": f.unconfirmed} for f in report.files],
    }


def _print_report(args: argparse.Namespace, schema: str, report: Any, verb: str, exit_status: int,
                  *, framed: bool = False, **extra: Any) -> int:
    emit(args, schema, {**_report_doc(report, args.port), "exit": exit_status, **extra},
         _report_lines(report, verb, framed=framed))
    return exit_status


def _progress(args: argparse.Namespace) -> Progress:
    return Progress(args.command, "B", enabled=not args.no_progress)


def _interrupted(args: argparse.Namespace, progress: Progress, exc: KeyboardInterrupt,
                 what: str) -> KeyboardInterrupt:
    """Ctrl-C mid-batch: one line saying where it stopped (and, with ``--json``, the bytes so
    far); the exception, marked reported, for ``main`` to exit 130."""
    if progress.label is None:
        where = "before the first file started"
    else:
        of = f"/{progress.total}" if progress.total else ""
        where = f"in {progress.label} at {progress.done}{of} bytes"
    message = f"interrupted {where}; {what}"
    print(f"idemlink {args.command}: {message}", file=sys.stderr)
    error_json(args, message, EXIT_INTERRUPTED, file=progress.label, bytes=progress.done,
               files_started=progress.items)
    mark_reported(exc)
    return exc


def sender_config(args: argparse.Namespace) -> SenderConfig:
    """The sender's settings as ``send`` takes them from its options (the benchmark uses it)."""
    from idemlink.protocol.ymodem_sender import SenderConfig
    from idemlink.protocol.ymodem_wire import BLOCK_LARGE, BLOCK_SMALL

    return SenderConfig(
        block_size=BLOCK_SMALL if args.block_128 else BLOCK_LARGE,
        turnaround=args.turnaround_ms / 1000.0,
        start_timeout=args.start_timeout,
    )


def receiver_config(args: argparse.Namespace) -> ReceiverConfig:
    """The receiver's settings as ``receive`` takes them from its options."""
    from idemlink.protocol.ymodem_receiver import ReceiverConfig

    # 'C' every few seconds for as long as --idle-timeout says (the spec's cadence is 3 s).
    c_interval = min(3.0, args.idle_timeout)
    return ReceiverConfig(c_interval=c_interval,
                          header_retries=max(1, round(args.idle_timeout / c_interval)),
                          silence_timeout=args.idle_timeout, max_file_size=args.quota)


def run_send(args: argparse.Namespace) -> int:
    from idemlink.commands.common import check_seconds
    from idemlink.host.ymodem_io import check_batch_names, send_files
    from idemlink.protocol.ymodem_wire import build_header

    check_seconds("--start-timeout", args.start_timeout, 3600.0)  # before anything is sent
    if not (math.isfinite(args.turnaround_ms) and 0 <= args.turnaround_ms <= MAX_TURNAROUND_MS):
        raise UserError(f"--turnaround-ms {args.turnaround_ms!r}: expected milliseconds, >= 0 and "
                        f"<= {MAX_TURNAROUND_MS:g}")
    if args.regmap is not None:
        regmap_from(args)  # a map file that cannot be loaded is a mistake, even if unused
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
    if getattr(args, "key_file", None):
        raise UserError("--plain: --key-file signs idemlink frames; plain YMODEM has none (its "
                        "blocks carry no MAC): drop --key-file; nothing was sent")
    return _plain_transfer(
        args, SEND_SCHEMA, "sent",
        lambda port, progress: send_files(port, args.files, config, progress),
        on_signal="the receiver was told to cancel",
        on_interrupt="the receiver was told to cancel (CAN CAN): what it kept of that file is "
                     "discarded",
        on_port_failure="what the receiver kept is unknown")


def _plain_transfer(args: argparse.Namespace, schema: str, past: str,
                    transfer: Callable[[Any, Any], Any], *, on_signal: str, on_interrupt: str,
                    on_port_failure: str) -> int:
    """Run one YMODEM batch on ``--port`` (``send --plain`` or ``receive``) with the exits every
    transfer shares: SIGTERM/SIGHUP -> 128 + signal, Ctrl-C -> one line and 130, the line dying
    mid-transfer -> one line and 5; the report and its exit status otherwise. The ``on_*`` texts
    say what became of the data in each case."""
    from idemlink.commands.common import line_settings

    port = _open(args.port, line_settings(args))
    bar = _progress(args)
    try:
        with _signals_interrupt():
            report = transfer(port, bar.update_item)
    except Terminated as exc:
        print(f"idemlink {args.command}: {exc}; {on_signal}", file=sys.stderr)
        error_json(args, f"{exc}; {on_signal}", exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        raise _interrupted(args, bar, exc, on_interrupt) from None
    except OSError as exc:  # serial.SerialException is one: the line died mid-transfer
        message = f"the port failed mid-transfer ({_one_line(exc)}); {on_port_failure}"
        print(f"idemlink {args.command}: {message}", file=sys.stderr)
        error_json(args, message, EXIT_UNKNOWN, outcome="UNKNOWN")
        return EXIT_UNKNOWN
    finally:
        bar.close()
        _close_quietly(port)
    ok = report.ok and all(f.ok for f in report.files)
    return _print_report(args, schema, report, past, EXIT_OK if ok else EXIT_LOCAL_ERROR)


def _send_framed(args: argparse.Namespace, config: Any) -> int:
    from idemlink.cli import EXIT_NOT_EXECUTED, EXIT_REJECTED, EXIT_UNKNOWN
    from idemlink.commands.common import host_key, line_settings
    from idemlink.host.device import Device
    from idemlink.host.errors import NoDevice, PortError
    from idemlink.protocol.outcome import IdemlinkError, Outcome

    key = host_key(args)
    bar = _progress(args)
    handed_over = False
    try:
        # check_map=False: a file transfer touches no register, whatever map the device serves
        with Device.open(args.port, **line_settings(args), check_map=False, key=key) as dev:
            handed_over = True  # from here on the device may have switched or stored something
            res, report = dev.send_files(args.files, progress=bar.update_item, config=config,
                                         overwrite=args.overwrite)
    except ValueError as exc:  # a batch refused before the hand-over
        raise UserError(str(exc)) from exc
    except NoDevice as exc:
        from idemlink.commands.device_io import no_device

        raise no_device(args.port, exc,
                        hint="a file goes to it only by plain YMODEM, if it has a YMODEM "
                             "receiver: send --plain") from None
    except (IdemlinkError, OSError) as exc:  # OSError: pyserial's SerialException mid-transfer
        if not handed_over or not isinstance(exc, (OSError, PortError)):
            from idemlink.commands.device_io import port_said_once

            raise UserError(port_said_once(args.port, exc)) from exc
        message = (f"the line failed mid-transfer: {_one_line(exc)}; the device may hold part "
                   "of the batch: read it back (send again: identical files are skipped)")
        print(f"idemlink send: {message}", file=sys.stderr)
        error_json(args, message, EXIT_UNKNOWN)
        return EXIT_UNKNOWN
    except KeyboardInterrupt as exc:
        raise _interrupted(args, bar, exc, "the device was told to cancel (CAN CAN); read back "
                           "what it holds before relying on it") from None
    finally:
        bar.close()
    if report is None:
        message = f"device did not switch to file receive: {res.describe()}"
        print(message, file=sys.stderr)
        status = {Outcome.NOT_EXECUTED: EXIT_NOT_EXECUTED, Outcome.REJECTED: EXIT_REJECTED}.get(
            res.outcome, EXIT_UNKNOWN)
        error_json(args, message, status, outcome=res.outcome.name)
        return status
    status, note = _framed_verdict(args, res, report)
    nothing_sent = bool(report.files) and all(f.identical for f in report.files)
    _print_report(args, SEND_SCHEMA, report, "sent", status, framed=True,
                  handover=NO_HANDOVER if nothing_sent else res.outcome.name, note=note)
    if note is not None:
        print(note, file=sys.stderr)
    return status


def _framed_verdict(args: argparse.Namespace, res: Any, report: Any) -> tuple[int, str | None]:
    """The exit status of a framed send and the stderr line that explains a non-zero one."""
    from idemlink.protocol.outcome import Outcome

    named = {f.name for f in report.files}
    if all(f.verified for f in report.files) and all(Path(p).name in named for p in args.files):
        return EXIT_OK, None  # every file is on the device, byte for byte (even if the batch's
        # end was not clean: what was promised is there)
    undecided = [f for f in report.files if f.verified is None and (f.ok or f.unconfirmed)]
    failed = [f for f in report.files if not f.ok and not (f.unconfirmed and f.verified is None)]
    if undecided and not failed:
        return EXIT_UNKNOWN, (f"{len(undecided)} file(s) not verified: the read-back got no "
                              "answer; read them back before relying on them")
    if res.outcome is Outcome.UNKNOWN:
        # The hand-over's answer was lost and the batch did not go through: the device may yet
        # switch to file receive (or may have and given up). That is an UNKNOWN, not a local error.
        return EXIT_UNKNOWN, (f"hand-over to file receive: {res.describe()}; the device may "
                              "still be waiting for a sender or may have switched back: read it "
                              "back before sending again")
    return EXIT_LOCAL_ERROR, None


def run_receive(args: argparse.Namespace) -> int:
    from idemlink.host.ymodem_io import receive_files
    from idemlink.protocol.ymodem_files import DirectorySink, SinkRefused

    try:
        sink = DirectorySink(args.dir, overwrite=args.overwrite, quota=args.quota)
    except SinkRefused as exc:
        raise UserError(str(exc)) from exc
    from idemlink.commands.common import check_seconds

    check_seconds("--idle-timeout", args.idle_timeout, 3600.0)  # nan, inf: refused, not a crash
    if args.quota is not None and args.quota < 0:
        raise UserError("--quota must be >= 0")
    config = receiver_config(args)
    return _plain_transfer(
        args, RECEIVE_SCHEMA, "received",
        lambda port, progress: receive_files(port, sink, config, progress),
        on_signal="the file in progress was discarded",
        on_interrupt="the file in progress was discarded, files finished before were committed",
        on_port_failure="the file in progress was discarded, files reported before were "
                        "committed")
