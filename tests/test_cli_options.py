"""The options of every command are consistent: each says what it does in ``--help``, the baud rate
is ``--baudrate`` everywhere, ``--timeout`` is the wait for each answer wherever it is shown, and
``--help`` shows neither options a command ignores nor docstring markup."""

from __future__ import annotations

import argparse

import pytest

from idemlink.cli import build_parser


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


COMMANDS = subparsers()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help(name: str) -> None:
    missing = [a.option_strings or a.dest for a in COMMANDS[name]._actions
               if a.help is None or (isinstance(a.help, str) and not a.help.strip())]
    assert not missing, f"{name}: options without help: {missing}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_json(name: str) -> None:
    text = COMMANDS[name].format_help()
    assert "--json" in text and "schema idemlink." in text


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_baudrate_is_spelt_one_way(name: str) -> None:
    text = COMMANDS[name].format_help()
    assert "--baud " not in text and "--baud\n" not in text and "--baud," not in text
    options = {o for a in COMMANDS[name]._actions for o in a.option_strings}
    if "--port" in options and name != "ports":
        assert "--baudrate" in options, f"{name} opens a port without --baudrate"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_that_opens_a_port_takes_the_character_format(name: str) -> None:
    """--bytesize/--parity/--stopbits wherever a port is opened (link: its --a/--b sides)."""
    options = {o for a in COMMANDS[name]._actions for o in a.option_strings}
    if ({"--port", "--a"} & options) and name != "ports":
        assert {"--bytesize", "--parity", "--stopbits"} <= options, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_timeout_means_the_wait_for_each_answer(name: str) -> None:
    for action in COMMANDS[name]._actions:
        if "--timeout" in action.option_strings and action.help is not argparse.SUPPRESS:
            assert isinstance(action.help, str) and "each answer" in action.help, name


@pytest.mark.parametrize(("argv", "dest", "value"), [
    (["send", "--port", "loop://", "f", "--timeout", "7"], "start_timeout", 7.0),
    (["send", "--port", "loop://", "f", "--start-timeout", "7"], "start_timeout", 7.0),
    (["receive", "--port", "loop://", "--dir", ".", "--timeout", "7"], "idle_timeout", 7.0),
    (["send", "--port", "loop://", "f", "--baud", "9600"], "baudrate", 9600),
    (["receive", "--port", "loop://", "--dir", ".", "--baud", "9600"], "baudrate", 9600),
    (["link", "--baud", "9600"], "baudrate", 9600),
    (["link"], "baudrate", None),
    (["send", "--port", "loop://", "f"], "baudrate", 115200),
    (["soak", "--loss", "0.3"], "loss", 0.3),
    (["soak", "--frame-loss", "0.3"], "loss", 0.3),
    (["demo", "--dup", "0.3"], "dup", 0.3),
    (["demo", "--frame-dup", "0.3"], "dup", 0.3),
    (["link", "--corrupt", "0.3"], "corrupt", 0.3),
    (["link", "--byte-corrupt", "0.3"], "corrupt", 0.3),
])
def test_hidden_aliases_still_work(argv: list[str], dest: str, value: object) -> None:
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert "--timeout" not in COMMANDS["send"].format_help()
    assert "--timeout" not in COMMANDS["receive"].format_help()


@pytest.mark.parametrize("name", ["soak", "demo", "link"])
def test_fault_probabilities_name_their_unit(name: str) -> None:
    """``--loss`` was per frame in soak and per byte in link: each option now says which."""
    for action in COMMANDS[name]._actions:
        words = [o for o in action.option_strings if o.startswith("--")]
        if not any(w.endswith(("loss", "dup", "corrupt")) for w in words):
            continue
        if action.help == argparse.SUPPRESS:  # the older spelling, hidden
            assert words[0] in ("--loss", "--dup", "--corrupt"), words
            continue
        unit = "frame" if words[0].startswith("--frame-") else "byte"
        assert words[0].startswith(f"--{unit}-") and f"per {unit}" in (action.help or ""), words


def test_monitor_help_lists_only_what_it_uses() -> None:
    text = COMMANDS["monitor"].format_help()
    for ignored in ("--timeout", "--attempts", "--trace", "--ports-file", "--modbus-rtu"):
        assert ignored not in text


def test_link_help_is_plain_text() -> None:
    text = COMMANDS["link"].format_help()
    assert "``" not in text and "--a/--b" in text


def test_a_bad_flag_names_the_command_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["read", "--bogus"])
    assert exc.value.code == 2
    assert "usage: idemlink read" in capsys.readouterr().err


def test_link_monitor_with_json_writes_only_json_objects(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from idemlink.commands.link_cmd import _monitor_tap
    from idemlink.protocol.frame import FrameType, encode_frame
    from idemlink.protocol.regmap_file import DEFAULT_MAP

    tap = _monitor_tap(DEFAULT_MAP, as_json=True)
    tap("a->b", encode_frame(FrameType.REQUEST, 7, 0xABCD, bytes.fromhex("0300040001")), 1.5)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    doc = json.loads(out[0])
    assert (doc["schema"], doc["dir"], doc["type"], doc["seq"]) == (
        "idemlink.monitor/1", "a->b", "REQUEST", 7)


@pytest.mark.parametrize(("argv", "prog"), [
    (["write"], "idemlink write"),
    (["read", "--timeout", "x"], "idemlink read"),
    (["soak", "--commands", "x", "--json"], "idemlink soak"),
    ([], "idemlink"),
])
def test_a_usage_error_is_one_line(argv: list[str], prog: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from idemlink.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: ") and err.endswith(f"(usage: {prog} --help)\n"), err
