"""``monitor`` and ``link --monitor`` in front of a device serving another map than the one they
decode with (``FrameDescriber``): the HELLO reply says so once, and registers are shown by address
from then on, never under the wrong map's names."""

from __future__ import annotations

from typing import Any

from idemlink.campaign import map_text
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.frame_view import FrameDescriber
from idemlink.protocol.frame import FrameDecoder
from idemlink.protocol.regmap_file import DEFAULT_MAP, parse_regmap


def chiller() -> Any:
    text = map_text("thermal-controller").replace('name = "thermal-controller"', 'name = "chiller"')
    return parse_regmap(text.replace('name = "threshold"', 'name = "setpoint"'), source="chiller")


class Tap:
    """The host's transport, every byte each way also fed to a frame decoder."""

    def __init__(self, inner: SimTransport) -> None:
        self.inner = inner
        self.frames: list[Any] = []
        self.out, self.back = FrameDecoder(), FrameDecoder()

    def _take(self, decoder: FrameDecoder, data: bytes) -> None:
        decoder.receive_data(data)
        self.frames.extend(iter(decoder.next_event, None))

    def write(self, data: bytes) -> None:
        self._take(self.out, data)
        self.inner.write(data)

    def read(self, timeout: float) -> bytes:
        data = self.inner.read(timeout)
        self._take(self.back, data)
        return data

    def now(self) -> float:
        return self.inner.now()

    def close(self) -> None:
        self.inner.close()


def _traffic(regmap: Any) -> list[Any]:
    tap = Tap(SimTransport(SimulatedDevice(seed=1, regmap=regmap)))
    dev = Device(tap, regmap=regmap)  # type: ignore[arg-type]
    dev.connect()
    assert dev.write({regmap.at(4).name: 300}).ok
    assert dev.read(4).ok
    dev.connect()  # a second HELLO: the mismatch is not said again
    return tap.frames


def test_a_device_serving_another_map_is_said_once_then_decoded_by_address() -> None:
    cm = chiller()
    assert cm.hash != DEFAULT_MAP.hash and cm.at(4).name == "setpoint"
    d = FrameDescriber(DEFAULT_MAP)
    described = [d.describe(f) for f in _traffic(cm)]
    texts = [x["text"] for x in described]
    notes = [t for t in texts if "not the map decoded with" in t]
    assert len(notes) == 1 and "map=chiller" in notes[0] and "--regmap FILE" in notes[0]
    assert not any("threshold" in t for t in texts), texts
    assert any("@4=300" in t for t in texts), texts
    regs = [r for x in described for r in x.get("registers", [])]
    assert regs and all(r["name"] is None and r["address"] == 4 for r in regs)


def test_the_map_the_device_serves_decodes_with_names() -> None:
    d = FrameDescriber(DEFAULT_MAP)
    texts = [d.describe(f)["text"] for f in _traffic(DEFAULT_MAP)]
    assert not any("not the map decoded with" in t for t in texts)
    assert any("threshold=300" in t for t in texts), texts
