"""Outcomes, wire status codes and what the caller should do next.

Every command ends in exactly one of four outcomes:

- ``OK``: executed exactly once; the result is attached (and marked when it was a replay).
- ``NOT_EXECUTED``: definitely did not run (a guard or precondition failed, a conflict, wrong epoch).
- ``REJECTED``: the request itself is invalid; retrying the same request cannot help.
- ``UNKNOWN``: may have run. Reconcile (read back the state) before sending anything else.

Every status code, on the wire or local to the host, declares its outcome and an ``Action``
(safe to retry / do not retry / reconcile first). This table is part of the contract export: the C
header and docs/PROTOCOL.md are generated from it. The contract hash covers the wire codes
(below ``FIRST_LOCAL_STATUS``) and the first four local ones (``HASHED_LOCAL_STATUSES``): a
host-local status added later never travels, so a host that adds one still talks to every device
built before it.

Errors follow the local-versus-remote split: ``LocalProtocolError`` is the caller's misuse of the
API, refused before anything is sent, and never carries a wire status (``status`` is None, so a
handler can tell a local refusal from the device's); ``RemoteProtocolError`` is a peer that sent
something bad, with the status it stands for when one applies. Every error idemlink raises derives
from ``IdemlinkError`` (the tree is in docs/API.md, "Errors"; ``tests/test_errors.py`` keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table


class Outcome(IntEnum):
    """The four outcomes of a command. ``str()`` is the name (``OK``), not the number."""

    def __str__(self) -> str:
        return self.name

    OK = 0
    NOT_EXECUTED = 1
    REJECTED = 2
    UNKNOWN = 3


class Action(IntEnum):
    """What the caller should do after a status."""

    NONE = 0  #: nothing to do: it worked
    SAFE_TO_RETRY = 1  #: it did not run and may run if sent again (same or new sequence number)
    DO_NOT_RETRY = 2  #: sending the same request again cannot help
    RECONCILE_FIRST = 3  #: it may have run: read back the state before anything else


class Status(IntEnum):
    """Status codes. Codes below 0xE0 travel on the wire (the first payload byte of a RESPONSE);
    codes from 0xE0 are the host's own conclusions and never appear on the wire."""

    OK = 0x00
    EPOCH_MISMATCH = 0x10
    IDEMPOTENCY_CONFLICT = 0x11
    GUARD_FAILED = 0x12
    BUSY = 0x13
    AUTHENTICATION_REQUIRED = 0x14
    TOO_OLD = 0x20
    ANSWER_EVICTED = 0x21
    UNSUPPORTED = 0x30
    MALFORMED_REQUEST = 0x31
    PAYLOAD_TOO_LARGE = 0x32
    # Local to the host (never on the wire).
    NO_ANSWER = 0xE0
    LINK_LOST = 0xE1
    EPOCH_CHANGED_IN_FLIGHT = 0xE2
    CANCELLED = 0xE3
    ANSWER_MISMATCH = 0xE4
    BREAKER_OPEN = 0xE5
    BROADCAST_SENT = 0xE6


FIRST_LOCAL_STATUS = 0xE0

HASHED_LOCAL_STATUSES = frozenset({Status.NO_ANSWER, Status.LINK_LOST,
                                   Status.EPOCH_CHANGED_IN_FLIGHT, Status.CANCELLED})
"""The local statuses the contract hash has covered since the first devices were built: kept in
it so those devices keep their hash; a local status added later is not hashed (it never
travels)."""

ADDITIVE_WIRE_STATUSES = frozenset({Status.AUTHENTICATION_REQUIRED})
"""Wire statuses added after the first devices were built (the addressed/authenticated revision):
not hashed (``ContractSection.additive``), because only a device that advertises the AUTH
capability in HELLO_REPLY ever sends one. A host of the first contract that meets one anyway
reads an unknown status, which it takes as UNKNOWN / RECONCILE_FIRST: cautious, never wrong."""


@dataclass(frozen=True, slots=True)
class StatusInfo:
    outcome: Outcome
    action: Action
    meaning: str


