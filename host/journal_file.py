"""Where a journal lives: reading it (private to this user, a regular file within the size
limit, never through a symbolic link: ``idemlink.protocol.regular_file.read_regular_file``),
replacing it atomically and durably (``write_regular_file``), and the one-writer lock
(``lock_journal``, over ``lock_file``).

The rules are stated in ``idemlink.host.journal``'s contract; the bytes are
``idemlink.host.journal_format``'s.
"""

from __future__ import annotations

import os
import stat
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
from idemlink.protocol.regular_file import (
    FileLock,
    FileRefused,
    LockHeld,
    NotDurable,
    Problem,
    lock_file,
    read_regular_file,
    write_regular_file,
)

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


def save(path: str | os.PathLike[str], snapshot: Snapshot) -> None:
    """Replace the journal at ``path`` with ``snapshot`` atomically and durably.

    Encodes (and so checks the limits) before touching the disk. Refuses to replace anything but
    a regular file or nothing.
    """
    _store(os.fspath(path), encode(snapshot))


def _store(p: str, data: bytes) -> None:
    """Replace the journal at ``p`` with ``data`` (``write_regular_file``: a private temp file
    beside it, fsynced, renamed over it, the directory fsynced), refusing anything there but a
    regular file."""
    try:
        write_regular_file(p, data, mode=FILE_MODE)
    except FileRefused as exc:
        raise JournalUnsafeFileError(f"{p}: is {exc.kind}; refused") from exc
    except NotDurable as exc:
        raise JournalError(
            f"{os.path.dirname(os.path.abspath(p))}: journal replaced but the directory fsync "
            f"failed ({exc.reason}); the change may not survive a power loss - reopen the "
            "journal before going on") from exc
    except OSError as exc:
        raise JournalError(f"{p}: cannot write journal: {exc.strerror}") from exc


def load_keyed(path: str | os.PathLike[str]) -> KeyedSnapshot:
    """Read the journal at ``path`` (either version). A missing file is the empty snapshot."""
    p = os.fspath(path)
    data = _read_existing(p)
    return KeyedSnapshot() if data is None else decode_keyed(data, where=p)


def save_keyed(path: str | os.PathLike[str], snapshot: KeyedSnapshot) -> None:
    """Replace the journal at ``path`` with ``snapshot`` (version 2), atomically and durably."""
    _store(os.fspath(path), encode_keyed(snapshot))


# ------------------------------------------------------------------------------------- lock


JournalLock = FileLock
"""The journal's lock (``lock_journal``): an exclusive ``flock`` on ``<journal>.lock``, held while
open. The lock file is created 0600 on first use and never deleted (deleting it would let two
processes lock two different files); the lock dies with the process that holds it, so it is never
stale."""


def lock_path(journal: str | os.PathLike[str]) -> str:
    return os.fspath(journal) + ".lock"


def _check_owner(p: str) -> Callable[[os.stat_result], None]:
    def check(st: os.stat_result) -> None:
        if st.st_uid != os.geteuid():
            raise JournalUnsafeFileError(f"{p}: owned by uid {st.st_uid}; refused")
    return check


def lock_journal(journal: str | os.PathLike[str]) -> JournalLock:
    """Take the journal's lock at once (``lock_file``) or raise ``JournalBusyError`` naming the
    holder's pid (as it wrote it); ``JournalUnsafeFileError`` if the lock path is a symlink or not
    a private regular file; ``JournalError`` if it cannot be created."""
    p = lock_path(journal)
    try:
        return lock_file(p, check=_check_owner(p))
    except LockHeld as exc:
        raise JournalBusyError(
            f"journal {os.fspath(journal)} is in use by another process"
            + (f" (pid {exc.holder})" if exc.holder else "")
            + ": one apply per journal at a time") from None
    except FileRefused as exc:
        raise JournalUnsafeFileError(f"{p}: is {exc.kind}; refused") from exc
    except OSError as exc:
        raise JournalError(f"{p}: cannot lock the journal: {exc.strerror}") from exc
