"""YMODEM batch sender and receiver, sans-I/O, with seed 004's idempotent EOT handshake.

Contract (both machines):

- Bytes in with ``receive_data(data, now)``, time in with ``tick(now)`` (seconds, any monotonic
  origin), bytes out with ``data_to_send()``, events out with ``next_event()`` / ``events()``.
  ``next_deadline()`` says when ``tick`` must be called next. Nothing here sleeps, reads a clock or
  touches a file: the shell moves bytes and writes files.
- Every transition lives in one table, ``RX_TRANSITIONS`` / ``TX_TRANSITIONS``, keyed by
  ``(state, input)`` and giving ``(next_state, action)``; an input absent from the table for a state
  is ignored. ``docs/YMODEM.md`` prints the tables.
- Receiver EOT machine (seed 004): first EOT -> NAK and wait (``WAIT_EOT_CONFIRM``); the next EOT ->
  ACK, ``FileCommitted`` emitted exactly once, then ``'C'`` for the next header; an EOT after the
  commit -> ACK again, no second commit, no error. A repeat of the last accepted block is ACKed
  and not delivered again (block 0 only if byte-identical to the accepted header, the last data
  block after the commit likewise: other bytes are the next file's block); any other
  out-of-sequence block cancels. Sender: a file counts as delivered only on the receiver's 'C'
  after an ACK to an EOT sent once an earlier EOT of this file had been answered (NAK-first
  receivers give that for free; ACK-first ones like rb get the EOT once more). Speed without a
  weaker proof: no turnaround until the receiver loses a header or block (then ``flush_guard``,
  as rb flushes its input after answering), and one NUL (the "nudge", which any receiver takes
  for noise) when rb sits out its one-second read before a 'C' (at the start, after a slow ACK
  to EOT): it makes the receiver's own answer come sooner and proves nothing.
- Receiver never completes a header from bytes outside the block: a block 0 whose name has no NUL
  inside the block is refused. Names go through ``check_name`` (a pure function returning a typed
  ``NameRefusal``). Size rule: the first metadata field must be 1..20 ASCII digits (no sign, no
  spaces, no hex); an absent metadata string (room for one, all NUL) means "size unknown"; a size
  cut by the block's end, or no room left for one (sb's 123..127-character names), is refused.
  ``FileData`` never carries bytes beyond the declared size (the 0x1A padding is cut there).
- The shell may refuse a file at any time (name exists, quota, write error) with ``abort(reason)``:
  unsent output is dropped and CAN CAN is queued instead.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import crcmod.predefined

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table

# --- wire constants (declared once; exported through contract_section) -------------------------

SOH = 0x01  #: 128-byte block
STX = 0x02  #: 1024-byte block
EOT = 0x04  #: end of file
ACK = 0x06
NAK = 0x15
CAN = 0x18  #: two in a row abort
CRC_REQUEST = 0x43  #: 'C': "send with CRC-16" / "send the next header"
CPMEOF = 0x1A  #: padding of the last block
BLOCK_SMALL = 128
BLOCK_LARGE = 1024
CAN_COUNT = 8  #: CAN bytes we send to abort (the peer needs two in a row)
REGULAR_FILE = 0o100000  #: S_IFREG, always sent with the mode (rb keeps padding without it)
MAX_NAME_BYTES = 255
#: In a 128-byte block 0 whose byte 125 is NUL, sz-family senders (lrzsz sb) put a block count in
#: bytes 126-127 ("a little goodie for IMP/KMD"): those two bytes are not metadata.
_SB_COUNT_AT = 126

crc16 = crcmod.predefined.mkCrcFun("xmodem")
"""CRC-16/XMODEM (poly 0x1021, init 0, not reflected); sent high byte first."""


class YmodemByte(enum.IntEnum):
    """Single control bytes on the wire."""

    SOH = SOH
    STX = STX
    EOT = EOT
    ACK = ACK
    NAK = NAK
    CAN = CAN
    C = CRC_REQUEST
    CPMEOF = CPMEOF


# --- names, sizes, modes (pure functions) -------------------------------------------------------


class NameRefusal(enum.Enum):
    """Why a file name from block 0 was refused."""

    EMPTY = "empty name"
    NOT_UTF8 = "name is not valid UTF-8"
    CONTROL_CHAR = "name contains NUL or a control character"
    ABSOLUTE = "absolute path"
    DRIVE_LETTER = "drive letter or colon"
    PATH_SEPARATOR = "path separator"
    DOT_DOT = "'.' or '..'"
    TOO_LONG = "name too long"
    RESERVED_DEVICE = "Windows reserved device name (CON, PRN, AUX, NUL, COM1-9, LPT1-9)"
    TRAILING_DOT_SPACE = "name ends in '.' or ' ' (Windows drops them)"
    FORMAT_CHAR = "name contains an invisible Unicode format character (bidi override, BOM...)"


class HeaderRefusal(enum.Enum):
    """Why a block 0 was refused (besides the name)."""

    NAME_NOT_TERMINATED = "no NUL after the name inside block 0"
    BAD_SIZE = "declared size is not a plain decimal number"
    SIZE_CUT = "file information cut off by a long name: size unknown"
    TOO_LARGE = "declared size exceeds the receiver's limit"


_SIZE_RE = re.compile(rb"[0-9]{1,20}")
_OCTAL_RE = re.compile(rb"[0-7]{1,22}")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
#: Windows device names, reserved with any extension and in any case ("nul.txt", "Com1");
#: Windows also counts the superscript digits as COM/LPT numbers.
_RESERVED_RE = re.compile(r"(CON|PRN|AUX|NUL|(COM|LPT)[1-9\u00b9\u00b2\u00b3])", re.IGNORECASE)


def check_name(raw: bytes, max_bytes: int = MAX_NAME_BYTES) -> str | NameRefusal:
    """Return the name to use, or why it is refused. The result is always a single plain path
    component: no separator, no '..', no control character, at most ``max_bytes`` bytes."""
    if not raw:
        return NameRefusal.EMPTY
    if len(raw) > max_bytes:
        return NameRefusal.TOO_LONG
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return NameRefusal.NOT_UTF8
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in name):
        return NameRefusal.CONTROL_CHAR
    if name.startswith(("/", "\\")):
        return NameRefusal.ABSOLUTE
    if _DRIVE_RE.match(name) or ":" in name:
        return NameRefusal.DRIVE_LETTER
    if "/" in name or "\\" in name:
        return NameRefusal.PATH_SEPARATOR
    if name in (".", ".."):
        return NameRefusal.DOT_DOT
    if any(unicodedata.category(ch) == "Cf" for ch in name):
        return NameRefusal.FORMAT_CHAR
    if _RESERVED_RE.fullmatch(name.split(".", 1)[0].rstrip(" ")):
        return NameRefusal.RESERVED_DEVICE
    if name.endswith((".", " ")):
        return NameRefusal.TRAILING_DOT_SPACE
    return name


def sanitize_mode(mode: int | None, default: int = 0o644) -> int:
    """Permission bits to apply: never setuid/setgid/sticky, never world-writable."""
    if mode is None:
        return default
    return mode & 0o775


def parse_size(field_: bytes) -> int | None:
    """The size rule: 1..20 ASCII digits, nothing else. Returns None when not plain decimal."""
    return int(field_) if _SIZE_RE.fullmatch(field_) else None


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed block 0."""

    name: str
    size: int | None
    mtime: int | None
    mode: int | None