STATUS_TABLE: dict[Status, StatusInfo] = {
    Status.OK: StatusInfo(Outcome.OK, Action.NONE, "executed exactly once; result attached"),
    Status.EPOCH_MISMATCH: StatusInfo(
        Outcome.NOT_EXECUTED,
        Action.SAFE_TO_RETRY,
        "request carried another boot epoch; not executed; the answer carries the current epoch",
    ),
    Status.IDEMPOTENCY_CONFLICT: StatusInfo(
        Outcome.NOT_EXECUTED,
        Action.DO_NOT_RETRY,
        "sequence number already used for different content; nothing executed",
    ),
    Status.GUARD_FAILED: StatusInfo(
        Outcome.NOT_EXECUTED,
        Action.DO_NOT_RETRY,
        "a read-only precondition (e.g. generation counter) failed; nothing changed",
    ),
    Status.BUSY: StatusInfo(
        Outcome.NOT_EXECUTED, Action.SAFE_TO_RETRY, "device busy (e.g. in a file transfer)"
    ),
    Status.AUTHENTICATION_REQUIRED: StatusInfo(
        Outcome.NOT_EXECUTED,
        Action.DO_NOT_RETRY,
        "the device is keyed and the request carried no valid MAC; nothing executed "
        "(authenticate the session, then send it)",
    ),
    Status.TOO_OLD: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "sequence number older than the window: an earlier copy may have run",
    ),
    Status.ANSWER_EVICTED: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "ran before, but its answer is no longer kept",
    ),
    Status.UNSUPPORTED: StatusInfo(
        Outcome.REJECTED, Action.DO_NOT_RETRY, "function or frame type not supported"
    ),
    Status.MALFORMED_REQUEST: StatusInfo(
        Outcome.REJECTED, Action.DO_NOT_RETRY, "request payload could not be parsed"
    ),
    Status.PAYLOAD_TOO_LARGE: StatusInfo(
        Outcome.REJECTED, Action.DO_NOT_RETRY, "request payload exceeds the device's limit"
    ),
    Status.NO_ANSWER: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "(host) no valid answer after every attempt: the request may have run",
    ),
    Status.LINK_LOST: StatusInfo(
        Outcome.UNKNOWN, Action.RECONCILE_FIRST, "(host) the port failed while a request was out"
    ),
    Status.EPOCH_CHANGED_IN_FLIGHT: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "(host) the device rebooted while a non-set-only command was in flight",
    ),
    Status.CANCELLED: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "(host) the caller stopped waiting while the request was out: it may still run",
    ),
    Status.ANSWER_MISMATCH: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "(host) an answer came that does not fit the request (a plain Modbus slave echoing "
        "another value): the request may have run",
    ),
    Status.BREAKER_OPEN: StatusInfo(
        Outcome.NOT_EXECUTED,
        Action.SAFE_TO_RETRY,
        "(host) the device on a bus left its last requests unanswered: nothing was sent while "
        "its circuit breaker is open; it is probed again after a cooldown",
    ),
    Status.BROADCAST_SENT: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "(host) a broadcast was sent; nobody answers one: read each device back to know",
    ),
}


class ModbusException(IntEnum):
    """Modbus exception codes carried in an exception PDU (function | 0x80, code)."""

    ILLEGAL_FUNCTION = 0x01
    ILLEGAL_DATA_ADDRESS = 0x02
    ILLEGAL_DATA_VALUE = 0x03
    SERVER_DEVICE_FAILURE = 0x04


MODBUS_EXCEPTION_TABLE: dict[ModbusException, StatusInfo] = {
    ModbusException.ILLEGAL_FUNCTION: StatusInfo(
        Outcome.REJECTED, Action.DO_NOT_RETRY, "function code not supported; nothing changed"
    ),
    ModbusException.ILLEGAL_DATA_ADDRESS: StatusInfo(
        Outcome.REJECTED,
        Action.DO_NOT_RETRY,
        "address unknown or not writable (input register); nothing changed",
    ),
    ModbusException.ILLEGAL_DATA_VALUE: StatusInfo(
        Outcome.REJECTED, Action.DO_NOT_RETRY, "value out of range or bad count; nothing changed"
    ),
    ModbusException.SERVER_DEVICE_FAILURE: StatusInfo(
        Outcome.UNKNOWN,
        Action.RECONCILE_FIRST,
        "the device failed while acting (impossible state): reconcile",
    ),
}


def known_status(code: int) -> Status | None:
    """The ``Status`` for a wire code, or ``None`` for a code this version does not know."""
    try:
        return Status(code)
    except ValueError:
        return None


