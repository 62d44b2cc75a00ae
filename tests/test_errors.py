"""One error root: every exception idemlink defines derives from
``idemlink.protocol.outcome.IdemlinkError``, docs/API.md shows the tree as it is, and a host-side
refusal never carries a wire status."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import idemlink
from idemlink.protocol.outcome import IdemlinkError, LocalProtocolError

ROOT = Path(__file__).resolve().parent.parent
API_DOC = ROOT / "docs" / "API.md"

#: Outside the tree on purpose, each for the reason given.
EXEMPT = {
    # Loading the plugin imports nothing of idemlink (tests/test_pytest_plugin.py), so its one
    # error cannot have idemlink's base; pytest reports it as the ImportError it stands for.
    "idemlink.pytest_plugin.PluginLoadError",
}


def _import_everything() -> None:
    for info in pkgutil.walk_packages(idemlink.__path__, "idemlink."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            importlib.import_module(info.name)


def _subclasses(cls: type[BaseException]) -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _ours(cls: type) -> bool:
    return cls.__module__ == "idemlink" or cls.__module__.startswith("idemlink.")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_every_exception_idemlink_defines_derives_from_idemlink_error() -> None:
    _import_everything()
    outside = sorted({_name(c) for c in _subclasses(Exception)
                      if _ours(c) and not issubclass(c, IdemlinkError)} - EXEMPT)
    assert outside == [], "derive these from IdemlinkError (a built-in base as a mix-in)"


def error_tree() -> str:
    """The public error classes under ``IdemlinkError``, one a line, indented by depth, each with
    its defining module and the built-in types it also is."""
    _import_everything()
    lines: list[str] = []

    def walk(cls: type[BaseException], depth: int) -> None:
        builtins = [b.__name__ for b in cls.__bases__ if b.__module__ == "builtins"
                    and cls is not IdemlinkError]
        label = "  " * depth + cls.__qualname__ + (f" ({', '.join(builtins)})" if builtins else "")
        lines.append(f"{label:<44} {cls.__module__}".rstrip())
        children = {c for c in cls.__subclasses__()
                    if c.__bases__[0] is cls and not c.__name__.startswith("_") and _ours(c)}
        for child in sorted(children, key=lambda c: c.__qualname__):
            walk(child, depth + 1)

    walk(IdemlinkError, 0)
    return "\n".join(lines) + "\n"


def test_the_error_tree_in_the_api_doc_is_the_codes() -> None:
    text = API_DOC.read_text("utf-8")
    m = re.search(r"<!-- error-tree -->\n```text\n(.*?)```", text, re.S)
    assert m is not None, "docs/API.md lost its error tree block"
    assert m.group(1) == error_tree(), "docs/API.md's error tree is stale; it should be:\n" + (
        error_tree())


def test_every_error_is_in_the_tree_under_its_first_base() -> None:
    """The tree follows each class's first base: an error whose first base is a built-in (the
    mix-in first) would not show."""
    _import_everything()
    for cls in _subclasses(IdemlinkError):
        if _ours(cls) and not cls.__name__.startswith("_"):
            assert issubclass(cls.__bases__[0], IdemlinkError), _name(cls)


def test_a_host_side_refusal_carries_no_wire_status() -> None:
    from idemlink.host.command import CommandBuilder
    from idemlink.protocol.regmap_file import DEFAULT_MAP
    from idemlink.protocol.rtu_master import RtuMaster

    builder = CommandBuilder(DEFAULT_MAP)
    refusals = [lambda: builder.spec("no-such-register"), lambda: builder.write_command({}),
                lambda: builder.write_command({"threshold": 70000}),
                lambda: RtuMaster(DEFAULT_MAP).submit(b"", 0.0),
                lambda: RtuMaster(DEFAULT_MAP).submit(b"\x03", 0.0, unit=300)]
    for refuse in refusals:
        with pytest.raises(LocalProtocolError) as exc:
            refuse()
        assert exc.value.status is None, exc.value
    with pytest.raises(TypeError):
        LocalProtocolError("misuse", 0x31)  # type: ignore[misc]  # no status can be given
