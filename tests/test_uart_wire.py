"""The character format on a wire (``idemlink.protocol.uart_line``, ``idemlink.device_sim.
uart_wire``): characters framed bit by bit at the sender's format and sampled at the receiver's,
so "an 8E1 server is reached with ``--parity E`` and not without" is shown, not assumed.

The bit model is checked against hand-drawn frames and known receiver behaviour; the wire then
carries the third-party boiler (pymodbus's serial server at 8E1, on the wire's pty) to
``idemlink read --modbus-rtu`` on the wire's RFC 2217 end, where the host's own format is what
idemlink asked pyserial for. Ground truth: the wire's log of what each end sent and received,
and the boiler's own count of requests executed.
"""

from __future__ import annotations

import json
import os
import termios
from collections.abc import Iterator

import pytest
from support.boiler import MAP, Boiler
from support.timing import scaled

from idemlink.cli import main
from idemlink.device_sim.pty import open_pty
from idemlink.device_sim.uart_wire import TO_DEVICE, TO_HOST, UartWire, pty_format
from idemlink.protocol.char_format import CharFormat
from idemlink.protocol.uart_line import (
    UNITS_PER_BIT,
    UartReceiver,
    char_levels,
    idle_levels,
    line_levels,
    transfer,
)

F = CharFormat.parse
FRAME = bytes.fromhex("01030000000ac5cd")  # read 10 holding registers from 0, unit 1


def bits(levels: bytes) -> str:
    return "".join(str(levels[i]) for i in range(0, len(levels), UNITS_PER_BIT))


@pytest.mark.parametrize(("value", "fmt", "drawn"), [
    (0x01, "8N1", "0" "10000000" "1"),
    (0x01, "8E1", "0" "10000000" "1" "1"),      # one 1: the even parity bit makes two
    (0x03, "8E1", "0" "11000000" "0" "1"),
    (0x03, "8O2", "0" "11000000" "1" "11"),
    (0x41, "7E1", "0" "1000001" "0" "1"),
    (0x00, "8M1", "0" "00000000" "1" "1"),
    (0xFF, "8S1", "0" "11111111" "0" "1"),
])
def test_a_character_is_start_data_lsb_first_parity_stop(value: int, fmt: str,
                                                         drawn: str) -> None:
    assert bits(char_levels(value, F(fmt))) == drawn


def test_one_and_a_half_stop_bits_are_six_quarter_bits() -> None:
    assert char_levels(0x1F, F("5N1.5")).endswith(b"\x01" * 6)
    assert len(char_levels(0x1F, F("5N1.5"))) == (1 + 5) * UNITS_PER_BIT + 6


@pytest.mark.parametrize("fmt", ["8N1", "8E1", "8O1", "8N2", "7E1", "7O2", "5N1.5", "8M1", "8S1"])
def test_the_same_format_at_both_ends_carries_every_byte(fmt: str) -> None:
    data = bytes(range(256)) if fmt[0] == "8" else bytes(range(1 << int(fmt[0])))
    got = transfer(data, F(fmt), UartReceiver(F(fmt)))
    assert bytes(c.value for c in got) == data and all(c.ok for c in got)


def test_a_character_cut_between_feeds_completes_on_the_next() -> None:
    rx = UartReceiver(F("8E1"))
    levels = line_levels(FRAME, F("8E1")) + idle_levels(12)
    got = []
    for i in range(0, len(levels), 7):
        rx.receive_data(levels[i:i + 7])
        while (c := rx.next_event()) is not None:
            got.append(c)
    assert bytes(c.value for c in got) == FRAME and all(c.ok for c in got)


def test_a_short_low_glitch_receives_nothing() -> None:
    rx = UartReceiver(F("8N1"))
    rx.receive_data(b"\x01\x00\x00\x01" + idle_levels(20))
    assert rx.next_event() is None


def test_8n1_sent_to_an_8e1_receiver_errs_on_every_character_but_the_last() -> None:
    """Back to back, the 8E1 receiver samples the sender's stop bit as parity and the next start
    bit as its stop bit (a framing error, on which a 16550 re-synchronises): the data survive, every
    character but the last is flagged, and a device that discards flagged characters (as
    Modbus RTU requires) gets almost nothing."""
    got = transfer(FRAME, F("8N1"), UartReceiver(F("8E1")))
    assert bytes(c.value for c in got) == FRAME
    assert [c.framing_error for c in got] == [True] * 7 + [False]
    assert bytes(c.value for c in got if c.ok) in (b"", FRAME[-1:])


def test_8e1_sent_to_an_8n1_receiver_is_garbled_where_a_parity_bit_is_0() -> None:
    """The 8N1 receiver samples the parity bit as its stop bit: a 0 there is a framing error,
    taken for the next start bit, and the characters after it come out shifted."""
    got = transfer(FRAME, F("8E1"), UartReceiver(F("8N1")))
    assert bytes(c.value for c in got) != FRAME
    assert got[0].value == FRAME[0] and got[0].ok  # 0x01: parity 1, read as a stop bit
    assert got[2].framing_error  # 0x00: parity 0


