"""A Modbus RTU bus with several slaves on one pty: what two slaves with one unit id do to a
master. ``bus_on_pty(servers, clash=...)`` serves every ``RtuServer`` of ``servers`` on one pty in
a thread, each fed every byte the master writes (an RS-485 bus); when more than one answers the
same request, ``clash`` says what the line carries: ``"both"`` one answer after the other (two
slaves whose answers do not overlap), ``"collide"`` overlaid, each a byte later than the one
before (a wired-AND of two drivers out of step: CRC-bad bytes); ``echo``: the master hears its
own bytes back first, as through an adapter that does not suppress its echo. Yields the path to
open."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from idemlink.device_sim.pty import open_pty
from idemlink.device_sim.rtu_server import RtuServer


@contextmanager
def bus_on_pty(servers: Sequence[RtuServer], clash: str = "both",
               echo: bool = False) -> Iterator[str]:
    pair = open_pty()
    transport = pair.transport()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            data = transport.read(0.005)
            if echo and data:  # an RS-485 adapter that echoes the master's bytes
                transport.write(data)
            now = time.monotonic()
            for s in servers:
                if data:
                    s.receive_data(data, now)
                else:
                    s.tick(now)
            replies = [r for r in (s.data_to_send() for s in servers) if r]
            if not replies:
                continue
            if len(replies) > 1 and clash == "collide":  # each a byte later than the one before
                out = bytearray(b"\xff" * max(len(r) + k for k, r in enumerate(replies)))
                for k, r in enumerate(replies):
                    for i, byte in enumerate(r):
                        out[i + k] &= byte
                transport.write(bytes(out))
            else:
                transport.write(b"".join(replies))

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        yield pair.slave_path
    finally:
        stop.set()
        th.join(5)
        pair.close()
