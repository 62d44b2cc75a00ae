"""Installing idemlink adds one top-level import name, ``idemlink``, and its pytest plugin does not
break a project that has its own ``protocol`` or ``host`` package.

The wheel is built once per session (``pip wheel --no-deps``) from a copy of the source tree (so
the checkout gets no ``build/`` directory), exactly as ``pip install .`` builds it. Then:

- the wheel's RECORD and ``top_level.txt`` hold nothing outside ``idemlink/`` and its dist-info;
- installed (``--no-deps``) into a venv *without* system site packages, it adds exactly those two
  entries to site-packages, and from a neutral directory ``importlib.util.find_spec`` finds no
  ``protocol``, ``host`` or ``device_sim`` (nothing else could provide them there);
- installed into a venv that also sees the site packages of the Python running this suite (for
  pytest and the dependencies: a ``.pth`` file lists them after the venv's own, whether this
  suite runs in a venv or with the system Python; the wheel goes in with ``--ignore-installed``
  so the venv's copy is the one found, not a development install of the outer environment), a
  throwaway user project with its own ``protocol/`` and ``host/`` packages runs its own pytest:
  its tests import their own modules, use the ``idemlink_sim`` fixture, and check that every
  ``idemlink`` module came from the venv.

``test_pip_install_into_a_clean_venv`` does it all once more the way a user does, ``pip install
SRC pytest`` into a venv without system site packages (the dependencies come from the configured
index): ``slow``, as it installs everything from scratch.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOREIGN_NAMES = ("protocol", "host", "device_sim")
SOURCE_IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
    "firmware_ref", "bench", "tests")

USER_FILES = {
    "protocol/__init__.py": '"""The user\'s own protocol package."""\n',
    "protocol/device_core.py": 'OWNER = "user project"\n',
    "host/__init__.py": '"""The user\'s own host package."""\n',
    "host/device.py": "class Device:\n    kind = 'user'\n",
    "tests/test_user.py": '''
import os
import sys

from host.device import Device
from protocol.device_core import OWNER


def test_own_packages_are_imported():
    assert OWNER == "user project" and Device.kind == "user"
    assert sys.modules["protocol"].__file__.startswith(os.getcwd())


def test_idemlink_fixture_runs_next_to_them(idemlink_sim):
    dev = idemlink_sim.connect()
    assert dev.write({"threshold": 420}).ok
    assert idemlink_sim.device.core.value("threshold") == 420
    prefix = os.environ["IDEMLINK_VENV"]
    loaded = {n: m.__file__ for n, m in list(sys.modules.items())
              if n.split(".")[0] == "idemlink" and getattr(m, "__file__", None)}
    assert "idemlink.protocol.device_core" in loaded
    assert all(f.startswith(prefix) for f in loaded.values()), loaded
    assert OWNER == "user project"
''',
}

CHECK_NAMES = f'''
import importlib.util, sys
found = {{n: importlib.util.find_spec(n) for n in {FOREIGN_NAMES!r}}}
assert all(s is None for s in found.values()), found
spec = importlib.util.find_spec("idemlink.protocol")
assert spec is not None and spec.origin.startswith(sys.prefix), spec
print("ok")
'''


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                       check=False)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r


def clean_env(venv: Path) -> dict[str, str]:
    """No PYTHONPATH or PYTHONHOME leaking in: the venv's interpreter sees only the venv (and,
    if it was made with them, the system site packages)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["IDEMLINK_VENV"] = str(venv)
    return env


def source_copy(dest: Path) -> Path:
    shutil.copytree(REPO, dest, ignore=SOURCE_IGNORE, symlinks=True)  # idemlink/protocol stays a link
    return dest


def site_packages(venv: Path) -> Path:
    (sp,) = venv.glob("lib/python*/site-packages")
    return sp


def pip_into(venv: Path, *args: str) -> None:
    """Install with this interpreter's pip into ``venv`` (made ``--without-pip``)."""
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
         *args], cwd=venv)


def outer_site_packages() -> list[str]:
    """The site-packages directories of the Python running this suite (a venv's, and the base
    installation's when that venv includes them; the user's when enabled), in its order."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def see_outer_packages(venv: Path) -> None:
    """Let ``venv`` import what this suite's Python has (pytest, pyserial...) after its own
    packages: plain directory lines in a ``.pth`` file (no code: the outer environment's own
    ``.pth`` hooks, such as an editable install's finder, are not run)."""
    lines = "".join(f"{d}\n" for d in outer_site_packages())
    (site_packages(venv) / "zz_outer_environment.pth").write_text(lines, encoding="utf-8")


def user_project(root: Path) -> Path:
    for rel, text in USER_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run_user_suite(venv: Path, project: Path) -> str:
    r = run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "--trace-config", "tests"], cwd=project, env=clean_env(venv))
    assert "2 passed" in r.stdout, r.stdout
    plugin = [line for line in r.stdout.splitlines() if "idemlink" in line and "pytest_plugin" in line]
    assert plugin and all(str(venv) in line for line in plugin), plugin  # active, from the venv
    return r.stdout


WHEEL_GROUP = pytest.mark.xdist_group("wheel")
"""The tests that use the wheel run on one xdist worker, so the module's wheel is built once
(each worker building its own cost the default run a second 30-second build)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = source_copy(tmp / "src")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"),
         str(src)], cwd=tmp)
    (whl,) = (tmp / "dist").glob("idemlink-*.whl")
    yield whl


@WHEEL_GROUP
def test_the_wheel_holds_only_the_idemlink_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        record = z.read(f"{dist_info}/RECORD").decode()
        top_level = z.read(f"{dist_info}/top_level.txt").decode().split()
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} == {"idemlink", dist_info}
    assert {line.split("/")[0] for line in record.splitlines() if line} == {"idemlink", dist_info}
    assert top_level == ["idemlink"]
    assert "idemlink = idemlink.pytest_plugin" in entry_points
    for sub in FOREIGN_NAMES:  # the source directories are there, under idemlink/
        assert f"idemlink/{sub}/__init__.py" in names


@WHEEL_GROUP
def test_installed_wheel_adds_no_foreign_top_level_names(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    before = set(os.listdir(site_packages(venv)))
    pip_into(venv, "--no-deps", "--no-index", str(wheel))
    added = set(os.listdir(site_packages(venv))) - before
    assert {n for n in added if not n.endswith(".dist-info")} == {"idemlink"}
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    r = run([str(venv / "bin" / "python"), "-c", CHECK_NAMES], cwd=neutral, env=clean_env(venv))
    assert r.stdout.strip() == "ok"


@WHEEL_GROUP
def test_user_project_with_own_protocol_and_host_runs_with_the_plugin(
        wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    see_outer_packages(venv)
    pip_into(venv, "--no-deps", "--no-index", "--ignore-installed", str(wheel))
    run_user_suite(venv, user_project(tmp_path / "project"))


@pytest.mark.slow
def test_pip_install_into_a_clean_venv(tmp_path: Path) -> None:
    """``pip install SRC pytest`` into a venv without system site packages (dependencies from the
    configured index), then the same checks: no foreign top-level names, the user project passes."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    src = source_copy(tmp_path / "src")
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src), "pytest"],
        cwd=tmp_path, env=clean_env(venv), timeout=900)
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    r = run([str(venv / "bin" / "python"), "-c", CHECK_NAMES], cwd=neutral, env=clean_env(venv))
    assert r.stdout.strip() == "ok"
    run_user_suite(venv, user_project(tmp_path / "project"))