def parse_header(payload: bytes, max_name: int = MAX_NAME_BYTES) -> Header | NameRefusal | HeaderRefusal:
    """Parse a non-empty block 0 payload (``payload[0] != 0``).

    The metadata is read only from its *area*: after the name's NUL up to the block's end, except
    that in a 128-byte block whose byte 125 is NUL the last two bytes are not metadata (sb and the
    whole sz family write a block count there: "a little goodie for IMP/KMD"; they keep it off only
    when byte 125 is used). A metadata field counts only when a space or NUL follows it inside the
    area: a field running into the area's end is cut. A cut size is refused (``SIZE_CUT``: a
    truncated number would truncate the file); cut later fields (mtime, mode) are ignored.
    "No metadata" (size unknown) needs proof: an area of at least 2 bytes (room for one digit and
    its end) that is all NUL. A shorter area (the name's NUL at 125-127 in a 128-byte block: sb's
    125..127-character names), or an empty first field followed by other bytes, is ``SIZE_CUT``."""
    nul = payload.find(b"\x00")
    if nul < 0:
        return HeaderRefusal.NAME_NOT_TERMINATED
    name = check_name(payload[:nul], max_name)
    if isinstance(name, NameRefusal):
        return name
    area_end = len(payload)
    if len(payload) == BLOCK_SMALL and payload[_SB_COUNT_AT - 1] == 0:
        area_end = _SB_COUNT_AT  # 126-127: sb's block count, not metadata
    area = payload[nul + 1 : area_end]
    if len(area) < 2:
        return HeaderRefusal.SIZE_CUT  # no room for even "0" and its end: size cut or absent?
    end = area.find(b"\x00")
    meta = area[: end if end >= 0 else len(area)]
    if not meta:
        # no metadata only if nothing else stands in the area
        return Header(name, None, None, None) if not area.strip(b"\x00") else HeaderRefusal.SIZE_CUT
    fields = meta.split(b" ")
    if end < 0:
        fields.pop()  # the last field runs into the area's end: cut
        if not fields:
            return HeaderRefusal.SIZE_CUT
    size = parse_size(fields[0])
    if size is None:
        return HeaderRefusal.BAD_SIZE
    mtime = int(fields[1], 8) if len(fields) > 1 and _OCTAL_RE.fullmatch(fields[1]) else None
    mode = int(fields[2], 8) if len(fields) > 2 and _OCTAL_RE.fullmatch(fields[2]) else None
    return Header(name, size, mtime, mode)


