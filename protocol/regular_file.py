"""Reading a small regular file safely: the one rule every file idemlink reads by name follows.

``read_regular_file(path, limit)`` returns the bytes of ``path`` when it is a regular file of at
most ``limit`` bytes, judged on the opened descriptor (no check-then-open race). It opens without
blocking, so a FIFO or a device is refused instead of hanging the reader; it refuses a symbolic
link unless ``follow_symlinks`` (a file the program writes itself — a journal, the flash — is
never read through a link; a file the user names — a map, a plan — may be one); and it refuses a
file that is larger than ``limit`` or grows past it while being read. ``check(stat)`` lets a
caller add its own rule on the opened file (a journal must be private) before anything is read.

``file_digest(path)`` is the (size, CRC-32C) of a file's bytes, as FILE_INFO reports a stored
file: the device computes it for the answer and the host for what it sent, so both sides use this
one function.

``write_regular_file(path, data, mode=0o600)`` is the one safe writer: it replaces ``path`` with
``data`` atomically and durably — a new temporary beside it with a unique name (``create_temp``:
``O_EXCL | O_NOFOLLOW``, so no two writers share one and a planted link is never written
through, given its final ``mode`` before any byte, whatever the umask), every byte written,
fsynced, ``os.replace``d over ``path``, then the directory fsynced (``sync_directory``: without it
a completed replacement can revert after a power loss). A reader sees the old file or the new one,
never half; on any failure (a full disk, an interrupt) the temporary is removed and ``path`` is as
it was. Anything at ``path`` but a regular file is refused; a symbolic link too, unless
``replace_symlink`` (then the link itself is replaced, never its target). A streaming writer (the
YMODEM sink) uses the same pieces: ``create_temp``, then ``commit_temp``.

``lock_file(path)`` is the one lock: an exclusive ``flock`` held while the returned ``FileLock`` is
open, taken at once or refused (``LockHeld``, with the pid the holder wrote); on a lock file
(created 0600 and never deleted, a symbolic link refused, the holder's pid written in it) or, with
``directory=True``, on a directory itself (nothing written in it). It dies with its process, so
it is never stale.

A refusal is a ``FileRefused`` naming the problem (``Problem``) and, for a file that is not
regular, what it is (``kind_of``); each caller turns it into its own error and message. An
absent file raises ``FileNotFoundError`` and any other failure to open its ``OSError``, unchanged.
A replacement whose directory fsync failed is ``NotDurable``.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Callable
from enum import Enum

from idemlink.protocol.frame import crc32c
from idemlink.protocol.outcome import IdemlinkError

log = logging.getLogger(__name__)


class Problem(Enum):
    SYMLINK = "a symbolic link"
    SPECIAL = "a special file"  #: refused by the kernel at open (a socket, ENXIO/EOPNOTSUPP)
    NOT_REGULAR = "not a regular file"
    TOO_LARGE = "too large"
    GREW = "grew past the limit while read"


class FileRefused(IdemlinkError):
    """``path`` is not a small regular file. ``kind`` says what it is (NOT_REGULAR), ``size``
    its size (TOO_LARGE: from ``fstat``; GREW: the bytes read, more than the limit),
    ``strerror`` the kernel's reason (SYMLINK, SPECIAL)."""

    def __init__(self, path: str | os.PathLike[str], problem: Problem, *, kind: str = "",
                 size: int = 0, strerror: str = "") -> None:
        super().__init__(f"{os.fspath(path)}: {kind or problem.value}; refused")
        self.path = path
        self.problem = problem
        self.kind = kind
        self.size = size
        self.strerror = strerror


_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO", "a directory"...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path: str | os.PathLike[str], limit: int, *, follow_symlinks: bool = False,
                      check: Callable[[os.stat_result], None] | None = None) -> bytes:
    """The content of ``path`` if it is a regular file of at most ``limit`` bytes (see the module
    docstring); ``FileRefused`` otherwise, ``FileNotFoundError`` if it is absent."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise FileRefused(path, Problem.SYMLINK, strerror=exc.strerror or "") from exc
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):
            raise FileRefused(path, Problem.SPECIAL, strerror=exc.strerror or "") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(path, Problem.NOT_REGULAR, kind=kind_of(st.st_mode))
        if check is not None:
            check(st)
        if st.st_size > limit:
            raise FileRefused(path, Problem.TOO_LARGE, size=st.st_size)
        chunks: list[bytes] = []
        total = 0
        while total <= limit and (chunk := os.read(fd, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # grew since fstat
            raise FileRefused(path, Problem.GREW, size=total)
        return b"".join(chunks)
    finally:
        os.close(fd)


def file_digest(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(size, CRC-32C) of the file at ``path``, read in 64 KiB chunks (FILE_INFO's digest)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            crc = crc32c(chunk, crc)
            size += len(chunk)
    return size, crc


# ------------------------------------------------------------------------------ the writer


class NotDurable(IdemlinkError, OSError):
    """``path`` was replaced, but fsyncing its directory failed: after a power loss the old file
    may come back. ``reason`` is the kernel's."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: replaced, but the directory fsync failed ({reason}); the "
                         "change may not survive a power loss")
        self.path = path
        self.reason = reason


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError:
        log.warning("could not remove temp file %s", tmp)


