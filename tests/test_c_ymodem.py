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
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from idemlink.protocol.ymodem import (
    BLOCK_LARGE,
    BLOCK_SMALL,
    CAN,
    EOT,
    RX_TRANSITIONS,
    FileStarted,
    HeaderRefusal,
    HeaderRefused,
    NameRefusal,
    Receiver,
    ReceiverConfig,
    RxAction,
    RxIn,
    RxState,
    Sender,
    SenderConfig,
    SendFile,
    build_block,
    build_header,
)
from idemlink.protocol.ymodem_files import ReceiverDriver, SinkRefused, exchange

ROOT = Path(__file__).resolve().parents[1]
FW = ROOT / "firmware_ref"
STEP_MS = 125  #: times are multiples of 1/8 s: exact in binary floating point

ACTIONS = [RxAction(name) for name in [
    "accept_header", "refuse_header", "end_batch", "ask_header", "cancel_sequence",
    "peer_cancelled", "accept_block", "reack_header", "cancel_other_header",
    "nak_first_block", "ask_first_block", "first_eot", "purge", "ack_duplicate", "nak",
    "commit", "reack_eot", "nak_stale_eot", "ask_next_header", "ack_only"]]
STATES = list(RxState)
INPUTS = list(RxIn)
NAME_CODES = {NameRefusal.EMPTY: 1, NameRefusal.TOO_LONG: 2, NameRefusal.NOT_UTF8: 3,
              NameRefusal.CONTROL_CHAR: 4, NameRefusal.ABSOLUTE: 5, NameRefusal.DRIVE_LETTER: 6,
              NameRefusal.PATH_SEPARATOR: 7, NameRefusal.DOT_DOT: 8, NameRefusal.FORMAT_CHAR: 9,
              NameRefusal.RESERVED_DEVICE: 10, NameRefusal.TRAILING_DOT_SPACE: 11,
              HeaderRefusal.NAME_NOT_TERMINATED: 100, HeaderRefusal.BAD_SIZE: 101,
              HeaderRefusal.SIZE_CUT: 102, HeaderRefusal.TOO_LARGE: 103}
END_BATCH, PEER, NO_SENDER, ERRORS, SEQUENCE, OTHER_HEADER, REFUSED, SILENT, STORAGE, STOPPED = (
    range(1, 11))
REFUSE_BEGIN, REFUSE_WRITE, REFUSE_COMMIT = 1, 2, 3


