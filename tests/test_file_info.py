"""FILE_INFO (0x45): the framed read-back of a stored file, and ``send_files`` verifying with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.host.command import Command, CommandKind
from idemlink.host.device import Device
from idemlink.protocol.modbus import (
    FileInfoRequest,
    FileInfoResponse,
    FileInfoStatus,
    FunctionCode,
    ModbusPduError,
    decode_file_info_request,
    decode_response,
    encode_file_info_request,
    encode_response,
)
from idemlink.protocol.outcome import ModbusException, Outcome
from idemlink.protocol.ymodem_files import TransferReport
from idemlink.pytest_plugin import start_pty_sim

# CRC-32C check value of the standard "123456789" (RFC 3720 B.4 / the CRC catalogue), so the tests
# do not take the digest from the code under test.
CRC32C_CHECK = 0xE3069283

_name_chars = st.characters(min_codepoint=0x20, blacklist_categories=("Cs", "Cf", "Cc"),
                            blacklist_characters="/\\:")
names = st.text(_name_chars, min_size=1, max_size=40).filter(
    lambda n: n not in (".", "..") and not n.endswith((".", " "))
    and n.split(".", 1)[0].rstrip(" ").upper() not in {"CON", "PRN", "AUX", "NUL"}
    and not any(n.split(".", 1)[0].rstrip(" ").upper().startswith(p) and len(
        n.split(".", 1)[0].rstrip(" ")) == 4 for p in ("COM", "LPT")))


@given(names)
def test_request_round_trip(name: str) -> None:
    pdu = encode_file_info_request(FileInfoRequest(name))
    raw = name.encode()
    assert pdu == bytes([0x45, len(raw)]) + raw
    assert decode_file_info_request(pdu) == FileInfoRequest(name)


@given(st.sampled_from(list(FileInfoStatus)), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1))
def test_answer_round_trip(status: FileInfoStatus, size: int, crc: int) -> None:
    pdu = encode_response(FileInfoResponse(status, size, crc))
    assert pdu == bytes([0x45, status]) + size.to_bytes(4, "big") + crc.to_bytes(4, "big")
    assert decode_response(pdu) == FileInfoResponse(status, size, crc)


@pytest.mark.parametrize("pdu", [
    b"\x45",  # no length
    b"\x45\x00",  # empty name
    b"\x45\x05abc",  # length past the end
    b"\x45\x02abc",  # trailing byte
    b"\x45\x05../ab",  # a path
    b"\x45\x04a/bc",
    b"\x45\x02..",
    b"\x45\x03\xff\xfe\xfd",  # not UTF-8
    b"\x45\x04a\x01bc",  # control character
    b"\x45\x07con.txt",  # a Windows device name
])
def test_bad_requests_are_exception_03(pdu: bytes) -> None:
    with pytest.raises(ModbusPduError) as err:
        decode_file_info_request(pdu)
    assert err.value.exception is ModbusException.ILLEGAL_DATA_VALUE
    dev = SimulatedDevice(seed=1)
    assert dev._execute(pdu, 0.0, 1) == bytes([0xC5, 0x03])


def test_a_refused_name_is_not_sent() -> None:
    with pytest.raises(ValueError, match="refused"):
        encode_file_info_request(FileInfoRequest("../etc/passwd"))


def test_device_answers_present_absent_and_hides_temporaries(tmp_path: Path) -> None:
    dev = SimulatedDevice(seed=1, flash_dir=tmp_path)
    (dev.files_dir / "check.txt").write_bytes(b"123456789")
    (dev.files_dir / ".ymodem-x.part").write_bytes(b"half")
    (dev.files_dir / "empty").write_bytes(b"")

    def ask(name: bytes) -> bytes:
        return dev._execute(bytes([FunctionCode.FILE_INFO, len(name)]) + name, 0.0, 1)

    assert ask(b"check.txt") == bytes.fromhex("45 00 00000009") + CRC32C_CHECK.to_bytes(4, "big")
    assert ask(b"empty") == bytes.fromhex("45 00 00000000 00000000")
    assert ask(b"missing") == bytes.fromhex("45 01 00000000 00000000")
    assert ask(b".ymodem-x.part") == bytes.fromhex("45 01 00000000 00000000")
    assert (dev.files_dir / "check.txt").read_bytes() == b"123456789"  # read-only


def test_file_info_over_the_pty_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import idemlink.host.command as hd
    sim = start_pty_sim(SimulatedDevice(seed=2, flash_dir=tmp_path / "flash"))
    try:
        (sim.device.files_dir / "check.txt").write_bytes(b"123456789")
        with Device.open(sim.path) as dev:
            present = dev.file_info("check.txt")
            assert present.outcome is Outcome.OK
            assert present.file == FileInfoResponse(FileInfoStatus.PRESENT, 9, CRC32C_CHECK)
            absent = dev.file_info("nothing.bin")
            assert absent.file == FileInfoResponse(FileInfoStatus.ABSENT, 0, 0)
            # A name the host refuses to send, sent anyway (no name check on this side): 03.
            monkeypatch.setattr(hd, "encode_file_info_request", lambda r: bytes(
                [0x45, len(r.name)]) + r.name.encode())
            raw = dev.execute(Command(CommandKind.FILE_INFO, 0, name="a\\b"))
            assert raw.outcome is Outcome.REJECTED
            assert raw.exception is ModbusException.ILLEGAL_DATA_VALUE
            assert dev.read("threshold").ok
    finally:
        sim.close()


def _files(tmp: Path) -> list[Path]:
    a = tmp / "image.bin"
    a.write_bytes(bytes(range(256)) * 9 + b"tail")
    b = tmp / "conf.txt"
    b.write_text("threshold=420\n")
    return [a, b]


def test_send_files_verifies_every_file(tmp_path: Path) -> None:
    files = _files(tmp_path)
    sim = start_pty_sim(SimulatedDevice(seed=3, flash_dir=tmp_path / "flash"))
    try:
        with Device.open(sim.path) as dev:
            _, report = dev.send_files([str(f) for f in files])
        assert report is not None
        assert [(f.ok, f.verified) for f in report.files] == [(True, True), (True, True)]
        reads = [e for e in sim.device.executions if e.request[:1] == b"\x45"]
        # asked once before sending (is it there already?) and read back once after
        assert sorted(e.request[2:].decode() for e in reads) == sorted(
            [f.name for f in files] * 2)
    finally:
        sim.close()


def _hand_overs(sim: object) -> int:
    return sum(1 for e in sim.device.executions  # type: ignore[attr-defined]
               if e.request[:1] == b"\x44")


def test_sending_a_file_already_there_sends_nothing(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    files = _files(tmp_path)
    sim = start_pty_sim(SimulatedDevice(seed=4, flash_dir=tmp_path / "flash"))
    try:
        with Device.open(sim.path) as dev:
            dev.send_files([str(files[0])])
        assert _hand_overs(sim) == 1
        # both files: the one already there is skipped, the other is sent
        with Device.open(sim.path) as dev:
            _, report = dev.send_files([str(f) for f in files])
        assert report is not None
        assert [(f.name, f.identical, f.verified) for f in report.files] == [
            ("image.bin", True, True), ("conf.txt", False, True)]
        assert _hand_overs(sim) == 2
        # again, from the CLI: every file identical -> no hand-over at all, exit 0
        from idemlink.cli import main

        assert main(["send", "--port", sim.path, "--no-progress", *map(str, files)]) == 0
        out = capsys.readouterr().out
        assert out.count("already on the device, identical") == 2
        assert _hand_overs(sim) == 2
        # a different file under a known name: refused before the hand-over, hint given
        files[1].write_text("threshold=430\n")
        assert main(["send", "--port", sim.path, "--no-progress", str(files[1])]) == 1
        assert "--overwrite" in capsys.readouterr().err
        assert _hand_overs(sim) == 2
        assert main(["send", "--port", sim.path, "--no-progress", "--overwrite",
                     str(files[1])]) == 0
        assert (sim.device.files_dir / "conf.txt").read_text() == "threshold=430\n"
    finally:
        sim.close()


def test_a_file_the_device_lacks_after_the_batch_is_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """YMODEM says ok, but the device does not have the file when it is read back (a commit that
    never happened looks exactly like this): failed, and the CLI exits 1."""
    import idemlink.host.ymodem_io as yio
    from idemlink.cli import EXIT_LOCAL_ERROR, main

    files = _files(tmp_path)
    flash = tmp_path / "flash"
    sim = start_pty_sim(SimulatedDevice(seed=4, flash_dir=flash))
    real = yio.send_files

    def send_then_lose(*args: object, **kw: object) -> TransferReport:
        report = real(*args, **kw)  # type: ignore[arg-type]
        (flash / "files" / "conf.txt").unlink()
        (flash / "files" / "image.bin").write_bytes(b"other bytes")
        return report

    monkeypatch.setattr(yio, "send_files", send_then_lose)
    try:
        with Device.open(sim.path) as dev:
            _, report = dev.send_files([str(f) for f in files])
        assert report is not None and report.ok  # the YMODEM layer saw nothing wrong
        image, conf = report.files
        assert (image.ok, image.verified) == (False, False)
        assert "different bytes" in image.detail
        assert (conf.ok, conf.verified) == (False, False)
        assert "does not have it" in conf.detail
        for f in files:
            f.write_bytes(f.read_bytes())  # unchanged; the CLI sends them again
        assert main(["send", "--no-progress", "--overwrite", "--port", sim.path,
                     *map(str, files)]) == EXIT_LOCAL_ERROR
    finally:
        sim.close()


def test_an_unconfirmed_file_that_is_there_is_verified(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The other way: YMODEM could not prove the commit, the read-back can."""
    import idemlink.host.ymodem_io as yio
    from idemlink.cli import EXIT_OK, main

    files = _files(tmp_path)
    sim = start_pty_sim(SimulatedDevice(seed=5, flash_dir=tmp_path / "flash"))
    real = yio.send_files

    def unconfirmed(*args: object, **kw: object) -> TransferReport:
        report = real(*args, **kw)  # type: ignore[arg-type]
        for f in report.files:
            f.ok, f.unconfirmed, f.detail = False, True, "not confirmed"
        return report

    monkeypatch.setattr(yio, "send_files", unconfirmed)
    try:
        assert main(["send", "--no-progress", "--port", sim.path, *map(str, files)]) == EXIT_OK
        out = capsys.readouterr().out
        assert "image.bin: ok, 2308 bytes, verified" in out
        assert "conf.txt: ok, 14 bytes, verified" in out
    finally:
        sim.close()


