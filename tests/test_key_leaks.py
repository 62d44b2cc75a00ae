"""Keys never leak (issue 23 item 4): every command that takes a key, run against a keyed
simulator, and what it leaves behind — stdout (text and ``--json``), stderr, the log records
(DEBUG, every logger), ``--trace`` files, the monitor's decoding of the same frames, the
gateway's API answers and its stderr, and the text of every refusal — is scanned for the key and
the session keys the device derived, as hex (either case), base64 and raw bytes."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.frame_view import FrameDescriber
from idemlink.protocol.auth import key_id
from idemlink.protocol.frame import FrameDecoder
from idemlink.pytest_plugin import PtySim, start_pty_sim

KEY = bytes.fromhex("5a" * 8 + "c3" * 8 + "0f" * 8 + "e1" * 8)
WRONG = bytes(range(32))


class Secrets:
    """The byte strings that must never appear: the long-term keys and each session key."""

    def __init__(self) -> None:
        self.keys: set[bytes] = {KEY, WRONG}

    def note_session(self, sim: SimulatedDevice) -> None:
        auth = sim.session.auth
        if auth is not None and auth.session is not None:
            self.keys.add(auth.session.key)

    def forms(self) -> Iterator[tuple[str, bytes]]:
        for k in self.keys:
            yield "raw", k
            yield "hex", k.hex().encode()
            yield "HEX", k.hex().upper().encode()
            yield "base64", base64.b64encode(k)
            yield "half hex", k.hex()[:32].encode()

    def check(self, what: str, data: str | bytes) -> None:
        blob = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        for form, needle in self.forms():
            assert needle not in blob, f"{what}: a key as {form}"


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple[PtySim, Path]]:
    sim = start_pty_sim(SimulatedDevice(seed=5, keys=(KEY,)))
    path = tmp_path / "device.key"
    path.write_text(f"# the device's key\n{KEY.hex()}\n")
    path.chmod(0o600)
    try:
        yield sim, path
    finally:
        sim.close()


def test_no_command_output_log_trace_or_error_shows_a_key(
        keyed: tuple[PtySim, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    sim, key_file = keyed
    secrets = Secrets()
    caplog.set_level(logging.DEBUG)
    trace = tmp_path / "trace.jsonl"
    firmware = tmp_path / "fw.bin"
    firmware.write_bytes(b"firmware" * 40)
    k = ("--port", sim.path, "--key-file", str(key_file))
    runs = [
        ("info", *k), ("info", *k, "--json"),
        ("read", *k, "--json", "mode", "threshold"), ("read", *k, "--trace", str(trace), "mode"),
        ("write", *k, "--json", "mode=2"), ("write", *k, "--trace", str(trace), "mode=1"),
        ("faults", *k, "--json"), ("clear", *k, "over_temperature"),
        ("trigger", *k, "--json"), ("trigger", *k, "--status"),
        ("watch", *k, "mode", "--count", "1", "--json", "--interval", "0.05"),
        ("send", *k, str(firmware), "--no-progress", "--overwrite"),
    ]
    for argv in runs:
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 0, (argv, err)
        secrets.note_session(sim.device)
        for stream, text in (("stdout", out), ("stderr", err)):
            secrets.check(f"{argv[0]} {stream}", text)
    info = json.loads(main_json(capsys, "info", *k, "--json"))
    assert info["authenticated"] is True and info["key_id"] is not None
    # the key from the environment, as hex: nowhere either
    monkeypatch.setenv("IDEMLINK_KEY", KEY.hex())
    assert main(["read", "--port", sim.path, "mode", "--json"]) == 0
    secrets.check("read with IDEMLINK_KEY", "".join(capsys.readouterr()))
    monkeypatch.delenv("IDEMLINK_KEY")
    # refusals: a key file others can read, a wrong key, a key in the environment cut short
    bad = tmp_path / "open.key"
    bad.write_text(KEY.hex())
    bad.chmod(0o644)
    wrong = tmp_path / "wrong.key"
    wrong.write_text(WRONG.hex())
    wrong.chmod(0o600)
    fast = ("--port", sim.path, "--timeout", "0.05", "--attempts", "2")
    for argv, env in ((("read", *fast, "--key-file", str(bad), "mode"), None),
                      (("read", *fast, "--key-file", str(wrong), "mode"), None),
                      (("info", *fast, "--key-file", str(wrong)), None),
                      (("read", *fast, "mode"), KEY.hex()[:-2])):
        if env is not None:
            monkeypatch.setenv("IDEMLINK_KEY", env)
        rc = main(list(argv))
        out, err = capsys.readouterr()
        monkeypatch.delenv("IDEMLINK_KEY", raising=False)
        assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        secrets.check(f"refused {argv}", out + err)
        assert KEY.hex()[:16] not in err
    secrets.note_session(sim.device)
    for record in caplog.records:
        secrets.check(f"log record {record.name}", record.getMessage())
    data = trace.read_bytes()
    assert data.count(b"\n") >= 4
    secrets.check("--trace file", data)
    assert len(secrets.keys) >= 3  # session keys were seen, and checked
    with pytest.raises(AssertionError):  # the scan can fail: a session key's hex is caught
        secrets.check("self-test", "tag " + max(secrets.keys).hex().upper())


def test_the_monitor_and_reprs_show_no_key() -> None:
    """What ``idemlink monitor`` prints of keyed frames both ways (its ``FrameDescriber``), and
    the repr of every object holding a key."""
    secrets = Secrets()
    sim = SimulatedDevice(seed=6, keys=(KEY,))
    wire: list[bytes] = []

    class Tap(SimTransport):
        def write(self, data: bytes) -> None:
            wire.append(data)
            super().write(data)

        def read(self, timeout: float) -> bytes:
            data = super().read(timeout)
            wire.append(data)
            return data

    dev = Device(Tap(sim), timeout=0.02, key=KEY)
    dev.connect()
    assert dev.write({"mode": 1}).ok and dev.read("mode").ok
    secrets.note_session(sim)
    decoder, describer = FrameDecoder(), FrameDescriber()
    shown = 0
    for chunk in wire:
        decoder.receive_data(chunk)
        for item in iter(decoder.next_event, None):
            secrets.check("monitor line", json.dumps(describer.describe(item)))
            shown += 1
    assert shown >= 6
    for thing in (dev.ops, dev.session, dev.session.auth, sim.session, sim.session.auth,
                  sim.key_ring, sim.session.device_info()):
        secrets.check(f"repr of {type(thing).__name__}", repr(thing))


def main_json(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr()[0]


def test_the_gateway_port_says_authenticated_and_the_key_id_never_the_key(
        keyed: tuple[PtySim, Path], tmp_path: Path) -> None:
    """The gateway's port config takes the key file; its identity (``GET /v1/ports/{port}``'s
    body) says authenticated and the key id; a read through it runs signed."""
    import asyncio

    from idemlink.gateway.service import Gateway, PortSpec
    from idemlink.gateway.store import CallStore
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    sim, key_file = keyed
    secrets = Secrets()

    async def run() -> list[dict[str, object]]:
        gw = Gateway(CallStore.open(tmp_path / "calls.db"),
                     [PortSpec("boiler", sim.path, DEFAULT_MAP, key_file=str(key_file)),
                      PortSpec("plain", sim.path + "-absent", DEFAULT_MAP)])
        await gw.start()
        try:
            read = await gw.read("boiler", ["mode"])
            return [gw.identity("boiler"), read.body, *gw.port_list()]
        finally:
            await gw.close()

    ident, read, *listing = asyncio.run(run())
    device = ident["device"]
    assert isinstance(device, dict)
    assert ident["authenticated"] is True and device["key_id"] == f"{key_id(KEY):08x}"
    assert read["outcome"] == "OK", read
    secrets.note_session(sim.device)
    for body in (ident, read, *listing):
        secrets.check("gateway answer", json.dumps(body))


def test_the_gateway_refuses_key_files_it_cannot_use(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from support.gateway import tokens_file

    path = tmp_path / "k"
    path.write_text(KEY.hex())
    common = ["gateway", "--tokens", str(tokens_file(tmp_path)), "--store",
              str(tmp_path / "calls.db"), "--listen", "127.0.0.1:0", "--key-file", str(path)]
    path.chmod(0o644)
    assert main([*common, "--port", "loop://"]) == 1
    err = capsys.readouterr()[1]
    assert err.count("\n") == 1 and "0600" in err and KEY.hex() not in err
    path.chmod(0o600)
    assert main([*common, "--rtu-port", "loop://"]) == 1
    err = capsys.readouterr()[1]
    assert err.count("\n") == 1 and "no room for a MAC" in err
