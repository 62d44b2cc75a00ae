"""Usage as the docs state it: ``--version`` is an option of ``idemlink`` itself (text, or one
``idemlink.version/1`` object with ``--json``), and a malformed argument, such as an assignment
without ``=``, is a usage error: exit 2, one line, nothing sent."""

from __future__ import annotations

import json

import pytest

from idemlink import __version__
from idemlink.cli import EXIT_USAGE, main


def test_version_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"idemlink {__version__}\n"


@pytest.mark.parametrize("argv", [["--version", "--json"], ["--json", "--version"]])
def test_version_as_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    assert json.loads(capsys.readouterr().out) == {"schema": "idemlink.version/1",
                                                   "version": __version__}


def test_version_after_the_command_says_where_it_goes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["read", "--port", "loop://", "--version"])
    assert stop.value.code == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "idemlink --version" in err[0]


@pytest.mark.parametrize("item", ["setpoint", "=42", "setpoint="])
def test_an_assignment_without_its_parts_is_a_usage_error(
        item: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["write", "--port", "/dev/nonexistent-idemlink", item])
    assert stop.value.code == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "expected NAME=VALUE" in err[0] and "usage:" in err[0]
