"""idemlink: a serial protocol stack whose one promise is: retries are harmless.

One top-level import name. The layers live in sub-packages, each in its own source directory:

- ``idemlink.protocol`` (``protocol/``): the sans-I/O core, bytes in, events out, time passed in;
- ``idemlink.host`` (``host/``): the driver over pyserial, blocking and asyncio, the journal;
- ``idemlink.device_sim`` (``device_sim/``): the simulated device and the link emulator;
- ``idemlink`` itself (``idemlink/``): the application layer that joins them, the CLI, the soak
  campaign and its oracle, and the pytest plugin.
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``__version__``, looked up when first asked for: importing the package stays instant (the
    console script's Ctrl-C guard, ``idemlink.console``, starts after it)."""
    if name != "__version__":
        raise AttributeError(f"module 'idemlink' has no attribute {name!r}")
    from importlib import metadata

    try:
        return metadata.version("idemlink")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
        return "0+unknown"
