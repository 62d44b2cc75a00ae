"""Simulated flash: where a simulated device keeps its configuration across reboots and runs.

``ConfigFlash(dir)`` stores the register core's ``ConfigSnapshot`` as ``config.json``, replaced
atomically by the one safe writer (``idemlink.protocol.regular_file.write_regular_file``:
temporary file created 0600, fsync, rename, fsync of the directory: a reader sees the old or the
new file, never half, a completed save survives a power loss, and a failed one leaves no
temporary). Both the framed
simulator and the Modbus RTU simulator use it.

The directory also keeps the device's id (``device_id``, one line of text), created on first use:
like an MCU's unique id it never changes for that directory, so a host's journal can tell this
device from another.

``count_boot()`` increments and returns a boot counter kept in ``boots`` (same atomic
replacement): the framed simulator mixes it into its seeded boot epochs so that every process
start draws new epochs (docs/DESIGN.md, "Boot epochs of the simulator"). The file's one rule,
the C device's too (``parse_boots``; ``tests/vectors/flash_files.json`` holds the cases both are
tested against): ASCII decimal digits, then nothing but ASCII blanks (space, tab, CR, LF), of a
value at most ``MAX_BOOTS`` = 2^64 - 2 (the C device keeps the counter in 64 bits and the next
boot's count must fit too); no sign, no leading blank, no ``_``. ``read_boots()`` checks it
without writing, so a device can refuse a bad counter before it changes anything.

Hostile files are refused, never followed or read whole: a file is opened with ``O_NOFOLLOW |
O_NONBLOCK`` (a symbolic link or a FIFO does not hang or redirect the read), judged on the
descriptor (``fstat``: a regular file of at most ``MAX_FILE_BYTES``) before anything is read.
A refusal is ``UnsafeFlashFileError`` (an ``OSError``: the simulators report it as one line) and
leaves the directory untouched. The same holds for ``files``, where the framed device stores the
files it receives: a symbolic link there would put them outside the flash directory, so
``ConfigFlash`` refuses one (or anything else that is not a directory) when it opens the directory
(``files_dir()``); the device never follows one put there later (``SimulatedDevice.files_dir``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from idemlink.protocol.device_core import ConfigSnapshot, SnapshotError
from idemlink.protocol.key_file import read_key_file
from idemlink.protocol.key_rotation import KeyRing
from idemlink.protocol.outcome import IdemlinkError, LocalProtocolError
from idemlink.protocol.regular_file import (
    FileLock,
    FileRefused,
    LockHeld,
    Problem,
    lock_file,
    read_regular_file,
    write_regular_file,
)

_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")


class DeviceIdError(IdemlinkError, ValueError):
    """A device id that is not 1-64 characters of ``[A-Za-z0-9_.:-]``."""


def check_device_id(text: str) -> str:
    if not _DEVICE_ID.match(text):
        raise DeviceIdError(f"device id {text!r} must be 1-64 characters of [A-Za-z0-9_.:-], "
                            "starting with a letter or digit")
    return text


def new_device_id() -> str:
    return f"sim-{secrets.randbits(64):016x}"


MAX_FILE_BYTES = 1 << 20
"""Largest flash file read (a configuration snapshot is a few KiB)."""
DEVICE_ID_FILE_BYTES = 128  #: a device id file: the id (at most 64 characters) and a newline


class UnsafeFlashFileError(IdemlinkError, OSError):
    """A flash file that is not a small regular file (symlink, FIFO, device, huge): refused."""


MAX_BOOTS = (1 << 64) - 2
"""Largest boot counter a ``boots`` file may hold: the C device counts in 64 bits, and the next
boot's count (``MAX_BOOTS + 1``) must fit."""
BOOTS_FILE_BYTES = 64  #: a ``boots`` file: digits and a newline (64 bytes leave room for zeros)
_BOOTS = re.compile(rb"[0-9]+[ \t\r\n]*\Z")


