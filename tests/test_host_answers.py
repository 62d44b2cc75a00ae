"""What the host makes of answers the contract does not define.

- A TRIGGER answer code outside ``TriggerStatus`` (e.g. 0x0103) is UNKNOWN, never OK: whether the
  action started is not known (CLI: exit 5).
- A HELLO_REPLY whose payload does not parse is an incompatible device with a one-line reason
  (CLI: one line on stderr, exit 1, no traceback).
"""

from __future__ import annotations

import json
import os
import select
import threading

import pytest

from idemlink.cli import EXIT_LOCAL_ERROR, EXIT_UNKNOWN, build_parser, main
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.pty import open_pty
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice
from idemlink.protocol.frame import Frame, FrameDecoder, FrameType, decode_frames, encode_frame
from idemlink.protocol.modbus import classify_answer
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import TriggerStatus

TRIGGER_START = bytes.fromhex("42000800" "01")


@pytest.mark.parametrize("code", [0x0103, 0x0001, 0x00FF, 0xFF02, 0xFFFF])
def test_an_undefined_trigger_code_is_unknown(code: int) -> None:
    answer = bytes.fromhex("420008") + code.to_bytes(2, "big")
    outcome, _, _ = classify_answer(TRIGGER_START, answer)
    assert outcome is Outcome.UNKNOWN


@pytest.mark.parametrize("code", [TriggerStatus.ACCEPTED, TriggerStatus.RUNNING,
                                  TriggerStatus.DONE])
def test_the_defined_trigger_codes_stay_ok(code: TriggerStatus) -> None:
    answer = bytes.fromhex("420008") + int(code).to_bytes(2, "big")
    assert classify_answer(TRIGGER_START, answer)[0] is Outcome.OK


class _OddTriggerDevice(SimulatedDevice):
    """Answers every trigger write with code 0x0103 (not in the contract)."""

    def _execute(self, pdu: bytes, now: float, seq: int) -> bytes:
        answer = super()._execute(pdu, now, seq)
        if pdu[:1] == b"\x42":
            return answer[:3] + b"\x01\x03"
        return answer


def test_cli_trigger_with_an_undefined_code_exits_unknown(
        capsys: pytest.CaptureFixture[str]) -> None:
    t = SimTransport(_OddTriggerDevice(seed=1))
    args = build_parser().parse_args(["trigger", "--json"])

    def opener() -> Device:
        dev = Device(t, attempts=3)
        dev.connect()
        return dev

    args.open_device = opener
    rc = args.handler(args)
    doc = json.loads(capsys.readouterr().out)
    assert rc == EXIT_UNKNOWN and doc["outcome"] == "UNKNOWN"


class _GarbledHelloTransport(SimTransport):
    """Answers every HELLO with a HELLO_REPLY whose payload is three bytes."""

    def write(self, data: bytes) -> None:
        self._garbled = encode_frame(FrameType.HELLO_REPLY, self._hello_seq(data), 0x1234,
                                     b"\x01\x02\x03")

    def _hello_seq(self, data: bytes) -> int:
        frames = [f for f in decode_frames(data) if isinstance(f, Frame)]
        return frames[0].seq

    def read(self, timeout: float) -> bytes:
        out, self._garbled = getattr(self, "_garbled", b""), b""
        return out


def test_a_malformed_hello_reply_is_an_incompatible_device_in_one_line() -> None:
    dev = Device(_GarbledHelloTransport(SimulatedDevice(seed=1)), attempts=2)
    with pytest.raises(IncompatibleDevice) as info:
        dev.connect()
    assert "\n" not in str(info.value) and "malformed HELLO_REPLY" in str(info.value)


def test_cli_with_a_malformed_hello_reply_says_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    pair = open_pty()
    stop = threading.Event()

    def garbling_device() -> None:
        decoder = FrameDecoder()
        while not stop.is_set():
            ready, _, _ = select.select([pair.master_fd], [], [], 0.02)
            if not ready:
                continue
            decoder.receive_data(os.read(pair.master_fd, 4096))
            for f in iter(decoder.next_event, None):
                if isinstance(f, Frame) and f.type is FrameType.HELLO:
                    os.write(pair.master_fd,
                             encode_frame(FrameType.HELLO_REPLY, f.seq, 0x1234, b"\x01\x02"))

    thread = threading.Thread(target=garbling_device, daemon=True)
    thread.start()
    try:
        rc = main(["read", "--port", pair.slave_path, "--timeout", "0.2", "--attempts", "1"])
    finally:
        stop.set()
        thread.join()
        pair.close()
    err = capsys.readouterr().err
    assert rc == EXIT_LOCAL_ERROR
    assert err.count("\n") == 1 and "malformed HELLO_REPLY" in err and "Traceback" not in err


def test_answer_values_and_codes_come_from_the_protocol_decoder() -> None:
    """``answer_of`` unpacks nothing by hand: an answer ``decode_response`` would refuse (a
    trailing byte, a short conditional-write answer, another function's shape) carries neither
    values nor a code, and the well-formed ones carry exactly what the decoder read."""
    from idemlink.host.command import Command, CommandKind, answer_of

    trig = Command(CommandKind.TRIGGER, 0x0800)
    wig = Command(CommandKind.WRITE_IF_GENERATION, 0x0100, 1, (5,), generation=7)
    read2 = Command(CommandKind.READ, 0x0100, 2)
    assert answer_of(trig, bytes.fromhex("42080000" "01")) == ((), 0x0001)
    assert answer_of(trig, bytes.fromhex("42080000" "01" "ff")) == ((), None)  # trailing byte
    assert answer_of(wig, bytes.fromhex("41" "00" "0008")) == ((), 8)
    assert answer_of(wig, bytes.fromhex("41" "00" "0008" "00")) == ((), None)
    assert answer_of(read2, bytes.fromhex("0604" "0001" "0002")) == ((), None)  # not a read answer
    assert answer_of(read2, bytes.fromhex("0304" "0001" "0002")) == ((1, 2), None)
    assert answer_of(read2, bytes.fromhex("83" "02")) == ((), None)
    assert answer_of(read2, b"") == ((), None)


def test_errors_carry_a_status_only_when_one_applies() -> None:
    """A failing port is not a misuse of the API with a LINK_LOST status; LinkLost (requests were
    out) is LINK_LOST; a blocked handle or a device that is not connected has no wire status;
    a flash that cannot save is not a LocalProtocolError."""
    from idemlink.host.errors import LinkLost, PortBusy, PortError, UnknownOutstanding
    from idemlink.protocol.device_core import PersistError
    from idemlink.protocol.outcome import LocalProtocolError, Status

    for exc in (PortError("cannot open x"), PortBusy("port busy: x")):
        assert exc.status is None and exc.action is None
        assert not isinstance(exc, LocalProtocolError)
    assert LinkLost("the port failed").status is Status.LINK_LOST
    assert UnknownOutstanding("blocked").status is None
    persist = PersistError("disk full")
    assert persist.status is None and not isinstance(persist, LocalProtocolError)
    dev = Device(SimTransport())
    with pytest.raises(LocalProtocolError, match="not connected") as not_connected:
        dev.read("threshold")
    assert not_connected.value.status is None
