"""YMODEM at its edges: what real senders put in block 0, late and lost control bytes, and names.

1. sb cuts block 0's metadata at the block's end for long names: a cut size must be refused, cut
   later fields ignored (bytes as sb really sends them, and sb itself over socat when present).
2. a duplicated ACK read late must not make the sender report a file the receiver discarded.
3. without a size field, a lost STX must not let payload bytes 0x04 pass for EOT + confirming EOT.
4. Ctrl-C or a port error leaves no ``.ymodem-*.part`` file behind (host and device loops).
5. two files with the same basename are refused before sending.
6. Windows device names, trailing dot/space and Unicode format characters are refused.
7. a 'C' proves a commit only after a proven ACK (an empty file's header ACK read twice, a peer
   answering ACK then NAK to every EOT).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import serial
from support.ymodem import Pair, files_of

from idemlink.host.ymodem_io import receive_files
from idemlink.protocol.ymodem_events import (
    Aborted,
    BatchEnded,
    FileCommitted,
    FileData,
    FileStarted,
    FileUnconfirmed,
    HeaderRefused,
    drain_events,
)
from idemlink.protocol.ymodem_files import DirectorySink, TransferReport
from idemlink.protocol.ymodem_names import NameRefusal, check_name
from idemlink.protocol.ymodem_receiver import Receiver, ReceiverConfig
from idemlink.protocol.ymodem_sender import Sender, SenderConfig, SendFile
from idemlink.protocol.ymodem_tables import RxState, TxState
from idemlink.protocol.ymodem_wire import (
    ACK,
    BLOCK_SMALL,
    CAN,
    CRC_REQUEST,
    EOT,
    NAK,
    SOH,
    STX,
    Header,
    HeaderRefusal,
    build_block,
    build_header,
    parse_header,
)

# --- 1. block 0 cut by a long name ----------------------------------------------------------------


def sb_block0(name_len: int, meta: bytes, tail: bytes) -> bytes:
    """Block 0 payload as lrzsz sb 0.12.21 builds it (observed on the wire): the name,
    NUL, the metadata string cut at byte 126, then two bytes of its own in 126-127."""
    name = b"n" * (name_len - 4) + b".bin"
    body = (name + b"\x00" + meta)[:126]
    return body.ljust(126, b"\x00") + tail


class ScriptedPort:
    """A pyserial-like port that plays a receiver from a script: the first answer is waiting at
    once, and each write of the sender releases the next one."""

    timeout: float | None = 0.0

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = list(answers)
        self.pending = bytearray(self.answers.pop(0))

    @property
    def in_waiting(self) -> int:
        return len(self.pending)

    def read(self, size: int = 1) -> bytes:
        out = bytes(self.pending[:size])
        del self.pending[:size]
        return out

    def write(self, data: bytes, /) -> int:
        if self.answers:
            self.pending += self.answers.pop(0)
        return len(data)


# (name length, what sb put in 126-127) -> expected: size, mtime, mode or a refusal.
# The file is 1234567 bytes, mtime 0o15303265007, mode 0o100644 (sb's own meta string).
SB_META = b"1234567 15303265007 100644 0 1 1234567"
SB_CASES: list[tuple[int, bytes, object]] = [
    (100, b"4 ", (1234567, 0o15303265007, 0o100644)),  # mode ends with a space at 127: complete
    (104, b"00", (1234567, 0o15303265007, None)),  # mode '1' + '00' cut: ignored (was mode 1)
    (116, b"53", (1234567, None, None)),  # mtime '1' + '53' cut: ignored (was 107)
    (118, b" 1", (1234567, None, None)),  # size ends with a space at 126: complete
    (120, b"67", HeaderRefusal.SIZE_CUT),  # size runs into the end (even if the digits are right)
    (122, b"45", HeaderRefusal.SIZE_CUT),  # sb's real bytes for a 122-character name: was 12345
    (124, b"23", HeaderRefusal.SIZE_CUT),
]


@pytest.mark.parametrize(("name_len", "tail", "expected"), SB_CASES)

def test_sb_long_name_block0_cut_size_is_refused_cut_fields_ignored(
        name_len: int, tail: bytes, expected: object) -> None:
    payload = sb_block0(name_len, SB_META, tail)
    assert len(payload) == 128
    parsed = parse_header(payload)
    if isinstance(expected, HeaderRefusal):
        assert parsed is expected
    else:
        assert isinstance(parsed, Header)
        assert (parsed.size, parsed.mtime, parsed.mode) == expected


def test_sb_block0_of_a_122_character_name_is_refused_with_a_clear_reason_and_cancelled() -> None:
    # Exactly the bytes sb sends for a 122-character name.
    name = b"n" * 118 + b".bin"
    payload = name + b"\x00" + b"123" + b"45"
    assert len(payload) == 128
    rx = Receiver()
    rx.start(0.0)
    rx.data_to_send()
    rx.receive_data(build_block(0, payload), 0.1)
    out = rx.data_to_send()
    assert out.count(CAN) >= 2 and ACK not in out
    evs = drain_events(rx)
    refused = [e for e in evs if isinstance(e, HeaderRefused)]
    assert refused and refused[0].reason is HeaderRefusal.SIZE_CUT
    assert "size unknown" in HeaderRefusal.SIZE_CUT.value
    assert not any(isinstance(e, FileStarted) for e in evs)
    assert rx.state is RxState.ABORTED and "size unknown" in (rx.abort_reason or "")


def sz_block0(name_len: int, size: int, mtime: int = 0o15316470153) -> bytes:
    """Block 0 exactly as lrzsz's wctxpn() builds it (sz.c): name, NUL, sprintf'd metadata
    "size mtime mode 0 files left bytes left" cut at 128, and, when byte 125 is NUL, the block
    count in 126-127 ("a little goodie for IMP/KMD"). Checked against sb's real bytes for names
    of 119..127 characters (dumped from sb 0.12.21)."""
    name = b"n" * (name_len - 4) + b".bin"
    meta = f"{size} {mtime:o} 100644 0 1 {size}".encode()
    buf = bytearray((name + b"\x00" + meta).ljust(1024, b"\x00"))
    if not buf[125]:
        buf[127] = ((size + 127) >> 7) & 0xFF
        buf[126] = ((size + 127) >> 15) & 0xFF
    return bytes(buf[:128])


# name length -> what the header must give (size, or a refusal): sb's real tails for 5000 bytes
# were "5000 153", "5000 15", "5000 1", "5000 ", "5000", "500", NUL '(', "5", "" (name + NUL).
SB_LONG_NAMES: list[tuple[int, int | HeaderRefusal]] = [
    (119, 5000), (120, 5000), (121, 5000), (122, 5000),  # the size ends inside the block
    (123, HeaderRefusal.SIZE_CUT), (124, HeaderRefusal.SIZE_CUT),  # the size runs into the end
    (125, HeaderRefusal.SIZE_CUT),  # metadata overwritten by the block count: was size unknown
    (126, HeaderRefusal.SIZE_CUT),
    (127, HeaderRefusal.SIZE_CUT),  # the NUL is the last byte, no room at all: was size unknown
]


def test_sz_block0_model_matches_sbs_real_bytes() -> None:
    real_tails = {119: b"\x005000 153", 120: b"\x005000 15", 121: b"\x005000 1",
                  122: b"\x005000 ", 123: b"\x005000", 124: b"\x00500", 125: b"\x00\x00(",
                  126: b"\x005", 127: b"\x00"}
    for n, tail in real_tails.items():
        assert sz_block0(n, 5000)[n:] == tail, n


@pytest.mark.parametrize(("name_len", "expected"), SB_LONG_NAMES)
def test_sb_names_of_119_to_127_characters_never_lose_the_size(
        name_len: int, expected: int | HeaderRefusal) -> None:
    parsed = parse_header(sz_block0(name_len, 5000))
    if isinstance(expected, HeaderRefusal):
        assert parsed is expected
    else:
        assert isinstance(parsed, Header) and parsed.size == expected


def test_a_name_only_header_must_leave_room_and_nothing_else_in_the_metadata() -> None:
    # room for "0" and its end, all NUL: a legal name-only header (bootloaders send these)
    assert parse_header(b"x" * 123 + b"\x00" * 5) == Header("x" * 123, None, None, None)
    # no room: the NUL at 125 (126-127 then belong to sz's count), 126 or 127
    for n in (125, 126, 127):
        assert parse_header(b"x" * n + b"\x00" * (128 - n)) is HeaderRefusal.SIZE_CUT, n
    # an empty first field with other bytes after it is not "no metadata"
    assert parse_header(b"f\x00\x00123 0".ljust(128, b"\x00")) is HeaderRefusal.SIZE_CUT
    # sz's block count behind a short name-only header is not metadata
    assert parse_header(b"f\x00".ljust(126, b"\x00") + b"\x00(") == Header(
        "f", None, None, None)
    # a 1K block 0 with a long name and its full metadata is read as before
    body = b"n" * 200 + b"\x001234567 15316470153 100644\x00"
    assert parse_header(body.ljust(1024, b"\x00")) == Header(
        "n" * 200, 1234567, 0o15316470153, 0o100644)


def test_a_terminated_header_is_unchanged() -> None:
    assert parse_header(b"f\x0012 0 100644\x00".ljust(128, b"\x00")) == Header(
        "f", 12, 0, 0o100644)
    # a metadata string ending exactly at the block's end with a space is complete
    p = b"f\x00" + b"42 " + b"7" * 123
    assert len(p) == 128
    assert parse_header(p) == Header("f", 42, None, None)


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
    assert check_name(raw) is expected


@pytest.mark.parametrize("raw", WINDOWS_OK)
def test_names_that_only_resemble_device_names_are_kept(raw: bytes) -> None:
    assert check_name(raw) == raw.decode()


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


# --- 2. a duplicated ACK read late must not make the sender claim a file --------------------------


class DelayedCopyPair(Pair):
    """A pair whose line duplicates one chosen byte, the copy arriving ``copy_delay`` s later (in
    its own read when the pair delivers byte by byte or the delay exceeds the turnaround)."""

    copy_delay = 0.0
    dup_when: Callable[[str, int], bool] = staticmethod(lambda d, b: False)
    drop_when: Callable[[str, int], bool] = staticmethod(lambda d, b: False)

    def _put(self, direction: str, data: bytes) -> None:
        if data:
            self.chunks[direction].append(data)
        t = max(self.now, self.busy[direction])
        for b in data:
            t += self.byte_time
            self.sent[direction].append(b)
            if self.drop_when(direction, b):
                continue
            self.lines[direction].append((t + self.latency, b))
            if self.dup_when(direction, b):
                self.lines[direction].append((t + self.latency + self.copy_delay, b))
        self.lines[direction].sort(key=lambda x: x[0])
        self.busy[direction] = t


@pytest.mark.parametrize(("turnaround", "copy_delay", "byte_by_byte"),
                         [(0.0, 0.0, True), (0.002, 0.005, False), (0.002, 0.001, False)],
                         ids=["turnaround-0-own-read", "copy-after-turnaround", "copy-inside"])
def test_a_late_duplicate_ack_never_makes_the_sender_report_a_discarded_file(
        turnaround: float, copy_delay: float, byte_by_byte: bool) -> None:
    data = random.Random(1).randbytes(5000)
    p = DelayedCopyPair(Sender(files_of({"fw.bin": data}), SenderConfig(turnaround=turnaround)),
                        Receiver(), byte_by_byte=byte_by_byte)
    p.copy_delay = copy_delay
    acks = [0]

    def dup_when(direction: str, b: int) -> bool:
        if direction == "rx>tx" and b == ACK:
            acks[0] += 1
            return acks[0] == 3  # the ACK of data block 2 comes twice
        return False

    p.dup_when = dup_when
    p.run(until=600)
    got = p.received()
    assert set(p.tx.committed) <= set(got)  # never "delivered" when the receiver discarded it
    assert got == {"fw.bin": data}  # and the NAK in WAIT_NEXT_C resends EOT: the batch completes
    assert p.tx.state is TxState.DONE and p.rx.state is RxState.DONE


def _sender_after_eot_ack() -> Sender:
    tx = Sender(files_of({"f": b"abc"}), SenderConfig(turnaround=0))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 0.1)
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.2)
    tx.receive_data(bytes([ACK]), 0.3)
    assert tx.data_to_send()[-1] == EOT
    tx.receive_data(bytes([ACK]), 0.4)
    assert tx.state is TxState.WAIT_NEXT_C
    return tx


def test_nak_after_the_eot_ack_resends_eot_and_nothing_is_reported_yet() -> None:
    tx = _sender_after_eot_ack()
    assert not any(isinstance(e, FileCommitted) for e in drain_events(tx))
    tx.receive_data(bytes([NAK]), 0.5)
    assert tx.data_to_send() == bytes([EOT]) and tx.state is TxState.SENT_EOT2
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.6)
    assert [e for e in drain_events(tx) if isinstance(e, FileCommitted)] == [FileCommitted("f", 3)]
    assert tx.committed == ["f"] and tx.state.value == "SENT_END"


def test_abort_before_the_next_c_reports_the_file_unconfirmed_not_ok() -> None:
    tx = _sender_after_eot_ack()
    tx.receive_data(bytes([CAN, CAN]), 0.5)
    evs = drain_events(tx)
    assert tx.committed == [] and tx.unconfirmed == ["f"]
    assert FileUnconfirmed("f", 3) in evs and not any(isinstance(e, FileCommitted) for e in evs)


def test_shell_reports_an_unconfirmed_file_as_not_ok(tmp_path: Path) -> None:
    """The receiver ACKs the EOT and then cancels: the file is reported not ok, 'not confirmed'."""
    from idemlink.host import ymodem_io

    src = tmp_path / "f.bin"
    src.write_bytes(b"abc")

    # plays the receiver: C, ACK C, ACK (block 1), ACK (to EOT) + CAN CAN
    script = ScriptedPort([b"C", b"\x06C", b"\x06", b"\x06\x18\x18"])
    rep = ymodem_io.send_files(script, [src], SenderConfig(turnaround=0), overall_timeout=10)
    assert not rep.ok
    assert [(f.name, f.ok) for f in rep.files] == [("f.bin", False)]
    assert "not confirmed" in rep.files[0].detail


# --- 3. no size field: a lost STX must not end the file early -------------------------------------


def _no_size_blocks() -> tuple[bytes, list[bytes]]:
    data = bytearray(random.Random(0).randbytes(4 * 1024))
    for i, v in enumerate(data):  # keep framing bytes out of the payload except the one we plant
        if v in (SOH, STX, EOT, CAN):
            data[i] = 0x55
    data[3 * 1024 + 10] = EOT  # a payload byte 0x04 early in block 4
    return bytes(data), [build_block(n, bytes(data[(n - 1) * 1024 : n * 1024])) for n in range(1, 5)]


@pytest.mark.parametrize("byte_by_byte", [False, True], ids=["burst", "byte-by-byte"])
def test_without_a_size_a_lost_stx_is_not_taken_for_eot(byte_by_byte: bool) -> None:
    data, blocks = _no_size_blocks()
    rx = Receiver()
    rx.start(0.0)
    now = 0.0
    rx.receive_data(build_block(0, b"fw.bin\x00".ljust(128, b"\x00")), now)  # name only
    evs: list[object] = []

    def feed(chunk: bytes) -> None:
        if byte_by_byte:
            for b in chunk:
                rx.receive_data(bytes([b]), now)
        else:
            rx.receive_data(chunk, now)

    for n, blk in enumerate(blocks, 1):
        now += 0.1
        feed(blk[1:] if n == 4 else blk)  # block 4's STX is lost on the line
    evs += drain_events(rx)
    assert not any(isinstance(e, FileCommitted) for e in evs)
    now += 1.0
    rx.tick(now)  # quiet: the purge ends with a NAK
    assert rx.data_to_send().endswith(bytes([NAK]))
    now += 0.1
    feed(blocks[3])  # the sender resends block 4
    assert rx.data_to_send().endswith(bytes([ACK]))
    for _ in range(2):  # EOT, NAK, EOT: committed with all four blocks
        now += 0.1
        rx.receive_data(bytes([EOT]), now)
    evs += drain_events(rx)
    body = b"".join(e.data for e in evs if isinstance(e, FileData))
    assert [e for e in evs if isinstance(e, FileCommitted)] == [FileCommitted("fw.bin", 4096)]
    assert body == data


def test_an_eot_followed_by_more_bytes_in_one_read_is_noise() -> None:
    rx = Receiver()
    rx.start(0.0)
    rx.receive_data(build_block(0, b"f\x00".ljust(128, b"\x00")), 0.1)
    rx.receive_data(build_block(1, bytes(128)), 0.2)
    rx.data_to_send()
    rx.receive_data(bytes([EOT, 0x42]), 0.3)
    assert rx.data_to_send() == b"" and rx.state is RxState.RECV_DATA
    rx.receive_data(bytes([EOT]), 0.4)  # during the purge: dropped
    assert rx.data_to_send() == b""
    rx.tick(0.4 + rx.config.purge_quiet)
    assert rx.data_to_send() == bytes([NAK])
    assert not any(isinstance(e, FileCommitted) for e in drain_events(rx))


# --- CAN CAN from the sender around a damaged block ----------------------------------------------


def _rx_in_data() -> Receiver:
    rx = Receiver()
    rx.start(0.0)
    _, hdr = build_header("f", 5000, 0, 0o644)
    rx.receive_data(build_block(0, hdr), 0.1)
    rx.receive_data(build_block(1, bytes(1024)), 0.2)
    rx.data_to_send()
    return rx


def test_can_can_while_purging_a_bad_block_is_a_cancel_by_the_sender() -> None:
    rx = _rx_in_data()
    bad = bytearray(build_block(2, bytes(1024)))
    bad[100] ^= 0xFF
    rx.receive_data(bytes(bad), 0.3)
    rx.receive_data(bytes([CAN]) * 10 + bytes([8]) * 10, 0.31)  # lrzsz's cancel
    assert rx.state is RxState.ABORTED and rx.abort_reason == "cancelled by sender"


def test_can_can_ending_a_cut_block_is_a_cancel_by_the_sender() -> None:
    rx = _rx_in_data()
    rx.receive_data(build_block(2, bytes(1024))[:400] + bytes([CAN]) * 10 + bytes([8]) * 10,
                    0.3)
    assert rx.state is RxState.RECV_DATA  # inside a block: payload bytes may be CAN
    rx.tick(0.3 + rx.config.interbyte_timeout)
    assert rx.state.value == "ABORTED" and rx.abort_reason == "cancelled by sender"
    assert NAK not in rx.data_to_send()


def test_can_can_filling_up_a_damaged_block_is_a_cancel_by_the_sender() -> None:
    rx = _rx_in_data()
    rx.receive_data(build_block(2, bytes(1024))[:1010] + bytes([CAN]) * 10 + bytes([8]) * 10,
                    0.3)
    assert rx.state is RxState.ABORTED and rx.abort_reason == "cancelled by sender"


# --- 4. Ctrl-C or a dead port leaves no temporary file --------------------------------------------


class _DyingPort:
    """Delivers a header and one block, then raises ``exc`` from read (Ctrl-C, an unplug)."""

    timeout: float | None = 0.0

    def __init__(self, exc: BaseException) -> None:
        _, hdr = build_header("big.bin", 4096, 0, 0o644)
        self.chunks = [build_block(0, hdr), build_block(1, bytes(1024))]
        self.exc = exc
        self.written = bytearray()

    @property
    def in_waiting(self) -> int:
        return len(self.chunks[0]) if self.chunks else 0

    def read(self, size: int = 1) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        raise self.exc

    def write(self, data: bytes, /) -> int:
        self.written += data
        return len(data)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError(5, "device disconnected")],
                         ids=["ctrl-c", "oserror"])
def test_receive_interrupted_mid_file_leaves_no_temporary_and_no_open_fd(
        tmp_path: Path, exc: BaseException) -> None:
    sink = DirectorySink(tmp_path)
    port = _DyingPort(exc)
    with pytest.raises(type(exc)):
        receive_files(port, sink)
    assert list(tmp_path.iterdir()) == []
    assert sink._fd is None  # the descriptor is closed too
    if isinstance(exc, KeyboardInterrupt):
        assert port.written.count(CAN) >= 2  # and the sender was told


def test_device_receive_loop_with_a_dying_transport_leaves_no_temporary(tmp_path: Path) -> None:
    import time

    from idemlink.device_sim.file_receive import receive_batch

    class Transport:
        def __init__(self) -> None:
            _, hdr = build_header("big.bin", 4096, 0, 0o644)
            self.chunks = [build_block(0, hdr), build_block(1, bytes(1024))]

        def read(self, timeout: float) -> bytes:
            if self.chunks:
                return self.chunks.pop(0)
            raise OSError(5, "pty closed")

        def write(self, data: bytes) -> None:
            pass

    with pytest.raises(OSError):
        receive_batch(tmp_path, Transport(), time.monotonic)
    assert list(tmp_path.iterdir()) == []


# --- 5. two files with one basename ---------------------------------------------------------------


def test_two_files_with_the_same_basename_are_refused_before_sending(tmp_path: Path) -> None:
    from idemlink.host.ymodem_io import send_files

    for sub, body in (("a", b"first"), ("b", b"second")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "x.bin").write_bytes(body)

    class Port:
        timeout: float | None = 0.0
        in_waiting = 0
        written = bytearray()

        def read(self, size: int = 1) -> bytes:
            raise AssertionError("nothing may be read: the batch must not start")

        def write(self, data: bytes, /) -> int:
            self.written += data
            return len(data)

    port = Port()
    with pytest.raises(ValueError, match="same file name twice"):
        send_files(port, [tmp_path / "a" / "x.bin", tmp_path / "b" / "x.bin"])
    assert port.written == b""


def test_cli_send_refuses_the_same_basename_twice(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """In-process (the console script itself is tests/test_cli_entry.py's): the first
    ``idemlink`` on PATH may belong to another Python than the one running the suite."""
    from idemlink.cli import main

    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "x.bin").write_bytes(b"z")
    rc = main(["send", "--plain", "--port", str(tmp_path / "no-such-port"),
               str(tmp_path / "a" / "x.bin"), str(tmp_path / "b" / "x.bin")])
    assert rc != 0
    assert "same file name twice" in capsys.readouterr().err


def test_a_failed_file_is_reported_by_position_in_the_batch() -> None:
    """Results follow the batch by index: each file gets exactly one line, in order."""
    from idemlink.host import ymodem_io

    files = [SendFile.from_bytes("a.bin", b"1"), SendFile.from_bytes("b.bin", b"2")]

    # receiver: takes a.bin completely (the idempotent EOT handshake: EOT, NAK, EOT, ACK 'C' proves
    # its commit), then cancels at b.bin's header
    port = ScriptedPort([b"C", b"\x06C", b"\x06", b"\x15", b"\x06C", b"\x18\x18"])
    rep = ymodem_io._send(port, files, SenderConfig(turnaround=0), None, 10)
    assert [(f.name, f.ok) for f in rep.files] == [("a.bin", True), ("b.bin", False)]


# --- 7. an empty file "confirmed" by the receiver's 'C' for block 1 -------------------------------


@pytest.mark.parametrize("spec", [{"empty.bin": b""}, {"empty.bin": b"", "a.bin": b"x" * 3000}],
                         ids=["A-empty-only", "B-empty-then-a"])
def test_an_empty_file_is_not_confirmed_by_the_receivers_c_for_block_1(
        spec: dict[str, bytes]) -> None:
    """The header's ACK arrives twice (the copy 5 ms late, after the
    turnaround) and the first EOT is lost. The copy was taken for the EOT's ACK, the receiver's
    timeout 'C' (still asking for block 1) for the commit: A reported empty.bin committed while
    the receiver aborted; B reported a.bin committed, the receiver having taken a.bin's header for
    a repeat of empty.bin's."""
    p = DelayedCopyPair(Sender(files_of(spec), SenderConfig()), Receiver())
    p.copy_delay = 0.005
    n = {"ack": 0, "eot": 0}

    def dup_when(direction: str, b: int) -> bool:
        if direction == "rx>tx" and b == ACK:
            n["ack"] += 1
            return n["ack"] == 1  # the header's ACK
        return False

    def drop_when(direction: str, b: int) -> bool:
        if direction == "tx>rx" and b == EOT:
            n["eot"] += 1
            return n["eot"] == 1
        return False

    p.dup_when, p.drop_when = dup_when, drop_when
    p.run(until=600)
    got = p.received()
    assert set(p.tx.committed) <= set(got)  # no file reported delivered that was not
    assert got == spec and p.tx.committed == list(spec)  # and the batch still completes
    assert p.tx.state is TxState.DONE and p.rx.state is RxState.DONE


