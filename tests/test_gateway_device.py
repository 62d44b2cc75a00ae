"""``Device.open("idemlink+http://...")`` and the CLI's ``--port`` of the same URL, against a real
gateway process in front of the simulator; ground truth from the device's execution log."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from support.gateway import CLI, TOKEN, running_gateway, served_sim
from support.timing import scaled

from idemlink.host.aio import AsyncDevice
from idemlink.host.command import CommandBuilder
from idemlink.host.device import Device
from idemlink.host.gateway_device import GatewayDevice, NotThroughGateway, parse_gateway_url
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.regmap_file import DEFAULT_MAP


def _pdu(values: dict[str | int, int | str]) -> bytes:
    return CommandBuilder(DEFAULT_MAP).write_command(values).pdu()


def test_gateway_urls() -> None:
    assert parse_gateway_url("idemlink+http://h:8080/oven") == ("http://h:8080", "oven")
    assert parse_gateway_url("idemlink+http://h:8080") == ("http://h:8080", None)
    with pytest.raises(NotThroughGateway, match="bus address"):
        parse_gateway_url("idemlink+http://h:8080/oven/3")
    with pytest.raises(NotThroughGateway):
        parse_gateway_url("http://h:8080/oven")


def test_device_api_through_a_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    monkeypatch.delenv("IDEMLINK_GATEWAY_TOKEN", raising=False)
    monkeypatch.setenv("IDEMLINK_GATEWAY_TOKEN_FILE", str(token))
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        url = "idemlink+" + gw.url + "/dev"
        with Device.open(url) as dev:
            assert isinstance(dev, GatewayDevice)
            assert dev.info is not None and dev.info.device_id == sim.device.device_id
            w = dev.write({"threshold": "41.5", "mode": 2})
            assert w.outcome is Outcome.OK and w.sent_as, w
            assert len(sim.executions_of(_pdu({"threshold": "41.5", "mode": 2}))) == 1
            r = dev.read("threshold")
            assert (r.outcome, r.values) == (Outcome.OK, (415,))
            gen = dev.read("generation").values[0]
            stale = dev.write_if_generation(gen + 1, {"threshold": 300})
            assert stale.outcome is Outcome.NOT_EXECUTED and stale.status is not None
            assert stale.status.name == "GUARD_FAILED"
            assert dev.write_if_generation(gen, {"threshold": 300}).ok
            t = dev.trigger()
            assert t.ok and t.code is not None
            assert dev.trigger_status().ok
            c = dev.clear_faults(1)
            assert c.outcome is Outcome.OK, c
            reads = dev.run([dev.read_command("temperature"), dev.read_command("threshold")])
            assert [x.values for x in reads][1] == (300,)
            with pytest.raises(NotThroughGateway):
                dev.send_files([str(token)])
            with pytest.raises(NotThroughGateway):
                dev.file_info("a.bin")
        keys = {e["key"] for e in gw.call("GET", "/v1/audit?limit=50").body["entries"]
                if e["path"].endswith("/write")}
        assert len(keys) == 3  # one key a call
        with pytest.raises(Exception, match="map"):
            Device.open(url, regmap="boiler")

        async def awaited() -> tuple[Outcome, tuple[int, ...]]:
            async with AsyncDevice.open(url) as adev:
                w = await adev.write({"threshold": 333})
                return w.outcome, (await adev.read("threshold")).values

        assert asyncio.run(awaited()) == (Outcome.OK, (333,))

        # the CLI's --port takes the same URL (in-process: the slow test runs it as a process)
        from idemlink.cli import main

        assert main(["write", "threshold=36.6", "--port", url]) == 0
        assert len(sim.executions_of(_pdu({"threshold": 366}))) == 1
        assert main(["read", "threshold", "--port", url, "--json"]) == 0
        assert main(["write", "threshold=36.7", "--port", url, "--trace",
                     str(tmp_path / "t.jsonl")]) == 1
        assert sim.executions_of(_pdu({"threshold": 367})) == []


@pytest.mark.slow
def test_cli_device_commands_through_a_gateway(tmp_path: Path) -> None:
    """Every device command takes ``--port idemlink+http://...`` as a process would run it: its
    output, one stderr line for what does not go through, and ``--gateway`` of the same URL."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=dev"]) as gw:
        url = "idemlink+" + gw.url + "/dev"
        env = {**os.environ, "IDEMLINK_GATEWAY_TOKEN_FILE": str(token)}
        env.pop("IDEMLINK_GATEWAY_TOKEN", None)

        def cli(*words: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*CLI, *words, "--port", url], capture_output=True, text=True,
                                  timeout=scaled(30), env=env)

        wrote = cli("write", "threshold=36.6")
        assert wrote.returncode == 0, wrote.stderr
        assert len(sim.executions_of(_pdu({"threshold": 366}))) == 1
        read = cli("read", "threshold")
        assert read.returncode == 0 and "36.6" in read.stdout, read.stderr
        traced = cli("write", "threshold=36.7", "--trace", str(tmp_path / "t.jsonl"))
        assert traced.returncode == 1 and traced.stderr.count("\n") == 1, traced.stderr
        assert "Traceback" not in traced.stderr
        info = cli("info")
        assert info.returncode == 0 and sim.device.device_id in info.stdout, info.stderr
        cleared = cli("clear", "--mask", "1")
        assert cleared.returncode in (0, 3), cleared.stdout + cleared.stderr
        gone = subprocess.run([*CLI, "read", "threshold", "--port", url], capture_output=True,
                              text=True, timeout=scaled(30),
                              env={k: v for k, v in os.environ.items()
                                   if not k.startswith("IDEMLINK_GATEWAY_TOKEN")})
        assert gone.returncode == 1 and gone.stderr.count("\n") == 1 and "token" in gone.stderr
        via = subprocess.run([*CLI, "--gateway", url, "read", "threshold"], capture_output=True,
                             text=True, timeout=scaled(30), env=env)
        assert via.returncode == 0 and via.stdout.startswith("threshold = 36.6"), via.stderr
