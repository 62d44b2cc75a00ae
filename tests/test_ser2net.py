"""Remote ports end to end: the simulator on a pty behind ser2net (Debian's package, installed by
.ci/run), the host over ``socket://`` (raw TCP) and ``rfc2217://`` (telnet RFC 2217), framed
commands, the continuous pipeline and a YMODEM batch, with both the blocking and the asyncio API.
Skipped, saying why, where ser2net is not installed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.timing import wait_until

from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.aio import AsyncDevice
from idemlink.host.device import Device
from idemlink.host.errors import PortError
from idemlink.pytest_plugin import PtySim, start_pty_sim

pytestmark = pytest.mark.skipif(shutil.which("ser2net") is None,
                                reason="ser2net is not installed (apt-get install ser2net)")


def holds(server: subprocess.Popen[str], path: str) -> bool:
    """Whether ``server`` has ``path`` open (ser2net opens its serial device while a client is
    connected, and takes no other client until it has closed it)."""
    fds = Path(f"/proc/{server.pid}/fd")
    opened = []
    for fd in fds.iterdir():
        try:
            opened.append(os.readlink(fd))
        except OSError:  # closed meanwhile
            continue
    return path in opened


@dataclass
class Remote:
    sim: PtySim
    raw: str  #: socket:// URL
    rfc2217: str  #: rfc2217:// URL
    files: Path  #: where the simulator stores received files
    server: subprocess.Popen[str]  #: ser2net

    def wait_released(self) -> None:
        """Until ser2net has closed the simulator's pty after the last client left: the next
        client is served, not told "Port already in use"."""
        wait_until(lambda: not holds(self.server, self.sim.path), what="ser2net to free the pty")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(port: int, proc: subprocess.Popen[str], device: str) -> None:
    """Until ser2net accepts a connection on ``port``, and has opened ``device`` for it and
    closed it again when the probe left."""

    def probe() -> socket.socket | None:
        if proc.poll() is not None:
            raise AssertionError(f"ser2net exited: {proc.communicate()[0]}")
        try:
            return socket.create_connection(("127.0.0.1", port), 0.2)
        except OSError:
            return None

    conn = wait_until(probe, what=f"ser2net to listen on {port}", poll=0.05)
    with conn:
        wait_until(lambda: holds(proc, device), what="ser2net to open the pty for the probe")
    wait_until(lambda: not holds(proc, device), what="ser2net to close the pty after the probe")


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    flash = tmp_path_factory.mktemp("flash")
    sim = start_pty_sim(SimulatedDevice(seed=1, flash_dir=flash))
    raw, rfc = free_port(), free_port()
    cfg = tmp_path_factory.mktemp("ser2net") / "ser2net.yaml"
    cfg.write_text(
        f"connection: &raw\n"
        f"  accepter: tcp,127.0.0.1,{raw}\n"
        f"  connector: serialdev,{sim.path},115200n81,local\n"
        f"connection: &rfc2217\n"
        f"  accepter: telnet(rfc2217),tcp,127.0.0.1,{rfc}\n"
        f"  connector: serialdev,{sim.path},115200n81,local\n")
    proc = subprocess.Popen(["ser2net", "-n", "-c", str(cfg), "-d"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(raw, proc, sim.path)
        wait_listening(rfc, proc, sim.path)
        yield Remote(sim, f"socket://127.0.0.1:{raw}",
                     f"rfc2217://127.0.0.1:{rfc}?ign_set_control", flash / "files", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        sim.close()


def urls(remote: Remote) -> list[str]:
    return [remote.raw, remote.rfc2217]


@pytest.mark.parametrize("which", ["socket", "rfc2217"])
def test_blocking_device_over_ser2net_with_a_ymodem_batch(remote: Remote, which: str,
                                                          tmp_path: Path) -> None:
    url = remote.raw if which == "socket" else remote.rfc2217
    payload = tmp_path / f"image-{which}.bin"
    payload.write_bytes(bytes(range(256)) * 9 + b"\xff\xff\x00tail")  # 0xFF: telnet's IAC
    with Device.open(url, timeout=0.5) as dev:
        assert dev.write({"threshold": 404}).ok
        assert dev.read("threshold").values == (404,)
        results = dev.run([dev.read_command(0, 9)] * 50)
        assert all(r.ok for r in results)
        res, report = dev.send_files([str(payload)])
        assert res.ok and report is not None and report.ok
        assert [(f.ok, f.verified) for f in report.files] == [(True, True)]
        assert dev.read("threshold").values == (404,)  # framed again
    stored = remote.files / payload.name
    assert hashlib.sha256(stored.read_bytes()).digest() == hashlib.sha256(
        payload.read_bytes()).digest()
    remote.wait_released()  # before the next client


@pytest.mark.parametrize("which", ["socket", "rfc2217"])
def test_async_device_over_ser2net(remote: Remote, which: str, tmp_path: Path) -> None:
    url = remote.raw if which == "socket" else remote.rfc2217
    payload = tmp_path / f"conf-{which}.txt"
    payload.write_text("threshold=420\n")

    async def session() -> None:
        async with AsyncDevice.open(url, timeout=0.5, max_inflight=16) as dev:
            assert (await dev.write({"threshold": 407})).ok
            got = [r.values async for r in dev.stream([dev.read_command("threshold")] * 30)]
            assert got == [(407,)] * 30
            res, report = await dev.send_files([str(payload)])
            assert res.ok and report is not None and report.ok
            assert (await dev.read("threshold")).values == (407,)

    asyncio.run(session())
    assert (remote.files / payload.name).read_text() == "threshold=420\n"
    remote.wait_released()


def test_rfc2217_server_that_ignores_line_control_gets_a_hint(remote: Remote) -> None:
    url = remote.rfc2217.split("?")[0] + "?timeout=0.5"  # the network timeout: fail fast
    with pytest.raises(PortError, match=r"ign_set_control"):
        Device.open(url)
    remote.wait_released()