def _rx_waiting_for_block_1(header: bytes) -> Receiver:
    rx = Receiver()
    rx.start(0.0)
    rx.receive_data(build_block(0, header), 0.1)
    assert rx.data_to_send() == bytes([CRC_REQUEST, ACK, CRC_REQUEST])
    assert rx.state is RxState.WAIT_FIRST_BLOCK
    return rx


def test_only_a_byte_identical_header_is_a_repeat_before_block_1() -> None:
    _, first = build_header("empty.bin", 0, 0, 0o644)
    rx = _rx_waiting_for_block_1(first)
    rx.receive_data(build_block(0, first), 0.2)  # our ACK was lost: the same header again
    assert rx.data_to_send() == bytes([ACK, CRC_REQUEST])
    assert rx.state is RxState.WAIT_FIRST_BLOCK
    for other in (build_header("a.bin", 3000, 0, 0o644)[1],  # the next file's header
                  build_header("empty.bin", 0, 1, 0o644)[1],  # same name, other metadata
                  bytes(BLOCK_SMALL)):  # the end of the batch
        rx = _rx_waiting_for_block_1(first)
        drain_events(rx)
        rx.receive_data(build_block(0, other), 0.2)
        out = rx.data_to_send()
        assert out.count(CAN) >= 2 and ACK not in out
        assert rx.state is RxState.ABORTED
        assert "sender moved on" in (rx.abort_reason or "")
        evs = drain_events(rx)
        assert not any(isinstance(e, (FileCommitted, FileStarted, BatchEnded))
                       for e in evs)


