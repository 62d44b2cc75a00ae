"""``idemlink sim --modbus-tcp [HOST:]PORT``: the ``--modbus-rtu`` slave served over Modbus TCP
(``idemlink.device_sim.tcp_server``). The connection machine byte by byte; the simulator as a
child process driven by idemlink's ``--modbus-tcp`` commands and read by pymodbus's own TCP
client (a third-party peer that decodes the words with its own converters); bad options refused
in one line."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.boiler import MAP, from_regs
from support.timing import read_line, scaled

from idemlink.cli import main
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.device_sim.tcp_server import TcpConnection, parse_listen_address
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.modbus_tcp import MbapDecoder, TcpAddressError, encode_mbap
from idemlink.protocol.regmap_file import DEFAULT_MAP

READ_THRESHOLD = bytes([0x03, 0x00, 0x04, 0x00, 0x01])  # FC03, address 4, one register


def answers(conn: TcpConnection) -> list[tuple[int, int, bytes]]:
    dec = MbapDecoder()
    dec.receive_data(conn.data_to_send())
    out = []
    while (f := dec.next_event()) is not None:
        out.append((f.tid, f.unit, f.pdu))
    return out


def test_a_connection_answers_under_each_request_s_id_byte_by_byte_and_together() -> None:
    conn = TcpConnection(RtuServer(DeviceCore(DEFAULT_MAP), unit=1))
    for b in encode_mbap(0x1234, 1, READ_THRESHOLD):
        conn.receive_data(bytes([b]), 0.0)
    assert answers(conn) == [(0x1234, 1, bytes([0x03, 0x02, 0x01, 0x5E]))]  # 350
    conn.receive_data(encode_mbap(7, 1, READ_THRESHOLD) + encode_mbap(8, 255, READ_THRESHOLD)
                      + encode_mbap(9, 0, READ_THRESHOLD) + encode_mbap(10, 2, READ_THRESHOLD),
                      0.0)
    assert [(tid, unit) for tid, unit, _ in answers(conn)] == [(7, 1), (8, 255), (9, 0)]
    assert conn.ignored == 1  # unit 2: not this server, no answer


@pytest.mark.parametrize(("text", "want"), [("1502", ("127.0.0.1", 1502)), ("0", ("127.0.0.1", 0)),
                                            ("0.0.0.0:1502", ("0.0.0.0", 1502)),
                                            ("127.0.0.1:0", ("127.0.0.1", 0)),
                                            ("[::1]:0", ("::1", 0)), ("localhost", ("localhost", 502))])
def test_listen_addresses(text: str, want: tuple[str, int]) -> None:
    assert parse_listen_address(text) == want


@pytest.mark.parametrize("bad", ["70000", "host:port", "::1", ":1502"])
def test_bad_listen_addresses_are_typed_errors(bad: str) -> None:
    with pytest.raises(TcpAddressError):
        parse_listen_address(bad)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``idemlink sim --modbus-tcp 127.0.0.1:0`` with the boiler's map: its address, its map."""
    regmap = tmp_path / "acme-boiler.toml"
    regmap.write_text(MAP, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "idemlink", "sim", "--modbus-tcp",
                             "127.0.0.1:0", "--regmap", str(regmap), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(read_line(proc.stdout, proc))
        assert first["mode"] == "modbus-tcp", first
        yield first["port"], regmap
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=scaled(10))
    assert proc.returncode == 0, err


def test_the_simulator_serves_typed_values_over_tcp(sim: tuple[str, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    address, regmap = sim
    tcp = ("--modbus-tcp", address, "--regmap", str(regmap), "--timeout", f"{scaled(0.5):.3f}")
    for value in ("setpoint=-7.5", "energy_limit=123456", "stage=high", "pump=on"):
        assert main(["write", *tcp, value]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["read", *tcp, "setpoint", "control", "energy_limit", "pump", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["value"] for r in doc["registers"]} == {
        "setpoint": -7.5, "control": 0x20, "energy_limit": 123456, "pump": 1}
    assert main(["trigger", *tcp, "purge"]) == 0
    assert main(["trigger", *tcp, "purge"]) == 0
    out = capsys.readouterr().out
    assert "purge: ACCEPTED (0x0000): started" in out
    assert "purge: RUNNING (0x0101): already running: nothing started" in out

    # a third-party client reads the same words and decodes them with its own converters
    pymodbus = pytest.importorskip("pymodbus.client")
    host, port = address.rsplit(":", 1)
    client = pymodbus.ModbusTcpClient(host, port=int(port), timeout=scaled(2))
    try:
        assert client.connect()
        words = client.read_holding_registers(0x100, count=5, device_id=1).registers
        coils = client.read_coils(0, count=2, device_id=1).bits
    finally:
        client.close()
    assert from_regs(words[0:1], "INT16") == -75
    assert words[1] == 0x20 and words[4] == 1  # the bit field; the purge still runs
    assert from_regs(words[2:4], "UINT32", "little") == 123456
    assert coils[:2] == [True, False]
    mbpoll = shutil.which("mbpoll")
    if mbpoll is None:
        pytest.skip("mbpoll is not installed (apt install mbpoll): pymodbus's reading stands")
    run = subprocess.run([mbpoll, "-m", "tcp", "-p", port, "-a", "1", "-t", "4", "-r", "256",
                          "-0", "-c", "1", "-1", host], capture_output=True, text=True,
                         timeout=scaled(20))
    assert run.returncode == 0 and "[256]: \t65461 (-75)" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize(("extra", "says"), [
    (("--port", "/dev/null"), "--port does not apply to --modbus-tcp"),
    (("--plain",), "--plain does not apply to --modbus-tcp"),
    (("--modbus-rtu",), "--modbus-rtu and --modbus-tcp: give one"),
    (("--unit", "0"), "unit id 0 outside 1..247"),
])
def test_sim_modbus_tcp_refuses_in_one_line(extra: tuple[str, ...], says: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--modbus-tcp", "0", *extra]) == 1
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
