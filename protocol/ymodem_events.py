"""What the YMODEM machines tell their shell, and the queues both machines share.

Contract: events are frozen dataclasses, drained in order with ``next_event()`` (None: nothing
more now; ``drain_events(machine)`` loops it); bytes to write are drained with ``data_to_send()``;
``next_deadline()`` is when the shell must call ``tick(now)`` next (None: only on input). The
receiver emits ``FileStarted``, ``FileData``, ``FileCommitted``, ``HeaderRefused``,
``BatchEnded``, ``Aborted``; the sender ``Progress``, ``FileCommitted``, ``FileUnconfirmed``,
``BatchEnded``, ``Aborted``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from idemlink.protocol.ymodem_names import NameRefusal
from idemlink.protocol.ymodem_wire import HeaderRefusal


@dataclass(frozen=True, slots=True)
class FileStarted:
    """Receiver: a header was accepted; the shell opens its temporary file."""

    name: str
    size: int | None
    mtime: int | None
    mode: int | None


@dataclass(frozen=True, slots=True)
class FileData:
    """Receiver: write ``data`` at ``offset`` (never beyond the declared size, never twice)."""

    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class FileCommitted:
    """Receiver: the file is complete; make it visible. Sender: the receiver ACKed the EOT *and*
    asked for the next file ('C'), which it does only after committing. Emitted once per file."""

    name: str
    size: int


@dataclass(frozen=True, slots=True)
class FileUnconfirmed:
    """Sender: the frame ending the file went out (its last block, or an empty file's EOT), but the
    batch ended before the receiver proved the commit (see ``Sender``: the proof of a commit): the receiver
    may or may not have committed it. Reported "not confirmed", never ok."""

    name: str
    size: int


@dataclass(frozen=True, slots=True)
class HeaderRefused:
    """Receiver: block 0 refused (the transfer is then cancelled)."""

    raw_name: bytes
    reason: NameRefusal | HeaderRefusal


@dataclass(frozen=True, slots=True)
class Progress:
    """Sender: ``done`` of ``size`` bytes of ``name`` acknowledged."""

    name: str
    done: int
    size: int


@dataclass(frozen=True, slots=True)
class BatchEnded:
    """The end-of-batch block 0 went through. ``final_ack`` is False when a sender gave up
    waiting for the receiver's last ACK (rb often loses it); every file was already ACKed."""

    final_ack: bool = True


@dataclass(frozen=True, slots=True)
class Aborted:
    """The transfer stopped; an uncommitted file must be discarded."""

    reason: str
    by_peer: bool = False


Event = (FileStarted | FileData | FileCommitted | FileUnconfirmed | HeaderRefused | Progress
         | BatchEnded | Aborted)


class MachineQueues:
    """Output queue, event queue and deadline shared by both machines."""

    def __init__(self) -> None:
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self._deadline: float | None = None

    def data_to_send(self) -> bytes:
        """Drain the bytes to write."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Event | None:
        """The oldest pending event, or None when there is nothing more now."""
        return self._events.popleft() if self._events else None

    def next_deadline(self) -> float | None:
        """When ``tick(now)`` must be called next (None: only when input arrives)."""
        return self._deadline


def drain_events(machine: MachineQueues) -> list[Event]:
    """Every pending event of ``machine``, oldest first (``next_event()`` until None)."""
    evs: list[Event] = []
    while (ev := machine.next_event()) is not None:
        evs.append(ev)
    return evs
