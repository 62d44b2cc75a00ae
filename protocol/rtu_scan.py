"""Finding the slaves on a Modbus RTU line (sans-I/O): who answers, who they say they are, and
two slaves answering one unit id.

Contract:

- ``BusScan(units, timing=rtu_timing(baud, fmt), turnaround=...)`` probes each unit in turn with
  one cheap read (``probe``: FC03 of one register, address 0 unless given — a map's first
  register); bytes go out through ``data_to_send()``, come in through ``receive_data(data,
  now)``; ``tick(now)`` fires deadlines and sends; ``next_deadline()``; ``done`` once every unit
  was probed; ``next_event()`` hands out each unit that answered (``UnitReport``) once its probe
  is settled, and ``reports`` keeps them all, in unit order. Time is passed in.
- Each request is followed by a fixed listening window, ``unit_wait`` = ``turnaround`` + the
  request's and the longest expected answer's transmission time + t3.5; everything heard in it
  is judged at its end (an early answer does not end it: a second slave's answer would come in
  the same window). The scan of N units therefore takes ``scan_bound(N, ...)`` = N ×
  (``probe_window`` + t3.5) on the clock it is given, plus for each unit that answers one more
  probe-sized window (a confirmation, or the id register's read) and one FC43 window; a driver
  adds its own read latency (a few ms per unit on a busy machine).
- What a window heard is judged by ``judge``: nothing (absent); exactly one CRC-valid frame from
  the unit that answers the request (an exception answer counts: a slave is there) and no other
  byte (``present``); anything else — two answers, bytes that form no CRC-valid frame, an answer
  from another unit id — is an anomaly. On RS-485 two slaves with one unit id answer together:
  their frames collide (CRC-bad bytes) or follow each other (two answers). The unit is probed
  once more: an anomaly again is ``conflict``; a clean answer is ``present`` with the first
  window's anomaly in ``detail`` (noise once); silence then is ``noise``.
- A unit present is asked FC43/14 Read Device Identification (basic objects: VendorName,
  ProductCode, MajorMinorRevision; ``identity``), unless ``identify`` is False; an exception or
  no answer means it offers none (``identity`` empty, ``detail`` says which). When ``id_read``
  is given (the read of a map's id register: all of its words) and no identity came, the words
  that read got are ``id_words`` (every one: a string's text or a u32 spans several) and
  ``id_value`` the first.
- A slave that answers a little late — after its own window, into the next one — is not lost:
  a frame in a window from the unit probed just before (whose own window was silent) that fits
  the probe is that unit's answer: it is ``present``, its ``detail`` saying ``unit N answered
  late (in the next window): raise --turnaround`` (it is not identified), and the frame is no
  anomaly of the window it landed in. The last unit's late answer lands in no window.
- Buffers are bounded: a window keeps at most ``MAX_HEARD`` bytes (more is counted as garbage).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from idemlink.protocol.modbus import EXCEPTION_FLAG, answer_fits
from idemlink.protocol.modbus_rtu import (
    MAX_RTU_FRAME,
    RtuTiming,
    crc16,
    encode_rtu,
    response_frame_length,
)

PROBE = bytes.fromhex("03 0000 0001")  #: FC03, one register at address 0
IDENTIFY = bytes.fromhex("2b 0e 01 00")  #: FC43/14, basic objects from VendorName
MEI = 0x2B
READ_DEVICE_ID = 0x0E
OBJECT_NAMES = {0: "VendorName", 1: "ProductCode", 2: "MajorMinorRevision", 3: "VendorUrl",
                4: "ProductName", 5: "ModelName", 6: "UserApplicationName"}
MAX_HEARD = 2 * MAX_RTU_FRAME

frame_log = logging.getLogger("idemlink.frames")
DEFAULT_TURNAROUND = 0.05
"""Seconds a slave gets to start answering (the Modbus spec leaves it to the device: most answer
within a few ms; 50 ms covers slow PLCs without making a scan of 247 units slow)."""


def unit_wait(timing: RtuTiming, turnaround: float, request: int, answer: int) -> float:
    """The listening window after a request of ``request`` bytes whose longest expected answer
    has ``answer`` bytes."""
    return turnaround + (request + answer) * timing.char_time + timing.t35


def probe_window(timing: RtuTiming, turnaround: float) -> float:
    """The window after a probe (8-byte request, 7-byte answer)."""
    return unit_wait(timing, turnaround, 8, 7)


def scan_bound(units: int, timing: RtuTiming, turnaround: float, answering: int = 0) -> float:
    """Seconds the scan of ``units`` units takes at most on the scanner's clock, ``answering``
    of which answered: each of those adds at most one more window of a probe's size (a
    confirmation, or the id register's read) and one FC43 window (a 256-byte answer)."""
    probe = probe_window(timing, turnaround) + timing.t35
    identify = unit_wait(timing, turnaround, 8, MAX_RTU_FRAME) + timing.t35
    return units * probe + answering * (probe + identify)


