"""The host side of the framed protocol, sans-I/O: requests in, retries, exactly one outcome out.

``HostSession`` never touches a port or a clock: the shell calls ``receive_data(bytes, now)``,
``tick(now)``, sends ``data_to_send()``, drains ``next_event()`` until ``None`` and sleeps until
``next_deadline()`` (the shape of docs/ARCHITECTURE.md, "The sans-I/O shape"). Every submitted
request ends in exactly one ``Completion`` carrying one of the four outcomes; events wait, in the
order they happened, until taken.

Rules (each tested):

- A retry resends the *same* sequence number and content with the RETRANSMIT flag, so the device
  can replay the first answer instead of running the command again.
- Up to ``max_inflight`` requests are outstanding (never more than the device advertised), and a new
  number is not taken while it would run ``min(replay_slots, window)`` or more ahead of the oldest
  outstanding one: the device can then still replay the oldest one's answer when its retry arrives
  (otherwise a lost answer in a busy pipeline would come back ANSWER_EVICTED, i.e. UNKNOWN).
- A request larger than the device's ``max_payload`` (HELLO_REPLY) is never sent: it settles
  NOT_EXECUTED (no status; ``detail`` says why) when its turn comes.
- Answers are matched by sequence number *and* the epoch the request was sent in, and must fit the
  request (``idemlink.protocol.modbus.answer_fits``: same function, the echo a write answers
  with, the byte count a read asked for). An answer for a number that is not outstanding (late,
  duplicated, from a previous epoch) or that does not fit (another host process's request under
  the same number) is counted and dropped — it is never taken for another request's answer.
- Boot epoch change (an EPOCH_MISMATCH answer to an outstanding request, carrying a new epoch and
  naming the epoch the refused request carried; one answering nothing outstanding, or naming another
  epoch than the request's, is a late answer like any other): every outstanding request sent
  in the old epoch is settled at once — a *set-only* command (absolute writes, harmless to repeat) is
  re-issued in the new epoch; any other becomes UNKNOWN
  (EPOCH_CHANGED_IN_FLIGHT), because a copy may have run before the reboot. Nothing more goes out
  before a new HELLO brings the new boot's numbers: a number the host picked itself could later be
  handed to another process, whose request would then collide with a delayed frame of ours. While
  that handshake goes unanswered, what waits is settled after each ``hello_attempts`` HELLOs (a
  re-issue UNKNOWN, EPOCH_CHANGED_IN_FLIGHT; never sent NOT_EXECUTED) and the HELLOs go on.
- No valid answer after ``attempts`` sends → UNKNOWN (NO_ANSWER).
- An OK answer is refined from its PDU by ``idemlink.protocol.modbus.classify_answer``: a Modbus
  exception is REJECTED (or UNKNOWN for SERVER_DEVICE_FAILURE); a failed guard is NOT_EXECUTED; a
  TRIGGER code of ILLEGAL_VALUE or ABNORMAL_STATE is classified like the exception FC06 would have
  answered (03 → REJECTED, 04 → UNKNOWN); a TRIGGER code the contract does not define
  (``TriggerStatus``) is UNKNOWN.
- A HELLO_REPLY whose payload does not parse fails the handshake as *incompatible* (something
  answered, not in our layout), with a one-line reason.
- A request may be *pinned* to the number ``next_number()`` promised (``submit(..., number=)``), so
  a journal can record (epoch, seq, PDU) before the request leaves: if by the time it would go out
  the session would give it another number (an epoch change, a handshake since), it is never sent
  and settles NOT_EXECUTED (no status). A pinned request is never re-issued under a new number.
- ``resend(pdu, number)`` sends again, under its original (epoch, seq) and with the RETRANSMIT
  flag, a request whose answer never came (this session's or a dead process's, from its journal),
  in the device's current epoch only: the device replays the stored answer or says
  ANSWER_EVICTED (it ran), IDEMPOTENCY_CONFLICT (another request holds that number: this one
  never ran under it), TOO_OLD (cannot tell), or runs it now (it never arrived) — evidence from
  the device itself (``idemlink.host.evidence``).
- A re-handshake (after an epoch change) answered by another device (another id or map: a board
  swapped on the line) closes the session (``gone`` says why, ``HelloFailed`` with
  ``incompatible``): what waited for a number settles (a re-issue UNKNOWN, never sent
  NOT_EXECUTED) and nothing more is sent until ``open()``: requests meant for one board never run
  on another, and a journal never receipts one board's step under the other's id.
- ``abandon(status)`` settles everything the session holds when the shell gives up (the port failed,
  the caller was cancelled): a request that was sent becomes UNKNOWN with that status, one never sent
  NOT_EXECUTED; ``abandon(status, tags)`` does the same for those requests only (one caller of a
  shared pipeline was cancelled), the others go on. ``open()`` refuses while anything is
  outstanding: a new handshake must not hand out numbers that requests still in flight carry.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from idemlink.protocol.auth import HostAuth, epoch_hint
from idemlink.protocol.frame import (
    PROTOCOL_VERSION,
    DecodeError,
    DecodeErrorKind,
    Direction,
    Flags,
    Frame,
    FrameDecoder,
    FrameType,
    check_address,
    encode_frame,
)
from idemlink.protocol.modbus import answer_fits, classify_answer, exception_code, exception_name
from idemlink.protocol.outcome import (
    LocalProtocolError,
    ModbusException,
    Outcome,
    Status,
    known_status,
    status_info,
)
from idemlink.protocol.payloads import (
    Capability,
    DeviceInfo,
    MalformedDeviceInfo,
    decode_response_payload,
    encode_hello,
    printable,
)


def status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"0x{code:02x}"


#: Frame-level trace (direction, type, epoch, seq, function, status, retry/replay flags) at DEBUG:
#: ``idemlink -v -v`` or ``logging.getLogger("idemlink.frames").setLevel(logging.DEBUG)``.
frame_log = logging.getLogger("idemlink.frames")

SEQ_MASK = 0xFFFFFFFF


def oversize(pdu: bytes, info: DeviceInfo | None) -> str | None:
    """Why ``pdu`` is never sent to the device that said ``info``: larger than its HELLO_REPLY's
    ``max_payload`` (None when it fits, or before HELLO). The one rule for a session's requests
    and a bus's broadcast."""
    if info is None or len(pdu) <= info.max_payload:
        return None
    return (f"a {len(pdu)}-byte request; the device takes at most {info.max_payload} (its "
            "HELLO_REPLY's max_payload): not sent")