def status_info(code: int) -> StatusInfo:
    """Look up a status code; an unknown code (a newer peer) is treated as UNKNOWN/reconcile."""
    try:
        return STATUS_TABLE[Status(code)]
    except ValueError:
        return StatusInfo(Outcome.UNKNOWN, Action.RECONCILE_FIRST, f"unknown status 0x{code:02X}")


class IdemlinkError(Exception):
    """Base of every idemlink error. ``status`` is the wire status the error stands for, only when
    one applies (a request the device refused as malformed, a function it does not support; never
    a host-side refusal); ``action`` is what the caller should do: the status's, or given, or None.
    Where callers catch a built-in type, a subclass mixes it in (``PlanError(IdemlinkError,
    ValueError)``, ``UnsafeFlashFileError(IdemlinkError, OSError)``)."""

    def __init__(self, message: str, status: Status | None = None,
                 action: Action | None = None) -> None:
        super().__init__(message)
        self.status = status
        if action is None and status is not None:
            action = STATUS_TABLE[status].action
        self.action = action


class LocalProtocolError(IdemlinkError):
    """The caller misused the API (e.g. a command while an UNKNOWN is unacknowledged), refused
    before anything was sent. It has no wire status (``status`` is None): the device said
    nothing; ``action`` may say what to do."""

    def __init__(self, message: str, *, action: Action | None = None) -> None:
        super().__init__(message, None, action)


class RemoteProtocolError(IdemlinkError):
    """The peer sent something the protocol does not allow."""


def contract_section() -> ContractSection:
    rows = [
        [f"0x{s.value:02X}", s.name, i.outcome.name, i.action.name, i.meaning]
        for s, i in STATUS_TABLE.items()
    ]
    mrows = [
        [f"0x{e.value:02X}", e.name, i.outcome.name, i.action.name, i.meaning]
        for e, i in MODBUS_EXCEPTION_TABLE.items()
    ]
    md = (
        "## Outcomes and status codes\n\n"
        "Every command ends in exactly one outcome: OK, NOT_EXECUTED, REJECTED or UNKNOWN. "
        "Every status code declares its outcome and the action it asks of the caller. "
        f"Codes from 0x{FIRST_LOCAL_STATUS:02X} are the host's own conclusions and never travel "
        "on the wire. A status a peer does not know is treated as UNKNOWN / RECONCILE_FIRST.\n\n"
        + md_table(["code", "name", "outcome", "action", "meaning"], rows)
        + "\n### Modbus exceptions\n\n"
        + md_table(["code", "name", "outcome", "action", "meaning"], mrows)
    )
    return ContractSection(
        name="outcome",
        defines=[CDefine("IDL_FIRST_LOCAL_STATUS", f"0x{FIRST_LOCAL_STATUS:02X}u",
                         "status codes from here are host-local")],
        enums=[
            CEnum("idl_outcome_t", "IDL_OUTCOME", Outcome, "the four outcomes"),
            CEnum("idl_action_t", "IDL_ACTION", Action, "what the caller should do"),
            CEnum("idl_status_t", "IDL_STATUS", Status, "status codes"),
            CEnum("idl_modbus_exc_t", "IDL_MB_EXC", ModbusException, "Modbus exceptions"),
        ],
        markdown=md,
        # A host-local status is the host's own conclusion and never travels: adding one must
        # not make every device built before it incompatible. The hash keeps exactly what it
        # covered when devices were first built (the wire codes and the first four local ones,
        # HASHED_LOCAL_STATUSES); local statuses added since are not hashed.
        data={
            "status": {s.name: [s.value, i.outcome.name, i.action.name]
                       for s, i in STATUS_TABLE.items()
                       if (s < FIRST_LOCAL_STATUS and s not in ADDITIVE_WIRE_STATUSES)
                       or s in HASHED_LOCAL_STATUSES},
            "modbus_exceptions": {e.name: [e.value, i.outcome.name, i.action.name]
                                  for e, i in MODBUS_EXCEPTION_TABLE.items()},
        },
        additive={"status": {s.name: [s.value, i.outcome.name, i.action.name]
                             for s, i in STATUS_TABLE.items() if s in ADDITIVE_WIRE_STATUSES}},
    )
