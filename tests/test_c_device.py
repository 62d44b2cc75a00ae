"""The C device core (firmware_ref/) against the Python reference, and the posix device driven by
the host's own driver.

- Differential: the same seeded random streams of frames (requests with valid and malformed
  PDUs, retransmissions, reused numbers, old and far-ahead numbers, wrong epochs, HELLOs,
  corrupted, truncated and oversized frames, garbage), time steps, sensor changes, external fault
  conditions, failing flash and impossible trigger states go to ``DeviceCore`` + ``DeviceSession``
  and to the C core (``firmware_ref/build/libidl_core.so`` through ctypes, built by
  ``make -C firmware_ref lib``); every answer must be byte-identical, and so must the registers,
  the saved configuration and the decoder's counters.
- End to end: ``make -C firmware_ref device`` builds ``build/posix/idemlink-device``; it is started
  on a pty and driven with ``idemlink.host.device.Device`` (HELLO, reads, set-only writes checked
  against the flash file, REJECTED, NOT_EXECUTED, triggers, W1C clears, a retransmission answered
  by replay, a lossy link).

Everything skips, naming the reason, when make or a C compiler is missing.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import struct
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import serial
from support import firmware
from support.firmware import QemuDevice, RunningDevice
from support.ptys import socat_pair
from support.timing import scaled

import idemlink.device_sim  # noqa: F401  (registers the faulty:// handler with pyserial)
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.host.device import Device
from idemlink.protocol import cobs
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import (
    GENERATION_RESERVE,
    ConfigSnapshot,
    DeviceCore,
    PersistError,
)
from idemlink.protocol.device_session import DeviceSession, Executor
from idemlink.protocol.frame import (
    HEADER_LEN,
    MAX_ENCODED,
    DecodeErrorKind,
    Flags,
    Frame,
    FrameDecoder,
    FrameType,
    build_raw,
    crc32c,
    encode_frame,
)
from idemlink.protocol.modbus import FileInfoResponse, FileInfoStatus
from idemlink.protocol.modbus_rtu import encode_rtu
from idemlink.protocol.outcome import ModbusException, Outcome, Status
from idemlink.protocol.payloads import DeviceInfo
from idemlink.protocol.registers import RegisterKind, RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, builtin_map
from idemlink.protocol.ymodem_names import NameRefusal, check_name

SLOTS = 8  #: IDL_REPLAY_SLOTS the library is built with
TRIGGER_MS = 2000
STEP_MS = 125  #: time steps are multiples of 1/8 s, exact in binary floating point


# ---- the C core through ctypes -----------------------------------------------------------------


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p, u8p = ctypes.c_void_p, ctypes.c_char_p
    sig: dict[str, tuple[list[object], object]] = {
        "idl_shim_sizeof": ([], ctypes.c_size_t),
        "idl_shim_init": ([p, ctypes.c_uint32, ctypes.c_uint32, u8p, ctypes.c_uint32], None),
        "idl_shim_feed": ([p, u8p, ctypes.c_size_t, ctypes.c_uint32, p, ctypes.c_size_t],
                          ctypes.c_size_t),
        "idl_shim_execute": ([p, u8p, ctypes.c_uint16, ctypes.c_uint32, p], ctypes.c_uint16),
        "idl_shim_tick": ([p, ctypes.c_uint32], None),
        "idl_shim_set_input": ([p, ctypes.c_uint16, ctypes.c_uint16, ctypes.c_uint32],
                               ctypes.c_int),
        "idl_shim_set_external": ([p, ctypes.c_uint16, ctypes.c_uint32], None),
        "idl_shim_get": ([p, ctypes.c_uint16], ctypes.c_int32),
        "idl_shim_force_trigger": ([p, ctypes.c_uint16, ctypes.c_uint16], ctypes.c_int),
        "idl_shim_persist_fail": ([p, ctypes.c_int], None),
        "idl_shim_persist_calls": ([p], ctypes.c_uint32),
        "idl_shim_saved": ([p, ctypes.c_uint16], ctypes.c_int32),
        "idl_shim_saved_generation": ([p], ctypes.c_uint32),
        "idl_shim_first_seq": ([p], ctypes.c_uint32),
        "idl_shim_decoder_counter": ([p, ctypes.c_uint], ctypes.c_uint32),
        "idl_shim_rtu_feed": ([p, u8p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint32, p,
                               ctypes.c_size_t], ctypes.c_size_t),
        "idl_shim_rtu_counter": ([p, ctypes.c_uint], ctypes.c_uint32),
        "idl_shim_check_name": ([u8p, ctypes.c_size_t, ctypes.c_size_t], ctypes.c_int),
        "idl_shim_file_info": ([u8p, u8p, ctypes.c_uint16, p], ctypes.c_uint16),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


@pytest.fixture(scope="session")
def clib(lib_path: Path) -> ctypes.CDLL:
    return _load(lib_path)


CANARY = b"\xa5\x5a\xc3\x3c" * 4


class CDevice:
    """One C core in a ctypes buffer with canaries on both sides."""

    def __init__(self, lib: ctypes.CDLL, epoch: int, device_id: str) -> None:
        self.lib = lib
        self.size = lib.idl_shim_sizeof()
        self.buf = ctypes.create_string_buffer(CANARY + bytes(self.size) + CANARY)
        self.ptr = ctypes.c_void_p(ctypes.addressof(self.buf) + len(CANARY))
        self.out = ctypes.create_string_buffer(1 << 16)
        lib.idl_shim_init(self.ptr, epoch, TRIGGER_MS, device_id.encode(), 0)

    def feed(self, data: bytes, now_ms: int) -> bytes:
        n = self.lib.idl_shim_feed(self.ptr, data, len(data), now_ms, self.out, len(self.out))
        return self.out.raw[:n]

    def rtu(self, data: bytes, now_ms: int, pause_after: bool) -> bytes:
        n = self.lib.idl_shim_rtu_feed(self.ptr, data, len(data), int(pause_after), now_ms,
                                       self.out, len(self.out))
        return bytes(self.out.raw[:n])

    def execute(self, pdu: bytes, now_ms: int) -> bytes:
        n = self.lib.idl_shim_execute(self.ptr, pdu, len(pdu), now_ms, self.out)
        return self.out.raw[:n]

    def value(self, address: int) -> int:
        return int(self.lib.idl_shim_get(self.ptr, address))

    def canaries_ok(self) -> bool:
        raw = self.buf.raw
        return raw[:len(CANARY)] == CANARY and raw[len(CANARY) + self.size:][:len(CANARY)] == CANARY


class PyDevice:
    """The reference: DeviceCore behind DeviceSession, with a recording persist hook."""

    def __init__(self, epoch: int, device_id: str) -> None:
        self.core = DeviceCore(DEFAULT_MAP, trigger_duration=TRIGGER_MS / 1000)
        self.persist_fail = False
        self.persist_calls = 0
        self.saved: ConfigSnapshot | None = None
        self.session = DeviceSession(
            self._execute, epoch, contract_hash=contract_hash(), name="idemlink-sim",
            map_hash=DEFAULT_MAP.hash, device_id=device_id, map_name=DEFAULT_MAP.name,
            replay_slots=SLOTS)

    def _persist(self, snap: ConfigSnapshot) -> None:
        self.persist_calls += 1
        if self.persist_fail:
            raise PersistError("flash refused")
        self.saved = snap

    def _execute(self, pdu: bytes, now: float, seq: int) -> bytes:
        return self.core.execute(pdu, now, persist=self._persist)

    def feed(self, data: bytes, now_ms: int) -> bytes:
        self.core.tick(now_ms / 1000)
        self.session.receive_data(data, now_ms / 1000)
        return self.session.data_to_send()


def _of(regmap: RegisterMap, kind: RegisterKind) -> list[int]:
    return [r.address for r in regmap.of_kind(kind)]


def _addr(rng: random.Random, regmap: RegisterMap = DEFAULT_MAP) -> int:
    """A mapped address, a neighbour of one (gaps, the ends), or anything."""
    near = rng.choice([r.address for r in regmap]) + rng.choice([0, 0, 0, -1, 1, 2])
    return rng.choice([near & 0xFFFF, near & 0xFFFF, rng.randrange(0x10000), 0xFFFF, 0xFFF0])


def _value(rng: random.Random) -> int:
    return rng.choice([0, 1, 2, 3, 4, 7, 8, 50, 100, 101, 250, 351, 999, 1000, 1001, 0xFFFF,
                       rng.randrange(0x10000)])


def _count(rng: random.Random, limit: int) -> int:
    return rng.choice([1, 1, 2, 3, 4, 5, 9, 0, limit, limit + 1, rng.randrange(0x10000)])


def random_pdu(rng: random.Random, generation: int, regmap: RegisterMap = DEFAULT_MAP) -> bytes:
    """Mostly well-formed requests for the thermal map, and every kind of malformed one."""
    kind = rng.randrange(12)
    if kind in (0, 1):  # read
        fc = rng.choice([3, 4])
        pdu = struct.pack(">BHH", fc, _addr(rng, regmap), _count(rng, 125) if rng.random() < 0.3
                          else rng.randrange(1, 10))
    elif kind in (2, 3):  # FC06
        pdu = struct.pack(">BHH", 6, _addr(rng, regmap), _value(rng))
    elif kind in (4, 5):  # FC16
        count = rng.randrange(1, 6) if rng.random() < 0.8 else _count(rng, 123)
        values = [_value(rng) for _ in range(min(count, 130))]
        bc = 2 * count if rng.random() < 0.9 else rng.randrange(256)
        pdu = struct.pack(">BHHB", 16, _addr(rng, regmap), count, bc & 0xFF) + struct.pack(
            f">{len(values)}H", *values)
    elif kind == 6:  # 0x41
        count = rng.randrange(1, 4) if rng.random() < 0.85 else _count(rng, 122)
        plausible = rng.random() < 0.5  # holdings only, values in every range
        values = [rng.randrange(3) if plausible else _value(rng) for _ in range(min(count, 130))]
        gen = generation if rng.random() < 0.6 else _value(rng)
        holdings = _of(regmap, RegisterKind.HOLDING)
        address = rng.choice(holdings[:-1] or holdings) if plausible else _addr(rng, regmap)
        pdu = struct.pack(">BHHHB", 0x41, gen, address, count, (2 * count) & 0xFF) + \
            struct.pack(f">{len(values)}H", *values)
    elif kind in (7, 8):  # 0x42
        triggers = _of(regmap, RegisterKind.TRIGGER)
        pdu = struct.pack(">BHH", 0x42, rng.choice([*triggers, *triggers, _addr(rng, regmap)]),
                          rng.choice([0, 1, 1, 2, _value(rng)]))
    elif kind == 9:  # W1C on the fault word
        faults = _of(regmap, RegisterKind.FAULT)
        pdu = struct.pack(">BHH", 6, rng.choice(faults), rng.choice([1, 2, 4, 7, 8, 9, 0]))
    elif kind == 10:  # unknown or file functions, random bytes
        pdu = bytes([rng.choice([0, 1, 2, 5, 0x44, 0x45, 0x83, 0x90, 0xFF])]) + rng.randbytes(
            rng.randrange(0, 8))
    else:
        pdu = b""
    r = rng.random()
    if r < 0.05 and pdu:
        pdu = pdu[:rng.randrange(len(pdu))]  # short
    elif r < 0.1:
        pdu += rng.randbytes(rng.randrange(1, 4))  # trailing
    return pdu


def _corrupt(rng: random.Random, wire: bytes) -> bytes:
    how = rng.randrange(5)
    raw = bytearray(wire)
    if how == 0 and len(raw) > 3:  # flip a bit inside
        i = rng.randrange(1, len(raw) - 1)
        raw[i] ^= 1 << rng.randrange(8)
        return bytes(raw)
    if how == 1:  # truncated, then the next frame's delimiter
        return bytes(raw[:rng.randrange(1, len(raw))])
    if how == 2:  # no delimiter for longer than the decoder holds
        return b"\x00" + bytes(rng.randrange(1, 256) for _ in range(MAX_ENCODED + rng.randrange(1, 40)))
    if how == 3:  # another version, unknown type or flag, bad length (valid CRC); addressed
        # (good and reserved addresses) and tagged frames, which this revision's devices ignore
        ftype, flags, version, pl, address, tag = rng.choice([
            (3, 0, 2, b"\x03", None, None), (9, 0, 1, b"", None, None),
            (3, 0x10, 1, b"", None, None), (3, 0x40, 1, b"ab", None, None),
            (3, 0x04, 1, b"\x03", rng.choice([0, 1, 7, 247, 248, 255]), None),
            (1, 0x04, 1, b"", 9, None), (3, 0x80, 1, b"ab", None, bytes(8)),
            (3, 0xC4, 1, b"ab", 5, bytes(16)), (9, 0x04, 1, b"", 3, None)])
        raw2 = build_raw(ftype, 1, 0, pl, flags, version=version, auth_tag=tag, address=address)
        return b"\x00" + cobs.encode(raw2) + b"\x00"
    return rng.randbytes(rng.randrange(1, 20))  # garbage


class Stream:
    """Drives both devices with the same seeded random events and compares them."""

    def __init__(self, lib: ctypes.CDLL, seed: int) -> None:
        self.rng = random.Random(seed)
        self.epoch = self.rng.randrange(1, 1 << 32)
        device_id = f"c-{seed:08x}"
        self.py = PyDevice(self.epoch, device_id)
        self.c = CDevice(lib, self.epoch, device_id)
        self.lib = lib
        self.now = 0
        self.seq = self.rng.choice([1, 1, 0xFFFFFFF0, self.rng.randrange(1 << 32)])
        self.sent: list[tuple[int, bytes]] = []
        self.answers = 0

    def both(self, data: bytes) -> None:
        a = self.py.feed(data, self.now)
        b = self.c.feed(data, self.now)
        assert b == a, f"answers differ for {data.hex()}:\n py {a.hex()}\n  c {b.hex()}"
        self.answers += len(a) > 0

    def request(self) -> bytes:
        rng = self.rng
        r = rng.random()
        if r < 0.55 or not self.sent:
            self.seq = (self.seq + rng.choice([1, 1, 1, 2, 5])) & 0xFFFFFFFF
            seq, pdu = self.seq, random_pdu(rng, self.py.core.generation)
            self.sent.append((seq, pdu))
        elif r < 0.75:  # retransmission (same number, same payload)
            seq, pdu = rng.choice(self.sent[-12:])
        elif r < 0.82:  # the number reused for other content
            seq, _ = rng.choice(self.sent[-12:])
            pdu = random_pdu(rng, self.py.core.generation)
        elif r < 0.88:  # a late first arrival, or long gone
            seq = (self.seq - rng.choice([1, 3, 40, 991, 992, 993, 5000])) & 0xFFFFFFFF
            pdu = random_pdu(rng, self.py.core.generation)
        elif r < 0.92:  # far ahead (and the wrap)
            seq = (self.seq + rng.choice([992, 1 << 30, (1 << 31) - 1, 1 << 31])) & 0xFFFFFFFF
            pdu = random_pdu(rng, self.py.core.generation)
        else:
            seq, pdu = self.seq, random_pdu(rng, self.py.core.generation)
        epoch = self.epoch if rng.random() < 0.95 else rng.randrange(1 << 32)
        flags = rng.choice([0, 0, 0, 1, 2, 3])
        return encode_frame(FrameType.REQUEST, seq, epoch, pdu, flags)

    def step(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.6:
            wire = self.request()
            if rng.random() < 0.1:  # two frames in one read, or one split over two reads
                if rng.random() < 0.5:
                    wire += self.request()
                else:
                    cut = rng.randrange(len(wire))
                    self.both(wire[:cut])
                    wire = wire[cut:]
            self.both(wire)
        elif r < 0.65:
            self.both(encode_frame(FrameType.HELLO, rng.randrange(1 << 32), 0,
                                   bytes([1]) + contract_hash()))
        elif r < 0.67:  # a frame a device must not answer
            self.both(encode_frame(rng.choice([FrameType.RESPONSE, FrameType.HELLO_REPLY]),
                                   self.seq, self.epoch, b"\x00"))
        elif r < 0.75:
            self.both(_corrupt(rng, self.request()))
        elif r < 0.85:
            self.now += STEP_MS * rng.choice([1, 2, 4, 8, 16, 24])
        elif r < 0.9:
            value = rng.choice([200, 349, 350, 351, 600, 1001])
            self.py.core.set_input("temperature", value, self.now / 1000)
            assert self.lib.idl_shim_set_input(self.c.ptr, 0, value, self.now) == 1
        elif r < 0.93:
            bits = rng.randrange(8) & 0b110
            for name, bit in (("sensor_fault", 2), ("fan_stall", 4)):
                self.py.core.set_condition(name, bool(bits & bit), self.now / 1000)
            self.lib.idl_shim_set_external(self.c.ptr, bits, self.now)
        elif r < 0.96:
            fail = rng.random() < 0.5
            self.py.persist_fail = fail
            self.lib.idl_shim_persist_fail(self.c.ptr, int(fail))
        elif r < 0.97:
            raw = rng.choice([0, 1, 2, 3, 7])
            self.py.core.force_trigger_state("self_clean", raw)
            assert self.lib.idl_shim_force_trigger(self.c.ptr, 8, raw) == 1
        else:
            self.py.core.tick(self.now / 1000)
            self.lib.idl_shim_tick(self.c.ptr, self.now)
        self.check_state()

    def check_state(self) -> None:
        assert self.c.canaries_ok()
        py_values = {r.address: self.py.core.value(r.name) for r in DEFAULT_MAP}
        c_values = {a: self.c.value(a) for a in py_values}
        assert c_values == py_values
        assert self.lib.idl_shim_persist_calls(self.c.ptr) == self.py.persist_calls
        if self.py.saved is not None:
            assert {a: self.lib.idl_shim_saved(self.c.ptr, a)
                    for a, _ in self.py.saved.holdings} == dict(self.py.saved.holdings)
            assert self.lib.idl_shim_saved_generation(self.c.ptr) == self.py.saved.generation
        assert self.lib.idl_shim_first_seq(self.c.ptr) == self.py.session.first_seq()
        counters = self.py.session.decoder.counters
        assert self.lib.idl_shim_decoder_counter(self.c.ptr, 0) == counters["FRAMES"]
        for kind in DecodeErrorKind:
            assert self.lib.idl_shim_decoder_counter(self.c.ptr, kind.value) == \
                counters[kind.name], kind.name


@pytest.mark.parametrize("seed", range(40))
def test_c_core_answers_like_python(clib: ctypes.CDLL, seed: int) -> None:
    stream = Stream(clib, seed)
    for _ in range(400):
        stream.step()
    assert stream.answers > 100


def test_the_streams_reach_every_answer(clib: ctypes.CDLL) -> None:
    """The differential is only as good as its streams: together they produce every session
    disposition, every decoder refusal, every Modbus exception and every trigger code."""
    sessions: Counter[str] = Counter()
    decoder: Counter[str] = Counter()
    pdus: Counter[tuple[int, int]] = Counter()
    for seed in range(12):
        stream = Stream(clib, seed)
        executed = stream.py.session
        original = executed.executor

        def spy(pdu: bytes, now: float, seq: int, run: Executor = original) -> bytes:
            answer = run(pdu, now, seq)
            if answer[0] & 0x80:
                pdus[(0x80, answer[1])] += 1
            elif answer[0] == 0x42:
                pdus[(0x42, int.from_bytes(answer[3:5], "big"))] += 1
            elif answer[0] == 0x41:
                pdus[(0x41, answer[1])] += 1
            return answer

        executed.executor = spy
        for _ in range(400):
            stream.step()
        sessions.update(executed.counters)
        decoder.update(executed.decoder.counters)
    for name in ("executed", "replayed", "conflict", "evicted", "too_old", "epoch_mismatch",
                 "hello", "unexpected_frames", "decode_errors"):
        assert sessions[name] > 0, name
    for kind in DecodeErrorKind:
        if kind is not DecodeErrorKind.BAD_MAC:  # needs a session key: neither device has one
            assert decoder[kind.name] > 0, kind.name
    for key in [(0x80, code) for code in (1, 2, 3, 4)] + [
            (0x42, code) for code in (0, 0x0101, 0x0102, 0xFF00, 0xFF01)] + [(0x41, 0), (0x41, 0x12)]:
        assert pdus[key] > 0, key


def test_c_modbus_pdus_like_python(clib: ctypes.CDLL) -> None:
    """Many PDUs straight into the Modbus layer (no session), with time moving on."""
    rng = random.Random(7)
    py = DeviceCore(DEFAULT_MAP, trigger_duration=TRIGGER_MS / 1000)
    c = CDevice(clib, 1, "x")
    now = 0
    for i in range(6000):
        pdu = random_pdu(rng, py.generation)
        if i % 7 == 0:
            now += STEP_MS * rng.randrange(1, 20)
        assert c.execute(pdu, now) == py.execute(pdu, now / 1000), pdu.hex()
    assert c.canaries_ok()


def test_c_hello_reply_decodes(clib: ctypes.CDLL) -> None:
    c = CDevice(clib, 0x12345678, "dev-1")
    wire = c.feed(encode_frame(FrameType.HELLO, 77, 0, bytes([1]) + contract_hash()), 0)
    raw = cobs.decode(wire.strip(b"\x00"))
    assert raw is not None
    info = DeviceInfo.decode(raw[HEADER_LEN:-4])
    assert info.map_hash == DEFAULT_MAP.hash and info.device_id == "dev-1"
    assert info.map_name == DEFAULT_MAP.name and info.contract_hash == contract_hash()
    assert (info.window, info.max_payload, info.replay_slots, info.max_inflight, info.next_seq) \
        == (992, 512, SLOTS, SLOTS, 1)



def _rtu_read(rng: random.Random, generation: int) -> bytes:
    """One read of an RTU line: requests for us, for everyone, for another unit, damaged ones,
    garbage, several frames back to back."""
    r = rng.random()
    unit = 1 if r < 0.7 else 0 if r < 0.8 else rng.choice([2, 17, 247])
    frame = encode_rtu(unit, random_pdu(rng, generation))
    r = rng.random()
    if r < 0.08:
        damaged = bytearray(frame)
        damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        return bytes(damaged)
    if r < 0.12:
        return rng.randbytes(rng.randrange(1, 40))
    if r < 0.2:  # a second, well-formed request right behind it
        second = struct.pack(">BHH", rng.choice([3, 6]), rng.randrange(12), rng.randrange(3))
        return frame + encode_rtu(1, second)
    return frame


@pytest.mark.parametrize("seed", range(10))
def test_c_rtu_answers_like_the_python_rtu_server(clib: ctypes.CDLL, seed: int) -> None:
    """Each read arrives after a pause of the line and is followed by one (an idle line), as on
    a point-to-point link: the C RTU face and ``RtuServer`` answer the same bytes. (Back-to-back
    frames are all well-formed: ``RtuDecoder`` sees pauses only at read boundaries, so after a
    damaged frame it also refuses a valid one that does not end where a read ended; the C face
    is told of every pause and needs no such rule.)"""
    rng = random.Random(1000 + seed)
    core = DeviceCore(DEFAULT_MAP, trigger_duration=TRIGGER_MS / 1000)
    server = RtuServer(core, unit=1)
    c = CDevice(clib, 1, "rtu")
    now = 0
    answered = 0
    for _ in range(300):
        now += STEP_MS * rng.randrange(2, 6)  # after the previous idle mark (+ 0.2 s)
        data = _rtu_read(rng, core.generation)
        server.receive_data(data, now / 1000)
        server.tick(now / 1000 + 0.2)
        py = server.data_to_send()
        mine = c.rtu(data, now, pause_after=False) + c.rtu(b"", now + 200, pause_after=True)
        assert mine == py, data.hex()
        answered += len(py) > 0
    assert answered > 100
    assert {r.address: core.value(r.name) for r in DEFAULT_MAP} == {
        r.address: c.value(r.address) for r in DEFAULT_MAP}
    assert c.canaries_ok()


# ---- the posix device, driven by the host's own driver ----------------------------------------


@pytest.fixture
def cdev(device_bin: Path, tmp_path: Path) -> Iterator[RunningDevice]:
    dev = RunningDevice(device_bin, tmp_path / "flash", "--trigger-duration", "60")
    try:
        yield dev
    finally:
        dev.kill()


def test_hello_advertises_the_built_in_map_and_a_stable_id(cdev: RunningDevice) -> None:
    with Device.open(cdev.path) as dev:
        info = dev.info
    assert info is not None
    assert info.map_hash == DEFAULT_MAP.hash and info.map_name == DEFAULT_MAP.name
    assert info.contract_hash == contract_hash()
    stored = (cdev.flash / "device_id").read_text(encoding="ascii").strip()
    assert info.device_id == stored and stored
    assert (info.window, info.replay_slots, info.next_seq) == (992, SLOTS, 1)
    with Device.open(cdev.path) as dev:  # the port reopened: a new host session
        assert dev.read("mode").values == (1,)
        again = dev.info
    assert again is not None and again.next_seq == 1 + 992  # beyond the first hand-out
    assert cdev.stop()["hello"] >= 2


def test_reads_and_set_only_writes_reach_the_flash(cdev: RunningDevice) -> None:
    with Device.open(cdev.path) as dev:
        assert dev.read("temperature", 3).values == (250, 450, 1200)
        assert not (cdev.flash / "config.json").exists()
        assert dev.write({"threshold": 420, "mode": 2, "fan_setpoint": 75}).ok
        assert dev.read("threshold", 3).values == (420, 2, 75)
        assert dev.read("generation").values == (1,)
        # flash keeps the ceiling, not the generation (DeviceCore's save policy)
        assert cdev.config() == ConfigSnapshot(((4, 420), (5, 2), (6, 75)), 1 + GENERATION_RESERVE)
        assert dev.write({"threshold": 420}).ok  # the same value again: no change
        assert dev.read("generation").values == (1,)
        bad = dev.write({"threshold": 1001})
        assert bad.outcome is Outcome.REJECTED
        assert bad.exception is ModbusException.ILLEGAL_DATA_VALUE
        assert dev.read("threshold").values == (420,)
        assert cdev.config().generation == 1 + GENERATION_RESERVE
    cdev.stop()


def test_configuration_and_id_survive_a_restart(device_bin: Path, tmp_path: Path) -> None:
    first = RunningDevice(device_bin, tmp_path / "flash")
    with Device.open(first.path) as dev:
        assert dev.write({"fan_setpoint": 9}).ok
        ident = dev.info.device_id if dev.info else None
        epoch = dev.info and dev.session.epoch
    first.stop()
    second = RunningDevice(device_bin, tmp_path / "flash")
    with Device.open(second.path) as dev:
        assert dev.read("fan_setpoint").values == (9,)
        assert dev.read("generation").values == (1 + GENERATION_RESERVE,)  # boots at the ceiling
        assert dev.info is not None and dev.info.device_id == ident
        assert dev.session.epoch != epoch
    second.stop()


def test_conditional_write_and_trigger(cdev: RunningDevice) -> None:
    with Device.open(cdev.path) as dev:
        stale = dev.write_if_generation(5, {"threshold": 500})
        assert stale.outcome is Outcome.NOT_EXECUTED and stale.code == 0
        ok = dev.write_if_generation(0, {"threshold": 500})
        assert ok.ok and ok.code == 1
        assert dev.read("threshold").values == (500,)
        assert dev.trigger().code == 0
        assert dev.trigger().code == 0x0101
        assert dev.trigger_status().values == (1,)
        assert dev.trigger_reset().code == 0
        assert dev.trigger_status().values == (0,)
    cdev.stop()


def test_fault_bits_clear_only_when_their_condition_is_gone(cdev: RunningDevice) -> None:
    with Device.open(cdev.path) as dev:
        assert dev.read("faults").values == (0,)
        assert dev.write({"threshold": 100}).ok  # temperature 250 > 100: over-temperature
        assert dev.read("faults").values == (1,)
        assert dev.clear_faults(1).ok
        assert dev.read("faults").values == (1,)  # the condition persists: stays latched
        assert dev.write({"threshold": 300}).ok
        assert dev.read("faults").values == (1,)  # latched after the condition went
        assert dev.clear_faults(1).ok
        assert dev.read("faults").values == (0,)
        bad = dev.clear_faults(8)  # a bit the map does not declare
        assert bad.exception is ModbusException.ILLEGAL_DATA_VALUE
    cdev.stop()


def _exchange(port: serial.Serial, wire: bytes) -> Frame:
    port.write(wire)
    decoder = FrameDecoder()
    for _ in range(50):
        decoder.receive_data(port.read(port.in_waiting or 1))
        for event in iter(decoder.next_event, None):
            assert isinstance(event, Frame), event
            return event
    raise AssertionError("no answer")


def test_a_retransmission_is_answered_by_replay(cdev: RunningDevice) -> None:
    port = serial.serial_for_url(cdev.path, timeout=0.1)
    try:
        hello = _exchange(port, encode_frame(FrameType.HELLO, 9, 0, bytes([1]) + contract_hash()))
        epoch = hello.epoch
        write = struct.pack(">BHH", 6, 4, 640)
        first = _exchange(port, encode_frame(FrameType.REQUEST, 5, epoch, write))
        again = _exchange(port, encode_frame(FrameType.REQUEST, 5, epoch, write, Flags.RETRANSMIT))
        assert first.payload == b"\x00" + write and not first.flags & Flags.REPLAY
        assert again.payload == first.payload and again.flags & Flags.REPLAY
        other = _exchange(port, encode_frame(FrameType.REQUEST, 5, epoch, struct.pack(
            ">BHH", 6, 4, 641)))
        assert other.payload == bytes([Status.IDEMPOTENCY_CONFLICT])
        wrong = _exchange(port, encode_frame(FrameType.REQUEST, 6, epoch ^ 1, write))
        assert wrong.payload == bytes([Status.EPOCH_MISMATCH]) + (epoch ^ 1).to_bytes(4, "little")
        read = _exchange(port, encode_frame(FrameType.REQUEST, 7, epoch, struct.pack(
            ">BHH", 3, 3, 2)))
        assert read.payload == b"\x00\x03\x04" + struct.pack(">HH", 1, 640)  # generation 1
    finally:
        port.close()
    counters = cdev.stop()
    assert (counters["executed"], counters["replayed"], counters["conflict"]) == (2, 1, 1)
    assert cdev.config().generation == 1 + GENERATION_RESERVE


def test_every_command_acts_once_over_a_lossy_link(cdev: RunningDevice) -> None:
    url = (f"faulty://{cdev.path}?frame_loss=0.2&frame_dup=0.1&frame_corrupt=0.05"
           "&baud=115200&latency_ms=1&seed=11")
    with Device.open(url, timeout=0.05, attempts=12) as dev:
        results = [dev.write({"threshold": 300 + i}) for i in range(20)]
        results += dev.run([dev.read_command("threshold")] * 10)
        results.append(dev.trigger())
        assert [r.outcome for r in results] == [Outcome.OK] * len(results)
        assert results[-2].values == (319,)
        sent = sum(len(r.sent_as) for r in results)
        assert dev.session.counters.retries > 0
        assert dev.read("generation").values == (20,)
    counters = cdev.stop()
    # one execution per command: the retries were replayed, never run again
    assert counters["executed"] == len(results) + 1 == sent + 1
    assert counters["replayed"] > 0
    assert cdev.config() == ConfigSnapshot(((4, 319), (5, 1), (6, 50)), 1 + GENERATION_RESERVE)


def test_bad_arguments_are_one_line(device_bin: Path, tmp_path: Path) -> None:
    bad_id = subprocess.run([str(device_bin), "--device-id", "-x"], capture_output=True,
                            text=True, timeout=5, check=False)
    assert bad_id.returncode == 1 and len(bad_id.stderr.splitlines()) == 1
    assert bad_id.stdout == ""
    usage = subprocess.run([str(device_bin), "--bogus", "1"], capture_output=True, text=True,
                           timeout=5, check=False)
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "config.json").write_text('{"generation": 1, "holdings": [[4, 5000]]}')
    broken = subprocess.run([str(device_bin), "--flash-dir", str(flash)], capture_output=True,
                            text=True, timeout=5, check=False)
    assert broken.returncode == 1 and len(broken.stderr.splitlines()) == 1
    assert broken.stdout == ""


def test_sigint_stops_cleanly(device_bin: Path, tmp_path: Path) -> None:
    dev = RunningDevice(device_bin, tmp_path / "flash")
    dev.proc.send_signal(signal.SIGINT)
    _, err = dev.proc.communicate(timeout=5)
    assert dev.proc.returncode == 0, err


# ---- the firmware targets of the core -----------------------------------------------------------


def test_make_size_device_meets_the_budget() -> None:
    """Cortex-M0+ and M4, -Os: the whole core without YMODEM in <= 6 KiB of code, without
    FILE_INFO too (issue 24's minimal framed device) in <= 4.5 KiB, one device's RAM (K = 8
    replay slots) <= 4 KiB; the bus option (IDL_BUS=1) on its own lines: the framed device with
    it within the same 6 KiB and 4 KiB."""
    out = firmware.make_once("size-device",
                             tools=("arm-none-eabi-gcc", "arm-none-eabi-size", "arm-none-eabi-nm"))
    rows = [dict(kv.split("=", 1) for kv in ln.split())
            for ln in out.splitlines() if ln.startswith("cpu=")]
    for cpu in ("cortex-m0plus", "cortex-m4"):
        mine = {r["module"]: r for r in rows if r["cpu"] == cpu}
        assert set(mine) == {"crc32c", "frame", "replay", "window", "session", "regs", "modbus",
                             "device", "name", "files", "blake2s", "rtu", "libc", "libgcc",
                             "total", "ymodem",
                             "total_ymodem",
                             "bus", "total_bus", "total_ymodem_bus", "total_framed"}
        mine.pop("ymodem")  # FILE_RECEIVE and the receiver: tests/test_c_file_receive.py
        mine.pop("total_ymodem")
        bus, total_bus = mine.pop("bus"), mine.pop("total_bus")
        mine.pop("total_ymodem_bus")
        assert 0 < int(bus["text"]) < 600  # the address filter and the broadcast window
        assert int(total_bus["text"]) + int(total_bus["data"]) <= 6144
        assert int(total_bus["ram_device"]) + int(total_bus["data"]) + int(total_bus["bss"]) \
            <= 4096
        framed = mine.pop("total_framed")
        total = mine.pop("total")
        # without FILE_INFO: less than the whole by at least name + files, within its budget
        assert int(framed["text"]) <= int(total["text"]) - int(mine["name"]["text"]) \
            - int(mine["files"]["text"])
        assert int(framed["text"]) + int(framed["data"]) <= int(framed["budget_text"]) == 4608
        mine.pop("rtu")  # the optional plain-RTU face is listed apart
        # IDL_AUTH's own module: compiled empty without it (make bench-auth measures it)
        assert int(mine["blake2s"]["text"]) == 0
        # newlib-nano's memcpy/memset/memcmp, apart: the total row's link, as its libc= says
        assert int(mine.pop("libc")["text"]) == int(total["libc"]) > 0
        assert int(mine.pop("libgcc")["text"]) == int(total["libgcc"])
        for row in (total, framed, total_bus):  # flash: the modules and what they link
            assert int(row["flash"]) == int(row["text"]) + int(row["data"]) + int(row["libc"]) \
                + int(row["libgcc"]) <= int(row["budget_flash"])
        assert int(total["text"]) == sum(int(r["text"]) for r in mine.values())
        assert int(total["text"]) + int(total["data"]) <= 6144
        assert int(total["ram_device"]) + int(total["data"]) + int(total["bss"]) <= 4096


def test_make_qemu_core() -> None:
    out = firmware.make("qemu-core", tools=("arm-none-eabi-gcc", "qemu-system-arm"))
    assert out.count(" 0 failures") == 2



@pytest.mark.slow
def test_make_fuzz_core() -> None:
    firmware.need_libfuzzer()
    firmware.make("fuzz-core", "FUZZ_TIME=30")


# ---- the posix device as a Modbus RTU slave ------------------------------------------------------


@pytest.fixture
def rtu_line(device_bin: Path, tmp_path: Path) -> Iterator[tuple[str, RunningDevice]]:
    """A socat pty pair; the C device (``--modbus-rtu``, unit 1) on one end; yields the other."""
    with socat_pair(tmp_path, "dev") as (a, b):
        dev = RunningDevice(device_bin, tmp_path / "flash", "--port", a, "--modbus-rtu",
                            "--unit", "1", "--trigger-duration", "0.3")
        try:
            yield b, dev
        finally:
            dev.kill()


def _ask(port: serial.Serial, frame: bytes, expect: int) -> bytes:
    port.reset_input_buffer()
    port.write(frame)
    return bytes(port.read(expect))


def test_rtu_mode_serves_minimalmodbus_and_raw_frames(rtu_line: tuple[str, RunningDevice]) -> None:
    import minimalmodbus

    path, dev = rtu_line
    inst = minimalmodbus.Instrument(path, 1)
    inst.serial.baudrate = 115200
    inst.serial.timeout = 0.5
    inst.close_port_after_each_call = True
    inst.write_register(5, 2, functioncode=6)  # minimalmodbus verifies the FC06 echo
    assert inst.read_registers(0, 3, functioncode=4) == [250, 450, 1200]
    inst.write_registers(4, [300, 0, 75])
    assert inst.read_registers(4, 3) == [300, 0, 75]
    with pytest.raises(minimalmodbus.IllegalRequestError):
        inst.write_registers(4, [301, 0, 200])  # fan_setpoint 200 > 100: nothing changes
    assert inst.read_registers(4, 3) == [300, 0, 75]
    with pytest.raises(minimalmodbus.IllegalRequestError):
        inst.read_register(20)

    port = serial.Serial(path, 115200, timeout=0.3)
    try:
        assert _ask(port, encode_rtu(1, bytes.fromhex("0600000001")), 5) == encode_rtu(
            1, bytes.fromhex("8602"))
        assert _ask(port, encode_rtu(1, bytes.fromhex("2b0e0100")), 5) == encode_rtu(
            1, bytes.fromhex("ab01"))  # unknown function: framed by the pause after it
        assert _ask(port, encode_rtu(2, bytes.fromhex("0300000001")), 1) == b""
        bad = bytearray(encode_rtu(1, bytes.fromhex("0600060000")))
        bad[-1] ^= 0x55
        assert _ask(port, bytes(bad), 1) == b""
        for garbage in (b"\x00", b"\xff\xfe\x01", bytes(range(40)), b"\x01\x10\x00\x00\x00\x01\xf6"):
            port.write(garbage)
            port.flush()
            time.sleep(0.05)  # the pause is the stimulus: a frame boundary (t3.5 = 1.75 ms)
            assert _ask(port, encode_rtu(1, bytes.fromhex("0300060001")), 7) == encode_rtu(
                1, bytes.fromhex("0302004b")), garbage
    finally:
        port.close()
    counters = dev.stop()
    assert counters["bad_crc"] >= 1 and counters["other_unit"] == 1
    assert dev.config() == ConfigSnapshot(((4, 300), (5, 0), (6, 75)), 1 + GENERATION_RESERVE)



# ---- another register map: the core is the map's, not the thermal controller's -----------------

PUMP = builtin_map("pump-controller")


def test_pump_map_core_answers_like_python(pump_build: Path) -> None:
    lib = _load(pump_build / "libidl_core.so")
    rng = random.Random(3)
    py = DeviceCore(PUMP, trigger_duration=TRIGGER_MS / 1000)
    c = CDevice(lib, 1, "pump")
    now = 0
    for i in range(6000):
        if i % 5 == 0:
            now += STEP_MS * rng.randrange(1, 12)
        pdu = random_pdu(rng, py.generation, PUMP)
        assert c.execute(pdu, now) == py.execute(pdu, now / 1000), pdu.hex()
    assert {r.address: py.value(r.name) for r in PUMP} == {r.address: c.value(r.address)
                                                          for r in PUMP}
    assert c.canaries_ok()


def test_pump_device_advertises_its_map_and_reverts_a_volatile_holding_at_boot(
        pump_build: Path, tmp_path: Path) -> None:
    binary = pump_build / "posix" / "idemlink-device"
    first = RunningDevice(binary, tmp_path / "flash")
    with Device.open(first.path, regmap=PUMP) as dev:
        assert dev.info is not None and dev.info.map_hash == PUMP.hash
        assert dev.info.map_name == PUMP.name
        assert dev.write({"speed_setpoint": 2000}).ok
        assert dev.write({"test_speed": 1200}).ok
        assert dev.trigger("prime").code == 0
        assert dev.read("test_speed").values == (1200,)
    assert first.stop()["flash_writes"] == 1  # the volatile write saved nothing
    saved = first.config()
    # the volatile test_speed is saved at its default
    assert saved == ConfigSnapshot(((0x201, 2000), (0x202, 60), (0x203, 0), (0x204, 0)),
                                   1 + GENERATION_RESERVE)
    second = RunningDevice(binary, tmp_path / "flash")
    reference = DeviceCore(PUMP, config=saved)  # what the Python simulator boots into
    with Device.open(second.path, regmap=PUMP) as dev:
        values = dev.read("config_generation", 5).values
        assert values == tuple(reference.value(r) for r in (
            "config_generation", "speed_setpoint", "max_pressure", "control", "test_speed"))
        assert values[0] == 1 + GENERATION_RESERVE and values[-1] == 0  # the ceiling; default
        assert dev.read("prime").values == (0,)  # volatile state starts IDLE
    second.stop()


# ---- the device on an emulated MCU (QEMU mps2-an385) ---------------------------------------------


def test_the_core_on_an_emulated_cortex_m3(qemu_elf: Path, tmp_path: Path) -> None:
    """The same host driver, the same answers, from the core running on QEMU's Cortex-M3 with its
    UART on a pty: identity, writes, refusals, a replayed retransmission, a lossy link, and the
    configuration kept across a power cycle."""
    first = QemuDevice(qemu_elf, tmp_path)
    try:
        with Device.open(first.path, timeout=scaled(0.5)) as dev:
            assert dev.info is not None and dev.info.device_id == "qemu-mps2-an385"
            assert dev.info.map_hash == DEFAULT_MAP.hash
            assert dev.write({"threshold": 420, "mode": 2}).ok
            assert dev.write({"fan_setpoint": 101}).exception is ModbusException.ILLEGAL_DATA_VALUE
            assert dev.write_if_generation(7, {"threshold": 1}).outcome is Outcome.NOT_EXECUTED
            assert [dev.trigger().code, dev.trigger().code] == [0, 0x0101]
            epoch = dev.session.epoch
        port = serial.serial_for_url(first.path, timeout=scaled(0.5))
        try:
            write = struct.pack(">BHH", 6, 6, 77)
            once = _exchange(port, encode_frame(FrameType.REQUEST, 50_000, epoch, write))
            again = _exchange(port, encode_frame(FrameType.REQUEST, 50_000, epoch, write,
                                                 Flags.RETRANSMIT))
            assert again.payload == once.payload and again.flags & Flags.REPLAY
        finally:
            port.close()
        url = (f"faulty://{first.path}?frame_loss=0.2&frame_dup=0.1&frame_corrupt=0.05"
               "&baud=115200&latency_ms=1&seed=5")
        with Device.open(url, timeout=scaled(0.1), attempts=12) as dev:
            results = [dev.write({"threshold": 500 + i}) for i in range(10)]
            assert [r.outcome for r in results] == [Outcome.OK] * 10
            assert dev.read("generation").values == (12,)  # 2 writes before, 10 here: once each
    finally:
        first.stop()
    second = QemuDevice(qemu_elf, tmp_path)  # power cycle: the configuration came back
    try:
        with Device.open(second.path, timeout=scaled(0.5)) as dev:
            assert dev.read("threshold", 3).values == (509, 2, 77)
            assert dev.read("generation").values == (1 + GENERATION_RESERVE,)  # the ceiling
            assert dev.read("self_clean").values == (0,)
    finally:
        second.stop()



# ---- FILE_INFO and the file-name rules ------------------------------------------------------------

#: idl_name_verdict_t, in NameRefusal's order of checks
NAME_CODES = {None: 0, NameRefusal.EMPTY: 1, NameRefusal.TOO_LONG: 2, NameRefusal.NOT_UTF8: 3,
              NameRefusal.CONTROL_CHAR: 4, NameRefusal.ABSOLUTE: 5, NameRefusal.DRIVE_LETTER: 6,
              NameRefusal.PATH_SEPARATOR: 7, NameRefusal.DOT_DOT: 8, NameRefusal.FORMAT_CHAR: 9,
              NameRefusal.RESERVED_DEVICE: 10, NameRefusal.TRAILING_DOT_SPACE: 11}


def _python_name_code(raw: bytes, limit: int) -> int:
    checked = check_name(raw, limit)
    return NAME_CODES[checked if isinstance(checked, NameRefusal) else None]


def _random_name(rng: random.Random) -> bytes:
    pieces = ["a", "b.txt", ".", "..", " ", ":", "/", "\\", "C:", "con", "Com1", "lpt\u00b9",
              "nul.tar.gz", "AUX  ", "\u200b", "\u202e", "\ufeff", "\u00ad", "\x7f", "\x85",
              "\x00", "\n", "\u00e9", "\U0001f600", "\U000e0041", ".ymodem-", ".part"]
    pieces += ["LPT9", "com0", "prn", "comx", "Com\u00b2.log"]
    text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 5)))
    raw = text.encode("utf-8")
    r = rng.random()
    if r < 0.15:  # invalid UTF-8: stray continuation, overlong, surrogate, past U+10FFFF, cut
        raw += rng.choice([b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                           b"\xe2\x82", b"\xff"])
    elif r < 0.2:
        raw = rng.randbytes(rng.randrange(1, 12))
    elif r < 0.25:
        raw = b"x" * rng.choice([250, 251, 252, 255, 256])
    return raw


def test_c_name_rules_like_python(clib: ctypes.CDLL) -> None:
    rng = random.Random(11)
    for _ in range(20000):
        raw = _random_name(rng)
        for limit in (251, 255):
            assert clib.idl_shim_check_name(raw, len(raw), limit) == _python_name_code(raw, limit), \
                (raw, limit)


def test_c_format_characters_are_pythons(clib: ctypes.CDLL) -> None:
    """Every BMP code point and the supplementary ones near a Cf range, between two letters:
    the C table is the running Python's unicodedata (regenerate it if this fails)."""
    cps = list(range(0x20, 0xD800)) + list(range(0xE000, 0x10000))
    cps += [c + d for c in (0x110BD, 0x110CD, 0x13430, 0x13438, 0x13439, 0x1343F, 0x1BCA0, 0x1BCA3,
                            0x1D173, 0x1D17A, 0xE0001, 0xE0020, 0xE007F) for d in (-1, 0, 1)]
    for cp in cps:
        raw = ("a" + chr(cp) + "b").encode("utf-8")
        assert clib.idl_shim_check_name(raw, len(raw), 255) == _python_name_code(raw, 255), hex(cp)


def test_c_file_info_like_the_simulator(clib: ctypes.CDLL, tmp_path: Path) -> None:
    sim = SimulatedDevice(seed=1, flash_dir=tmp_path)
    files = sim.files_dir
    (files / "a.txt").write_bytes(b"hello, device\n" * 300)
    (files / "empty").write_bytes(b"")
    (files / ".hidden").write_bytes(b"x")
    (files / ".ymodem-1234.part").write_bytes(b"half")
    (files / "sub").mkdir()
    (files / "link").symlink_to(files / "a.txt")
    os.mkfifo(files / "fifo")
    out = ctypes.create_string_buffer(64)
    names = [b"a.txt", b"empty", b".hidden", b".ymodem-1234.part", b"sub", b"link", b"fifo",
             b"missing", b"", b"..", b"a/b", b"con.txt", "\u00e9t\u00e9".encode(), b"x" * 251,
             b"x" * 252]
    pdus = [bytes([0x45, len(n) & 0xFF]) + n for n in names]
    pdus += [b"\x45", b"\x45\x05ab", b"\x45\x01ab", b"\x45\x00"]
    for pdu in pdus:
        n = clib.idl_shim_file_info(str(files).encode(), pdu, len(pdu), out)
        assert out.raw[:n] == sim._file_info(pdu), pdu


def test_file_info_on_the_posix_device(device_bin: Path, tmp_path: Path) -> None:
    files = tmp_path / "flash" / "files"
    files.mkdir(parents=True)
    data = bytes(range(256)) * 41
    (files / "firmware.bin").write_bytes(data)
    dev = RunningDevice(device_bin, tmp_path / "flash")
    with Device.open(dev.path) as host:
        present = host.file_info("firmware.bin")
        assert present.ok and present.file == FileInfoResponse(FileInfoStatus.PRESENT, len(data),
                                                               crc32c(data))
        absent = host.file_info("nothing.txt")
        assert absent.ok and absent.file == FileInfoResponse(FileInfoStatus.ABSENT, 0, 0)
        assert host.write({"mode": 0}).ok  # registers still answer between file questions
    dev.stop()


def test_hostile_or_foreign_flash_is_refused_untouched(device_bin: Path, tmp_path: Path) -> None:
    """As the Python simulator: a symlink or FIFO in the flash directory is refused, never followed
    or read; a directory saved with another map is refused; nothing is written either way."""
    target = tmp_path / "elsewhere.json"
    target.write_text('{"generation": 0, "holdings": [[4, 350], [5, 1], [6, 50]]}')
    cases = {"config.json": lambda p: p.symlink_to(target), "device_id": os.mkfifo,
             "map": lambda p: p.write_text("pump-controller e2da3a9fc375ac4d\n")}
    for name, make in cases.items():
        flash = tmp_path / f"flash-{name}"
        flash.mkdir()
        make(flash / name)
        before = sorted(p.name for p in flash.iterdir())
        proc = subprocess.run([str(device_bin), "--flash-dir", str(flash)], capture_output=True,
                              text=True, timeout=5, check=False)
        assert proc.returncode == 1 and proc.stdout == "", name
        assert len(proc.stderr.splitlines()) == 1, name
        assert "refused" in proc.stderr or "use another flash directory" in proc.stderr, name
        assert sorted(p.name for p in flash.iterdir()) == before, name


def test_a_flash_dir_of_another_map_is_refused_by_its_map_name(device_bin: Path,
                                                                tmp_path: Path) -> None:
    """A directory the pump controller's build saved (its `map` record and a configuration of its
    registers) is refused naming the map it holds, before its configuration is read (the
    configuration's check would only say "other registers"); nothing is written."""
    flash = tmp_path / "pump-flash"
    flash.mkdir()
    (flash / "map").write_text("pump-controller e2da3a9fc375ac4d\n")
    (flash / "config.json").write_text('{"generation": 3, "holdings": [[256, 7], [300, 2]]}')
    before = {p.name: p.read_bytes() for p in flash.iterdir()}
    proc = subprocess.run([str(device_bin), "--flash-dir", str(flash)], capture_output=True,
                          text=True, timeout=5, check=False)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "register map pump-controller" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in flash.iterdir()} == before


def test_a_seeded_device_draws_new_epochs_on_every_start(device_bin: Path, tmp_path: Path) -> None:
    epochs = []
    for boot in (1, 2, 3):
        dev = RunningDevice(device_bin, tmp_path / "flash", "--seed", "7")
        with Device.open(dev.path) as host:
            epochs.append(host.session.epoch)
        dev.stop()
        assert (tmp_path / "flash" / "boots").read_text().strip() == str(boot)
        assert (tmp_path / "flash" / "map").read_text().split() == [
            DEFAULT_MAP.name, DEFAULT_MAP.hash.hex()]
    assert len(set(epochs)) == 3
