"""The sender's speed features keep the end-of-file proof: the nudge (one NUL when rb sits out its
one-second read before a 'C') and the flush guard (no turnaround until the receiver loses a frame).

Virtual time only: the machines are driven by hand or through a small model of rb's pauses.
"""

from __future__ import annotations

import pytest

from idemlink.protocol.ymodem_receiver import Receiver
from idemlink.protocol.ymodem_sender import Sender, SenderConfig, SendFile
from idemlink.protocol.ymodem_tables import RxState, TxState
from idemlink.protocol.ymodem_wire import (
    ACK,
    CRC_REQUEST,
    EOT,
    NAK,
    NUDGE,
    SOH,
    STX,
    build_block,
    build_header,
)

NUL = bytes([NUDGE])


def _sender(data: bytes = b"abc", **cfg: object) -> Sender:
    tx = Sender([SendFile.from_bytes("f", data)], SenderConfig(**cfg))  # type: ignore[arg-type]
    tx.start(0.0)
    return tx


def _to_first_eot(tx: Sender) -> None:
    tx.receive_data(bytes([CRC_REQUEST]), 0.01)
    tx.tick(0.02)
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.1)
    tx.tick(0.11)
    tx.receive_data(bytes([ACK]), 0.2)
    tx.tick(0.21)
    assert tx.data_to_send()[-1:] == bytes([EOT]) and tx.state is TxState.SENT_EOT1


def test_defaults_answer_at_once_and_nudge_after_5_ms() -> None:
    cfg = SenderConfig()
    assert cfg.turnaround == 0.0 and cfg.flush_guard == 0.002 and cfg.nudge_after == 0.005


def test_rb_sits_idle_only_5_ms_after_its_slow_ack_to_eot() -> None:
    """rb flushes its input microseconds after writing the ACK, then waits (1 s) for any byte
    before its 'C': each ms before the NUL is a ms of idle line, twice per file."""
    tx = _sender()
    _to_first_eot(tx)
    tx.receive_data(bytes([ACK]), 1.2)
    assert tx.next_deadline() == pytest.approx(1.205)
    tx.tick(1.2049)
    assert tx.data_to_send() == b""
    tx.tick(1.205)
    assert tx.data_to_send() == NUL


def test_no_c_at_the_start_sends_one_nul_then_waits() -> None:
    tx = _sender()
    assert tx.next_deadline() == pytest.approx(0.005)
    tx.tick(0.0049)
    assert tx.data_to_send() == b""
    tx.tick(0.005)
    assert tx.data_to_send() == NUL and tx.state is TxState.WAIT_START
    tx.tick(5.0)
    assert tx.data_to_send() == b"" and tx.nudges == 1  # once only
    tx.receive_data(bytes([CRC_REQUEST]), 5.1)
    assert tx.data_to_send()[0] == SOH  # the header, at once


def test_a_c_before_the_nudge_cancels_it() -> None:
    tx = _sender()
    tx.receive_data(bytes([CRC_REQUEST]), 0.001)
    tx.data_to_send()
    tx.tick(0.2)
    assert tx.data_to_send() == b"" and tx.nudges == 0


def test_rb_like_ack_first_eot_is_nudged_twice_and_still_proven() -> None:
    """rb: EOT, 1 s silence, ACK, then a one-byte read (1 s) before 'C'. The NUL ends the read;
    the 'C' that follows an unproven ACK still sends the EOT once more, and only the ACK to that
    armed EOT and the next 'C' confirm the file."""
    tx = _sender()
    _to_first_eot(tx)
    tx.receive_data(bytes([ACK]), 1.2)  # rb's ACK to the first EOT
    assert tx.state is TxState.WAIT_NEXT_C and tx.committed == []
    tx.tick(1.25)
    assert tx.data_to_send() == NUL
    tx.receive_data(bytes([CRC_REQUEST]), 1.26)  # rb's read ended: 'C' at once
    assert tx.data_to_send() == bytes([EOT]) and tx.committed == []  # unproven: EOT again
    tx.receive_data(bytes([ACK]), 2.27)
    assert tx.committed == []
    tx.tick(2.32)
    assert tx.data_to_send() == NUL
    tx.receive_data(bytes([CRC_REQUEST]), 2.33)
    assert tx.committed == ["f"] and tx.nudges == 2  # one per ACK to an EOT


