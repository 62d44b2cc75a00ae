"""docs/API.md is executed: every block marked ``<!-- python -->`` runs against simulated devices
on ptys (``PORT``, ``PORT2``; ``RTU_PORT``: a plain Modbus RTU slave), so the examples stay
true."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.rtu import rtu_on_pty

from idemlink.device_sim.device import SimulatedDevice
from idemlink.protocol.device_core import DeviceCore
from idemlink.pytest_plugin import start_pty_sim

DOC = Path(__file__).resolve().parent.parent / "docs" / "API.md"
BLOCK = re.compile(r"<!-- python -->\n```python\n(?P<body>.*?)```", re.S)
EXAMPLES = [m["body"] for m in BLOCK.finditer(DOC.read_text("utf-8"))]


def test_the_doc_has_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.fixture
def rtu_port() -> Iterator[str]:
    """A plain Modbus RTU slave (the simulator's RTU face, unit 1) on a pty."""
    with rtu_on_pty(DeviceCore(trigger_duration=60.0)) as path:
        yield path


@pytest.mark.parametrize("body", EXAMPLES, ids=[f"block{i}" for i in range(len(EXAMPLES))])
def test_example_runs(body: str, capsys: pytest.CaptureFixture[str], rtu_port: str) -> None:
    sims = [start_pty_sim(SimulatedDevice(seed=i)) for i in range(2)]
    try:
        exec(compile(body, str(DOC), "exec"), {"PORT": sims[0].path, "PORT2": sims[1].path,
                                               "RTU_PORT": rtu_port})
    finally:
        for s in sims:
            s.close()
    out = capsys.readouterr().out
    for line in body.splitlines():  # a printed value announced in a comment must be printed
        if "print(" in line and "# " in line and line.split("# ", 1)[1][:1] in "([0123456789":
            expected = line.split("# ", 1)[1].split(":")[0].strip()
            assert expected in out, f"{expected!r} not in {out!r}"
