"""The gateway as a real process for tests: started on port 0, ready when it prints its address
(never a sleep); a small HTTP client over urllib; a tokens file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.timing import read_line, scaled

CLI = [sys.executable, "-m", "idemlink"]
TOKEN = "tok-alice-0123456789abcdef"
TOKEN_BOB = "tok-bob-0123456789abcdef00"
TOKEN_VIEWER = "tok-vic-0123456789abcdef00"
TOKEN_OPERATOR = "tok-olga-0123456789abcdef0"
READY = "idemlink gateway: listening on "


def tokens_file(directory: Path) -> Path:
    p = directory / "tokens"
    p.write_text(f"# token caller role\n{TOKEN} alice admin\n{TOKEN_BOB} bob admin\n"
                 f"{TOKEN_VIEWER} vic viewer\n{TOKEN_OPERATOR} olga\n")
    p.chmod(0o600)
    return p


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: Any


@dataclass
class Gw:
    proc: subprocess.Popen[bytes]
    url: str

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = TOKEN,
             headers: Mapping[str, str] | None = None) -> Reply:
        data = None if body is None else json.dumps(body).encode()
        h = {"Content-Type": "application/json"} if data is not None else {}
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=scaled(30)) as r:
                return Reply(r.status, dict(r.headers), json.loads(r.read()))
        except urllib.error.HTTPError as e:
            return Reply(e.code, dict(e.headers), json.loads(e.read()))

    def events(self, path: str) -> list[tuple[str, Any]]:
        """A server-sent event stream read to its end: (event, data) pairs."""
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        out: list[tuple[str, Any]] = []
        event = ""
        with urllib.request.urlopen(req, timeout=scaled(30)) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            for raw in r:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[len("event: "):]
                elif line.startswith("data: "):
                    out.append((event, json.loads(line[len("data: "):])))
        return out

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def gateway_args(tmp_path: Path, ports: list[str], *extra: str) -> list[str]:
    return [*CLI, "gateway", *(a for p in ports for a in ("--port", p)), "--listen",
            "127.0.0.1:0", "--tokens", str(tokens_file(tmp_path)), "--store",
            str(tmp_path / "calls.db"), *extra]


@contextmanager
def running_gateway(tmp_path: Path, ports: list[str], *extra: str,
                    env: Mapping[str, str] | None = None) -> Iterator[Gw]:
    proc = subprocess.Popen(gateway_args(tmp_path, ports, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
    try:
        line = read_line(proc.stdout, proc, timeout=30)
        assert line.startswith(READY), line
        yield Gw(proc, line[len(READY):])
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(scaled(10))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


class _Muting:
    """A device's side of a pty whose answers can be cut (``mute``) and restored: the line that
    loses every answer while the device still runs what it receives."""

    def __init__(self, inner: Any) -> None:
        import random

        self.inner = inner
        self.mute = False
        self.loss = 0.0  #: the share of reads and writes lost whole (a lossy line)
        self.rng = random.Random(7)
        self.lost = 0

    def read(self, timeout: float) -> bytes:
        data: bytes = self.inner.read(timeout)
        if data and self.loss and self.rng.random() < self.loss:
            self.lost += 1
            return b""
        return data

    def write(self, data: bytes) -> None:
        if self.loss and self.rng.random() < self.loss:
            self.lost += 1
            return
        if not self.mute:
            self.inner.write(data)


@dataclass
class ServedSim:
    """A simulated device served on a pty by a thread, reachable through ``link`` (a symbolic
    link: ``replug`` serves the same device on a new pty behind it, as a USB re-plug would)."""

    device: Any
    link: Path
    shared: Any
    line: _Muting | None = None
    _stop: Any = None

    def serve(self) -> None:
        import threading

        from idemlink.device_sim.pty import open_pty
        from idemlink.device_sim.serve import serve

        pair = open_pty()
        self.line = _Muting(pair.transport())
        stop = threading.Event()
        thread = threading.Thread(target=serve, args=(self.shared, self.line, stop), daemon=True)
        thread.start()
        tmp = self.link.with_suffix(".new")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(pair.slave_path)
        tmp.replace(self.link)

        def stopper() -> None:
            stop.set()
            thread.join(timeout=5)
            pair.close()

        self._stop = stopper

    def unplug(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None
        self.link.unlink(missing_ok=True)

    def executions_of(self, pdu: bytes) -> list[Any]:
        with self.shared.lock:
            return [e for e in self.device.executions if e.request == pdu]

    def reboot(self) -> None:
        import time

        with self.shared.lock:
            self.device.reboot(time.monotonic())


@contextmanager
def served_sim(directory: Path, trigger_duration: float = 60.0) -> Iterator[ServedSim]:
    from idemlink.device_sim.device import SimulatedDevice
    from idemlink.device_sim.serve import LockedDevice

    device = SimulatedDevice(seed=0, trigger_duration=trigger_duration)
    s = ServedSim(device, directory / "dev", LockedDevice(device))
    s.serve()
    try:
        yield s
    finally:
        s.unplug()
