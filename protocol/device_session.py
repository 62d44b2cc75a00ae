"""The device side of the framed protocol: frames in, exactly-once execution, answers out.

``DeviceSession`` is sans-I/O (the project's shape, docs/ARCHITECTURE.md): ``receive_data(bytes,
now)`` takes received bytes, ``data_to_send()`` drains the answers they produced.
It owns one boot epoch, one ``ReplayWindow`` and one ``ReplayCache``; a reboot is a new session.
The command itself is run by an ``Executor`` (the register core), called at most once per
(epoch, sequence number) — that is the whole promise, and this table is where it is kept:

=============================  ================================================================
REQUEST with another epoch     answer EPOCH_MISMATCH (our epoch in the header, the request's epoch
                               as u32 LE in the payload); nothing runs; not committed
window verdict NEW/ACCEPT_OLD  run the executor, commit the number, store the answer, send it
DUPLICATE, same digest         resend the stored answer with the REPLAY flag; nothing runs
DUPLICATE, other digest        answer IDEMPOTENCY_CONFLICT; nothing runs
DUPLICATE, answer evicted      answer ANSWER_EVICTED (it ran before); nothing runs
TOO_OLD                        answer TOO_OLD; nothing runs
HELLO                          answer HELLO_REPLY (device info, our epoch); only the hand-out
                               floor moves (see ``device_info``)
anything else / decode error   counted, no answer (the host's retry covers it)
=============================  ================================================================

The number is committed only after the frame passed its CRC (the decoder guarantees it) and only
for requests that were executed, so a forged far-ahead number in a corrupted frame never moves the
window, and a refused request can run later under the same number.

On a bus (issue 22, docs/BUS.md) a session may have an ``address`` (1..247). Which frames it takes
is decided by ``address_verdict`` once, before the table above:

=============================  ================================================================
no address in the frame        "the device on this line": the table above, answered unaddressed
the session's own address      the table above, answered with the same address
another device's address       counted (``other_address``), no answer
broadcast (0)                  a REQUEST only, never answered: run once per number of the
                               broadcast window (its own ``ReplayWindow``; the header's epoch is
                               not checked, a broadcast reaches devices of different boots) if
                               ``broadcast_ok`` says the PDU is a set-only write; else counted
any address, no own address    counted (``unexpected_frames``), no answer: a point-to-point
                               device stays silent on a bus, like a device of the first contract
a MAC tag, device not keyed    counted (``unexpected_frames``), no answer
=============================  ================================================================

A keyed device (``auth``: ``idemlink.protocol.auth.DeviceAuth``, issue 23, docs/SECURITY.md)
decides one thing more, before both tables: its decoder verifies every tag right after the CRC
(a wrong tag, a truncated one, one of another session or direction is ``bad_mac``, no answer),
and a frame other than HELLO that carries no verified tag is ``unauthenticated``: counted, never
run; a REQUEST gets AUTHENTICATION_REQUIRED, unsigned. A HELLO naming a key the device holds
makes a new session key; its HELLO_REPLY and every answer to a verified request are signed.
A keyed device runs no broadcast, not even one whose tag verified (the devices of a bus share no
session key; docs/SECURITY.md): a set-only one is counted ``unauthenticated``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from enum import Enum

from idemlink.protocol.auth import DeviceAuth
from idemlink.protocol.frame import (
    BROADCAST_ADDRESS,
    MAX_PAYLOAD,
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
from idemlink.protocol.outcome import Status
from idemlink.protocol.payloads import (
    HANDOUT_SPAN,
    NO_DEVICE_ADDRESS,
    Capability,
    DeviceInfo,
    encode_response_payload,
)
from idemlink.protocol.replay import DEFAULT_SLOTS, ReplayCache, ReplayVerdict, request_digest
from idemlink.protocol.window import RING_BITS, ReplayWindow, Verdict

Executor = Callable[[bytes, float, int], bytes]
"""Runs one request PDU (at simulated time ``now``, for sequence number ``seq``) and returns the
response PDU."""

BroadcastFilter = Callable[[bytes], bool]
"""Whether a request PDU may run as a broadcast: a set-only write (absolute values, nothing a
repeat could change), decided by the register model (``DeviceCore.broadcast_ok``)."""


class AddressVerdict(Enum):
    """What a session does with a frame, by its address (``address_verdict``)."""

    THIS_LINE = "this_line"  #: no address: the device on this line
    OURS = "ours"  #: our own address
    BROADCAST = "broadcast"  #: address 0: run once if allowed, never answer
    OTHER = "other_address"  #: another device's: ignore
    UNEXPECTED = "unexpected_frames"  #: addressed, and we have none; or tagged: ignore


def address_verdict(frame_address: int | None, tagged: bool, own: int | None) -> AddressVerdict:
    """The one rule of which frames a device takes on a shared line (pure)."""
    if tagged:
        return AddressVerdict.UNEXPECTED
    if frame_address is None:
        return AddressVerdict.THIS_LINE
    if own is None:
        return AddressVerdict.UNEXPECTED
    if frame_address == own:
        return AddressVerdict.OURS
    if frame_address == BROADCAST_ADDRESS:
        return AddressVerdict.BROADCAST
    return AddressVerdict.OTHER


DEFAULT_MAX_INFLIGHT = 32
"""How far ahead of the highest number seen a HELLO may hand out a start (half the RFC 1982
"ahead" range, so a start and the numbers after it are always NEW to the window)."""


class RequestDisposition(Enum):
    """What the session did with a request (for counters, tests and the monitor)."""

    EXECUTED = "executed"
    REPLAYED = "replayed"
    CONFLICT = "conflict"
    EVICTED = "evicted"
    TOO_OLD = "too_old"
    EPOCH_MISMATCH = "epoch_mismatch"


_DUPLICATE_ANSWER: dict[ReplayVerdict, tuple[RequestDisposition, Status]] = {
    ReplayVerdict.CONFLICT: (RequestDisposition.CONFLICT, Status.IDEMPOTENCY_CONFLICT),
    ReplayVerdict.EVICTED: (RequestDisposition.EVICTED, Status.ANSWER_EVICTED),
}


class DeviceSession:
    """One boot of a device: epoch, de-duplication window, replay cache and frame decoder."""

    def __init__(
        self,
        executor: Executor,
        epoch: int,
        *,
        contract_hash: bytes,
        name: str = "idemlink-sim",
        map_hash: bytes | None = None,
        device_id: str = "",
        map_name: str = "",
        ring_bits: int = RING_BITS,
        replay_slots: int = DEFAULT_SLOTS,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        address: int | None = None,
        broadcast_ok: BroadcastFilter | None = None,
        broadcast_executor: Executor | None = None,
        auth: DeviceAuth | None = None,
    ) -> None:
        if not 0 <= epoch < 2**32:
            raise ValueError("epoch must fit in 32 bits")
        self.executor = executor
        self.epoch = epoch
        self.window = ReplayWindow(ring_bits)
        self.cache = ReplayCache(replay_slots)
        self.decoder = FrameDecoder()
        self._outgoing = bytearray()
        self.contract_hash = contract_hash
        self.name = name
        self.map_hash = map_hash
        self.device_id = device_id
        self.map_name = map_name
        # Never more in flight than answers kept: a retry must still find its answer.
        self.max_inflight = min(max_inflight, self.window.size, self.cache.slots, 255)
        self._handed_out: int | None = None
        self.counters: Counter[str] = Counter()
        #: its bus address (None: a point-to-point device, silent on addressed frames)
        self.address = None if address is None else check_address(address)
        self.broadcast_ok = broadcast_ok
        #: runs a broadcast (its answer is dropped); the executor when not given
        self.broadcast_executor = broadcast_executor or executor
        #: broadcast numbers run (a space of their own: a broadcast reaches devices whose
        #: windows and epochs differ)
        self.broadcast_window = ReplayWindow(ring_bits)
        #: what it advertises of the contract's later additions (no keys yet: AUTH frames are
        #: ignored below)
        self.capabilities = Capability.ADDRESSED if address is not None else Capability.NONE
        #: a keyed device's keys and session key (None: unkeyed, the first contract's device)
        self.auth = auth
        if auth is not None:
            self.capabilities |= Capability.AUTH
        self._signing = False  #: the frame being answered verified: sign the answer

    def first_seq(self) -> int:
        """The first number for a new host session: 1 on a fresh boot; else a whole window beyond
        both the highest number seen and the last number handed out. A host process that died with
        requests in flight used numbers just above those; a new one must not reuse them, or a
        delayed frame of the dead one would be executed and its answer taken by the new one (and
        the new one's own request refused as a conflict). Numbers of the dead process that arrive
        later are then inside the window (they may still run, and that process reported them
        UNKNOWN) or too old: they never collide.

        The hand-out never runs away from the window: it stays at most ``HANDOUT_SPAN`` ahead of
        the highest number seen (past that, a request would be 2^31 ahead and refused TOO_OLD).
        HELLOs with no request between them cycle through the starts ``highest + 1 + k·window``
        (k = 1 .. ``HANDOUT_SPAN // window``, about a million), so a start is handed out again only
        after that many handshakes in which no request arrived."""
        highest, handed = self.window.highest, self._handed_out
        anchor = 1 if highest is None else (highest + 1) & 0xFFFFFFFF
        if handed is None:
            return anchor if highest is None else (anchor + self.window.size) & 0xFFFFFFFF
        offset = (handed - anchor) & 0xFFFFFFFF
        step = self.window.size
        # handed out at or ahead of the anchor: one window further; behind it: requests passed it
        following = offset + step if offset < 0x80000000 else step
        if following > HANDOUT_SPAN:
            following = step
        return (anchor + following) & 0xFFFFFFFF

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(
            version=PROTOCOL_VERSION,
            window=self.window.size,
            max_payload=MAX_PAYLOAD,
            replay_slots=self.cache.slots,
            max_inflight=self.max_inflight,
            contract_hash=self.contract_hash,
            next_seq=self.first_seq(),
            name=self.name,
            map_hash=self.map_hash,
            device_id=self.device_id,
            map_name=self.map_name,
            # the second extension follows the identity one: a device without a map hash (a
            # bare session in a test) replies as the first contract's devices did
            capabilities=self.capabilities if self.map_hash is not None else None,
            address=NO_DEVICE_ADDRESS if self.address is None else self.address,
            broadcast_next=None if self.address is None else self.broadcast_next(),
            key_id=None if self.auth is None else self.auth.key_id,
            device_nonce=None if self.auth is None else self.auth.device_nonce,
        )

    def broadcast_next(self) -> int:
        """The first broadcast number for a host (HELLO_REPLY's bus extension): 1 when no
        broadcast ran this boot, else one window beyond the highest that did (a dead host's
        broadcasts still in flight are not reused)."""
        highest = self.broadcast_window.highest
        if highest is None:
            return 1
        return (highest + 1 + self.broadcast_window.size) & 0xFFFFFFFF

    def receive_data(self, data: bytes, now: float) -> None:
        """Take received bytes (any chunking) at time ``now``; the answers wait in
        ``data_to_send``."""
        decoder = self.decoder
        decoder.receive_data(data)
        out = self._outgoing
        while (event := decoder.next_event()) is not None:
            if isinstance(event, DecodeError):
                self.counters["decode_errors"] += 1
                if event.kind is DecodeErrorKind.BAD_MAC:
                    self.counters["bad_mac"] += 1
                continue
            reply = self._handle_frame(event, now)
            if reply:
                out += reply

    def data_to_send(self) -> bytes:
        """The answer bytes produced so far, in order (drains them; b"" when there are none)."""
        out = bytes(self._outgoing)
        self._outgoing.clear()
        return out

    def _handle_frame(self, frame: Frame, now: float) -> bytes:
        auth = self.auth
        if auth is not None and frame.type is not FrameType.HELLO and not frame.verified:
            # keyed: nothing without a verified tag runs (no downgrade); the refusal is
            # unsigned, so a keyed host never takes it for the answer to its own signed request
            self.counters["unauthenticated"] += 1
            if frame.type is not FrameType.REQUEST or (
                    frame.address is not None and frame.address != self.address):
                return b""
            self._signing = False
            if frame.tag is None:
                return self._answer(frame.seq, Status.AUTHENTICATION_REQUIRED, frame.address)
            if auth.session is None and frame.epoch != self.epoch:
                # just rebooted, no session key to check or sign with: the unsigned news of the
                # new epoch makes the host shake hands again (``auth.epoch_hint``)
                return self._encode(FrameType.RESPONSE, frame.seq, encode_response_payload(
                    Status.EPOCH_MISMATCH, frame.epoch.to_bytes(4, "little")), 0, frame.address)
            return b""
        self._signing = frame.verified
        where = address_verdict(frame.address, frame.tag is not None and auth is None,
                                self.address)
        if where is AddressVerdict.BROADCAST:
            self.counters[self._broadcast(frame, now)] += 1
            return b""
        if where is AddressVerdict.OTHER or where is AddressVerdict.UNEXPECTED:
            # another device's frame, or one this device cannot take (addressed without an
            # address of its own, or tagged without a key): silent, as an answer could collide
            # with the addressed device's on a bus and an unverified tag proves nothing
            self.counters[where.value] += 1
            return b""
        to = frame.address  # the answer is addressed as the request was
        if frame.type is FrameType.REQUEST:
            disposition, wire = self._request(frame, now, to)
            self.counters[disposition.value] += 1
            return wire
        if frame.type is FrameType.HELLO:
            self.counters["hello"] += 1
            if auth is not None:
                self._signing = auth.hello(frame.payload, self.device_id, to) is not None
                self.decoder.mac = auth.check()
            info = self.device_info()
            self._handed_out = info.next_seq
            return self._encode(FrameType.HELLO_REPLY, frame.seq, info.encode(), 0, to)
        self.counters["unexpected_frames"] += 1
        return b""

    def _broadcast(self, frame: Frame, now: float) -> str:
        """Run a broadcast request at most once per number (its own window); never answered.
        Returns the counter it adds to."""
        if frame.type is not FrameType.REQUEST:
            return "broadcast_refused"
        if self.broadcast_ok is None or not self.broadcast_ok(frame.payload):
            return "broadcast_refused"  # not a set-only write: a broadcast never runs it
        if self.auth is not None:  # keyed: only a verified tag reaches here; a broadcast
            return "unauthenticated"  # never runs all the same (devices share no session key)
        verdict = self.broadcast_window.check(frame.seq)
        if verdict is not Verdict.NEW and verdict is not Verdict.ACCEPT_OLD:
            return "broadcast_repeated"
        self.broadcast_executor(frame.payload, now, frame.seq)
        self.broadcast_window.commit(frame.seq)
        return "broadcast_executed"

    def _encode(self, ftype: FrameType, seq: int, payload: bytes, flags: int,
                to: int | None) -> bytes:
        """An answer, signed with the session key when the frame answered verified."""
        if self._signing and self.auth is not None and self.auth.session is not None:
            return encode_frame(ftype, seq, self.epoch, payload, flags, address=to,
                                key=self.auth.session, direction=Direction.DEVICE_TO_HOST)
        return encode_frame(ftype, seq, self.epoch, payload, flags, address=to)

    def _answer(self, seq: int, status: Status, to: int | None, flags: int = 0) -> bytes:
        return self._encode(FrameType.RESPONSE, seq, encode_response_payload(status), flags, to)

    def _request(self, frame: Frame, now: float,
                 to: int | None) -> tuple[RequestDisposition, bytes]:
        seq = frame.seq
        if frame.epoch != self.epoch:
            wire = self._encode(FrameType.RESPONSE, seq, encode_response_payload(
                Status.EPOCH_MISMATCH, frame.epoch.to_bytes(4, "little")), 0, to)
            return RequestDisposition.EPOCH_MISMATCH, wire
        verdict = self.window.check(seq)
        if verdict is Verdict.NEW or verdict is Verdict.ACCEPT_OLD:
            payload = encode_response_payload(Status.OK, self.executor(frame.payload, now, seq))
            self.window.commit(seq)
            self.cache.store(seq, request_digest(frame.payload), payload)
            return RequestDisposition.EXECUTED, self._encode(
                FrameType.RESPONSE, seq, payload, 0, to)
        if verdict is Verdict.TOO_OLD:
            return RequestDisposition.TOO_OLD, self._answer(seq, Status.TOO_OLD, to)
        found, stored = self.cache.lookup(seq, request_digest(frame.payload))
        if found is ReplayVerdict.REPLAY:
            wire = self._encode(FrameType.RESPONSE, seq, stored, Flags.REPLAY, to)
            return RequestDisposition.REPLAYED, wire
        disposition, status = _DUPLICATE_ANSWER[found]
        return disposition, self._answer(seq, status, to)
