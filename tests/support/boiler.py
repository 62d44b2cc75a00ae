"""A third-party boiler controller served by pymodbus's own server (serial RTU or Modbus TCP):
its map (``MAP``: signed temperatures, a float32 energy counter in little-word order, a u32
run-hours counter, a serial-number string, a plain fault word, a holding set-point, a packed
control word with bit fields written by FC22, a u32 limit, a purge command register that returns
to 0, coils and a discrete input — and no generation register), its layout made with pymodbus's
own converters (``to_regs``/``from_regs``, never idemlink's codec), and ``Boiler``, the device
with its ground truth (``writes``, ``log``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from support.pymodbus_serial import BackgroundSerialServer, BackgroundTcpServer

MAP = """\
name = "acme-boiler"
description = "A third-party boiler controller: no generation register"
mask_write = true                   # the controller implements FC22 (mask write register)

[[registers]]
address = 0
name = "flow_temperature"
kind = "input"
type = "i16"
scale = 0.1
unit = "°C"

[[registers]]
address = 1
name = "outdoor_temperature"
kind = "input"
type = "i16"
scale = 0.1
unit = "°C"

[[registers]]
address = 2
name = "energy"
kind = "input"
type = "f32"
word_order = "little"
unit = "kWh"

[[registers]]
address = 4
name = "run_hours"
kind = "input"
type = "u32"
word_order = "big"
unit = "h"

[[registers]]
address = 6
name = "serial_number"
kind = "input"
type = "string"
length = 5

[[registers]]
address = 11
name = "fault_code"
kind = "input"
description = "the controller's own fault word (read-only, not write-1-to-clear)"

[[registers]]
address = 0x100
name = "setpoint"
kind = "holding"
type = "i16"
scale = 0.1
unit = "°C"
min = -200
max = 800
default = 450

[[registers]]
address = 0x101
name = "control"
kind = "holding"
fields = [
    { name = "heating", bit = 0 },
    { name = "hot_water", bit = 1 },
    { name = "stage", bit = 4, width = 2, labels = { off = 0, low = 1, high = 2 } },
]

[[registers]]
address = 0x102
name = "energy_limit"
kind = "holding"
type = "u32"
word_order = "little"
unit = "Wh"

[[registers]]
address = 0x104
name = "purge"
kind = "command"
max = 1
description = "write 1: purge the burner once; reads 1 while it runs, 0 when done"

[[registers]]
address = 0
name = "pump"
kind = "coil"
labels = { off = 0, on = 1 }

[[registers]]
address = 1
name = "alarm_relay"
kind = "coil"