def build_header(name: str, size: int, mtime: int, mode: int) -> tuple[int, bytes]:
    """Block 0 payload for a file: ``name NUL "size mtime(octal) mode(octal) 0"``, NUL padded;
    128 bytes when it fits, else 1024 (long names). Returns (block length, payload)."""
    meta = f"{size} {mtime:o} {(mode & 0o7777) | REGULAR_FILE:o} 0".encode("ascii")
    body = name.encode("utf-8") + b"\x00" + meta + b"\x00"
    if len(body) > BLOCK_LARGE:
        raise ValueError(f"name too long for block 0: {name!r}")
    length = BLOCK_SMALL if len(body) <= BLOCK_SMALL else BLOCK_LARGE
    return length, body.ljust(length, b"\x00")


def build_block(number: int, payload: bytes) -> bytes:
    """One framed block: SOH/STX, number, complement, payload, CRC high byte first."""
    lead = SOH if len(payload) == BLOCK_SMALL else STX
    if len(payload) not in (BLOCK_SMALL, BLOCK_LARGE):
        raise ValueError("payload must be 128 or 1024 bytes")
    n = number & 0xFF
    crc: int = crc16(payload)
    return bytes((lead, n, 0xFF - n)) + payload + crc.to_bytes(2, "big")


# --- events -------------------------------------------------------------------------------------


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
    batch ended before the receiver proved the commit (see ``Sender._c_unproven``): the receiver
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


# --- shared plumbing ----------------------------------------------------------------------------


class _Machine:
    """Output queue, event queue and deadline shared by both machines."""

    def __init__(self) -> None:
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self._deadline: float | None = None

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def events(self) -> list[Event]:
        evs = list(self._events)
        self._events.clear()
        return evs

    def next_deadline(self) -> float | None:
        return self._deadline


# --- receiver -----------------------------------------------------------------------------------


class RxState(enum.Enum):
    WAIT_HEADER = "WAIT_HEADER"  #: 'C' sent, no file yet
    WAIT_FIRST_BLOCK = "WAIT_FIRST_BLOCK"  #: header ACKed, 'C' sent for block 1
    RECV_DATA = "RECV_DATA"
    WAIT_EOT_CONFIRM = "WAIT_EOT_CONFIRM"  #: seed S2: first EOT answered NAK
    WAIT_NEXT_HEADER = "WAIT_NEXT_HEADER"  #: file committed, 'C' sent; late EOT -> ACK again
    DONE = "DONE"
    ABORTED = "ABORTED"


class RxIn(enum.Enum):
    HEADER = "HEADER"  #: valid block 0 with a name
    BAD_HEADER = "BAD_HEADER"  #: block 0 refused (name, size, no NUL)
    END_OF_BATCH = "END_OF_BATCH"  #: block 0 with an empty name
    BLOCK_NEXT = "BLOCK_NEXT"
    BLOCK_DUP = "BLOCK_DUP"  #: same number as the last accepted block
    BLOCK_OTHER = "BLOCK_OTHER"
    #: a block 0 before block 1 that is not byte-identical to the accepted header: the sender moved
    #: on (took a late 'C' or ACK for our commit) while we still wait for this file's data
    OTHER_HEADER = "OTHER_HEADER"
    BAD_PACKET = "BAD_PACKET"  #: CRC, complement or inter-byte timeout (after purge)
    EOT = "EOT"
    #: an EOT after the commit once a block (good or bad) has arrived since: the sender moved on to
    #: another header, so this EOT is not a repeat of the committed file's (review 3)
    STALE_EOT = "STALE_EOT"
    NOISE = "NOISE"  #: a byte where only an EOT may stand: right after an EOT, or before EOT #2
    CANCEL = "CANCEL"  #: CAN CAN (also while purging, or ending a damaged block)
    TIMEOUT = "TIMEOUT"


_R = RxState
_I = RxIn

