"""``idemlink send`` to an idemlink device as a user runs it: a file transfer needs no register
map (a device serving any map takes files; ``--regmap`` is accepted like every device command's),
and a batch whose every file is already on the device hands nothing over and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.device_sim.device import SimulatedDevice
from idemlink.protocol.regmap_file import builtin_map
from idemlink.pytest_plugin import start_pty_sim


def _file(tmp: Path) -> Path:
    f = tmp / "fw.bin"
    f.write_bytes(bytes(range(256)) * 4)
    return f


@pytest.mark.parametrize("regmap", [[], ["--regmap", "pump-controller"],
                                    ["--regmap", "thermal-controller"]])
def test_send_goes_to_a_device_serving_another_map(tmp_path: Path, regmap: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    f = _file(tmp_path)
    sim = start_pty_sim(SimulatedDevice(seed=1, regmap=builtin_map("pump-controller"),
                                        flash_dir=tmp_path / "flash"))
    try:
        status = main(["send", "--port", sim.path, "--no-progress", *regmap, str(f)])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        assert "fw.bin: ok" in captured.out
        assert (sim.device.files_dir / "fw.bin").read_bytes() == f.read_bytes()
    finally:
        sim.close()


def test_send_refuses_a_map_file_that_cannot_be_loaded(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    f = _file(tmp_path)
    assert main(["send", "--port", "/dev/null", "--regmap", str(tmp_path / "none.toml"),
                 "--no-progress", str(f)]) == 1
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_batch_already_on_the_device_hands_nothing_over(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    f = _file(tmp_path)
    sim = start_pty_sim(SimulatedDevice(seed=2, flash_dir=tmp_path / "flash"))
    try:
        assert main(["send", "--port", sim.path, "--no-progress", str(f)]) == 0
        assert "sent 1024 bytes" in capsys.readouterr().out
        assert main(["send", "--port", sim.path, "--no-progress", str(f)]) == 0
        assert capsys.readouterr().out.splitlines() == [
            "fw.bin: already on the device, identical (1024 bytes, size and CRC-32C read back): "
            "not sent"]
        assert main(["send", "--port", sim.path, "--no-progress", "--json", str(f)]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["handover"] == "NONE" and doc["bytes"] == 0 and doc["exit"] == 0
        assert [x["identical"] for x in doc["files"]] == [True]
    finally:
        sim.close()
