"""A device in another process as a member of the simulated bus (issue 22 item 2, docs/BUS.md).

Contract: ``ProcessStation(command, address, workdir)`` runs a device command — the posix C device
(``firmware_ref/build/posix/idemlink-device``) or ``firmware_ref/tools/qemu-device`` — on a
pseudo-terminal of its own and is a ``idemlink.device_sim.bus.Station``: what the medium delivers
to it is written to the pty, what it answers is collected from the pty by a reader thread and
handed to the medium whole frames at a time (``data_to_send``: up to the last byte that ends a
frame; the rest waits), so the medium times, collides and damages it like any member's. The
command's placeholders are filled in: ``{port}`` the pty it serves, ``{flash}`` its flash
directory (``workdir/flash``, the same across restarts), ``{effects}`` the file it appends its
record to (``workdir/effects.jsonl``, docs/SOAK.md), ``{address}`` its bus address; the device is
ready when it prints its first line (the port), as both commands do. ``reboot`` is a power cycle:
the process is stopped (SIGTERM, SIGKILL after ``STOP_GRACE`` s), what was on its line dropped,
and started again on the same pty and flash directory, in a thread of its own so the medium keeps
running; while it is down it hears nothing. ``check()`` raises ``StationError`` (one line) when
the process exited by itself. Bounded: at most ``MAX_HELD`` bytes wait to be collected (the rest
is dropped and counted in ``dropped``), a write the device does not take is dropped (``lost``).
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from idemlink.device_sim.pty import open_pty
from idemlink.protocol.outcome import IdemlinkError

START_TIMEOUT = 20.0
"""Seconds a device has to print its first line."""
STOP_GRACE = 5.0
"""Seconds a device has to exit after SIGTERM before it is killed."""
MAX_HELD = 65536
"""Bytes of answers held for the medium at most."""


class StationError(IdemlinkError):
    """A device command that cannot serve as a bus member (one line)."""


class ProcessStation:
    """See the module docstring."""

    asynchronous = True  #: its answers come later than it hears (``Bus`` polls them in ``tick``)

    def __init__(self, command: str | Sequence[str], address: int, workdir: Path, *,
                 name: str | None = None) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not any("{port}" in a for a in argv):
            raise StationError(f"a bus device command must contain {{port}}: {command!r}")
        self.address: int | None = address
        self.workdir = Path(workdir)
        self.flash = self.workdir / "flash"
        self.effects = self.workdir / "effects.jsonl"
        self.log = self.workdir / "device.log"
        self.flash.mkdir(parents=True, exist_ok=True)
        self._pty = open_pty()
        os.set_blocking(self._pty.master_fd, False)
        values = {"port": self._pty.slave_path, "flash": str(self.flash),
                  "effects": str(self.effects), "address": str(address)}
        for key, value in values.items():
            argv = [a.replace("{" + key + "}", value) for a in argv]
        self.argv = argv
        self.name = name or Path(argv[0]).name
        self.waker: Callable[[], None] | None = None
        self.dropped = 0  #: answer bytes dropped: the medium did not collect them in time
        self.lost = 0  #: bytes for the device dropped: down, or its line full
        self.restarts = 0
        self._held = bytearray()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._down = True
        self._restarting: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        self._closed = False
        self._start()
        self._reader = threading.Thread(target=self._read_loop, name=f"station-{address}",
                                        daemon=True)
        self._reader.start()

    # ------------------------------------------------------------------ the process
    def _start(self) -> None:
        try:
            with self.log.open("ab") as err:
                proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=err)
        except OSError as exc:
            raise StationError(f"cannot start {self.argv[0]!r}: {exc.strerror}") from None
        assert proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            chunk = os.read(proc.stdout.fileno(), 256) if ready else b""
            if not chunk:
                try:  # its stdout closed: it is exiting
                    rc = proc.wait(timeout=1.0 if ready else 0.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
                why = (self._tail() or f"exited ({rc}) without its first line") if ready else \
                    f"no first line within {START_TIMEOUT:.0f} s"
                raise StationError(f"{self.name} at address {self.address} did not start: {why}")
            line += chunk
        self._proc = proc
        self._down = False

    def _tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        self._down = True
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def _power_cycle(self) -> None:
        self._stop()
        with contextlib.suppress(termios.error):  # what was on its line is gone with it
            termios.tcflush(self._pty.slave_fd, termios.TCIOFLUSH)
        with self._lock:
            self._held.clear()
        if not self._closed:
            self._start()
            self.restarts += 1

    def check(self) -> None:
        """Raise ``StationError`` if the device exited by itself."""
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            raise StationError(f"{self.name} at address {self.address} exited "
                               f"({proc.returncode}): {self._tail()}")
        thread = self._restarting
        if thread is not None and not thread.is_alive() and self._proc is None \
                and not self._closed:
            raise StationError(f"{self.name} at address {self.address} did not come back after "
                               f"a reboot: {self._tail()}")

    @property
    def restarting(self) -> bool:
        thread = self._restarting
        return thread is not None and thread.is_alive()

    @property
    def device_id(self) -> str:
        try:
            return (self.flash / "device_id").read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return f"{self.name}@{self.address}"

    # ------------------------------------------------------------------ Station
    def receive_data(self, data: bytes, now: float) -> None:
        if self._down:
            self.lost += len(data)
            return
        try:
            n = os.write(self._pty.master_fd, data)
        except (BlockingIOError, OSError):
            n = 0
        self.lost += len(data) - n

    def data_to_send(self) -> bytes:
        """The whole frames answered since the last call (a frame still arriving waits)."""
        with self._lock:
            held = self._held
            end = len(held)
            while end > 1 and not (held[end - 1] == 0 and held[end - 2] != 0):
                end -= 1
            if end <= 1:
                return b""
            out = bytes(held[:end])
            del held[:end]
            return out

    def tick(self, now: float) -> None:
        pass

    def reboot(self, now: float) -> None:
        """A power cycle in the background (one at a time): the medium keeps running."""
        if self.restarting or self._closed:
            return
        self._down = True
        self._restarting = threading.Thread(target=self._power_cycle, daemon=True,
                                            name=f"reboot-{self.address}")
        self._restarting.start()

    def wait_up(self, timeout: float = START_TIMEOUT + STOP_GRACE) -> None:
        """Block until a reboot in progress is over (tests, the end of a campaign)."""
        thread = self._restarting
        if thread is not None:
            thread.join(timeout)

    # ------------------------------------------------------------------ the reader
    def _read_loop(self) -> None:
        fd = self._pty.master_fd
        while True:
            ready, _, _ = select.select([fd, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = os.read(fd, 4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # EIO: nobody has the slave open right now
                time.sleep(0.01)
                continue
            if not data:
                continue
            with self._lock:
                room = MAX_HELD - len(self._held)
                self._held += data[:room]
                self.dropped += max(0, len(data) - room)
            waker = self.waker
            if waker is not None:
                waker()

    def close(self) -> None:
        """Stop the device and the reader; the pty is closed."""
        self._closed = True
        self.wait_up()
        self._stop()
        os.write(self._stop_w, b"x")
        self._reader.join(5.0)
        self._pty.close()
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> ProcessStation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def c_device_command(binary: str | os.PathLike[str],
                     trigger_duration: float | None = None) -> str:
    """The posix C device (``make -C firmware_ref device``, built with ``IDL_BUS=1``) as a bus
    member's command."""
    tail = "" if trigger_duration is None else f" --trigger-duration {trigger_duration!r}"
    return (f"{shlex.quote(str(binary))} --port {{port}} --flash-dir {{flash}} "
            f"--effects {{effects}} --address {{address}}{tail}")


def qemu_device_command(tool: str | os.PathLike[str], board: str, elf: str | os.PathLike[str],
                        trigger_duration: float | None = None) -> str:
    """``firmware_ref/tools/qemu-device`` running an image built with ``IDL_OPTS=-DIDL_BUS=1``
    (``make qemu-device IDL_OPTS=-DIDL_BUS=1 BUILD=build/bus``) as a bus member's command."""
    tail = "" if trigger_duration is None else f" --trigger-duration {trigger_duration!r}"
    return (f"{shlex.quote(str(tool))} --board {shlex.quote(board)} --elf "
            f"{shlex.quote(str(elf))} --port {{port}} --flash-dir {{flash}} "
            f"--effects {{effects}} --address {{address}}{tail}")


def start_stations(commands: Sequence[tuple[int, str]], workdir: Path) -> list[ProcessStation]:
    """One ``ProcessStation`` per (address, command), each in ``workdir/<address>``, started
    together; if one fails, those already started are stopped and ``StationError`` raised."""
    started: list[ProcessStation] = []
    try:
        for address, command in commands:
            started.append(ProcessStation(command, address, workdir / str(address)))
    except BaseException:
        for s in started:
            s.close()
        raise
    return started
