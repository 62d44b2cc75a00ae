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

- ``idemlink_plain_slave`` — a *plain* third-party Modbus RTU slave from the map (the marker's,
  else ``idemlink_plain_slave_factory(regmap=..., unit=1, command_seconds=5.0)``) on a pty:
  no idemlink functions (0x41/0x42 answer exception 01), COMMAND registers that return to 0,
  fault words as declared. ``.path``, ``.open() -> RtuDevice``; faults a test controls:
  ``.drop_answer()``, ``.answer_late(seconds)``, ``.echo_differs()``, ``.mute()``/``.unmute()``,
  ``.wrong_unit()``, ``.clear_faults()``; ground truth: ``.executed`` (every request executed,
  with time, answer, fault and effects), ``.starts(name)``, ``.writes(name)``, ``.value(name)``;
  the world: ``.set_input``, ``.set_condition``, ``.finish(name)`` (a running command ends).
  docs/MODBUS_RTU.md, "Test your application against your device's map".

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
    from idemlink.device_sim.plain_slave import Executed, PlainRtuServer
    from idemlink.device_sim.serve import LockedDevice
    from idemlink.device_sim.simlink import SimTransport
    from idemlink.host.device import Device
    from idemlink.host.rtu_device import RtuDevice
    from idemlink.protocol.device_core import DeviceCore, Effect
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
    shutdown = _serve_in_thread(lambda stop: serve(shared, transport, stop),  # type: ignore[arg-type]
                                pair.close)
    return PtySim(pair.slave_path, sim, shared, shutdown)


def _serve_in_thread(serve: Callable[[threading.Event], object],
                     close: Callable[[], None]) -> Callable[[], None]:
    """Run ``serve(stop)`` in a daemon thread; the returned call stops it, then ``close()``s."""
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(stop,), daemon=True)
    thread.start()

    def shutdown() -> None:
        stop.set()
        thread.join(timeout=5)
        close()

    return shutdown


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


# --------------------------------------------------------------------- a plain Modbus RTU slave


@dataclass(slots=True)
class PlainSlave:
    """A plain third-party Modbus RTU slave on a pty (``path``), served by a background thread;
    ``server`` is the ``idemlink.device_sim.plain_slave.PlainRtuServer``. Every hook takes the
    server's lock."""

    path: str
    server: PlainRtuServer
    _stop: Callable[[], None]
    opened: list[RtuDevice] = field(default_factory=list)

    @property
    def core(self) -> DeviceCore:
        return self.server.core

    @property
    def regmap(self) -> RegisterMap:
        return self.server.core.regmap

    @property
    def unit(self) -> int:
        return self.server.unit

    def open(self, *, timeout: float = 0.2, attempts: int = 5, unit: int | None = None,
             ) -> RtuDevice:
        """``RtuDevice.open`` on this pty with the slave's map (closed at teardown)."""
        with loading("the RTU driver"):
            from idemlink.host.rtu_device import RtuDevice

        dev = RtuDevice.open(self.path, unit=self.unit if unit is None else unit,
                             regmap=self.regmap, timeout=timeout, attempts=attempts)
        self.opened.append(dev)
        return dev

    # faults
    def _inject(self, name: str, **options: object) -> None:
        from idemlink.device_sim.plain_slave import PlainFault

        self.server.inject(PlainFault[name], **options)  # type: ignore[arg-type]

    def drop_answer(self, times: int | None = 1, *, writes_only: bool = True) -> None:
        """The next ``times`` writes (``writes_only=False``: requests) execute; no answer."""
        self._inject("DROP_ANSWER", times=times, writes_only=writes_only)

    def answer_late(self, seconds: float, times: int | None = 1, *,
                    writes_only: bool = True) -> None:
        """The next ``times`` writes execute and are answered ``seconds`` late."""
        self._inject("LATE", times=times, writes_only=writes_only, delay=seconds)

    def echo_differs(self, times: int | None = 1, *, echo: int | None = None) -> None:
        """The next ``times`` writes execute and are echoed with another last word."""
        self._inject("ECHO_DIFFERS", times=times, echo=echo)

    def mute(self) -> None:
        """Hear nothing from now on (nothing executed, nothing answered) until ``unmute``."""
        self._inject("MUTE", times=None)

    def unmute(self) -> None:
        from idemlink.device_sim.plain_slave import PlainFault

        self.server.clear_faults(PlainFault.MUTE)

    def wrong_unit(self, times: int | None = None, *, unit: int | None = None) -> None:
        """Execute, but answer as another unit id (``times`` requests; None: until cleared)."""
        self._inject("WRONG_UNIT", times=times, unit=unit)

    def clear_faults(self) -> None:
        self.server.clear_faults()

    # ground truth
    @property
    def executed(self) -> list[Executed]:
        """Every request the slave executed, in order (a copy)."""
        with self.server.lock:
            return list(self.server.executed)

    def effects(self, register: str | None = None) -> list[Effect]:
        with self.server.lock:
            return [e for e in self.server.core.log
                    if register is None or e.register == register]

    def starts(self, name: str) -> int:
        """How many times the action of trigger or command register ``name`` started."""
        from idemlink.protocol.device_core import EffectKind

        with self.server.lock:
            return self.server.core.count(EffectKind.TRIGGER_STARTED, name)

    def writes(self, name: str) -> list[Executed]:
        """The executed requests that wrote register (or coil) ``name``."""
        from idemlink.device_sim.plain_slave import WRITE_FUNCTIONS

        spec = self.regmap.named(name)
        return [e for e in self.executed if e.function in WRITE_FUNCTIONS
                and e.address is not None and e.exception is None
                and spec.address <= e.address < spec.address + spec.words]

    def value(self, name: str) -> int:
        with self.server.lock:
            return self.server.core.value(name)

    # the world
    def _now(self) -> float:
        import time

        return time.monotonic()

    def set_input(self, name: str, raw: int) -> None:
        with self.server.lock:
            self.server.core.set_input(name, raw, self._now())

    def set_condition(self, bit: str, active: bool) -> None:
        with self.server.lock:
            self.server.core.set_condition(bit, active, self._now())

    def finish(self, name: str) -> None:
        """The running command of COMMAND register ``name`` is done now (it reads 0)."""
        with self.server.lock:
            self.server.core.finish_command(name, self._now())

    def close(self) -> None:
        for dev in self.opened:
            dev.close()
        self._stop()


