"""Finding the idemlink devices on a framed bus (sans-I/O): who answers at each address, who they
say they are, and two devices sharing one address (issue 22 item 5).

Contract:

- ``FramedScan(addresses, byte_time=..., turnaround=..., nonce=...)`` probes each address in turn
  with an addressed HELLO (seq ``nonce + i``); bytes go out through ``data_to_send()``, come in
  through ``receive_data(data, now)``; ``tick(now)`` fires deadlines and sends;
  ``next_deadline()``; ``done`` once every address was probed; ``next_event()`` hands out each
  address that answered (``FramedReport``) once settled, and ``reports`` keeps them all, in
  probe order. Time is passed in.
- Each HELLO is followed by a listening window: ``hello_window(byte_time, turnaround)`` =
  ``turnaround`` + the HELLO's and a usual HELLO_REPLY's transmission time (``USUAL_REPLY``
  bytes: a line or adapter that hands bytes on only at a frame's end, as the simulated bus does,
  has then delivered it) + ``MARGIN``; once bytes come, the window lasts until the line has been
  quiet for ``quiet(byte_time)`` (an answer does not end it: a second device's answer starts
  within the same window). Everything heard is judged at its end. The scan takes at most
  ``framed_scan_bound(probes, byte_time, turnaround, heard)`` on the clock it is given: one
  window per probe, and for each of the ``heard`` windows in which bytes came, the longest
  HELLO_REPLY's transmission time (``REPLY_BYTES``) and the quiet time more; an address that
  answered anomalously once is probed a second time.
- What a window heard is judged by ``judge``: nothing (absent); exactly one valid HELLO_REPLY
  to this HELLO's number from the probed address whose device info parses, and nothing else
  (``present``, with its identity: device id, map name and hash, boot epoch, name); anything else
  — two replies, bytes that form no valid frame, a reply from another address — is an anomaly.
  The master's own HELLO heard back (an adapter's echo: the exact bytes it sent) is skipped. On
  RS-485 two devices at one address answer together: their frames collide (bytes that decode to
  nothing valid) or follow each other (two replies). An anomaly is probed once more: an anomaly
  again is ``conflict``; a clean answer is ``present`` with the first window's anomaly in
  ``detail`` (noise once); silence then is ``noise``.
- Bounded: a window keeps at most ``MAX_HEARD`` bytes (more is an anomaly).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from idemlink.protocol.frame import (
    MAX_FRAME,
    DecodeError,
    FrameType,
    decode_frames,
    encode_frame,
)
from idemlink.protocol.payloads import DeviceInfo, MalformedDeviceInfo, encode_hello

MARGIN = 0.002
"""Seconds a window waits beyond the line time: a device's own latency."""
REPLY_BYTES = MAX_FRAME + 2
"""The longest HELLO_REPLY on the wire (a frame, COBS overhead and delimiters)."""
MAX_HEARD = 4 * REPLY_BYTES


USUAL_REPLY = 160
"""A HELLO_REPLY's bytes on the wire with names of usual length (the simulator's: 109). A longer
reply on a line that delivers bytes as they come extends its window; on one that delivers whole
frames it needs a longer ``turnaround``."""
HELLO_BYTES = 32
"""An addressed HELLO on the wire, at most (a 14-byte header, the address, 9 bytes of payload,
the CRC, COBS and the delimiters)."""


def hello_window(byte_time: float, turnaround: float) -> float:
    """How long after an addressed HELLO is sent a usual answer has come."""
    return turnaround + (HELLO_BYTES + USUAL_REPLY) * byte_time + MARGIN


def quiet(byte_time: float) -> float:
    """How long the line stays quiet before a window with bytes in it ends."""
    return MARGIN + 10 * byte_time


def framed_scan_bound(probes: int, byte_time: float, turnaround: float,
                      heard: int = 0) -> float:
    """Seconds a scan of ``probes`` HELLOs takes at most on the scanner's clock, bytes having
    come in ``heard`` of their windows (an answer, an echo, noise)."""
    return (probes * hello_window(byte_time, turnaround)
            + heard * (REPLY_BYTES * byte_time + quiet(byte_time)))


@dataclass(slots=True)
class FramedReport:
    address: int
    state: str  #: present, conflict, noise
    identity: dict[str, str] = field(default_factory=dict)
    detail: str = ""