#: (state, input) -> (next state, action). Absent pairs are ignored. Actions that can fail a
#: guard (an incomplete file at EOT, the error limit) may end elsewhere; the table names the
#: usual target and docs/YMODEM.md lists the guards.
RX_TRANSITIONS: dict[tuple[RxState, RxIn], tuple[RxState, str]] = {
    (_R.WAIT_HEADER, _I.HEADER): (_R.WAIT_FIRST_BLOCK, "accept_header"),  # ACK 'C'
    (_R.WAIT_HEADER, _I.BAD_HEADER): (_R.ABORTED, "refuse_header"),  # CAN CAN
    (_R.WAIT_HEADER, _I.END_OF_BATCH): (_R.DONE, "end_batch"),  # ACK
    (_R.WAIT_HEADER, _I.BAD_PACKET): (_R.WAIT_HEADER, "ask_header"),  # 'C'
    (_R.WAIT_HEADER, _I.TIMEOUT): (_R.WAIT_HEADER, "ask_header"),  # 'C'
    (_R.WAIT_HEADER, _I.BLOCK_OTHER): (_R.ABORTED, "cancel_sequence"),
    (_R.WAIT_HEADER, _I.CANCEL): (_R.ABORTED, "peer_cancelled"),
    (_R.WAIT_FIRST_BLOCK, _I.BLOCK_NEXT): (_R.RECV_DATA, "accept_block"),  # ACK
    (_R.WAIT_FIRST_BLOCK, _I.BLOCK_DUP): (_R.WAIT_FIRST_BLOCK, "reack_header"),  # same header: ACK 'C'
    (_R.WAIT_FIRST_BLOCK, _I.OTHER_HEADER): (_R.ABORTED, "cancel_other_header"),  # CAN CAN
    (_R.WAIT_FIRST_BLOCK, _I.BLOCK_OTHER): (_R.ABORTED, "cancel_sequence"),
    (_R.WAIT_FIRST_BLOCK, _I.BAD_PACKET): (_R.WAIT_FIRST_BLOCK, "nak_first_block"),  # NAK
    (_R.WAIT_FIRST_BLOCK, _I.TIMEOUT): (_R.WAIT_FIRST_BLOCK, "ask_first_block"),  # 'C'
    (_R.WAIT_FIRST_BLOCK, _I.EOT): (_R.WAIT_EOT_CONFIRM, "first_eot"),  # NAK (empty file)
    (_R.WAIT_FIRST_BLOCK, _I.NOISE): (_R.WAIT_FIRST_BLOCK, "purge"),  # then 'C'
    (_R.WAIT_FIRST_BLOCK, _I.CANCEL): (_R.ABORTED, "peer_cancelled"),
    (_R.RECV_DATA, _I.BLOCK_NEXT): (_R.RECV_DATA, "accept_block"),  # ACK
    (_R.RECV_DATA, _I.BLOCK_DUP): (_R.RECV_DATA, "ack_duplicate"),  # ACK, nothing delivered
    (_R.RECV_DATA, _I.BLOCK_OTHER): (_R.ABORTED, "cancel_sequence"),  # CAN CAN
    (_R.RECV_DATA, _I.OTHER_HEADER): (_R.ABORTED, "cancel_other_header"),  # no block 1 yet
    (_R.RECV_DATA, _I.BAD_PACKET): (_R.RECV_DATA, "nak"),
    (_R.RECV_DATA, _I.TIMEOUT): (_R.RECV_DATA, "nak"),
    (_R.RECV_DATA, _I.EOT): (_R.WAIT_EOT_CONFIRM, "first_eot"),  # NAK
    (_R.RECV_DATA, _I.NOISE): (_R.RECV_DATA, "purge"),  # the "EOT" was a block's number byte
    (_R.RECV_DATA, _I.CANCEL): (_R.ABORTED, "peer_cancelled"),
    (_R.WAIT_EOT_CONFIRM, _I.EOT): (_R.WAIT_NEXT_HEADER, "commit"),  # ACK, commit once, 'C'
    (_R.WAIT_EOT_CONFIRM, _I.TIMEOUT): (_R.WAIT_EOT_CONFIRM, "nak"),
    (_R.WAIT_EOT_CONFIRM, _I.BAD_PACKET): (_R.WAIT_EOT_CONFIRM, "nak"),
    (_R.WAIT_EOT_CONFIRM, _I.BLOCK_NEXT): (_R.RECV_DATA, "accept_block"),  # the EOT was noise
    (_R.WAIT_EOT_CONFIRM, _I.BLOCK_DUP): (_R.RECV_DATA, "ack_duplicate"),
    (_R.WAIT_EOT_CONFIRM, _I.BLOCK_OTHER): (_R.ABORTED, "cancel_sequence"),
    (_R.WAIT_EOT_CONFIRM, _I.OTHER_HEADER): (_R.ABORTED, "cancel_other_header"),  # empty file
    (_R.WAIT_EOT_CONFIRM, _I.NOISE): (_R.RECV_DATA, "purge"),  # the EOT was noise: NAK when quiet
    (_R.WAIT_EOT_CONFIRM, _I.CANCEL): (_R.ABORTED, "peer_cancelled"),
    (_R.WAIT_NEXT_HEADER, _I.EOT): (_R.WAIT_NEXT_HEADER, "reack_eot"),  # ACK 'C', no commit
    (_R.WAIT_NEXT_HEADER, _I.STALE_EOT): (_R.WAIT_NEXT_HEADER, "nak_stale_eot"),  # NAK, error
    (_R.WAIT_NEXT_HEADER, _I.HEADER): (_R.WAIT_FIRST_BLOCK, "accept_header"),
    (_R.WAIT_NEXT_HEADER, _I.BAD_HEADER): (_R.ABORTED, "refuse_header"),
    (_R.WAIT_NEXT_HEADER, _I.END_OF_BATCH): (_R.DONE, "end_batch"),
    (_R.WAIT_NEXT_HEADER, _I.BAD_PACKET): (_R.WAIT_NEXT_HEADER, "ask_next_header"),  # 'C'; moved on
    (_R.WAIT_NEXT_HEADER, _I.TIMEOUT): (_R.WAIT_NEXT_HEADER, "ask_header"),
    (_R.WAIT_NEXT_HEADER, _I.BLOCK_DUP): (_R.WAIT_NEXT_HEADER, "ack_only"),
    (_R.WAIT_NEXT_HEADER, _I.BLOCK_OTHER): (_R.ABORTED, "cancel_sequence"),
    (_R.WAIT_NEXT_HEADER, _I.CANCEL): (_R.ABORTED, "peer_cancelled"),
    (_R.DONE, _I.END_OF_BATCH): (_R.DONE, "ack_only"),  # our final ACK was lost
}


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


