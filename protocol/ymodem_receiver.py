"""YMODEM batch receiver, sans-I/O, with the idempotent EOT handshake.

Contract:

- Bytes in with ``receive_data(data, now)``, time in with ``tick(now)`` (seconds, any monotonic
  origin), bytes out with ``data_to_send()``, events out with ``next_event()``;
  ``next_deadline()`` says when ``tick`` must be called next; ``start(now)`` sends the first 'C'
  and ``abort(reason)`` lets the shell refuse the file at any time (name exists, quota, write
  error): unsent output is dropped and CAN CAN queued instead. Nothing here sleeps, reads a clock
  or touches a file.
- Every transition lives in ``RX_TRANSITIONS``, keyed by ``(state, input)`` and giving
  ``(next_state, action)``; an input absent from the table for a state is ignored.
  ``docs/YMODEM.md`` lists the table.
- The EOT handshake: first EOT -> NAK and wait (``WAIT_EOT_CONFIRM``); the next EOT -> ACK,
  ``FileCommitted`` emitted exactly once, then 'C' for the next header; an EOT after the commit ->
  ACK again, no second commit, no error. An EOT counts only when nothing follows it in the same
  burst. A repeat of the last accepted block is ACKed and not delivered again (block 0 only if
  byte-identical to the accepted header, the last data block after the commit likewise: other
  bytes are the next file's block); any other out-of-sequence block cancels.
- A block 0 is read by ``parse_header`` (name inside the block, the size rule); ``FileData``
  never carries bytes beyond the declared size (the 0x1A padding is cut there).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from idemlink.protocol.ymodem_events import (
    Aborted,
    BatchEnded,
    FileCommitted,
    FileData,
    FileStarted,
    HeaderRefused,
    MachineQueues,
)
from idemlink.protocol.ymodem_names import MAX_NAME_BYTES
from idemlink.protocol.ymodem_tables import RX_TRANSITIONS, RxAction, RxIn, RxState
from idemlink.protocol.ymodem_wire import (
    ACK,
    BLOCK_LARGE,
    BLOCK_SMALL,
    CAN,
    CAN_COUNT,
    CRC_REQUEST,
    EOT,
    NAK,
    SOH,
    STX,
    Header,
    HeaderRefusal,
    decode_block,
    parse_header,
)

#: States where an EOT moves towards a commit: it must stand alone (nothing after it in the burst).
_EOT_CHECKED = frozenset((RxState.WAIT_FIRST_BLOCK, RxState.RECV_DATA, RxState.WAIT_EOT_CONFIRM))
#: A damaged or cut block ending in CAN CAN (lrzsz: CAN x10 then BS x10) is the sender cancelling.
_CANCEL_TAIL = re.compile(rb"\x18\x18[\x18\x08]*\Z")


@dataclass(slots=True)
class ReceiverConfig:
    """Timeouts (s) and limits. Defaults follow the YMODEM spec and lrzsz."""

    c_interval: float = 3.0  #: resend 'C' while waiting for a header / the first block
    header_retries: int = 20  #: 'C's sent for one header before giving up
    block_timeout: float = 10.0  #: silence while expecting a block -> NAK
    interbyte_timeout: float = 1.0  #: silence inside a block -> bad packet
    purge_quiet: float = 0.25  #: after a bad block, wait for this much silence before NAK
    eot_confirm_timeout: float = 5.0  #: no second EOT -> NAK again
    max_errors: int = 10  #: consecutive errors before CAN
    #: once the sender has spoken, the longest silence tolerated (then CAN: "sender silent");
    #: without it a sender gone quiet mid-file is waited on for max_errors × block_timeout
    silence_timeout: float | None = 60.0
    max_name_bytes: int = MAX_NAME_BYTES
    max_file_size: int | None = None  #: declared sizes above this are refused


class Receiver(MachineQueues):
    """YMODEM batch receiver. Call ``start(now)`` to send the first 'C'."""

    def __init__(self, config: ReceiverConfig | None = None) -> None:
        super().__init__()
        self.config = config or ReceiverConfig()
        self.state = RxState.WAIT_HEADER
        self._buf = bytearray()
        self._need = 0  # full length of the block being collected (0 = between blocks)
        self._last_byte_at = 0.0
        self._purging = False
        self._pending_can = False
        self._last_block = 0  # number of the last accepted block (0 = header)
        self._errors = 0
        self._header: Header | None = None
        self._header_payload = b""  # block 0 as accepted: only a byte-identical copy is a repeat
        self._received = 0  # payload bytes accepted for the current file
        self._delivered = 0  # bytes delivered in FileData (<= declared size)
        self.commits = 0  # files committed in this batch
        self.abort_reason: str | None = None
        self._refusal = ""
        self._c_sent = 0
        self._block_payload = b""
        self._eot_pending = False  # an EOT read last in this burst: it counts only if it stays last
        self._moved_on = False  # a bad block since the commit: an EOT is no longer a repeat
        self._heard = False  # any byte from the sender yet (the silence limit starts then)

    # public API

    def start(self, now: float) -> None:
        """Send the first 'C' (the receiver speaks first in YMODEM)."""
        self._out.append(CRC_REQUEST)
        self._arm(now, self.config.c_interval)

    def abort(self, reason: str, now: float = 0.0) -> None:
        """The shell refuses to continue (write error, quota, existing file): CAN CAN."""
        if self.state in (RxState.DONE, RxState.ABORTED):
            return
        self._out.clear()
        self._do_abort(reason, by_peer=False)

    def receive_data(self, data: bytes, now: float) -> None:
        """An EOT counts only when nothing follows it in ``data``: a lost SOH/STX turns a block's
        number byte into an apparent EOT, and the bytes after it show it was not one."""
        for b in data:
            if self.state is RxState.ABORTED:
                return
            self._feed_byte(b, now)
        if self._eot_pending:
            self._eot_pending = False
            self._input(RxIn.EOT, now)

    def tick(self, now: float) -> None:
        silent_until = self._silence_deadline()
        if silent_until is not None and now >= silent_until:
            self._do_abort(f"sender silent for {self.config.silence_timeout:g} s", by_peer=False)
            return
        if self._purging:
            if now >= self._purge_end():
                self._purging = False
                self._input(RxIn.BAD_PACKET, now)
            return
        if self._need and now >= self._last_byte_at + self.config.interbyte_timeout:
            self._need = 0
            cancelled = _CANCEL_TAIL.search(self._buf) is not None
            self._buf.clear()
            self._input(RxIn.CANCEL if cancelled else RxIn.BAD_PACKET, now)
            return
        if self._deadline is not None and now >= self._deadline and not self._need:
            self._deadline = None
            self._input(RxIn.TIMEOUT, now)

    def next_deadline(self) -> float | None:
        due = self._protocol_deadline()
        silent_until = self._silence_deadline()
        if silent_until is None:
            return due
        return silent_until if due is None else min(due, silent_until)

    def _protocol_deadline(self) -> float | None:
        if self._purging:
            return self._purge_end()
        if self._need:
            return self._last_byte_at + self.config.interbyte_timeout
        return self._deadline

    def _purge_end(self) -> float:
        """The line quiet for ``purge_quiet``, or the purge's own deadline (``_start_purge``)."""
        quiet = self._last_byte_at + self.config.purge_quiet
        return quiet if self._deadline is None else min(quiet, self._deadline)

    def _silence_deadline(self) -> float | None:
        """When the sender's silence ends the batch (None: no limit, or not started/over)."""
        limit = self.config.silence_timeout
        if limit is None or not self._heard or self.state in (RxState.DONE, RxState.ABORTED):
            return None
        return self._last_byte_at + limit

    # parsing

    def _feed_byte(self, b: int, now: float) -> None:
        self._last_byte_at = now
        self._heard = True
        if self._eot_pending:  # a byte after an EOT in the same burst: the EOT was noise
            self._eot_pending = False
            self._input(RxIn.NOISE, now)
        if self._purging:  # drop everything until the line is quiet, but hear CAN CAN
            if b == CAN and self._pending_can:
                self._pending_can = False
                self._input(RxIn.CANCEL, now)
            else:
                self._pending_can = b == CAN
            return
        if self._need:
            self._buf.append(b)
            if len(self._buf) == self._need:
                self._need = 0
                self._classify_block(bytes(self._buf), now)
                self._buf.clear()
            return
        if b == CAN:
            if self._pending_can:
                self._pending_can = False
                self._input(RxIn.CANCEL, now)
            else:
                self._pending_can = True
            return
        self._pending_can = False
        if b in (SOH, STX):
            self._buf = bytearray((b,))
            self._need = 3 + (BLOCK_SMALL if b == SOH else BLOCK_LARGE) + 2
        elif b == EOT and self.state in _EOT_CHECKED:
            self._eot_pending = True
        elif b == EOT:
            stale = self.state is RxState.WAIT_NEXT_HEADER and self._moved_on
            self._input(RxIn.STALE_EOT if stale else RxIn.EOT, now)
        elif self.state is RxState.WAIT_EOT_CONFIRM:
            self._input(RxIn.NOISE, now)  # only EOT #2 (or a resent block) may come now
        # anything else between blocks is line noise: ignored

    def _classify_block(self, pkt: bytes, now: float) -> None:
        decoded = decode_block(pkt)
        if decoded is None:
            if _CANCEL_TAIL.search(pkt):  # the sender cancelled inside the block
                self._input(RxIn.CANCEL, now)
                return
            self._start_purge(now)  # NAK once the line is quiet
            return
        number, payload = decoded
        if self.state in (RxState.WAIT_HEADER, RxState.WAIT_NEXT_HEADER, RxState.DONE):
            if number != 0:
                # After the commit only a byte-identical copy of the last block is a repeat; a
                # block of that number with other bytes is the next file's (its header was lost
                # and the sender took a re-ACKed EOT for the header's ACK): not ours to ACK.
                dup = (self.state is RxState.WAIT_NEXT_HEADER and number == self._last_block
                       and payload == self._block_payload)
                self._input(RxIn.BLOCK_DUP if dup else RxIn.BLOCK_OTHER, now)
            elif payload[0] == 0:
                self._input(RxIn.END_OF_BATCH, now)
            else:
                parsed = parse_header(payload, self.config.max_name_bytes)
                if (
                    isinstance(parsed, Header)
                    and self.config.max_file_size is not None
                    and parsed.size is not None
                    and parsed.size > self.config.max_file_size
                ):
                    parsed = HeaderRefusal.TOO_LARGE
                if isinstance(parsed, Header):
                    self._header = parsed
                    self._header_payload = payload
                    self._input(RxIn.HEADER, now)
                else:
                    nul = payload.find(b"\x00")
                    raw = payload[: nul if nul >= 0 else len(payload)]
                    self._events.append(HeaderRefused(raw, parsed))
                    self._refusal = f"header refused: {parsed.value}"
                    self._input(RxIn.BAD_HEADER, now)
            return
        self._block_payload = payload
        if number == 0 and self._received == 0 and payload != self._header_payload:
            self._input(RxIn.OTHER_HEADER, now)  # no data yet: block 0 can only be our header
        elif number == (self._last_block + 1) & 0xFF:
            self._input(RxIn.BLOCK_NEXT, now)
        elif number == self._last_block:
            self._input(RxIn.BLOCK_DUP, now)
        else:
            self._input(RxIn.BLOCK_OTHER, now)

    def _input(self, inp: RxIn, now: float) -> None:
        entry = RX_TRANSITIONS.get((self.state, inp))
        if entry is None:
            return
        self.state, action = entry
        ACTION_METHODS[action](self, now)

    # actions

    def _arm(self, now: float, delay: float) -> None:
        self._deadline = now + delay

    def _error(self, reason: str) -> bool:
        """Count an error; True (and aborted) when the limit is reached."""
        self._errors += 1
        if self._errors >= self.config.max_errors:
            self._do_abort(f"too many errors ({reason})", by_peer=False)
            return True
        return False

    def _do_abort(self, reason: str, by_peer: bool) -> None:
        self.state = RxState.ABORTED
        self.abort_reason = reason
        self._deadline = None
        self._purging = self._eot_pending = False
        self._need = 0
        if not by_peer:
            self._out += bytes((CAN,)) * CAN_COUNT
        self._events.append(Aborted(reason, by_peer))

    def _accept_header(self, now: float) -> None:
        h = self._header
        assert h is not None
        self._last_block = 0
        self._received = self._delivered = 0
        self._errors = 0
        self._events.append(FileStarted(h.name, h.size, h.mtime, h.mode))
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)

    def _refuse_header(self, now: float) -> None:
        self._do_abort(self._refusal, by_peer=False)

    def _end_batch(self, now: float) -> None:
        self._out.append(ACK)
        self._deadline = None
        self._events.append(BatchEnded())

    def _ask_header(self, now: float) -> None:
        if self.state is RxState.WAIT_HEADER:  # nobody has spoken yet: a longer patience
            self._c_sent += 1
            if self._c_sent > self.config.header_retries:
                self._do_abort("no sender (no header)", by_peer=False)
                return
        elif self._error("no header"):
            return
        self._out.append(CRC_REQUEST)
        self._arm(now, self.config.c_interval)

    def _ask_first_block(self, now: float) -> None:
        if not self._error("no first block"):
            self._out.append(CRC_REQUEST)
            self._arm(now, self.config.c_interval)

    def _nak_first_block(self, now: float) -> None:
        """A bad block 1 (or noise) before block 1: NAK, not rb's 'C'. Senders resend on either,
        but a 'C' is what a sender that (misled by a late ACK) waits on after an EOT takes for
        "committed, next header"; here 'C' goes out only on the timeout."""
        if not self._error("bad first block"):
            self._out.append(NAK)
            self._arm(now, self.config.c_interval)

    def _cancel_sequence(self, now: float) -> None:
        self._do_abort("block out of sequence", by_peer=False)

    def _cancel_other_header(self, now: float) -> None:
        self._do_abort("a different block 0 before this file's data: the sender moved on without "
                       "our commit", by_peer=False)

    def _peer_cancelled(self, now: float) -> None:
        self._do_abort("cancelled by sender", by_peer=True)

    def _accept_block(self, now: float) -> None:
        payload = self._block_payload
        self._last_block = (self._last_block + 1) & 0xFF
        self._errors = 0
        size = self._header.size if self._header else None
        room = len(payload) if size is None else max(0, min(len(payload), size - self._delivered))
        if room:
            self._events.append(FileData(self._delivered, payload[:room]))
            self._delivered += room
        self._received += len(payload)
        self._out.append(ACK)
        self._arm(now, self.config.block_timeout)

    def _purge(self, now: float) -> None:
        """Bytes where only an EOT may stand: drop the line until it is quiet, then NAK so the
        sender resends what it sent."""
        self._start_purge(now)

    def _start_purge(self, now: float) -> None:
        """Drop the line until it is quiet for ``purge_quiet``, or for at most ``block_timeout``:
        a line that never goes quiet (noise, or a host already back to sending frames faster
        than ``purge_quiet``) still counts an error per ``block_timeout`` and so ends the batch,
        instead of holding the receiver forever."""
        self._purging = True
        self._pending_can = False
        self._last_byte_at = now
        self._arm(now, self.config.block_timeout)

    def _ack_duplicate(self, now: float) -> None:
        self._out.append(ACK)
        self._arm(now, self.config.block_timeout)

    def _ack_only(self, now: float) -> None:
        self._out.append(ACK)

    def _reack_header(self, now: float) -> None:
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)

    def _nak(self, now: float) -> None:
        if not self._error("bad or missing block"):
            self._out.append(NAK)
            timeout = (
                self.config.eot_confirm_timeout
                if self.state is RxState.WAIT_EOT_CONFIRM
                else self.config.block_timeout
            )
            self._arm(now, timeout)

    def _first_eot(self, now: float) -> None:
        size = self._header.size if self._header else None
        if size is not None and self._delivered < size:
            # Guard: the file is incomplete; an EOT here is noise or a short sender.
            self.state = RxState.RECV_DATA
            if not self._error("EOT before the declared size"):
                self._out.append(NAK)
                self._arm(now, self.config.block_timeout)
            return
        self._out.append(NAK)
        self._arm(now, self.config.eot_confirm_timeout)

    def _commit(self, now: float) -> None:
        h = self._header
        assert h is not None
        self.commits += 1
        self._errors = 0
        self._moved_on = False
        self._events.append(FileCommitted(h.name, self._delivered))
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)

    def _ask_next_header(self, now: float) -> None:
        """A bad block after the commit: the sender has sent something other than our file's EOT
        (a header), so from now on an EOT is not a repeat of the committed file's."""
        self._moved_on = True
        self._ask_header(now)

    def _nak_stale_eot(self, now: float) -> None:
        """An EOT after the sender moved on: it ends a file whose header we never accepted, not
        the committed one. ACK 'C' would let the sender report that file; NAK it (an error)."""
        if not self._error("EOT for a file whose header we did not accept"):
            self._out.append(NAK)
            self._arm(now, self.config.c_interval)

    def _reack_eot(self, now: float) -> None:
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)