@dataclass(slots=True)
class UnitReport:
    unit: int
    state: str  #: ``present``, ``conflict`` or ``noise``
    answer: str = ""  #: what the probe got: ``registers [350]`` or ``exception 0x02``
    identity: dict[str, str] = field(default_factory=dict)
    id_value: int | None = None  #: the id register's first word
    id_words: tuple[int, ...] = ()  #: every word the id register's read got
    detail: str = ""


@dataclass(slots=True)
class Heard:
    """What one window heard (``judge``)."""

    answers: list[bytes]  #: PDUs of CRC-valid frames from the unit that answer the request
    others: list[tuple[int, bytes]]  #: CRC-valid frames that do not (another unit, another shape)
    garbage: int  #: bytes in no CRC-valid frame

    @property
    def silent(self) -> bool:
        return not (self.answers or self.others or self.garbage)

    @property
    def clean(self) -> bool:
        return len(self.answers) == 1 and not self.others and not self.garbage

    def describe(self) -> str:
        parts = []
        if len(self.answers) > 1:
            parts.append(f"{len(self.answers)} answers")
        if self.garbage:
            parts.append(f"{self.garbage} byte(s) in no valid frame (collision or noise)")
        for unit, pdu in self.others:
            parts.append(f"a frame from unit {unit} fc 0x{pdu[0]:02X}" if pdu else "")
        return ", ".join(p for p in parts if p)


def _frame_length(buf: bytes) -> int:
    """The length of the answer frame at the head of ``buf`` (FC43/14 walked object by object),
    or <= 0: not known from what is there."""
    if len(buf) >= 2 and buf[1] == MEI:
        if len(buf) < 8:  # unit, 0x2B, 0x0E, code, conformity, more, next id, count
            return -1
        n, pos = buf[7], 8
        for _ in range(n):
            if pos + 2 > len(buf):
                return -1
            pos += 2 + buf[pos + 1]
        return pos + 2
    return response_frame_length(buf)


def _fits(request: bytes, pdu: bytes) -> bool:
    if request[:1] == bytes([MEI]):
        return pdu[:1] == bytes([MEI | EXCEPTION_FLAG]) or pdu[:2] == bytes([MEI, READ_DEVICE_ID])
    return answer_fits(request, pdu)


def judge(unit: int, request: bytes, heard: bytes) -> Heard:
    """Cut ``heard`` into CRC-valid frames, greedily from the head; a byte that starts none is
    garbage."""
    out = Heard([], [], 0)
    i = 0
    while i < len(heard):
        rest = heard[i:]
        n = _frame_length(rest) if len(rest) >= 4 else -1
        if 4 <= n <= len(rest) and crc16(rest[:n - 2]) == int.from_bytes(rest[n - 2:n], "little"):
            pdu = bytes(rest[1:n - 2])
            if rest[0] == unit and _fits(request, pdu):
                out.answers.append(pdu)
            else:
                out.others.append((rest[0], pdu))
            i += n
        else:
            out.garbage += 1
            i += 1
    return out


