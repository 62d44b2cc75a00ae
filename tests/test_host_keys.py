"""Keys on every host handle (issue 23): ``AsyncDevice``, ``Bus`` and ``AsyncBus`` (one key for
every device, or one per address), a host key file holding both keys of a rotation, and
``--key-file`` refused in one line with ``--modbus-rtu`` / ``--modbus-tcp``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.device_sim.bus import Bus as Medium
from idemlink.device_sim.bus import BusConfig, BusTransport
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import AsyncSimTransport, SimTransport
from idemlink.host.aio import AsyncDevice
from idemlink.host.aio_bus import AsyncBus
from idemlink.host.bus import Bus
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice
from idemlink.host.gateway_device import NotThroughGateway
from idemlink.protocol.auth import key_id
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status

K1 = bytes(range(32))
K2 = bytes(range(1, 33))
K3 = bytes(range(2, 34))


def test_async_device_takes_a_key_and_refuses_downgrades() -> None:
    async def main_() -> None:
        keyed = SimulatedDevice(seed=1, keys=(K1,))
        dev = AsyncDevice(AsyncSimTransport(SimTransport(keyed)), timeout=0.02, key=K1)
        await dev.connect()
        assert dev.ops.authenticated and dev.ops.key_id == key_id(K1)
        assert (await dev.write({"mode": 2})).outcome is Outcome.OK
        plain = AsyncDevice(AsyncSimTransport(SimTransport(keyed)), timeout=0.02)
        await plain.connect()
        r = await plain.write({"mode": 1})
        assert (r.outcome, r.status) == (Outcome.NOT_EXECUTED, Status.AUTHENTICATION_REQUIRED)
        unkeyed = SimulatedDevice(seed=2)
        refusing = AsyncDevice(AsyncSimTransport(SimTransport(unkeyed)), timeout=0.02,
                               attempts=2, key=K1)
        with pytest.raises(IncompatibleDevice, match="no downgrade"):
            await refusing.connect()
        assert unkeyed.executions == []
        assert keyed.core.value("mode") == 2  # the unkeyed host's write never ran

    asyncio.run(main_())


def test_a_bus_takes_one_key_per_address_and_drives_no_address_unkeyed() -> None:
    medium = Medium([SimulatedDevice(seed=1, address=1, keys=(K1,)),
                     SimulatedDevice(seed=2, address=2, keys=(K2,))], BusConfig())
    with Bus(BusTransport(medium), timeout=0.02, attempts=3, key={1: K1, 2: K2}) as bus:
        for a in (1, 2):
            assert bus.device(a).write({"mode": a}).outcome is Outcome.OK
            assert bus.device(a).ops.authenticated
        with pytest.raises(LocalProtocolError, match="no key"):
            bus.device(3)
    assert [medium.device(a).core.value("mode") for a in (1, 2)] == [1, 2]


def test_one_key_for_the_bus_and_a_device_with_another_key_is_refused() -> None:
    medium = Medium([SimulatedDevice(seed=1, address=1, keys=(K1,)),
                     SimulatedDevice(seed=2, address=2, keys=(K2,))], BusConfig())
    with Bus(BusTransport(medium), timeout=0.02, attempts=2, key=K1) as bus:
        assert bus.device(1).write({"mode": 1}).outcome is Outcome.OK
        with pytest.raises(IncompatibleDevice, match="key id"):
            bus.device(2).connect()
    assert medium.device(2).executions == []


def test_async_bus_keys_per_address() -> None:
    medium = Medium([SimulatedDevice(seed=1, address=1, keys=(K1,)),
                     SimulatedDevice(seed=2, address=2, keys=(K2,))], BusConfig())

    async def main_() -> None:
        async with AsyncBus(AsyncSimTransport(BusTransport(medium)),  # type: ignore[arg-type]
                            timeout=0.02, attempts=3, key={1: K1, 2: K2}) as bus:
            got = await asyncio.gather(bus.device(1).write({"mode": 1}),
                                       bus.device(2).write({"mode": 2}))
            assert [r.outcome for r in got] == [Outcome.OK, Outcome.OK]
            assert bus.device(2).ops.authenticated
            with pytest.raises(LocalProtocolError, match="no key"):
                bus.device(5)

    asyncio.run(main_())


def test_a_host_holding_both_keys_of_a_rotation_uses_the_one_the_device_names() -> None:
    old_only = SimulatedDevice(seed=3, keys=(K1,))  # not yet provisioned with the new key
    dev = Device(SimTransport(old_only), timeout=0.02, key=(K2, K1))
    dev.connect()
    assert dev.ops.authenticated and dev.ops.key_id == key_id(K1)
    assert dev.write({"mode": 1}).outcome is Outcome.OK
    # a key the host does not hold is still refused (no fall-back to no key)
    with pytest.raises(IncompatibleDevice, match="key id"):
        Device(SimTransport(old_only), timeout=0.02, attempts=2, key=(K2, K3)).connect()
    assert KEYS_HIDDEN(repr(dev.ops))


def KEYS_HIDDEN(text: str) -> bool:
    return all(k.hex() not in text and repr(k) not in text for k in (K1, K2, K3))


@pytest.mark.parametrize("how", [("--modbus-rtu", "--port", "/dev/null"),
                                 ("--modbus-rtu", "--port", "/dev/null", "--unit", "1,2"),
                                 ("--modbus-tcp", "127.0.0.1:1")])
def test_key_file_with_plain_modbus_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], how: tuple[str, ...]) -> None:
    path = tmp_path / "k"
    path.write_text(K1.hex())
    path.chmod(0o600)
    commands = [("read", "mode"), ("watch", "mode", "--count", "1")]
    for command in commands[:1] if "--unit" in how else commands:  # watch takes one unit
        rc = main([command[0], *how, "--key-file", str(path), *command[1:]])
        _, err = capsys.readouterr()
        assert rc == 1 and err.count("\n") == 1 and "no room for a MAC" in err, err
        assert K1.hex() not in err and "Traceback" not in err


def test_plain_modbus_units_on_a_bus_get_no_key() -> None:
    medium = Medium([SimulatedDevice(seed=1, address=1, keys=(K1,))], BusConfig())
    with pytest.raises(LocalProtocolError, match="no authentication"):
        Bus(BusTransport(medium), modbus_rtu=True, key=K1)
    # refused before the port is opened (the path does not exist: else a PortError)
    with pytest.raises(LocalProtocolError, match="no authentication"):
        Bus.open("/nonexistent/tty-keyed", modbus_rtu=True, key=K1)
    with Bus(BusTransport(medium), modbus_rtu=True) as plain:  # can-fail: unkeyed is made
        assert plain.key_for(1) is None


def test_a_keyed_bus_sends_no_broadcast() -> None:
    medium = Medium([SimulatedDevice(seed=1, address=1, keys=(K1,)),
                     SimulatedDevice(seed=2, address=2, keys=(K2,))], BusConfig())
    with Bus(BusTransport(medium), timeout=0.02, attempts=3, key={1: K1, 2: K2}) as bus:
        for a in (1, 2):
            bus.device(a).connect()
        with pytest.raises(LocalProtocolError, match="a keyed device does not run one"):
            bus.broadcast({"mode": 2})
    assert [medium.device(a).executions for a in (1, 2)] == [[], []]


def test_broadcast_refuses_a_key_file_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k"
    path.write_text(K1.hex())
    path.chmod(0o600)
    rc = main(["broadcast", "--port", "/dev/null", "--address", "1,2", "--key-file", str(path),
               "mode=1"])
    _, err = capsys.readouterr()
    assert rc == 1 and err.count("\n") == 1 and "unsigned" in err, err
    assert K1.hex() not in err and "Traceback" not in err


def test_no_key_through_a_gateway_url() -> None:
    with pytest.raises(NotThroughGateway, match="key"):
        Device.open("idemlink+http://127.0.0.1:1/boiler", key=K1)
    with pytest.raises(NotThroughGateway, match="key"):
        AsyncDevice.open("idemlink+http://127.0.0.1:1/boiler", key=K1)


@pytest.mark.parametrize("how", [("--modbus-rtu",), ("--modbus-tcp", "127.0.0.1:0")])
def test_a_keyed_simulator_never_serves_plain_modbus(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], how: tuple[str, ...]) -> None:
    """``sim --key-file`` with a plain Modbus face would serve every unauthenticated write (a
    silent downgrade): refused in one line, exit 1, before it serves (as the C device)."""
    path = tmp_path / "k"
    path.write_text(K1.hex())
    path.chmod(0o600)
    rc = main(["sim", *how, "--key-file", str(path)])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and err.count("\n") == 1 and "--key-file" in err, (out, err)
    assert K1.hex() not in err
