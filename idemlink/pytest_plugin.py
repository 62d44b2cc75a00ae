"""pytest plugin (entry point ``pytest11``): a ready simulated idemlink device for any test suite.

Installed with idemlink, so any project's tests can ask for:

- ``idemlink_sim`` — an in-process device on a simulated clock (fast, deterministic): ``.device``
  (the ``SimulatedDevice``: register core, ``executions`` ground truth, ``core.log`` effects),
  ``.regmap``, ``.connect() -> host.device.Device``, ``.reboot()``, ``.set_link(LinkConfig)``
  (a lossy line from now on).
- ``idemlink_sim_pty`` — the same device served on a pseudo-terminal by a background thread:
  ``.path`` (open it with any serial tool or ``Device.open(path)``), ``.device``, ``.reboot()``,
  ``.open() -> Device``. A lossy line is set with ``idemlink_pty_factory(link=LinkConfig(...))``.
- Your device's register map instead of the built-in thermal controller: mark the test
  ``@pytest.mark.idemlink_regmap("path/to/map.toml")`` (a map file or a built-in map's name), or
  build devices yourself with ``idemlink_sim_factory(regmap=..., seed=...)`` and
  ``idemlink_pty_factory(regmap=...)``. ``connect()``/``open()`` use the device's map. A marker
  without a map, or whose map does not load, fails the test with that one line (no traceback).

Example::

    def test_threshold(idemlink_sim):
        dev = idemlink_sim.connect()
        assert dev.write({"threshold": 420}).ok
        assert idemlink_sim.device.core.value("threshold") == 420

Loading the plugin costs nothing and cannot fail on idemlink's account: the module imports only
the standard library and pytest, and the simulator is imported when a fixture is first used. An
import that fails then raises ``PluginLoadError``, whose message starts with "idemlink pytest
plugin:" and says how to switch the plugin off (``pytest -p no:idemlink``): a project that has
idemlink installed but does not use it is never broken by it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from idemlink.device_sim.device import SimulatedDevice
    from idemlink.device_sim.link import LinkConfig
    from idemlink.device_sim.serve import LockedDevice
    from idemlink.device_sim.simlink import SimTransport
    from idemlink.host.device import Device
    from idemlink.protocol.registers import RegisterMap

DISABLE_HINT = "disable with -p no:idemlink"


class PluginLoadError(ImportError):
    """idemlink's simulator could not be imported for a fixture of this plugin."""


@contextmanager
def loading(what: str) -> Iterator[None]:
    """Re-raise an ImportError inside as a ``PluginLoadError`` that names idemlink and the way to
    disable the plugin."""
    try:
        yield
    except ImportError as exc:
        raise PluginLoadError(
            f"idemlink pytest plugin: cannot import {what}: {exc} ({DISABLE_HINT})") from exc


@dataclass(slots=True)
class InProcessSim:
    """An in-process simulated device and its simulated line."""

    transport: SimTransport

    @property
    def device(self) -> SimulatedDevice:
        return self.transport.device

    @property
    def regmap(self) -> RegisterMap:
        return self.transport.device.core.regmap

    def connect(self, *, timeout: float = 0.2, attempts: int = 5, max_inflight: int = 8) -> Device:
        """A connected ``idemlink.host.device.Device`` on this simulated line."""
        with loading("the host driver"):
            from idemlink.host.device import Device

        dev = Device(self.transport, timeout=timeout, attempts=attempts,
                     max_inflight=max_inflight, regmap=self.regmap)
        dev.connect()
        return dev

    def reboot(self) -> None:
        self.transport.reboot()

    def set_link(self, link: LinkConfig | None, link_back: LinkConfig | None = None) -> None:
        self.transport.set_link(link, link_back)


@dataclass(slots=True)
class PtySim:
    """A simulated device served on a pseudo-terminal (``path``) by a background thread."""

    path: str
    device: SimulatedDevice
    _shared: LockedDevice
    _stop: Callable[[], None]
    opened: list[Device] = field(default_factory=list)

    def reboot(self) -> None:
        import time

        with self._shared.lock:
            self.device.reboot(time.monotonic())

    def open(self, *, timeout: float = 0.2, attempts: int = 5, max_inflight: int = 8) -> Device:
        """``idemlink.host.device.Device.open`` on this pty (closed at teardown)."""
        with loading("the host driver"):
            from idemlink.host.device import Device

        dev = Device.open(self.path, timeout=timeout, attempts=attempts,
                          max_inflight=max_inflight, regmap=self.device.core.regmap)
        self.opened.append(dev)
        return dev

    def close(self) -> None:
        for dev in self.opened:
            dev.close()
        self._stop()


