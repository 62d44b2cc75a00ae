"""protocol/ stays sans-I/O: no serial, socket, thread, async, select, clock or subprocess imports."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"serial", "socket", "threading", "asyncio", "select", "time", "subprocess",
             "multiprocessing", "signal"}
PROTOCOL = Path(__file__).resolve().parent.parent / "protocol"


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_protocol_package_imports_no_io() -> None:
    files = sorted(PROTOCOL.glob("*.py"))
    assert files, "protocol/ must exist"
    offenders = {f.name: sorted(imported_roots(f) & FORBIDDEN) for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_checker_itself_catches_an_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom serial import Serial\n")
    assert imported_roots(bad) & FORBIDDEN == {"time", "serial"}
