"""Simulated flash: where a simulated device keeps its configuration across reboots and runs.

``ConfigFlash(dir)`` stores the register core's ``ConfigSnapshot`` as ``config.json``, replaced
atomically (temporary file, fsync, rename, fsync of the directory: a reader sees the old or the
new file, never half, and a completed save survives a power loss), mode 0600. Both the framed
simulator and the Modbus RTU simulator use it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from idemlink.protocol.device_core import ConfigSnapshot


class ConfigFlash:
    """Simulated flash: the configuration snapshot as ``config.json`` in a directory, written
    by atomic replacement (a reader sees the old or the new file, never half), mode 0600."""

    FILE = "config.json"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / self.FILE

    def load(self) -> ConfigSnapshot | None:
        try:
            return ConfigSnapshot.from_json(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def save(self, snap: ConfigSnapshot) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".config.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(snap.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._sync_dir()

    def _sync_dir(self) -> None:
        """Make the rename itself durable: without this an acknowledged save can revert to the
        old file after a power loss (the directory entry was still only in the page cache)."""
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
