"""``info`` and ``send`` on a port where a standard Modbus RTU slave answers: one line naming the
port and saying it answers Modbus RTU (what to do instead), as the register commands do;
``info --modbus-rtu`` is refused in one line (a standard slave has no HELLO identity). The API
says the same: ``Device.open`` and ``AsyncDevice.open`` raise ``AnswersModbusRtu`` (a
``NoDevice``), not only "no HELLO_REPLY"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.rtu import rtu_on_pty

from idemlink.cli import main
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.regmap_file import DEFAULT_MAP


@pytest.fixture
def rtu_port() -> Iterator[str]:
    with rtu_on_pty(DeviceCore(DEFAULT_MAP)) as path:
        yield path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_info_on_a_modbus_rtu_port_says_so(rtu_port: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, "info", "--port", rtu_port, "--attempts", "1", "--timeout", "0.1")
    assert rc == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith(f"idemlink info: {rtu_port}: this port answers Modbus RTU, not idemlink")
    assert "read --modbus-rtu" in line and line.count(rtu_port) == 1


def test_send_on_a_modbus_rtu_port_says_so(rtu_port: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fw.bin"
    f.write_bytes(b"x" * 100)
    rc, out, err = _run(capsys, "send", "--port", rtu_port, "--no-progress", str(f))
    assert rc == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith(f"idemlink send: {rtu_port}: this port answers Modbus RTU, not idemlink")
    assert "send --plain" in line


def test_both_apis_opening_a_modbus_rtu_port_say_so(rtu_port: str) -> None:
    import asyncio

    from idemlink.host.aio import AsyncDevice
    from idemlink.host.device import Device
    from idemlink.host.errors import AnswersModbusRtu, NoDevice

    with pytest.raises(AnswersModbusRtu, match=r"^this port answers Modbus RTU, not idemlink: "
                                                r"open it with RtuDevice or AsyncRtuDevice"):
        Device.open(rtu_port, attempts=1, timeout=0.1)

    async def opening() -> None:
        async with AsyncDevice.open(rtu_port, attempts=1, timeout=0.1):
            raise AssertionError("no idemlink device is there")  # pragma: no cover

    with pytest.raises(AnswersModbusRtu, match="no HELLO_REPLY after 1 attempts") as caught:
        asyncio.run(opening())
    assert isinstance(caught.value, NoDevice)


def test_info_modbus_rtu_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, "info", "--port", "/dev/null", "--modbus-rtu")
    assert rc == 1 and out == ""
    [line] = err.splitlines()
    assert "HELLO" in line and "read --modbus-rtu" in line and "nothing was sent" in line
