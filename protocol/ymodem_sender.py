"""YMODEM batch sender, sans-I/O, that reports a file delivered only on proof of its commit.

Contract:

- ``start(now)``, then bytes in with ``receive_data(data, now)``, time in with ``tick(now)``,
  bytes out with ``data_to_send()``, events out with ``next_event()``;
  ``next_deadline()`` says when ``tick`` must be called next; ``abort(reason)`` drops unsent
  output and queues CAN CAN. The shell supplies each file's bytes through ``SendFile.read``.
- Every transition lives in ``TX_TRANSITIONS``, keyed by ``(state, input)`` and giving
  ``(next_state, action)``; an input absent from the table for a state is ignored.
- The proof of a commit: a file counts as delivered (``FileCommitted``) only on the receiver's
  'C' after an ACK to an EOT sent once an earlier EOT of this file had been answered
  (NAK-first receivers give that for free; ACK-first ones like rb get the EOT once more). If the
  batch ends after the file's last frame went out but before that proof, the file is
  ``FileUnconfirmed``, never ok.
- Answers cannot precede the question: bytes read before our last send, or while it waits out
  its turnaround, are stale (only CAN CAN is heard in them).
- Speed without a weaker proof: no turnaround until the receiver loses a header or block (then
  ``flush_guard``, as rb flushes its input after answering), and one NUL (the "nudge", which any
  receiver takes for noise) when rb sits out its one-second read before a 'C' (at the start,
  after a slow ACK to EOT): it makes the receiver's own answer come sooner and proves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from idemlink.protocol.ymodem_events import (
    Aborted,
    BatchEnded,
    FileCommitted,
    FileUnconfirmed,
    MachineQueues,
    Progress,
)
from idemlink.protocol.ymodem_tables import TX_TRANSITIONS, TxAction, TxIn, TxState
from idemlink.protocol.ymodem_wire import (
    ACK,
    BLOCK_LARGE,
    BLOCK_SMALL,
    CAN,
    CAN_COUNT,
    CPMEOF,
    CRC_REQUEST,
    EOT,
    NAK,
    NUDGE,
    build_block,
    build_header,
)


@dataclass(slots=True)
class SenderConfig:
    """Timeouts (s), retry limits and the turnaround delay."""

    block_size: int = BLOCK_LARGE  #: 1024 (STX while > 896 bytes remain) or 128 (SOH only)
    #: pause after a received byte before answering, always (half-duplex RS-485 needs one)
    turnaround: float = 0.0
    #: pause adopted for the rest of the batch once the receiver lost a frame (a header or block
    #: NAKed, or not answered in time): rb flushes its input right after each answer, so a frame
    #: that arrives before the flush is eaten. Over a real line the answer's own transit covers
    #: that; over a local pty it may not.
    flush_guard: float = 0.002
    #: at the start and after an ACK to EOT, this long without 'C' sends one NUL: rb reads one
    #: byte (1 s timeout) before each 'C' it sends for a header, so the NUL saves it that second;
    #: an rb whose first 'C' was lost (pyserial purges input when it opens a port) answers the
    #: NUL with 'C' after 1 s instead of its 10 s timeout. Our receiver ignores a NUL there (and
    #: NAKs it before a commit, never 'C'). 5 ms: rb flushes its input right after writing the
    #: ACK (microseconds), so the NUL only has to come after that; every ms more is a ms rb
    #: sits idle, twice per file (after each ACK to EOT) and once at the start. None: never.
    nudge_after: float | None = 0.005
    #: ... but after an ACK to EOT only when that ACK came this long after our EOT (rb answers an
    #: EOT after 1 s of silence): a prompt ACK is a receiver that sends its 'C' promptly too, or a
    #: late copy; a NUL close behind our EOT could share the receiver's read with it and make the
    #: EOT noise
    nudge_slow_ack: float = 0.5
    start_timeout: float = 60.0  #: waiting for the receiver's first 'C'
    #: header / data block ACK: neither 5 s (rb) nor 10 s (our receiver): timers firing together cross
    ack_timeout: float = 7.0
    eot_timeout: float = 3.0  #: before resending EOT (rb needs > 1 s of silence)
    c_timeout: float = 10.0  #: waiting for 'C' after a header or a committed file
    max_retries: int = 10
    end_timeout: float = 1.0  #: end-of-batch block 0 ACK
    end_retries: int = 1  #: then finish with success, BatchEnded(final_ack=False)


@dataclass(frozen=True, slots=True)
class SendFile:
    """One file to send. ``read(offset, n)`` is supplied by the shell (the core never opens
    files); it must return exactly ``min(n, size - offset)`` bytes."""

    name: str
    size: int
    mtime: int
    mode: int
    read: Callable[[int, int], bytes] = field(repr=False)

    @classmethod
    def from_bytes(cls, name: str, data: bytes, mtime: int = 0, mode: int = 0o644) -> SendFile:
        return cls(name, len(data), mtime, mode, lambda off, n: data[off : off + n])


class Sender(MachineQueues):
    """YMODEM batch sender for ``files`` (the list may be empty: just the end block)."""

    def __init__(self, files: list[SendFile], config: SenderConfig | None = None) -> None:
        super().__init__()
        self.config = config or SenderConfig()
        if self.config.block_size not in (BLOCK_SMALL, BLOCK_LARGE):
            raise ValueError("block_size must be 128 or 1024")
        for f in files:
            build_header(f.name, f.size, f.mtime, f.mode)  # raises early on impossible names
        self.files = list(files)
        self.state = TxState.WAIT_START
        self._index = 0
        self._offset = 0  # bytes of the current file ACKed
        self._block_no = 0
        self._current = b""  # the frame awaiting an answer (resent verbatim)
        self._current_len = 0  # payload bytes in it
        self._retries = 0
        self._pending_can = False
        self._scheduled = bytearray()
        self._send_at = 0.0
        self.committed: list[str] = []  #: files the receiver confirmed (EOT ACKed, then 'C')
        self.unconfirmed: list[str] = []  #: EOT ACKed but the batch ended before the 'C'
        self._eot_acked = False
        self._final_sent = False  # the frame ending this file went out: the receiver may commit
        # Proof of a commit (see _c_unproven): an EOT of this file was answered (ACK/NAK), an EOT
        # was sent after that answer ("armed"), and an ACK came while armed ("proven").
        self._eot_answered = False
        self._eot_armed = False
        self._eot_proven = False
        self.abort_reason: str | None = None
        self.stale_answers = 0  #: ACK/NAK/'C' ignored because they preceded our last send
        self._sends = 0
        self._deadline = None
        self._guarded = False  # the receiver lost a frame: flush_guard applies from now on
        self._nudge_at: float | None = None
        self.nudges = 0  #: NULs sent to end a receiver's one-byte read before its 'C'

    def start(self, now: float) -> None:
        self._deadline = now + self.config.start_timeout
        if self.config.nudge_after is not None:
            self._nudge_at = now + self.config.nudge_after

    def abort(self, reason: str, now: float = 0.0) -> None:
        if self.state in (TxState.DONE, TxState.ABORTED):
            return
        self._scheduled.clear()
        self._out.clear()
        self._do_abort(reason, by_peer=False)

    def receive_data(self, data: bytes, now: float) -> None:
        """Answers cannot precede the question: once a byte of ``data`` made us send something,
        the rest of ``data`` (read before that send) and anything arriving while the send waits
        out its turnaround is stale, and only scanned for CAN CAN. A duplicated or late ACK is
        thus never taken as the answer to the next block or to EOT."""
        stale = False
        for b in data:
            if self.state in (TxState.DONE, TxState.ABORTED):
                return
            if b == CAN:
                if self._pending_can:
                    self._input(TxIn.CANCEL, now)
                self._pending_can = True
                continue
            self._pending_can = False
            if stale or self._scheduled:
                self.stale_answers += b in (ACK, NAK, CRC_REQUEST)
                continue
            sends = self._sends
            if b == ACK:
                self._input(TxIn.ACK, now)
            elif b == NAK:
                self._input(TxIn.NAK, now)
            elif b == CRC_REQUEST:
                self._input(TxIn.C_UNPROVEN if self._c_unproven() else TxIn.C, now)
            stale = self._sends != sends

    def tick(self, now: float) -> None:
        if self._scheduled and now >= self._send_at:
            self._out += self._scheduled
            self._scheduled.clear()
        if self._nudge_at is not None and now >= self._nudge_at and not self._scheduled:
            self._nudge_at = None
            self._input(TxIn.QUIET, now)
        if self._deadline is not None and now >= self._deadline and not self._scheduled:
            self._deadline = None
            self._input(TxIn.TIMEOUT, now)
            if self._scheduled and now >= self._send_at:
                self._out += self._scheduled
                self._scheduled.clear()

    def next_deadline(self) -> float | None:
        if self._scheduled:
            return self._send_at
        if self._nudge_at is not None and (self._deadline is None or self._nudge_at < self._deadline):
            return self._nudge_at
        return self._deadline

    # plumbing

    def _input(self, inp: TxIn, now: float) -> None:
        entry = TX_TRANSITIONS.get((self.state, inp))
        if entry is None:
            return
        self.state, action = entry
        self._nudge_at = None  # only the ACK to an EOT (re)starts it
        ACTION_METHODS[action](self, now)

    def _send(self, frame: bytes, now: float, timeout: float, *, keep: bool = True) -> None:
        """Queue ``frame`` after the turnaround delay and arm ``timeout`` from then."""
        if keep:
            self._current = frame
        self._sends += 1
        self._scheduled = bytearray(frame)
        pause = max(self.config.turnaround, self.config.flush_guard if self._guarded else 0.0)
        self._send_at = now + pause
        if pause <= 0:
            self._out += self._scheduled
            self._scheduled.clear()
        self._deadline = self._send_at + timeout

    def _do_abort(self, reason: str, by_peer: bool) -> None:
        self.state = TxState.ABORTED
        self.abort_reason = reason
        self._deadline = self._nudge_at = None
        self._scheduled.clear()
        # The frame ending the file went out (or an ACK to its EOT came, but no proven 'C'): the
        # receiver may have committed (late EOT copies can commit a complete file before our own
        # EOT), so the file's fate is unknown: "not confirmed", never "failed" and never ok.
        if self._eot_acked or self._final_sent:
            f = self.files[self._index]
            self._eot_acked = self._final_sent = False
            self.unconfirmed.append(f.name)
            self._events.append(FileUnconfirmed(f.name, f.size))
        if not by_peer:
            self._out += bytes((CAN,)) * CAN_COUNT
        self._events.append(Aborted(reason, by_peer))

    def _c_unproven(self) -> bool:
        """A 'C' that cannot confirm the current file. A receiver still waiting for block 1 sends
        'C' too, and the ACK we took for the EOT may be a late copy, so a 'C' proves a commit only
        after an ACK to an EOT that was sent once an earlier EOT of this file had been answered by
        ACK or NAK: a receiver that saw an EOT of this file no longer waits for block 1 (it NAKs
        an EOT short of the declared size and then only NAKs), so its later 'C' comes from the
        header wait, after the commit. Our receiver's NAK-first handshake gives this proof at no
        cost (EOT, NAK, EOT, ACK 'C'); rb's ACK-first costs one more EOT round."""
        return self.state is TxState.WAIT_NEXT_C and not self._eot_proven

    def _timeout_for_state(self) -> float:
        if self.state in (TxState.SENT_EOT1, TxState.SENT_EOT2):
            return self.config.eot_timeout
        if self.state is TxState.SENT_END:
            return self.config.end_timeout
        return self.config.ack_timeout

    def _next_block(self) -> bytes:
        f = self.files[self._index]
        remaining = f.size - self._offset
        size = BLOCK_LARGE if self.config.block_size == BLOCK_LARGE and remaining > 896 else BLOCK_SMALL
        data = f.read(self._offset, min(size, remaining))
        if len(data) != min(size, remaining):
            raise ValueError(f"short read from {f.name!r} at {self._offset}")
        self._current_len = len(data)
        self._final_sent = self._final_sent or self._offset + len(data) >= f.size
        return build_block(self._block_no, data.ljust(size, bytes((CPMEOF,))))

    # actions (``ACTION_METHODS`` maps the table's ``TxAction`` to them)

    def _send_header(self, now: float) -> None:
        self._retries = 0
        if self._index >= len(self.files):
            self.state = TxState.SENT_END
            self._send(build_block(0, bytes(BLOCK_SMALL)), now, self.config.end_timeout)
            return
        f = self.files[self._index]
        _, payload = build_header(f.name, f.size, f.mtime, f.mode)
        self._offset = 0
        self._block_no = 0
        self._eot_answered = self._eot_armed = self._eot_proven = False
        self._send(build_block(0, payload), now, self.config.ack_timeout)

    def _resend(self, now: float) -> None:
        if self.state in (TxState.SENT_HEADER, TxState.SENT_BLOCK):
            self._guarded = True  # a frame was lost: maybe eaten by the receiver's flush
        self._retries += 1
        if self._retries > self.config.max_retries:
            self._do_abort(f"no answer after {self.config.max_retries} retries ({self.state.value})",
                           by_peer=False)
            return
        if self.state in (TxState.SENT_EOT1, TxState.SENT_EOT2) and self._eot_answered:
            self._eot_armed = True
        self._send(self._current, now, self._timeout_for_state())

    def _eot_naked(self, now: float) -> None:
        """A NAK to an EOT (a NAK-first receiver's first answer, or the receiver refusing it):
        EOT again."""
        self._eot_answered = True
        self._resend(now)

    def _resend_end(self, now: float) -> None:
        self._retries += 1
        if self._retries > self.config.end_retries:
            self.state = TxState.DONE
            self._deadline = None
            self._events.append(BatchEnded(final_ack=False))
            return
        self._send(self._current, now, self.config.end_timeout)

    def _wait_data_c(self, now: float) -> None:
        self._retries = 0
        self._deadline = now + self.config.c_timeout

    def _wait_again(self, now: float) -> None:
        self._retries += 1
        if self._retries > self.config.max_retries:
            self._do_abort("no 'C' from the receiver", by_peer=False)
            return
        self._deadline = now + self.config.c_timeout

    def _send_first_block(self, now: float) -> None:
        self._retries = 0
        self._block_no = 1
        if self.files[self._index].size == 0:
            self.state = TxState.SENT_EOT1
            self._final_sent = True
            self._send(bytes((EOT,)), now, self.config.eot_timeout)
            return
        self._send(self._next_block(), now, self.config.ack_timeout)

    def _send_next(self, now: float) -> None:
        f = self.files[self._index]
        self._retries = 0
        self._offset += self._current_len
        self._events.append(Progress(f.name, min(self._offset, f.size), f.size))
        if self._offset >= f.size:
            self.state = TxState.SENT_EOT1
            self._send(bytes((EOT,)), now, self.config.eot_timeout)
            return
        self._block_no = (self._block_no + 1) & 0xFF
        self._send(self._next_block(), now, self.config.ack_timeout)

    def _c_during_block(self, now: float) -> None:
        if self._block_no == 1 and self._offset == 0:
            self._resend(now)

    def _note_eot_ack(self, now: float) -> None:
        """Not yet delivered: a late copy of the last block's ACK looks the same. The receiver's
        'C' for the next file confirms it; its NAK sends us back to EOT. ``_retries`` keeps
        counting (reset only by the next header): an ACK-then-NAK peer cycles WAIT_NEXT_C ->
        SENT_EOT2 -> WAIT_NEXT_C, and ``max_retries`` EOTs end it (FileUnconfirmed, CAN CAN)."""
        self._eot_acked = True
        if self._eot_armed:
            self._eot_proven = True
        self._eot_answered = True
        self._deadline = now + self.config.c_timeout
        slow = now - self._send_at >= self.config.nudge_slow_ack  # _send_at: our EOT went out
        if self.config.nudge_after is not None and slow:
            self._nudge_at = now + self.config.nudge_after

    def _nudge(self, now: float) -> None:
        """No 'C' yet (at the start, or after the EOT's ACK): one NUL, straight out (not an
        answer, so no turnaround and nothing read meanwhile is stale). rb reads one byte with a
        1 s timeout before every 'C' asking for a header; the NUL ends that read, and the 'C'
        (or the EOT re-check it starts) comes a second sooner. Any receiver takes it for line
        noise: ours ignores it after a commit and NAKs it before one (never 'C'), so it cannot
        forge the proof."""
        self.nudges += 1
        self._out.append(NUDGE)

    def _recheck_eot(self, now: float) -> None:
        """Unproven 'C' after the EOT's ACK: send the EOT again. A receiver that committed ACKs it
        again and sends 'C' (now proof); one still waiting for block 1 NAKs it (the size guard,
        or the NAK-first answer to an empty file's first EOT) and never sends 'C' for this file again."""
        self._resend(now)

    def _confirm_file(self, now: float) -> None:
        f = self.files[self._index]
        self._eot_acked = self._final_sent = False
        self.committed.append(f.name)
        self._events.append(FileCommitted(f.name, f.size))
        self._index += 1
        self._send_header(now)

    def _batch_done(self, now: float) -> None:
        self._deadline = None
        self._events.append(BatchEnded(final_ack=True))

    def _give_up(self, now: float) -> None:
        self._do_abort("no receiver ('C') before the start timeout", by_peer=False)

    def _peer_cancelled(self, now: float) -> None:
        self._do_abort("cancelled by receiver", by_peer=True)


ACTION_METHODS: dict[TxAction, Callable[[Sender, float], None]] = {
    TxAction.SEND_HEADER: Sender._send_header,
    TxAction.RESEND: Sender._resend,
    TxAction.EOT_NAKED: Sender._eot_naked,
    TxAction.RESEND_END: Sender._resend_end,
    TxAction.WAIT_DATA_C: Sender._wait_data_c,
    TxAction.WAIT_AGAIN: Sender._wait_again,
    TxAction.SEND_FIRST_BLOCK: Sender._send_first_block,
    TxAction.SEND_NEXT: Sender._send_next,
    TxAction.C_DURING_BLOCK: Sender._c_during_block,
    TxAction.EOT_ACKED: Sender._note_eot_ack,
    TxAction.NUDGE: Sender._nudge,
    TxAction.RECHECK_EOT: Sender._recheck_eot,
    TxAction.CONFIRM_FILE: Sender._confirm_file,
    TxAction.BATCH_DONE: Sender._batch_done,
    TxAction.GIVE_UP: Sender._give_up,
    TxAction.PEER_CANCELLED: Sender._peer_cancelled,
}
"""The method each action runs (after the state is set to the table's target)."""