def test_a_c_after_an_empty_files_eot_ack_sends_the_eot_again_before_confirming() -> None:
    tx = Sender(files_of({"empty.bin": b"", "b": b"x"}), SenderConfig(turnaround=0))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 0.1)
    tx.data_to_send()
    tx.receive_data(bytes([ACK]), 0.2)
    tx.receive_data(bytes([CRC_REQUEST]), 0.3)
    assert tx.data_to_send() == bytes([EOT])
    tx.receive_data(bytes([ACK]), 0.4)  # maybe a late copy of the header's ACK
    tx.receive_data(bytes([CRC_REQUEST]), 3.4)  # maybe the receiver asking for block 1
    assert tx.data_to_send() == bytes([EOT]) and tx.state is TxState.SENT_EOT2
    assert not any(isinstance(e, FileCommitted) for e in drain_events(tx))
    tx.receive_data(bytes([ACK]), 3.5)  # a committed receiver ACKs the EOT again...
    tx.receive_data(bytes([CRC_REQUEST]), 3.6)  # ... and asks for the next file: proof
    assert [e for e in drain_events(tx) if isinstance(e, FileCommitted)] == [
        FileCommitted("empty.bin", 0)]
    assert tx.data_to_send()[:3] == bytes([SOH, 0, 0xFF]) and tx.committed == ["empty.bin"]
    # a non-empty file likewise: an ACK to its first EOT proves nothing yet
    tx.receive_data(bytes([ACK]), 3.7)
    tx.receive_data(bytes([CRC_REQUEST]), 3.8)
    tx.data_to_send()
    tx.receive_data(bytes([ACK]), 3.9)
    assert tx.data_to_send() == bytes([EOT])
    tx.receive_data(bytes([ACK]), 4.0)
    tx.receive_data(bytes([CRC_REQUEST]), 4.1)
    assert tx.data_to_send() == bytes([EOT]) and tx.committed == ["empty.bin"]
    tx.receive_data(bytes([ACK]), 4.2)
    tx.receive_data(bytes([CRC_REQUEST]), 4.3)
    assert tx.committed == ["empty.bin", "b"]
    assert tx.data_to_send() == build_block(0, bytes(BLOCK_SMALL))  # the end of the batch