@dataclass(slots=True)
class Completion:
    """The one and only result of a submitted request."""

    tag: Any
    outcome: Outcome
    status: Status | None
    exception: ModbusException | None = None
    pdu: bytes = b""
    replay: bool = False
    attempts: int = 0
    reissued: int = 0
    seq: int = 0
    epoch: int = 0
    sent_as: tuple[tuple[int, int], ...] = ()  #: every (epoch, seq) this request travelled under
    answered: bool = False  #: the device answered it with a PDU (ran now, or replayed)
    detail: str = ""  #: what the status alone does not say (e.g. an answer that did not fit)
    exception_code: int | None = None  #: the exception code as sent, 01-04 or any other


@dataclass(slots=True)
class SessionOpened:
    info: DeviceInfo
    epoch: int


@dataclass(slots=True)
class HelloFailed:
    reason: str
    incompatible: bool = False  #: something answered that we cannot talk to (another frame
    #: version, or a HELLO_REPLY that does not parse)


Event = Completion | SessionOpened | HelloFailed


class SessionState(Enum):
    CLOSED = "closed"
    HELLO_SENT = "hello_sent"
    OPEN = "open"


@dataclass(slots=True)
class _Pending:
    tag: Any
    pdu: bytes
    set_only: bool
    number: tuple[int, int] | None = None  #: pinned (epoch, seq): sent under it or never
    seq: int = 0
    epoch: int = 0
    attempts: int = 0
    deadline: float = 0.0
    reissued: int = 0
    sent_as: list[tuple[int, int]] = field(default_factory=list)


@dataclass(slots=True)
class HostCounters:
    sent: int = 0
    retries: int = 0
    replays: int = 0
    reissued: int = 0
    late_answers: int = 0
    mismatched_answers: int = 0  #: OK answers under our number that do not fit our request
    decode_errors: int = 0
    #: frames of another address (other devices' answers on a shared bus), or tagged frames
    other_address: int = 0
    #: a keyed host: frames without a tag that verifies under the session key (refused)
    unauthenticated: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


