"""The sans-I/O YMODEM sender and receiver as a pair over two lossy byte queues, in virtual time:
``Pair(Sender(...), Receiver(...)).run()``, and the oracles a test asks of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from idemlink.protocol.ymodem_events import (
    Aborted,
    FileCommitted,
    FileData,
    FileStarted,
    drain_events,
)
from idemlink.protocol.ymodem_receiver import Receiver
from idemlink.protocol.ymodem_sender import Sender, SendFile
from idemlink.protocol.ymodem_tables import RxState, TxState
from idemlink.protocol.ymodem_wire import EOT

Fault = Callable[[str, int], bytes | int | None]  # (direction, byte) -> delivered: None = lost


@dataclass
class Pair:
    """Sender and receiver over two byte queues with latency, in virtual time."""

    tx: Sender
    rx: Receiver
    latency: float = 0.001
    byte_time: float = 10 / 115200
    fault: Fault | None = None
    byte_by_byte: bool = False
    now: float = 0.0
    lines: dict[str, list[tuple[float, int]]] = field(
        default_factory=lambda: {"tx>rx": [], "rx>tx": []}
    )
    sent: dict[str, bytearray] = field(
        default_factory=lambda: {"tx>rx": bytearray(), "rx>tx": bytearray()}
    )
    busy: dict[str, float] = field(default_factory=lambda: {"tx>rx": 0.0, "rx>tx": 0.0})
    chunks: dict[str, list[bytes]] = field(default_factory=lambda: {"tx>rx": [], "rx>tx": []})
    rx_events: list[object] = field(default_factory=list)
    tx_events: list[object] = field(default_factory=list)

    def _put(self, direction: str, data: bytes) -> None:
        if data:
            self.chunks[direction].append(data)
        t = max(self.now, self.busy[direction])
        for b in data:
            t += self.byte_time
            self.sent[direction].append(b)
            out = self.fault(direction, b) if self.fault else b
            for x in [out] if isinstance(out, int) else (out or b""):
                self.lines[direction].append((t + self.latency, x))
        self.busy[direction] = t

    def _pump(self) -> None:
        self.rx_events += drain_events(self.rx)
        self.tx_events += drain_events(self.tx)
        self._put("rx>tx", self.rx.data_to_send())
        self._put("tx>rx", self.tx.data_to_send())

    def _deliver(self, direction: str, machine: Sender | Receiver) -> None:
        line = self.lines[direction]
        n = 0
        while n < len(line) and line[n][0] <= self.now:
            n += 1
        if not n:
            return
        data = bytes(b for _, b in line[:n])
        del line[:n]
        if self.byte_by_byte:
            for b in data:
                machine.receive_data(bytes([b]), self.now)
        else:
            machine.receive_data(data, self.now)

    def finished(self) -> bool:
        return self.tx.state in (TxState.DONE, TxState.ABORTED) and self.rx.state in (
            RxState.DONE,
            RxState.ABORTED,
        )

    def run(self, until: float = 3000.0) -> Pair:
        self.rx.start(self.now)
        self.tx.start(self.now)
        self._pump()
        while not self.finished() and self.now < until:
            times = [
                t
                for t in (
                    self.tx.next_deadline(),
                    self.rx.next_deadline(),
                    self.lines["tx>rx"][0][0] if self.lines["tx>rx"] else None,
                    self.lines["rx>tx"][0][0] if self.lines["rx>tx"] else None,
                )
                if t is not None
            ]
            if not times:
                break
            self.now = max(self.now, min(times))
            self._deliver("tx>rx", self.rx)
            self._deliver("rx>tx", self.tx)
            self.rx.tick(self.now)
            self.tx.tick(self.now)
            self._pump()
        return self

    # oracles

    def received(self) -> dict[str, bytes]:
        """Files as a careful sink would expose them: only committed ones, rebuilt from FileData
        (asserting every offset is written exactly once, in order)."""
        out: dict[str, bytes] = {}
        cur: bytearray | None = None
        for ev in self.rx_events:
            if isinstance(ev, FileStarted):
                cur = bytearray()
            elif isinstance(ev, FileData):
                assert cur is not None and ev.offset == len(cur), "data delivered twice or gapped"
                cur += ev.data
            elif isinstance(ev, FileCommitted):
                assert cur is not None
                assert ev.name not in out, f"{ev.name} committed twice"
                out[ev.name] = bytes(cur)
                cur = None
            elif isinstance(ev, Aborted):
                cur = None
        return out

    def eots_sent(self) -> int:
        return self.chunks["tx>rx"].count(bytes([EOT]))

    def count(self, events: list[object], kind: type) -> int:
        return sum(isinstance(e, kind) for e in events)


def files_of(spec: dict[str, bytes]) -> list[SendFile]:
    return [SendFile.from_bytes(n, d, mtime=0o1234567, mode=0o640) for n, d in spec.items()]
