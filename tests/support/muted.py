"""A simulated device that runs every request but loses the answers to some (for any shell that
serves a ``SimulatedDevice``, e.g. ``start_pty_sim``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from idemlink.device_sim.device import SimulatedDevice
from idemlink.protocol.frame import Frame, FrameDecoder


class MutedFor(SimulatedDevice):
    """Runs every request; the answers to the requests ``drop(pdu)`` picks are lost, their
    retries' replayed answers too, while ``muted`` is set. ``out`` is set once such a request
    ran."""

    def __init__(self, drop: Callable[[bytes], bool], **kw: Any) -> None:
        super().__init__(**kw)
        self.drop = drop
        self.muted = threading.Event()
        self.muted.set()
        self.out = threading.Event()
        self._dropped: set[int] = set()
        self._seen = 0

    def data_to_send(self) -> bytes:
        for e in self.executions[self._seen:]:
            if self.drop(e.request):
                self._dropped.add(e.seq)
                self.out.set()
        self._seen = len(self.executions)
        data = super().data_to_send()
        if not self.muted.is_set() or not data:
            return data
        decoder = FrameDecoder()
        decoder.receive_data(data)
        return b"".join(f.encode() for f in iter(decoder.next_event, None)
                        if isinstance(f, Frame) and f.seq not in self._dropped)
