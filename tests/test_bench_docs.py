"""Benchmark tables in the docs are written by the benchmarks between markers, never typed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _docs_table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_table", ROOT / "bench" / "docs_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_text_between_the_markers_is_replaced_and_nothing_else(tmp_path: Path) -> None:
    dt = _docs_table()
    doc = tmp_path / "X.md"
    doc.write_text("intro\n<!-- t:begin -->\nold | table\n<!-- t:end -->\noutro\n")
    dt.replace_between_markers(doc, "t", dt.markdown_table(["a", "b"], [["1", "2"]]))
    assert doc.read_text() == ("intro\n<!-- t:begin -->\n| a | b |\n|---|---|\n| 1 | 2 |\n"
                               "<!-- t:end -->\noutro\n")
    dt.replace_between_markers(doc, "t", "again")  # idempotent shape: markers kept
    assert doc.read_text() == "intro\n<!-- t:begin -->\nagain\n<!-- t:end -->\noutro\n"


def test_missing_markers_are_one_line_and_the_doc_is_untouched(tmp_path: Path) -> None:
    dt = _docs_table()
    doc = tmp_path / "X.md"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match=re.escape("no <!-- t:begin --> ... <!-- t:end --> markers")):
        dt.replace_between_markers(doc, "t", "x")
    assert doc.read_text() == "no markers\n"


@pytest.mark.parametrize(("doc", "name"), [("YMODEM.md", "bench_ymodem"), ("LINK.md", "bench_link"),
                                             ("BUS.md", "bench_bus"), ("BUS.md", "bench_bus_fair")])
def test_the_docs_carry_the_benchmark_markers(doc: str, name: str) -> None:
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    begin, end = _docs_table().markers(name)
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end)


@pytest.mark.parametrize("name", ["bench_pipeline_tasks", "bench_pipeline_single"])
def test_pipeline_md_carries_the_benchmark_markers(name: str) -> None:
    """bench/bench_pipeline.py rewrites the one-device table (from every measuring run, or from
    the saved medians with ``--skip-single --plot``) and the many-tasks table (``--tasks``) of
    bench/PIPELINE.md."""
    text = (ROOT / "bench" / "PIPELINE.md").read_text(encoding="utf-8")
    begin, end = _docs_table().markers(name)
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end)
    assert f'"{name}"' in (ROOT / "bench" / "bench_pipeline.py").read_text()