class HostSession:
    """Request tracker for one device. See the module docstring for the rules."""

    def __init__(
        self,
        *,
        contract_hash: bytes,
        timeout: float = 0.2,
        attempts: int = 5,
        max_inflight: int = 8,
        hello_attempts: int = 5,
        hello_nonce: int = 0,
        address: int | None = None,
        auth: HostAuth | None = None,
    ) -> None:
        if attempts < 1 or max_inflight < 1:
            raise ValueError("attempts and max_inflight must be >= 1")
        #: the device's bus address: every frame is sent ADDRESSED to it and only its answers
        #: are taken (None: point to point, the first contract's frames)
        self.address = None if address is None else check_address(address)
        self.contract_hash = contract_hash
        self.timeout = timeout
        self.attempts = attempts
        self.want_inflight = max_inflight
        self.max_inflight = max_inflight
        self.hello_attempts = hello_attempts
        self.state = SessionState.CLOSED
        self._rehandshake = False  #: HELLO_SENT after an epoch change (the session stays usable)
        self.info: DeviceInfo | None = None
        self.epoch = 0
        self._next_seq = 1
        # HELLO numbers start at a shell-chosen nonce, so a stale HELLO_REPLY left on the line by
        # another process's handshake is not taken for ours (it would bring an old next_seq).
        self._hello_seq = hello_nonce & SEQ_MASK
        self._hello_sent = 0
        self._hello_deadline = 0.0
        self._decoder = FrameDecoder()
        self._foreign_version: str | None = None
        self._out = bytearray()
        self._inflight: dict[int, _Pending] = {}
        self._earliest: float | None = None  #: cached earliest in-flight deadline (None: stale)
        self._queue: deque[_Pending] = deque()
        self._events: deque[Event] = deque()
        self.counters = HostCounters()
        #: why the session closed itself: another device answered a re-handshake (None: it did
        #: not); requests submitted meanwhile settle NOT_EXECUTED, never sent
        self.gone: str | None = None
        #: a keyed host (``idemlink.protocol.auth``): takes only signed frames, signs its own
        self.auth = auth
        self._auth_refusal: str | None = None  #: why the last HELLO_REPLY was refused
        #: a keyed host's re-key probe is out: one fresh HELLO sent while the session stays OPEN
        #: (``_probe_hello``); its reply, if it comes, opens the new session
        self._probing = False

    # ------------------------------------------------------------------ shell-facing interface
    def open(self, now: float) -> None:
        """Start (or restart) the HELLO handshake. Refused while requests are outstanding: the
        handshake brings the device's idea of the next number, which in-flight requests may
        already carry (``abandon`` them first)."""
        if self.outstanding:
            raise LocalProtocolError(
                f"open() with {self.outstanding} request(s) outstanding: abandon() them first")
        self.state = SessionState.HELLO_SENT
        self._rehandshake = False
        self._probing = False
        self.gone = None
        self._auth_refusal = None
        self._hello_sent = 0
        self._hello_seq = (self._hello_seq + 1) & SEQ_MASK
        self._send_hello(now)

    def submit(self, pdu: bytes, now: float, *, set_only: bool, tag: Any = None,
               number: tuple[int, int] | None = None) -> None:
        """Queue a request; it is sent as soon as a pipelining slot is free. With ``number`` (the
        (epoch, seq) ``next_number()`` gave) it is sent under that number or not at all: given
        another, it settles NOT_EXECUTED without being sent."""
        self._queue.append(_Pending(tag, pdu, set_only and number is None, number))
        if self.gone is not None:  # the device changed: never sent, to this one or another
            self._settle_queue()
        self._pump(now)

    def next_number(self) -> tuple[int, int] | None:
        """The (epoch, seq) the next submitted request will travel under, when that is certain:
        the session is open and holds nothing (else None). Record it, then ``submit`` with
        ``number=`` it."""
        if self.state is not SessionState.OPEN or self.outstanding:
            return None
        return self.epoch, self._next_seq

    def queued_number(self) -> tuple[int, int] | None:
        """The (epoch, seq) a request submitted now will travel under if every request queued
        before it leaves as queued — also while others are outstanding (None: the session is not
        open). Record it, then ``submit`` with ``number=`` it: should it turn out otherwise (an
        earlier queued request dropped, a reboot learnt), the request settles NOT_EXECUTED
        without being sent, so a recorded number is never one it travelled under by mistake."""
        if self.state is not SessionState.OPEN:
            return None
        return self.epoch, (self._next_seq + len(self._queue)) & SEQ_MASK

    def resend(self, pdu: bytes, number: tuple[int, int], now: float, *, tag: Any = None) -> None:
        """Send ``pdu`` again under its original ``number`` (epoch, seq), with the RETRANSMIT
        flag, and settle it like any request (retries, then UNKNOWN NO_ANSWER). Only in the
        device's current epoch and while the session holds nothing else (``LocalProtocolError``
        otherwise): another epoch's number would only be refused."""
        epoch, seq = number
        if self.state is not SessionState.OPEN or self.outstanding:
            raise LocalProtocolError("resend() needs an open session holding nothing else")
        if epoch != self.epoch or not 0 <= seq <= SEQ_MASK:
            raise LocalProtocolError(
                f"resend() of epoch {epoch:#010x} seq {seq}: the device is in epoch "
                f"{self.epoch:#010x}; a number of another boot cannot be asked about")
        p = _Pending(tag, pdu, False, number, seq=seq, epoch=epoch)
        p.sent_as.append(number)
        self._inflight[seq] = p
        self._transmit(p, now, retransmit=True)

    def abandon(self, status: Status, tags: Collection[Any] | None = None) -> None:
        """Settle every request the session holds, because the shell stops driving it (``status``:
        LINK_LOST, CANCELLED) — with ``tags``, only the requests submitted under those tags (one
        caller of a shared pipeline gave up; the others go on). A request that went out may still
        run: UNKNOWN with ``status``; its answer, should it come, is a late answer like any other.
        One never sent: NOT_EXECUTED. One queued for re-issue after an epoch change went out in
        the old epoch: UNKNOWN."""
        for p in sorted(self._inflight.values(), key=lambda q: q.seq):
            if tags is None or p.tag in tags:
                self._finish(p, Outcome.UNKNOWN, status)
        queue, kept = self._queue, deque[_Pending]()
        self._queue = kept
        while queue:
            p = queue.popleft()
            if tags is not None and p.tag not in tags:
                kept.append(p)
                continue
            outcome = Outcome.UNKNOWN if p.sent_as else Outcome.NOT_EXECUTED
            self.counters.outcomes[outcome.name] += 1
            self._events.append(Completion(
                p.tag, outcome, status if p.sent_as else None, attempts=p.attempts,
                reissued=p.reissued, seq=p.seq, epoch=p.epoch, sent_as=tuple(p.sent_as)))

    def resync(self) -> None:
        """Forget any partial frame (after the port carried another protocol, e.g. YMODEM)."""
        self._decoder.reset()

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Event | None:
        """The oldest event not yet taken (``Completion``, ``SessionOpened``, ``HelloFailed``), or
        None: nothing more until more bytes or time come in."""
        events = self._events
        return events.popleft() if events else None

    @property
    def outstanding(self) -> int:
        return len(self._inflight) + len(self._queue)

    def next_deadline(self) -> float | None:
        if self.state is SessionState.HELLO_SENT:
            return self._hello_deadline
        return self._earliest_deadline()

    def _earliest_deadline(self) -> float | None:
        """The earliest deadline of a request in flight, cached until one changes: the shell
        asks every I/O round, which on a byte-paced line is several times per answer."""
        if not self._inflight:
            return None
        if self._earliest is None:
            self._earliest = min(p.deadline for p in self._inflight.values())
        return self._earliest

    def receive_data(self, data: bytes, now: float) -> None:
        self._decoder.receive_data(data)
        while (ev := self._decoder.next_event()) is not None:
            if isinstance(ev, DecodeError):
                if frame_log.isEnabledFor(logging.DEBUG):
                    frame_log.debug("rx undecodable frame: %s", ev.kind.name)
                self.counters.decode_errors += 1
                if ev.kind is DecodeErrorKind.UNKNOWN_VERSION:
                    self._foreign_version = ev.detail
            elif ev.address != self.address or (ev.tag is not None and self.auth is None):
                self.counters.other_address += 1  # another device's on a bus, or keyed
            elif self.auth is not None and ev.type is not FrameType.HELLO_REPLY and not (
                    self.auth.verify(ev) or epoch_hint(ev, self.epoch)):
                self.counters.unauthenticated += 1  # no downgrade: unsigned or forged
            elif ev.type is FrameType.RESPONSE:
                self._on_response(ev, now)
            elif ev.type is FrameType.HELLO_REPLY:
                self._on_hello_reply(ev, now)
            else:
                self.counters.late_answers += 1
        self._pump(now)

    def tick(self, now: float) -> None:
        if self.state is SessionState.HELLO_SENT and now >= self._hello_deadline:
            if self._hello_sent >= self.hello_attempts and self._rehandshake:
                self._settle_queue()
                self._hello_sent = 0
                self._send_hello(now)
            elif self._hello_sent >= self.hello_attempts:
                self.state = SessionState.CLOSED
                if self._auth_refusal is not None:
                    self._events.append(HelloFailed(self._auth_refusal, incompatible=True))
                elif self._foreign_version is not None:
                    self._events.append(HelloFailed(
                        f"the device answers in another protocol {self._foreign_version} "
                        f"(we speak version {PROTOCOL_VERSION})", incompatible=True))
                else:
                    self._events.append(
                        HelloFailed(f"no HELLO_REPLY after {self._hello_sent} attempts"))
            else:
                self._send_hello(now)
        earliest = self._earliest_deadline()
        due = [] if earliest is None or now < earliest else [
            p for p in self._inflight.values() if now >= p.deadline]
        unanswered = False
        for p in due:
            if p.attempts >= self.attempts:
                self._finish(p, Outcome.UNKNOWN, Status.NO_ANSWER)
                unanswered = True
            else:
                self._transmit(p, now, retransmit=True)
        if unanswered and self.auth is not None and self.state is SessionState.OPEN:
            self._probe_hello(now)  # a keyed device's silence: maybe another session key
        self._pump(now)

    # ------------------------------------------------------------------ internals
    def _send_hello(self, now: float) -> None:
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("tx HELLO seq=%d attempt=%d", self._hello_seq, self._hello_sent + 1)
        self._hello_sent += 1
        self._hello_deadline = now + self.timeout
        payload = encode_hello(PROTOCOL_VERSION, self.contract_hash)
        if self.auth is not None:
            payload += self.auth.hello_extension(self._hello_seq)
        self._out += encode_frame(FrameType.HELLO, self._hello_seq, 0, payload,
                                  address=self.address)

    def _on_hello_reply(self, frame: Frame, now: float) -> None:
        if (self.auth is not None and self.state is SessionState.OPEN and not self._probing
                and frame.seq == self._hello_seq and frame.epoch != self.epoch):
            # A keyed device rebooted between two copies of our HELLO and answered each in its
            # own boot with its own nonce: only one of the two session keys is the device's now,
            # and we cannot tell which (nor which epoch is the later). Probe with a fresh HELLO
            # (found by idemlink.explore_auth). A forged reply costs a handshake.
            self.counters.late_answers += 1
            self._probe_hello(now)
            return
        probe = self._probing and self.state is SessionState.OPEN
        if (self.state is not SessionState.HELLO_SENT and not probe) or \
                frame.seq != self._hello_seq:
            self.counters.late_answers += 1
            return
        try:
            info = DeviceInfo.decode(frame.payload)
        except MalformedDeviceInfo as exc:  # an answer in our framing we cannot read
            self.state = SessionState.CLOSED
            self._events.append(HelloFailed(str(exc), incompatible=True))
            return
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("rx HELLO_REPLY epoch=%08x device=%s map=%s next_seq=%d window=%d",
                            frame.epoch, info.device_id, info.map_name, info.next_seq,
                            info.window)
        if self.auth is not None:
            got = self.auth.on_hello_reply(frame, info.device_nonce, info.key_id,
                                           info.serves(Capability.AUTH), info.device_id or "",
                                           self.address)
            if isinstance(got, str):  # refused, counted; a genuine reply may still come
                self.counters.unauthenticated += 1
                self._auth_refusal = got
                return
        old = self.info
        if (self._rehandshake or probe) and old is not None and (
                (info.device_id, info.map_hash) != (old.device_id, old.map_hash)):
            # Another board took this one's place on the line: nothing of ours goes to it.
            self.gone = (f"another device answers on this line: "
                         f"{printable(info.device_id or info.name)} instead of "
                         f"{printable(old.device_id or old.name)}; nothing more was sent")
            self.state = SessionState.CLOSED
            self._rehandshake = self._probing = False
            for p in sorted(self._inflight.values(), key=lambda q: q.seq):  # a probe's: sent to
                self._finish(p, Outcome.UNKNOWN, Status.EPOCH_CHANGED_IN_FLIGHT)  # the old one
            self._settle_queue()
            self._events.append(HelloFailed(self.gone, incompatible=True))
            return
        self.info = info
        if self._probing:  # a re-key probe answered: what is in flight of another boot settles
            self._probing = False
            self._settle_other_epochs(frame.epoch)
        self.epoch = frame.epoch
        self._next_seq = info.next_seq
        self.max_inflight = max(1, min(self.want_inflight, info.max_inflight))
        self.state = SessionState.OPEN
        self._rehandshake = False
        self._events.append(SessionOpened(info, frame.epoch))

    def _pump(self, now: float) -> None:
        if self.state is not SessionState.OPEN:
            return
        while self._queue and len(self._inflight) < self.max_inflight:
            if self._inflight and self._run_ahead() >= self._run_ahead_limit():
                break
            p = self._queue.popleft()
            if p.number is not None and p.number != (self.epoch, self._next_seq):
                self.counters.outcomes[Outcome.NOT_EXECUTED.name] += 1
                self._events.append(Completion(p.tag, Outcome.NOT_EXECUTED, None))
                continue
            too_large = oversize(p.pdu, self.info)
            if too_large is not None:
                # the device said it takes no larger payload (HELLO_REPLY's max_payload): never
                # sent, so it did not run; a later pinned number settles as above
                self.counters.outcomes[Outcome.NOT_EXECUTED.name] += 1
                self._events.append(Completion(p.tag, Outcome.NOT_EXECUTED, None,
                                               detail=too_large))
                continue
            p.seq = self._next_seq
            self._next_seq = (self._next_seq + 1) & SEQ_MASK
            p.epoch = self.epoch
            p.attempts = 0
            p.sent_as.append((p.epoch, p.seq))
            self._inflight[p.seq] = p
            self._transmit(p, now, retransmit=False)

    def _run_ahead(self) -> int:
        """How far the next number is ahead of the oldest outstanding one (serial arithmetic)."""
        return max((self._next_seq - seq) & SEQ_MASK for seq in self._inflight)

    def _run_ahead_limit(self) -> int:
        info = self.info
        if info is None:
            return self.max_inflight
        return max(1, min(info.replay_slots, info.window))

    def _transmit(self, p: _Pending, now: float, *, retransmit: bool) -> None:
        p.attempts += 1
        p.deadline = now + self.timeout
        if retransmit:
            self._earliest = None
        elif self._earliest is not None:
            self._earliest = min(self._earliest, p.deadline)
        self.counters.sent += 1
        if retransmit:
            self.counters.retries += 1
        flags = Flags.RETRANSMIT if retransmit else Flags.NONE
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("tx REQUEST epoch=%08x seq=%d fc=0x%02x attempt=%d%s", p.epoch, p.seq,
                            p.pdu[0] if p.pdu else 0, p.attempts,
                            " RETRANSMIT" if retransmit else "")
        key = None if self.auth is None else self.auth.session
        self._out += encode_frame(FrameType.REQUEST, p.seq, p.epoch, p.pdu, flags,
                                  address=self.address, key=key,
                                  direction=None if key is None else Direction.HOST_TO_DEVICE)

    def _finish(self, p: _Pending, outcome: Outcome, status: Status | None, **kw: Any) -> None:
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("settled epoch=%08x seq=%d %s%s%s", p.epoch, p.seq, outcome.name,
                            f" ({status.name})" if status is not None else "",
                            " replayed" if kw.get("replay") else "")
        del self._inflight[p.seq]
        self._earliest = None
        self.counters.outcomes[outcome.name] += 1
        self._events.append(
            Completion(p.tag, outcome, status, attempts=p.attempts, reissued=p.reissued,
                       seq=p.seq, epoch=p.epoch, sent_as=tuple(p.sent_as), **kw)
        )

    def _on_response(self, frame: Frame, now: float) -> None:
        p = self._inflight.get(frame.seq)
        decoded = decode_response_payload(frame.payload)
        if frame_log.isEnabledFor(logging.DEBUG):
            frame_log.debug("rx RESPONSE epoch=%08x seq=%d status=%s%s%s", frame.epoch, frame.seq,
                            status_name(decoded[0]) if decoded else "-",
                            " REPLAY" if frame.flags & Flags.REPLAY else "",
                            "" if p is not None else " (nothing outstanding)")
        if decoded is None:
            self.counters.decode_errors += 1
            return
        status, pdu = decoded
        if status == Status.EPOCH_MISMATCH and frame.epoch != self.epoch:
            # The answer names the epoch the refused request carried (devices before that field:
            # nothing); a refusal of another epoch's request under the same number is stale.
            refused = int.from_bytes(pdu[:4], "little") if len(pdu) >= 4 else None
            if p is not None and p.epoch == self.epoch and refused in (None, p.epoch):
                self._epoch_changed(frame.epoch, now)
            else:  # answers nothing outstanding: e.g. a delayed copy from an older boot
                self.counters.late_answers += 1
            return
        if p is None or frame.epoch != p.epoch:
            self.counters.late_answers += 1
            return
        if status == Status.EPOCH_MISMATCH:
            # Sent in the device's own epoch yet refused: the device must have changed epoch and
            # back; nothing certain can be said.
            self._finish(p, Outcome.UNKNOWN, Status.EPOCH_CHANGED_IN_FLIGHT)
            return
        if status == Status.OK:
            if not answer_fits(p.pdu, pdu):
                self.counters.mismatched_answers += 1
                return
            replay = bool(frame.flags & Flags.REPLAY)
            if replay:
                self.counters.replays += 1
            outcome, st, exc = classify_answer(p.pdu, pdu)
            code = exception_code(pdu)
            self._finish(p, outcome, st, exception=exc, pdu=pdu, replay=replay, answered=True,
                         exception_code=code,
                         detail=f"Modbus exception {exception_name(code)}"
                         if code is not None and exc is None else "")
            return
        info = status_info(status)
        self._finish(p, info.outcome, known_status(status))

    def _epoch_changed(self, epoch: int, now: float) -> None:
        self.epoch = epoch
        self._settle_other_epochs(epoch)
        self._handshake_again(now)

    def _settle_other_epochs(self, epoch: int) -> None:
        """Requests in flight in another epoch than ``epoch`` (the device's now): set-only ones
        re-issued (queued first), the others UNKNOWN (they may have run in their boot)."""
        reissue: list[_Pending] = []
        for p in sorted(self._inflight.values(), key=lambda q: q.seq):
            if p.epoch == epoch:
                continue
            if p.set_only and p.reissued < self.attempts:  # a flapping epoch cannot loop us
                del self._inflight[p.seq]
                self._earliest = None
                p.reissued += 1
                self.counters.reissued += 1
                reissue.append(p)
            else:
                self._finish(p, Outcome.UNKNOWN, Status.EPOCH_CHANGED_IN_FLIGHT)
        self._queue.extendleft(reversed(reissue))

    def _probe_hello(self, now: float) -> None:
        """A keyed host's re-key probe: one fresh HELLO (a new nonce) while the session stays
        OPEN. Silence from a keyed device that holds a session key may mean it holds *another*
        one (a HELLO answered on both sides of a reboot, a forged HELLO): its frames under ours
        fail the MAC and it sends no hint. If the probe is answered, the new session opens (what
        is in flight of another boot settles by the epoch rules); if not, nothing changes and
        the next unanswered request probes again."""
        self._probing = True
        self._hello_sent = 0
        self._hello_seq = (self._hello_seq + 1) & SEQ_MASK
        self._send_hello(now)

    def _handshake_again(self, now: float) -> None:
        """A new boot hands out its own numbers: HELLO again before anything more goes out. A
        number this host picked itself could be handed to another process by that boot later,
        and a delayed frame of ours would then run under that process's number."""
        self.state = SessionState.HELLO_SENT
        self._rehandshake = True
        self._probing = False
        self._hello_sent = 0
        self._hello_seq = (self._hello_seq + 1) & SEQ_MASK
        self._send_hello(now)

    def _settle_queue(self) -> None:
        """The handshake after an epoch change got no reply within its attempts: what waits for
        a number is settled (a re-issue went out in the old epoch: UNKNOWN; never sent:
        NOT_EXECUTED), and the handshake goes on for what is submitted next."""
        while self._queue:
            p = self._queue.popleft()
            outcome = Outcome.UNKNOWN if p.sent_as else Outcome.NOT_EXECUTED
            self.counters.outcomes[outcome.name] += 1
            self._events.append(Completion(
                p.tag, outcome, Status.EPOCH_CHANGED_IN_FLIGHT if p.sent_as else None,
                attempts=p.attempts, reissued=p.reissued, seq=p.seq, epoch=p.epoch,
                sent_as=tuple(p.sent_as)))

