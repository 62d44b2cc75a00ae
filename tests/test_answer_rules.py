"""The answer rules, stated once in ``idemlink.protocol.modbus`` and used by both ends.

- A trigger write that starts nothing means the same through FC06 (the device answers a Modbus
  exception) and through 0x42 (the device answers a ``TriggerStatus`` code): the host classifies
  both to the same outcome and exception, through ``TRIGGER_CODE_EXCEPTION``.
- Errors carry a wire status only when one applies: a failed flash save, a snapshot that does not
  fit, a response or RTU frame that does not parse, a refused register access stand for no status.
"""

from __future__ import annotations

import pytest

from idemlink.protocol.device_core import (
    DeviceCore,
    PersistError,
    RegisterAccessError,
    SnapshotError,
)
from idemlink.protocol.modbus import TRIGGER_CODE_EXCEPTION, BadResponse, IllegalFunction, classify_answer
from idemlink.protocol.modbus_rtu import RtuFrameError
from idemlink.protocol.outcome import (
    MODBUS_EXCEPTION_TABLE,
    Action,
    IdemlinkError,
    LocalProtocolError,
    ModbusException,
    Status,
)
from idemlink.protocol.registers import TriggerStatus

TRIGGER_ADDRESS = 0x0008  # self_clean in the default map


def _both_answers(core: DeviceCore, value: int) -> tuple[bytes, bytes, bytes, bytes]:
    fc06 = bytes([0x06]) + TRIGGER_ADDRESS.to_bytes(2, "big") + value.to_bytes(2, "big")
    fc42 = bytes([0x42]) + fc06[1:]
    return fc06, core.execute(fc06, 0.0), fc42, core.execute(fc42, 0.0)


@pytest.mark.parametrize("code", list(TRIGGER_CODE_EXCEPTION))
def test_fc06_and_0x42_mean_the_same_when_a_trigger_starts_nothing(code: TriggerStatus) -> None:
    core = DeviceCore()
    value = 2 if code is TriggerStatus.ILLEGAL_VALUE else 1
    if code is TriggerStatus.ABNORMAL_STATE:
        core.force_trigger_state("self_clean", 7)
    fc06, answer06, fc42, answer42 = _both_answers(core, value)
    exc = TRIGGER_CODE_EXCEPTION[code]
    assert answer06 == bytes([0x86, exc])
    assert int.from_bytes(answer42[3:5], "big") == code
    expected = (MODBUS_EXCEPTION_TABLE[exc].outcome, None, exc)
    assert classify_answer(fc06, answer06) == expected
    assert classify_answer(fc42, answer42) == expected


@pytest.mark.parametrize("error", [
    PersistError("flash gone"),
    SnapshotError("address 9 is not in the map"),
    BadResponse("cannot parse"),
    RtuFrameError("RTU CRC mismatch"),
    LocalProtocolError("sequence number -1 is outside 0..4294967295"),
], ids=lambda e: type(e).__name__)
def test_an_error_without_a_wire_status_carries_none(error: IdemlinkError) -> None:
    assert error.status is None and error.action is None


def test_a_refused_register_access_carries_its_exceptions_action_not_a_status() -> None:
    err = RegisterAccessError("impossible state", ModbusException.SERVER_DEVICE_FAILURE)
    assert err.status is None and err.action is Action.RECONCILE_FIRST


def test_an_error_that_stands_for_a_status_keeps_it() -> None:
    err = IllegalFunction("function 0x99 not supported", 0x99)
    assert err.status is Status.UNSUPPORTED and err.action is Action.DO_NOT_RETRY
