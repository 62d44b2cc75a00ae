"""``idemlink scan --framed`` (issue 22 item 5): the addresses of a framed bus that answer, with
their identity, and two devices sharing one address, within the stated bound."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from idemlink.device_sim.bus import Bus, BusConfig, BusTransport
from idemlink.device_sim.device import SimulatedDevice
from idemlink.host.bus_scan import scan_bus
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.frame import PROTOCOL_VERSION
from idemlink.protocol.framed_scan import (
    REPLY_BYTES,
    FramedReport,
    FramedScan,
    hello_window,
    quiet,
)


def test_scan_finds_each_device_with_its_identity_within_the_bound() -> None:
    devs = [SimulatedDevice(seed=a, address=a) for a in (1, 2, 5, 7)]
    wire = BusTransport(Bus(devs, BusConfig(echo=True)))  # the master hears its own HELLOs
    res = scan_bus(wire, list(range(1, 11)))
    assert [(r.address, r.state) for r in res.reports] == [
        (1, "present"), (2, "present"), (5, "present"), (7, "present")]
    for r, d in zip(res.reports, devs, strict=True):
        assert r.identity["device_id"] == d.device_id
        assert r.identity["map"] == "thermal-controller" and len(r.identity["epoch"]) == 8
    assert res.answered and res.seconds <= res.bound
    # 10 windows; 10 echoes and 4 replies heard: REPLY_BYTES and the quiet time more each
    bt = 10 / 115200
    assert res.bound == pytest.approx(10 * hello_window(bt, 0.001) + 10 * 0.002
                                      + 10 * (REPLY_BYTES * bt + quiet(bt)))
    assert res.seconds < 10 * hello_window(bt, 0.001) + 4 * 0.01  # silence costs one window


def _scan_with(answer: Callable[[bytes, int], bytes]) -> list[FramedReport]:
    """A scan of addresses 3 and 4 whose every window hears ``answer(hello, probe)``."""
    scan = FramedScan([3, 4], byte_time=0.0, turnaround=0.001, contract_hash=contract_hash(),
                      version=PROTOCOL_VERSION)
    now, probe = 0.0, 0
    scan.tick(now)
    while not scan.done:
        hello = scan.data_to_send()
        if hello:
            probe += 1
            scan.receive_data(answer(hello, probe), now)
        deadline = scan.next_deadline()
        assert deadline is not None
        now = deadline
        scan.tick(now)
    return scan.reports


def _reply(dev: SimulatedDevice, hello: bytes) -> bytes:
    dev.receive_data(hello, 0.0)
    return dev.data_to_send()


def test_two_devices_sharing_an_address_are_a_conflict_whether_their_replies_follow_or_collide(
        ) -> None:
    twins = [SimulatedDevice(seed=s, address=3) for s in (1, 2)]

    def both(hello: bytes, probe: int) -> bytes:
        return b"".join(_reply(d, hello) for d in twins)

    def collided(hello: bytes, probe: int) -> bytes:
        a, b = (_reply(d, hello) for d in twins)
        return bytes(x | y for x, y in zip(a, b, strict=False))  # the wire's wired-OR, roughly

    for answer in (both, collided):
        reports = _scan_with(answer)
        assert [(r.address, r.state) for r in reports] == [(3, "conflict")], reports
        assert "again" in reports[0].detail


def test_noise_once_then_a_clean_reply_is_present_and_silence_after_noise_is_noise() -> None:
    dev = SimulatedDevice(seed=1, address=3)

    def noisy_first(hello: bytes, probe: int) -> bytes:
        return b"\x13\x37\x00" if probe == 1 else _reply(dev, hello) if probe == 2 else b""

    reports = _scan_with(noisy_first)
    assert [(r.address, r.state) for r in reports] == [(3, "present")]
    assert reports[0].detail.startswith("once:")
    reports = _scan_with(lambda hello, probe: b"\x13\x37\x00" if probe == 1 else b"")
    assert [(r.address, r.state) for r in reports] == [(3, "noise")]
