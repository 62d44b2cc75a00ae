"""docs/YOUR_DEVICE.md is executed, block by block, so every command in it stays true.

Blocks are marked in the Markdown: ``<!-- file: NAME -->`` writes the next code block to NAME,
``<!-- run -->`` runs each ``$ `` line of the next console block (exit 0 required; output lines
printed under a command must appear, ``...`` matching anything), ``<!-- python -->`` runs the
next block with Python. The ``idemlink sim`` block is started as written, in the background,
and its first line becomes ``$PORT``. Ground truth for the effects is the simulator's flash.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "YOUR_DEVICE.md"
BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def blocks() -> list[tuple[str | None, str, str]]:
    return [(m["mark"], m["lang"], m["body"]) for m in BLOCK.finditer(DOC.read_text("utf-8"))]


def argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "idemlink":
        return [sys.executable, "-m", "idemlink", *words[1:]]
    if words[:3] == ["python3", "-m", "pytest"]:
        return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *words[3:]]
    raise AssertionError(f"the doc runs something this test does not know: {command}")


def matches(expected: str, output: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return any(re.fullmatch(pattern, line.rstrip()) for line in output.splitlines())


def run_console(body: str, cwd: Path, env: dict[str, str]) -> None:
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif line.strip():
            steps[-1][1].append(line)
    for command, expected in steps:
        command = command.replace("$PORT", env["PORT"]) if "PORT" in env else command
        r = subprocess.run(argv(command), cwd=cwd, env=env, capture_output=True, text=True,
                           check=False, timeout=120)
        assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
        assert "Traceback" not in r.stderr, r.stderr
        for line in expected:
            assert matches(line, r.stdout), f"{command}: {line!r} not in\n{r.stdout}"


def start_sim(command: str, cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv(command.rstrip("& ")), cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready, "the simulator printed no port"
    return proc, proc.stdout.readline().strip()


def test_every_command_of_your_device_walkthrough(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    sim: subprocess.Popen[str] | None = None
    ran = {"file": 0, "run": 0, "python": 0, "sim": 0}
    try:
        for mark, lang, body in blocks():
            if mark and mark.startswith("file: "):
                (tmp_path / mark[len("file: "):]).write_text(body, encoding="utf-8")
                ran["file"] += 1
            elif mark == "run":
                run_console(body, tmp_path, env)
                ran["run"] += 1
            elif mark == "python":
                r = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=env,
                                   capture_output=True, text=True, check=False, timeout=60)
                assert r.returncode == 0, r.stdout + r.stderr
                ran["python"] += 1
            elif lang == "console" and "idemlink sim" in body:
                command = next(line[2:] for line in body.splitlines()
                               if line.startswith("$ idemlink sim"))
                sim, env["PORT"] = start_sim(command, tmp_path, env)
                ran["sim"] += 1
        assert ran == {"file": 3, "run": 4, "python": 1, "sim": 1}, ran
        # The device's own record: the flash holds what the walk-through wrote last.
        config = json.loads((tmp_path / "doser-flash" / "config.json").read_text())
        holdings = dict(map(tuple, config["holdings"]))
        assert holdings[0x21] == 200  # dose_volume set by the Python block
        assert (tmp_path / "generated" / "idemlink_regmap.h").is_file()
    finally:
        if sim is not None:
            sim.send_signal(signal.SIGTERM)
            try:
                sim.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sim.kill()
