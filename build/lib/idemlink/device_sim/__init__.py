"""idemlink's simulated device and link emulator (thin I/O shells around ``protocol``)."""

from idemlink.device_sim.urlhandler import register as _register_url_handlers

_register_url_handlers()  # pyserial then opens faulty://<inner-url>?loss=...
