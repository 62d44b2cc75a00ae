"""The gateway process: the store, the ports and the HTTP server on one event loop.

``serve(config, ready)`` opens the store (one gateway per store), opens the ports and settles what
a stopped gateway left (``Gateway.start``), *then* listens and calls ``ready(url)`` with the
address actually bound (port 0 picks one) — and, with ``modbus_tcp``, ``modbus_ready(HOST:PORT)``
for the Modbus TCP face (``idemlink.gateway.modbus_tcp``), already listening by then: a caller
that saw the readiness line talks to a gateway that has already retransmitted every call it had
in flight. The watcher (register values, bus load) and, with ``mqtt``, the MQTT bridge start
before the readiness line; the bridge connects in the background (a broker that is down delays
nothing). SIGINT/SIGTERM stop it: the Modbus face stops listening, the HTTP server stops, the
bridge says offline, the watcher stops, then the ports close.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from idemlink.gateway import page
from idemlink.gateway.app import make_app
from idemlink.gateway.modbus_tcp import ModbusFace, default_units
from idemlink.gateway.service import Gateway, PortSpec
from idemlink.gateway.store import CallStore, StoreLimits
from idemlink.gateway.watch import Watcher

if TYPE_CHECKING:
    from idemlink.gateway.mqtt_bridge import Bridge, MqttConfig


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    ports: list[PortSpec]
    tokens: dict[str, str]
    store: str
    host: str = "127.0.0.1"
    port: int = 8080
    roles: dict[str, str] = field(default_factory=dict)  #: caller -> role (DEFAULT_ROLE else)
    limits: StoreLimits = field(default_factory=StoreLimits)  #: the store's bounds
    #: the Modbus TCP face (``idemlink.gateway.modbus_tcp``): where it listens (None: off),
    #: unit -> port (None: ``default_units``), whether writes are refused
    modbus_tcp: tuple[str, int] | None = None
    modbus_units: dict[int, str] | None = None
    modbus_read_only: bool = False
    watch: float = 2.0  #: seconds between looks at the registers (0: none; the page, MQTT values)
    mqtt: MqttConfig | None = None  #: the MQTT bridge (docs/GATEWAY.md, "The fleet")


async def serve(config: GatewayConfig, ready: Callable[[str], None],
                stop: asyncio.Event | None = None,
                modbus_ready: Callable[[str], None] | None = None) -> None:
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    store = CallStore.open(config.store, config.limits)
    gateway = Gateway(store, config.ports)
    runner: web.AppRunner | None = None
    modbus: asyncio.Server | None = None
    watcher = Watcher(gateway, config.watch)
    bridge: Bridge | None = None
    try:
        await gateway.start()
        if config.modbus_tcp is not None:
            face = ModbusFace(gateway, config.modbus_units
                              or default_units([p.name for p in config.ports]),
                              read_only=config.modbus_read_only)
            modbus = await asyncio.start_server(face.serve, *config.modbus_tcp)
        watcher.start()
        if config.mqtt is not None:
            from idemlink.gateway.mqtt_bridge import Bridge

            bridge = Bridge(gateway, watcher, config.mqtt, set(config.tokens.values()),
                            config.roles)
            bridge.start()
        runner = web.AppRunner(make_app(gateway, config.tokens, config.roles,
                                        page.routes(watcher), page.public), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        ready(f"http://{host}:{port}")
        if modbus is not None and modbus_ready is not None:
            m_host, m_port = modbus.sockets[0].getsockname()[:2]
            modbus_ready(f"{m_host}:{m_port}")
        await stop.wait()
    finally:
        if modbus is not None:
            modbus.close()
        if runner is not None:
            await runner.cleanup()
        if bridge is not None:
            await bridge.close()
        await watcher.close()
        await gateway.close()
        store.close()


__all__ = ["GatewayConfig", "serve"]
