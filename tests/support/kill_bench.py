"""The bench of tests/test_apply_kills.py: real ``idemlink apply`` processes and real devices on a
pseudo-terminal line, killed at chosen moments, judged only by what the devices recorded.

- ``Runner`` starts CLI processes (``idemlink apply``, ``idemlink sim``, ...) and SIGKILLs them.
  By default through a fork server: one Python process that imported idemlink once and forks a
  child per command, which runs ``idemlink.console.main`` (the entry of ``python -m idemlink``)
  with its stdout/stderr in files. Each command is its own process, killed like any other; only
  the 0.35 s of interpreter start-up and imports is saved, which is what lets a campaign of
  thousands of runs fit in minutes. ``IDEMLINK_KILLS_EXEC=1`` runs ``sys.executable -m idemlink``
  per command instead. The server kills only its own unreaped children (a pid cannot be reused
  before its parent reaps it), so a kill never reaches an unrelated process.
- ``Relay``: the line. Two pseudo-terminals, the host's (``host_path``, where ``apply`` opens) and
  the device's (``device_path``, which the powered board serves), joined by a thread that moves
  the bytes unchanged and keeps both ptys alive while programs come and go. Its ``Gate`` holds the
  traffic at a chosen frame: from the first REQUEST whose PDU matches (``"request"``: the
  command left the host after its journal entry, and has not reached the device) or from the
  RESPONSE to such a request (``"answer"``: the device ran it, the host has no answer yet). That
  is the readiness signal the faults are injected on; ``release(deliver)`` then lets the held
  bytes through (late) or drops them (lost).
- ``Board``: one device's flash directory and effects file (docs/SOAK.md). ``Bench.power_on``
  serves a board on the device pty (the Python simulator or the posix C device, with
  ``--flash-dir`` and ``--effects``), ready when it printed its port; ``power_off`` is SIGKILL (a
  power cut). A board keeps a model of its configuration built from its effects file alone and,
  after every power cut, compares it with the flash: an execution the flash holds but the record
  lacks (the device persists first, then records) is a torn record, kept as evidence.
- Ground truth: ``Board.records`` (every execution the device recorded) and the torn records,
  never the CLI's output.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import tty
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idemlink.protocol.frame import Frame, FrameType, decode_frames
from idemlink.protocol.registers import RegisterKind
from idemlink.protocol.regmap_file import DEFAULT_MAP

ROOT = Path(__file__).resolve().parents[2]
FW = ROOT / "firmware_ref"
C_DEVICE = FW / "build" / "posix" / "idemlink-device"
START_TIMEOUT = 20.0  #: seconds a board has to print its port
HOLDINGS = {r.address: r.default for r in DEFAULT_MAP.of_kind(RegisterKind.HOLDING)}
GENERATION_MODULUS = 1 << 16

_ZYGOTE = r'''
import json, os, signal, select, sys, traceback
import idemlink.cli, idemlink.console
idemlink.cli.build_parser()  # every command module, imported once
import idemlink.device_sim.device, idemlink.device_sim.serve, idemlink.device_sim.pty
import idemlink.device_sim.flash
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *a: None)
signal.set_wakeup_fd(wake_w)
live = set()

def reply(*words):
    os.write(1, (" ".join(str(w) for w in words) + "\n").encode())

def child(req):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.close(wake_r)
    os.close(wake_w)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    sys.argv = ["idemlink", *req["argv"]]
    code = 1
    try:
        code = idemlink.console.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

reply("ready")
pending = b""
while True:
    try:
        ready, _, _ = select.select([0, wake_r], [], [])
    except InterruptedError:
        ready = [wake_r]
    if wake_r in ready:
        try:
            os.read(wake_r, 4096)
        except BlockingIOError:
            pass
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            live.discard(pid)
            reply("exit", pid, os.waitstatus_to_exitcode(status))
    if 0 in ready:
        data = os.read(0, 65536)
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            if req["op"] == "spawn":
                pid = os.fork()
                if pid == 0:
                    child(req)
                live.add(pid)
                reply("pid", pid)
            elif req["op"] == "kill":
                pid = req["pid"]
                if pid in live:  # not reaped yet: the pid is still this child's
                    os.kill(pid, req["sig"])
                    reply("killed", pid, 1)
                else:
                    reply("killed", pid, 0)
for pid in live:
    os.kill(pid, signal.SIGKILL)
'''


class Proc:
    """One started command: ``done``/``rc`` once it exited (rc -9 when SIGKILLed)."""

    def __init__(self, runner: Runner, pid: int, out: Path, err: Path,
                 popen: subprocess.Popen[bytes] | None = None) -> None:
        self.runner = runner
        self.pid = pid
        self.out = out
        self.err = err
        self.popen = popen
        self.rc: int | None = None

    @property
    def done(self) -> bool:
        return self.runner.exit_code(self) is not None

    def wait(self, timeout: float) -> int:
        rc = self.runner.wait(self, timeout)
        if rc is None:
            raise TimeoutError(f"pid {self.pid} still running after {timeout} s: "
                               f"{self.err.read_text(errors='replace')[-2000:]}")
        return rc

    def kill(self) -> None:
        """SIGKILL, unless it already exited; ``killed`` once it is known to have died of it."""
        if not self.done:
            self.runner.kill(self)

    @property
    def killed(self) -> bool:
        return self.runner.exit_code(self) == -signal.SIGKILL

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


class Runner:
    """Starts ``idemlink`` commands (through the fork server, or exec'd) and external programs."""

    def __init__(self, work: Path, cond: threading.Condition) -> None:
        self.work = work
        self.cond = cond  #: notified when a process exits
        self.exec_mode = os.environ.get("IDEMLINK_KILLS_EXEC") == "1"
        self._exits: dict[int, int] = {}
        self._replies: list[str] = []
        self._lock = threading.Lock()
        self._count = 0
        self._zygote: subprocess.Popen[bytes] | None = None
        self._popens: list[subprocess.Popen[bytes]] = []
        if not self.exec_mode:
            with (work / "fork-server.err").open("wb") as err:
                self._zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=err, cwd=work)
            threading.Thread(target=self._read_replies, daemon=True).start()
            self._reply("ready")

    def _read_replies(self) -> None:
        assert self._zygote is not None and self._zygote.stdout is not None
        for raw in self._zygote.stdout:
            words = raw.decode().split()
            with self.cond:
                if words[0] == "exit":
                    self._exits[int(words[1])] = int(words[2])
                else:
                    self._replies.append(" ".join(words))
                self.cond.notify_all()
        with self.cond:
            self._replies.append("eof")
            self.cond.notify_all()

    def _reply(self, prefix: str) -> str:
        with self.cond:
            if not self.cond.wait_for(lambda: bool(self._replies), timeout=30):
                raise RuntimeError(f"fork server silent: {(self.work / 'fork-server.err').read_text()}")
            got = self._replies.pop(0)
        if not got.startswith(prefix):
            raise RuntimeError(f"fork server: expected {prefix!r}, got {got!r}: "
                               f"{(self.work / 'fork-server.err').read_text()}")
        return got

    def _send(self, req: dict[str, Any]) -> None:
        assert self._zygote is not None and self._zygote.stdin is not None
        self._zygote.stdin.write(json.dumps(req).encode() + b"\n")
        self._zygote.stdin.flush()

    def _files(self, tag: str) -> tuple[Path, Path]:
        self._count += 1
        base = self.work / "logs" / f"{self._count:06d}-{tag}"
        base.parent.mkdir(exist_ok=True)
        out, err = base.with_suffix(".out"), base.with_suffix(".err")
        out.touch()
        err.touch()
        return out, err

    def idemlink(self, argv: list[str], tag: str) -> Proc:
        """``idemlink ARGV...`` as a new process."""
        out, err = self._files(tag)
        if self.exec_mode:
            return self.program([sys.executable, "-m", "idemlink", *argv], tag, out, err)
        with self._lock:
            self._send({"op": "spawn", "argv": argv, "out": str(out), "err": str(err),
                        "cwd": str(self.work)})
            pid = int(self._reply("pid").split()[1])
        return Proc(self, pid, out, err)

    def program(self, argv: list[str], tag: str, out: Path | None = None,
                err: Path | None = None) -> Proc:
        """Any program, exec'd; its output in files."""
        if out is None or err is None:
            out, err = self._files(tag)
        with out.open("wb") as o, err.open("wb") as e:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                                     cwd=self.work)
        self._popens.append(popen)
        proc = Proc(self, popen.pid, out, err, popen)
        threading.Thread(target=self._reap, args=(proc,), daemon=True).start()
        return proc

    def _reap(self, proc: Proc) -> None:
        assert proc.popen is not None
        rc = proc.popen.wait()
        with self.cond:
            self._exits[proc.pid] = rc
            self.cond.notify_all()

    def exit_code(self, proc: Proc) -> int | None:
        with self.cond:
            return self._exits.get(proc.pid) if proc.rc is None else proc.rc

    def wait(self, proc: Proc, timeout: float) -> int | None:
        with self.cond:
            if proc.rc is not None:
                return proc.rc
            self.cond.wait_for(lambda: proc.pid in self._exits, timeout=timeout)
            if proc.pid not in self._exits:
                return None
            proc.rc = self._exits.pop(proc.pid)
            return proc.rc

    def kill(self, proc: Proc) -> None:
        if proc.popen is not None:
            proc.popen.kill()  # Popen kills only while it has not reaped its child
            return
        with self._lock:
            self._send({"op": "kill", "pid": proc.pid, "sig": int(signal.SIGKILL)})
            self._reply("killed")

    def close(self) -> None:
        for popen in self._popens:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
        if self._zygote is not None:
            assert self._zygote.stdin is not None
            self._zygote.stdin.close()  # the server kills its children left and exits
            try:
                self._zygote.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()


