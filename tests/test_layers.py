"""The import layers, enforced: each layer imports only what is below it.

- ``protocol`` (``idemlink.protocol``) imports nothing of ours above it, and stays sans-I/O: no
  serial, socket, thread, async, select, clock or subprocess imports.
- ``host`` (``idemlink.host``) and ``device_sim`` (``idemlink.device_sim``) import only ``protocol``
  (besides themselves and the standard or third-party libraries): never each other, never the
  application.
- The application layer, the ``idemlink`` package itself (the CLI, its commands, the soak campaign
  and its oracle, the pytest plugin), is the only place that imports both.

Every ``import``/``from ... import`` counts, wherever it stands (in a function, under
``TYPE_CHECKING``), and so does a string naming one of our modules (``importlib.import_module``
lists). docs/ARCHITECTURE.md states the same rule; a test below checks that the two agree and that
every name the document cites exists.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

SOURCE_DIRS = {"protocol": "protocol", "host": "host", "device_sim": "device_sim",
               "application": "idemlink"}
"""Layer -> its source directory (installed as ``idemlink.<layer>``, the application as ``idemlink``)."""

MAY_IMPORT: dict[str, frozenset[str]] = {
    "protocol": frozenset({"protocol"}),
    "host": frozenset({"protocol", "host"}),
    "device_sim": frozenset({"protocol", "device_sim"}),
    "application": frozenset({"protocol", "host", "device_sim", "application"}),
}
"""The rule: which layers a layer's modules may import (itself included)."""

FORBIDDEN_IN_PROTOCOL = {"serial", "socket", "threading", "asyncio", "select", "time", "subprocess",
                         "multiprocessing", "signal"}
_MODULE_NAME = re.compile(r"idemlink\.(protocol|host|device_sim|commands|cli|campaign|pytest_plugin)(\.\w+)*")
"""A string naming one of our modules (logger names such as ``idemlink.frames`` are not modules)."""


def layer_of(module: str) -> str | None:
    """The layer an absolute module name belongs to; None if it is not ours."""
    parts = module.split(".")
    if parts[0] != "idemlink":
        return None
    if len(parts) > 1 and parts[1] in ("protocol", "host", "device_sim"):
        return parts[1]
    return "application"


def _package_of(path: Path, root: Path) -> list[str]:
    """The installed package name of a source file, as a list of parts."""
    rel = path.relative_to(root)
    top = rel.parts[0]
    pkg = ["idemlink"] if top == "idemlink" else ["idemlink", top]
    return pkg + list(rel.parts[1:-1])


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every absolute module name ``path`` imports (statically or by naming it in a string)."""
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(path, root)[: len(_package_of(path, root)) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            mods.add(module)
            # ``from idemlink import host`` imports the sub-package ``idemlink.host``
            mods |= {f"{module}.{a.name}" for a in node.names if module == "idemlink"}
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _MODULE_NAME.fullmatch(node.value)):
            mods.add(node.value)
    return mods


def imported_roots(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports (``serial``, ``time``, ``idemlink``...)."""
    return {m.split(".")[0] for m in imported_modules(path, path.parent) if m}


def layer_violations(root: Path = ROOT) -> list[str]:
    """``file: imports module (layer L may import only ...)`` for every import breaking the rule."""
    found: list[str] = []
    for layer, directory in SOURCE_DIRS.items():
        for path in sorted((root / directory).rglob("*.py")):
            for module in sorted(imported_modules(path, root)):
                target = layer_of(module)
                if target is not None and target not in MAY_IMPORT[layer]:
                    found.append(f"{path.relative_to(root)}: imports {module} "
                                 f"({layer} may import only {', '.join(sorted(MAY_IMPORT[layer]))})")
    return found


def test_every_import_follows_the_layer_rule() -> None:
    assert layer_violations() == []


def test_a_wrong_import_is_caught(tmp_path: Path) -> None:
    """The simulator importing the driver it exists to test (as it once did to receive files), the
    driver importing the simulator, and the core importing the driver (relative import, inside a
    function): each is reported, and nothing else."""
    for directory in SOURCE_DIRS.values():
        shutil.copytree(ROOT / directory, tmp_path / directory,
                        ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "device_sim" / "file_receive.py", "a", encoding="utf-8") as f:
        f.write("\nfrom idemlink.host.ymodem_io import receive_files\n")
    with open(tmp_path / "host" / "trace.py", "a", encoding="utf-8") as f:
        f.write("\nSIM = 'idemlink.device_sim.device'\n")
    with open(tmp_path / "protocol" / "frame.py", "a", encoding="utf-8") as f:
        f.write("\ndef _late() -> None:\n    from ..host import device  # noqa\n")
    assert layer_violations(tmp_path) == [
        "protocol/frame.py: imports idemlink.host (protocol may import only protocol)",
        "host/trace.py: imports idemlink.device_sim.device (host may import only host, protocol)",
        "device_sim/file_receive.py: imports idemlink.host.ymodem_io "
        "(device_sim may import only device_sim, protocol)",
    ]


