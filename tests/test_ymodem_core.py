"""The sans-I/O YMODEM sender and receiver, driven in-process through a scriptable lossy pair.

Covers the codec (block 0, blocks, names, sizes, modes), the idempotent-EOT scenarios by name, the
duplicate/out-of-sequence rules, CAN in both directions, the rb-compatible sender paths, and a
seeded fault campaign whose oracle is the source data (never the code under test).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Iterable

import crcmod.predefined
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.ymodem import Fault, Pair, files_of

from idemlink.protocol.ymodem_events import (
    Aborted,
    BatchEnded,
    FileCommitted,
    FileData,
    FileStarted,
    HeaderRefused,
    drain_events,
)
from idemlink.protocol.ymodem_names import NameRefusal, check_name, sanitize_mode
from idemlink.protocol.ymodem_receiver import ACTION_METHODS as RX_ACTION_METHODS
from idemlink.protocol.ymodem_receiver import Receiver, ReceiverConfig
from idemlink.protocol.ymodem_sender import ACTION_METHODS as TX_ACTION_METHODS
from idemlink.protocol.ymodem_sender import Sender, SenderConfig, SendFile
from idemlink.protocol.ymodem_tables import (
    RX_TRANSITIONS,
    TX_TRANSITIONS,
    RxAction,
    RxIn,
    RxState,
    TxAction,
    TxState,
)
from idemlink.protocol.ymodem_wire import (
    ACK,
    CAN,
    CRC_REQUEST,
    EOT,
    NAK,
    NUDGE,
    SOH,
    STX,
    Header,
    HeaderRefusal,
    build_block,
    build_header,
    crc16,
    parse_header,
    parse_size,
)

# An independent CRC reference (crcmod's table is what the module uses; this is the bitwise rule).


def ref_crc(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def ref_block(number: int, payload: bytes) -> bytes:
    lead = SOH if len(payload) == 128 else STX
    return bytes([lead, number & 0xFF, 0xFF - (number & 0xFF)]) + payload + ref_crc(
        payload
    ).to_bytes(2, "big")


FAST_TX = SenderConfig(end_timeout=1.0, end_retries=2)


def make_pair(spec: dict[str, bytes], tx_cfg: SenderConfig | None = None,
              rx_cfg: ReceiverConfig | None = None, **kw: object) -> Pair:
    return Pair(Sender(files_of(spec), tx_cfg or SenderConfig()), Receiver(rx_cfg), **kw)  # type: ignore[arg-type]


# --- codec ---------------------------------------------------------------------------------------


def test_crc_is_crc16_xmodem() -> None:
    assert crc16(b"123456789") == 0x31C3
    assert crcmod.predefined.mkCrcFun("xmodem")(b"123456789") == ref_crc(b"123456789")


@given(st.integers(0, 1000), st.sampled_from([128, 1024]), st.binary(min_size=0, max_size=1024))
def test_build_block_matches_the_bitwise_reference(number: int, size: int, data: bytes) -> None:
    payload = data[:size].ljust(size, b"\x1a")
    assert build_block(number, payload) == ref_block(number, payload)


def test_header_layout_is_name_nul_decimal_octal_octal() -> None:
    length, payload = build_header("fw.bin", 1000, 0o14567123456, 0o644)
    assert length == 128
    assert payload == (b"fw.bin\x00" + b"1000 14567123456 100644 0\x00").ljust(128, b"\x00")


def test_long_name_uses_a_1k_block0() -> None:
    name = "n" * 200
    length, payload = build_header(name, 5, 0, 0o600)
    assert length == 1024 and payload.startswith(name.encode() + b"\x00" + b"5 0 100600 0\x00")


@given(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/\\:"),
             min_size=1, max_size=100).filter(lambda s: check_name(s.encode()) == s),
    st.integers(0, 2**40), st.integers(0, 2**33), st.integers(0, 0o7777),
)
def test_header_round_trip(name: str, size: int, mtime: int, mode: int) -> None:
    _, payload = build_header(name, size, mtime, mode)
    h = parse_header(payload)
    assert h == Header(name, size, mtime, mode | 0o100000)


SIZE_RULE = [
    (b"0", 0),
    (b"1000", 1000),
    (b"007", 7),
    (b"99999999999999999999", 99999999999999999999),
    (b"", None),  # field empty (metadata starts with a space)
    (b"-1", None),
    (b"+5", None),
    (b"0x10", None),
    (b"1e3", None),
    (b"12a", None),
    (b"\xd9\xa3", None),  # Arabic-Indic digit three: int() would accept it, we do not
    (b"123456789012345678901", None),  # 21 digits
]


@pytest.mark.parametrize(("field_", "expected"), SIZE_RULE)
def test_size_rule(field_: bytes, expected: int | None) -> None:
    assert parse_size(field_) == expected
    payload = (b"f\x00" + field_ + b" 0 100644").ljust(128, b"\x00")
    parsed = parse_header(payload)
    if expected is None:
        assert parsed is HeaderRefusal.BAD_SIZE
    else:
        assert isinstance(parsed, Header) and parsed.size == expected


def test_header_without_metadata_has_unknown_size() -> None:
    assert parse_header(b"f\x00".ljust(128, b"\x00")) == Header("f", None, None, None)


def test_bad_mtime_or_mode_is_ignored_not_fatal() -> None:
    h = parse_header(b"f\x0010 9z 88".ljust(128, b"\x00"))
    assert h == Header("f", 10, None, None)


HOSTILE_NAMES: list[tuple[bytes, NameRefusal | str]] = [
    (b"../etc/passwd", NameRefusal.PATH_SEPARATOR),
    (b"..", NameRefusal.DOT_DOT),
    (b".", NameRefusal.DOT_DOT),
    (b"/etc/passwd", NameRefusal.ABSOLUTE),
    (b"\\\\server\\share", NameRefusal.ABSOLUTE),
    (b"sub/x", NameRefusal.PATH_SEPARATOR),
    (b"a\\..\\b", NameRefusal.PATH_SEPARATOR),
    (b"C:evil", NameRefusal.DRIVE_LETTER),
    (b"c:\\windows\\x", NameRefusal.DRIVE_LETTER),
    (b"file:stream", NameRefusal.DRIVE_LETTER),
    (b"a\x01b", NameRefusal.CONTROL_CHAR),
    (b"tab\tname", NameRefusal.CONTROL_CHAR),
    (b"new\nline", NameRefusal.CONTROL_CHAR),
    (b"esc\x1b[31m", NameRefusal.CONTROL_CHAR),
    (b"del\x7f", NameRefusal.CONTROL_CHAR),
    ("c1\u0085".encode(), NameRefusal.CONTROL_CHAR),
    (b"\xff\xfe", NameRefusal.NOT_UTF8),
    (b"x" * 256, NameRefusal.TOO_LONG),
    (b"", NameRefusal.EMPTY),
    (b"x" * 255, "x" * 255),
    (b"with space.bin", "with space.bin"),
    (b"...", NameRefusal.TRAILING_DOT_SPACE),
    (b"CON", NameRefusal.RESERVED_DEVICE),
    ("\u202etxt.exe".encode(), NameRefusal.FORMAT_CHAR),
    (b".hidden", ".hidden"),
    ("unicodé.txt".encode(), "unicodé.txt"),
    (b"-rf", "-rf"),
]


@pytest.mark.parametrize(("raw", "expected"), HOSTILE_NAMES)
def test_check_name(raw: bytes, expected: NameRefusal | str) -> None:
    assert check_name(raw) == expected


@pytest.mark.parametrize("raw", [r for r, e in HOSTILE_NAMES if isinstance(e, NameRefusal) and r])
def test_hostile_name_in_block0_cancels_with_nothing_delivered(raw: bytes) -> None:
    rx = Receiver()
    rx.start(0.0)
    rx.data_to_send()
    payload = (raw + b"\x005 0 100644").ljust(1024 if len(raw) > 120 else 128, b"\x00")
    rx.receive_data(ref_block(0, payload), 0.1)
    out = rx.data_to_send()
    assert out.count(CAN) >= 2 and ACK not in out
    evs = drain_events(rx)
    assert any(isinstance(e, HeaderRefused) and e.raw_name == raw for e in evs)
    assert not any(isinstance(e, FileStarted | FileData | FileCommitted) for e in evs)
    assert rx.state is RxState.ABORTED


def test_block0_without_nul_inside_the_block_is_refused() -> None:
    rx = Receiver()
    rx.start(0.0)
    rx.receive_data(ref_block(0, b"A" * 128) + b"\x00" + b"5 0 100644\x00", 0.1)
    assert rx.state is RxState.ABORTED
    assert any(isinstance(e, HeaderRefused) and e.reason is HeaderRefusal.NAME_NOT_TERMINATED
               for e in drain_events(rx))


def test_declared_size_over_the_limit_is_refused() -> None:
    rx = Receiver(ReceiverConfig(max_file_size=1000))
    rx.start(0.0)
    rx.receive_data(ref_block(0, b"f\x001001 0 100644".ljust(128, b"\x00")), 0.1)
    assert any(isinstance(e, HeaderRefused) and e.reason is HeaderRefusal.TOO_LARGE
               for e in drain_events(rx))


@pytest.mark.parametrize(("mode", "expected"), [
    (0o104755, 0o755), (0o102755, 0o755), (0o101777, 0o775), (0o100666, 0o664),
    (0o4777, 0o775), (0o600, 0o600), (None, 0o644),
])
def test_mode_never_grants_setuid_setgid_sticky_or_world_write(mode: int | None,
                                                                expected: int) -> None:
    assert sanitize_mode(mode) == expected


@given(st.integers(0, 0o177777))
def test_sanitized_mode_property(mode: int) -> None:
    assert sanitize_mode(mode) & 0o7002 == 0


# --- tables --------------------------------------------------------------------------------------


@pytest.mark.parametrize("table,actions", [
    (RX_TRANSITIONS, RxAction), (TX_TRANSITIONS, TxAction),
])
def test_every_action_has_its_method_and_terminal_states_are_sinks(
        table: dict[tuple[object, object], tuple[object, enum.Enum]], actions: type[enum.Enum]) -> None:
    methods = RX_ACTION_METHODS if actions is RxAction else TX_ACTION_METHODS
    assert set(methods) == set(actions)  # every action runs a method, and only actions do
    for (state, _), (_, action) in table.items():
        assert isinstance(action, actions) and callable(methods[action]), action
        assert getattr(state, "name", "") != "ABORTED"


def test_receiver_eot_rows_are_the_idempotent_handshake() -> None:
    t = RX_TRANSITIONS
    assert t[(RxState.RECV_DATA, RxIn.EOT)] == (RxState.WAIT_EOT_CONFIRM, RxAction.FIRST_EOT)
    assert t[(RxState.WAIT_EOT_CONFIRM, RxIn.EOT)] == (RxState.WAIT_NEXT_HEADER, RxAction.COMMIT)
    assert t[(RxState.WAIT_NEXT_HEADER, RxIn.EOT)] == (RxState.WAIT_NEXT_HEADER, RxAction.REACK_EOT)
    assert [a for (_, _), (_, a) in t.items()].count(RxAction.COMMIT) == 1


# --- the receiver's EOT machine, byte by byte ------------------------------------------------------


def _rx_with_one_block(data: bytes = b"hello") -> Receiver:
    rx = Receiver()
    rx.start(0.0)
    rx.receive_data(ref_block(0, (b"f\x00%d 0 100644" % len(data)).ljust(128, b"\x00")), 0.1)
    rx.receive_data(ref_block(1, data.ljust(128, b"\x1a")), 0.2)
    rx.data_to_send()
    return rx


def test_first_eot_nak_second_ack_commit_late_eot_ack_again() -> None:
    rx = _rx_with_one_block()
    rx.receive_data(bytes([EOT]), 1.0)
    assert rx.data_to_send() == bytes([NAK]) and rx.state is RxState.WAIT_EOT_CONFIRM
    assert not any(isinstance(e, FileCommitted) for e in drain_events(rx))
    rx.receive_data(bytes([EOT]), 1.1)
    assert rx.data_to_send() == bytes([ACK, CRC_REQUEST])
    assert [e for e in drain_events(rx) if isinstance(e, FileCommitted)] == [FileCommitted("f", 5)]
    for k in range(3):  # late EOTs: ACK each, never a second commit, never an error
        rx.receive_data(bytes([EOT]), 2.0 + k)
        assert rx.data_to_send() == bytes([ACK, CRC_REQUEST])
        assert drain_events(rx) == [] and rx.commits == 1
        assert rx.state is RxState.WAIT_NEXT_HEADER  # type: ignore[comparison-overlap]


def test_eot_before_the_declared_size_is_nakked_never_committed() -> None:
    rx = Receiver()
    rx.start(0.0)
    rx.receive_data(ref_block(0, b"f\x00300 0 100644".ljust(128, b"\x00")), 0.1)
    rx.receive_data(ref_block(1, bytes(128)), 0.2)
    for k in range(3):
        rx.receive_data(bytes([EOT]), 1.0 + k)
    assert rx.commits == 0 and rx.state is RxState.RECV_DATA
    assert not any(isinstance(e, FileCommitted) for e in drain_events(rx))


def test_duplicate_block_acked_not_delivered_twice_other_block_cancels() -> None:
    rx = _rx_with_one_block(b"abc")
    drain_events(rx)
    rx.receive_data(ref_block(1, b"abc".ljust(128, b"\x1a")), 0.3)
    assert rx.data_to_send() == bytes([ACK]) and drain_events(rx) == []
    rx.receive_data(ref_block(3, bytes(128)), 0.4)
    assert rx.data_to_send().count(CAN) >= 2 and rx.state is RxState.ABORTED


def test_corrupt_header_is_answered_with_c_after_the_line_is_quiet() -> None:
    rx = Receiver()
    rx.start(0.0)
    rx.data_to_send()
    bad = bytearray(ref_block(0, b"f\x005".ljust(128, b"\x00")))
    bad[10] ^= 0x40
    rx.receive_data(bytes(bad), 0.1)
    rx.tick(0.2)
    assert rx.data_to_send() == b""  # still purging
    rx.tick(0.1 + rx.config.purge_quiet)
    assert rx.data_to_send() == bytes([CRC_REQUEST])


def test_sender_can_can_aborts_receiver_and_receiver_can_can_aborts_sender() -> None:
    rx = _rx_with_one_block()
    rx.receive_data(bytes([CAN, CAN]), 1.0)
    assert rx.state is RxState.ABORTED
    assert any(isinstance(e, Aborted) and e.by_peer for e in drain_events(rx))
    tx = Sender(files_of({"f": b"x" * 2000}), SenderConfig(turnaround=0))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 0.1)
    tx.receive_data(bytes([CAN]), 0.2)
    assert tx.state is TxState.SENT_HEADER  # one CAN is noise
    tx.receive_data(bytes([CAN, CAN]), 0.3)
    assert tx.state is TxState.ABORTED  # type: ignore[comparison-overlap]
    assert any(isinstance(e, Aborted) and e.by_peer for e in drain_events(tx))


# --- the sender against rb-like answers ---------------------------------------------------------


def _sender_at_eot(data: bytes = b"abc", nudge_after: float | None = 0.05) -> Sender:
    tx = Sender(files_of({"f": data}), SenderConfig(turnaround=0, nudge_after=nudge_after))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 0.1)
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.2)
    tx.receive_data(bytes([ACK]), 0.3)
    assert tx.data_to_send()[-1] == EOT and tx.state is TxState.SENT_EOT1
    return tx


def test_sender_accepts_ack_to_the_first_eot_like_rb() -> None:
    tx = _sender_at_eot()
    tx.receive_data(bytes([ACK]), 1.3)
    assert tx.state is TxState.WAIT_NEXT_C and tx.committed == []  # not before the 'C'
    tx.receive_data(bytes([CRC_REQUEST]), 2.3)  # rb: 'C' ~1 s after its ACK
    # ACK-first: that ACK answered the first EOT, so it may be a late copy and the 'C' a receiver's
    # request for block 1: the EOT goes once more, and its ACK + 'C' are the proof
    tx.tick(2.4)
    assert tx.data_to_send() == bytes([EOT]) and tx.committed == []
    tx.receive_data(bytes([ACK]), 3.4)
    tx.receive_data(bytes([CRC_REQUEST]), 4.4)
    assert tx.state.value == "SENT_END" and tx.committed == ["f"]


def test_sender_waits_over_a_second_before_resending_eot_then_c_before_end_block() -> None:
    tx = _sender_at_eot(nudge_after=None)
    tx.tick(1.2)
    assert tx.data_to_send() == b""  # rb needs silence
    tx.tick(0.3 + tx.config.eot_timeout)
    assert tx.data_to_send() == bytes([EOT])
    tx.receive_data(bytes([ACK]), 4.0)
    tx.tick(5.0)
    assert tx.data_to_send() == b""  # no end block before 'C'
    tx.receive_data(bytes([CRC_REQUEST]), 5.1)
    tx.tick(5.2)
    assert tx.data_to_send() == bytes([EOT])  # unproven (no answered EOT before): once more
    tx.receive_data(bytes([ACK]), 6.0)
    tx.receive_data(bytes([CRC_REQUEST]), 7.0)
    tx.tick(7.1)
    assert tx.data_to_send() == ref_block(0, bytes(128))


def test_c_during_header_and_first_block_is_a_nak_later_it_is_noise() -> None:
    tx = Sender(files_of({"f": b"z" * 3000}), SenderConfig(turnaround=0, flush_guard=0))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 0.1)
    header = tx.data_to_send()
    tx.receive_data(bytes([CRC_REQUEST]), 0.2)
    assert tx.data_to_send() == header
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.3)
    first = tx.data_to_send()
    tx.receive_data(bytes([CRC_REQUEST]), 0.4)
    assert tx.data_to_send() == first
    tx.receive_data(bytes([ACK]), 0.5)
    second = tx.data_to_send()
    assert second[1] == 2
    tx.receive_data(bytes([CRC_REQUEST]), 0.6)
    assert tx.data_to_send() == b""


def test_sender_finishes_with_success_when_the_final_ack_never_comes() -> None:
    tx = _sender_at_eot()
    tx.receive_data(bytes([ACK]), 1.0)
    tx.receive_data(bytes([CRC_REQUEST]), 2.0)
    tx.tick(2.1)
    tx.receive_data(bytes([ACK]), 3.0)  # the proving round (see the rb test above)
    tx.receive_data(bytes([CRC_REQUEST]), 4.0)
    assert tx.committed == ["f"]
    t = 4.0
    while tx.state is not TxState.DONE and t < 60:
        t += 0.5
        tx.tick(t)
    assert tx.state is TxState.DONE and t < 30
    assert drain_events(tx)[-1] == BatchEnded(final_ack=False)


def test_turnaround_delay_holds_the_next_block() -> None:
    tx = Sender(files_of({"f": b"q" * 3000}), SenderConfig(turnaround=0.004))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 1.0)
    assert tx.data_to_send() == b"" and tx.next_deadline() == pytest.approx(1.004)
    tx.tick(1.003)
    assert tx.data_to_send() == b""
    tx.tick(1.004)
    assert tx.data_to_send()[:3] == bytes([SOH, 0, 0xFF])


# --- whole transfers in-process ------------------------------------------------------------------


file_names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E,
                                   blacklist_characters="/\\:"), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(file_names.filter(lambda s: check_name(s.encode()) == s),
                    st.integers(0, 5000), min_size=0, max_size=3),
    st.sampled_from([128, 1024]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_clean_batches_arrive_byte_exact(sizes: dict[str, int], block: int, byte_by_byte: bool,
                                         rnd: random.Random) -> None:
    spec = {n: rnd.randbytes(s) for n, s in sizes.items()}
    p = make_pair(spec, SenderConfig(block_size=block), byte_by_byte=byte_by_byte).run()
    assert p.tx.state is TxState.DONE and p.rx.state is RxState.DONE
    assert p.received() == spec
    assert p.tx.committed == list(spec)
    assert p.count(p.rx_events, BatchEnded) == 1


def test_block_numbers_wrap_255_to_0() -> None:
    data = random.Random(7).randbytes(128 * 300 + 5)
    p = make_pair({"wrap": data}, SenderConfig(block_size=128)).run()
    assert p.received() == {"wrap": data}
    framed = bytes(p.sent["tx>rx"])
    assert ref_block(0, data[255 * 128 : 256 * 128]) in framed  # block 256 travels as number 0


def test_mixed_1k_and_128_blocks_like_sb_k() -> None:
    data = random.Random(3).randbytes(1024 * 2 + 900 + 100)  # STX STX STX (900 > 896) SOH
    p = make_pair({"mix": data}).run()
    assert p.received() == {"mix": data}
    leads = [b for b in p.sent["tx>rx"] if b in (SOH, STX)]
    assert leads.count(STX) >= 3 and SOH in leads


def _drop_first(direction: str, byte: int, when: Callable[[], bool] = lambda: True) -> Fault:
    dropped = [False]

    def fault(d: str, b: int) -> int | None:
        if not dropped[0] and d == direction and b == byte and when():
            dropped[0] = True
            return None
        return b

    return fault


def test_seed_scenario_the_nak_to_the_first_eot_is_lost() -> None:
    data = random.Random(1).randbytes(3000)
    p = make_pair({"fw.bin": data}, FAST_TX)
    p.fault = _drop_first("rx>tx", NAK)
    p.run()
    assert b"".join(p.chunks["rx>tx"]).count(NAK) == 1  # the only NAK was the EOT's, and it was lost
    # the resent EOT commits; its ACK answered an EOT nobody had answered before (it could be a
    # late copy), so the sender proves it with one more EOT: ACK 'C' again, no second commit
    assert p.eots_sent() == 3
    assert p.received() == {"fw.bin": data}
    assert p.rx.commits == 1 and p.count(p.rx_events, FileCommitted) == 1
    assert p.tx.committed == ["fw.bin"] and p.count(p.tx_events, FileCommitted) == 1
    assert p.tx.state is TxState.DONE and p.rx.state is RxState.DONE


def test_seed_scenario_the_ack_to_the_final_eot_is_lost() -> None:
    data = random.Random(2).randbytes(3000)
    p = make_pair({"fw.bin": data}, FAST_TX)
    p.fault = _drop_first("rx>tx", ACK, when=lambda: p.rx.commits == 1)
    p.run()
    assert p.eots_sent() == 3  # EOT, EOT (confirm), EOT again (our ACK lost)
    assert p.received() == {"fw.bin": data}
    assert p.rx.commits == 1 and p.count(p.rx_events, FileCommitted) == 1
    assert p.tx.committed == ["fw.bin"] and p.count(p.tx_events, FileCommitted) == 1
    assert p.tx.state is TxState.DONE and p.rx.state is RxState.DONE
    assert not any(isinstance(e, Aborted) for e in p.rx_events + p.tx_events)


def test_lost_data_ack_makes_a_duplicate_that_is_written_once() -> None:
    data = random.Random(4).randbytes(5000)
    p = make_pair({"d": data}, FAST_TX)
    p.fault = _drop_first("rx>tx", ACK, when=lambda: p.rx._last_block == 2)
    p.run()
    blocks = bytes(p.sent["tx>rx"])
    assert blocks.count(ref_block(2, data[1024:2048])) == 2  # the block really went twice
    assert p.received() == {"d": data}


# --- fault campaign ------------------------------------------------------------------------------


def lossy(rnd: random.Random, loss: float, corrupt: float, dup: float = 0.0) -> Fault:
    def fault(direction: str, b: int) -> bytes | int | None:
        r = rnd.random()
        if r < loss:
            return None
        if r < loss + corrupt:
            return b ^ (1 << rnd.randrange(8))
        if r < loss + corrupt + dup:
            return bytes([b, b])
        return b

    return fault


def campaign_run(seed: int) -> tuple[str, Pair, dict[str, bytes]]:
    rnd = random.Random(seed)
    spec = {f"f{i}.bin": rnd.randbytes(rnd.choice([0, 1, 127, 128, 129, 1000, 1025, 4000]))
            for i in range(rnd.randint(1, 3))}
    loss = rnd.choice([0.0, 0.0001, 0.0003, 0.001])
    corrupt = rnd.choice([0.0, 0.0001, 0.0003, 0.001])
    p = make_pair(spec, SenderConfig(block_size=rnd.choice([128, 1024])),
                  byte_by_byte=rnd.random() < 0.2)
    p.fault = lossy(rnd, loss, corrupt, dup=rnd.choice([0.0, 0.0003]))
    p.run(until=5000.0)
    got = p.received()  # asserts: contiguous data, no double commit
    assert p.finished(), f"seed {seed}: hung in {p.tx.state}/{p.rx.state}"
    for name, body in got.items():
        assert body == spec[name], f"seed {seed}: {name} committed with wrong content"
    assert p.rx.commits == len(got)
    for name in p.tx.committed:  # what the sender believes was committed, was
        assert name in got, f"seed {seed}: sender saw ACK for {name} that was never committed"
    if p.tx.state is TxState.DONE or p.rx.state is RxState.DONE:
        assert got == spec, f"seed {seed}: batch ended without every file"
    outcome = "exact" if got == spec and p.rx.state is RxState.DONE else "aborted"
    return outcome, p, spec


def test_fault_campaign_exact_or_cleanly_aborted_never_twice() -> None:
    outcomes = [campaign_run(seed)[0] for seed in range(120)]
    assert outcomes.count("exact") >= 110, outcomes.count("exact")


@pytest.mark.slow
def test_fault_campaign_long() -> None:
    outcomes = [campaign_run(seed)[0] for seed in range(1000, 3000)]
    assert outcomes.count("exact") >= 1900


def test_docs_list_every_transition_of_both_tables() -> None:
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "YMODEM.md").read_text(encoding="utf-8")
    for table in (RX_TRANSITIONS, TX_TRANSITIONS):
        for (state, inp), (target, _) in table.items():
            row = f"| {state.value} | {inp.value} | {target.value} |"
            assert row in doc, f"docs/YMODEM.md lacks {row}"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300), st.floats(0, 20)), max_size=30))
def test_receiver_survives_any_bytes_and_commits_only_after_a_header(
        chunks: list[tuple[bytes, float]]) -> None:
    rx = Receiver()
    rx.start(0.0)
    now = 0.0
    evs: list[object] = []
    for data, dt in chunks:
        now += dt
        rx.receive_data(data, now)
        rx.tick(now)
        rx.data_to_send()
        evs += drain_events(rx)
    started = False
    for ev in evs:
        if isinstance(ev, FileStarted):
            started = True
        if isinstance(ev, FileData | FileCommitted):
            assert started


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=20), st.floats(0, 20)), max_size=40))
def test_sender_survives_any_bytes(chunks: list[tuple[bytes, float]]) -> None:
    tx = Sender(files_of({"f": bytes(3000), "g": b""}))
    tx.start(0.0)
    now = 0.0
    for data, dt in chunks:
        now += dt
        tx.receive_data(data, now)
        tx.tick(now)
        out = tx.data_to_send()
        # frames, EOT, CAN or the nudge (a lone NUL): nothing else
        assert out == b"" or out[0] in (SOH, STX, EOT, CAN) or out == bytes([NUDGE])
    committed = [e for e in drain_events(tx) if isinstance(e, FileCommitted)]
    assert len(committed) == len({e.name for e in committed})


@pytest.mark.parametrize("turnaround", [0.0, 0.004])
def test_a_duplicated_ack_is_never_taken_for_the_answer_to_eot(turnaround: float) -> None:
    # Found by the long campaign (seed 1702): the link doubled the ACK of the last block, and the
    # copy was read as the ACK of an EOT the receiver had not even seen.
    tx = Sender(files_of({"f": b"abc"}), SenderConfig(turnaround=turnaround))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 0.1)
    tx.tick(0.2)
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.2)
    tx.tick(0.3)
    tx.data_to_send()
    if turnaround:
        tx.receive_data(bytes([ACK]), 0.4)
        tx.receive_data(bytes([ACK]), 0.4 + turnaround / 2)  # the copy, inside the turnaround
    else:
        tx.receive_data(bytes([ACK, ACK]), 0.4)  # original and copy in one read
    tx.tick(0.5)
    assert tx.data_to_send() == bytes([EOT])
    assert tx.state is TxState.SENT_EOT1 and tx.committed == [] and tx.stale_answers == 1


def test_a_duplicated_nak_causes_one_resend_not_two() -> None:
    tx = Sender(files_of({"f": b"x" * 300}), SenderConfig(turnaround=0, flush_guard=0))
    tx.start(0.0)
    tx.receive_data(bytes([CRC_REQUEST]), 0.1)
    tx.receive_data(bytes([ACK, CRC_REQUEST]), 0.2)
    first = tx.data_to_send()[-133:]
    tx.receive_data(bytes([NAK, NAK]), 0.3)
    assert tx.data_to_send() == first  # once


# --- campaign: late copies of single control bytes ----------------------------------------------
# Virtual-time campaign: ACK/NAK/'C' (rx>tx) and EOT (tx>rx) are doubled with the copy
# arriving 10 ms .. 12 s late, or lost; rare bit flips; per-direction reads of one byte, a whole
# burst, or polled. Oracle: the source data. A file the sender reports ok must be committed exactly
# once, byte exact; a file the receiver committed must be reported ok or "not confirmed".

_R3_SHAPES = [
    [0, 0, 0], [0, 0, 5], [3, 0, 0], [0, 1], [0], [1, 0], [128, 0], [1024, 0, 0, 2048],
    [0, 128, 0, 1024], [256, 3072, 0], [896, 897, 0], [0, 0, 1, 0], [127, 129, 0], [1, 1, 0, 0],
]


class LateCopyRun:
    def __init__(self, seed: int) -> None:
        rnd = random.Random(seed)
        if rnd.random() < 0.7:
            sizes = rnd.choice(_R3_SHAPES)
        else:
            sizes = [rnd.choice([0, 0, 1, 127, 128, 129, 256, 1023, 1024, 1025, 2048, 3072])
                     for _ in range(rnd.randint(1, 5))]
        self.spec = {f"f{i}_{s}.bin": rnd.randbytes(s) for i, s in enumerate(sizes)}
        block = rnd.choice([128, 1024])
        turnaround = rnd.choice([0.0, 0.002, 0.002, 0.01])
        self.read_mode = {d: rnd.choice(["byte", "burst", "poll"]) for d in ("tx>rx", "rx>tx")}
        self.poll = {d: rnd.choice([0.005, 0.02, 0.1, 0.3]) for d in ("tx>rx", "rx>tx")}
        self.p_dup = rnd.choice([0.02, 0.05, 0.1, 0.2])
        self.p_loss = rnd.choice([0.0, 0.01, 0.03])
        self.p_flip = rnd.choice([0.0, 0.0, 0.0002])
        self.max_delay = rnd.choice([0.05, 0.5, 3.0, 12.0])
        self.fault_seed = rnd.getrandbits(32)
        self.tx = Sender([SendFile.from_bytes(n, d) for n, d in self.spec.items()],
                         SenderConfig(block_size=block, turnaround=turnaround))
        self.rx = Receiver(ReceiverConfig())
        self.now = 0.0
        self.lines: dict[str, list[tuple[float, int]]] = {"tx>rx": [], "rx>tx": []}
        self.busy = {"tx>rx": 0.0, "rx>tx": 0.0}
        self.count = {"tx>rx": 0, "rx>tx": 0}
        self.rx_events: list[object] = []

    def _fault(self, d: str, idx: int, b: int) -> list[tuple[float, int]]:
        r = random.Random(f"{self.fault_seed}:{d}:{idx}")
        u = r.random()
        delay = r.uniform(0.01, self.max_delay)
        flip = 1 << r.randrange(8)
        ctrl = (d == "rx>tx" and b in (ACK, NAK, CRC_REQUEST)) or (d == "tx>rx" and b == EOT)
        if ctrl and u < self.p_dup:
            return [(0.0, b), (delay, b)]
        if ctrl and u < self.p_dup + self.p_loss:
            return []
        if u > 1 - self.p_flip:
            return [(0.0, b ^ flip)]
        return [(0.0, b)]

    def _put(self, d: str, data: bytes) -> None:
        t = max(self.now, self.busy[d])
        for b in data:
            t += 10 / 115200
            for extra, x in self._fault(d, self.count[d], b):
                self.lines[d].append((t + 0.001 + extra, x))
            self.count[d] += 1
        self.lines[d].sort(key=lambda e: e[0])
        self.busy[d] = t

    def _deliver_time(self, d: str) -> float | None:
        if not self.lines[d]:
            return None
        t = self.lines[d][0][0]
        if self.read_mode[d] == "poll":
            p = self.poll[d]
            return math.ceil(t / p - 1e-9) * p
        return t

    def _deliver(self, d: str, m: Sender | Receiver) -> None:
        dt = self._deliver_time(d)
        if dt is None or dt > self.now:
            return
        line = self.lines[d]
        n = 0
        while n < len(line) and line[n][0] <= max(self.now, dt) + 1e-9:  # float poll rounding
            n += 1
        data = bytes(b for _, b in line[:n])
        del line[:n]
        if self.read_mode[d] == "byte":
            for b in data:
                m.receive_data(bytes([b]), self.now)
        else:
            m.receive_data(data, self.now)

    def finished(self) -> bool:
        return (self.tx.state in (TxState.DONE, TxState.ABORTED)
                and self.rx.state in (RxState.DONE, RxState.ABORTED))

    def go(self, until: float = 4000.0) -> LateCopyRun:
        self.rx.start(0.0)
        self.tx.start(0.0)
        while not self.finished() and self.now < until:
            self.rx_events += drain_events(self.rx)
            drain_events(self.tx)
            self._put("rx>tx", self.rx.data_to_send())
            self._put("tx>rx", self.tx.data_to_send())
            ts = [t for t in (self.tx.next_deadline(), self.rx.next_deadline(),
                              self._deliver_time("tx>rx"), self._deliver_time("rx>tx"))
                  if t is not None]
            if not ts:
                break
            self.now = max(self.now, min(ts))
            self._deliver("tx>rx", self.rx)
            self._deliver("rx>tx", self.tx)
            self.rx.tick(self.now)
            self.tx.tick(self.now)
        self.rx_events += drain_events(self.rx)
        return self

    def violations(self) -> list[str]:
        got: dict[str, bytes] = {}
        v: list[str] = []
        cur: bytearray | None = None
        for ev in self.rx_events:
            if isinstance(ev, FileStarted):
                cur = bytearray()
            elif isinstance(ev, FileData):
                if cur is None or ev.offset != len(cur):
                    v.append("data gapped/twice")
                else:
                    cur += ev.data
            elif isinstance(ev, FileCommitted):
                if ev.name in got:
                    v.append(f"{ev.name} committed twice")
                got[ev.name] = bytes(cur or b"")
                cur = None
            elif isinstance(ev, Aborted):
                cur = None
        if not self.finished():
            v.append(f"HANG tx={self.tx.state.value} rx={self.rx.state.value}")
        for n in self.tx.committed:
            if got.get(n) != self.spec[n]:
                v.append(f"SENDER-OK-NOT-COMMITTED {n}")
        for n, body in got.items():
            if body != self.spec[n]:
                v.append(f"COMMITTED-WRONG-BYTES {n}")
            if n not in self.tx.committed and n not in self.tx.unconfirmed:
                v.append(f"RX-COMMITTED-SENDER-FAILED {n}")
        if self.tx.state is TxState.DONE and got != self.spec:
            v.append("SENDER-DONE-BUT-MISSING")
        return v


def late_copy_failures(seeds: Iterable[int]) -> dict[int, list[str]]:
    bad = {}
    for seed in seeds:
        v = LateCopyRun(seed).go().violations()
        if v:
            bad[seed] = v
    return bad


#: seeds that once reported a file ok that the receiver never committed (a late ACK carried the
#: sender through block 1 or a lost header)
LATE_COPY_REGRESSIONS = (40, 42, 136)


def test_late_copies_of_control_bytes_never_make_a_false_ok() -> None:
    """The regressions and every 6th of the 300 seeds below (slow: all of them)."""
    assert late_copy_failures(sorted({*LATE_COPY_REGRESSIONS, *range(0, 300, 6)})) == {}


@pytest.mark.slow
def test_late_copies_of_control_bytes_never_make_a_false_ok_300_seeds() -> None:
    assert late_copy_failures(range(300)) == {}


@pytest.mark.slow
def test_late_copies_of_control_bytes_long() -> None:
    # The residual limit (docs/YMODEM.md): a late copy of a header's ACK 'C' arriving, in order,
    # after an armed EOT the receiver has not answered is byte for byte the commit's proof. Before
    # the fix 109 of seeds 0..8726 reported a false ok; what is left must stay rare and of that
    # one kind: never a hang, wrong bytes, a double commit or a committed file reported failed.
    bad = late_copy_failures(range(300, 4300))
    kinds = {v.split()[0] for vs in bad.values() for v in vs}
    assert kinds <= {"SENDER-OK-NOT-COMMITTED", "SENDER-DONE-BUT-MISSING"}, bad
    assert len(bad) <= 10, bad  # 0.25 % (before the fix: 1.25 %)


# --- receiver side: no 'C' and no ACK 'C' that a misled sender could take for a commit -----------


def _rx_committed_one_block_file() -> Receiver:
    rx = Receiver()
    rx.start(0.0)
    _, header = build_header("a.bin", 5, 0, 0o644)
    rx.receive_data(ref_block(0, header), 0.1)
    block1 = ref_block(1, b"hello".ljust(128, b"\x1a"))
    rx.receive_data(block1, 0.2)
    rx.receive_data(bytes([EOT]), 0.3)
    rx.receive_data(bytes([EOT]), 0.4)
    assert rx.commits == 1 and rx.state is RxState.WAIT_NEXT_HEADER
    rx.data_to_send()
    return rx


def test_after_the_commit_an_eot_is_acked_again_until_a_block_arrives() -> None:
    rx = _rx_committed_one_block_file()
    rx.receive_data(bytes([EOT]), 0.5)  # our ACK was lost: the sender repeats the EOT
    assert rx.data_to_send() == bytes([ACK, CRC_REQUEST])
    bad = bytearray(ref_block(0, build_header("b.bin", 0, 0, 0o644)[1]))
    bad[40] ^= 0x10  # the next header, damaged
    rx.receive_data(bytes(bad), 0.6)
    rx.tick(0.6 + rx.config.purge_quiet)
    assert rx.data_to_send() == bytes([CRC_REQUEST])
    # the sender moved on (it took a late ACK for the header's): this EOT ends b.bin, not a.bin
    rx.receive_data(bytes([EOT]), 1.0)
    assert rx.data_to_send() == bytes([NAK]) and rx.commits == 1


def test_a_bad_first_block_is_nakked_not_answered_with_c() -> None:
    rx = Receiver()
    rx.start(0.0)
    _, header = build_header("a.bin", 5, 0, 0o644)
    rx.receive_data(ref_block(0, header), 0.1)
    rx.data_to_send()
    bad = bytearray(ref_block(1, b"hello".ljust(128, b"\x1a")))
    bad[10] ^= 0x01
    rx.receive_data(bytes(bad), 0.2)
    rx.tick(0.2 + rx.config.purge_quiet)
    assert rx.data_to_send() == bytes([NAK])  # a 'C' here could pass for "committed, next file"
    rx.tick(0.2 + rx.config.purge_quiet + rx.config.c_interval)
    assert rx.data_to_send() == bytes([CRC_REQUEST])  # the timeout still asks with 'C'


def test_after_the_commit_a_block_of_the_next_file_is_not_taken_for_a_repeat() -> None:
    # Found by the explorer (two faults): the next header lost, a late EOT's ACK 'C' taken for its
    # ACK, the next file's block 1 was ACKed as a repeat of the committed file's block 1, and its
    # EOT re-ACKed as the commit: the sender reported a file the receiver never had.
    rx = _rx_committed_one_block_file()
    rx.receive_data(ref_block(1, b"!".ljust(128, b"\x1a")), 0.5)
    assert ACK not in rx.data_to_send() and rx.state is RxState.ABORTED
    # a true repeat of the committed file's last block (its ACK was lost) is still ACKed
    rx = _rx_committed_one_block_file()
    rx.receive_data(ref_block(1, b"hello".ljust(128, b"\x1a")), 0.5)
    assert rx.data_to_send() == bytes([ACK]) and rx.commits == 1


def test_the_ymodem_module_holds_only_the_contract_section() -> None:
    """One import path per name: ``idemlink.protocol.ymodem`` re-exports nothing; ``Sender``,
    ``Receiver`` and ``check_name`` are imported from their defining modules."""
    from idemlink.protocol import ymodem

    assert ymodem.__all__ == ["contract_section"]
    assert not hasattr(ymodem, "Sender") and not hasattr(ymodem, "Receiver")
