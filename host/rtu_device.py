"""A driver for any standard Modbus RTU slave, with the same operations and ``Result``s as ``Device``.

``RtuDevice.open(url, unit=1, regmap=...)`` opens the port like ``Device.open`` (exclusively,
DTR/RTS low) and reads one register of the map to make sure a slave answers at ``unit``
(``NoDevice`` otherwise; an exception answer is a slave too). There is no handshake: a standard
slave cannot say which map it serves, so the map given is taken at its word.

It is ``idemlink.host.device.BlockingDriver`` — the same shell and the same operation generators
as ``Device`` (``idemlink.host.operations``) — over the sans-I/O RTU master
``idemlink.protocol.rtu_master.RtuMaster`` (``idemlink.host.rtu_operations.RtuOperations``), so
every rule is the one ``Device`` follows, and what only the protocol decides is the master's:

- what may be retried is decided from the map: reads and writes of HOLDING registers only (a
  trigger, a fault clear, an unknown address: sent once);
- a trigger reads its state first and writes 1 only in IDLE: ``Result.code`` is ACCEPTED
  (started now), RUNNING or DONE (nothing started, nothing written), as the framed TRIGGER
  function answers; a reset is an FC06 write of 0; a fault clear is an FC06 write of the bit
  mask (write 1 to clear);
- a conditional write and the file functions are refused before anything is sent
  (``LocalProtocolError``);
- commands run one after the other (no pipelining); an UNKNOWN command that may have had an
  effect blocks the handle (``UnknownOutstanding``) and leaves the rest of a ``run`` unsent
  (NOT_EXECUTED), as with ``Device``; ``reconcile`` reads back what it touched (a plain slave
  keeps no record: ``executed`` stays None);
- an answer that arrives but does not fit (an FC06 echo of another value) is UNKNOWN
  (ANSWER_MISMATCH, ``Result.detail`` saying what came), not NO_ANSWER;
- a failing port raises ``LinkLost`` settling the command out (UNKNOWN/LINK_LOST) and the rest
  (NOT_EXECUTED); an interrupt settles them as CANCELLED before it propagates.

``idemlink.host.aio.AsyncRtuDevice`` is the same, awaited.
"""

from __future__ import annotations

import os

from idemlink.host.device import BlockingDriver, opened
from idemlink.host.half_duplex import HalfDuplexTransport
from idemlink.host.rtu_operations import RtuOperations
from idemlink.host.transport import SerialTransport, Transport, is_pty
from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap
from idemlink.protocol.rtu_master import RtuMaster


class RtuDevice(BlockingDriver):
    """A session with one Modbus RTU slave. See the module docstring."""

    ops: RtuOperations

    def __init__(self, transport: Transport, *, regmap: RegisterMap = DEFAULT_MAP, unit: int = 1,
                 baudrate: int | None = None, timeout: float = 0.2, attempts: int = 5,
                 char_format: CharFormat = MODBUS_CHAR_FORMAT) -> None:
        super().__init__(transport, RtuOperations(transport, regmap=regmap, unit=unit,
                                                  baudrate=baudrate, timeout=timeout,
                                                  attempts=attempts, char_format=char_format))

    @property
    def master(self) -> RtuMaster:
        """The sans-I/O RTU master session."""
        return self.ops.session

    @classmethod
    def open(cls, url: str, *, unit: int = 1, baudrate: int = 115200, bytesize: int = 8,
             parity: str = "E", stopbits: float = 1,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP, timeout: float = 0.2,
             attempts: int = 5, keep_lines: bool = True, probe: bool = True,
             echo: bool = False, guard: float = 0.0) -> RtuDevice:
        """Open ``url`` and (``probe``) check that a slave answers at ``unit``. The line's
        character format defaults to the Modbus specification's 8E1; it also sets the length of
        a character in the RTU timing (t3.5, the wait for an answer). ``echo`` and ``guard``: an
        RS-485 adapter's echo removed (a wrong one is ``EchoMismatch``) and the master's
        turnaround guard (``idemlink.host.half_duplex``), as ``Bus.open`` has them."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        fmt = CharFormat(bytesize, parity, stopbits)
        transport = SerialTransport(url, baudrate=baudrate, bytesize=fmt.bytesize,
                                    parity=fmt.parity, stopbits=fmt.stopbits,
                                    keep_lines=keep_lines)
        line: Transport = transport
        if echo or guard:
            line = HalfDuplexTransport(transport, echo=echo, guard=guard)
        dev = cls(line, regmap=rm, unit=unit, baudrate=line_rate(transport.port, baudrate),
                  timeout=timeout, attempts=attempts, char_format=fmt)
        return opened(dev, probe)


def line_rate(port: object, baudrate: int) -> int | None:
    """The baud rate that paces ``port``'s line (t3.5, transmission times), or None for a pty,
    socket or loop URL, which has no line rate (t3.5 is then the fast-line 1.75 ms)."""
    name = str(getattr(port, "portstr", "") or "")
    return None if "://" in name or is_pty(name) else baudrate


__all__ = ["RtuDevice", "line_rate"]
