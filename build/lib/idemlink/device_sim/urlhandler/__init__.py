"""pyserial URL handlers of idemlink (``faulty://``).

pyserial finds a handler for ``scheme://`` by importing ``<package>.protocol_<scheme>`` for each
package in ``serial.protocol_handler_packages``; ``register()`` adds this package to that list
(once). After it, ``serial.serial_for_url("faulty://loop://?loss=0.1&seed=1")`` works.
"""

from __future__ import annotations

import serial

PACKAGE = "idemlink.device_sim.urlhandler"


def register() -> None:
    """Make pyserial find idemlink's URL handlers (idempotent)."""
    if PACKAGE not in serial.protocol_handler_packages:
        serial.protocol_handler_packages.append(PACKAGE)