class Receiver(_Machine):
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
            if now >= self._last_byte_at + self.config.purge_quiet:  # same sum as next_deadline
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
            return self._last_byte_at + self.config.purge_quiet
        if self._need:
            return self._last_byte_at + self.config.interbyte_timeout
        return self._deadline

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
        number, comp, payload = pkt[1], pkt[2], pkt[3:-2]
        if number ^ comp != 0xFF or crc16(pkt[3:]) != 0:
            if _CANCEL_TAIL.search(pkt):  # the sender cancelled inside the block
                self._input(RxIn.CANCEL, now)
                return
            self._purging = True  # NAK once the line is quiet
            self._pending_can = False
            return
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
        target, action = entry
        self.state = target
        getattr(self, "_rx_" + action)(now)

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

    def _rx_accept_header(self, now: float) -> None:
        h = self._header
        assert h is not None
        self._last_block = 0
        self._received = self._delivered = 0
        self._errors = 0
        self._events.append(FileStarted(h.name, h.size, h.mtime, h.mode))
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)

    def _rx_refuse_header(self, now: float) -> None:
        self._do_abort(self._refusal, by_peer=False)

    def _rx_end_batch(self, now: float) -> None:
        self._out.append(ACK)
        self._deadline = None
        self._events.append(BatchEnded())

    def _rx_ask_header(self, now: float) -> None:
        if self.state is RxState.WAIT_HEADER:  # nobody has spoken yet: a longer patience
            self._c_sent += 1
            if self._c_sent > self.config.header_retries:
                self._do_abort("no sender (no header)", by_peer=False)
                return
        elif self._error("no header"):
            return
        self._out.append(CRC_REQUEST)
        self._arm(now, self.config.c_interval)

    def _rx_ask_first_block(self, now: float) -> None:
        if not self._error("no first block"):
            self._out.append(CRC_REQUEST)
            self._arm(now, self.config.c_interval)

    def _rx_nak_first_block(self, now: float) -> None:
        """A bad block 1 (or noise) before block 1: NAK, not rb's 'C'. Senders resend on either,
        but a 'C' is what a sender that (misled by a late ACK) waits on after an EOT takes for
        "committed, next header"; here 'C' goes out only on the timeout (review 3)."""
        if not self._error("bad first block"):
            self._out.append(NAK)
            self._arm(now, self.config.c_interval)

    def _rx_cancel_sequence(self, now: float) -> None:
        self._do_abort("block out of sequence", by_peer=False)

    def _rx_cancel_other_header(self, now: float) -> None:
        self._do_abort("a different block 0 before this file's data: the sender moved on without "
                       "our commit", by_peer=False)

    def _rx_peer_cancelled(self, now: float) -> None:
        self._do_abort("cancelled by sender", by_peer=True)

    def _rx_accept_block(self, now: float) -> None:
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

    def _rx_purge(self, now: float) -> None:
        """Bytes where only an EOT may stand: drop the line until it is quiet, then NAK so the
        sender resends what it sent."""
        self._purging = True
        self._pending_can = False
        self._last_byte_at = now

    def _rx_ack_duplicate(self, now: float) -> None:
        self._out.append(ACK)
        self._arm(now, self.config.block_timeout)

    def _rx_ack_only(self, now: float) -> None:
        self._out.append(ACK)

    def _rx_reack_header(self, now: float) -> None:
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)

    def _rx_nak(self, now: float) -> None:
        if not self._error("bad or missing block"):
            self._out.append(NAK)
            timeout = (
                self.config.eot_confirm_timeout
                if self.state is RxState.WAIT_EOT_CONFIRM
                else self.config.block_timeout
            )
            self._arm(now, timeout)

    def _rx_first_eot(self, now: float) -> None:
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

    def _rx_commit(self, now: float) -> None:
        h = self._header
        assert h is not None
        self.commits += 1
        self._errors = 0
        self._moved_on = False
        self._events.append(FileCommitted(h.name, self._delivered))
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)

    def _rx_ask_next_header(self, now: float) -> None:
        """A bad block after the commit: the sender has sent something other than our file's EOT
        (a header), so from now on an EOT is not a repeat of the committed file's."""
        self._moved_on = True
        self._rx_ask_header(now)

    def _rx_nak_stale_eot(self, now: float) -> None:
        """An EOT after the sender moved on: it ends a file whose header we never accepted, not
        the committed one. ACK 'C' would let the sender report that file; NAK it (an error)."""
        if not self._error("EOT for a file whose header we did not accept"):
            self._out.append(NAK)
            self._arm(now, self.config.c_interval)

    def _rx_reack_eot(self, now: float) -> None:
        self._out += bytes((ACK, CRC_REQUEST))
        self._arm(now, self.config.c_interval)