def test_send_through_a_lossy_line_still_verifies(tmp_path: Path) -> None:
    files = _files(tmp_path)
    line = LinkConfig(baud=115200, latency=0.001, loss=0.0003, corrupt=0.0003, seed=7)
    sim = start_pty_sim(SimulatedDevice(seed=6, flash_dir=tmp_path / "flash"), line)
    try:
        with Device.open(sim.path, timeout=0.05, attempts=10) as dev:
            _, report = dev.send_files([str(f) for f in files])
        assert report is not None
        assert [(f.ok, f.verified) for f in report.files] == [(True, True), (True, True)]
        for f in files:
            assert (tmp_path / "flash" / "files" / f.name).read_bytes() == f.read_bytes()
    finally:
        sim.close()


def test_crc_matches_an_independent_crc32c_of_the_local_file(tmp_path: Path) -> None:
    """The host digest and the device digest must be the same function: CRC-32C, not zlib's."""
    sim = start_pty_sim(SimulatedDevice(seed=8, flash_dir=tmp_path / "flash"))
    f = tmp_path / "check.txt"
    f.write_bytes(b"123456789")
    try:
        with Device.open(sim.path) as dev:
            _, report = dev.send_files([str(f)])
            info = dev.file_info("check.txt")
        assert report is not None and report.files[0].verified
        assert info.file is not None and info.file.crc32c == CRC32C_CHECK
    finally:
        sim.close()


