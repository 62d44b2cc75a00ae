"""A bus of plain Modbus RTU units (issue 22 item 3 for ``--modbus-rtu``; docs/BUS.md): pymodbus's
own server serving units 1, 2 and 3 on one line (a real peer), driven through
``Bus.open(url, modbus_rtu=True)`` and ``--modbus-rtu --unit 1,2,5-8``: one transaction at a
time, round-robin between units with work queued, a silent unit stopped by its breaker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.pymodbus_serial import BackgroundSerialServer
from support.timing import scaled

from idemlink.cli import main
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.link_proxy import LinkProxy
from idemlink.host.bus import Bus
from idemlink.host.errors import NoDevice
from idemlink.protocol.bus_rules import BreakerPolicy, BreakerState
from idemlink.protocol.outcome import Outcome, Status
from idemlink.protocol.regmap_file import DEFAULT_MAP

UNITS = (1, 2, 3)
TH = 4  #: threshold


class Units:
    """pymodbus's RTU server with one SimDevice per unit of ``UNITS``; ``heard`` lists the unit
    of every request it received, in order; ``writes[unit]`` what each unit executed."""

    def __init__(self, path: str) -> None:
        from pymodbus.simulator import DataType, SimData, SimDevice

        self.heard: list[int] = []
        self.writes: dict[int, list[tuple[int, list[int]]]] = {u: [] for u in UNITS}

        def action_of(unit: int) -> Any:
            async def action(fc: int, start: int, address: int, count: int, regs: list[int],
                             set_values: list[int] | None) -> Any:
                if set_values is not None:
                    self.writes[unit].append((address, list(set_values)))
                return None
            return action

        def trace(sending: bool, frame: bytes) -> bytes:
            if not sending and frame:
                self.heard.append(frame[0])
            if sending and frame and frame[0] not in UNITS:
                return b""  # pymodbus's simulator answers a unit it does not serve: silence
            return frame

        devices = [SimDevice(u, simdata=[SimData(0, values=[s.default for s in DEFAULT_MAP],
                                                 datatype=DataType.REGISTERS)],
                             action=action_of(u)) for u in UNITS]
        self.background = BackgroundSerialServer(devices, path, trace)

    def close(self) -> None:
        self.background.close()


@pytest.fixture
def line() -> Iterator[tuple[str, Units]]:
    with LinkProxy(None, None, LinkConfig()).start() as proxy:
        units = Units(proxy.a_path)
        try:
            yield proxy.b_path, units
        finally:
            units.close()


def open_bus(path: str, **kw: Any) -> Bus:
    """The bus, once pymodbus listens (it opens its port asynchronously)."""
    for _ in range(40):
        bus = Bus.open(path, modbus_rtu=True, timeout=scaled(0.1), attempts=2, **kw)
        try:
            bus.device(1).connect()
            return bus
        except NoDevice:
            bus.close()
    raise AssertionError("pymodbus never answered")


def test_units_on_one_line_take_turns_fairly_and_a_silent_one_is_stopped(
        line: tuple[str, Units]) -> None:
    path, units = line
    bus = open_bus(path, breaker=BreakerPolicy(failures=1, cooldown=60.0))
    try:
        for u in UNITS:
            assert bus.device(u).write({"threshold": 300 + u}).outcome is Outcome.OK
        units.heard.clear()
        bus.turn.acquire(0)  # the callers queue while the line is busy
        errors: list[BaseException] = []
        queues = {1: 3, 2: 3, 3: 6}

        def work(u: int) -> None:
            try:
                d = bus.device(u)
                rs = d.run([d.read_command("threshold") for _ in range(queues[u])])
                assert [r.values for r in rs] == [(300 + u,)] * queues[u]
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(u,)) for u in UNITS]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 10
        while bus.turn.waiting != set(UNITS):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        bus.turn.release(0)
        for th in threads:
            th.join()
        assert not errors
        assert units.heard == [1, 2, 3] * 3 + [3] * 3  # round-robin, then the deep queue
        assert {u: units.writes[u] for u in UNITS} == {u: [(TH, [300 + u])] for u in UNITS}
        # unit 9 is nobody: one unanswered read opens its breaker; then nothing is sent
        r = bus.device(9).read("threshold")
        assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
        assert bus.device(9).breaker.state is BreakerState.OPEN
        heard = len(units.heard)
        r = bus.device(9).write({"threshold": 1})
        assert (r.outcome, r.status) == (Outcome.NOT_EXECUTED, Status.BREAKER_OPEN)
        assert bus.device(2).read("threshold").values == (302,)
        assert units.heard[heard:] == [2]  # the refused write sent nothing
    finally:
        bus.close()


def test_the_cli_runs_one_command_on_several_units_of_the_line(
        line: tuple[str, Units], capsys: pytest.CaptureFixture[str]) -> None:
    path, units = line
    open_bus(path).close()  # pymodbus listens
    rtu = ["--port", path, "--modbus-rtu", "--timeout", str(scaled(0.1)), "--attempts", "2"]
    assert main(["write", *rtu, "--unit", "1-3", "threshold=41"]) == 0
    out = capsys.readouterr().out
    assert [f"== {path}@{u}: OK (exit 0)" in out for u in UNITS] == [True] * 3
    assert "3 devices: 3 OK; exit 0" in out
    assert {u: units.writes[u] for u in UNITS} == {u: [(TH, [410])] for u in UNITS}
    assert main(["read", *rtu, "--unit", "2,7", "threshold"]) == 1
    out, err = capsys.readouterr()
    assert f"== {path}@2: OK (exit 0)" in out and f"== {path}@7: ERROR (exit 1)" in out
    assert "unit 7" in err
    assert main(["read", *rtu, "--unit", "0,2", "threshold"]) == 1
    assert "--unit must be 1..247" in capsys.readouterr().err
    assert main(["watch", *rtu, "--unit", "1,2", "--count", "1"]) == 1
    assert "this command takes one unit" in capsys.readouterr().err


def test_the_cli_with_echo_on_an_echoing_rtu_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``--modbus-rtu --echo`` as the framed commands have it: the master's echo skipped on a
    line that hands it back; without ``--echo`` its own request stands where the answer should."""
    from support.rtu_bus import bus_on_pty

    from idemlink.device_sim.rtu_server import RtuServer
    from idemlink.protocol.device_core import DeviceCore

    servers = [RtuServer(DeviceCore(DEFAULT_MAP), unit=u) for u in (1, 2)]
    with bus_on_pty(servers, echo=True) as path:
        rtu = ["--port", path, "--modbus-rtu", "--timeout", str(scaled(0.2)), "--attempts", "2"]
        assert main(["write", *rtu, "--echo", "--guard", "0.001", "--unit", "1,2",
                     "threshold=42"]) == 0
        assert "2 devices: 2 OK; exit 0" in capsys.readouterr().out
        assert [s.core.read(TH, 1) for s in servers] == [(420,), (420,)]
        assert main(["read", "--port", path, "--modbus-rtu", "--timeout", str(scaled(0.05)),
                     "--attempts", "1", "--unit", "1", "threshold"]) == 1  # the echo unskipped
        assert "no Modbus RTU slave answered at unit 1" in capsys.readouterr().err