ACTION_METHODS: dict[RxAction, Callable[[Receiver, float], None]] = {
    RxAction.ACCEPT_HEADER: Receiver._accept_header,
    RxAction.REFUSE_HEADER: Receiver._refuse_header,
    RxAction.END_BATCH: Receiver._end_batch,
    RxAction.ASK_HEADER: Receiver._ask_header,
    RxAction.ASK_NEXT_HEADER: Receiver._ask_next_header,
    RxAction.ASK_FIRST_BLOCK: Receiver._ask_first_block,
    RxAction.NAK_FIRST_BLOCK: Receiver._nak_first_block,
    RxAction.CANCEL_SEQUENCE: Receiver._cancel_sequence,
    RxAction.CANCEL_OTHER_HEADER: Receiver._cancel_other_header,
    RxAction.PEER_CANCELLED: Receiver._peer_cancelled,
    RxAction.ACCEPT_BLOCK: Receiver._accept_block,
    RxAction.PURGE: Receiver._purge,
    RxAction.ACK_DUPLICATE: Receiver._ack_duplicate,
    RxAction.ACK_ONLY: Receiver._ack_only,
    RxAction.REACK_HEADER: Receiver._reack_header,
    RxAction.NAK: Receiver._nak,
    RxAction.FIRST_EOT: Receiver._first_eot,
    RxAction.COMMIT: Receiver._commit,
    RxAction.REACK_EOT: Receiver._reack_eot,
    RxAction.NAK_STALE_EOT: Receiver._nak_stale_eot,
}
"""The method each action runs (after the state is set to the table's target)."""