def judge(heard: bytes, sent: bytes, address: int, seq: int) -> tuple[str, dict[str, str], str]:
    """``(verdict, identity, what)`` of a window: ``absent``, ``present`` or ``anomaly``."""
    echo = sent.strip(b"\x00")
    events = decode_frames(heard)
    raw = [p for p in heard.split(b"\x00") if p]
    if echo in raw:  # our own HELLO, echoed: skipped (it is no answer)
        raw.remove(echo)
        events = [e for e in events if not (not isinstance(e, DecodeError)
                                            and e.type is FrameType.HELLO and e.seq == seq)]
    if not raw:
        return "absent", {}, ""
    if len(heard) > MAX_HEARD:
        return "anomaly", {}, f"{len(heard)} bytes heard"
    bad = [e for e in events if isinstance(e, DecodeError)]
    replies = [e for e in events if not isinstance(e, DecodeError)]
    if bad or len(replies) != 1:
        return "anomaly", {}, (f"{len(replies)} replies, {len(bad)} undecodable "
                               f"({', '.join(sorted({e.kind.name for e in bad}))})"
                               if bad else f"{len(replies)} replies")
    f = replies[0]
    if f.type is not FrameType.HELLO_REPLY or f.seq != seq or f.address != address:
        return "anomaly", {}, f"a {f.type.name} seq {f.seq} from address {f.address}"
    try:
        info = DeviceInfo.decode(f.payload)
    except MalformedDeviceInfo as exc:
        return "anomaly", {}, f"a reply that does not parse: {exc}"
    ident = {"device_id": info.device_id or "", "map": info.map_name or "",
             "map_hash": info.map_hash.hex() if info.map_hash else "",
             "epoch": f"{f.epoch:08x}", "name": info.name}
    return "present", {k: v for k, v in ident.items() if v}, ""


class FramedScan:
    """See the module docstring."""

    def __init__(self, addresses: list[int], *, byte_time: float, turnaround: float,
                 contract_hash: bytes, version: int, nonce: int = 1) -> None:
        self._todo: deque[int] = deque(addresses)
        self.window = hello_window(byte_time, turnaround)
        self.quiet = quiet(byte_time)
        self.heard = 0  #: windows in which bytes came
        self._hello = encode_hello(version, contract_hash)
        self._seq = nonce & 0xFFFFFFFF
        self._out = bytearray()
        self._heard = bytearray()
        self._current: int | None = None
        self._sent = b""
        self._deadline: float | None = None
        self._second: str | None = None  #: the first window's anomaly, when probing again
        self.reports: list[FramedReport] = []
        self._new: deque[FramedReport] = deque()
        self.probes = 0

    @property
    def done(self) -> bool:
        return self._current is None and not self._todo

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_deadline(self) -> float | None:
        return self._deadline

    def next_event(self) -> FramedReport | None:
        """The next address settled as present, conflict or noise; None: none yet."""
        return self._new.popleft() if self._new else None

    def _report(self, report: FramedReport) -> None:
        self.reports.append(report)
        self._new.append(report)

    def receive_data(self, data: bytes, now: float) -> None:
        if self._current is None or not data:
            return
        if not self._heard:
            self.heard += 1
        room = MAX_HEARD + 1 - len(self._heard)
        self._heard += data[:max(0, room)]
        if self._deadline is not None:  # the window lasts until the line is quiet
            self._deadline = max(self._deadline, now + self.quiet)

    def tick(self, now: float) -> None:
        if self._deadline is not None and now >= self._deadline:
            self._settle()
        if self._current is None and self._todo:
            self._probe(self._todo.popleft(), now)

    def _probe(self, address: int, now: float) -> None:
        self._current = address
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        self._sent = encode_frame(FrameType.HELLO, self._seq, 0, self._hello, address=address)
        self._out += self._sent
        self._heard.clear()
        self._deadline = now + self.window
        self.probes += 1

    def _settle(self) -> None:
        address = self._current
        assert address is not None
        verdict, ident, what = judge(bytes(self._heard), self._sent, address, self._seq)
        self._current, self._deadline = None, None
        first = self._second
        if first is None:
            if verdict == "present":
                self._report(FramedReport(address, "present", ident))
            elif verdict == "anomaly":
                self._second = what
                self._todo.appendleft(address)  # once more, at once
            return
        self._second = None
        if verdict == "anomaly":
            self._report(FramedReport(address, "conflict", {},
                                             f"{first}; again: {what}"))
        elif verdict == "present":
            self._report(FramedReport(address, "present", ident, f"once: {first}"))
        else:
            self._report(FramedReport(address, "noise", {}, f"once: {first}"))
