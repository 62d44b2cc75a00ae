"""Old peers keep working with this revision (issues 22 and 23: addressed and authenticated frames).

The revision is additive: its flags, address byte, tag, status and HELLO_REPLY capabilities are
kept out of the contract hash (``ContractSection.additive``), so a peer of the first contract —
built before it, hash 44d2f2230a344059 — meets a new one with the same hash and frames it knows.
These tests speak the first contract from its own description, not through the codec under test:
the first contract's golden frames (tests/vectors/frames.json, the entries without ``address``),
the oracle's independent reader (``idemlink.oracle_wire``), and the HELLO_REPLY layout as the
first devices built it (``struct`` below). The posix C device in the rest of the suite is another
old device in this sense: it sends no capabilities extension.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from idemlink import oracle_wire
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.payloads import Capability, DeviceInfo, MalformedDeviceInfo

FIRST_CONTRACT_HASH = bytes.fromhex("44d2f2230a344059")
VECTORS = {v["name"]: v for v in json.loads(
    (Path(__file__).parent / "vectors" / "frames.json").read_text())["frames"]}
FIRST_VECTORS = [v for v in VECTORS.values() if "address" not in v]

#: HELLO_REPLY as the first devices built it: the fields, then the identity extension.
_INFO = struct.Struct("<BHHHB8sI")


def _stuff(raw: bytes) -> bytes:
    """COBS, written from the paper (the old peer's own encoder), between two delimiters."""
    out, block = bytearray(), bytearray()
    for b in raw:
        if b == 0:
            out += bytes((len(block) + 1,)) + block
            block.clear()
        else:
            block.append(b)
            if len(block) == 254:
                out += b"\xff" + block
                block.clear()
    out += bytes((len(block) + 1,)) + block
    return b"\x00" + bytes(out) + b"\x00"


def old_frame(ftype: int, seq: int, epoch: int, payload: bytes, flags: int = 0) -> bytes:
    """A frame of the first contract, built by the old peer without idemlink's codec."""
    raw = struct.pack("<BBBIIH", 1, ftype, flags, epoch, seq, len(payload)) + payload
    return _stuff(raw + oracle_wire.crc32c(raw).to_bytes(4, "little"))


def old_read(wire: bytes) -> list[oracle_wire.WireFrame]:
    """Every frame the old peer accepts in ``wire`` (it drops what it does not know)."""
    return [f for unit in wire.split(b"\x00") if unit
            for f in [oracle_wire.read_frame(unit)] if f is not None]


def old_parse_info(payload: bytes) -> tuple[tuple[int, ...], str, bytes, bytes]:
    """The first contract's reading of HELLO_REPLY: fields, name, map hash, the bytes after the
    identity extension (which an old host ignores)."""
    fields = _INFO.unpack_from(payload)
    at = _INFO.size
    name = payload[at + 1 : at + 1 + payload[at]].decode()
    at += 1 + payload[at]
    map_hash = payload[at : at + 8]
    at += 8
    for _ in range(2):  # device_id, map_name
        at += 1 + payload[at]
    return fields, name, map_hash, payload[at:]


def test_first_contract_golden_frames_are_byte_for_byte_the_old_ones() -> None:
    """The first contract's golden frames are still in the vectors, unchanged, and the old
    reader accepts each exactly as declared."""
    assert len(FIRST_VECTORS) == 7
    for v in FIRST_VECTORS:
        wire = bytes.fromhex(v["wire"])
        assert wire == old_frame({"HELLO": 1, "HELLO_REPLY": 2, "REQUEST": 3, "RESPONSE": 4}
                                 [v["type"]], v["seq"], v["epoch"], bytes.fromhex(v["payload"]),
                                 v["flags"]), v["name"]
        (f,) = old_read(wire)
        assert (f.seq, f.epoch, f.flags, f.payload.hex()) == (v["seq"], v["epoch"], v["flags"],
                                                              v["payload"])


def test_an_old_host_drives_a_new_device() -> None:
    """An old host's HELLO (the golden frame, and one with its hash) gets a reply it reads with
    the first contract's layout: the same contract hash, the capabilities extension left as
    trailing bytes. A request it builds itself runs once; its retransmission is replayed."""
    dev = SimulatedDevice(seed=7)
    dev.receive_data(bytes.fromhex(VECTORS["hello"]["wire"]), 0.0)
    dev.receive_data(old_frame(1, 5, 0, b"\x01" + FIRST_CONTRACT_HASH), 0.0)
    replies = old_read(dev.data_to_send())
    assert [(r.type, r.seq) for r in replies] == [(2, 0), (2, 5)]
    fields, name, map_hash, trailing = old_parse_info(replies[1].payload)
    version, _window, _max_payload, _slots, _inflight, hash_, next_seq = fields
    assert (version, hash_, name) == (1, FIRST_CONTRACT_HASH, "idemlink-sim")
    assert map_hash == dev.core.regmap.hash
    assert trailing == bytes(3)  # capabilities NONE, address 0: the old host ignores them
    epoch = replies[1].epoch

    # a golden request of another epoch: refused in the first contract's shape
    dev.receive_data(bytes.fromhex(VECTORS["request_read10"]["wire"]), 0.0)
    (refusal,) = old_read(dev.data_to_send())
    assert refusal.payload == bytes((oracle_wire.EPOCH_MISMATCH,)) + (0x12345678).to_bytes(4, "little")

    write = bytes.fromhex("060005") + (2).to_bytes(2, "big")  # mode := 2, set-only
    dev.receive_data(old_frame(3, next_seq, epoch, write), 0.1)
    (first,) = old_read(dev.data_to_send())
    dev.receive_data(old_frame(3, next_seq, epoch, write, oracle_wire.RETRANSMIT), 0.2)
    (again,) = old_read(dev.data_to_send())
    assert first.payload[0] == oracle_wire.STATUS_OK and first.flags == 0
    assert again.payload == first.payload and again.flags == oracle_wire.REPLAY
    assert len(dev.executions_of(epoch, next_seq)) == 1 and dev.core.read(5, 1) == (2,)


def test_a_new_device_never_answers_frames_an_old_host_cannot_read() -> None:
    """An old host never sees an ADDRESSED or AUTH frame from a new device: a device answers in
    the shape it was asked (point to point here), and only a host that asked in the new shape
    gets one. (Its HELLO_REPLY's capabilities are trailing bytes, read above.)"""
    dev = SimulatedDevice(seed=8)
    dev.receive_data(old_frame(1, 1, 0, b"\x01" + FIRST_CONTRACT_HASH), 0.0)
    out = dev.data_to_send()
    units = [u for u in out.split(b"\x00") if u]
    assert len(units) == len(old_read(out)) == 1


def test_a_new_host_drives_an_old_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device whose HELLO_REPLY ends after the identity extension, byte for byte what the
    first devices send: the new host accepts it (same hash), sees no capabilities, and runs
    writes and reads as before."""
    real = DeviceSession.device_info

    def first_contract_info(self: DeviceSession) -> DeviceInfo:
        info = real(self)
        return DeviceInfo(info.version, info.window, info.max_payload, info.replay_slots,
                          info.max_inflight, info.contract_hash, info.next_seq, info.name,
                          info.map_hash, info.device_id, info.map_name)

    monkeypatch.setattr(DeviceSession, "device_info", first_contract_info)
    sim = SimulatedDevice(seed=9)
    with Device(SimTransport(sim), timeout=0.05) as dev:
        dev.connect()
        info = dev.info
        assert info is not None and info.capabilities is None
        assert not info.serves(Capability.ADDRESSED)
        assert old_parse_info(first_contract_info(sim.session).encode())[3] == b""
        assert dev.write({"mode": 2}).outcome.name == "OK"
        assert dev.read("mode").values == (2,)


def test_capabilities_round_trip_and_a_truncated_extension_is_refused() -> None:
    info = DeviceInfo(1, 992, 512, 64, 32, FIRST_CONTRACT_HASH, 1, "d", b"m" * 8, "id", "map",
                      int(Capability.ADDRESSED), 7)
    back = DeviceInfo.decode(info.encode())
    assert back == info and back.serves(Capability.ADDRESSED)
    assert not back.serves(Capability.AUTH)
    with pytest.raises(MalformedDeviceInfo, match="capabilities extension"):
        DeviceInfo.decode(info.encode()[:-1])
    # the bus extension follows; bytes after it are ignored, as every reader ignores them
    bus = DeviceInfo.decode(info.encode() + (5).to_bytes(4, "little") + b"\x09\x09")
    assert bus.broadcast_next == 5 and bus.address == 7
    with pytest.raises(MalformedDeviceInfo, match="bus extension"):
        DeviceInfo.decode(info.encode() + b"\x09\x09")