def _build_lib() -> ctypes.CDLL:
    if shutil.which("make") is None or not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("cannot build firmware_ref: make or a C compiler is missing")
    proc = subprocess.run(["make", "-s", "-C", str(FW), "lib"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        pytest.fail(f"make lib failed:\n{proc.stdout}\n{proc.stderr}")
    lib = ctypes.CDLL(str(FW / "build" / "libidl_core.so"))
    p, u8p, sz, u32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32
    u32p = ctypes.POINTER(ctypes.c_uint32)
    sig: dict[str, tuple[list[object], object]] = {
        "idl_shim_ym_sizeof": ([], sz),
        "idl_shim_ym_init": ([p, u32p, u32p, ctypes.c_int], None),
        "idl_shim_ym_start": ([p, u32, p, sz], sz),
        "idl_shim_ym_feed": ([p, u8p, sz, u32, p, sz], sz),
        "idl_shim_ym_tick": ([p, u32, p, sz], sz),
        "idl_shim_ym_abort": ([p, p, sz], sz),
        "idl_shim_ym_status": ([p, u32p], None),
        "idl_shim_ym_log": ([p, p, sz], sz),
        "idl_shim_ym_transition": ([ctypes.c_uint, ctypes.c_uint], ctypes.c_uint),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


@pytest.fixture(scope="module")
def clib() -> ctypes.CDLL:
    return _build_lib()


# ---- the two receivers behind one interface ----------------------------------------------------

Record = tuple[object, ...]


class RecordingSink:
    """A FileSink that logs what the C storage callbacks log, and refuses when told to."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.log: list[Record] = []
        self.open_file = False

    def open(self, ev: FileStarted) -> None:
        self.log.append(("B", ev.size is not None, ev.size or 0, ev.name.encode("utf-8")))
        if self.refuse == REFUSE_BEGIN:
            raise SinkRefused("refused at begin")
        self.open_file = True

    def write(self, offset: int, data: bytes) -> None:
        self.log.append(("W", offset, data))
        if self.refuse == REFUSE_WRITE:
            raise SinkRefused("refused at write")

    def commit(self, name: str, size: int) -> str:
        self.log.append(("K", size))
        if self.refuse == REFUSE_COMMIT:
            raise SinkRefused("refused at commit")
        self.open_file = False
        return name

    def discard(self) -> None:
        if self.open_file:
            self.log.append(("A",))
        self.open_file = False


class TracingReceiver(Receiver):
    """Records every (state, input) pair the table acted on."""

    seen: set[tuple[RxState, RxIn]]
    refusal: int = 0  #: the last header refusal (its HeaderRefused event precedes the input)

    def _input(self, inp: RxIn, now: float) -> None:
        if (self.state, inp) in RX_TRANSITIONS:
            self.seen.add((self.state, inp))
        if inp is RxIn.BAD_HEADER:
            ev = self._events[-1]
            assert isinstance(ev, HeaderRefused)
            self.refusal = NAME_CODES[ev.reason]
        super()._input(inp, now)


@dataclass
class Outcome:
    state: RxState
    end: int
    refusal: int


@dataclass
class PyRx:
    config: ReceiverConfig
    refuse: int = 0
    seen: set[tuple[RxState, RxIn]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.sink = RecordingSink(self.refuse)
        self.driver = ReceiverDriver(self.sink, self.config)
        rx = TracingReceiver(self.config)
        rx.seen = self.seen
        self.rx = rx
        self.driver.rx = rx

    def start(self, ms: int) -> bytes:
        self.driver.start(ms / 1000)
        return self.driver.data_to_send()

    def feed(self, data: bytes, ms: int) -> bytes:
        return exchange(self.driver, data, ms / 1000)

    def abort(self) -> bytes:
        """As the device's receive loop stops a batch: abort, then hand the CANs out."""
        self.rx.abort("device stopping")
        self.driver.close()
        return self.rx.data_to_send()

    def take_log(self) -> list[Record]:
        log, self.sink.log = self.sink.log, []
        return log

    def outcome(self) -> Outcome:
        rx = self.rx
        reason = rx.abort_reason or ""
        if rx.state is RxState.DONE:
            end = END_BATCH
        elif rx.state is not RxState.ABORTED:
            end = 0
        elif reason == "cancelled by sender":
            end = PEER
        elif reason.startswith("no sender"):
            end = NO_SENDER
        elif reason.startswith("too many errors"):
            end = ERRORS
        elif reason == "block out of sequence":
            end = SEQUENCE
        elif reason.startswith("a different block 0"):
            end = OTHER_HEADER
        elif reason.startswith("header refused"):
            end = REFUSED
        elif reason.startswith("sender silent"):
            end = SILENT
        elif reason.startswith("refused at"):
            end = STORAGE
        elif reason == "device stopping":
            end = STOPPED
        else:
            raise AssertionError(reason)
        return Outcome(rx.state, end, rx.refusal if end == REFUSED else 0)


class CRx:
    """The C receiver in a ctypes buffer."""

    def __init__(self, lib: ctypes.CDLL, config: ReceiverConfig, refuse: int = 0) -> None:
        self.lib = lib
        self.buf = ctypes.create_string_buffer(lib.idl_shim_ym_sizeof())
        self.out = ctypes.create_string_buffer(1 << 16)
        ms = (ctypes.c_uint32 * 6)(*(round(v * 1000) for v in (
            config.c_interval, config.block_timeout, config.interbyte_timeout,
            config.purge_quiet, config.eot_confirm_timeout, config.silence_timeout or 0)))
        assert config.max_file_size is not None
        limits = (ctypes.c_uint32 * 4)(config.max_file_size, config.header_retries,
                                       config.max_errors, config.max_name_bytes)
        lib.idl_shim_ym_init(self.buf, ms, limits, refuse)

    def _take(self, n: int) -> bytes:
        return self.out.raw[:n]

    def start(self, ms: int) -> bytes:
        return self._take(self.lib.idl_shim_ym_start(self.buf, ms, self.out, len(self.out)))

    def feed(self, data: bytes, ms: int) -> bytes:
        if not data:
            return self._take(self.lib.idl_shim_ym_tick(self.buf, ms, self.out, len(self.out)))
        return self._take(self.lib.idl_shim_ym_feed(self.buf, data, len(data), ms, self.out,
                                                    len(self.out)))

    def abort(self) -> bytes:
        return self._take(self.lib.idl_shim_ym_abort(self.buf, self.out, len(self.out)))

    def take_log(self) -> list[Record]:
        n = self.lib.idl_shim_ym_log(self.buf, self.out, len(self.out))
        raw = self.out.raw[:n]
        log: list[Record] = []
        i = 0
        while i < len(raw):
            kind = raw[i : i + 1].decode()
            if kind == "B":
                known, size, n = raw[i + 1], *struct.unpack_from("<IB", raw, i + 2)
                log.append(("B", bool(known), size, raw[i + 7 : i + 7 + n]))
                i += 7 + n
            elif kind == "W":
                offset, n = struct.unpack_from("<IH", raw, i + 1)
                log.append(("W", offset, raw[i + 7 : i + 7 + n]))
                i += 7 + n
            elif kind == "K":
                log.append(("K", struct.unpack_from("<I", raw, i + 1)[0]))
                i += 5
            else:
                log.append(("A",))
                i += 1
        return log

    def outcome(self) -> Outcome:
        st = (ctypes.c_uint32 * 7)()
        self.lib.idl_shim_ym_status(self.buf, st)
        return Outcome(STATES[st[0]], st[1], st[2] if st[1] == REFUSED else 0)


class Pair:
    """Both receivers; every call must give the same bytes, storage calls and outcome."""

    def __init__(self, lib: ctypes.CDLL, config: ReceiverConfig, refuse: int = 0,
                 seen: set[tuple[RxState, RxIn]] | None = None) -> None:
        self.py = PyRx(config, refuse, seen if seen is not None else set())
        self.c = CRx(lib, config, refuse)
        self.trace: list[str] = []

    def _check(self, what: str, py: bytes, c: bytes) -> bytes:
        self.trace.append(f"{what} -> {py.hex()}")
        assert c == py, "\n".join(self.trace[-30:]) + f"\nC answered {c.hex()}"
        assert self.c.take_log() == self.py.take_log(), "\n".join(self.trace[-30:])
        po, co = self.py.outcome(), self.c.outcome()
        assert co == po, "\n".join(self.trace[-30:])
        return py

    def start(self, ms: int) -> bytes:
        return self._check(f"start@{ms}", self.py.start(ms), self.c.start(ms))

    def feed(self, data: bytes, ms: int) -> bytes:
        return self._check(f"feed@{ms} {data[:40].hex()}{'..' if len(data) > 40 else ''}"
                           f" ({len(data)})", self.py.feed(data, ms), self.c.feed(data, ms))

    def abort(self) -> bytes:
        return self._check("abort", self.py.abort(), self.c.abort())

    @property
    def finished(self) -> bool:
        return self.py.outcome().state in (RxState.DONE, RxState.ABORTED)


DEVICE = ReceiverConfig(c_interval=1.0, header_retries=10, max_file_size=20000)


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
