"""The host driver's typed errors: a port that fails, a device that is not there or not ours, a
handle blocked by an UNKNOWN.

A protocol outcome is never an exception (it is a ``Result``); these are the cases where there is
no outcome to give. Each carries a wire status only when one applies: ``LinkLost`` (requests were
out: they settled as LINK_LOST), ``NoDevice`` (nothing answered: NO_ANSWER; ``AnswersModbusRtu``
when a plain Modbus RTU slave answers instead), ``IncompatibleDevice``
(another protocol or contract: UNSUPPORTED). A port that cannot be opened or fails
(``PortError``: not a misuse of the API, so not a ``LocalProtocolError``) and a blocked handle
(``UnknownOutstanding``: the blocking result carries its own status) carry none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemlink.protocol.outcome import (
    IdemlinkError,
    LocalProtocolError,
    Outcome,
    RemoteProtocolError,
    Status,
)

if TYPE_CHECKING:
    from idemlink.host.command import Result


class PortError(IdemlinkError):
    """The port could not be opened or failed (no wire status: nothing was out)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class PortBusy(PortError):
    """The port is held open by another program (exclusive lock)."""


class LinkLost(PortError):
    """The transport failed while a command was out. ``results`` settles every request of the
    interrupted operation: UNKNOWN (LINK_LOST) for one that was sent — the handle is then blocked
    if it may have had an effect, as for any UNKNOWN — NOT_EXECUTED for one never sent. Empty:
    nothing was out (e.g. HELLO)."""

    def __init__(self, message: str, results: tuple[Result, ...] = ()) -> None:
        IdemlinkError.__init__(self, message, Status.LINK_LOST)
        self.results = results

    @property
    def unknown(self) -> bool:
        """Whether something may have run."""
        return any(r.outcome is Outcome.UNKNOWN for r in self.results)


TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, PortError)
"""What a failing transport raises (``SerialTransport`` turns pyserial's errors into PortError;
other transports may raise OSError, as sockets and file descriptors do)."""


class IncompatibleDevice(RemoteProtocolError):
    """The device speaks another protocol version or another contract."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.UNSUPPORTED)


class NoDevice(RemoteProtocolError):
    """No HELLO_REPLY: nothing idemlink-shaped answers on this port."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.NO_ANSWER)


class AnswersModbusRtu(NoDevice):
    """No idemlink device answered, but a Modbus RTU slave did (one read at unit 1 after the
    HELLOs went unanswered): open the port with ``RtuDevice`` / ``AsyncRtuDevice`` instead."""

    SAYS = "this port answers Modbus RTU, not idemlink"


class BaudrateError(LocalProtocolError, ValueError):
    """A baud rate a line cannot take (outside 1..20,000,000; 0 would hang a real line up):
    refused before the port is opened, as the CLI's ``--baudrate`` refuses it."""


class UnknownOutstanding(LocalProtocolError):
    """A previous command ended UNKNOWN; reconcile and ``acknowledge_unknown()`` first (the
    blocking ``Result`` carries the status; this refusal has none of its own)."""


__all__ = ["TRANSPORT_ERRORS", "AnswersModbusRtu", "BaudrateError", "IncompatibleDevice",
           "LinkLost", "NoDevice", "PortBusy", "PortError", "UnknownOutstanding"]