[[registers]]
address = 0
name = "flame"
kind = "discrete_input"
"""

INPUTS, HOLDINGS, PURGE = 0, 0x100, 0x104
FC22, FC05, FC15, FC06, FC16 = 22, 5, 15, 6, 16


def to_regs(value: Any, kind: str, word_order: str = "big") -> list[int]:
    from pymodbus.client.mixin import ModbusClientMixin as M

    return list(M.convert_to_registers(value, getattr(M.DATATYPE, kind), word_order=word_order))


def from_regs(regs: list[int], kind: str, word_order: str = "big") -> Any:
    from pymodbus.client.mixin import ModbusClientMixin as M

    return M.convert_from_registers(regs, getattr(M.DATATYPE, kind), word_order=word_order)


class Boiler:
    """The controller: a pymodbus RTU server (unit 1) with four separate tables, laid out with
    pymodbus's own converters. ``writes`` logs (function, address, values) of every write it
    executed; ``drop(frame)`` loses an answer (the write still ran).

    The purge register (``PURGE``) is the controller's own behaviour, in pymodbus's datastore
    action: 1 written while it reads 0 starts a purge (``log`` gets ``("start", 1)``), the
    register reads 1 while the purge runs and 0 once it is done (``finish()``: ``log`` gets
    ``("done", 1)``); a write while it runs starts nothing and leaves
    it at 1 (pymodbus echoes the stored value); a value above 1 is exception 03. ``log`` is the
    ground truth of what the burner did."""

    def __init__(self, path: str | None, drop: Callable[[bytes], bool] = lambda frame: False,
                 ) -> None:
        """Served on the serial port ``path``, or over Modbus TCP on 127.0.0.1 (``path`` None:
        ``address`` says where). ``drop`` sees an answer as an RTU frame would
        start (unit, function, ...): over TCP the MBAP header's first six bytes are left out.
        ``requests`` counts the requests pymodbus executed (reads too)."""
        from pymodbus.constants import ExcCodes
        from pymodbus.simulator import DataType, SimData, SimDevice

        self.writes: list[tuple[int, int, list[Any]]] = []
        self.log: list[tuple[str, int]] = []
        self.requests = 0
        self._holdings: list[int] = []
        self._at = 0
        inputs = (to_regs(-50, "INT16") + to_regs(-123, "INT16")
                  + to_regs(1234.5, "FLOAT32", "little") + to_regs(70000, "UINT32")
                  + to_regs("AB-1234567", "STRING") + [0x0042])
        holdings = [*to_regs(450, "INT16"), 0x0011, *to_regs(100000, "UINT32", "little"), 0]

        def done() -> None:  # nothing before the first purge write: nothing runs
            if self._holdings and self._holdings[self._at]:
                self.log.append(("done", self._holdings[self._at]))
                self._holdings[self._at] = 0

        async def action(fc: int, start: int, address: int, count: int, current: list[int],
                         set_values: list[Any] | None) -> Any:
            self.requests += 1
            if set_values is None:
                return None
            if fc in (FC06, FC16) and address <= PURGE < address + count:
                self._holdings, self._at = current, PURGE - start
                i, running = PURGE - address, current[PURGE - start]
                if set_values[i] > 1:
                    return ExcCodes.ILLEGAL_VALUE
                if running:
                    set_values[i] = running  # accepted, starts nothing
                elif set_values[i]:
                    self.log.append(("start", set_values[i]))
            self.writes.append((fc, address, list(set_values)))
            return None

        skip = 0 if path is not None else 6  # MBAP: transaction, protocol, length

        def trace(sending: bool, frame: bytes) -> bytes:
            return b"" if sending and drop(frame[skip:]) else frame

        self._done = done
        device = SimDevice(1, simdata=(
            [SimData(0, values=[True, False], datatype=DataType.BITS)],
            [SimData(0, values=[True], datatype=DataType.BITS)],
            [SimData(HOLDINGS, values=holdings, datatype=DataType.REGISTERS)],
            [SimData(INPUTS, values=inputs, datatype=DataType.REGISTERS)]), action=action)
        self.background: BackgroundSerialServer | BackgroundTcpServer = (
            BackgroundSerialServer(device, path, trace) if path is not None
            else BackgroundTcpServer(device, trace))

    @property
    def address(self) -> str:
        """Where the Modbus TCP boiler listens (``HOST:PORT``)."""
        assert isinstance(self.background, BackgroundTcpServer)
        return self.background.address

    @property
    def starts(self) -> int:
        return sum(1 for what, _ in self.log if what == "start")

    def finish(self) -> None:
        """The running purge is done: the register returns to 0 (on the server's own loop)."""
        async def now() -> None:
            self._done()

        asyncio.run_coroutine_threadsafe(now(), self.background.loop).result(5)

    def close(self) -> None:
        self.background.close()


#: ``read --all`` of the boiler as it starts (whitespace collapsed): every type the map has.
READOUT = [
    "flow_temperature = -5.0 °C (raw 0xFFCE)",
    "outdoor_temperature = -12.3 °C (raw 0xFF85)",
    "energy = 1234.5 kWh (raw 0x449A5000)",
    "run_hours = 70000 h",
    "serial_number = AB-1234567",
    "fault_code = 66",
    "setpoint = 45.0 °C (raw 0x01C2)",
    "control = 0x0011 heating=1 hot_water=0 stage=low",
    "energy_limit = 100000 Wh",
    "purge = 0",
    "pump = on (1)",
    "alarm_relay = 0",
    "flame = 1",
]