# ---- the read-back: dot-files, long names, files too large for the answer ----------------------


def test_a_dot_file_that_arrived_is_verified_not_absent(tmp_path: Path) -> None:
    """Only the receiver's own `.ymodem-*.part` temporaries are hidden; `.env` is a file."""
    env = tmp_path / ".env"
    env.write_bytes(b"KEY=value\n")
    sim = start_pty_sim(SimulatedDevice(seed=4, flash_dir=tmp_path / "flash"))
    try:
        with Device.open(sim.path) as dev:
            _, report = dev.send_files([str(env)])
        assert report is not None
        assert [(f.name, f.ok, f.verified) for f in report.files] == [(".env", True, True)]
    finally:
        sim.close()


def test_a_name_too_long_to_read_back_is_refused_before_the_hand_over(tmp_path: Path) -> None:
    """YMODEM takes names up to 255 bytes, FILE_INFO up to MAX_FILE_INFO_NAME: such a file could
    be stored but never verified, so it is refused before the device is switched."""
    from idemlink.protocol.modbus import MAX_FILE_INFO_NAME

    long_name = tmp_path / ("a" * (MAX_FILE_INFO_NAME + 1))
    long_name.write_bytes(b"x")
    sim = start_pty_sim(SimulatedDevice(seed=5, flash_dir=tmp_path / "flash"))
    try:
        with Device.open(sim.path) as dev:
            with pytest.raises(ValueError, match="read-back"):
                dev.send_files([str(long_name)])
            assert dev.read("threshold").ok  # still framed
        assert not [e for e in sim.device.executions if e.request[:1] == b"\x44"]
    finally:
        sim.close()


def test_a_file_too_large_for_the_answer_is_exception_04_not_a_dead_device(
        tmp_path: Path) -> None:
    """A u32 cannot carry its size: exception 04 (the host says "not verified"), and the device
    lives on (before: struct.error escaped and the serve loop died)."""
    dev = SimulatedDevice(seed=1, flash_dir=tmp_path)
    with (dev.files_dir / "big.bin").open("wb") as f:
        f.truncate(2**32 + 5)  # sparse: nothing is written
    answer = dev._execute(bytes([FunctionCode.FILE_INFO, 7]) + b"big.bin", 0.0, 1)
    assert answer == bytes([FunctionCode.FILE_INFO | 0x80, ModbusException.SERVER_DEVICE_FAILURE])
    (dev.files_dir / "small").write_bytes(b"123456789")
    assert dev._execute(bytes([FunctionCode.FILE_INFO, 5]) + b"small", 0.0, 2)[1] == 0  # present