def test_a_late_ack_copy_and_a_nudge_never_confirm_a_file_our_receiver_lacks() -> None:
    """The nudge goes to our receiver only when an ACK to EOT came without its 'C': before a
    commit it answers the NUL with NAK (or ignores it), never with 'C'."""
    rx = Receiver()
    rx.start(0.0)
    rx.data_to_send()
    _, header = build_header("a.bin", 1024, 0, 0o644)
    rx.receive_data(build_block(0, header), 0.1)
    assert rx.data_to_send() == bytes([ACK, CRC_REQUEST])
    for t in (0.2, 0.5, 2.0):  # waiting for block 1: the NUL is noise, no 'C' comes of it
        rx.receive_data(NUL, t)
        rx.tick(t + 0.3)
        assert CRC_REQUEST not in rx.data_to_send()
    rx.receive_data(build_block(1, bytes(1024)), 2.5)
    assert rx.data_to_send() == bytes([ACK])
    rx.receive_data(bytes([EOT]), 2.6)
    assert rx.data_to_send() == bytes([NAK]) and rx.state is RxState.WAIT_EOT_CONFIRM
    rx.receive_data(NUL, 2.7)  # a NUL where only the confirming EOT may stand: NAK, no 'C'
    rx.tick(3.5)
    out = rx.data_to_send()
    assert CRC_REQUEST not in out and NAK in out and rx.commits == 0


def test_after_a_commit_our_receiver_ignores_the_nul() -> None:
    rx = Receiver()
    rx.start(0.0)
    _, header = build_header("a.bin", 3, 0, 0o644)
    rx.receive_data(build_block(0, header), 0.1)
    rx.receive_data(build_block(1, b"abc".ljust(128, b"\x1a")), 0.2)
    rx.receive_data(bytes([EOT]), 0.3)
    rx.receive_data(bytes([EOT]), 0.4)
    rx.data_to_send()
    rx.receive_data(NUL, 0.5)
    rx.tick(0.6)
    assert rx.data_to_send() == b"" and rx.state is RxState.WAIT_NEXT_HEADER and rx.commits == 1
    rx.receive_data(bytes([EOT]), 0.7)  # a late EOT is still a repeat, not STALE
    assert rx.data_to_send() == bytes([ACK, CRC_REQUEST])


def test_the_flush_guard_starts_after_the_receiver_loses_a_frame() -> None:
    tx = _sender(bytes(3000))
    tx.receive_data(bytes([CRC_REQUEST]), 0.01)
    assert tx.data_to_send()[0] == SOH  # no turnaround by default
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.1)
    block1 = tx.data_to_send()
    assert block1[:2] == bytes([STX, 1])
    tx.receive_data(bytes([ACK]), 0.2)
    assert tx.data_to_send()[:2] == bytes([STX, 2])
    tx.receive_data(bytes([NAK]), 0.3)  # block 2 lost (rb's flush ate it, say)
    assert tx.data_to_send() == b""
    tx.tick(0.3 + 0.002)
    assert tx.data_to_send()[:2] == bytes([STX, 2])
    tx.receive_data(bytes([ACK]), 0.4)
    assert tx.data_to_send() == b""  # the guard stays for the rest of the batch
    tx.tick(0.402)
    assert tx.data_to_send()[:2] == bytes([STX, 3])


def test_an_explicit_turnaround_applies_from_the_first_answer() -> None:
    tx = _sender(turnaround=0.004)
    tx.receive_data(bytes([CRC_REQUEST]), 0.01)
    assert tx.data_to_send() == b""
    tx.tick(0.014)
    assert tx.data_to_send()[0] == SOH


def test_a_prompt_ack_to_eot_is_not_nudged() -> None:
    """A NUL close behind our EOT could share the receiver's read with it, and ours takes an EOT
    followed by anything for noise: a prompt ACK (a late copy, or a receiver whose 'C' comes at
    once anyway) gets no nudge; only an ACK that came after rb's second of silence does."""
    tx = _sender()
    _to_first_eot(tx)
    tx.receive_data(bytes([ACK]), 0.26)  # 50 ms after the EOT: prompt
    assert tx.state is TxState.WAIT_NEXT_C
    tx.tick(1.0)
    assert tx.data_to_send() == b"" and tx.nudges == 0
