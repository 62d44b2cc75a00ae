"""Issue 22 item 1 in the simulator: a device with a bus address (docs/BUS.md).

Each device has its own session (boot epoch, window, replay cache, sequence numbers; HELLO per
address), answers frames addressed to it in kind, ignores other addresses, still answers
unaddressed frames ("the device on this line"), and runs a broadcast set-only write at most once
per number without answering. The host opens one address (``Device(..., address=N)``,
``--address N``); the address is kept in the flash directory and shown by ``idemlink info``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.timing import read_line, scaled

from idemlink.cli import main
from idemlink.device_sim.device import BROADCAST_EPOCH, SimulatedDevice
from idemlink.device_sim.flash import UnsafeFlashFileError
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.errors import NoDevice
from idemlink.protocol.device_session import AddressVerdict, address_verdict
from idemlink.protocol.frame import (
    Flags,
    Frame,
    FrameEncodeError,
    FrameType,
    decode_frames,
    encode_frame,
)
from idemlink.protocol.payloads import Capability, DeviceInfo, decode_response_payload

MODE = 0x0005  # HOLDING register "mode" of the built-in map
WRITE_MODE_2 = bytes.fromhex("0600050002")


def frames(wire: bytes) -> list[Frame]:
    out = decode_frames(wire)
    assert all(isinstance(f, Frame) for f in out)
    return [f for f in out if isinstance(f, Frame)]


def hello(dev: SimulatedDevice, address: int | None, seq: int = 1) -> tuple[Frame, DeviceInfo]:
    dev.receive_data(encode_frame(FrameType.HELLO, seq, 0, b"", address=address), 0.0)
    (reply,) = frames(dev.data_to_send())
    return reply, DeviceInfo.decode(reply.payload)


def test_the_address_rule_is_one_table() -> None:
    v = address_verdict
    assert v(None, False, None) is v(None, False, 7) is AddressVerdict.THIS_LINE
    assert v(7, False, 7) is AddressVerdict.OURS
    assert v(8, False, 7) is AddressVerdict.OTHER
    assert v(0, False, 7) is AddressVerdict.BROADCAST
    assert v(7, False, None) is v(0, False, None) is AddressVerdict.UNEXPECTED
    assert v(7, True, 7) is v(None, True, 7) is AddressVerdict.UNEXPECTED


def test_an_addressed_device_answers_its_address_in_kind_and_ignores_others() -> None:
    dev = SimulatedDevice(seed=1, address=7)
    reply, info = hello(dev, 7)
    assert reply.address == 7 and info.address == 7 and info.serves(Capability.ADDRESSED)
    epoch, seq = reply.epoch, info.next_seq
    dev.receive_data(encode_frame(FrameType.REQUEST, seq, epoch, WRITE_MODE_2, address=8), 0.0)
    dev.receive_data(encode_frame(FrameType.HELLO, 2, 0, b"", address=9), 0.0)
    assert dev.data_to_send() == b"" and dev.session.counters["other_address"] == 2
    dev.receive_data(encode_frame(FrameType.REQUEST, seq, epoch, WRITE_MODE_2, address=7), 0.0)
    (answer,) = frames(dev.data_to_send())
    assert answer.address == 7 and answer.seq == seq
    # the same number unaddressed ("the device on this line") is the same device's retry
    dev.receive_data(encode_frame(FrameType.REQUEST, seq, epoch, WRITE_MODE_2,
                                  Flags.RETRANSMIT), 0.0)
    (again,) = frames(dev.data_to_send())
    assert again.address is None and again.flags & Flags.REPLAY
    assert again.payload == answer.payload and len(dev.executions_of(epoch, seq)) == 1
    assert dev.core.read(MODE, 1) == (2,)


def test_a_device_without_an_address_stays_silent_on_addressed_frames() -> None:
    dev = SimulatedDevice(seed=2)
    reply, info = hello(dev, None)
    assert info.capabilities == 0 and info.address == 0 and reply.address is None
    dev.receive_data(encode_frame(FrameType.HELLO, 2, 0, b"", address=1), 0.0)
    dev.receive_data(encode_frame(FrameType.REQUEST, 3, 0, WRITE_MODE_2, address=0), 0.0)
    assert dev.data_to_send() == b"" and dev.session.counters["unexpected_frames"] == 2
    assert dev.executions == []


def test_broadcast_runs_a_set_only_write_once_per_number_and_never_answers() -> None:
    devs = [SimulatedDevice(seed=10 + a, address=a) for a in (1, 2, 3)]
    bcast = encode_frame(FrameType.REQUEST, 41, 0, WRITE_MODE_2, address=0)
    for _ in range(3):  # a broadcast repeated, as a master re-sends it
        for d in devs:
            d.receive_data(bcast, 0.0)
    for d in devs:
        assert d.data_to_send() == b""
        assert d.core.read(MODE, 1) == (2,)
        assert [(e.epoch, e.seq) for e in d.executions] == [(BROADCAST_EPOCH, 41)]
        assert d.session.counters["broadcast_executed"] == 1
        assert d.session.counters["broadcast_repeated"] == 2


@pytest.mark.parametrize("pdu", [
    bytes.fromhex("0300000001"),  # a read: nobody would see the answer
    bytes.fromhex("4200080001"),  # a trigger: not set-only
    bytes.fromhex("0600000001"),  # an INPUT register
    b"\x06\x00",  # malformed
], ids=["read", "trigger", "input", "malformed"])
def test_broadcast_refuses_what_is_not_a_set_only_write(pdu: bytes) -> None:
    dev = SimulatedDevice(seed=4, address=4)
    dev.receive_data(encode_frame(FrameType.REQUEST, 1, 0, pdu, address=0), 0.0)
    assert dev.data_to_send() == b"" and dev.executions == []
    assert dev.session.counters["broadcast_refused"] == 1


def test_two_devices_on_one_stream_have_their_own_sessions() -> None:
    """Every device hears every byte; each answers only its own address, from its own epoch,
    window and numbers."""
    a, b = SimulatedDevice(seed=21, address=1), SimulatedDevice(seed=22, address=2)
    stream = (encode_frame(FrameType.HELLO, 5, 0, b"", address=1)
              + encode_frame(FrameType.HELLO, 6, 0, b"", address=2))
    for d in (a, b):
        d.receive_data(stream, 0.0)
    (ra,), (rb,) = frames(a.data_to_send()), frames(b.data_to_send())
    assert (ra.address, ra.seq, rb.address, rb.seq) == (1, 5, 2, 6)
    assert ra.epoch != rb.epoch
    ia, ib = DeviceInfo.decode(ra.payload), DeviceInfo.decode(rb.payload)
    # the same number to both: each runs it once, in its own space
    stream = (encode_frame(FrameType.REQUEST, ia.next_seq, ra.epoch, WRITE_MODE_2, address=1)
              + encode_frame(FrameType.REQUEST, ia.next_seq, rb.epoch, WRITE_MODE_2, address=2))
    for d in (a, b):
        d.receive_data(stream, 0.1)
    (oa,), (ob,) = frames(a.data_to_send()), frames(b.data_to_send())
    assert decode_response_payload(oa.payload) == decode_response_payload(ob.payload)
    assert (oa.address, ob.address) == (1, 2) and ib.next_seq == ia.next_seq
    assert len(a.executions) == len(b.executions) == 1


def test_the_host_opens_one_address() -> None:
    sim = SimulatedDevice(seed=5, address=5)
    with Device(SimTransport(sim), timeout=0.05, address=5) as dev:
        dev.connect()
        assert dev.info is not None and dev.info.address == 5
        assert dev.write({"mode": 2}).outcome.name == "OK"
        assert dev.read("mode").values == (2,)
    wrong = Device(SimTransport(sim), timeout=0.02, attempts=2, address=6)
    with pytest.raises(NoDevice):
        wrong.connect()
    assert sim.session.counters["other_address"] == 2
    with pytest.raises(FrameEncodeError, match=r"1\.\.247"):
        Device(SimTransport(sim), address=0)


def test_the_address_is_kept_in_the_flash_dir(tmp_path: Path) -> None:
    SimulatedDevice(seed=1, flash_dir=tmp_path, address=9).close()
    assert (tmp_path / "address").read_text() == "9\n"
    kept = SimulatedDevice(seed=1, flash_dir=tmp_path)
    assert kept.address == 9
    kept.close()
    (tmp_path / "address").write_text("300\n")
    with pytest.raises(UnsafeFlashFileError, match="does not hold a device address"):
        SimulatedDevice(seed=1, flash_dir=tmp_path)


def test_cli_sim_address_info_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flash = tmp_path / "flash"
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--address", "12",
                             "--flash-dir", str(flash), "--seed", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = read_line(proc.stdout, proc)
        assert main(["info", "--port", port, "--address", "12", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["address"] == 12 and out["capabilities"] == ["ADDRESSED"]
        assert main(["info", "--port", port, "--address", "12"]) == 0
        assert "bus address   12" in capsys.readouterr().out
        assert main(["write", "--port", port, "--address", "12", "mode=1"]) == 0
        capsys.readouterr()
        assert main(["read", "--port", port, "--address", "13", "mode", "--timeout", "0.05",
                     "--attempts", "2"]) == 1
        assert "no idemlink device answered at address 13" in capsys.readouterr().err
        assert main(["read", "--port", port, "--address", "0", "mode"]) == 1
        assert "--address must be 1..247" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(10)) == 0
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    assert (flash / "address").read_text() == "12\n"


def test_the_monitor_shows_the_address() -> None:
    from idemlink.host.frame_view import FrameDescriber

    d = FrameDescriber()
    addressed, broadcast, plain = decode_frames(
        encode_frame(FrameType.REQUEST, 5, 7, WRITE_MODE_2, address=3)
        + encode_frame(FrameType.REQUEST, 6, 0, WRITE_MODE_2, address=0)
        + encode_frame(FrameType.REQUEST, 7, 7, WRITE_MODE_2))
    one, every, none = d.describe(addressed), d.describe(broadcast), d.describe(plain)
    assert one["address"] == 3 and "address=3 " in one["text"]
    assert every["address"] == 0 and " broadcast " in every["text"]
    assert "address" not in none and "address" not in none["text"]


def test_the_async_device_opens_one_address_too() -> None:
    import asyncio

    from idemlink.device_sim.simlink import AsyncSimTransport
    from idemlink.host.aio import AsyncDevice

    sim = SimulatedDevice(seed=6, address=9)

    async def go() -> tuple[int | None, str, tuple[int, ...]]:
        dev = AsyncDevice(AsyncSimTransport(SimTransport(sim)), timeout=0.05, address=9)
        await dev.connect()
        written = await dev.write({"mode": 1})
        values = (await dev.read("mode")).values
        await dev.close()
        assert dev.info is not None
        return dev.info.address, written.outcome.name, values

    assert asyncio.run(go()) == (9, "OK", (1,))
