"""A plain Modbus RTU slave's part of the operations: the probe and what it cannot carry.

``RtuOperations`` is ``idemlink.host.operations.Operations`` over the sans-I/O RTU master
``idemlink.protocol.rtu_master.RtuMaster``: the same operation generators as an idemlink device's
(the pipeline, one request at a time here; the rule that an UNKNOWN which may have had an effect
blocks the handle; the read-back), so ``RtuDevice`` and ``AsyncRtuDevice`` hold no rule of their
own. What may be retried and how a trigger travels (its state read first, then an FC06 write of
1 only in IDLE; ``Result.code`` ACCEPTED / RUNNING / DONE as the framed TRIGGER function answers)
is the master's.

Contract:

- ``connect_steps``: read the map's first register; no answer at the unit is ``NoDevice`` (an
  exception answer, or an answer that does not fit, is a slave too). A plain slave cannot say
  which map it serves: the map given is taken at its word.
- ``refuse_unsupported``: the idemlink-only functions (conditional write, file hand-over,
  FILE_INFO) are refused before anything of the operation is sent (``LocalProtocolError``,
  ``RtuMaster.check``).
- No numbers: ``execute_recorded`` records the PDU only, and a reconcile can only read back what
  holds now (``Reconciliation.executed`` stays None: a plain slave keeps no record).
- ``answers_modbus_rtu_steps``: whether a Modbus RTU slave answers one read at unit 1, for the
  framed driver's "this port answers Modbus RTU" (``FramedOperations.open_steps``).
"""

from __future__ import annotations

from idemlink.host.command import Command, CommandBuilder
from idemlink.host.errors import NoDevice
from idemlink.host.operations import Clock, Operations, Steps
from idemlink.protocol.char_format import MODBUS_CHAR_FORMAT, CharFormat
from idemlink.protocol.outcome import Status
from idemlink.protocol.registers import RegisterMap, Space
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.protocol.rtu_master import RtuMaster


class RtuOperations(Operations[RtuMaster]):
    """The operations on one Modbus RTU slave (``RtuMaster``). See the module docstring."""

    slave = "Modbus RTU slave"  #: what ``connect_steps`` says did not answer (Modbus TCP: its own)

    def __init__(self, clock: Clock, *, regmap: RegisterMap = DEFAULT_MAP, unit: int = 1,
                 baudrate: int | None = None, timeout: float = 0.2, attempts: int = 5,
                 char_format: CharFormat = MODBUS_CHAR_FORMAT) -> None:
        super().__init__(clock, RtuMaster(regmap, unit=unit, baudrate=baudrate, timeout=timeout,
                                          attempts=attempts, char_format=char_format), regmap)

    def connect_steps(self) -> Steps[None]:
        """Read the map's first register; ``NoDevice`` if nothing answers at the unit."""
        first = self.regmap.registers[0]
        (r,) = yield from self.wave_steps([probe_command(self.regmap)])
        if r.status is Status.NO_ANSWER:
            raise NoDevice(f"no {self.slave} answered at unit {self.session.unit} "
                           f"({r.attempts} read(s) of {first.name} got no answer)")

    def refuse_unsupported(self, c: Command) -> None:
        self.session.check(c.pdu())


def probe_command(regmap: RegisterMap) -> Command:
    """The read that asks whether a slave answers: the map's first register read with its own
    function — FC04 for an input register, FC03 for the others (every slave answers it, an
    exception included) — or FC01/FC02 of its first coil or discrete input when the map has no
    register. A device that serves only input registers may not answer an FC03 at all."""
    registers = [s for s in regmap.registers if s.space is Space.REGISTERS]
    first = registers[0] if registers else regmap.registers[0]
    return CommandBuilder(regmap).read_command(first.name, 1)


def answers_modbus_rtu_steps(clock: Clock, regmap: RegisterMap, timeout: float) -> Steps[bool]:
    """Whether a Modbus RTU slave answers at unit 1 (one read of the map's first register; an
    exception answer, or one that does not fit, counts)."""
    probe = RtuOperations(clock, regmap=regmap, unit=1, timeout=timeout, attempts=1)
    try:
        yield from probe.connect_steps()
    except NoDevice:
        return False
    return True


__all__ = ["RtuOperations", "answers_modbus_rtu_steps", "probe_command"]
