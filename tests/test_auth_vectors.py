"""The C device core's authenticated frames (issue 23, docs/SECURITY.md): keyed BLAKE2s (the only
kind the device has) against the BLAKE2 reference's known answers and ``hashlib.blake2s`` over
random keys and inputs cut into pieces, the key id,
and the keyed golden streams of ``tests/vectors/auth_session.json`` (the Python reference's
answers: handshake, signed answers, refusals of forged, reflected, stripped and long tags, key
rotation, a rebooted device) answered byte for byte through ctypes; ``make check``'s ``-auth``
variants run the same streams natively.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
from support import firmware

from idemlink.protocol.auth import key_id

VECTORS = Path(__file__).parent / "vectors" / "auth_session.json"
#: the C core's IDL_DISP_* (built with the bus, as the library is) of the counters compared
DISP = {"executed": 0, "replayed": 1, "epoch_mismatch": 5, "hello": 6, "unexpected_frames": 7,
        "decode_errors": 8, "unauthenticated": 13}
BAD_MAC = 9  #: IDL_DECODE_BAD_MAC, the decoder's counter


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "gen_auth_session", Path(__file__).parent / "vectors" / "gen_auth_session.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_auth_session"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_vectors_are_the_python_reference_now() -> None:
    assert VECTORS.read_text(encoding="utf-8") == _generator().render(), \
        "run python3 tests/vectors/gen_auth_session.py"


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    return firmware.shim_library()


def _blake2s(lib: ctypes.CDLL, data: bytes, key: bytes, size: int,
             cuts: tuple[int, int]) -> bytes:
    out = ctypes.create_string_buffer(32)
    assert lib.idl_shim_blake2s(out, size, key, data, len(data), *cuts) == 1, \
        "built without IDL_AUTH"
    return out.raw[:size]


def test_blake2s_is_the_references_and_hashlibs_keyed_over_random_pieces(
        lib: ctypes.CDLL) -> None:
    # blake2s-kat.txt of the BLAKE2 reference: key 00..1f, message 00 01 .. 3f
    assert _blake2s(lib, bytes(range(64)), bytes(range(32)), 32, (1, 40)).hex() == (
        "8975b0577fd35566d750b362b0897a26c399136df07bababbde6203ff2954ed4")
    rng = random.Random(23)
    for n in (0, 1, 55, 63, 64, 65, 127, 128, 129, 300, 600):
        data = rng.randbytes(n)
        key = rng.randbytes(32)
        cuts = tuple(sorted((rng.randint(0, n), rng.randint(0, n))))
        for size in (4, 8, 16, 32):
            assert _blake2s(lib, data, key, size, cuts) == hashlib.blake2s(
                data, key=key, digest_size=size).digest(), (n, size, cuts)


def test_the_key_id_is_the_python_ones(lib: ctypes.CDLL) -> None:
    for seed in range(4):
        key = random.Random(seed).randbytes(32)
        assert lib.idl_shim_key_id(key) == key_id(key)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_c_core_answers_the_keyed_streams_byte_for_byte(lib: ctypes.CDLL,
                                                            index: int) -> None:
    stream = json.loads(VECTORS.read_text(encoding="utf-8"))["streams"][index]
    keys = b"".join(bytes.fromhex(k) for k in stream["keys"])
    tape = bytes.fromhex(stream["tape"])
    buf = ctypes.create_string_buffer(lib.idl_shim_sizeof())
    out = ctypes.create_string_buffer(4096)
    assert lib.idl_shim_auth_keys(keys, len(stream["keys"])) == 1, "built without IDL_AUTH"
    lib.idl_shim_auth_tape(tape, len(tape))
    try:
        lib.idl_shim_init(buf, stream["epoch"], 2000, stream["device_id"].encode(), 0)
        for step in stream["steps"]:
            wire = bytes.fromhex(step["in"])
            n = lib.idl_shim_feed(buf, wire, len(wire), 0, out, len(out))
            assert out.raw[:n].hex() == step["out"], step["name"]
        got = {k: lib.idl_shim_counter(buf, DISP[k]) for k in DISP}
        got["bad_mac"] = lib.idl_shim_decoder_counter(buf, BAD_MAC)
        assert got == stream["counters"]
    finally:
        lib.idl_shim_auth_keys(b"", 0)  # the library's other users get unkeyed devices
