"""The YMODEM transition tables: every state, input and action of both machines, and each
``(state, input) -> (next state, action)`` row.

Contract: data only. ``Receiver`` and ``Sender`` run these tables (an input absent for a state is
ignored; an action may end elsewhere when a guard fails, as its method says); docs/YMODEM.md lists
every row (a test checks it) and ``idemlink.protocol.ymodem.contract_section`` prints them. Action
values are the names the contract documents.
"""

from __future__ import annotations

import enum

# --- receiver ------------------------------------------------------------------------------------


class RxState(enum.Enum):
    """Receiver states."""

    WAIT_HEADER = "WAIT_HEADER"  #: 'C' sent, no file yet
    WAIT_FIRST_BLOCK = "WAIT_FIRST_BLOCK"  #: header ACKed, 'C' sent for block 1
    RECV_DATA = "RECV_DATA"
    WAIT_EOT_CONFIRM = "WAIT_EOT_CONFIRM"  #: first EOT answered NAK, waiting for the second
    WAIT_NEXT_HEADER = "WAIT_NEXT_HEADER"  #: file committed, 'C' sent; late EOT -> ACK again
    DONE = "DONE"
    ABORTED = "ABORTED"


class RxIn(enum.Enum):
    """Receiver inputs: what a received block, byte or timeout is classified as."""

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
    #: another header, so this EOT is not a repeat of the committed file's
    STALE_EOT = "STALE_EOT"
    NOISE = "NOISE"  #: a byte where only an EOT may stand: right after an EOT, or before EOT #2
    CANCEL = "CANCEL"  #: CAN CAN (also while purging, or ending a damaged block)
    TIMEOUT = "TIMEOUT"



class RxAction(enum.Enum):
    """What a transition does (``Receiver`` maps each to one method)."""

    ACCEPT_HEADER = "accept_header"  #: ACK 'C', FileStarted
    REFUSE_HEADER = "refuse_header"  #: CAN CAN (HeaderRefused already emitted)
    END_BATCH = "end_batch"  #: ACK, BatchEnded
    ASK_HEADER = "ask_header"  #: 'C'
    ASK_NEXT_HEADER = "ask_next_header"  #: 'C'; an EOT from now on is STALE_EOT
    ASK_FIRST_BLOCK = "ask_first_block"  #: 'C'
    NAK_FIRST_BLOCK = "nak_first_block"  #: NAK (never 'C': see the method)
    CANCEL_SEQUENCE = "cancel_sequence"  #: CAN CAN: block out of sequence
    CANCEL_OTHER_HEADER = "cancel_other_header"  #: CAN CAN: the sender moved on
    PEER_CANCELLED = "peer_cancelled"  #: Aborted(by_peer)
    ACCEPT_BLOCK = "accept_block"  #: ACK, FileData
    PURGE = "purge"  #: drop input until quiet, then NAK
    ACK_DUPLICATE = "ack_duplicate"  #: ACK, nothing delivered
    ACK_ONLY = "ack_only"  #: ACK
    REACK_HEADER = "reack_header"  #: ACK 'C' for the repeated header
    NAK = "nak"  #: NAK, counts an error
    FIRST_EOT = "first_eot"  #: NAK (guard: short of the declared size)
    COMMIT = "commit"  #: ACK, FileCommitted (the only commit), 'C'
    REACK_EOT = "reack_eot"  #: ACK 'C' again, no commit
    NAK_STALE_EOT = "nak_stale_eot"  #: NAK, counts an error

_R = RxState
_I = RxIn
_RA = RxAction

