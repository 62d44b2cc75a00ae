"""The soak campaign against a device given as a command (``idemlink soak --device-cmd``).

Contract: ``run_device_campaign(cfg, template)`` starts the link emulator as a real-time proxy
between two pseudo-terminals, spawns the device with ``template``'s placeholders filled in —
``{port}`` (the pty the device serves), ``{effects}`` (the file it appends its record to, format in
docs/SOAK.md), ``{flash}`` (a directory it may keep its configuration in, the same across restarts)
and, optionally, ``{control}`` (the control FIFO, below) — and runs the campaign of
``idemlink.campaign`` over the proxy in real time. A device reboot is the process stopped (SIGTERM;
SIGKILL after ``STOP_GRACE`` seconds) and started again on the same port and flash directory, at a
random moment, requests in flight; host-process crashes are as in-process. SIGTERM rather than a
power cut: an execution whose effect is durable must also be in the effects file, which a kill
between the two would tear. The oracle reads the effects file — the device writes a ``boot`` line
when it starts and one line per execution, flushed — and the proxy's own record of every frame it
delivered each way (its ``DeliveryLog``, on the host's clock); outages and late copies are the
proxy's, as in-process. The line is ``cfg``'s (``baud`` None: unpaced; ``latency``); the host's
retry timeout is ``retry_timeout`` real seconds, by default ``max(cfg.timeout, DEVICE_TIMEOUT)``,
which a device written in Python answers within on a loaded machine; a fast device on an unpaced
line can be driven with a few milliseconds (a retry that comes too early is answered by replay:
harmless). The environment (inputs, fault conditions) moves when the template has ``{control}``:
the campaign creates a FIFO there (``ControlLine``) and writes the control lines of
``device_sim.control`` to it — ``input ADDRESS VALUE``, ``condition ADDRESS BITS`` — the device
reads it (``--control``); its own record of each condition is fed to the oracle. A device reboot is
a new process with a fresh world, so the current inputs and conditions are written again before it
starts (it reads them before its first request: the C device's serve loop reads the FIFO before the
port). The FIFO is held open by the campaign for reading and writing, so a line written while the
device is down waits for it; one the device does not read within the pipe's buffer is
``DeviceCommandError``. Without ``{control}`` the device keeps its inputs at the map's defaults and
no condition comes. ``DeviceCommandError`` (one line) when the template lacks a placeholder, the
device does not start (no boot line within ``START_TIMEOUT``) or exits by itself.

Authenticated (``cfg.authenticated``, issue 23): the campaign's key goes to a private key file
(0600) in the workspace, ``{key}`` in the template (required then): the device is keyed with it
(``idemlink-device --key-file {key}``, ``idemlink sim --key-file {key}``) and the host signs with
it. ``cfg.adversary`` puts the link's attacker on the proxy's host-to-device line. Every
execution in the device's record is checked against the REQUESTs the host itself wrote (an
attack that ran is ``attacks_executed``); the attacks sent and delivered are the proxy's; the
device's refusals (``bad_mac``, ``unauthenticated``, ``decode_errors``) are summed from the
``--stats`` lines it wrote to its log at each stop, when the template asks for them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shlex
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from idemlink.campaign import (
    Campaign,
    CampaignConfig,
    CampaignReport,
    HostWrites,
    TimelinePoint,
    attacks_ran,
    delivered,
)
from idemlink.device_sim.link import DeliveryLog
from idemlink.device_sim.link_proxy import LinkProxy
from idemlink.host.transport import SerialTransport
from idemlink.oracle import Boot, Delivered, OracleError, Record, parse_effects_line
from idemlink.protocol.outcome import IdemlinkError

START_TIMEOUT = 10.0
"""Seconds a spawned device has to write its boot line."""
STOP_GRACE = 5.0
"""Seconds a device has to exit after SIGTERM before it is killed."""
CLOCK_TOLERANCE = 0.002
"""A real clock: a trigger this close to its finish may read RUNNING or DONE."""
DEVICE_TIMEOUT = 0.1
"""The least retry timeout (seconds) by default: the in-process 0.03 is simulated time."""


class DeviceCommandError(IdemlinkError):
    """The device command could not be run as a device under test (one line)."""


class EffectsReader:
    """The records appended to an effects file since the last call (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[Record]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        try:
            return [parse_effects_line(line.decode()) for line in lines if line.strip()]
        except (OracleError, UnicodeDecodeError) as exc:
            raise DeviceCommandError(f"{self.path}: {exc}") from None


class ControlLine:
    """The device's control FIFO (``{control}``), written by the campaign: every line goes to the
    device; ``replay()`` writes the world as it stands again (inputs, conditions) for a device
    that starts afresh. Thread-safe: reboots come from a timer thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path, 0o600)
        # read and write: a write never blocks nor fails while no device reads
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._world: dict[tuple[str, str], str] = {}  #: (word, address) -> its latest line

    def write(self, line: str) -> None:
        words = line.split()
        with self._lock:
            self._world[(words[0], words[1])] = line
            self._write(line)

    def replay(self) -> None:
        with self._lock:
            for line in self._world.values():
                self._write(line)

    def _write(self, line: str) -> None:
        data = f"{line}\n".encode()
        try:
            os.write(self._fd, data)  # shorter than PIPE_BUF: whole or not at all
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise DeviceCommandError(f"the device does not read its control FIFO "
                                         f"{self.path} (--control)") from None
            raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class DeviceProcess:
    """The device command, (re)started on demand; ``restart()`` is a power cycle (the world,
    ``control``, written again before the new process starts)."""

    def __init__(self, template: str, values: Mapping[str, str], log: Path,
                 control: ControlLine | None = None) -> None:
        self.control = control
        for key in ("{port}", "{effects}"):
            if key not in template:
                raise DeviceCommandError(f"--device-cmd must contain {key}: {template!r}")
        argv = shlex.split(template)
        for key, value in values.items():
            argv = [a.replace("{" + key + "}", value) for a in argv]
        self.argv = argv
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._killed = False

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
        try:
            with self.log.open("ab") as err:
                self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=err)
        except OSError as exc:
            raise DeviceCommandError(f"cannot start {self.argv[0]!r}: {exc.strerror}") from None

    def restart(self) -> None:
        with self._lock:
            self._kill()
            if self.control is not None:
                self.control.replay()
            self._start()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        with self._lock:
            self._kill()

    def check(self) -> None:
        """Raise if the device exited by itself."""
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                raise DeviceCommandError(f"the device command exited ({proc.returncode}): "
                                         f"{tail[0]}")


class _CommandCampaign(Campaign):
    def __init__(self, cfg: CampaignConfig, device: DeviceProcess, reader: EffectsReader,
                 transport: SerialTransport, proxy: LinkProxy, line: DeliveryLog) -> None:
        self.device = device
        self.reader = reader
        self.proxy = proxy
        self.line = line
        self._timer: threading.Timer | None = None
        self._pending: list[Record] = []
        #: keyed or attacked: the host's own requests, so an execution of anything else shows
        self.host_writes = HostWrites(transport) if cfg.authenticated or cfg.adversary else None
        super().__init__(cfg, self.host_writes or transport, tolerance=CLOCK_TOLERANCE,
                         environment=device.control is not None)
        self.in_process = False  # no control line puts a trigger in a wrong state
        self._boot_rng = random.Random(cfg.seed + 1)

    def control(self, line: str) -> None:
        assert self.device.control is not None
        self.device.control.write(line)

    def records(self) -> list[Record]:
        self.device.check()
        out, self._pending = self._pending + self.reader.read(), []
        attacks_ran(self, self.host_writes, out)
        return out

    def deliveries(self) -> list[Delivered]:
        units = self.line.take()
        adversary = self.proxy.link.adversary
        if adversary is not None:
            for d in units:
                kind = adversary.delivered(d.unit) if d.direction == "a->b" else None
                if kind is not None:
                    self.report.attacks_delivered[kind] += 1
        # the proxy's clock counts from its origin on time.monotonic, the host's transport's
        return delivered(units, self.proxy.origin)

    def conclude(self) -> CampaignReport:
        rep = super().conclude()
        adversary = self.proxy.link.adversary
        if adversary is not None:
            rep.attacks_sent = Counter(adversary.sent)
        return rep

    def schedule_reboot(self) -> None:
        if self._timer is not None and self._timer.is_alive():
            return
        self._timer = threading.Timer(self._boot_rng.uniform(0.0, 0.02), self.device.restart)
        self._timer.daemon = True
        self._timer.start()

    def schedule_outage(self, directions: tuple[str, ...], delay: float, length: float) -> None:
        start = self.proxy.now() + delay
        for d in (self.proxy.link.a_to_b, self.proxy.link.b_to_a):
            if d.name in directions:
                d.outage(start, start + length)

    def link_stats(self) -> dict[str, dict[str, int]]:
        return self.proxy.link.stats()

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()


REFUSALS = ("bad_mac", "unauthenticated", "decode_errors")


def stats_refusals(log: str) -> dict[str, int]:
    """The device's refusals summed over its ``--stats`` lines (one per stop: ``... stopped:
    executed=N ... bad_mac=N ...``); empty when it wrote none."""
    total: dict[str, int] = {}
    for line in log.splitlines():
        if "stopped:" not in line:
            continue
        for word in line.split("stopped:", 1)[1].split():
            name, _, value = word.partition("=")
            if name in REFUSALS and value.isdigit():
                total[name] = total.get(name, 0) + int(value)
    return total


def _wait_for_boot(reader: EffectsReader, device: DeviceProcess) -> list[Record]:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        device.check()
        got = reader.read()
        if any(isinstance(r, Boot) for r in got):
            return got
        time.sleep(0.02)
    raise DeviceCommandError(f"the device wrote no boot line to {{effects}} within "
                             f"{START_TIMEOUT:.0f} s")


@contextlib.contextmanager
def _workspace() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="idemlink-soak-") as d:
        yield Path(d)


def run_device_campaign(cfg: CampaignConfig, template: str,
                        progress: Callable[[int], None] | None = None,
                        stop: Callable[[], bool] | None = None, *, fail_fast: bool = False,
                        timeline: list[TimelinePoint] | None = None,
                        retry_timeout: float | None = None) -> CampaignReport:
    link = cfg.link_config()
    cfg = replace(cfg, timeout=max(cfg.timeout, DEVICE_TIMEOUT) if retry_timeout is None
                  else retry_timeout)
    with _workspace() as work, LinkProxy(None, None, link, cfg.link_config(back=True)) as proxy:
        line = DeliveryLog()
        proxy.link.record_deliveries(line)
        proxy.start()
        flash = work / "flash"
        flash.mkdir()
        effects = work / "effects.jsonl"
        values = {"port": proxy.b_path, "effects": str(effects), "flash": str(flash)}
        if cfg.key is not None:
            if "{key}" not in template:
                raise DeviceCommandError("--authenticated: --device-cmd must contain {key} (the "
                                         "device's key file, e.g. --key-file {key})")
            key_file = work / "key"
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(cfg.key.hex() + "\n")
            values["key"] = str(key_file)
        control = None
        if "{control}" in template:
            control = ControlLine(work / "control")
            values["control"] = str(control.path)
        device = DeviceProcess(template, values, work / "device.log", control)
        reader = EffectsReader(effects)
        device.start()
        transport: SerialTransport | None = None
        try:
            first = _wait_for_boot(reader, device)
            transport = SerialTransport(proxy.a_path, baudrate=link.baud or 115200)
            campaign = _CommandCampaign(cfg, device, reader, transport, proxy, line)
            campaign._pending = first
            try:
                report = campaign.run(progress, stop, fail_fast=fail_fast, timeline=timeline)
            finally:
                campaign.finish()
            device.stop()  # its last --stats line
            if cfg.authenticated or cfg.adversary:
                report.refused = stats_refusals(
                    (work / "device.log").read_text(encoding="utf-8", errors="replace"))
            return report
        finally:
            device.stop()
            if control is not None:
                control.close()
            if transport is not None:
                transport.close()


__all__ = ["DEVICE_TIMEOUT", "ControlLine", "DeviceCommandError", "EffectsReader", "run_device_campaign"]