# --- sender -------------------------------------------------------------------------------------


class TxState(enum.Enum):
    WAIT_START = "WAIT_START"  #: waiting for the receiver's first 'C'
    SENT_HEADER = "SENT_HEADER"
    WAIT_DATA_C = "WAIT_DATA_C"  #: header ACKed; waiting for 'C' to send block 1
    SENT_BLOCK = "SENT_BLOCK"
    SENT_EOT1 = "SENT_EOT1"
    SENT_EOT2 = "SENT_EOT2"  #: after NAK (or 'C') to the first EOT
    WAIT_NEXT_C = "WAIT_NEXT_C"  #: EOT ACKed; waiting for 'C' before the next block 0
    SENT_END = "SENT_END"  #: empty block 0 sent
    DONE = "DONE"
    ABORTED = "ABORTED"


class TxIn(enum.Enum):
    ACK = "ACK"
    NAK = "NAK"
    C = "C"
    #: 'C' in WAIT_NEXT_C when the ACK we took for the EOT did not answer an EOT sent *after* an
    #: earlier EOT of this file had been answered (ACK or NAK): that ACK may be a late copy (of a
    #: block's or the header's ACK), and a receiver still waiting for block 1 sends 'C' too
    #: (timeout, bad packet), so this 'C' does not prove a commit
    C_UNPROVEN = "C_UNPROVEN"
    CANCEL = "CANCEL"
    TIMEOUT = "TIMEOUT"
    #: ``nudge_after`` passed with no 'C' (at the start, or after an ACK to EOT): the receiver may
    #: be sitting out a one-second read before its 'C' (rb reads one byte, with a 1 s timeout,
    #: before every 'C' that asks for a header), or have sent its 'C' before our port was open
    QUIET = "QUIET"


_S = TxState
_T = TxIn

