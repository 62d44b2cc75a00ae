"""``make -C firmware_ref bench-device``: the instructions per framed request (and on the RTU face,
next to nanoMODBUS's reference figures from the same run) that
firmware_ref/README.md quotes are the bench's output (written by ``BENCH_DOCS=1`` through
``firmware_ref/tools/bench_device_docs.py``), never typed; the figures are gcc 12's on x86-64
(valgrind callgrind counts are exact for a given binary), so the comparison skips on another
compiler."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
FW = ROOT / "firmware_ref"
TOOL = FW / "tools" / "bench_device_docs.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_device_docs", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _readme_table() -> str:
    text = (FW / "README.md").read_text(encoding="utf-8")
    tool = _tool()
    assert text.count(tool.BEGIN) == 1 and text.count(tool.END) == 1
    return text.split(tool.BEGIN + "\n", 1)[1].split(tool.END, 1)[0]


@pytest.mark.slow  # a callgrind benchmark of four builds
def test_the_readme_quotes_the_bench_output(tmp_path: Path) -> None:
    for tool in ("make", "gcc", "valgrind"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    major = subprocess.run(["gcc", "-dumpversion"], capture_output=True, text=True,
                           check=False).stdout.strip().split(".")[0]
    if major != "12":
        pytest.skip("the README's figures are gcc 12's (another compiler schedules differently)")
    proc = subprocess.run(["make", "-s", "-C", str(FW), "bench-device", f"BUILD={tmp_path}"],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _tool().parse(proc.stdout)
    assert {(r["case"], r["crc_table"]) for r in rows if "crc_table" in r} == {
        (c, t) for c in ("read", "replay") for t in ("1", "2", "3")}
    assert _readme_table() == _tool().table(proc.stdout)
    by = {(r["case"], r["crc_table"]): float(r["instr_per_request"])
          for r in rows if "crc_table" in r}
    assert by[("replay", "1")] < by[("read", "1")] and by[("read", "3")] < by[("read", "1")]
    # issue 24: both faces beat nanoMODBUS's reference (printed by the same run) at its own job
    ref = next(r for r in rows if r.get("reference") == "nanoMODBUS")
    rtu = next(r for r in rows if r.get("case") == "rtu")
    assert by[("read", "1")] <= float(ref["instr_per_request"])
    assert float(rtu["instr_per_request"]) <= float(ref["instr_per_request"])


def test_the_tool_writes_between_the_markers_only(tmp_path: Path) -> None:
    out = tmp_path / "bench.txt"
    out.write_text("case=read registers=9 crc_table=1 instr_per_request=10.0\n"
                   "case=replay registers=9 crc_table=1 instr_per_request=8.0\n")
    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- bench_device:begin -->\nold\n<!-- bench_device:end -->\nend\n")
    run = [sys.executable, str(TOOL), str(out), str(doc)]
    assert subprocess.run(run, check=False).returncode == 0
    assert doc.read_text() == (
        "intro\n<!-- bench_device:begin -->\n"
        "| request (FC03 of all 9 registers) | CRC-32C nibble table (64 B, default) |\n"
        "|---|---|\n| executed (a new number) | 10.0 |\n| replayed (a retransmission) | 8.0 |\n"
        "<!-- bench_device:end -->\nend\n")
    doc.write_text("no markers\n")
    r = subprocess.run(run, capture_output=True, text=True, check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "markers" in r.stderr
    assert doc.read_text() == "no markers\n"


def test_the_tool_sets_ours_against_the_reference_from_the_same_run() -> None:
    text = ("case=read registers=9 crc_table=1 instr_per_request=10.0\n"
            "case=replay registers=9 crc_table=1 instr_per_request=8.0\n"
            "case=rtu registers=9 instr_per_request=7.5\n"
            "case=size cpu=cortex-m0plus text=4000\n"
            "reference=nanoMODBUS registers=9 instr_per_request=12 text=1900\n")
    second = _tool().table(text).split("\n\n", 1)[1]
    assert second.splitlines() == [
        "| the same job (FC03 of 9 registers) | idemlink C core | nanoMODBUS |",
        "|---|---|---|",
        "| instructions, framed (executed, nibble table (64 B, default)) | 10.0 | 12 |",
        "| instructions, Modbus RTU face | 7.5 | 12 |",
        "| code on cortex-m0plus (-Os), framed device without FILE_INFO and YMODEM | 4000 B | 1900 B |"]
    # without the reference line there is no comparison (the first table only)
    assert "\n\n" not in _tool().table(text.rsplit("reference=", 1)[0])