def test_a_pty_keeps_only_the_odd_parity_flag_and_the_stop_bits() -> None:
    """Why the host's end is RFC 2217: Linux clears a pty's parity enable and data bits (a
    program's 8E1 and 8N1 look alike through it); the odd flag and stop bits are kept, and the
    wire's pty end reads them at every burst."""
    import serial

    pair = open_pty()
    try:
        port = serial.Serial(pair.slave_path, 9600, bytesize=7, parity="O", stopbits=2)
        cflag = termios.tcgetattr(pair.master_fd)[2]
        assert not cflag & termios.PARENB and cflag & termios.CSIZE == termios.CS8
        assert pty_format(pair.master_fd, F("7E1")) == F("7O2")
        port.parity, port.stopbits = "E", 1
        assert pty_format(pair.master_fd, F("7E1")) == F("7E1")
        port.close()
    finally:
        pair.close()


# ------------------------------------------------------------------------ through the wire

@pytest.fixture
def wire_8e1(tmp_path: os.PathLike[str]) -> Iterator[tuple[UartWire, Boiler]]:
    pytest.importorskip("pymodbus")
    wire = UartWire(F("8E1")).start()  # the boiler's UART: 8E1
    boiler = Boiler(wire.device_path)  # pymodbus above it (a pty takes no parity: 8N1)
    yield wire, boiler
    boiler.close()
    wire.close()


def read_setpoint(wire: UartWire, tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str],
                  *parity: str) -> tuple[int, str, str]:
    regmap = os.path.join(tmp_path, "acme-boiler.toml")
    with open(regmap, "w", encoding="utf-8") as f:
        f.write(MAP)
    rc = main(["read", "setpoint", "--port", wire.url, "--modbus-rtu", "--regmap", regmap,
               "--timeout", f"{scaled(0.3):.3f}", "--attempts", "2", "--json", *parity])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_an_8e1_server_is_reached_with_parity_e_and_not_with_n(
        wire_8e1: tuple[UartWire, Boiler], tmp_path: os.PathLike[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    wire, boiler = wire_8e1
    # --parity E, and the --modbus-rtu default (8E1): the boiler answers
    for parity in (("--parity", "E"), ()):
        before = boiler.requests
        rc, out, err = read_setpoint(wire, tmp_path, capsys, *parity)
        assert rc == 0, err
        doc = json.loads(out)
        assert doc["outcome"] == "OK" and doc["registers"][0]["value"] == 45.0
        # the open's probe (the map's first register, an input: FC04) and the read
        assert boiler.requests == before + 2
        assert wire.host_side == F("8E1")
    clean = len(wire.log)
    assert all(b.errors == 0 for b in wire.log)
    # --parity N: every request character but the last is flagged at the boiler's UART and
    # discarded; the boiler executes nothing and idemlink says it got no answer, in one line
    for parity in ("N", "O"):
        before = boiler.requests
        rc, out, err = read_setpoint(wire, tmp_path, capsys, "--parity", parity)
        assert wire.host_side == F(f"8{parity}1")
        assert rc == 1 and err.count("\n") == 1, err
        assert "no Modbus RTU slave answered at unit 1" in err
        assert json.loads(out)["schema"] == "idemlink.error/1"
        assert boiler.requests == before
    mismatched = wire.log[clean:]
    assert mismatched and all(b.direction == TO_DEVICE for b in mismatched)
    assert all(b.errors >= len(b.sent) - 1 and len(b.passed) < len(b.sent) for b in mismatched)
    assert not [b for b in wire.log if b.direction == TO_HOST and b.errors]


@pytest.mark.parametrize("device_parity", ["O", "E"])
def test_the_c_device_s_parity_reaches_its_uart(device_bin: os.PathLike[str], device_parity: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The posix C device on the wire's pty with ``--parity O`` or ``E``: the pty keeps the odd
    flag the device set (the enable it clears, so the wire's declaration says "parity on"), and
    only a host of the same parity gets an answer. (N against E cannot be shown through a pty:
    that is the boiler's test above, whose UART is declared.)"""
    import subprocess

    other = {"O": "E", "E": "O"}[device_parity]
    with UartWire(F("8E1")) as wire:
        proc = subprocess.Popen([os.fspath(device_bin), "--modbus-rtu", "--port",
                                 wire.device_path, "--parity", device_parity],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == wire.device_path  # it set its format
            assert wire.device_side == F(f"8{device_parity}1")
            base = ["read", "mode", "--port", wire.url, "--modbus-rtu", "--timeout",
                    f"{scaled(0.3):.3f}", "--attempts", "2"]
            assert main([*base, "--parity", device_parity]) == 0
            assert capsys.readouterr().out.strip() == "mode = auto (1)"
            assert main([*base, "--parity", other]) == 1
            assert "no Modbus RTU slave answered" in capsys.readouterr().err
        finally:
            proc.terminate()
            proc.communicate(timeout=10)
    assert [b.direction for b in wire.log if b.errors] == [TO_DEVICE] * 2  # both tries garbled
