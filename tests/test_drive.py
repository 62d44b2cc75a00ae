"""The blocking and the asyncio request loop are one loop: ``idemlink.host.drive.rounds`` and
``drive_async`` are the same lines but for ``await`` (and ``between()`` where the blocking one
yields to a ``stream``), and every operation of ``BlockingDriver`` is its ``AsyncDriver``
counterpart's line for line, awaited. A change made to one spelling and not the other fails here
(what the loops do is tested through the four drivers in ``test_four_drivers.py``).

The comparison is on the syntax tree (docstrings dropped, ``await x`` read as ``x``,
``between()`` as ``yield``), so layout and comments may differ; statements may not.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from idemlink.host import drive
from idemlink.host.aio import AsyncDriver
from idemlink.host.device import BlockingDriver
from idemlink.host.operations import OPERATIONS, DeviceHandle

DIFFERENT_BY_DESIGN = {
    "stream": "a blocking stream is a generator over the loop's rounds; an asyncio one runs the "
              "loop in a task and hands results over a queue, so the line stays busy while the "
              "caller awaits something else",
}
"""Operations whose two spellings differ on purpose, and why."""


class _Unawait(ast.NodeTransformer):
    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        v = node.value
        if (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "between"
                and not v.args):
            return ast.Expr(ast.Yield(None))
        self.generic_visit(node)
        return node


def normalized(source: str) -> tuple[str, list[str]]:
    """(its parameters, its body's lines) of the one function in ``source``, read blocking."""
    fn = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    module = _Unawait().visit(ast.Module(body=body, type_ignores=[]))
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg != "between"]
    return ", ".join(params), ast.unparse(module).splitlines()


def assert_same(blocking: Callable[..., Any], awaited: Callable[..., Any]) -> None:
    a, b = normalized(inspect.getsource(blocking)), normalized(inspect.getsource(awaited))
    diff = "\n".join(difflib.unified_diff(a[1], b[1], "blocking", "asyncio", lineterm=""))
    assert a == b, f"{blocking.__qualname__} and {awaited.__qualname__} differ:\n{diff}"


def test_the_blocking_and_the_asyncio_loop_are_the_same_lines() -> None:
    assert_same(drive.rounds, drive.drive_async)
    assert inspect.iscoroutinefunction(drive.drive_async)
    assert inspect.isgeneratorfunction(drive.rounds)


def test_the_comparison_catches_a_line_changed_on_one_side_only() -> None:
    source = inspect.getsource(drive.drive_async)
    assert "ops.interrupted(exc)" in source
    changed = source.replace("ops.interrupted(exc)", "pass")
    assert normalized(changed) != normalized(inspect.getsource(drive.rounds))
    assert normalized(source) == normalized(inspect.getsource(drive.rounds))


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_operation_is_the_same_in_both_shells(name: str) -> None:
    blocking = inspect.getattr_static(BlockingDriver, name)
    awaited = inspect.getattr_static(AsyncDriver, name)
    if name in DIFFERENT_BY_DESIGN or blocking is awaited:
        assert name in DIFFERENT_BY_DESIGN or name in vars(DeviceHandle)
        return
    assert inspect.isfunction(blocking) and inspect.iscoroutinefunction(awaited), name
    assert_same(blocking, awaited)


def test_the_shells_hold_no_other_code_than_listed() -> None:
    """Besides the operations, each shell has only its loop's plumbing: a new method there is a
    rule in a driver, and belongs in the operations."""
    plumbing = {"__init__", "__enter__", "__exit__", "__aenter__", "__aexit__", "_drive",
                "_rounds", "_loop", "_run_job", "_lends_port",
                # who has the line: one operation alone, or the shared pipeline's loop for
                # every caller (the rules are SharedPipeline's, in the operations)
                "_alone", "_acquire", "_release", "_drain", "_refuse_inside_stream",
                "_refuse_reentry", "_share", "_share_recorded", "_share_loop", "_drive_shared",
                "_notify", "_wake",
                "_stop_sharing"}
    for shell in (BlockingDriver, AsyncDriver):
        own = {n for n, v in vars(shell).items() if callable(v)}
        assert own - set(OPERATIONS) - plumbing == set(), shell.__name__
