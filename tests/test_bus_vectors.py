"""The C device core on a bus (issue 22 item 1, docs/BUS.md): the golden streams of
``tests/vectors/bus_session.json`` — addressed requests and answers, other devices' frames,
broadcasts run once, refused or repeated — are the Python reference's answers now, and the C core
built with ``IDL_BUS=1`` answers every step byte for byte with the same counters (through ctypes
here; ``make check``'s ``-bus`` variants run the same streams natively). The posix device keeps its
``--address`` in the flash directory and says so in HELLO_REPLY.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import firmware

from idemlink.host.device import Device
from idemlink.host.errors import NoDevice

VECTORS = Path(__file__).parent / "vectors" / "bus_session.json"
#: the C core's IDL_DISP_* of the counters the streams compare
DISP = {"executed": 0, "replayed": 1, "epoch_mismatch": 5, "hello": 6, "unexpected_frames": 7,
        "decode_errors": 8, "other_address": 9, "broadcast_executed": 10,
        "broadcast_repeated": 11, "broadcast_refused": 12}


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "gen_bus_session", Path(__file__).parent / "vectors" / "gen_bus_session.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_bus_session"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_vectors_are_the_python_reference_now() -> None:
    assert VECTORS.read_text(encoding="utf-8") == _generator().render(), \
        "run python3 tests/vectors/gen_bus_session.py"


def test_the_vectors_cover_every_address_verdict_and_broadcast_rule() -> None:
    table = json.loads(VECTORS.read_text(encoding="utf-8"))
    own = table["streams"][0]["counters"]
    assert all(own[k] > 0 for k in DISP), own  # every counter moves in the addressed stream
    bare = table["streams"][-1]
    assert bare["address"] is None and bare["counters"]["unexpected_frames"] > 0


@pytest.fixture(scope="module")
def bus_lib() -> ctypes.CDLL:
    return firmware.shim_library()


@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_c_core_answers_the_bus_streams_byte_for_byte(bus_lib: ctypes.CDLL,
                                                          index: int) -> None:
    stream = json.loads(VECTORS.read_text(encoding="utf-8"))["streams"][index]
    buf = ctypes.create_string_buffer(bus_lib.idl_shim_sizeof())
    out = ctypes.create_string_buffer(4096)
    bus_lib.idl_shim_init(buf, stream["epoch"], 2000, stream["device_id"].encode(), 0)
    assert bus_lib.idl_shim_bus(buf, stream["address"] or 0) == 1, "built without IDL_BUS"
    for step in stream["steps"]:
        wire = bytes.fromhex(step["in"])
        n = bus_lib.idl_shim_feed(buf, wire, len(wire), 0, out, len(out))
        assert out.raw[:n].hex() == step["out"], step["name"]
    got = {k: bus_lib.idl_shim_counter(buf, DISP[k]) for k in stream["counters"]}
    assert got == stream["counters"]


def test_the_posix_device_keeps_its_address_and_answers_only_it(device_bin: Path,
                                                               tmp_path: Path) -> None:
    dev = firmware.RunningDevice(device_bin, tmp_path, "--address", "9")
    try:
        with Device.open(dev.path, address=9, timeout=0.2) as d:
            d.connect()
            info = d.session.info
            assert info is not None and (info.address, int(info.capabilities or 0)) == (9, 1)
            assert d.write({"mode": 2}).ok
        with pytest.raises(NoDevice), Device.open(dev.path, address=8, timeout=0.05,
                                                  attempts=2) as d:
            d.connect()
    finally:
        stats = dev.stop()
    assert stats["other_address"] >= 2 and stats["executed"] == 1  # address 8's HELLOs
    assert (tmp_path / "address").read_text() == "9\n"
    again = firmware.RunningDevice(device_bin, tmp_path)  # the kept address
    try:
        with Device.open(again.path, address=9, timeout=0.2) as d:
            assert d.read("mode").values == (2,)
    finally:
        again.stop()
    (tmp_path / "address").write_text("248\n")
    proc = subprocess.run([str(device_bin), "--flash-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=10, check=False)
    assert proc.returncode == 1 and "address does not hold a device address" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