def start_plain_slave(regmap: RegisterMap | str | None = None, *, unit: int = 1,
                      command_seconds: float = 5.0) -> PlainSlave:
    """Serve a plain Modbus RTU slave of ``regmap`` on a new pty; ``close()`` it."""
    with loading("the plain Modbus RTU simulator"):
        import time

        from idemlink.device_sim.plain_slave import PlainRtuServer
        from idemlink.device_sim.pty import open_pty
        from idemlink.protocol.device_core import DeviceCore
        from idemlink.protocol.registers import RegisterMap
        from idemlink.protocol.regmap_file import resolve_regmap

    rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
    core = DeviceCore(rm, trigger_duration=command_seconds, now=time.monotonic())
    server = PlainRtuServer(core, unit=unit)
    pair = open_pty()
    transport = pair.transport()
    shutdown = _serve_in_thread(lambda stop: server.serve(transport, stop), pair.close)
    return PlainSlave(pair.slave_path, server, shutdown)


@pytest.fixture
def idemlink_plain_slave_factory(
        request: pytest.FixtureRequest) -> Iterator[Callable[..., PlainSlave]]:
    """Start plain Modbus RTU slaves (``factory(regmap=..., unit=1, command_seconds=5.0)``; the
    map defaults to the ``idemlink_regmap`` marker's); all are stopped at teardown."""
    started: list[PlainSlave] = []
    marked = _marked_map(request)

    def factory(regmap: RegisterMap | str | None = None, *, unit: int = 1,
                command_seconds: float = 5.0) -> PlainSlave:
        s = start_plain_slave(regmap if regmap is not None else marked, unit=unit,
                              command_seconds=command_seconds)
        started.append(s)
        return s

    yield factory
    for s in started:
        s.close()


@pytest.fixture
def idemlink_plain_slave(idemlink_plain_slave_factory: Callable[..., PlainSlave]) -> PlainSlave:
    """A plain Modbus RTU slave of the marker's map on a pty, stopped at teardown."""
    return idemlink_plain_slave_factory()
