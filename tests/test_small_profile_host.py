"""The host adapts to what a small-profile device says in HELLO_REPLY (issue 24, item 1).

What a small profile changes and where the host learns it: the replay slots K (``replay_slots``,
``max_inflight``: the host pipelines no more), FILE_RECEIVE / FILE_INFO left out (the device
answers exception 01 at once: REJECTED ILLEGAL_FUNCTION, no timeout), and a device's
``max_payload`` (a larger request is never sent: NOT_EXECUTED). Against the posix C device built
with ``IDL_OPTS='-DIDL_REPLAY_SLOTS=2u -DIDL_FILE_RECEIVE=0 -DIDL_FILE_INFO=0'``, and, for
``max_payload`` (the C device's is the contract's 512, not an option), the Python device session
advertising less.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import firmware
from support.timing import read_line, scaled

from idemlink.host.device import Device
from idemlink.protocol import device_session
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.host_session import Completion, HostSession
from idemlink.protocol.modbus import ExceptionResponse, encode_response
from idemlink.protocol.outcome import ModbusException, Outcome

SMALL = "IDL_OPTS=-DIDL_REPLAY_SLOTS=2u -DIDL_FILE_RECEIVE=0 -DIDL_FILE_INFO=0"


@pytest.fixture(scope="session")
def small_device(tmp_path_factory: pytest.TempPathFactory) -> Path:
    firmware.need()
    build = tmp_path_factory.mktemp("small") / "build"
    firmware.make("device", f"BUILD={build}", SMALL)
    return build / "posix" / "idemlink-device"


def test_the_host_adapts_to_a_small_profile_c_device(small_device: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen([str(small_device), "--flash-dir", str(tmp_path / "flash")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        path = read_line(proc.stdout, proc)
        (tmp_path / "a.bin").write_bytes(b"x" * 100)
        with Device.open(path, timeout=scaled(0.5)) as dev:
            assert dev.info is not None
            assert (dev.info.replay_slots, dev.info.max_inflight) == (2, 2)
            assert dev.session.max_inflight == 2  # it asked for more; the device said 2
            # pipelined reads: never more than 2 outstanding, so none is ever evicted
            results = dev.run([dev.read_command("threshold") for _ in range(12)])
            assert all(r.ok for r in results), [r.describe() for r in results]
            info = dev.file_info("a.bin")
            assert (info.outcome, info.exception) == (Outcome.REJECTED,
                                                     ModbusException.ILLEGAL_FUNCTION)
            sent, report = dev.send_files([str(tmp_path / "a.bin")])
            assert report is None and sent.answered
            assert (sent.outcome, sent.exception) == (Outcome.REJECTED,
                                                     ModbusException.ILLEGAL_FUNCTION)
            assert "does not serve file transfer" in sent.describe()
            assert dev.read("threshold").ok  # the session goes on
    finally:
        proc.terminate()
        proc.communicate(timeout=scaled(10))


def test_a_request_larger_than_the_devices_max_payload_is_never_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_session, "MAX_PAYLOAD", 16)
    ran: list[bytes] = []

    def execute(pdu: bytes, now: float, seq: int) -> bytes:
        ran.append(pdu)
        return encode_response(ExceptionResponse(pdu[0], ModbusException.ILLEGAL_FUNCTION))

    dev = DeviceSession(execute, 0x1234, contract_hash=contract_hash())
    host = HostSession(contract_hash=contract_hash(), timeout=1.0, attempts=2, max_inflight=4)
    host.open(0.0)
    dev.receive_data(host.data_to_send(), 0.0)
    host.receive_data(dev.data_to_send(), 0.0)
    assert host.info is not None and host.info.max_payload == 16
    big, small = bytes([0x41]) + bytes(16), bytes([0x41]) + bytes(15)
    host.submit(big, 0.0, set_only=False, tag="big")
    host.submit(small, 0.0, set_only=False, tag="small")
    dev.receive_data(host.data_to_send(), 0.0)
    host.receive_data(dev.data_to_send(), 0.0)
    done = {e.tag: e for e in iter(host.next_event, None) if isinstance(e, Completion)}
    assert ran == [small]  # the 17-byte one never left the host
    assert done["big"].outcome is Outcome.NOT_EXECUTED and "at most 16" in done["big"].detail
    assert done["small"].outcome is Outcome.REJECTED
