"""Session-scoped fixtures over the C builds (loaded by ``tests/conftest.py`` as a plugin).

Each builds once per session (``support.firmware.make_once``); a test that asks for one skips,
naming the tool, when make, a C compiler or the Arm tools are missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from idemlink.protocol.contract import render_map_header
from idemlink.protocol.regmap_file import builtin_map
from support import firmware


@pytest.fixture(scope="session")
def device_bin() -> Path:
    """The posix C device for the built-in map (``make -C firmware_ref device``)."""
    return firmware.device_binary()


@pytest.fixture(scope="session")
def qemu_elf() -> Path:
    """The C device for QEMU's mps2-an385 (``make -C firmware_ref qemu-device``)."""
    return firmware.qemu_device_elf()


@pytest.fixture(scope="session")
def lib_path() -> Path:
    """``libidl_core.so`` for ctypes (``make -C firmware_ref lib``)."""
    return firmware.core_library()


@pytest.fixture(scope="session")
def pump_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The core built for the built-in pump controller (gaps in the addresses, two fault words,
    two triggers, a volatile HOLDING) from the header ``idemlink contract --regmap`` renders:
    ``libidl_core.so`` and ``posix/idemlink-device`` under the returned build directory."""
    firmware.need()
    d = tmp_path_factory.mktemp("pump")
    header = d / "idemlink_regmap.h"
    header.write_text(render_map_header(builtin_map("pump-controller")), encoding="utf-8")
    for target in ("lib", "device"):
        firmware.make(target, f"BUILD={d / 'build'}", f"REGMAP_H={header}")
    return d / "build"
