"""``idemlink scan``: the sans-I/O ``BusScan`` on a simulated clock (what a window heard, the
confirmation of an anomaly, the time bound), then the command on a pty bus of simulated slaves
(``support.rtu_bus``: two slaves on one unit id, answering both or colliding) and against a
pymodbus RTU server that offers FC43 identification (over a socat pty pair)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.ptys import socat_pair
from support.rtu_bus import bus_on_pty
from support.timing import scaled

from idemlink.cli import main
from idemlink.commands.scan_cmd import parse_units
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.host.rtu_scan import READ_LATENCY
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.modbus_rtu import encode_rtu, rtu_timing
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.protocol.rtu_scan import (
    IDENTIFY,
    PROBE,
    BusScan,
    judge,
    parse_identity,
    probe_window,
    scan_bound,
)

ANSWER = bytes.fromhex("03 02 00 fa")  # one register, 250
IDENT = (bytes.fromhex("2b 0e 01 01 00 00 02") + b"\x00\x04Acme" + b"\x01\x05B-200")


# ------------------------------------------------------------------------ sans-I/O


def test_what_a_window_heard() -> None:
    one = encode_rtu(5, ANSWER)
    assert judge(5, PROBE, b"").silent
    assert judge(5, PROBE, one).clean
    assert judge(5, PROBE, encode_rtu(5, bytes([0x83, 0x02]))).clean  # an exception: a slave
    h = judge(5, PROBE, one + one)
    assert len(h.answers) == 2 and not h.clean and "2 answers" in h.describe()
    h = judge(5, PROBE, one[:3] + bytes([one[3] ^ 0x10]) + one[4:])
    assert h.garbage == len(one) and "no valid frame" in h.describe()
    h = judge(5, PROBE, encode_rtu(6, ANSWER))
    assert h.others == [(6, ANSWER)] and not h.clean
    h = judge(5, IDENTIFY, encode_rtu(5, IDENT))
    assert h.clean and parse_identity(h.answers[0]) == {"VendorName": "Acme",
                                                         "ProductCode": "B-200"}


class Bus:
    """``BusScan`` on a simulated clock; ``answer(unit, request pdu) -> bytes heard``."""

    def __init__(self, units: list[int], **kw: object) -> None:
        self.timing = rtu_timing(9600)
        self.scan = BusScan(units, timing=self.timing, turnaround=0.05, **kw)  # type: ignore[arg-type]
        self.t = 0.0

    def run(self, answer: object) -> float:
        s = self.scan
        s.tick(self.t)
        while not s.done:
            out = s.data_to_send()
            if out:
                heard = answer(out[0], out[1:-2])  # type: ignore[operator]
                if heard:
                    s.receive_data(heard, self.t + 0.01)
            deadline = s.next_deadline()
            assert deadline is not None
            self.t = max(self.t, deadline)
            s.tick(self.t)
        return self.t


def test_silent_units_take_exactly_the_bound() -> None:
    bus = Bus(list(range(1, 248)))
    took = bus.run(lambda unit, pdu: b"")
    assert bus.scan.reports == [] and bus.scan.probes == 247
    bound = scan_bound(247, bus.timing, 0.05)
    assert bound - bus.timing.t35 - 1e-9 <= took <= bound  # no t3.5 after the last window
    assert took < 19.0  # 247 units at 9600 8E1, 50 ms turnaround: 18.6 s (docs/CLI.md)
    assert probe_window(bus.timing, 0.05) == pytest.approx(0.05 + 15 * 11 / 9600 + 3.5 * 11 / 9600)


def test_present_conflict_noise_and_identity() -> None:
    seen: dict[int, int] = {}

    def answer(unit: int, pdu: bytes) -> bytes:
        seen[unit] = seen.get(unit, 0) + 1
        if pdu == IDENTIFY:
            return encode_rtu(unit, IDENT) if unit == 2 else encode_rtu(unit, bytes([0xAB, 1]))
        one = encode_rtu(unit, ANSWER)
        return {2: one, 3: one + one, 4: one[:-1] + b"\x00" if seen[unit] == 1 else one,
                5: b"\x17\x42" if seen[unit] == 1 else b"", 6: one[:5]}.get(unit, b"")

    bus = Bus([1, 2, 3, 4, 5, 6, 7])
    took = bus.run(answer)
    got = {r.unit: r for r in bus.scan.reports}
    assert {u: r.state for u, r in got.items()} == {2: "present", 3: "conflict", 4: "present",
                                                   5: "noise", 6: "conflict"}
    assert got[2].identity == {"VendorName": "Acme", "ProductCode": "B-200"}
    assert got[2].answer == "registers [250]"
    assert "2 answers" in got[3].detail and "noise once" in got[4].detail
    assert "no FC43 identification (exception 0x01)" in got[4].detail
    assert took <= scan_bound(7, bus.timing, 0.05, answering=5)


ID_MAP = """name = "ided"
[[registers]]
address = 0
name = "level"
kind = "holding"
default = 7
[[registers]]
address = 1
name = "fw"
kind = "input"
type = "string"
length = 3
default = "V1.2.3"
[[registers]]
address = 9
name = "gen"
kind = "generation"
"""


def test_a_string_id_register_is_read_and_shown_whole(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 (review): ``scan --id-register fw`` of a 3-register string showed only its
    first word, as a number. Every word of the read is kept (``id_words``) and shown as ``read``
    shows the register: the whole text. Sans-I/O, then the CLI against a slave on a pty."""
    from idemlink.host.command import CommandBuilder
    from idemlink.protocol.regmap_file import parse_regmap

    regmap = parse_regmap(ID_MAP)
    id_read = CommandBuilder(regmap).read_command("fw").pdu()
    fw = b"V1.2.3"

    def answer(unit: int, pdu: bytes) -> bytes:
        if pdu == id_read:
            return encode_rtu(unit, bytes([4, 6]) + fw)
        return encode_rtu(unit, ANSWER) if pdu != IDENTIFY else encode_rtu(unit, bytes([0xAB, 1]))

    bus = Bus([1], id_read=id_read)
    bus.run(answer)
    (report,) = bus.scan.reports
    assert report.id_words == (0x5631, 0x2E32, 0x2E33) and report.id_value == 0x5631
    path = tmp_path / "ided.toml"
    path.write_text(ID_MAP)
    with bus_on_pty([RtuServer(DeviceCore(regmap), unit=4)]) as port:
        rc = main(["scan", "--port", port, "--units", "4", "--turnaround", str(scaled(0.05)),
                   "--regmap", str(path), "--id-register", "fw"])
    out = capsys.readouterr().out
    assert rc == 0 and "id register V1.2.3" in out, out


