"""A port is driven by one program at a time: a second opener is refused with "port busy".

Before, a forgotten second process on the port took half the answers, and every command of the
first reported "OK (replayed answer)" after a retry: the exclusive open makes that visible at once.
"""

from __future__ import annotations

import pytest

from idemlink.cli import main
from idemlink.host.device import Device
from idemlink.host.errors import PortBusy
from idemlink.pytest_plugin import start_pty_sim


def test_second_open_of_a_port_is_refused_and_the_first_keeps_working(
        capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_pty_sim()
    try:
        with Device.open(sim.path) as first:
            with pytest.raises(PortBusy, match="port busy"):
                Device.open(sim.path)
            assert main(["read", "--port", sim.path, "mode"]) == 1
            err = capsys.readouterr().err
            assert "port busy" in err and err.count("\n") == 1
            r = first.read("mode")
            assert r.ok and not r.replay and r.attempts == 1
        with Device.open(sim.path) as again:  # released on close
            assert again.read("mode").ok
    finally:
        sim.close()


def test_a_faulty_url_is_no_way_around_the_exclusive_open() -> None:
    sim = start_pty_sim()
    try:
        with Device.open(sim.path), pytest.raises(PortBusy, match="port busy"):
            Device.open(f"faulty://{sim.path}")
        with Device.open(f"faulty://{sim.path}") as dev:
            assert dev.read("mode").ok
            with pytest.raises(PortBusy):
                Device.open(sim.path)
    finally:
        sim.close()


def test_the_hint_on_a_busy_pty_is_only_what_works_there() -> None:
    """``idemlink monitor`` on a pty would be a second reader stealing bytes: not offered."""
    sim = start_pty_sim()
    try:
        with Device.open(sim.path), pytest.raises(PortBusy) as refused:
            Device.open(sim.path)
    finally:
        sim.close()
    text = str(refused.value)
    assert "idemlink monitor" not in text
    assert f"idemlink link --monitor --b {sim.path}" in text


def test_the_hint_on_a_serial_device_names_a_tap() -> None:
    from idemlink.host.port_hint import busy_hint, is_pty

    assert is_pty("faulty:///dev/pts/7?loss=0.1") and not is_pty("/dev/ttyUSB0")
    assert "on a tap of the line" in busy_hint("/dev/ttyUSB0")
    assert "link --monitor" in busy_hint("/dev/pts/7")


def test_the_watching_command_carries_the_users_regmap() -> None:
    from idemlink.host.port_hint import busy_hint

    assert "`idemlink link --monitor --b /dev/pts/7 --regmap chiller.toml`" in busy_hint(
        "/dev/pts/7", "chiller.toml")
    assert "`idemlink monitor --regmap chiller.toml`" in busy_hint("/dev/ttyUSB0", "chiller.toml")
    for url in ("/dev/pts/7", "/dev/ttyUSB0"):
        assert "add --regmap FILE" in busy_hint(url)
        assert "add --regmap" not in busy_hint(url, "chiller.toml")


def test_a_busy_port_from_the_cli_suggests_the_map_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_pty_sim()
    try:
        with Device.open(sim.path):
            rc = main(["read", "--port", sim.path, "--regmap", "thermal-controller", "mode"])
    finally:
        sim.close()
    err = capsys.readouterr().err
    assert rc == 1 and len(err.splitlines()) == 1
    assert f"`idemlink link --monitor --b {sim.path} --regmap thermal-controller`" in err
    assert err.count(sim.path) == 2  # the busy port once, the command to run once