# ------------------------------------------------------------------ the line


@dataclass
class Gate:
    """Holds the line from the first frame that matches (see the module docstring)."""

    where: str  #: "request" or "answer"
    match: Callable[[bytes], bool]
    triggered: bool = False
    seqs: set[tuple[int, int]] = field(default_factory=set)  #: (epoch, seq) of matched requests
    held_up: bytearray = field(default_factory=bytearray)  #: host -> device, held
    held_down: bytearray = field(default_factory=bytearray)  #: device -> host, held


class Relay:
    """The line between the host pty and the device pty (module docstring)."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond  #: notified when a gate triggers
        self._fds: list[int] = []
        self.host_master, self.host_path = self._pty()
        self.dev_master, self.device_path = self._pty()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._buf = {self.host_master: bytearray(), self.dev_master: bytearray()}
        self._out = {self.host_master: bytearray(), self.dev_master: bytearray()}
        self.gate: Gate | None = None
        self.frames_up = 0  #: delimited units the host has sent so far (readiness signal)
        self.dropped = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="kills-relay", daemon=True)
        self._thread.start()

    def _pty(self) -> tuple[int, str]:
        master, slave = os.openpty()
        tty.setraw(slave)
        os.set_blocking(master, False)
        self._fds += [master, slave]  # the slave stays open: the pty outlives its clients
        return master, os.ttyname(slave)

    def arm(self, where: str, match: Callable[[bytes], bool]) -> Gate:
        with self.cond:
            assert self.gate is None
            self.gate = Gate(where, match)
            return self.gate

    def release(self, deliver: bool) -> None:
        """Disarm the gate: its held bytes go through now (``deliver``) or are lost."""
        with self.cond:
            gate, self.gate = self.gate, None
            if gate is not None and deliver:
                self._out[self.dev_master] += gate.held_up
                self._out[self.host_master] += gate.held_down
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for fd in (*self._fds, self._wake_r, self._wake_w):
            os.close(fd)

    # the relay thread
    def _serve(self) -> None:
        while not self._stop:
            with self.cond:
                writers = [fd for fd, out in self._out.items() if out]
            readable, _, _ = select.select(
                [self.host_master, self.dev_master, self._wake_r], writers, [], 1.0)
            if self._wake_r in readable:
                os.read(self._wake_r, 4096)
            for fd in (self.host_master, self.dev_master):
                if fd in readable:
                    try:
                        data = os.read(fd, 4096)
                    except (BlockingIOError, OSError):
                        data = b""
                    if data:
                        self._units(fd, data)
            with self.cond:
                for fd in (self.host_master, self.dev_master):
                    out = self._out[fd]
                    if out:
                        try:
                            n = os.write(fd, bytes(out))
                        except BlockingIOError:
                            n = 0
                        del out[:n]
                        if len(out) > 1 << 16:  # nobody reads this side: a FIFO overflows
                            self.dropped += len(out)
                            out.clear()

    def _units(self, fd: int, data: bytes) -> None:
        buf = self._buf[fd]
        buf += data
        up = fd == self.host_master
        dest = self.dev_master if up else self.host_master
        while True:
            end = buf.find(0)
            if end < 0:
                return
            unit = bytes(buf[:end + 1])
            del buf[:end + 1]
            with self.cond:
                if up and len(unit) > 1:
                    self.frames_up += 1
                    self.cond.notify_all()
                gate = self.gate
                if gate is not None and self._holds(gate, unit, up):
                    (gate.held_up if up else gate.held_down).extend(unit)
                else:
                    self._out[dest] += unit

    def _holds(self, gate: Gate, unit: bytes, up: bool) -> bool:
        """Whether ``unit`` (one delimited piece of the stream) is held (called with cond)."""
        if gate.triggered:
            return up if gate.where == "request" else not up
        frame = _frame(unit)
        if frame is None:
            return False
        if up and frame.type is FrameType.REQUEST and gate.match(frame.payload):
            gate.seqs.add((frame.epoch, frame.seq))
            if gate.where == "request":
                self._trigger(gate)
                return True
        if (not up and gate.where == "answer" and frame.type is FrameType.RESPONSE
                and (frame.epoch, frame.seq) in gate.seqs):
            self._trigger(gate)
            return True
        return False

    def _trigger(self, gate: Gate) -> None:
        gate.triggered = True
        self.cond.notify_all()


def _frame(unit: bytes) -> Frame | None:
    if len(unit) < 2:
        return None
    got = decode_frames(b"\x00" + unit)
    return got[0] if len(got) == 1 and isinstance(got[0], Frame) else None


# ------------------------------------------------------------------ the devices' record


@dataclass(frozen=True)
class Record:
    """One execution a device recorded (or one its flash proves, ``torn``)."""

    epoch: int
    seq: int
    request: bytes
    response: bytes
    boot: int  #: index of the board's boot it happened in
    torn: bool = False


@dataclass(eq=False)
class Board:
    """One device: flash directory, effects file, and what they say."""

    name: str
    kind: str  #: "sim" or "c"
    flash: Path
    effects: Path
    device_id: str = ""
    records: list[Record] = field(default_factory=list)
    boots: int = 0
    model: dict[int, int] = field(default_factory=lambda: dict(HOLDINGS))
    generation: int = 0
    torn: list[str] = field(default_factory=list)  #: descriptions of torn records found
    _offset: int = 0
    _partial: bytes = b""

    def refresh(self) -> None:
        """Read the complete lines appended to the effects file since the last call."""
        try:
            with self.effects.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            doc = json.loads(line)
            if "boot" in doc:
                self.boots += 1
                continue
            rec = Record(doc["epoch"], doc["seq"], bytes.fromhex(doc["request"]),
                         bytes.fromhex(doc["response"]), self.boots)
            self.records.append(rec)
            self._model(rec.request, rec.response)

    def _model(self, req: bytes, resp: bytes) -> None:
        """The configuration as the record says it is: set-only and conditional writes that
        were answered without an exception (a failed guard changes nothing)."""
        if not resp or resp[0] & 0x80:
            return
        fc = req[0]
        writes: dict[int, int] = {}
        if fc == 0x06:
            address, value = struct.unpack(">HH", req[1:5])
            writes[address] = value
        elif fc == 0x10:
            address, count = struct.unpack(">HH", req[1:5])
            writes = dict(zip(range(address, address + count),
                              struct.unpack(f">{count}H", req[6:6 + 2 * count]), strict=True))
        elif fc == 0x41 and resp[1] == 0:
            _, address, count = struct.unpack(">HHH", req[1:7])
            writes = dict(zip(range(address, address + count),
                              struct.unpack(f">{count}H", req[8:8 + 2 * count]), strict=True))
        changed = False
        for a, v in writes.items():
            if a in self.model and self.model[a] != v:
                self.model[a] = v
                changed = True
        if changed:
            self.generation = (self.generation + 1) % GENERATION_MODULUS

    def check_flash(self) -> dict[int, int] | None:
        """After a power cut: the writes the flash holds beyond the record (a torn record), or
        None when they agree. Adopts the flash's state as the model."""
        self.refresh()
        path = self.flash / "config.json"
        if not path.exists():
            return None
        snap = json.loads(path.read_text())
        held = {a: v for a, v in snap["holdings"]}
        diff = {a: v for a, v in held.items() if self.model.get(a) != v}
        if not diff and snap["generation"] == self.generation:
            return None
        self.torn.append(f"flash {held} gen {snap['generation']}, record says {self.model} gen "
                         f"{self.generation}")
        self.model.update(held)
        self.generation = snap["generation"]
        return diff

    def add_torn(self, request: bytes, response: bytes) -> None:
        self.records.append(Record(0, 0, request, response, self.boots, torn=True))