def describe_answer(pdu: bytes) -> str:
    if pdu and pdu[0] & EXCEPTION_FLAG:
        return f"exception 0x{pdu[1]:02X}" if len(pdu) > 1 else "exception"
    if len(pdu) >= 2 and pdu[0] in (3, 4):
        regs = [int.from_bytes(pdu[2 + 2 * k:4 + 2 * k], "big") for k in range(pdu[1] // 2)]
        return f"registers {regs}"
    return pdu.hex(" ")


def parse_identity(pdu: bytes) -> dict[str, str]:
    """The objects of an FC43/14 answer PDU, by name (``Object 0x80`` for private ones)."""
    out: dict[str, str] = {}
    if len(pdu) < 7:
        return out
    pos = 7
    for _ in range(pdu[6]):
        if pos + 2 > len(pdu):
            break
        oid, n = pdu[pos], pdu[pos + 1]
        value = pdu[pos + 2:pos + 2 + n].decode("latin-1")
        out[OBJECT_NAMES.get(oid, f"Object 0x{oid:02X}")] = value
        pos += 2 + n
    return out


class BusScan:
    """The scan of one line at one baud rate. See the module docstring."""

    def __init__(self, units: Sequence[int], *, timing: RtuTiming,
                 turnaround: float = DEFAULT_TURNAROUND, probe: bytes = PROBE,
                 identify: bool = True, id_read: bytes | None = None) -> None:
        for u in units:
            if not 1 <= u <= 247:
                raise ValueError(f"unit id {u} outside 1..247")
        if not turnaround > 0:
            raise ValueError("turnaround must be > 0")
        self.units = list(units)
        self.timing = timing
        self.turnaround = turnaround
        self.probe = probe
        self.identify = identify
        self.id_read = id_read
        self.reports: list[UnitReport] = []
        self._events: deque[UnitReport] = deque()
        self.probes = 0  #: probe requests sent
        self._next = 0  #: index of the next unit to start
        self._unit = 0
        self._stage = ""  #: "probe", "confirm", "identify", "id" or "" (between units)
        self._first: Heard | None = None
        self._report: UnitReport | None = None
        self._request = b""
        self._heard = bytearray()
        self._overflow = 0
        self._deadline: float | None = None
        self._pending: tuple[str, bytes] | None = None  #: the unit's next request, after t3.5
        self._silent: int | None = None  #: the unit whose probe window just before was silent
        self._quiet_until = 0.0
        self._out = bytearray()

    @property
    def done(self) -> bool:
        return not self._stage and self._pending is None and self._next >= len(self.units)

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> UnitReport | None:
        """The next unit settled since the last call, or None."""
        return self._events.popleft() if self._events else None

    def next_deadline(self) -> float | None:
        if self._stage:
            return self._deadline
        return None if self.done else self._quiet_until

    def receive_data(self, data: bytes, now: float) -> None:
        if not self._stage:
            return  # between windows: heard by no request (dropped)
        room = MAX_HEARD - len(self._heard)
        self._heard += data[:room]
        self._overflow += max(0, len(data) - room)

    def tick(self, now: float) -> None:
        if self._stage and self._deadline is not None and now >= self._deadline:
            self._judge(now)
        if self._stage or self.done or now < self._quiet_until:
            return
        if self._pending is not None:
            stage, pdu = self._pending
            self._pending = None
            self._send(stage, pdu, now)
            return
        self._unit = self.units[self._next]
        self._next += 1
        self._first, self._report = None, None
        self._send("probe", self.probe, now)

    # ------------------------------------------------------------------------------ internal
    def _send(self, stage: str, pdu: bytes, now: float) -> None:
        frame = encode_rtu(self._unit, pdu)
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("tx RTU scan unit=%d %s: %s", self._unit, stage, frame.hex(" "))
        self._out += frame
        self._stage, self._request = stage, pdu
        self._heard.clear()
        self._overflow = 0
        if stage in ("probe", "confirm"):
            self.probes += 1
        answer = MAX_RTU_FRAME if pdu[:1] == bytes([MEI]) else (
            5 + 2 * int.from_bytes(pdu[3:5], "big") if pdu[:1] in (b"\x03", b"\x04") else 8)
        self._deadline = now + unit_wait(self.timing, self.turnaround, len(frame), answer)

    def _judge(self, now: float) -> None:
        if frame_log.isEnabledFor(logging.DEBUG) and self._heard:
            frame_log.debug("rx RTU scan unit=%d %s: %s", self._unit, self._stage,
                            self._heard.hex(" "))
        heard = judge(self._unit, self._request, bytes(self._heard))
        heard.garbage += self._overflow
        stage = self._stage
        self._stage = ""
        self._quiet_until = now + self.timing.t35
        silent, self._silent = self._silent, None
        late = [(u, p) for u, p in heard.others if u == silent and _fits(self.probe, p)]
        if late:  # the unit before, silent in its own window, answered in this one
            heard.others = [o for o in heard.others if o not in late]
            self._settled(UnitReport(
                late[0][0], "present", describe_answer(late[0][1]),
                detail=f"unit {late[0][0]} answered late (in the next window): raise "
                       "--turnaround"))
        if stage == "probe":
            if heard.silent:
                self._silent = self._unit
                return
            if heard.clean:
                self._present(heard.answers[0], "", now)
            else:
                self._first = heard
                self._pending = ("confirm", self.probe)
        elif stage == "confirm":
            first = self._first.describe() if self._first is not None else ""
            if heard.clean:
                self._present(heard.answers[0], f"first probe: {first}; the second answered "
                                                f"cleanly (noise once?)", now)
            elif heard.silent:
                self._settled(UnitReport(self._unit, "noise",
                                         detail=f"first probe: {first}; then silence"))
            else:
                answer = describe_answer(heard.answers[0]) if heard.answers else ""
                self._settled(UnitReport(
                    self._unit, "conflict", answer,
                    detail=f"two slaves answer this unit id? first probe: {first}; "
                           f"second: {heard.describe()}"))
        elif stage == "identify":
            report = self._report
            assert report is not None
            if heard.answers and heard.answers[0][:1] == bytes([MEI]):
                report.identity = parse_identity(heard.answers[0])
                if not report.identity:
                    report.detail = _join(report.detail, "FC43 identification with no objects")
            else:
                why = (describe_answer(heard.answers[0]) if heard.answers else
                       "no answer" if heard.silent else heard.describe())
                report.detail = _join(report.detail, f"no FC43 identification ({why})")
            self._after_identify(now)
        elif stage == "id":
            report = self._report
            assert report is not None
            if heard.answers and not heard.answers[0][0] & EXCEPTION_FLAG:
                pdu = heard.answers[0]
                data = pdu[2:2 + pdu[1]] if len(pdu) >= 2 else b""
                report.id_words = tuple(int.from_bytes(data[i:i + 2], "big")
                                        for i in range(0, len(data) - 1, 2))
                report.id_value = report.id_words[0] if report.id_words else None
            else:
                report.detail = _join(report.detail, "id register: no value")
            self._finish()

    def _present(self, answer: bytes, detail: str, now: float) -> None:
        self._report = UnitReport(self._unit, "present", describe_answer(answer), detail=detail)
        if self.identify:
            self._pending = ("identify", IDENTIFY)
        else:
            self._after_identify(now)

    def _after_identify(self, now: float) -> None:
        report = self._report
        assert report is not None
        if self.id_read is not None and not report.identity:
            self._pending = ("id", self.id_read)
        else:
            self._finish()

    def _finish(self) -> None:
        assert self._report is not None
        self._settled(self._report)
        self._report = None
        self._stage = ""

    def _settled(self, report: UnitReport) -> None:
        self.reports.append(report)
        self._events.append(report)


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


__all__ = ["DEFAULT_TURNAROUND", "IDENTIFY", "PROBE", "BusScan", "Heard", "UnitReport", "judge",
           "parse_identity", "probe_window", "scan_bound", "unit_wait"]
