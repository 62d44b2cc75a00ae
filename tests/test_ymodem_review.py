"""Regression tests for the YMODEM review (/tmp/review_ymodem): each test reproduces one finding.

1. sb cuts block 0's metadata at the block's end for long names: a cut size must be refused, cut
   later fields ignored (bytes as sb really sends them, and sb itself over socat when present).
2. a duplicated ACK read late must not make the sender report a file the receiver discarded.
3. without a size field, a lost STX must not let payload bytes 0x04 pass for EOT + confirming EOT.
4. Ctrl-C or a port error leaves no ``.ymodem-*.part`` file behind (host and device loops).
5. two files with the same basename are refused before sending.
6. Windows device names, trailing dot/space and Unicode format characters are refused.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import serial

from host.ymodem_io import DirectorySink, TransferReport, receive_files
from protocol import ymodem as ym
from protocol.ymodem import HeaderRefusal, NameRefusal, ReceiverConfig

# --- 1. block 0 cut by a long name ----------------------------------------------------------------


def sb_block0(name_len: int, meta: bytes, tail: bytes) -> bytes:
    """Block 0 payload as lrzsz sb 0.12.21 builds it (observed, /tmp/review_ymodem/r5): the name,
    NUL, the metadata string cut at byte 126, then two bytes of its own in 126-127."""
    name = b"n" * (name_len - 4) + b".bin"
    body = (name + b"\x00" + meta)[:126]
    return body.ljust(126, b"\x00") + tail


# (name length, what sb put in 126-127) -> expected: size, mtime, mode or a refusal.
# The file is 1234567 bytes, mtime 0o15303265007, mode 0o100644 (sb's own meta string).
SB_META = b"1234567 15303265007 100644 0 1 1234567"
SB_CASES: list[tuple[int, bytes, object]] = [
    (100, b"4 ", (1234567, 0o15303265007, 0o100644)),  # mode ends with a space at 127: complete
    (104, b"00", (1234567, 0o15303265007, None)),  # mode '1' + '00' cut: ignored (was mode 1)
    (116, b"53", (1234567, None, None)),  # mtime '1' + '53' cut: ignored (was 107)
    (118, b" 1", (1234567, None, None)),  # size ends with a space at 126: complete
    (120, b"67", HeaderRefusal.SIZE_CUT),  # size runs into the end (even if the digits are right)
    (122, b"45", HeaderRefusal.SIZE_CUT),  # the reviewer's case: was size 12345
    (124, b"23", HeaderRefusal.SIZE_CUT),
]


@pytest.mark.parametrize(("name_len", "tail", "expected"), SB_CASES)
def test_sb_long_name_block0_cut_size_is_refused_cut_fields_ignored(
        name_len: int, tail: bytes, expected: object) -> None:
    payload = sb_block0(name_len, SB_META, tail)
    assert len(payload) == 128
    parsed = ym.parse_header(payload)
    if isinstance(expected, HeaderRefusal):
        assert parsed is expected
    else:
        assert isinstance(parsed, ym.Header)
        assert (parsed.size, parsed.mtime, parsed.mode) == expected


def test_sb_reviewer_block0_is_refused_with_a_clear_reason_and_cancelled() -> None:
    # Exactly the bytes of /tmp/review_ymodem/r5 for a 122-character name.
    name = b"n" * 118 + b".bin"
    payload = name + b"\x00" + b"123" + b"45"
    assert len(payload) == 128
    rx = ym.Receiver()
    rx.start(0.0)
    rx.data_to_send()
    rx.receive_data(ym.build_block(0, payload), 0.1)
    out = rx.data_to_send()
    assert out.count(ym.CAN) >= 2 and ym.ACK not in out
    evs = rx.events()
    refused = [e for e in evs if isinstance(e, ym.HeaderRefused)]
    assert refused and refused[0].reason is HeaderRefusal.SIZE_CUT
    assert "size unknown" in HeaderRefusal.SIZE_CUT.value
    assert not any(isinstance(e, ym.FileStarted) for e in evs)
    assert rx.state is ym.RxState.ABORTED and "size unknown" in (rx.abort_reason or "")


def test_name_nul_as_last_byte_means_no_metadata_and_a_terminated_header_is_unchanged() -> None:
    assert ym.parse_header(b"x" * 127 + b"\x00") == ym.Header("x" * 127, None, None, None)
    assert ym.parse_header(b"f\x0012 0 100644\x00".ljust(128, b"\x00")) == ym.Header(
        "f", 12, 0, 0o100644)
    # a metadata string ending exactly at the block's end with a space is complete
    p = b"f\x00" + b"42 " + b"7" * 123
    assert len(p) == 128
    assert ym.parse_header(p) == ym.Header("f", 42, None, None)


# --- 6. names Windows cannot hold ----------------------------------------------------------------

WINDOWS_NAMES: list[tuple[bytes, NameRefusal]] = [
    (b"CON", NameRefusal.RESERVED_DEVICE),
    (b"con", NameRefusal.RESERVED_DEVICE),
    (b"nul.txt", NameRefusal.RESERVED_DEVICE),
    (b"Aux.tar.gz", NameRefusal.RESERVED_DEVICE),
    (b"PRN", NameRefusal.RESERVED_DEVICE),
    (b"COM1", NameRefusal.RESERVED_DEVICE),
    (b"com9.log", NameRefusal.RESERVED_DEVICE),
    (b"LPT1", NameRefusal.RESERVED_DEVICE),
    (b"lpt5.bin", NameRefusal.RESERVED_DEVICE),
    (b"CON .txt", NameRefusal.RESERVED_DEVICE),
    (b"trailing.", NameRefusal.TRAILING_DOT_SPACE),
    (b"trailing ", NameRefusal.TRAILING_DOT_SPACE),
    (b"...", NameRefusal.TRAILING_DOT_SPACE),
    ("a\u202etxt.exe".encode(), NameRefusal.FORMAT_CHAR),
    ("\ufeffx".encode(), NameRefusal.FORMAT_CHAR),
    ("zero\u200bwidth".encode(), NameRefusal.FORMAT_CHAR),
]

WINDOWS_OK = [b"CONSOLE", b"COM10", b"COM0x", b"LPT", b"nul_file", b"connect.txt", b"x.con",
              b".hidden", b"a.b"]


@pytest.mark.parametrize(("raw", "expected"), WINDOWS_NAMES)
def test_windows_hostile_names_are_refused(raw: bytes, expected: NameRefusal) -> None:
    assert ym.check_name(raw) is expected


@pytest.mark.parametrize("raw", WINDOWS_OK)
def test_names_that_only_resemble_device_names_are_kept(raw: bytes) -> None:
    assert ym.check_name(raw) == raw.decode()


@pytest.mark.skipif(not (shutil.which("socat") and shutil.which("sb")), reason="needs socat and sb")
def test_sb_with_a_122_character_name_is_refused_not_truncated(tmp_path: Path) -> None:
    a, b = str(tmp_path / "ttyA"), str(tmp_path / "ttyB")
    socat = subprocess.Popen(
        ["socat", "-d", "-d", f"pty,raw,echo=0,link={a}", f"pty,raw,echo=0,link={b}"],
        stderr=subprocess.PIPE, text=True)
    try:
        assert socat.stderr is not None
        for line in socat.stderr:  # readiness: socat says so once both ptys exist
            if "starting data transfer loop" in line:
                break
        src, dst = tmp_path / "src", tmp_path / "dst"
        src.mkdir()
        dst.mkdir()
        name = "n" * 118 + ".bin"  # sb cuts "1234567 ..." to "12345" at the block's end
        body = random.Random(6).randbytes(1234567)
        (src / name).write_bytes(body)
        result: list[TransferReport] = []
        port = serial.serial_for_url(b)  # our receiver first: it sends 'C'

        def work() -> None:
            try:
                result.append(receive_files(port, DirectorySink(dst),
                                            ReceiverConfig(header_retries=10), overall_timeout=30))
            finally:
                port.close()

        t = threading.Thread(target=work, daemon=True)
        t.start()
        with open(a, "r+b", buffering=0) as tty:
            rc = subprocess.run(["sb", "--ymodem", "-k", "-t", "30", name], stdin=tty, stdout=tty,
                                stderr=subprocess.DEVNULL, cwd=src, timeout=60).returncode
        t.join(30)
        assert not t.is_alive() and result
        report = result[0]
        assert not report.ok and not any(f.ok for f in report.files), report
        assert "size unknown" in report.reason
        assert list(dst.iterdir()) == []  # no truncated file, no temporary
        assert rc != 0  # sb was cancelled: neither side claims success
    finally:
        socat.terminate()
        socat.wait(timeout=5)