class Bench:
    """The line, the boards, the runner; one board powered at a time (module docstring)."""

    def __init__(self, work: Path, kind: str, boards: int, seed: int) -> None:
        self.work = work
        self.kind = kind
        self.seed = seed
        self.cond = threading.Condition()
        self.runner = Runner(work, self.cond)
        self.relay = Relay(self.cond)
        self.boards = [Board(f"{kind}-{chr(65 + i)}", kind, work / f"flash-{i}",
                             work / f"effects-{i}.jsonl") for i in range(boards)]
        self.current: Board | None = None
        self.proc: Proc | None = None

    def close(self) -> None:
        if self.proc is not None and not self.proc.done:
            self.proc.kill()
            self.proc.wait(10)
        self.runner.close()
        self.relay.close()

    def power_on(self, board: Board) -> None:
        assert self.proc is None
        args = ["--port", self.relay.device_path, "--flash-dir", str(board.flash), "--effects",
                str(board.effects), "--trigger-duration", "0.2"]
        if board.kind == "sim":
            proc = self.runner.idemlink(
                ["sim", *args, "--seed", str(self.seed * 7 + self.boards.index(board))],
                f"{board.name}-power")
        else:
            proc = self.runner.program([str(C_DEVICE), *args], f"{board.name}-power")
        deadline = time.monotonic() + START_TIMEOUT
        while not proc.stdout().endswith("\n"):  # ready: its port printed (after it opened it)
            if proc.done or time.monotonic() > deadline:
                raise RuntimeError(f"{board.name} did not start: {proc.stderr()}")
            time.sleep(0.002)
        assert proc.stdout().strip() == self.relay.device_path, proc.stdout()
        self.proc, self.current = proc, board
        if not board.device_id:
            board.device_id = (board.flash / "device_id").read_text().strip()

    def power_off(self) -> dict[int, int] | None:
        """SIGKILL the powered board (a power cut); the flash's writes beyond its record."""
        assert self.proc is not None and self.current is not None
        self.proc.kill()
        rc = self.proc.wait(10)
        if rc != -signal.SIGKILL:
            raise RuntimeError(f"{self.current.name} exited by itself ({rc}): "
                               f"{self.proc.stderr()}")
        board, self.proc, self.current = self.current, None, None
        return board.check_flash()

    def plug(self, board: Board) -> None:
        """Make ``board`` the powered one (a swap when another was)."""
        if self.current is board:
            return
        if self.current is not None:
            self.power_off()
        self.power_on(board)

    def board_of(self, device_id: str | None) -> Board | None:
        return next((b for b in self.boards if b.device_id == device_id), None)


def build_c_device() -> str | None:
    """Build the posix C device; the reason it cannot be built, or None."""
    if shutil.which("make") is None or (shutil.which("gcc") is None and shutil.which("cc") is None):
        return "no make or C compiler"
    proc = subprocess.run(["make", "-s", "-C", str(FW), "device"], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"make device failed:\n{proc.stdout}\n{proc.stderr}")
    return None
