"""Scanning a Modbus RTU line: the sans-I/O ``idemlink.protocol.rtu_scan.BusScan`` on a port.

``scan_line(url, baudrate=..., char_format=..., units=...)`` opens the port (as every driver
does: ``SerialTransport``, exclusive, DTR/RTS low), runs the scan with the one request loop
(``idemlink.host.drive.rounds``) and closes it; ``LineScan`` says who answered, how long it took
and the bound it was to stay within (``scan_bound`` of the line's timing; a pty or socket has no
line rate: the fast line's t3.5). The probe is the map's first register when a map is given
(FC03, FC04 for an input register), else FC03 of address 0; ``id_register``: a register of the
map whose value stands for a device's identity when it offers no FC43 identification. A port
that fails is ``LinkLost`` (from the loop), one that cannot be opened ``PortError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from idemlink.host.command import CommandBuilder
from idemlink.host.drive import rounds
from idemlink.host.operations import no_job, scan_steps
from idemlink.host.rtu_device import line_rate
from idemlink.host.rtu_operations import RtuOperations
from idemlink.host.transport import SerialTransport
from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.modbus_rtu import rtu_timing
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.rtu_scan import (
    DEFAULT_TURNAROUND,
    PROBE,
    BusScan,
    UnitReport,
    scan_bound,
)

READ_LATENCY = 0.002
"""Seconds a window may end late in this driver (the read that sees its deadline returns after
it; a few hundred µs idle, more on a loaded machine): part of the stated bound."""


@dataclass(slots=True)
class LineScan:
    baudrate: int
    char_format: CharFormat
    units: int  #: units probed
    seconds: float  #: how long the scan took
    bound: float  #: ``scan_bound`` for those units on this line
    reports: list[UnitReport] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return any(r.state in ("present", "conflict") for r in self.reports)


def scan_line(url: str, *, baudrate: int, char_format: CharFormat = MODBUS_CHAR_FORMAT,
              units: list[int], turnaround: float = DEFAULT_TURNAROUND,
              regmap: RegisterMap | None = None, id_register: str | None = None,
              identify: bool = True, keep_lines: bool = True) -> LineScan:
    """Scan ``units`` on ``url`` at ``baudrate`` (see the module docstring)."""
    probe, id_read = PROBE, None
    if regmap is not None:
        builder = CommandBuilder(regmap)
        probe = builder.read_command(regmap.registers[0].name).pdu()
        if id_register is not None:
            id_read = builder.read_command(id_register).pdu()
    transport = SerialTransport(url, baudrate=baudrate, bytesize=char_format.bytesize,
                                parity=char_format.parity, stopbits=char_format.stopbits,
                                keep_lines=keep_lines)
    try:
        timing = rtu_timing(line_rate(transport.port, baudrate), char_format)
        scan = BusScan(units, timing=timing, turnaround=turnaround, probe=probe,
                       identify=identify, id_read=id_read)
        ops = RtuOperations(transport)  # holds no request: the loop's settling has none to settle
        start = transport.now()
        for _ in rounds(ops, transport, no_job, scan_steps(scan, transport)):
            pass
        return LineScan(baudrate, char_format, len(units), transport.now() - start,
                        scan_bound(len(units), timing, turnaround, len(scan.reports))
                        + (len(units) + 2 * len(scan.reports)) * READ_LATENCY, scan.reports)
    finally:
        transport.close()


__all__ = ["READ_LATENCY", "LineScan", "scan_line"]
