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

A refusal is a ``FileRefused`` naming the problem (``Problem``) and, for a file that is not
regular, what it is (``kind_of``); each caller turns it into its own error and message. An
absent file raises ``FileNotFoundError`` and any other failure to open its ``OSError``, unchanged.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from enum import Enum

from idemlink.protocol.frame import crc32c
from idemlink.protocol.outcome import IdemlinkError


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


__all__ = ["FileRefused", "Problem", "file_digest", "kind_of", "read_regular_file"]