#: (state, input) -> (next state, action). Absent pairs are ignored. Actions that can fail a
#: guard (an incomplete file at EOT, the error limit) may end elsewhere; the table names the
#: usual target and docs/YMODEM.md lists the guards.
RX_TRANSITIONS: dict[tuple[RxState, RxIn], tuple[RxState, RxAction]] = {
    (_R.WAIT_HEADER, _I.HEADER): (_R.WAIT_FIRST_BLOCK, _RA.ACCEPT_HEADER),  # ACK 'C'
    (_R.WAIT_HEADER, _I.BAD_HEADER): (_R.ABORTED, _RA.REFUSE_HEADER),  # CAN CAN
    (_R.WAIT_HEADER, _I.END_OF_BATCH): (_R.DONE, _RA.END_BATCH),  # ACK
    (_R.WAIT_HEADER, _I.BAD_PACKET): (_R.WAIT_HEADER, _RA.ASK_HEADER),  # 'C'
    (_R.WAIT_HEADER, _I.TIMEOUT): (_R.WAIT_HEADER, _RA.ASK_HEADER),  # 'C'
    (_R.WAIT_HEADER, _I.BLOCK_OTHER): (_R.ABORTED, _RA.CANCEL_SEQUENCE),
    (_R.WAIT_HEADER, _I.CANCEL): (_R.ABORTED, _RA.PEER_CANCELLED),
    (_R.WAIT_FIRST_BLOCK, _I.BLOCK_NEXT): (_R.RECV_DATA, _RA.ACCEPT_BLOCK),  # ACK
    (_R.WAIT_FIRST_BLOCK, _I.BLOCK_DUP): (_R.WAIT_FIRST_BLOCK, _RA.REACK_HEADER),  # same header: ACK 'C'
    (_R.WAIT_FIRST_BLOCK, _I.OTHER_HEADER): (_R.ABORTED, _RA.CANCEL_OTHER_HEADER),  # CAN CAN
    (_R.WAIT_FIRST_BLOCK, _I.BLOCK_OTHER): (_R.ABORTED, _RA.CANCEL_SEQUENCE),
    (_R.WAIT_FIRST_BLOCK, _I.BAD_PACKET): (_R.WAIT_FIRST_BLOCK, _RA.NAK_FIRST_BLOCK),  # NAK
    (_R.WAIT_FIRST_BLOCK, _I.TIMEOUT): (_R.WAIT_FIRST_BLOCK, _RA.ASK_FIRST_BLOCK),  # 'C'
    (_R.WAIT_FIRST_BLOCK, _I.EOT): (_R.WAIT_EOT_CONFIRM, _RA.FIRST_EOT),  # NAK (empty file)
    (_R.WAIT_FIRST_BLOCK, _I.NOISE): (_R.WAIT_FIRST_BLOCK, _RA.PURGE),  # then 'C'
    (_R.WAIT_FIRST_BLOCK, _I.CANCEL): (_R.ABORTED, _RA.PEER_CANCELLED),
    (_R.RECV_DATA, _I.BLOCK_NEXT): (_R.RECV_DATA, _RA.ACCEPT_BLOCK),  # ACK
    (_R.RECV_DATA, _I.BLOCK_DUP): (_R.RECV_DATA, _RA.ACK_DUPLICATE),  # ACK, nothing delivered
    (_R.RECV_DATA, _I.BLOCK_OTHER): (_R.ABORTED, _RA.CANCEL_SEQUENCE),  # CAN CAN
    (_R.RECV_DATA, _I.OTHER_HEADER): (_R.ABORTED, _RA.CANCEL_OTHER_HEADER),  # no block 1 yet
    (_R.RECV_DATA, _I.BAD_PACKET): (_R.RECV_DATA, _RA.NAK),
    (_R.RECV_DATA, _I.TIMEOUT): (_R.RECV_DATA, _RA.NAK),
    (_R.RECV_DATA, _I.EOT): (_R.WAIT_EOT_CONFIRM, _RA.FIRST_EOT),  # NAK
    (_R.RECV_DATA, _I.NOISE): (_R.RECV_DATA, _RA.PURGE),  # the "EOT" was a block's number byte
    (_R.RECV_DATA, _I.CANCEL): (_R.ABORTED, _RA.PEER_CANCELLED),
    (_R.WAIT_EOT_CONFIRM, _I.EOT): (_R.WAIT_NEXT_HEADER, _RA.COMMIT),  # ACK, commit once, 'C'
    (_R.WAIT_EOT_CONFIRM, _I.TIMEOUT): (_R.WAIT_EOT_CONFIRM, _RA.NAK),
    (_R.WAIT_EOT_CONFIRM, _I.BAD_PACKET): (_R.WAIT_EOT_CONFIRM, _RA.NAK),
    (_R.WAIT_EOT_CONFIRM, _I.BLOCK_NEXT): (_R.RECV_DATA, _RA.ACCEPT_BLOCK),  # the EOT was noise
    (_R.WAIT_EOT_CONFIRM, _I.BLOCK_DUP): (_R.RECV_DATA, _RA.ACK_DUPLICATE),
    (_R.WAIT_EOT_CONFIRM, _I.BLOCK_OTHER): (_R.ABORTED, _RA.CANCEL_SEQUENCE),
    (_R.WAIT_EOT_CONFIRM, _I.OTHER_HEADER): (_R.ABORTED, _RA.CANCEL_OTHER_HEADER),  # empty file
    (_R.WAIT_EOT_CONFIRM, _I.NOISE): (_R.RECV_DATA, _RA.PURGE),  # the EOT was noise: NAK when quiet
    (_R.WAIT_EOT_CONFIRM, _I.CANCEL): (_R.ABORTED, _RA.PEER_CANCELLED),
    (_R.WAIT_NEXT_HEADER, _I.EOT): (_R.WAIT_NEXT_HEADER, _RA.REACK_EOT),  # ACK 'C', no commit
    (_R.WAIT_NEXT_HEADER, _I.STALE_EOT): (_R.WAIT_NEXT_HEADER, _RA.NAK_STALE_EOT),  # NAK, error
    (_R.WAIT_NEXT_HEADER, _I.HEADER): (_R.WAIT_FIRST_BLOCK, _RA.ACCEPT_HEADER),
    (_R.WAIT_NEXT_HEADER, _I.BAD_HEADER): (_R.ABORTED, _RA.REFUSE_HEADER),
    (_R.WAIT_NEXT_HEADER, _I.END_OF_BATCH): (_R.DONE, _RA.END_BATCH),
    (_R.WAIT_NEXT_HEADER, _I.BAD_PACKET): (_R.WAIT_NEXT_HEADER, _RA.ASK_NEXT_HEADER),  # 'C'; moved on
    (_R.WAIT_NEXT_HEADER, _I.TIMEOUT): (_R.WAIT_NEXT_HEADER, _RA.ASK_HEADER),
    (_R.WAIT_NEXT_HEADER, _I.BLOCK_DUP): (_R.WAIT_NEXT_HEADER, _RA.ACK_ONLY),
    (_R.WAIT_NEXT_HEADER, _I.BLOCK_OTHER): (_R.ABORTED, _RA.CANCEL_SEQUENCE),
    (_R.WAIT_NEXT_HEADER, _I.CANCEL): (_R.ABORTED, _RA.PEER_CANCELLED),
    (_R.DONE, _I.END_OF_BATCH): (_R.DONE, _RA.ACK_ONLY),  # our final ACK was lost
}


