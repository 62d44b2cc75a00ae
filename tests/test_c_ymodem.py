"""The C YMODEM receiver (firmware_ref/src/idl_ymodem.c) against the Python one, byte for byte.

- Differential: the same bursts of bytes at the same times go to ``ReceiverDriver`` (the Python
  ``Receiver`` with a recording sink) and to the C receiver (``libidl_core.so`` through ctypes,
  ``make -C firmware_ref lib``): the answers of every call, the storage calls (begin, write at
  offset, commit, abort) and the outcome (state, why it ended, the header refusal) must be
  identical. Streams: the Python ``Sender`` through a faulty line (lost, corrupted and repeated
  bytes, lost answers, stray EOT/CAN/noise, bursts split and merged), and hand-made fragments
  (valid and refused headers — bad names, sizes, sb's block count —, duplicate, out-of-sequence
  and damaged blocks, repeated EOTs, CAN CAN inside a block, silences of every length), with
  storage that refuses at begin, write or commit.
- The transition table of the C receiver is ``RX_TRANSITIONS``.
- ``make -C firmware_ref size-device`` lists the receiver as its own module within the budget.

Skips, naming the reason, when make or a C compiler is missing.
"""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

import pytest
from support.c_ymodem import (
    DEVICE,
    END_BATCH,
    ERRORS,
    NO_SENDER,
    OTHER_HEADER,
    PEER,
    REFUSE_BEGIN,
    REFUSE_COMMIT,
    REFUSE_WRITE,
    REFUSED,
    SEQUENCE,
    SILENT,
    STOPPED,
    STORAGE,
    Outcome,
    Pair,
    load_library,
)

from idemlink.protocol.ymodem_receiver import ReceiverConfig
from idemlink.protocol.ymodem_sender import Sender, SenderConfig, SendFile
from idemlink.protocol.ymodem_tables import RX_TRANSITIONS, RxAction, RxIn, RxState
from idemlink.protocol.ymodem_wire import BLOCK_LARGE, BLOCK_SMALL, CAN, EOT, build_block, build_header

STEP_MS = 125  #: times are multiples of 1/8 s: exact in binary floating point

ACTIONS = [RxAction(name) for name in [
    "accept_header", "refuse_header", "end_batch", "ask_header", "cancel_sequence",
    "peer_cancelled", "accept_block", "reack_header", "cancel_other_header",
    "nak_first_block", "ask_first_block", "first_eot", "purge", "ack_duplicate", "nak",
    "commit", "reack_eot", "nak_stale_eot", "ask_next_header", "ack_only"]]
STATES = list(RxState)
INPUTS = list(RxIn)
@pytest.fixture(scope="module")
def clib(lib_path: Path) -> ctypes.CDLL:
    return load_library(lib_path)


def _config(rng: random.Random) -> ReceiverConfig:
    return rng.choice([
        DEVICE,
        ReceiverConfig(max_file_size=0xFFFFFFFF),
        ReceiverConfig(c_interval=0.5, header_retries=3, max_errors=4, silence_timeout=8.0,
                       max_name_bytes=40, max_file_size=5000),
    ])


# ---- streams: the Python sender through a faulty line ----------------------------------------


def _files(rng: random.Random) -> list[SendFile]:
    names = ["a.bin", "conf with spaces.txt", "empty", "x" * 100, "\u00e9t\u00e9.txt", "z"]
    out = []
    for name in rng.sample(names, rng.randrange(1, 4)):
        size = rng.choice([0, 1, 127, 128, 129, 900, 1024, 1500, 3000, 4200])
        out.append(SendFile.from_bytes(name, rng.randbytes(size)))
    return out


def _mangle(rng: random.Random, data: bytes, rate: float) -> bytes:
    """Line faults on a burst: a byte lost, flipped, doubled; a stray byte; the burst again."""
    if not data or rng.random() > rate:
        return data
    b = bytearray(data)
    i = rng.randrange(len(b))
    fault = rng.randrange(6)
    if fault == 0:
        del b[i]
    elif fault == 1:
        b[i] ^= 1 << rng.randrange(8)
    elif fault == 2:
        b.insert(i, b[i])
    elif fault == 3:
        b.insert(i, rng.choice([EOT, CAN, 0x00, 0x43, 0x06, 0x15]))
    elif fault == 4:
        return bytes(b) + bytes(b)
    else:
        return bytes(b[:i])
    return bytes(b)


