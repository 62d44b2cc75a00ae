"""The serial line's character format (data bits, parity, stop bits): parsed and refused in one
place, the Modbus RTU timing computed from its real length for the master and the server alike,
and passed to the port that is opened (what a pseudo-terminal can show of it, honestly)."""

from __future__ import annotations

import os
import termios
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.rtu import rtu_reply

from idemlink.device_sim.rtu_server import RtuServer
from idemlink.protocol.char_format import (
    IDEMLINK_CHAR_FORMAT,
    MODBUS_CHAR_FORMAT,
    CharFormat,
    CharFormatError,
    parse_parity,
    parse_stopbits,
)
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.modbus_rtu import encode_rtu, rtu_frame_gap, rtu_timing
from idemlink.protocol.outcome import IdemlinkError
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.protocol.rtu_master import RtuMaster

N81 = CharFormat(8, "N", 1)
READ_PDU = bytes.fromhex("0300040001")  # FC03, one register at 4 (threshold)


@pytest.mark.parametrize(("fmt", "bits"), [
    ("8N1", 10), ("8E1", 11), ("8O1", 11), ("8N2", 11), ("7E1", 10), ("7N1", 9), ("8E2", 12),
    ("5N1.5", 7.5),
])
def test_a_character_is_start_data_parity_and_stop_bits(fmt: str, bits: float) -> None:
    parsed = CharFormat.parse(fmt)
    assert parsed.char_bits == bits and str(parsed) == fmt