# --- sender --------------------------------------------------------------------------------------


class TxState(enum.Enum):
    """Sender states."""

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
    """Sender inputs: the receiver's answers and the sender's timers."""

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


class TxAction(enum.Enum):
    """What a transition does (``Sender`` maps each to one method)."""

    SEND_HEADER = "send_header"  #: block 0 of the next file, or the empty block 0 ending the batch
    RESEND = "resend"  #: the same frame again (the retry limit cancels)
    EOT_NAKED = "eot_naked"  #: EOT again; the EOT is now answered
    RESEND_END = "resend_end"  #: the empty block 0 again, or finish without its ACK
    WAIT_DATA_C = "wait_data_c"  #: wait for the 'C' asking for block 1
    WAIT_AGAIN = "wait_again"  #: keep waiting for 'C' (the retry limit cancels)
    SEND_FIRST_BLOCK = "send_first_block"  #: block 1, or EOT for an empty file
    SEND_NEXT = "send_next"  #: the next block, or EOT after the last
    C_DURING_BLOCK = "c_during_block"  #: resend block 1 ('C' is rb's NAK there), else ignore
    EOT_ACKED = "eot_acked"  #: the EOT is answered (proven if armed); wait for 'C'
    NUDGE = "nudge"  #: one NUL, straight out
    RECHECK_EOT = "recheck_eot"  #: EOT again: the 'C' proved nothing
    CONFIRM_FILE = "confirm_file"  #: FileCommitted, then the next block 0
    BATCH_DONE = "batch_done"  #: BatchEnded(final_ack=True)
    GIVE_UP = "give_up"  #: CAN CAN: no receiver
    PEER_CANCELLED = "peer_cancelled"  #: Aborted(by_peer)


_S = TxState
_T = TxIn
_TA = TxAction

