"""The C YMODEM receiver (``libidl_core.so`` through ctypes) and the Python one
(``ReceiverDriver`` + ``Receiver`` with a recording sink) behind one interface: ``Pair`` feeds
both the same bytes at the same times and asserts the same answers, storage calls and outcome."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from pathlib import Path

from idemlink.protocol.ymodem_events import FileStarted, HeaderRefused
from idemlink.protocol.ymodem_files import ReceiverDriver, SinkRefused, exchange
from idemlink.protocol.ymodem_names import NameRefusal
from idemlink.protocol.ymodem_receiver import Receiver, ReceiverConfig
from idemlink.protocol.ymodem_tables import RX_TRANSITIONS, RxIn, RxState
from idemlink.protocol.ymodem_wire import HeaderRefusal

STATES = list(RxState)
NAME_CODES = {NameRefusal.EMPTY: 1, NameRefusal.TOO_LONG: 2, NameRefusal.NOT_UTF8: 3,
              NameRefusal.CONTROL_CHAR: 4, NameRefusal.ABSOLUTE: 5, NameRefusal.DRIVE_LETTER: 6,
              NameRefusal.PATH_SEPARATOR: 7, NameRefusal.DOT_DOT: 8, NameRefusal.FORMAT_CHAR: 9,
              NameRefusal.RESERVED_DEVICE: 10, NameRefusal.TRAILING_DOT_SPACE: 11,
              HeaderRefusal.NAME_NOT_TERMINATED: 100, HeaderRefusal.BAD_SIZE: 101,
              HeaderRefusal.SIZE_CUT: 102, HeaderRefusal.TOO_LARGE: 103}
END_BATCH, PEER, NO_SENDER, ERRORS, SEQUENCE, OTHER_HEADER, REFUSED, SILENT, STORAGE, STOPPED = (
    range(1, 11))
REFUSE_BEGIN, REFUSE_WRITE, REFUSE_COMMIT = 1, 2, 3


def load_library(path: Path) -> ctypes.CDLL:
    """``libidl_core.so`` (``support.fixtures.lib_path``) with the YMODEM shim's signatures."""
    lib = ctypes.CDLL(str(path))
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