def test_the_documented_defaults() -> None:
    assert str(IDEMLINK_CHAR_FORMAT) == "8N1" and str(MODBUS_CHAR_FORMAT) == "8E1"
    assert CharFormat() == IDEMLINK_CHAR_FORMAT


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"bytesize": 9}, "data bits are one of 5, 6, 7, 8"),
    ({"parity": "X"}, r"parity .X.: one of N \(none\), E \(even\)"),
    ({"stopbits": 3}, "stop bits are one of 1, 1.5, 2"),
    ({"stopbits": "nan"}, "stop bits are one of 1, 1.5, 2"),
    ({"bytesize": True}, "data bits"),
])
def test_a_bad_field_is_one_typed_line(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(CharFormatError, match=says) as exc:
        CharFormat(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, IdemlinkError)


def test_fields_as_typed_on_a_command_line_or_in_a_profile() -> None:
    assert [parse_parity(p) for p in ("e", "Even", " O ", "none", "S")] == ["E", "E", "O", "N", "S"]
    assert [parse_stopbits(s) for s in ("1", "1.5", 2, 2.0)] == [1, 1.5, 2, 2]
    assert CharFormat(8, "even", "2") == CharFormat.parse("8e2")
    with pytest.raises(CharFormatError, match=r"e\.g\. 8N1"):
        CharFormat.parse("8-E-1")


# ----------------------------------------------------------------- the Modbus RTU timing


def test_t35_and_t15_count_the_real_character_length() -> None:
    """Modbus over serial line 2.5.1.1: 3.5 and 1.5 characters up to 19200 Bd. An 8E1 (or 8N2)
    character is 11 bits, an 8N1 one 10: at 9600 Bd t3.5 is 4.010 ms against 3.646 ms."""
    e81, n81 = rtu_timing(9600, MODBUS_CHAR_FORMAT), rtu_timing(9600, N81)
    assert e81.t35 == pytest.approx(3.5 * 11 / 9600) and e81.t15 == pytest.approx(1.5 * 11 / 9600)
    assert n81.t35 == pytest.approx(3.5 * 10 / 9600) and n81.char_time == pytest.approx(10 / 9600)
    assert rtu_timing(9600, CharFormat.parse("8N2")) == e81
    assert rtu_frame_gap(9600) == e81.t35  # the Modbus default: 8E1
    for fast in (38400, 115200, None):
        t = rtu_timing(fast, N81)
        assert (t.t15, t.t35) == (0.00075, 0.00175)
    with pytest.raises(ValueError, match="positive"):
        rtu_timing(0)


def test_the_rtu_server_cuts_frames_at_the_t35_of_its_character_format() -> None:
    """A good frame 3.8 ms after a damaged one, at 9600 Bd: with 8N1 characters (t3.5 = 3.65 ms)
    that silence is a pause and the good frame is answered; with 8E1 (t3.5 = 4.01 ms) it is not,
    and the good frame goes with the damaged one."""
    read = encode_rtu(1, READ_PDU)
    bad = bytearray(read)
    bad[3] ^= 0xFF
    answers = {}
    for fmt in (N81, MODBUS_CHAR_FORMAT):
        server = RtuServer(DeviceCore(), unit=1, baudrate=9600, char_format=fmt)
        assert server.decoder.frame_gap == rtu_timing(9600, fmt).t35
        frame_time = len(read) * fmt.char_bits / 9600
        assert rtu_reply(server, bytes(bad), 1.0) == b""
        answers[str(fmt)] = rtu_reply(server, read, 1.0 + 0.0038 + frame_time)
    assert answers["8N1"] != b"" and answers["8E1"] == b""


def test_the_rtu_master_waits_by_the_same_timing() -> None:
    """The master's wait for an answer counts the request's and the answer's characters at the
    line's real length, and its silence before the next request is the same t3.5."""
    waits = {}
    for fmt in (N81, MODBUS_CHAR_FORMAT):
        master = RtuMaster(DEFAULT_MAP, baudrate=9600, timeout=0.1, char_format=fmt)
        assert master.timing == rtu_timing(9600, fmt) == master._decoder.timing
        master.submit(READ_PDU, 0.0)
        master.tick(0.0)  # the request leaves on a tick (nothing stale on the line)
        assert master.data_to_send()
        deadline = master.next_deadline()
        assert deadline is not None
        waits[str(fmt)] = deadline - 0.1
    # 8 request bytes + 7 answer bytes, 10 or 11 bits each
    assert waits["8N1"] == pytest.approx(15 * 10 / 9600)
    assert waits["8E1"] == pytest.approx(15 * 11 / 9600)


# ------------------------------------------------------------------- what reaches the port


@pytest.fixture
def pty_path() -> Iterator[str]:
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        yield os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


def test_open_port_sets_the_format_asked_for() -> None:
    """A port that has a character format takes the one asked for (pyserial's port object;
    loop:// stands for any port that is not a pty)."""
    from idemlink.host.transport import open_port

    for fmt in ("8N1", "8E1", "7O2", "8N1.5"):
        f = CharFormat.parse(fmt)
        port = open_port("loop://", baudrate=9600, bytesize=f.bytesize, parity=f.parity,
                         stopbits=f.stopbits)
        try:
            assert (port.bytesize, port.parity, port.stopbits) == (f.bytesize, f.parity, f.stopbits)
        finally:
            port.close()


def test_a_pty_accepts_any_format_and_enforces_none(pty_path: str) -> None:
    """A pseudo-terminal has no parity and no data bits: Linux keeps 8 bits and parity off
    whatever is asked, and a recent kernel refuses (EINVAL) a tcsetattr whose only change is one
    it cannot keep — pyserial let that through as termios.error, so the second 8E1 open of a pty
    was a traceback. The port opens as 8N with the stop bits asked (the kernel keeps CSTOPB):
    that is all a pty can show of a format, and all this test claims."""
    from idemlink.host.transport import is_pty, open_port

    assert is_pty(pty_path) and not is_pty("loop://") and not is_pty("/dev/null")
    cflags = {}
    for fmt in ("8E1", "8E1", "7O2", "8N1", "8E2"):
        f = CharFormat.parse(fmt)
        port = open_port(pty_path, baudrate=9600, bytesize=f.bytesize, parity=f.parity,
                         stopbits=f.stopbits, exclusive=False)
        try:
            assert (port.bytesize, port.parity, port.stopbits) == (8, "N", f.stopbits)
            cflags[fmt] = termios.tcgetattr(port.fileno())[2]
        finally:
            port.close()
    for fmt, cflag in cflags.items():
        assert cflag & termios.CSIZE == termios.CS8 and not cflag & termios.PARENB, fmt
        assert bool(cflag & termios.CSTOPB) == fmt.endswith("2"), fmt


def test_a_bad_format_is_refused_before_the_port_is_touched() -> None:
    from idemlink.host.transport import open_port

    with pytest.raises(CharFormatError, match="parity 'Q'"):
        open_port("/dev/nonexistent-port", parity="Q")


# ------------------------------------------- a peer told the format: an RFC 2217 server


class Rfc2217Slave:
    """An RFC 2217 server — pyserial's own ``PortManager``, a real implementation of the
    protocol's server side — in front of a Modbus RTU slave (``RtuServer``) on a UART set to
    ``uart`` (8E1). The client's ``rfc2217://`` port tells the server the format it was opened
    with; the server sets its port to it (``formats`` records each) — which is all a real server
    can see. What a real UART then does with a sender of another format is the bit-level model
    of ``idemlink.protocol.uart_line``: the client's bytes are framed at the negotiated format
    and sampled at the UART's, a character with a parity or framing error is discarded (as a
    Modbus slave does; ``dropped`` counts them), and the answers are framed at the UART's format
    and sampled at the client's (delivered as sampled, as a tty does)."""

    def __init__(self, uart: str = "8E1") -> None:
        import socket
        import threading

        import serial

        self.uart = CharFormat.parse(uart)
        self.formats: list[str] = []
        self.dropped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"rfc2217://127.0.0.1:{self.listener.getsockname()[1]}"
        self.port = serial.serial_for_url("loop://")  # holds the settings the client asks for
        self.server = RtuServer(DeviceCore(DEFAULT_MAP), unit=1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _negotiated(self) -> CharFormat:
        return CharFormat(self.port.bytesize, self.port.parity, self.port.stopbits)

    def _serve(self) -> None:
        import time

        from serial.rfc2217 import PortManager

        from idemlink.protocol.uart_line import UartReceiver, transfer

        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(0.05)
                manager = PortManager(self.port, _Writer(conn))
                seen: CharFormat | None = None
                while not self.stop.is_set():
                    try:
                        data = conn.recv(4096)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if not data:
                        break
                    line = b"".join(manager.filter(data))
                    fmt = self._negotiated()
                    if fmt != seen:
                        seen = fmt
                        self.formats.append(str(fmt))
                    if not line:
                        continue
                    chars = transfer(line, fmt, UartReceiver(self.uart))
                    kept = bytes(c.value for c in chars if c.ok)
                    self.dropped += len(line) - len(kept)
                    if not kept:
                        continue
                    self.server.receive_data(kept, time.monotonic())
                    answer = bytes(c.value for c in transfer(self.server.data_to_send(),
                                                             self.uart, UartReceiver(fmt)))
                    if answer:
                        try:
                            conn.sendall(b"".join(manager.escape(answer)))
                        except OSError:
                            break

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


class _Writer:
    def __init__(self, conn: object) -> None:
        self.conn = conn

    def write(self, data: bytes) -> None:
        self.conn.sendall(data)  # type: ignore[attr-defined]


@pytest.fixture
def rfc2217_slave() -> Iterator[Rfc2217Slave]:
    slave = Rfc2217Slave("8E1")
    try:
        yield slave
    finally:
        slave.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from idemlink.cli import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


QUICK = ("--timeout", "0.2", "--attempts", "2")


def test_modbus_rtu_speaks_8e1_unless_told_otherwise(rfc2217_slave: Rfc2217Slave,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--modbus-rtu`` opens the line 8E1 (the Modbus default): the server is told so and the
    8E1 slave answers; ``--parity N`` is an 8N1 line the slave cannot read: no slave answered."""
    rc, out, err = _cli(capsys, "read", "--port", rfc2217_slave.url, "--modbus-rtu", "mode", *QUICK)
    assert rc == 0 and out.strip() == "mode = auto (1)", err
    assert rfc2217_slave.formats[-1] == "8E1" and rfc2217_slave.dropped == 0
    rc, out, err = _cli(capsys, "read", "--port", rfc2217_slave.url, "--modbus-rtu",
                        "--parity", "N", "mode", *QUICK)
    assert rc == 1 and "no Modbus RTU slave answered at unit 1" in err, err
    assert rfc2217_slave.formats[-1] == "8N1" and rfc2217_slave.dropped > 0


def test_a_framed_command_speaks_8n1_and_asks_modbus_on_its_own_line(
        rfc2217_slave: Rfc2217Slave, capsys: pytest.CaptureFixture[str]) -> None:
    """A framed command opens 8N1: no idemlink device answers, and the 8E1 slave cannot read
    the question whether a Modbus slave is there (``Device.open`` asks it on the same port), so
    it is "no device" — on a real line as here. Given ``--parity E``, the line is the slave's:
    still no idemlink device, and the hint to add --modbus-rtu."""
    rc, _, err = _cli(capsys, "read", "--port", rfc2217_slave.url, "mode", *QUICK)
    assert rc == 1 and "answers Modbus RTU" not in err, err
    assert rfc2217_slave.formats == ["8N1"] and rfc2217_slave.dropped > 0
    rc, _, err = _cli(capsys, "read", "--port", rfc2217_slave.url, "--parity", "E", "mode", *QUICK)
    assert rc == 1 and "this port answers Modbus RTU, not idemlink: add --modbus-rtu" in err, err
    assert rfc2217_slave.formats[-1] == "8E1"


def test_the_format_from_a_profile_and_the_environment_reaches_the_line(
        rfc2217_slave: Rfc2217Slave, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = tmp_path / "line.toml"
    profile.write_text(f'port = "{rfc2217_slave.url}"\nmodbus_rtu = true\nparity = "O"\n')
    rc, _, err = _cli(capsys, "read", "--profile", str(profile), "mode", *QUICK)
    assert rc == 1 and rfc2217_slave.formats[-1] == "8O1", err
    monkeypatch.setenv("IDEMLINK_PARITY", "even")
    rc, out, err = _cli(capsys, "read", "--profile", str(profile), "mode", *QUICK)
    assert rc == 0 and out.strip() == "mode = auto (1)", err
    assert rfc2217_slave.formats[-1] == "8E1"