TX_TRANSITIONS: dict[tuple[TxState, TxIn], tuple[TxState, TxAction]] = {
    (_S.WAIT_START, _T.C): (_S.SENT_HEADER, _TA.SEND_HEADER),
    (_S.WAIT_START, _T.TIMEOUT): (_S.ABORTED, _TA.GIVE_UP),
    (_S.WAIT_START, _T.QUIET): (_S.WAIT_START, _TA.NUDGE),  # rb's 'C' comes at once, or after 1 s
    (_S.WAIT_START, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
    (_S.SENT_HEADER, _T.ACK): (_S.WAIT_DATA_C, _TA.WAIT_DATA_C),
    (_S.SENT_HEADER, _T.NAK): (_S.SENT_HEADER, _TA.RESEND),
    (_S.SENT_HEADER, _T.C): (_S.SENT_HEADER, _TA.RESEND),  # 'C' = NAK here (rb)
    (_S.SENT_HEADER, _T.TIMEOUT): (_S.SENT_HEADER, _TA.RESEND),
    (_S.SENT_HEADER, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
    (_S.WAIT_DATA_C, _T.C): (_S.SENT_BLOCK, _TA.SEND_FIRST_BLOCK),  # or EOT for an empty file
    (_S.WAIT_DATA_C, _T.TIMEOUT): (_S.WAIT_DATA_C, _TA.WAIT_AGAIN),
    (_S.WAIT_DATA_C, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
    (_S.SENT_BLOCK, _T.ACK): (_S.SENT_BLOCK, _TA.SEND_NEXT),  # or EOT after the last block
    (_S.SENT_BLOCK, _T.NAK): (_S.SENT_BLOCK, _TA.RESEND),
    (_S.SENT_BLOCK, _T.C): (_S.SENT_BLOCK, _TA.C_DURING_BLOCK),  # NAK for block 1, else noise
    (_S.SENT_BLOCK, _T.TIMEOUT): (_S.SENT_BLOCK, _TA.RESEND),
    (_S.SENT_BLOCK, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
    (_S.SENT_EOT1, _T.ACK): (_S.WAIT_NEXT_C, _TA.EOT_ACKED),  # rb: ACK at once
    (_S.SENT_EOT1, _T.NAK): (_S.SENT_EOT2, _TA.EOT_NAKED),  # NAK-first receivers: EOT again
    (_S.SENT_EOT1, _T.C): (_S.SENT_EOT2, _TA.RESEND),
    (_S.SENT_EOT1, _T.TIMEOUT): (_S.SENT_EOT1, _TA.RESEND),  # NAK lost: the resend confirms
    (_S.SENT_EOT1, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
    (_S.SENT_EOT2, _T.ACK): (_S.WAIT_NEXT_C, _TA.EOT_ACKED),
    (_S.SENT_EOT2, _T.NAK): (_S.SENT_EOT2, _TA.EOT_NAKED),
    (_S.SENT_EOT2, _T.C): (_S.SENT_EOT2, _TA.RESEND),  # our ACK lost, receiver moved on
    (_S.SENT_EOT2, _T.TIMEOUT): (_S.SENT_EOT2, _TA.RESEND),
    (_S.SENT_EOT2, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
    (_S.WAIT_NEXT_C, _T.C): (_S.SENT_HEADER, _TA.CONFIRM_FILE),  # FileCommitted, next block 0
    (_S.WAIT_NEXT_C, _T.C_UNPROVEN): (_S.SENT_EOT2, _TA.RECHECK_EOT),  # no proof yet: EOT again
    (_S.WAIT_NEXT_C, _T.NAK): (_S.SENT_EOT2, _TA.EOT_NAKED),  # the receiver did not take the EOT
    (_S.WAIT_NEXT_C, _T.TIMEOUT): (_S.WAIT_NEXT_C, _TA.WAIT_AGAIN),
    (_S.WAIT_NEXT_C, _T.QUIET): (_S.WAIT_NEXT_C, _TA.NUDGE),  # one NUL: rb's 1 s read ends at once
    (_S.WAIT_NEXT_C, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
    (_S.SENT_END, _T.ACK): (_S.DONE, _TA.BATCH_DONE),
    (_S.SENT_END, _T.NAK): (_S.SENT_END, _TA.RESEND),
    (_S.SENT_END, _T.C): (_S.SENT_END, _TA.RESEND),
    (_S.SENT_END, _T.TIMEOUT): (_S.SENT_END, _TA.RESEND_END),  # gives up with success
    (_S.SENT_END, _T.CANCEL): (_S.ABORTED, _TA.PEER_CANCELLED),
}
