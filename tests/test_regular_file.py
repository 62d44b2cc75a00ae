"""``idemlink.protocol.regular_file.read_regular_file``: the one rule for reading a small regular
file by name (journal, flash, map file, plan), each refusal typed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idemlink.protocol.regular_file import FileRefused, Problem, kind_of, read_regular_file


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


def test_a_symlink_is_refused_unless_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"ok")
    link = tmp_path / "link"
    link.symlink_to(real)
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
