"""Several ports at once: a device command run on every ``--port`` (or ``--ports-file``) together.

Contract:

- ``--port`` may be given several times, and ``--ports-file FILE`` adds one port per line (blank
  lines and ``#`` comments skipped). One port: the command runs as always. Several: it runs on
  each concurrently, in one process, one thread and one independent ``Device`` per port; a port
  named twice is refused (two handles on one device would share its numbers).
- Text output: one block per device in the order given, headed by ``== PORT: OUTCOME (exit N)``
  and holding that device's own output, then one summary line ``N devices: 2 OK, 1 UNKNOWN; exit
  5``. A device's stderr lines go to stderr prefixed by its port.
- ``--json``: one object, schema ``idemlink.devices/1``: ``command``, ``exit`` (the worst),
  ``devices``, one object per device in the order given: ``port``, ``exit``, ``outcome`` (OK,
  NOT_EXECUTED, REJECTED, UNKNOWN, ERROR for a local error such as no device answering,
  INTERRUPTED), ``result`` (the document the command prints for one device, or null) and
  ``error`` (its stderr text, or null).
- Progress: while devices are still running, ``idemlink.output.Progress`` reports how many have
  finished (a bar on a terminal, a periodic line on stderr otherwise).
- Exit status: the worst device's — UNKNOWN 5 > REJECTED 4 > NOT_EXECUTED 3 > local error 1 > OK
  0 (a device that could not be reached is never hidden by the others' success).
- Ctrl-C (caught as a flag by the main thread, then raised in each device thread) interrupts
  every device within one ``--timeout`` (what the threads would import first is imported
  before they start: an interrupt inside an import could leave its lock held and hang them):
  each settles what it had out (CANCELLED, as with one port; a write that was out says it may
  have run), the blocks are printed
  (INTERRUPTED for a device that had not finished), then one stderr line says what happened —
  ``idemlink read: interrupted: 1 of 3 devices finished; nothing that may have had an effect was
  out on the 2 others`` (or how many devices had requests out that may have run) — and with
  ``--json`` one ``idemlink.error/1`` object carries the counts (``devices_run``,
  ``devices_finished``, ``devices_may_have_run``); exit 130.
- ``apply`` with several ports shares one receipt journal, locked once by this process; its
  writes are serialised (each device has its own scope in it). ``--trace`` and ``apply --resolve``
  take one port.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import io
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from idemlink.cli import EXIT_LOCAL_ERROR, UserError
from idemlink.host.journal import DeviceJournal
from idemlink.host.journal_file import JournalLock, lock_journal
from idemlink.host.journal_format import SentRecord, StepEvent
from idemlink.output import ERROR_SCHEMA, Progress, print_json

EXIT_INTERRUPTED = 130

#: Worst first; any other status ranks with the local error.
RANK: dict[int, int] = {5: 5, 4: 4, 3: 3, EXIT_LOCAL_ERROR: 2, 0: 0}
OUTCOME_OF_EXIT: dict[int, str] = {0: "OK", 3: "NOT_EXECUTED", 4: "REJECTED", 5: "UNKNOWN",
                                   EXIT_INTERRUPTED: "INTERRUPTED"}


class PortAction(argparse.Action):
    """``--port`` given several times: every value lands in ``ports``; ``port`` keeps the first
    (what a one-port command reads)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        ports = list(getattr(namespace, "ports", None) or [])
        ports.append(values)
        namespace.ports = ports
        namespace.port = ports[0]


def add_port_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", action=PortAction, default=None,
                        help="device path or pyserial URL (see `idemlink ports`); give it several "
                             "times to run on several devices at once")
    parser.add_argument("--ports-file", metavar="FILE", default=None,
                        help="one port per line (# comments): run on all of them at once")


def ports_of(args: argparse.Namespace) -> list[str]:
    """Every port the command line names, in order; ``UserError`` for an unreadable ports file
    or a port named twice."""
    ports = list(getattr(args, "ports", None) or [])
    file = getattr(args, "ports_file", None)
    if file is not None:
        try:
            text = Path(file).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--ports-file {file}: {getattr(exc, 'strerror', None) or exc}") from None
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                ports.append(line)
        if not ports:
            raise UserError(f"--ports-file {file}: no port in it")
    seen: set[str] = set()
    for p in ports:
        if p in seen:
            raise UserError(f"port {p} is named twice")
        seen.add(p)
    return ports


# ------------------------------------------------------------------------------ per-thread output


