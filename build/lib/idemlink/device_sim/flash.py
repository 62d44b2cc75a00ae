"""Simulated flash: where a simulated device keeps its configuration across reboots and runs.

``ConfigFlash(dir)`` stores the register core's ``ConfigSnapshot`` as ``config.json``, replaced
atomically (temporary file, fsync, rename, fsync of the directory: a reader sees the old or the
new file, never half, and a completed save survives a power loss), mode 0600. Both the framed
simulator and the Modbus RTU simulator use it.

The directory also keeps the device's id (``device_id``, one line of text), created on first use:
like an MCU's unique id it never changes for that directory, so a host's journal can tell this
device from another.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

from idemlink.protocol.device_core import ConfigSnapshot

_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")


class DeviceIdError(ValueError):
    """A device id that is not 1-64 characters of ``[A-Za-z0-9_.:-]``."""


def check_device_id(text: str) -> str:
    if not _DEVICE_ID.match(text):
        raise DeviceIdError(f"device id {text!r} must be 1-64 characters of [A-Za-z0-9_.:-], "
                            "starting with a letter or digit")
    return text


def new_device_id() -> str:
    return f"sim-{secrets.randbits(64):016x}"


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

    def device_id(self) -> str:
        """This flash's device id: read from ``device_id``, created (atomically) the first time.
        A file that is not a regular file, or holds no valid id, is refused (DeviceIdError)."""
        path = self.dir / "device_id"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            ident = new_device_id()
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".device_id.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(ident + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._sync_dir()
            return ident
        except OSError as exc:
            raise DeviceIdError(f"{path}: cannot read the device id ({exc.strerror})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise DeviceIdError(f"{path}: not a regular file")
            data = os.read(fd, 128)
        finally:
            os.close(fd)
        try:
            return check_device_id(data.decode("ascii").strip())
        except (UnicodeDecodeError, DeviceIdError):
            raise DeviceIdError(f"{path}: does not hold a device id (1-64 characters of "
                                "[A-Za-z0-9_.:-])") from None

    def _sync_dir(self) -> None:
        """Make the rename itself durable: without this an acknowledged save can revert to the
        old file after a power loss (the directory entry was still only in the page cache)."""
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
