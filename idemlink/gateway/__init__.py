"""The gateway: one process owns the serial ports, callers above it get idempotency keys and
honest outcomes over HTTP (docs/GATEWAY.md). ``calls`` holds the call layer's rules (pure),
``store`` the SQLite call store, ``tokens`` the bearer tokens, ``service`` the ports and calls,
``app`` the HTTP shell (aiohttp), ``openapi`` its description, ``server`` the process; ``watch``
the register values and bus load, ``page`` the page and its event stream, ``mqtt_topics``,
``mqtt_inbox`` and ``mqtt_bridge`` the fleet through an MQTT broker."""
