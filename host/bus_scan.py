"""Scanning a framed idemlink bus: the sans-I/O ``idemlink.protocol.framed_scan.FramedScan`` on a
transport (issue 22 item 5).

``scan_bus(transport, addresses, baud=..., turnaround=...)`` runs the scan with the one request
loop (``idemlink.host.drive.rounds``) on an open transport (a port, or the simulated bus's
``BusTransport``) and returns a ``BusScanResult``: who answered with which identity, who shares
an address (conflict), how long it took and the bound it was to stay within
(``framed_scan_bound`` plus this driver's read latency per window). ``scan_bus_url(url, ...)``
opens the port as every driver does (``SerialTransport``) and closes it after. A port that fails
is ``LinkLost`` (from the loop), one that cannot be opened ``PortError``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from idemlink.host.drive import rounds
from idemlink.host.operations import no_job, scan_steps
from idemlink.host.rtu_operations import RtuOperations
from idemlink.host.transport import SerialTransport, Transport
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.frame import PROTOCOL_VERSION
from idemlink.protocol.framed_scan import FramedReport, FramedScan, framed_scan_bound

READ_LATENCY = 0.002
"""Seconds a window may end late in this driver (the read that sees its deadline returns after
it): part of the stated bound."""


@dataclass(slots=True)
class BusScanResult:
    addresses: int  #: addresses probed
    seconds: float  #: how long the scan took
    bound: float  #: what it was to stay within
    reports: list[FramedReport] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return any(r.state in ("present", "conflict") for r in self.reports)


def scan_bus(transport: Transport, addresses: list[int], *, baud: int | None = 115200,
             turnaround: float = 0.001) -> BusScanResult:
    """Scan ``addresses`` on an open ``transport`` (see the module docstring)."""
    byte_time = 0.0 if baud is None else 10.0 / baud
    scan = FramedScan(addresses, byte_time=byte_time, turnaround=turnaround,
                      contract_hash=contract_hash(), version=PROTOCOL_VERSION,
                      nonce=random.getrandbits(32))  # a stale reply names another number
    ops = RtuOperations(transport)  # holds no request: the loop's settling has none to settle
    start = transport.now()
    for _ in rounds(ops, transport, no_job, scan_steps(scan, transport)):
        pass
    bound = (framed_scan_bound(scan.probes, byte_time, turnaround, scan.heard)
             + scan.probes * READ_LATENCY)
    return BusScanResult(len(addresses), transport.now() - start, bound, scan.reports)


def scan_bus_url(url: str, addresses: list[int], *, baudrate: int = 115200,
                 turnaround: float = 0.001, keep_lines: bool = True) -> BusScanResult:
    """``scan_bus`` on ``url`` (any pyserial URL), opened and closed here."""
    transport = SerialTransport(url, baudrate=baudrate, keep_lines=keep_lines)
    try:
        return scan_bus(transport, addresses, baud=baudrate, turnaround=turnaround)
    finally:
        transport.close()


__all__ = ["READ_LATENCY", "BusScanResult", "scan_bus", "scan_bus_url"]