class _PerThread(io.TextIOBase):
    """A stream that writes to the calling thread's buffer when it has one, else to ``default``."""

    def __init__(self, default: TextIO) -> None:
        self.default = default
        self.local = threading.local()

    def write(self, s: str) -> int:
        buf: io.StringIO | None = getattr(self.local, "buf", None)
        return (buf if buf is not None else self.default).write(s)

    def flush(self) -> None:
        if getattr(self.local, "buf", None) is None:
            self.default.flush()


@contextlib.contextmanager
def _captured_streams() -> Iterator[tuple[_PerThread, _PerThread]]:
    out, err = _PerThread(sys.stdout), _PerThread(sys.stderr)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved


# ------------------------------------------------------------------------------ a shared journal


class SharedJournal(DeviceJournal):
    """A ``DeviceJournal`` that several threads write: each change is serialised (the snapshot it
    replaces is immutable, so reads need no lock)."""

    _write_lock = threading.Lock()

    def _apply(self, device_id: str, key: uuid.UUID, event: StepEvent,
               sent: SentRecord | None = None) -> None:
        with self._write_lock:
            super()._apply(device_id, key, event, sent)


class SharedJournals:
    """The journals of one multi-port run: each locked and opened once, by the first device that
    asks, for every device of the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[JournalLock, SharedJournal]] = {}

    def get(self, path: str) -> DeviceJournal:
        with self._lock:
            if path not in self._open:
                lock = lock_journal(path)
                try:
                    journal = SharedJournal.open(path)
                    assert isinstance(journal, SharedJournal)  # open() builds cls
                    self._open[path] = (lock, journal)
                except BaseException:
                    lock.release()
                    raise
            return self._open[path][1]

    def close(self) -> None:
        for lock, _ in self._open.values():
            lock.release()
        self._open.clear()


# ------------------------------------------------------------------------------ the run


@dataclass(slots=True)
class DeviceRun:
    port: str
    exit: int = EXIT_LOCAL_ERROR
    out: str = ""
    err: str = ""
    may_have_run: bool = False  #: interrupted with a request out that may have had an effect

    @property
    def outcome(self) -> str:
        return OUTCOME_OF_EXIT.get(self.exit, "ERROR")


def run_on_ports(args: argparse.Namespace, handler: Callable[[argparse.Namespace], int],
                 ports: list[str]) -> int:
    """Run ``handler`` once per port, concurrently; print the blocks and the summary; return the
    worst exit status."""
    if getattr(args, "trace", None) is not None:
        raise UserError("--trace records one port: give one --port")
    if getattr(args, "resolve", None) is not None:
        raise UserError("--resolve settles one journal entry: give one --port, or none")
    if getattr(args, "device_id", None) is not None:
        raise UserError("--device-id names one Modbus RTU slave: give one --port")
    runs = [DeviceRun(p) for p in ports]
    _import_before_threads()
    journals = SharedJournals()
    threads = Threads()
    progress = Progress(args.command, "devices", stream=sys.stderr)
    with _captured_streams() as (out, err), ThreadPoolExecutor(len(ports)) as pool, \
            _ctrl_c_as_flag() as ctrl_c:
        futures: list[Future[None]] = []
        try:
            for i, run in enumerate(runs):
                if ctrl_c.is_set():
                    break
                futures.append(pool.submit(_one, args, handler, run, i, threads, journals,
                                           out, err))
            while not ctrl_c.is_set() and not all(f.done() for f in futures):
                ctrl_c.wait(0.1)
                progress.update(sum(f.done() for f in futures), len(runs))
            if ctrl_c.is_set():
                threads.interrupt()
                wait(futures)
                for run in runs[len(futures):]:  # never submitted: nothing was sent to it
                    run.exit = EXIT_INTERRUPTED
        finally:
            progress.close()
    interrupted = ctrl_c.is_set()
    journals.close()
    _report(args, runs)
    if interrupted:
        _report_interrupt(args, runs)
        return EXIT_INTERRUPTED
    return max((r.exit for r in runs), key=lambda e: RANK.get(e, RANK[EXIT_LOCAL_ERROR]))


@contextlib.contextmanager
def _ctrl_c_as_flag() -> Iterator[threading.Event]:
    """While the devices run, Ctrl-C (SIGINT) sets an event instead of raising KeyboardInterrupt
    in the main thread: raised inside ``concurrent.futures``' own locking, it could leave a
    future's lock held and hang the run. Off the main thread (no signal handler can be set
    there) the event is never set."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


def _import_before_threads() -> None:
    """Import here, in the main thread, what every device thread would import first
    (``contract_hash``'s sections, on each ``Device``'s construction): a Ctrl-C is raised
    in the device threads as an asynchronous exception, and one landing inside a thread's
    import can leave that module's import lock held, so every other thread (and the wait for
    them) hangs for ever."""
    from idemlink.protocol.contract import sections

    sections()