def test_an_ack_then_nak_peer_cannot_keep_the_sender_resending_eot_forever() -> None:
    """Each ACK to the EOT used to reset the retry count, so a peer answering
    every EOT with ACK and then NAK (instead of 'C') was sent EOTs for ever."""
    cfg = SenderConfig(turnaround=0)
    tx = Sender(files_of({"a.bin": b"x" * 100}), cfg)
    now = 0.0
    tx.start(now)
    for answer in (b"C", b"\x06C", b"\x06"):  # header ACKed, 'C', block 1 ACKed -> EOT
        tx.receive_data(answer, now)
    eots = tx.data_to_send().count(EOT)
    while now < 3600 and tx.state is not TxState.ABORTED:
        now += 0.5
        tx.receive_data(bytes([ACK]), now)
        now += 1.0
        tx.receive_data(bytes([NAK]), now)
        tx.tick(now)
        eots += tx.data_to_send().count(EOT)
    assert tx.state is TxState.ABORTED and now < 60
    assert eots == cfg.max_retries + 1  # the first EOT and max_retries resends
    evs = drain_events(tx)
    assert FileUnconfirmed("a.bin", 100) in evs and tx.unconfirmed == ["a.bin"]
    assert not tx.committed and any(isinstance(e, Aborted) and not e.by_peer for e in evs)