def test_protocol_package_imports_no_io() -> None:
    files = sorted((ROOT / "protocol").rglob("*.py"))
    assert files, "protocol/ must exist"
    offenders = {f.name: sorted(imported_roots(f) & FORBIDDEN_IN_PROTOCOL) for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_io_checker_itself_catches_an_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom serial import Serial\n")
    assert imported_roots(bad) & FORBIDDEN_IN_PROTOCOL == {"time", "serial"}


# ------------------------------------------------------------------------ docs/ARCHITECTURE.md


def _rule_table(text: str) -> dict[str, frozenset[str]]:
    """The ``| layer | directory | may import |`` table of the document."""
    rule: dict[str, frozenset[str]] = {}
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in SOURCE_DIRS:
            rule[cells[0]] = frozenset(c.strip().strip("`") for c in cells[2].split(","))
    return rule


def test_architecture_states_the_rule_the_test_enforces() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert _rule_table(text) == MAY_IMPORT
    for layer, directory in SOURCE_DIRS.items():
        assert f"| `{layer}` | `{directory}/` |" in text


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_name_the_architecture_cites_exists() -> None:
    """Where each rule lives and the byte's path are cited as ``idemlink.x.y.name``: each resolves."""
    names = set(re.findall(r"`(idemlink(?:\.\w+)+)(?:\(\))?`", ARCHITECTURE.read_text("utf-8")))
    assert len(names) > 20
    assert sorted(n for n in names if not _resolves(n)) == []


def _defining_module(dotted: str) -> tuple[str, str] | None:
    """(module the citation names, module that defines the cited class/function), or None for a
    module or a value that has no defining module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        if cut == len(parts):
            return None
        top = getattr(obj, parts[cut])
        defined = getattr(top, "__module__", None)
        if not isinstance(defined, str) or not (inspect.isclass(top) or inspect.isfunction(top)):
            return None
        return ".".join(parts[:cut]), defined
    return None


def test_every_cited_rule_points_at_its_defining_module_not_a_re_export() -> None:
    """A "where each rule lives" row names the module that defines the rule; a re-export
    (``idemlink.host.device.Result`` for ``idemlink.host.command.Result``) sends the reader to the
    wrong file."""
    names = set(re.findall(r"`(idemlink(?:\.\w+)+)(?:\(\))?`", ARCHITECTURE.read_text("utf-8")))
    wrong = {}
    for n in names:
        found = _defining_module(n)
        if found is not None and found[0] != found[1]:
            wrong[n] = found[1]
    assert wrong == {}


# ---- one import path per name ---------------------------------------------------------------


def _top_level_names(path: Path) -> tuple[set[str], set[str]]:
    """(names a module defines, names it imports) at its top level (``if``/``try`` included)."""
    defined: set[str] = set()
    imported: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    defined.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return defined, imported - defined


def _module_path(module: str, root: Path = ROOT) -> Path | None:
    """The source file of one of our modules (``idemlink.host.command`` -> host/command.py)."""
    parts = module.split(".")
    if parts[0] != "idemlink":
        return None
    base = root / (parts[1] if len(parts) > 1 and parts[1] in ("protocol", "host", "device_sim")
                   else "idemlink")
    rest = parts[2:] if base.name != "idemlink" else parts[1:]
    for candidate in (base.joinpath(*rest).with_suffix(".py") if rest else None,
                      base.joinpath(*rest, "__init__.py")):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def re_exported_imports(root: Path = ROOT) -> list[str]:
    """``file:line: name from A, defined in B`` for every ``from idemlink.A import name`` in the
    tree whose name A only imports (one import path per name: the defining module's)."""
    found: list[str] = []
    dirs = [*SOURCE_DIRS.values(), "tests", "bench", "tools", "firmware_ref"]
    files = sorted(p for d in dirs if (root / d).is_dir() and not (root / d).is_symlink()
                   for p in (root / d).rglob("*.py")
                   if not any(part in ("protocol", "host", "device_sim") and (root / d).name == "idemlink"
                              for part in p.relative_to(root / d).parts[:1]))
    cache: dict[str, tuple[set[str], set[str]]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.startswith("idemlink")):
                continue
            source = _module_path(node.module, root)
            if source is None:
                continue
            if node.module not in cache:
                cache[node.module] = _top_level_names(source)
            _, imported = cache[node.module]
            for alias in node.names:
                if alias.name in imported and _module_path(f"{node.module}.{alias.name}", root) is None:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {alias.name} from "
                                 f"{node.module}, which imports it")
    return found


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    """The re-export hubs are gone: ``from idemlink.host.device import Result`` would name a
    module that only imports ``Result`` (from ``idemlink.host.command``); one import path per
    name keeps editors, grep and this document pointing at one place."""
    assert re_exported_imports() == []


def test_a_re_exported_import_is_caught(tmp_path: Path) -> None:
    for d in ("protocol", "host", "device_sim", "idemlink", "tests"):
        (tmp_path / d).mkdir()
    (tmp_path / "protocol" / "a.py").write_text("X = 1\n")
    (tmp_path / "protocol" / "b.py").write_text("from idemlink.protocol.a import X\n")
    (tmp_path / "tests" / "t.py").write_text("from idemlink.protocol.b import X\n"
                                             "from idemlink.protocol.a import X as Y\n")
    assert re_exported_imports(tmp_path) == [
        "tests/t.py:1: X from idemlink.protocol.b, which imports it"]
