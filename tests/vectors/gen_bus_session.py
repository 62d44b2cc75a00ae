"""Generate ``bus_session.json``: golden streams of a device on a bus (docs/BUS.md), shared by the
Python and the C tests.

Each stream is a device (epoch, bus address or none, device id) fed whole frames one after the
other at time 0; each step holds the frame's wire bytes and the exact bytes the device answers
(empty: silence). The answers come from the Python reference (``DeviceSession`` in front of
``DeviceCore`` of the built-in map, 8 replay slots); ``tests/test_bus_vectors.py`` checks that the
file is what this script writes now and that the C core (``make check`` with ``IDL_BUS=1``, through
``build/bus_vectors.h``, and the ctypes library) answers every step byte for byte, with the same
counters at the end of each stream.

Run ``python3 tests/vectors/gen_bus_session.py`` after a change of the rule; the file is
committed.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

from idemlink.protocol.cobs import encode as cobs_encode
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import Flags, FrameType, crc32c, encode_frame
from idemlink.protocol.registers import RegisterKind
from idemlink.protocol.regmap_file import DEFAULT_MAP

OUT = Path(__file__).with_name("bus_session.json")
EPOCH = 0x1DE71A4B
OTHER_EPOCH = 0x0BADCAFE
COUNTERS = ("executed", "replayed", "hello", "other_address", "unexpected_frames",
            "broadcast_executed", "broadcast_repeated", "broadcast_refused", "decode_errors",
            "epoch_mismatch")
"""The counters compared at the end of a stream (the C core's IDL_DISP_* of the same meaning)."""


def _fc06(address: int, value: int) -> bytes:
    return struct.pack(">BHH", 0x06, address, value)


def _fc16(address: int, values: tuple[int, ...]) -> bytes:
    return struct.pack(f">BHHB{len(values)}H", 0x10, address, len(values), 2 * len(values),
                       *values)


def _read(address: int, count: int) -> bytes:
    return struct.pack(">BHH", 0x03, address, count)


def _raw_frame(ftype: int, flags: int, epoch: int, seq: int, payload: bytes,
               address: int | None = None, tag: bytes = b"") -> bytes:
    """A frame built by hand (an address out of range, a tag nobody can check)."""
    head = struct.pack("<BBBIIH", 1, ftype, flags, epoch, seq, len(payload))
    body = head + (b"" if address is None else bytes([address])) + payload + tag
    return b"\x00" + cobs_encode(body + struct.pack("<I", crc32c(body))) + b"\x00"


def _steps(address: int | None) -> list[tuple[str, bytes]]:
    """The frames of one stream: every row of ``address_verdict`` and of the broadcast rule."""
    threshold = DEFAULT_MAP.named("threshold").address
    temperature = DEFAULT_MAP.named("temperature").address
    holdings = sorted(DEFAULT_MAP.of_kind(RegisterKind.HOLDING), key=lambda s: s.address)
    first = holdings[0].address
    block = tuple(s.default if s.minimum <= s.default <= s.maximum else s.minimum
                  for s in holdings)
    block = tuple(min(v + 1, s.maximum) for v, s in zip(block, holdings, strict=True))
    trigger = DEFAULT_MAP.of_kind(RegisterKind.TRIGGER)[0].address
    own = address if address is not None else 5
    other = own - 2 if own > 2 else own + 2
    req = FrameType.REQUEST
    e = EPOCH
    return [
        ("hello_unaddressed", encode_frame(FrameType.HELLO, 1, 0, b"")),
        ("hello_own", encode_frame(FrameType.HELLO, 2, 0, b"", address=own)),
        ("hello_other", encode_frame(FrameType.HELLO, 3, 0, b"", address=other)),
        ("write_own", encode_frame(req, 10, e, _fc06(threshold, 300), address=own)),
        ("write_own_retransmitted", encode_frame(req, 10, e, _fc06(threshold, 300),
                                                 Flags.RETRANSMIT, address=own)),
        ("write_own_retried_unaddressed", encode_frame(req, 10, e, _fc06(threshold, 300),
                                                       Flags.RETRANSMIT)),
        ("write_other", encode_frame(req, 11, e, _fc06(threshold, 310), address=other)),
        ("broadcast_block", encode_frame(req, 1, e, _fc16(first, block), address=0)),
        ("broadcast_block_again", encode_frame(req, 1, e, _fc16(first, block), Flags.RETRANSMIT,
                                               address=0)),
        ("broadcast_trigger", encode_frame(req, 2, e, struct.pack(">BHH", 0x42, trigger, 1),
                                           address=0)),
        ("broadcast_read", encode_frame(req, 3, e, _read(first, 1), address=0)),
        ("broadcast_hello", encode_frame(FrameType.HELLO, 4, 0, b"", address=0)),
        ("broadcast_input", encode_frame(req, 5, e, _fc06(temperature, 1), address=0)),
        ("broadcast_malformed", encode_frame(req, 6, e, _fc06(threshold, 1)[:4], address=0)),
        ("broadcast_other_epoch", encode_frame(req, 7, OTHER_EPOCH, _fc06(threshold, 333),
                                               address=0)),
        ("broadcast_out_of_range", encode_frame(req, 8, e, _fc06(threshold, 0xFFFF),
                                                address=0)),
        ("broadcast_late_number", encode_frame(req, 1, e, _fc06(threshold, 444), address=0)),
        ("read_own", encode_frame(req, 12, e, _read(first, len(holdings)), address=own)),
        ("hello_own_after_broadcasts", encode_frame(FrameType.HELLO, 13, 0, b"", address=own)),
        ("write_own_other_epoch", encode_frame(req, 14, OTHER_EPOCH, _fc06(threshold, 320),
                                               address=own)),
        ("tagged_own", _raw_frame(req, Flags.ADDRESSED | Flags.AUTH, e, 15,
                                  _fc06(threshold, 330), own, bytes(8))),
        ("address_248", _raw_frame(req, Flags.ADDRESSED, e, 16, _fc06(threshold, 340), 248)),
        ("write_unaddressed", encode_frame(req, 17, e, _fc06(threshold, 350))),
        ("read_unaddressed", encode_frame(req, 18, e, _read(first, len(holdings)))),
    ]


def stream(name: str, address: int | None, device_id: str) -> dict[str, Any]:
    core = DeviceCore(DEFAULT_MAP, trigger_duration=2.0)
    session = DeviceSession(
        lambda pdu, now, seq: core.execute(pdu, now), EPOCH, contract_hash=contract_hash(),
        name="idemlink-sim", map_hash=DEFAULT_MAP.hash, device_id=device_id,
        map_name=DEFAULT_MAP.name, replay_slots=8, address=address,
        broadcast_ok=core.broadcast_ok)
    steps = []
    for step, wire in _steps(address):
        session.receive_data(wire, 0.0)
        steps.append({"name": step, "in": wire.hex(), "out": session.data_to_send().hex()})
    return {"name": name, "epoch": EPOCH, "address": address, "device_id": device_id,
            "steps": steps, "counters": {k: session.counters[k] for k in COUNTERS}}


def render() -> str:
    table = {
        "about": "generated by tests/vectors/gen_bus_session.py: a device on a bus, frames in, "
                 "exact answers out (docs/BUS.md)",
        "map": DEFAULT_MAP.name,
        "replay_slots": 8,
        "streams": [stream("address_5", 5, "bus-0005"), stream("address_247", 247, "bus-0247"),
                    stream("no_address", None, "bus-none")],
    }
    return json.dumps(table, indent=1) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    sys.exit(0)
