"""Usage as the docs state it: ``--version`` is an option of ``idemlink`` itself (text, or one
``idemlink.version/1`` object with ``--json``), and a malformed argument, such as an assignment
without ``=``, is a usage error: exit 2, one line, nothing sent."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_a_port_that_does_not_exist_is_named_once(capsys: pytest.CaptureFixture[str]) -> None:
    port = "/dev/nonexistent-idemlink"
    assert main(["read", "--port", port, "mode"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"idemlink read: cannot open {port}: No such file or directory"


def test_on_several_ports_each_line_names_its_port_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    ports = ["/dev/nonexistent-idemlink-a", "/dev/nonexistent-idemlink-b"]
    assert main(["read", "--port", ports[0], "--port", ports[1], "mode"]) == 1
    lines = capsys.readouterr().err.splitlines()
    for port in ports:
        [line] = [x for x in lines if x.startswith(f"{port}: ")]
        assert line.count(port) == 1, line


def test_ctrl_c_while_sim_opens_its_port_is_its_normal_end(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.commands import sim_cmd

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim_cmd, "run_framed", interrupted)
    assert main(["sim"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("saved", "hint"), [("pump-controller", "--regmap pump-controller"),
                                             ("chiller", "--regmap FILE, FILE being map chiller")])
def test_a_flash_dir_of_another_map_names_the_regmap_to_use(tmp_path: Path, saved: str,
                                                           hint: str) -> None:
    from idemlink.device_sim.flash import ConfigFlash, UnsafeFlashFileError

    (tmp_path / "map").write_text(f"{saved} 0123456789abcdef\n")
    with pytest.raises(UnsafeFlashFileError) as refused:
        ConfigFlash(tmp_path).claim_map("thermal-controller", "fedcba9876543210")
    assert hint in str(refused.value) and "another flash directory" in str(refused.value)


@pytest.mark.parametrize("argv", [
    ["receive", "--idle-timeout", "inf"], ["receive", "--idle-timeout", "nan"],
    ["receive", "--idle-timeout", "0"], ["send", "--turnaround-ms", "nan", "FILE"],
    ["send", "--turnaround-ms", "inf", "FILE"], ["send", "--turnaround-ms", "-1", "FILE"],
])
def test_non_finite_or_negative_ymodem_durations_are_one_line(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before the port is opened (it does not exist): one line, exit 1, no traceback."""
    from idemlink.cli import main

    (tmp_path / "f.bin").write_bytes(b"x")
    args = [a.replace("FILE", str(tmp_path / "f.bin")) for a in argv]
    extra = ["--dir", str(tmp_path)] if argv[0] == "receive" else ["--plain"]
    assert main([*args, "--port", str(tmp_path / "no-port"), *extra]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected" in err and "cannot open" not in err, err
