"""A port is driven by one program at a time: a second opener is refused with "port busy".

Before, a forgotten second process on the port took half the answers, and every command of the
first reported "OK (replayed answer)" after a retry: the exclusive open makes that visible at once.
"""

from __future__ import annotations

import pytest

from idemlink.cli import main
from idemlink.host.device import Device, PortBusy
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
