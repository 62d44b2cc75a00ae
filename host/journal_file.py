"""Where a journal lives: reading it (private to this user, a regular file within the size
limit, never through a symbolic link: ``idemlink.protocol.regular_file.read_regular_file``),
replacing it atomically and durably, and the one-writer lock (``lock_journal``).

The rules are stated in ``idemlink.host.journal``'s contract; the bytes are
``idemlink.host.journal_format``'s.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import tempfile
from collections.abc import Callable

from idemlink.host.journal_format import (
    FILE_MODE,
    MAX_ENCODED_BYTES,
    JournalBusyError,
    JournalError,
    JournalUnsafeFileError,
    KeyedSnapshot,
    Snapshot,
    check_size,
    decode,
    decode_keyed,
    encode,
    encode_keyed,
)
from idemlink.protocol.regular_file import FileRefused, Problem, kind_of, read_regular_file

log = logging.getLogger("idemlink.host.journal")

# ------------------------------------------------------------------------------------- files


def _check_private(path: str) -> Callable[[os.stat_result], None]:
    """The journal's own rule on the opened file: private to this user, within the size limit."""
    def check(st: os.stat_result) -> None:
        if st.st_mode & 0o077:
            raise JournalUnsafeFileError(
                f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read or write it; "
                f"a journal is private (chmod 600 {path})"
            )
        if st.st_uid != os.geteuid():
            raise JournalUnsafeFileError(
                f"{path}: owned by uid {st.st_uid}, not by this user ({os.geteuid()}); refused"
            )
        check_size(st.st_size)
    return check


def _read_existing(path: str) -> bytes | None:
    """The journal's bytes, or None if there is none. Refuses anything not private and regular
    (``read_regular_file``: no symlink, no FIFO, no device; judged on the opened descriptor)."""
    try:
        return read_regular_file(path, MAX_ENCODED_BYTES, check=_check_private(path))
    except FileNotFoundError:
        return None
    except FileRefused as exc:
        if exc.problem is Problem.SYMLINK:
            raise JournalUnsafeFileError(f"{path}: is a symbolic link; refused") from exc
        if exc.problem is Problem.SPECIAL:
            raise JournalUnsafeFileError(f"{path}: is a special file; refused") from exc
        if exc.problem is Problem.NOT_REGULAR:
            raise JournalUnsafeFileError(f"{path}: is {exc.kind}; refused") from exc
        check_size(exc.size)  # TOO_LARGE, GREW: the journal's limit
        raise
    except OSError as exc:
        raise JournalError(f"{path}: cannot open: {exc.strerror}") from exc


def load(path: str | os.PathLike[str]) -> Snapshot:
    """Read the journal at ``path``. A missing file is the empty snapshot."""
    p = os.fspath(path)
    data = _read_existing(p)
    return Snapshot() if data is None else decode(data, where=p)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def save(path: str | os.PathLike[str], snapshot: Snapshot) -> None:
    """Replace the journal at ``path`` with ``snapshot`` atomically and durably.

    Encodes (and so checks the limits) before touching the disk. Refuses to replace anything but
    a regular file or nothing.
    """
    _store(os.fspath(path), encode(snapshot))


def _store(p: str, data: bytes) -> None:
    """Replace the journal at ``p`` with ``data``, refusing anything there but a regular file."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise JournalUnsafeFileError(f"{p}: is {kind_of(st.st_mode)}; refused")
    _replace(p, data)


def _replace(p: str, data: bytes) -> None:
    """Write ``data`` to a new uniquely named temp file beside ``p`` (``tempfile.mkstemp``:
    created 0600 with ``O_EXCL``, so two processes never share one), fsync it, ``os.replace``
    it over ``p``, fsync the directory."""
    directory, name = os.path.split(os.path.abspath(p))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise JournalError(f"{directory}: cannot create a temp file: {exc.strerror}") from exc
    try:
        try:
            os.fchmod(fd, FILE_MODE)  # the umask may have removed owner bits
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            log.warning("could not remove temp file %s", tmp)
        if isinstance(exc, IsADirectoryError):
            raise JournalUnsafeFileError(f"{p}: is a directory; refused") from exc
        raise JournalError(f"{p}: cannot write journal: {exc.strerror}") from exc
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise JournalError(
            f"{directory}: journal replaced but the directory fsync failed ({exc.strerror}); "
            "the change may not survive a power loss - reopen the journal before going on"
        ) from exc


def load_keyed(path: str | os.PathLike[str]) -> KeyedSnapshot:
    """Read the journal at ``path`` (either version). A missing file is the empty snapshot."""
    p = os.fspath(path)
    data = _read_existing(p)
    return KeyedSnapshot() if data is None else decode_keyed(data, where=p)


def save_keyed(path: str | os.PathLike[str], snapshot: KeyedSnapshot) -> None:
    """Replace the journal at ``path`` with ``snapshot`` (version 2), atomically and durably."""
    _store(os.fspath(path), encode_keyed(snapshot))


# ------------------------------------------------------------------------------------- lock


class JournalLock:
    """An exclusive ``fcntl.flock`` on ``<journal>.lock``, held while the object is open. The lock
    file is created 0600 on first use and never deleted (deleting it would let two processes lock
    two different files); the lock dies with the process that holds it, so it is never stale."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> JournalLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_path(journal: str | os.PathLike[str]) -> str:
    return os.fspath(journal) + ".lock"


def lock_journal(journal: str | os.PathLike[str]) -> JournalLock:
    """Take the journal's lock at once or raise ``JournalBusyError`` naming the holder's pid (as
    it wrote it); ``JournalUnsafeFileError`` if the lock path is a symlink or not a private
    regular file; ``JournalError`` if it cannot be created."""
    p = lock_path(journal)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(p, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JournalUnsafeFileError(f"{p}: is a symbolic link; refused") from exc
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP, errno.EISDIR):
            raise JournalUnsafeFileError(f"{p}: is not a regular file; refused") from exc
        raise JournalError(f"{p}: cannot open the journal lock: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JournalUnsafeFileError(f"{p}: is {kind_of(st.st_mode)}; refused")
        if st.st_uid != os.geteuid():
            raise JournalUnsafeFileError(f"{p}: owned by uid {st.st_uid}; refused")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise JournalBusyError(
                f"journal {os.fspath(journal)} is in use by another process"
                + (f" (pid {holder})" if holder.isdigit() else "")
                + ": one apply per journal at a time") from None
        os.fchmod(fd, FILE_MODE)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except OSError as exc:
        os.close(fd)
        raise JournalError(f"{p}: cannot lock: {exc.strerror}") from exc
    except BaseException:
        os.close(fd)
        raise
    return JournalLock(p, fd)