def _run_sender(lib: ctypes.CDLL, seed: int, seen: set[tuple[RxState, RxIn]],
                refuse: int = 0) -> Pair:
    rng = random.Random(seed)
    config = _config(rng)
    pair = Pair(lib, config, refuse, seen)
    tx = Sender(_files(rng), SenderConfig(block_size=rng.choice([128, 1024]), flush_guard=0.0,
                                          nudge_after=None))
    rate = rng.choice([0.0, 0.05, 0.2])
    lose_answer = rng.choice([0.0, 0.05, 0.2])
    ms = 0
    tx.start(0.0)
    answer = pair.start(ms)
    for _ in range(3000):
        if pair.finished:
            break
        if answer and rng.random() >= lose_answer:
            tx.receive_data(answer, ms / 1000)
        ms += STEP_MS * rng.choice([1, 1, 1, 2, 8, 24])
        tx.tick(ms / 1000)
        data = _mangle(rng, tx.data_to_send(), rate)
        if data and rng.random() < 0.2:  # one burst read in two
            cut = rng.randrange(len(data) + 1)
            pair.feed(data[:cut], ms)
            data = data[cut:]
        answer = pair.feed(data, ms)
    if not pair.finished and rng.random() < 0.5:
        pair.abort()
    return pair


@pytest.mark.parametrize("seed", range(40))
def test_c_receiver_answers_the_python_sender_like_python(clib: ctypes.CDLL, seed: int) -> None:
    _run_sender(clib, seed, set())


def test_storage_refusals_end_the_batch_alike(clib: ctypes.CDLL) -> None:
    for refuse in (REFUSE_BEGIN, REFUSE_WRITE, REFUSE_COMMIT):
        for seed in range(6):
            pair = _run_sender(clib, 100 + seed, set(), refuse)
            out = pair.c.outcome()
            assert out.end in (STORAGE, STOPPED, SILENT, NO_SENDER, ERRORS, PEER), out


# ---- streams: hand-made fragments ---------------------------------------------------------------

GOOD = ["a.bin", "x", "UPPER.BIN", "\u00e9t\u00e9", "n" * 40]
BAD = ["", "../x", "/abs", "a/b", "c:x", "con.txt", "..", "tail.", "a\x01b", "\u202eevil", "m" * 300]
METAS = [b"123", b"5 0 100644", b"0", b"", b"abc", b"1" * 21, b" 5", b"12", b"99999999999",
         b"4294967296", b"20000 777", b"20001", b"7 x y"]