class BootCounterError(LocalProtocolError):
    """The content of a ``boots`` file breaks the counter's rule (``parse_boots``)."""


def parse_boots(data: bytes) -> int:
    """The boot counter in ``data`` (a ``boots`` file's bytes): ASCII digits, then only ASCII
    blanks, at most ``MAX_BOOTS``; ``BootCounterError`` otherwise (the C device's rule too)."""
    if not _BOOTS.match(data):
        raise BootCounterError("not a boot counter")
    digits = data.rstrip(b" \t\r\n").lstrip(b"0") or b"0"
    if len(digits) > len(str(MAX_BOOTS)) or int(digits) > MAX_BOOTS:
        raise BootCounterError(f"boot counter above {MAX_BOOTS}")
    return int(digits)


def read_flash_file(path: Path, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """The content of ``path`` (None when absent); refuses what is not a regular file of at most
    ``limit`` bytes, or a symbolic link (``read_regular_file``)."""
    try:
        return read_regular_file(path, limit)
    except FileNotFoundError:
        return None
    except FileRefused as exc:
        raise UnsafeFlashFileError(_refusal(path, exc, limit)) from None


def _refusal(path: Path, exc: FileRefused, limit: int) -> str:
    if exc.problem is Problem.SYMLINK:
        return f"{path}: is a symbolic link; refused"
    if exc.problem is Problem.SPECIAL:
        return f"{path}: is a special file; refused"
    if exc.problem is Problem.NOT_REGULAR:
        return f"{path}: is {exc.kind}; refused"
    if exc.problem is Problem.TOO_LARGE:
        return f"{path}: {exc.size} bytes, more than the {limit} a flash file may hold; refused"
    return f"{path}: grew past {limit} bytes while read; refused"


class ConfigFlash:
    """Simulated flash: the configuration snapshot as ``config.json`` in a directory, written
    by atomic replacement (a reader sees the old or the new file, never half), mode 0600. A
    ``files`` entry that is not a directory of its own (a symbolic link...) is refused at once
    (``UnsafeFlashFileError``, nothing changed)."""

    FILE = "config.json"
    BOOTS = "boots"
    FILES = "files"
    KEYS = "keys"  #: a keyed device's long-term keys, 0600 (docs/SECURITY.md); never a register

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / self.FILE
        #: configuration saves since this object was made: the erase/program cycles an MCU's
        #: flash would have spent (``DeviceCore`` saves only what must survive a reboot)
        self.saves = 0
        self.files_dir()

    def files_dir(self) -> Path:
        """``<dir>/files``, where received files go, if it is absent (not created here) or a
        directory; a symbolic link (even to a directory: it would put received files outside the
        flash directory) or any other kind of file is refused (``UnsafeFlashFileError``)."""
        path = self.dir / self.FILES
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return path
        if stat.S_ISLNK(mode):
            raise UnsafeFlashFileError(f"{path}: is a symbolic link; refused")
        if not stat.S_ISDIR(mode):
            raise UnsafeFlashFileError(f"{path}: not a directory; refused")
        return path

    def keys(self, given: tuple[bytes, ...] | None) -> tuple[bytes, ...] | None:
        """The device's long-term keys: ``given`` (provisioned: kept in ``keys``, 0600, for the
        next start), else the ones kept here, else None (an unkeyed device). A factory reset
        (``factory_reset``) erases them with the configuration and the receipts."""
        ring = self.ring(given)
        return None if ring is None else ring.keys

    def ring(self, given: tuple[bytes, ...] | None) -> KeyRing | None:
        """The device's key ring (``idemlink.protocol.key_rotation``): keys ``given`` at start
        (a new rotation unless the same keys are kept here already: a restart keeps its window's
        count), else the ring kept here, else None (unkeyed)."""
        kept = self.load_ring()
        if given is None:
            return kept
        if kept is not None and kept.keys == given:
            return kept
        ring = KeyRing.given(given)
        self.save_ring(ring)
        return ring

    def load_ring(self) -> KeyRing | None:
        path = self.dir / self.KEYS
        if not os.path.lexists(path):
            return None
        keys = read_key_file(path)  # private, a regular file, lines of hex: or refused
        return KeyRing.from_lines(keys, path.read_text("ascii"))

    def save_ring(self, ring: KeyRing) -> None:
        """Keep ``ring`` in ``keys`` (0600, replaced atomically)."""
        write_regular_file(self.dir / self.KEYS, ring.to_lines().encode("ascii"), mode=0o600)

    def factory_reset(self) -> None:
        """The recovery path for a lost key (docs/SECURITY.md): erase the keys, the
        configuration and the received files, so the device comes back unkeyed and blank and no
        state of its keyed life is left to replay. The boot counter is kept (the next boot's
        epoch stays new, so no frame of an earlier boot is ever in its epoch) and so is the
        device id (it names the hardware)."""
        for name in (self.KEYS, self.FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()
        files = self.dir / self.FILES
        if files.is_dir() and not files.is_symlink():
            for entry in files.iterdir():
                if entry.is_file() or entry.is_symlink():
                    entry.unlink()

    def load(self) -> ConfigSnapshot | None:
        """The saved configuration (None when there is none). Bytes that are not text (invalid
        UTF-8, a NUL) are ``UnsafeFlashFileError``, a snapshot that breaks the format
        ``SnapshotError``; both name the file, with the C device's words
        (``tests/vectors/flash_files.json``)."""
        data = read_flash_file(self.path)
        if data is None:
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = "\0"
        if "\0" in text:
            raise UnsafeFlashFileError(f"{self.path}: not UTF-8 text") from None
        with self.naming_config():
            return ConfigSnapshot.from_json(text)

    @contextlib.contextmanager
    def naming_config(self) -> Iterator[None]:
        """A ``SnapshotError`` raised inside (the saved configuration does not fit the map it is
        loaded into...) names this flash's ``config.json``, as the C device's refusals do."""
        try:
            yield
        except SnapshotError as exc:
            raise SnapshotError(f"{self.path}: {exc}") from None

    def save(self, snap: ConfigSnapshot) -> None:
        self._replace(self.path, snap.to_json())
        self.saves += 1

    def claim_map(self, name: str, map_hash: str, *, record: bool = True) -> None:
        """Tie this flash to one register map (file ``map``: name and hash). A directory saved
        with another map is refused (``UnsafeFlashFileError``, nothing changed; the message names
        the ``--regmap`` it was saved with): its configuration would be read with the wrong
        layout, limits or scale. A directory from
        before this file existed is claimed by the first map that opens it (``record=False``:
        only checked, nothing written)."""
        path = self.dir / "map"
        data = read_flash_file(path, limit=256)
        if data is None:
            if record:
                self._replace(path, f"{name} {map_hash}\n")
            return
        try:
            old_name, old_hash = data.decode("utf-8").split()
        except (UnicodeDecodeError, ValueError):
            raise UnsafeFlashFileError(f"{path}: not a map record; refused") from None
        if old_hash != map_hash:
            from idemlink.protocol.regmap_file import BUILTIN_MAPS

            with_map = (f"--regmap {old_name}" if old_name in BUILTIN_MAPS
                        else f"--regmap FILE, FILE being map {old_name}'s file")
            raise UnsafeFlashFileError(
                f"{self.dir} holds the configuration of register map {old_name} {old_hash}, "
                f"not {name} {map_hash}: serve it with the map it was saved with ({with_map}) "
                "or use another flash directory")

    def read_boots(self) -> int:
        """The persisted boot counter (0 on a fresh directory), nothing written. A ``boots``
        file that breaks the rule (``parse_boots``) is refused (``UnsafeFlashFileError``)."""
        path = self.dir / self.BOOTS
        data = read_flash_file(path, limit=BOOTS_FILE_BYTES)
        try:
            return parse_boots(data) if data is not None else 0
        except BootCounterError as exc:
            raise UnsafeFlashFileError(f"{path}: {exc}; refused") from None

    def count_boot(self) -> int:
        """Increment the persisted boot counter and return it (1 on a fresh directory); a bad
        counter is refused as by ``read_boots``, nothing written."""
        boots = self.read_boots() + 1
        self._replace(self.dir / self.BOOTS, f"{boots}\n")
        return boots

    def device_id(self) -> str:
        """This flash's device id: read from ``device_id``, created (atomically) the first time.
        A file that is not a regular file, or holds no valid id, is refused (DeviceIdError)."""
        path = self.dir / "device_id"
        try:
            data = read_regular_file(path, DEVICE_ID_FILE_BYTES)
        except FileNotFoundError:
            ident = new_device_id()
            self._replace(path, ident + "\n")
            return ident
        except FileRefused as exc:
            if exc.problem in (Problem.SYMLINK, Problem.SPECIAL):
                raise DeviceIdError(f"{path}: cannot read the device id ({exc.strerror})") from None
            if exc.problem is Problem.NOT_REGULAR:
                raise DeviceIdError(f"{path}: not a regular file") from None
            data = b""  # too large for an id: refused below as not holding one
        except OSError as exc:
            raise DeviceIdError(f"{path}: cannot read the device id ({exc.strerror})") from None
        try:
            return check_device_id(data.decode("ascii").strip())
        except (UnicodeDecodeError, DeviceIdError):
            raise DeviceIdError(f"{path}: does not hold a device id (1-64 characters of "
                                "[A-Za-z0-9_.:-])") from None

    def address(self, given: int | None) -> int | None:
        """This device's bus address (docs/BUS.md): ``given`` (1..247) is kept in ``address``
        for the next start; without one, the kept one, or None (a point-to-point device). A file
        that holds no address is refused (``UnsafeFlashFileError``), nothing changed."""
        from idemlink.protocol.frame import FrameEncodeError, check_address

        path = self.dir / "address"
        if given is not None:
            check_address(given)
            self._replace(path, f"{given}\n")
            return given
        data = read_flash_file(path, limit=16)
        if data is None:
            return None
        try:
            return check_address(int(data.decode("ascii").strip()))
        except (UnicodeDecodeError, ValueError, FrameEncodeError):
            raise UnsafeFlashFileError(f"{path}: does not hold a device address "
                                       "(1..247); refused") from None

    def _replace(self, path: Path, text: str) -> None:
        """``path`` replaced by ``text``, atomically and durably, mode 0600
        (``write_regular_file``); anything there but a regular file is refused
        (``UnsafeFlashFileError``), nothing changed."""
        try:
            write_regular_file(path, text.encode("utf-8"))
        except FileRefused as exc:
            raise UnsafeFlashFileError(_refusal(path, exc, MAX_FILE_BYTES)) from None


class FlashBusyError(IdemlinkError, OSError):
    """Another process serves from this flash directory (it holds the directory's lock)."""


FlashLock = FileLock
"""A flash directory's lock (``lock_flash_dir``)."""


def lock_flash_dir(directory: str | os.PathLike[str]) -> FlashLock:
    """Take ``directory``'s lock at once (creating the directory if needed, as ``ConfigFlash``
    does) or raise ``FlashBusyError``; an ``OSError`` if it is not a directory. Refused, nothing
    in the directory is read or changed. The lock is an exclusive ``flock`` on the directory
    itself (``lock_file``, ``directory=True``), as the C device takes it: one simulator or device
    per flash directory (two would overwrite each other's configuration and count each other's
    boots). Nothing is written for it; it dies with its process, so it is never stale."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    try:
        return lock_file(d, directory=True, follow_symlinks=True)
    except LockHeld:
        raise FlashBusyError(f"{d} is in use by another simulator: one simulator per flash "
                             "directory; nothing changed") from None
