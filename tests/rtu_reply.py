"""One read's worth of bytes through an ``RtuServer`` (the sans-I/O RTU slave), as the tests of
the RTU face drive it: what the server answers by ``now``; and an ``RtuServer`` serving a pty in
a thread (``rtu_on_pty``), for tests that open a real port."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from idemlink.device_sim.pty import open_pty
from idemlink.device_sim.rtu_server import RtuServer
from idemlink.protocol.device_core import DeviceCore


def rtu_reply(server: RtuServer, data: bytes, now: float) -> bytes:
    """What ``server`` answers by ``now`` to the bytes of one read (b"": the read was empty)."""
    if data:
        server.receive_data(data, now)
    else:
        server.tick(now)
    return server.data_to_send()


@contextmanager
def rtu_on_pty(core: DeviceCore, unit: int = 1) -> Iterator[str]:
    """``core`` as a plain Modbus RTU slave at ``unit`` on a pty: yields the path to open."""
    pair = open_pty()
    server = RtuServer(core, unit=unit)
    stop = threading.Event()
    th = threading.Thread(target=server.serve, args=(pair.transport(), stop), daemon=True)
    th.start()
    try:
        yield pair.slave_path
    finally:
        stop.set()
        th.join(5)
        pair.close()
