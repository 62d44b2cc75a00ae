"""docs/GATEWAY.md is executed: every ``<!-- sh -->`` block runs in bash against a real gateway in
front of the simulator (``$GW``, ``$TOKEN``), its output matched by the ``<!-- output -->`` block
after it (each line in order, ``...`` any text); every ``<!-- python -->`` block runs with
``GW`` and ``TOKEN`` defined, and a value announced in a ``# comment`` after a ``print`` must be
printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_runner import line_matches
from support.gateway import TOKEN, running_gateway, served_sim
from support.timing import scaled

DOC = Path(__file__).resolve().parent.parent / "docs" / "GATEWAY.md"
BLOCK = re.compile(r"<!-- (?P<mark>sh|output|python) -->\n```\w*\n(?P<body>.*?)```", re.S)


def _blocks() -> list[tuple[str, str]]:
    return [(m["mark"], m["body"]) for m in BLOCK.finditer(DOC.read_text("utf-8"))]


def test_the_doc_has_examples() -> None:
    marks = [m for m, _ in _blocks()]
    assert marks.count("sh") >= 3 and marks.count("python") >= 1
    assert marks.count("output") == marks.count("sh")


def _expect(expected: str, out: str) -> None:
    lines = out.splitlines()
    i = 0
    for want in expected.strip().splitlines():
        while i < len(lines) and not line_matches(want, lines[i]):
            i += 1
        assert i < len(lines), f"{want!r} not found in order in:\n{out}"
        i += 1


def test_the_examples_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    blocks = _blocks()
    bindir = tmp_path / "bin"  # `python3` in the examples is this Python
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    with served_sim(tmp_path) as sim, running_gateway(tmp_path, [f"{sim.link}=oven"]) as gw:
        env = {**os.environ, "GW": gw.url, "TOKEN": TOKEN,
               "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
        for n, (mark, body) in enumerate(blocks):
            if mark == "sh":
                r = subprocess.run(["bash", "-euo", "pipefail", "-c", body], env=env,
                                   capture_output=True, text=True, timeout=scaled(60))
                assert r.returncode == 0, r.stderr
                assert blocks[n + 1][0] == "output"
                _expect(blocks[n + 1][1], r.stdout)
            elif mark == "python":
                exec(compile(body, str(DOC), "exec"), {"GW": gw.url, "TOKEN": TOKEN})
                out = capsys.readouterr().out
                for line in body.splitlines():
                    if "print(" in line and "# " in line:
                        want = line.split("# ", 1)[1].split(":")[0].strip()
                        assert want in out, f"{want!r} not in {out!r}"
