"""``idemlink.protocol.regular_file``: the one rule for reading a small regular file by name
(journal, flash, map file, plan), each refusal typed; the one safe writer (``write_regular_file``)
and the one lock (``lock_file``) next to it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

import idemlink.protocol.regular_file as regular_file
from idemlink.protocol.regular_file import (
    FileRefused,
    LockHeld,
    NotDurable,
    Problem,
    kind_of,
    lock_file,
    read_regular_file,
    write_regular_file,
)


def test_a_small_regular_file_is_read(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"x" * 10)
    assert read_regular_file(f, 10) == b"x" * 10


def test_absent_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "none", 10)


def test_oversized_is_refused_with_its_size(tmp_path: Path) -> None:
    f = tmp_path / "big"
    f.write_bytes(b"x" * 11)
    with pytest.raises(FileRefused) as exc:
        read_regular_file(f, 10)
    assert exc.value.problem is Problem.TOO_LARGE and exc.value.size == 11


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileRefused) as exc:
        read_regular_file(fifo, 10, follow_symlinks=True)
    assert exc.value.problem is Problem.NOT_REGULAR and exc.value.kind == "a FIFO"


def test_a_directory_is_refused_as_such(tmp_path: Path) -> None:
    with pytest.raises(FileRefused) as exc:
        read_regular_file(tmp_path, 10)
    assert exc.value.kind == "a directory"
    assert str(exc.value) == f"{tmp_path}: a directory; refused"


def _linked(tmp_path: Path, content: bytes) -> tuple[Path, Path]:
    """A regular file holding ``content`` and a symbolic link to it: (file, link)."""
    real = tmp_path / "real"
    real.write_bytes(content)
    link = tmp_path / "link"
    link.symlink_to(real)
    return real, link


def test_a_symlink_is_refused_unless_followed(tmp_path: Path) -> None:
    _, link = _linked(tmp_path, b"ok")
    with pytest.raises(FileRefused) as exc:
        read_regular_file(link, 10)
    assert exc.value.problem is Problem.SYMLINK
    assert read_regular_file(link, 10, follow_symlinks=True) == b"ok"


def test_the_callers_check_runs_on_the_opened_file_before_reading(tmp_path: Path) -> None:
    f = tmp_path / "shared"
    f.write_bytes(b"secret")
    f.chmod(0o644)

    def private(st: os.stat_result) -> None:
        if st.st_mode & 0o077:
            raise PermissionError("not private")

    with pytest.raises(PermissionError, match="not private"):
        read_regular_file(f, 10, check=private)


def test_kind_of_names_every_special_file() -> None:
    import stat

    assert kind_of(stat.S_IFIFO) == "a FIFO" and kind_of(stat.S_IFSOCK) == "a socket"
    assert kind_of(stat.S_IFCHR) == "a character device" and kind_of(stat.S_IFLNK) == "a symbolic link"


# ------------------------------------------------------------------------------ the writer


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o777])
def test_the_written_file_has_its_mode_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        write_regular_file(tmp_path / "private", b"one")
        write_regular_file(tmp_path / "shared", b"two", mode=0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o644
    assert (tmp_path / "private").read_bytes() == b"one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["private", "shared"]  # no temp left


def test_a_replacement_is_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    f = tmp_path / "f"
    write_regular_file(f, b"old")
    write_regular_file(f, b"new" * 100_000)
    assert f.read_bytes() == b"new" * 100_000 and os.listdir(tmp_path) == ["f"]


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                     KeyboardInterrupt()], ids=["disk full", "interrupt"])
def test_a_failed_write_leaves_the_file_as_it_was_and_no_temp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException) -> None:
    f = tmp_path / "f"
    write_regular_file(f, b"old")

    def fail(fd: int, data: bytes) -> None:
        os.write(fd, data[:1])
        raise failure

    monkeypatch.setattr(regular_file, "_write_all", fail)
    with pytest.raises(type(failure)):
        write_regular_file(f, b"new")
    assert f.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_a_symlink_at_the_path_is_refused_unless_the_caller_replaces_links(tmp_path: Path) -> None:
    victim, link = _linked(tmp_path, b"keep")
    with pytest.raises(FileRefused) as exc:
        write_regular_file(link, b"new")
    assert exc.value.problem is Problem.SYMLINK and link.is_symlink()
    write_regular_file(link, b"new", replace_symlink=True)  # the link is replaced, not followed
    assert not link.is_symlink() and link.read_bytes() == b"new" and victim.read_bytes() == b"keep"


def test_a_directory_or_fifo_at_the_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for name, kind in (("d", "a directory"), ("fifo", "a FIFO")):
        with pytest.raises(FileRefused) as exc:
            write_regular_file(tmp_path / name, b"x")
        assert exc.value.kind == kind
    assert sorted(os.listdir(tmp_path)) == ["d", "fifo"]


def test_the_file_is_fsynced_then_renamed_then_the_directory_fsynced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_regular_file(tmp_path / "f", b"x")
    assert calls == ["fsync file", "replace", "fsync dir"]


def test_a_failed_directory_fsync_is_not_durable(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(NotDurable, match="may not survive a power loss") as exc:
        write_regular_file(tmp_path / "f", b"x")
    assert isinstance(exc.value, OSError) and exc.value.reason == os.strerror(errno.EIO)
    assert os.listdir(tmp_path) == ["f"]  # replaced: only its durability is in doubt


# -------------------------------------------------------------------------------- the lock


def test_a_held_lock_is_refused_at_once_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with lock_file(path):
        with pytest.raises(LockHeld) as exc:
            lock_file(path)  # one holder, even within a process
        assert exc.value.holder == str(os.getpid())
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    lock_file(path).release()  # released on exit
    assert path.exists()  # never deleted: two processes must lock the same file


def test_a_symlinked_or_special_lock_file_is_refused(tmp_path: Path) -> None:
    _, link = _linked(tmp_path, b"")
    with pytest.raises(FileRefused) as exc:
        lock_file(link)
    assert exc.value.problem is Problem.SYMLINK
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileRefused, match="FIFO"):
        lock_file(tmp_path / "fifo")
    with pytest.raises(FileRefused):
        lock_file(tmp_path)  # a directory where a lock file should be


def test_a_directory_lock_writes_nothing_in_it(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    with lock_file(d, directory=True), pytest.raises(LockHeld) as exc:
        lock_file(d, directory=True)
    assert exc.value.holder == "" and os.listdir(d) == []
    (tmp_path / "link").symlink_to(d)
    with pytest.raises(FileRefused):
        lock_file(tmp_path / "link", directory=True)
    lock_file(tmp_path / "link", directory=True, follow_symlinks=True).release()
