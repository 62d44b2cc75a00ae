"""Run strict mypy on idemlink as it is installed: ``python3 tests/typecheck.py``.

The source directories (``protocol/``, ``host/``, ``device_sim/``, ``idemlink/``) install as
``idemlink.protocol``, ``idemlink.host``, ``idemlink.device_sim`` and ``idemlink`` (a setuptools
package-dir mapping). mypy cannot see through that mapping, so this lays the tree out as installed
with symbolic links in a temporary directory and checks ``-p idemlink`` there, with the
configuration in pyproject.toml. Exit status is mypy's.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = ("protocol", "host", "device_sim")


def installed_layout(dest: Path) -> Path:
    """Build ``dest/idemlink`` as the wheel would; return ``dest``."""
    pkg = dest / "idemlink"
    pkg.mkdir()
    for entry in (ROOT / "idemlink").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name in MAPPED:
        (pkg / name).symlink_to(ROOT / name)
    return dest


def run_mypy() -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="idemlink-mypy-") as tmp:
        tree = installed_layout(Path(tmp))
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
             "--cache-dir", str(ROOT / ".mypy_cache"), "-p", "idemlink"],
            cwd=tree, capture_output=True, text=True, check=False, timeout=900)


if __name__ == "__main__":
    r = run_mypy()
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    sys.exit(r.returncode)