def start_pty_sim(device: SimulatedDevice | None = None, link: LinkConfig | None = None) -> PtySim:
    """Serve a device on a new pty (optionally behind a lossy real-time line); ``close()`` it."""
    with loading("the simulator"):
        from idemlink.device_sim.device import SimulatedDevice
        from idemlink.device_sim.link import Link
        from idemlink.device_sim.lossy_transport import LossyTransport
        from idemlink.device_sim.pty import open_pty
        from idemlink.device_sim.serve import LockedDevice, serve

    sim = device if device is not None else SimulatedDevice(seed=0)
    shared = LockedDevice(sim)
    pair = open_pty()
    transport: object = pair.transport()
    if link is not None:
        transport = LossyTransport(pair.transport(), Link(link))
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(shared, transport, stop), daemon=True)
    thread.start()

    def shutdown() -> None:
        stop.set()
        thread.join(timeout=5)
        pair.close()

    return PtySim(pair.slave_path, sim, shared, shutdown)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "idemlink_regmap(ref): the register map (file path or built-in name) of the "
        "idemlink_sim / idemlink_sim_pty devices of this test")


def _marked_map(request: pytest.FixtureRequest) -> RegisterMap | None:
    """The map of the ``idemlink_regmap`` marker: a path relative to the test's own file (then to
    the working directory), or a built-in map's name. A map that cannot be loaded fails the test
    with one line naming idemlink, the file and the reason."""
    marker = request.node.get_closest_marker("idemlink_regmap")
    if marker is None:
        return None
    with loading("the register-map loader"):
        from pathlib import Path

        from idemlink.protocol.regmap_file import RegmapFileError, resolve_regmap

    given = marker.args[0] if marker.args else marker.kwargs.get("ref")
    if given is None:
        pytest.fail("idemlink pytest plugin: idemlink_regmap marker without a map: name one, "
                    'e.g. @pytest.mark.idemlink_regmap("pump.toml")', pytrace=False)
    ref = str(given)
    beside = Path(str(request.node.path)).parent / ref
    try:
        return resolve_regmap(str(beside) if beside.is_file() else ref)
    except RegmapFileError as exc:
        pytest.fail(f"idemlink pytest plugin: idemlink_regmap({ref!r}): {exc} (a path is taken "
                    "relative to the test file, then to the working directory)", pytrace=False)


def _device(regmap: RegisterMap | str | None, **options: object) -> SimulatedDevice:
    with loading("the simulator"):
        from idemlink.device_sim.device import SimulatedDevice
        from idemlink.protocol.registers import RegisterMap
        from idemlink.protocol.regmap_file import resolve_regmap

    rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
    options.setdefault("seed", 0)
    return SimulatedDevice(regmap=rm, **options)  # type: ignore[arg-type]


@pytest.fixture
def idemlink_sim_factory() -> Callable[..., InProcessSim]:
    """Build in-process simulated devices: ``factory(regmap=None|RegisterMap|path|name,
    seed=0, **SimulatedDevice options)``."""

    def factory(regmap: RegisterMap | str | None = None, **options: object) -> InProcessSim:
        return InProcessSim(_sim_transport(_device(regmap, **options)))

    return factory


@pytest.fixture
def idemlink_sim(request: pytest.FixtureRequest) -> InProcessSim:
    """An in-process simulated device on a simulated clock (see the module docstring)."""
    return InProcessSim(_sim_transport(_device(_marked_map(request))))


def _sim_transport(device: SimulatedDevice) -> SimTransport:
    with loading("the simulator"):
        from idemlink.device_sim.simlink import SimTransport
    return SimTransport(device)


@pytest.fixture
def idemlink_pty_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., PtySim]]:
    """Start pty-served devices (``factory(link=LinkConfig(...), device=..., regmap=...)``); all
    are stopped at teardown."""
    started: list[PtySim] = []
    marked = _marked_map(request)

    def factory(link: LinkConfig | None = None, device: SimulatedDevice | None = None,
                regmap: RegisterMap | str | None = None) -> PtySim:
        if device is None:
            device = _device(regmap if regmap is not None else marked)
        s = start_pty_sim(device, link)
        started.append(s)
        return s

    yield factory
    for s in started:
        s.close()


@pytest.fixture
def idemlink_sim_pty(idemlink_pty_factory: Callable[..., PtySim]) -> PtySim:
    """A simulated device on a pseudo-terminal, stopped at teardown."""
    return idemlink_pty_factory()