def create_temp(directory: str | os.PathLike[str], *, prefix: str, suffix: str = ".tmp",
                mode: int = 0o600,
                claim: Callable[[str], None] | None = None) -> tuple[int, str]:
    """A new file ``<directory>/<prefix><random><suffix>`` opened read-write: ``O_EXCL |
    O_NOFOLLOW`` (never one that exists, never through a link), of ``mode`` whatever the umask.
    ``claim(name)`` is called before each attempt, so a caller that records the name there can
    remove the file after an interrupt that lands while it is created. Returns (fd, name)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(os.fspath(directory), f"{prefix}{secrets.token_hex(6)}{suffix}")
        if claim is not None:
            claim(tmp)
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, mode)  # the umask may have removed bits
        except BaseException:
            os.close(fd)
            _remove(tmp)
            raise
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "every temporary name is taken", os.fspath(directory))


def sync_directory(directory: str | os.PathLike[str], path: str = "") -> None:
    """fsync ``directory`` so that a rename in it survives a power loss; ``NotDurable`` (naming
    ``path``, the file just put there) if it fails."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise NotDurable(path or os.fspath(directory), exc.strerror or str(exc)) from exc


def commit_temp(tmp: str, path: str | os.PathLike[str], *, replace: bool = True) -> None:
    """Put the written and fsynced temporary ``tmp`` at ``path`` (``os.replace``; with
    ``replace=False`` a link that fails if ``path`` exists, then ``tmp`` unlinked), then fsync the
    directory (``NotDurable``). ``tmp`` is left in place if the rename fails: the caller removes
    it."""
    if replace:
        os.replace(tmp, path)
    else:
        os.link(tmp, path)
        os.unlink(tmp)
    sync_directory(os.path.dirname(os.path.abspath(path)), os.fspath(path))


def _check_target(path: str, replace_symlink: bool) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        if not replace_symlink:
            raise FileRefused(path, Problem.SYMLINK, kind="a symbolic link")
    elif not stat.S_ISREG(mode):
        raise FileRefused(path, Problem.NOT_REGULAR, kind=kind_of(mode))


def write_regular_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600,
                       replace_symlink: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically and durably (see the module docstring):
    ``FileRefused`` for what is at ``path`` (not a regular file; a symbolic link unless
    ``replace_symlink``), ``NotDurable`` if only the directory fsync failed, the ``OSError`` of any
    other failure (``path`` unchanged, no temporary left)."""
    p = os.fspath(path)
    _check_target(p, replace_symlink)
    directory, name = os.path.split(os.path.abspath(p))
    fd, tmp = create_temp(directory, prefix=f".{name}.", mode=mode)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, IsADirectoryError):  # one appeared at the path since the check
            raise FileRefused(p, Problem.NOT_REGULAR, kind="a directory") from exc
        raise
    sync_directory(directory, p)


# -------------------------------------------------------------------------------- the lock


class LockHeld(IdemlinkError):
    """Another open lock (this process's or another's) holds ``path``; ``holder`` is the pid it
    wrote in the lock file ("" when none)."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"{path}: locked by another process"
                         + (f" (pid {holder})" if holder else ""))
        self.path = path
        self.holder = holder


class FileLock:
    """An exclusive ``flock`` held while this is open (``release()``, or leave the ``with``)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_file(path: str | os.PathLike[str], *, directory: bool = False,
              follow_symlinks: bool = False,
              check: Callable[[os.stat_result], None] | None = None) -> FileLock:
    """Take the lock on ``path`` at once (see the module docstring) or raise ``LockHeld``.
    A lock file: created 0600 if absent, ``FileRefused`` if it is a symbolic link or not a regular
    file, ``check(stat)`` the caller's own rule on it (its owner...), then the holder's pid
    written in it. ``directory=True``: the directory itself, a symbolic link to one followed only
    with ``follow_symlinks``. Any other failure is its ``OSError``."""
    import fcntl  # here: the rest of this module works where there is no fcntl

    p = os.fspath(path)
    if directory:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    else:
        flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(p, flags, 0o600)
    except OSError as exc:
        if not follow_symlinks and (exc.errno == errno.ELOOP or (  # O_DIRECTORY says ENOTDIR
                exc.errno == errno.ENOTDIR and os.path.islink(p))):
            raise FileRefused(p, Problem.SYMLINK, kind="a symbolic link",
                              strerror=exc.strerror or "") from exc
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP) or (
                exc.errno == errno.EISDIR and not directory):
            raise FileRefused(p, Problem.SPECIAL, kind="not a regular file",
                              strerror=exc.strerror or "") from exc
        raise
    try:
        if not directory:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileRefused(p, Problem.NOT_REGULAR, kind=kind_of(st.st_mode))
            if check is not None:
                check(st)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = "" if directory else os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise LockHeld(p, holder if holder.isdigit() else "") from None
        if not directory:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except BaseException:
        os.close(fd)
        raise
    return FileLock(p, fd)


__all__ = ["FileLock", "FileRefused", "LockHeld", "NotDurable", "Problem", "commit_temp",
           "create_temp", "file_digest", "kind_of", "lock_file", "read_regular_file",
           "sync_directory", "write_regular_file"]