def _header(rng: random.Random) -> bytes:
    name = rng.choice(GOOD * 3 + BAD)
    raw = name.encode("utf-8") if rng.random() > 0.05 else b"\xff\xfe"
    meta = rng.choice(METAS)
    length = rng.choice([BLOCK_SMALL, BLOCK_SMALL, BLOCK_LARGE])
    if rng.random() < 0.05:  # no NUL inside the block
        return build_block(0, (raw * (length // max(1, len(raw)) + 1))[:length] or b"q" * length)
    body = raw + b"\x00" + meta + (b"" if rng.random() < 0.1 else b"\x00")
    if len(body) > length:
        length = BLOCK_LARGE
    payload = body[:length].ljust(length, b"\x00")
    if length == BLOCK_SMALL and rng.random() < 0.2:  # sb's block count in 126-127
        payload = payload[:126] + rng.randbytes(2)
    return build_block(0, payload)


def _fragment(rng: random.Random, state: dict[str, int]) -> bytes:
    r = rng.random()
    if r < 0.12:
        name, size = rng.choice(GOOD), rng.choice([0, 5, 200, 1500])
        state["next"] = 1
        return build_block(0, build_header(name, size, 0, 0o644)[1])
    if r < 0.2:
        return _header(rng)
    if r < 0.45:
        number = rng.choice([state["next"], state["next"], state["next"] - 1, 0,
                             rng.randrange(256)]) & 0xFF
        length = rng.choice([BLOCK_SMALL, BLOCK_LARGE])
        block = build_block(number, rng.choice([rng.randbytes(length),
                                                b"\x1a" * length]))
        if number == state["next"] & 0xFF:
            state["next"] += 1
        return block
    if r < 0.55:
        block = bytearray(build_block(rng.randrange(3), rng.randbytes(BLOCK_SMALL)))
        cut = rng.randrange(len(block))
        if rng.random() < 0.5:
            block[cut] ^= 0xFF
            return bytes(block)
        return bytes(block[:cut]) + rng.choice([b"", b"\x18\x18", b"\x18" * 5 + b"\x08" * 5])
    if r < 0.75:
        return bytes([EOT]) * rng.choice([1, 1, 1, 2])
    if r < 0.8:
        return rng.choice([b"\x18", b"\x18\x18", b"\x18\x00\x18"])
    if r < 0.83:
        return build_block(0, bytes(BLOCK_SMALL))  # end of batch
    return rng.randbytes(rng.randrange(1, 4))


def _script(rng: random.Random) -> list[bytes]:
    """A well-formed batch (headers, blocks, EOT pairs, the end), each frame at times repeated,
    dropped or replaced by a random fragment: the receiver goes deep before it goes wrong."""
    frames: list[bytes] = []
    for _ in range(rng.randrange(1, 4)):
        name, size = rng.choice(GOOD), rng.choice([0, 5, 128, 200, 1500])
        frames.append(build_block(0, build_header(name, size, 0, 0o644)[1]))
        data = rng.randbytes(size)
        for n, off in enumerate(range(0, size, 128), start=1):
            frames.append(build_block(n, data[off : off + 128].ljust(128, b"\x1a")))
        frames += [bytes([EOT]), bytes([EOT])]
    frames.append(build_block(0, bytes(BLOCK_SMALL)))
    out: list[bytes] = []
    state = {"next": 1}
    rate = rng.choice([0.02, 0.1, 0.3])
    for f in frames:
        r = rng.random()
        if r < rate / 3:
            continue
        if r < rate * 2 / 3:
            out += [f, f]
        elif r < rate:
            out.append(rng.choice([
                _fragment(rng, state),
                _header(rng),
                bytes([EOT]),
                b"\x18\x18",
                f[: rng.randrange(len(f))] + rng.choice([b"", b"\x18\x18", b"\x18" * 5 + b"\x08" * 5]),
                bytes([f[0], f[1] ^ 0x10]) + f[2:] if len(f) > 2 else f,
                f + b"\x00",
            ]))
        else:
            out.append(f)
    return out


def _run_fragments(lib: ctypes.CDLL, seed: int, seen: set[tuple[RxState, RxIn]]) -> Pair:
    rng = random.Random(seed)
    refuse = rng.choice([0] * 8 + [REFUSE_BEGIN, REFUSE_WRITE, REFUSE_COMMIT])
    pair = Pair(lib, _config(rng), refuse, seen)
    state = {"next": 1}
    ms = 0
    pair.start(ms)
    script = _script(rng) if rng.random() < 0.5 else None
    for _ in range(len(script) if script is not None else rng.randrange(5, 60)):
        if pair.c.outcome().state is RxState.ABORTED:
            break
        # A refusing store: one frame per burst (the C receiver refuses at the frame, Python
        # after the burst; a sender waits for each answer, so its bursts hold one frame)
        frames = 1 if refuse else rng.choice([1, 1, 1, 2, 3])
        if script is not None:
            burst = b"".join(script.pop(0) for _ in range(min(frames, len(script))))
            if not burst:
                break
        else:
            burst = b"".join(_fragment(rng, state) for _ in range(frames))
        if rng.random() < 0.15 and len(burst) > 2:
            cut = rng.randrange(1, len(burst))
            pair.feed(burst[:cut], ms)
            ms += rng.choice([0, STEP_MS, 1000, 2000])
            burst = burst[cut:]
        pair.feed(burst, ms)
        for _ in range(rng.choice([0, 1, 1, 2, 4] if script is None else [0, 0, 0, 1])):
            ms += STEP_MS * rng.choice([1, 2, 8, 24, 40, 80, 480, 520])
            pair.feed(b"", ms)
    return pair


@pytest.mark.parametrize("block", range(8))
def test_c_receiver_answers_fragments_like_python(clib: ctypes.CDLL, block: int) -> None:
    for seed in range(block * 150, (block + 1) * 150):
        _run_fragments(clib, seed, set())


def _directed(lib: ctypes.CDLL, seen: set[tuple[RxState, RxIn]]) -> list[Pair]:
    """The corners random streams reach rarely: a block cut short, then whole, after the first
    EOT of a file of unknown size; and after a commit: the last block again, a refused header,
    an EOT once the sender moved on (a damaged block came after the commit)."""
    data = bytes(range(256))
    unknown = build_block(0, b"u.bin".ljust(BLOCK_SMALL, b"\x00"))
    blocks = [build_block(n + 1, data[n * 128 : (n + 1) * 128]) for n in range(2)]
    _, sized = build_header("s.bin", 256, 0, 0o644)
    eot = bytes([EOT])
    scenarios = [
        [unknown, blocks[0], eot, blocks[1][:30], b"", blocks[1], eot, eot,
         build_block(0, bytes(BLOCK_SMALL))],
        [build_block(0, sized), *blocks, eot, eot, blocks[1], eot,
         build_block(0, b"../x\x005".ljust(BLOCK_SMALL, b"\x00"))],
        [build_block(0, sized), *blocks, eot, eot, blocks[1][:40] + b"\x00" * 93, b"", eot,
         eot],
    ]
    pairs = []
    for frames in scenarios:
        pair = Pair(lib, DEVICE, 0, seen)
        ms = 0
        pair.start(ms)
        for f in frames:
            ms += 1000 if not f else STEP_MS
            pair.feed(f, ms)
        pairs.append(pair)
    nobody = Pair(lib, DEVICE, 0, seen)  # no sender: 'C' every second, then CAN
    nobody.start(0)
    for ms in range(500, 13000, 500):
        nobody.feed(b"", ms)
    stopped = Pair(lib, DEVICE, 0, seen)  # the device stops mid-file: CAN, temporary dropped
    stopped.start(0)
    stopped.feed(build_block(0, sized), 125)
    stopped.feed(blocks[0], 250)
    stopped.abort()
    return [*pairs, nobody, stopped]


def test_directed_corners_like_python(clib: ctypes.CDLL) -> None:
    ends = [p.c.outcome().end for p in _directed(clib, set())]
    assert ends == [END_BATCH, REFUSED, 0, NO_SENDER, STOPPED]  # the third one still waits


def test_the_streams_reach_every_transition(clib: ctypes.CDLL) -> None:
    seen: set[tuple[RxState, RxIn]] = set()
    ends = {p.c.outcome().end for p in _directed(clib, seen)}
    for seed in range(400):
        ends.add(_run_fragments(clib, seed, seen).c.outcome().end)
    for seed in range(40):
        ends.add(_run_sender(clib, seed, seen).c.outcome().end)
    assert sorted((s.value, i.value) for s, i in set(RX_TRANSITIONS) - seen) == []
    assert ends >= {END_BATCH, PEER, NO_SENDER, ERRORS, SEQUENCE, OTHER_HEADER, REFUSED, SILENT,
                    STORAGE, STOPPED}


def test_every_header_refusal_like_python(clib: ctypes.CDLL) -> None:
    """Every name and metadata of the lists, in 128- and 1024-byte blocks, with and without sb's
    block count in bytes 126-127, and every name length around sb's 123..127 cut."""
    refusals: set[int] = set()
    headers = []
    names = [n.encode("utf-8") for n in [*GOOD, *BAD, "\u00ad", "nul.txt", "ok \u00b9", "a:b"]]
    for raw in [*names, b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80"]:
        for meta in [*METAS, b"5 0", b"5 0 100644 0"]:
            body = raw + b"\x00" + meta + b"\x00"
            for length in (BLOCK_SMALL, BLOCK_LARGE):
                payload = body[:length].ljust(length, b"\x00")
                headers.append(payload)
                if length == BLOCK_SMALL:
                    headers.append(payload[:126] + b"\x01\x02")
    for n in range(118, 129):
        body = b"n" * n + b"\x00" + b"5000 0 100644"
        headers += [body[:BLOCK_SMALL].ljust(BLOCK_SMALL, b"\x00"),
                    body[:126].ljust(126, b"\x00") + b"\x00\x28"]
    headers.append(b"q" * BLOCK_SMALL)
    for payload in headers:
        pair = Pair(clib, DEVICE)
        pair.start(0)
        pair.feed(build_block(0, payload), STEP_MS)
        refusals.add(pair.c.outcome().refusal)
    assert refusals == {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 100, 101, 102, 103}


def test_c_transition_table_is_rx_transitions(clib: ctypes.CDLL) -> None:
    for si, state in enumerate(STATES):
        for ii, inp in enumerate(INPUTS):
            entry = clib.idl_shim_ym_transition(si, ii)
            want = RX_TRANSITIONS.get((state, inp))
            got = None if entry == 0xFF else (STATES[entry >> 5], ACTIONS[entry & 31])
            assert got == want, (state, inp)


def test_the_idempotent_eot_handshake(clib: ctypes.CDLL) -> None:
    """A whole file, the EOT repeated after the commit (its ACK lost), a duplicate block: the
    commit happens once, the repeats are ACKed, the C receiver answers like Python."""
    pair = Pair(clib, DEVICE)
    _, payload = build_header("fw.bin", 200, 0, 0o644)
    data = bytes(range(200))
    assert pair.start(0) == b"C"
    assert pair.feed(build_block(0, payload), 125) == b"\x06C"
    assert pair.feed(build_block(1, data[:128]), 250) == b"\x06"
    assert pair.feed(build_block(1, data[:128]), 375) == b"\x06"  # our ACK was lost
    assert pair.feed(build_block(2, data[128:].ljust(128, b"\x1a")), 500) == b"\x06"
    assert pair.feed(bytes([EOT]), 625) == b"\x15"
    assert pair.feed(bytes([EOT]), 750) == b"\x06C"
    assert pair.feed(bytes([EOT]), 875) == b"\x06C"  # no second commit
    assert pair.feed(build_block(0, bytes(128)), 1000) == b"\x06"
    assert pair.c.outcome() == Outcome(RxState.DONE, END_BATCH, 0)
