"""Run the examples of a Markdown document, so the documentation cannot drift from the tool.

Blocks are marked in the Markdown with an HTML comment on the line before the fence:

- ``<!-- file: NAME -->``: the next code block is written to NAME (in the working directory);
- ``<!-- run -->``: the next console block is run like a shell session, line by line;
- ``<!-- python -->``: the next code block is run with this Python (``PORT`` etc. in its env).

In a console block, ``$ `` starts a command and the lines under it are its expected output: each
must appear in the command's output, in order (``...`` matches anything; text after two spaces and
``#`` in a command is a comment). The shell-isms the docs use are understood: ``idemlink sim ...
&`` starts the simulator in the background (its printed pty path stands for the real one),
``NAME=VALUE`` sets a variable (``$NAME`` is substituted, the doc's pty path becomes the real
one), ``export NAME=VALUE`` also puts it in the environment, ``; echo $?`` checks the exit
status printed on the last expected line (otherwise the status must be 0), ``kill %1`` stops the
simulator with SIGTERM and requires exit 0.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "idemlink":
        return [sys.executable, "-m", "idemlink", *words[1:]]
    if words[:3] == ["python3", "-m", "pytest"]:
        return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *words[3:]]
    raise AssertionError(f"the doc runs something the doc runner does not know: {command}")


def line_matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, actual.strip()) is not None


@dataclass
class Session:
    """The state of one document's run: working directory, variables, background simulator."""

    cwd: Path
    env: dict[str, str] = field(default_factory=lambda: {**os.environ,
                                                          "PYTHONDONTWRITEBYTECODE": "1"})
    variables: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  #: doc's pty path -> the real one
    sim: subprocess.Popen[str] | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"file": 0, "run": 0, "python": 0,
                                                            "command": 0})

    # ------------------------------------------------------------------ blocks
    def run_document(self, text: str) -> None:
        try:
            for m in BLOCK.finditer(text):
                mark, body = m["mark"], m["body"]
                if mark and mark.startswith("file: "):
                    (self.cwd / mark[len("file: "):]).write_text(body, encoding="utf-8")
                    self.counts["file"] += 1
                elif mark == "run":
                    self.console(body)
                    self.counts["run"] += 1
                elif mark == "python":
                    r = subprocess.run([sys.executable, "-c", body], cwd=self.cwd, env=self.env,
                                       capture_output=True, text=True, check=False, timeout=60)
                    assert r.returncode == 0, r.stdout + r.stderr
                    self.counts["python"] += 1
        finally:
            self.stop_sim(check=False)

    def console(self, body: str) -> None:
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif line.strip():
                steps[-1][1].append(line)
        for command, expected in steps:
            self.step(re.split(r"\s{2,}#", command)[0].strip(), expected)

    # ------------------------------------------------------------------ one command
    def substitute(self, text: str) -> str:
        for name, value in sorted(self.variables.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(f"${name}", value)
        return text

    def step(self, command: str, expected: list[str]) -> None:
        self.counts["command"] += 1
        assignment = re.fullmatch(r"(export )?([A-Z_]+)=(\S+)", command)
        if assignment:
            value = self.aliases.get(assignment[3], self.substitute(assignment[3]))
            self.variables[assignment[2]] = value
            if assignment[1]:
                self.env[assignment[2]] = value
            return
        if command == "kill %1":
            self.stop_sim(check=True)
            return
        if command.endswith("&") and command.startswith("idemlink sim"):
            self.start_sim(self.substitute(command.rstrip("& ")), expected)
            return
        want_status = None
        if command.endswith("; echo $?"):
            command = command[: -len("; echo $?")].strip()
            want_status = int(expected.pop())
        r = subprocess.run(argv(self.substitute(command)), cwd=self.cwd, env=self.env,
                           capture_output=True, text=True, check=False, timeout=120)
        out = r.stdout + r.stderr
        assert "Traceback" not in r.stderr, f"{command}\n{r.stderr}"
        assert r.returncode == (want_status or 0), f"{command}: exit {r.returncode}\n{out}"
        actual = out.splitlines()
        at = 0
        for want in expected:
            while at < len(actual) and not line_matches(self.substitute(want), actual[at]):
                at += 1
            assert at < len(actual), f"{command}: {want!r} not found (in order) in\n{out}"
            at += 1

    def start_sim(self, command: str, expected: list[str]) -> None:
        assert self.sim is None, "one background simulator at a time"
        self.sim = subprocess.Popen(argv(command), cwd=self.cwd, env=self.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.sim.stdout is not None
        ready, _, _ = select.select([self.sim.stdout], [], [], 30)
        assert ready, f"{command}: printed no port"
        path = self.sim.stdout.readline().strip()
        assert path, f"{command}: printed no port"
        if expected:
            self.aliases[expected[0].strip()] = path

    def stop_sim(self, *, check: bool) -> None:
        sim, self.sim = self.sim, None
        if sim is None:
            assert not check, "kill %1 with no simulator running"
            return
        sim.send_signal(signal.SIGTERM)
        try:
            rc = sim.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()
            raise AssertionError("the simulator did not stop on SIGTERM") from None
        if check:
            assert rc == 0, f"the simulator exited {rc} on SIGTERM"