class Threads:
    """The device threads still running, and a Ctrl-C delivered to each of them: one that starts
    after the interrupt does not run its command at all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, int] = {}  # run index -> thread ident
        self.stopping = False

    def enter(self, index: int) -> None:
        """Register the calling thread; KeyboardInterrupt if Ctrl-C came before it started."""
        with self._lock:
            if self.stopping:
                raise KeyboardInterrupt
            self._running[index] = threading.get_ident()

    def leave(self, index: int) -> None:
        with self._lock:
            self._running.pop(index, None)

    def interrupt(self) -> None:
        """Raise KeyboardInterrupt in every running device thread (each settles its requests, as
        Ctrl-C would with one port)."""
        with self._lock:
            self.stopping = True
            for ident in self._running.values():
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                           ctypes.py_object(KeyboardInterrupt))


def _one(args: argparse.Namespace, handler: Callable[[argparse.Namespace], int], run: DeviceRun,
         index: int, threads: Threads, journals: SharedJournals, out: _PerThread,
         err: _PerThread) -> None:
    ns = copy.copy(args)
    ns.port, ns.ports, ns.ports_file = run.port, [run.port], None
    ns.shared_journals = journals
    out.local.buf, err.local.buf = io.StringIO(), io.StringIO()
    try:
        threads.enter(index)
        run.exit = handler(ns)
    except UserError as exc:
        print(f"idemlink {args.command}: {exc}", file=sys.stderr)
        run.exit = EXIT_LOCAL_ERROR
    except KeyboardInterrupt as exc:
        run.exit = EXIT_INTERRUPTED
        run.may_have_run = bool(getattr(exc, "idemlink_reported", False))
    except Exception as exc:  # one device's failure must not hide the others' results
        print(f"idemlink {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        run.exit = EXIT_LOCAL_ERROR
    finally:
        threads.leave(index)
        run.out, run.err = out.local.buf.getvalue(), err.local.buf.getvalue()
        out.local.buf = err.local.buf = None


def _port_said_once(line: str, command: str, port: str) -> str:
    """A device's stderr line naming its port no more (the prefix names it): its own leading
    ``PORT: `` dropped, a further mention said "the port"."""
    head = f"idemlink {command}: "
    if not line.startswith(head):
        return line
    rest = line[len(head):]
    if rest.startswith(f"{port}: "):
        rest = rest[len(port) + 2:]
    return head + rest.replace(port, "the port", 1)


def _report(args: argparse.Namespace, runs: list[DeviceRun]) -> None:
    for r in runs:
        for line in r.err.splitlines():
            print(f"{r.port}: {_port_said_once(line, args.command, r.port)}", file=sys.stderr)
    worst = max((r.exit for r in runs), key=lambda e: RANK.get(e, RANK[EXIT_LOCAL_ERROR]))
    if any(r.exit == EXIT_INTERRUPTED for r in runs):
        worst = EXIT_INTERRUPTED
    if getattr(args, "json", False):
        print_json("idemlink.devices/1", {
            "command": args.command, "exit": worst,
            "devices": [{"port": r.port, "exit": r.exit, "outcome": r.outcome,
                         "result": _document(r.out), "error": r.err.strip() or None}
                        for r in runs]})
        return
    for r in runs:
        print(f"== {r.port}: {r.outcome} (exit {r.exit})")
        sys.stdout.write(r.out)
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    parts = ", ".join(f"{n} {name}" for name, n in counts.items())
    print(f"{len(runs)} devices: {parts}; exit {worst}")


def _report_interrupt(args: argparse.Namespace, runs: list[DeviceRun]) -> None:
    """The one stderr line (and ``idemlink.error/1`` object with ``--json``) of a Ctrl-C."""
    finished = sum(r.exit != EXIT_INTERRUPTED for r in runs)
    others = len(runs) - finished
    risky = sum(r.may_have_run for r in runs)
    head = f"interrupted: {finished} of {len(runs)} devices finished; "
    if risky:
        message = head + (f"{risky} device(s) had requests out that may have run (UNKNOWN, "
                          "CANCELLED): read back what they touched before going on")
    else:
        message = head + (f"nothing that may have had an effect was out on the {others} "
                          f"other(s)" if others else "nothing was left out")
    print(f"idemlink {args.command}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print_json(ERROR_SCHEMA, {"command": args.command, "message": message,
                                  "exit": EXIT_INTERRUPTED, "devices_run": len(runs),
                                  "devices_finished": finished,
                                  "devices_may_have_run": risky})


def _document(text: str) -> Any:
    """The JSON document one device printed (None if it printed none; the text if not JSON)."""
    import json

    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
