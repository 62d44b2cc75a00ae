"""A driver for a Modbus TCP device or gateway, with the same operations and ``Result``s as ``RtuDevice``.

``TcpDevice.open("host[:port]", unit=1, regmap=...)`` connects (port 502 by default), and reads
one register of the map to make sure something answers at ``unit`` (``NoDevice`` otherwise; an
exception answer, a gateway's too, is an answer). The connection is pyserial's ``socket://`` URL,
so it is the same ``SerialTransport`` (and, awaited, ``AsyncSerialTransport``) every driver moves
bytes with: a refused or unreachable address is ``PortError``; a connection the peer closes
while a command is out is ``LinkLost`` (UNKNOWN/LINK_LOST, as a dying serial port).

It is ``idemlink.host.device.BlockingDriver`` running the operation generators of
``idemlink.host.rtu_operations.RtuOperations`` over the sans-I/O ``idemlink.protocol.modbus_tcp.
TcpMaster`` (``TcpOperations``): every rule is the RTU driver's — what may be retried, the trigger
read first, the blocking UNKNOWN, the read-back — and what Modbus TCP adds (transaction ids, the
gateway exceptions 0x0A/0x0B) is the master's. ``idemlink.host.aio.AsyncTcpDevice`` is the same,
awaited.
"""

from __future__ import annotations

import os

from idemlink.host.device import BlockingDriver, opened
from idemlink.host.operations import Clock, Operations
from idemlink.host.rtu_operations import RtuOperations
from idemlink.host.transport import SerialTransport, Transport
from idemlink.protocol.modbus_tcp import TcpMaster, parse_tcp_address
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

DEFAULT_TCP_TIMEOUT = 1.0
"""Seconds to wait for an answer: a TCP peer (a gateway polling a serial line behind it) is
slower than a serial slave; 1 s as pymodbus and mbpoll."""
DEFAULT_TCP_ATTEMPTS = 5  #: as RtuDevice and the CLI


class TcpOperations(RtuOperations):
    """``RtuOperations`` over a ``TcpMaster`` (the same operations; only the framing differs)."""

    slave = "Modbus TCP device"

    def __init__(self, clock: Clock, *, regmap: RegisterMap = DEFAULT_MAP, unit: int = 1,
                 timeout: float = DEFAULT_TCP_TIMEOUT,
                 attempts: int = DEFAULT_TCP_ATTEMPTS) -> None:
        Operations.__init__(self, clock, TcpMaster(regmap, unit=unit, timeout=timeout,
                                                   attempts=attempts), regmap)

    @property
    def master(self) -> TcpMaster:
        session = self.session
        assert isinstance(session, TcpMaster)
        return session


def socket_url(address: str) -> str:
    """The pyserial URL of ``HOST[:PORT]`` (``TcpAddressError`` for a bad one)."""
    host, port = parse_tcp_address(address)
    return f"socket://{f'[{host}]' if ':' in host else host}:{port}"


class TcpDevice(BlockingDriver):
    """A session with one Modbus TCP device (or a unit behind a gateway). See the module
    docstring."""

    ops: TcpOperations

    def __init__(self, transport: Transport, *, regmap: RegisterMap = DEFAULT_MAP, unit: int = 1,
                 timeout: float = DEFAULT_TCP_TIMEOUT,
                 attempts: int = DEFAULT_TCP_ATTEMPTS) -> None:
        super().__init__(transport, TcpOperations(transport, regmap=regmap, unit=unit,
                                                  timeout=timeout, attempts=attempts))

    @property
    def master(self) -> TcpMaster:
        """The sans-I/O Modbus TCP master session."""
        return self.ops.master

    @classmethod
    def open(cls, address: str, *, unit: int = 1,
             regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP,
             timeout: float = DEFAULT_TCP_TIMEOUT, attempts: int = DEFAULT_TCP_ATTEMPTS,
             probe: bool = True) -> TcpDevice:
        """Connect to ``address`` (``HOST[:PORT]``, port 502 by default) and (``probe``) check
        that something answers at ``unit``."""
        rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
        transport = SerialTransport(socket_url(address))
        dev = cls(transport, regmap=rm, unit=unit, timeout=timeout, attempts=attempts)
        return opened(dev, probe)


__all__ = ["DEFAULT_TCP_ATTEMPTS", "DEFAULT_TCP_TIMEOUT", "TcpDevice", "TcpOperations",
           "socket_url"]