def test_a_slave_answering_late_into_the_next_window_is_found_and_told() -> None:
    """Issue 21 (review): a slave whose answer landed in the next unit's window was lost (and
    the next unit judged noisy). It is present, with the hint to raise --turnaround; the next
    unit, silent apart from it, is absent; one that answers is present too."""
    def late_one(next_answers: bool) -> Callable[[int, bytes], bytes]:
        pending: list[bytes] = []

        def answer(unit: int, pdu: bytes) -> bytes:
            out = b"".join(pending)
            pending.clear()
            if unit == 1 and pdu == PROBE:
                pending.append(encode_rtu(1, ANSWER))  # too late for its own window
            elif unit == 2 and next_answers and pdu == PROBE:
                out += encode_rtu(2, ANSWER)
            elif pdu == IDENTIFY:
                out += encode_rtu(unit, bytes([0xAB, 1]))
            return out
        return answer

    for next_answers in (False, True):
        answer = late_one(next_answers)
        bus = Bus([1, 2, 3], identify=True)
        bus.run(answer)
        got = {r.unit: r for r in bus.scan.reports}
        assert set(got) == ({1, 2} if next_answers else {1})
        assert got[1].state == "present" and got[1].answer == "registers [250]"
        assert "unit 1 answered late (in the next window): raise --turnaround" in got[1].detail
        if next_answers:
            assert got[2].state == "present" and "answered late" not in got[2].detail
            assert "unit 1" not in got[2].detail


def test_units_list() -> None:
    assert parse_units("1-3,7,2,10-11") == [1, 2, 3, 7, 10, 11]
    for bad in ("0-5", "5-1", "x", "1-248"):
        with pytest.raises(Exception, match="--units"):
            parse_units(bad)


# -------------------------------------------------------------- the command, on a pty bus


