"""One read's worth of bytes through an ``RtuServer`` (the sans-I/O RTU slave), as the tests of
the RTU face drive it: what the server answers by ``now``."""

from __future__ import annotations

from idemlink.device_sim.rtu_server import RtuServer


def rtu_reply(server: RtuServer, data: bytes, now: float) -> bytes:
    """What ``server`` answers by ``now`` to the bytes of one read (b"": the read was empty)."""
    if data:
        server.receive_data(data, now)
    else:
        server.tick(now)
    return server.data_to_send()