TX_TRANSITIONS: dict[tuple[TxState, TxIn], tuple[TxState, str]] = {
    (_S.WAIT_START, _T.C): (_S.SENT_HEADER, "send_header"),
    (_S.WAIT_START, _T.TIMEOUT): (_S.ABORTED, "give_up"),
    (_S.WAIT_START, _T.QUIET): (_S.WAIT_START, "nudge"),  # rb's 'C' comes at once, or after 1 s
    (_S.WAIT_START, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
    (_S.SENT_HEADER, _T.ACK): (_S.WAIT_DATA_C, "wait_data_c"),
    (_S.SENT_HEADER, _T.NAK): (_S.SENT_HEADER, "resend"),
    (_S.SENT_HEADER, _T.C): (_S.SENT_HEADER, "resend"),  # 'C' = NAK here (rb)
    (_S.SENT_HEADER, _T.TIMEOUT): (_S.SENT_HEADER, "resend"),
    (_S.SENT_HEADER, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
    (_S.WAIT_DATA_C, _T.C): (_S.SENT_BLOCK, "send_first_block"),  # or EOT for an empty file
    (_S.WAIT_DATA_C, _T.TIMEOUT): (_S.WAIT_DATA_C, "wait_again"),
    (_S.WAIT_DATA_C, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
    (_S.SENT_BLOCK, _T.ACK): (_S.SENT_BLOCK, "send_next"),  # or EOT after the last block
    (_S.SENT_BLOCK, _T.NAK): (_S.SENT_BLOCK, "resend"),
    (_S.SENT_BLOCK, _T.C): (_S.SENT_BLOCK, "c_during_block"),  # NAK for block 1, else noise
    (_S.SENT_BLOCK, _T.TIMEOUT): (_S.SENT_BLOCK, "resend"),
    (_S.SENT_BLOCK, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
    (_S.SENT_EOT1, _T.ACK): (_S.WAIT_NEXT_C, "eot_acked"),  # rb: ACK at once
    (_S.SENT_EOT1, _T.NAK): (_S.SENT_EOT2, "eot_naked"),  # seed 004: NAK, then confirm
    (_S.SENT_EOT1, _T.C): (_S.SENT_EOT2, "resend"),
    (_S.SENT_EOT1, _T.TIMEOUT): (_S.SENT_EOT1, "resend"),  # NAK lost: the resend confirms
    (_S.SENT_EOT1, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
    (_S.SENT_EOT2, _T.ACK): (_S.WAIT_NEXT_C, "eot_acked"),
    (_S.SENT_EOT2, _T.NAK): (_S.SENT_EOT2, "eot_naked"),
    (_S.SENT_EOT2, _T.C): (_S.SENT_EOT2, "resend"),  # our ACK lost, receiver moved on
    (_S.SENT_EOT2, _T.TIMEOUT): (_S.SENT_EOT2, "resend"),
    (_S.SENT_EOT2, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
    (_S.WAIT_NEXT_C, _T.C): (_S.SENT_HEADER, "confirm_file"),  # FileCommitted, next block 0
    (_S.WAIT_NEXT_C, _T.C_UNPROVEN): (_S.SENT_EOT2, "recheck_eot"),  # no proof yet: EOT again
    (_S.WAIT_NEXT_C, _T.NAK): (_S.SENT_EOT2, "eot_naked"),  # the receiver did not take the EOT
    (_S.WAIT_NEXT_C, _T.TIMEOUT): (_S.WAIT_NEXT_C, "wait_again"),
    (_S.WAIT_NEXT_C, _T.QUIET): (_S.WAIT_NEXT_C, "nudge"),  # one NUL: rb's 1 s read ends at once
    (_S.WAIT_NEXT_C, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
    (_S.SENT_END, _T.ACK): (_S.DONE, "batch_done"),
    (_S.SENT_END, _T.NAK): (_S.SENT_END, "resend"),
    (_S.SENT_END, _T.C): (_S.SENT_END, "resend"),
    (_S.SENT_END, _T.TIMEOUT): (_S.SENT_END, "resend_end"),  # gives up with success
    (_S.SENT_END, _T.CANCEL): (_S.ABORTED, "peer_cancelled"),
}


NUDGE = 0x00  #: the byte sent to end a receiver's wait-for-any-byte (see ``nudge_after``)


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


class Sender(_Machine):
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
        target, action = entry
        self.state = target
        self._nudge_at = None  # only the ACK to an EOT (re)starts it
        getattr(self, "_tx_" + action)(now, inp)

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

    # actions (the table names them; ``inp`` is the input that fired)

    def _tx_send_header(self, now: float, inp: TxIn) -> None:
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

    def _tx_resend(self, now: float, inp: TxIn) -> None:
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

    def _tx_eot_naked(self, now: float, inp: TxIn) -> None:
        """A NAK to an EOT (seed 004's first answer, or the receiver refusing it): EOT again."""
        self._eot_answered = True
        self._tx_resend(now, inp)

    def _tx_resend_end(self, now: float, inp: TxIn) -> None:
        self._retries += 1
        if self._retries > self.config.end_retries:
            self.state = TxState.DONE
            self._deadline = None
            self._events.append(BatchEnded(final_ack=False))
            return
        self._send(self._current, now, self.config.end_timeout)

    def _tx_wait_data_c(self, now: float, inp: TxIn) -> None:
        self._retries = 0
        self._deadline = now + self.config.c_timeout

    def _tx_wait_again(self, now: float, inp: TxIn) -> None:
        self._retries += 1
        if self._retries > self.config.max_retries:
            self._do_abort("no 'C' from the receiver", by_peer=False)
            return
        self._deadline = now + self.config.c_timeout

    def _tx_send_first_block(self, now: float, inp: TxIn) -> None:
        self._retries = 0
        self._block_no = 1
        if self.files[self._index].size == 0:
            self.state = TxState.SENT_EOT1
            self._final_sent = True
            self._send(bytes((EOT,)), now, self.config.eot_timeout)
            return
        self._send(self._next_block(), now, self.config.ack_timeout)

    def _tx_send_next(self, now: float, inp: TxIn) -> None:
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

    def _tx_c_during_block(self, now: float, inp: TxIn) -> None:
        if self._block_no == 1 and self._offset == 0:
            self._tx_resend(now, inp)

    def _tx_eot_acked(self, now: float, inp: TxIn) -> None:
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

    def _tx_nudge(self, now: float, inp: TxIn) -> None:
        """No 'C' yet (at the start, or after the EOT's ACK): one NUL, straight out (not an
        answer, so no turnaround and nothing read meanwhile is stale). rb reads one byte with a
        1 s timeout before every 'C' asking for a header; the NUL ends that read, and the 'C'
        (or the EOT re-check it starts) comes a second sooner. Any receiver takes it for line
        noise: ours ignores it after a commit and NAKs it before one (never 'C'), so it cannot
        forge the proof."""
        self.nudges += 1
        self._out.append(NUDGE)

    def _tx_recheck_eot(self, now: float, inp: TxIn) -> None:
        """Unproven 'C' after the EOT's ACK: send the EOT again. A receiver that committed ACKs it
        again and sends 'C' (now proof); one still waiting for block 1 NAKs it (the size guard,
        or seed 004's first NAK for an empty file) and never sends 'C' for this file again."""
        self._tx_resend(now, inp)

    def _tx_confirm_file(self, now: float, inp: TxIn) -> None:
        f = self.files[self._index]
        self._eot_acked = self._final_sent = False
        self.committed.append(f.name)
        self._events.append(FileCommitted(f.name, f.size))
        self._index += 1
        self._tx_send_header(now, inp)

    def _tx_batch_done(self, now: float, inp: TxIn) -> None:
        self._deadline = None
        self._events.append(BatchEnded(final_ack=True))

    def _tx_give_up(self, now: float, inp: TxIn) -> None:
        self._do_abort("no receiver ('C') before the start timeout", by_peer=False)

    def _tx_peer_cancelled(self, now: float, inp: TxIn) -> None:
        self._do_abort("cancelled by receiver", by_peer=True)


# --- contract -----------------------------------------------------------------------------------


def contract_section() -> ContractSection:
    """YMODEM wire bytes and the two transition tables."""
    rx_rows = [[s.value, i.value, t.value, a] for (s, i), (t, a) in RX_TRANSITIONS.items()]
    tx_rows = [[s.value, i.value, t.value, a] for (s, i), (t, a) in TX_TRANSITIONS.items()]
    md = (
        "## YMODEM\n\n"
        "CRC-16/XMODEM, 128-byte (SOH) and 1024-byte (STX) blocks, block 0 = "
        "`name NUL \"size mtime(octal) mode(octal) 0\"`; an empty name ends the batch.\n\n"
        "### Receiver transitions\n\n" + md_table(["state", "input", "next", "action"], rx_rows)
        + "\n### Sender transitions\n\n" + md_table(["state", "input", "next", "action"], tx_rows)
    )
    return ContractSection(
        name="ymodem",
        defines=[
            CDefine("IDL_YM_BLOCK_SMALL", BLOCK_SMALL, "SOH payload bytes"),
            CDefine("IDL_YM_BLOCK_LARGE", BLOCK_LARGE, "STX payload bytes"),
            CDefine("IDL_YM_MAX_NAME", MAX_NAME_BYTES, "longest accepted file name (bytes)"),
            CDefine("IDL_YM_S_IFREG", f"0{REGULAR_FILE:o}u", "regular-file bit sent with the mode"),
        ],
        enums=[CEnum("idl_ym_byte_t", "IDL_YM", YmodemByte, "YMODEM control bytes")],
        markdown=md,
        data={  # wire facts only: the tables are behaviour, documented but not hashed
            "bytes": {m.name: m.value for m in YmodemByte},
            "blocks": [BLOCK_SMALL, BLOCK_LARGE],
            "max_name": MAX_NAME_BYTES,
            "s_ifreg": REGULAR_FILE,
            "crc": "CRC-16/XMODEM",
        },
    )