def servers(*units: int) -> list[RtuServer]:
    return [RtuServer(DeviceCore(DEFAULT_MAP), unit=u) for u in units]


@pytest.mark.parametrize("clash", ["both", "collide"])
def test_scan_finds_slaves_and_two_on_one_unit(clash: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    turnaround = scaled(0.03)
    with bus_on_pty(servers(3, 9, 5, 5), clash=clash) as path:
        start = time.monotonic()
        rc = main(["scan", "--port", path, "--units", "1-40", "--turnaround", str(turnaround),
                   "--json"])
        took = time.monotonic() - start
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    (scan,) = doc["scans"]
    assert doc["answered"] is True and scan["units"] == 40 and scan["format"] == "8E1"
    states = {f["unit"]: f["state"] for f in scan["found"]}
    assert states == {3: "present", 5: "conflict", 9: "present"}
    assert "no FC43 identification" in scan["found"][0]["detail"]  # the simulator offers none
    assert scan["seconds"] <= scan["bound"] * scaled(1.0)
    assert took < scan["bound"] * scaled(1.0) + scaled(1.0)  # opening the port, the process


def test_nobody_answers_exit_1_and_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    with bus_on_pty(servers(20)) as path:
        rc = main(["scan", "--port", path, "--units", "1-5", "--turnaround", "0.01"])
        out = capsys.readouterr().out
        assert rc == 1 and "scanned 5 unit(s) at 115200 8E1" in out and "0 answered" in out
        for argv, why in ((["--units", "0-3"], "--units"), (["--bauds", "9600,x"], "--bauds"),
                          (["--id-register", "mode"], "needs --regmap"),
                          (["--turnaround", "0"], "--turnaround")):
            assert main(["scan", "--port", path, *argv]) == 1
            assert why in capsys.readouterr().err


@pytest.mark.slow
def test_247_units_within_the_stated_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """The default turnaround over the whole range, as docs/CLI.md states it (on a pty: the
    fast line's t3.5)."""
    with bus_on_pty(servers(247)) as path:
        start = time.monotonic()
        rc = main(["scan", "--port", path, "--json", "--bauds", "9600,19200"])
        took = time.monotonic() - start
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    for scan in doc["scans"]:
        assert [f["unit"] for f in scan["found"]] == [247]
        assert scan["seconds"] <= scan["bound"] * scaled(1.0)
        assert scan["bound"] < 247 * (0.05 + 0.002 + 15 * 11 / 115200 + 2 * 0.00175
                                      + READ_LATENCY) + 1
    assert took < sum(s["bound"] for s in doc["scans"]) * scaled(1.0) + scaled(2.0)


# ------------------------------------------------------ FC43 from pymodbus's RTU server


@pytest.fixture
def pty_pair(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with socat_pair(tmp_path) as pair:
        yield pair


def test_identity_from_a_pymodbus_slave(pty_pair: tuple[str, str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from pymodbus import ModbusDeviceIdentification
    from pymodbus.server import ModbusSerialServer
    from pymodbus.simulator import DataType, SimData, SimDevice

    a, b = pty_pair
    identity = ModbusDeviceIdentification(info_name={
        "VendorName": "Boilerworks", "ProductCode": "BW-12", "MajorMinorRevision": "3.1"})
    device = SimDevice(12, simdata=[SimData(0, values=[7, 8, 9], datatype=DataType.REGISTERS)],
                       identity=identity)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, ModbusSerialServer] = {}

    async def serve() -> None:
        server = ModbusSerialServer(device, port=a, baudrate=115200, identity=identity)
        holder["server"] = server
        await server.serve_forever(background=True)
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve())
        loop.run_forever()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert ready.wait(scaled(10))
    try:
        rc = main(["scan", "--port", b, "--units", "12", "--turnaround", str(scaled(0.1))])
        # (pymodbus's simulator answers every other unit id too, with exception 0x04)
        out = capsys.readouterr().out
    finally:
        asyncio.run_coroutine_threadsafe(holder["server"].shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)
    assert rc == 0, out
    assert ("unit  12 @ 115200 8E1: PRESENT (registers [7]; VendorName=Boilerworks, "
            "ProductCode=BW-12, MajorMinorRevision=3.1)") in out, out
