"""Connection settings a command's line leaves out: environment, profile, the map's ``[link]``,
defaults — in that order behind the command line (docs/CLI.md), each bad value one line and
never a traceback. (The files themselves: tests/test_link_profile.py.)"""

from __future__ import annotations

import json
import threading
from importlib import resources
from pathlib import Path

import pytest

from idemlink.cli import build_parser, main
from idemlink.commands.connection import ENV
from idemlink.protocol.link_profile import PROFILE_KEYS

THERMAL = resources.files("idemlink.protocol").joinpath("maps", "thermal-controller.toml")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests set what they need: none of the user's IDEMLINK_* variables leaks in."""
    for name in [*ENV.values(), "IDEMLINK_PROFILE"]:
        monkeypatch.delenv(name, raising=False)


def map_with_link(path: Path, link: str) -> Path:
    """The built-in thermal controller's map file with a ``[link]`` table."""
    path.write_text(THERMAL.read_text("utf-8") + "\n[link]\n" + link, encoding="utf-8")
    return path


def parse(*argv: str) -> object:
    return build_parser().parse_args(list(argv))


# ------------------------------------------------------------------------------ precedence


def test_defaults_8n1_for_idemlink_8e1_for_modbus_rtu() -> None:
    args = parse("read", "mode")
    assert (args.baudrate, args.bytesize, args.parity, args.stopbits) == (115200, 8, "N", 1)
    assert (args.timeout, args.attempts, args.modbus_rtu, args.unit, args.port) == (
        0.2, 5, False, None, None)
    args = parse("read", "--modbus-rtu", "mode")
    assert (args.parity, args.unit) == ("E", 1)
    assert set(args.settings_from.values()) == {"default", "command line"}


def test_each_source_wins_over_the_ones_below_it(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """command line > environment > profile > map's [link] > default, key by key."""
    regmap = map_with_link(tmp_path / "dev.toml", 'parity = "O"\nbaudrate = 9600\nstopbits = 2\n'
                                                  'timeout = 0.7\nattempts = 9\n')
    profile = tmp_path / "p.toml"
    profile.write_text('parity = "M"\nbaudrate = 19200\ntimeout = 0.5\nregmap = "dev.toml"\n')
    monkeypatch.setenv("IDEMLINK_PARITY", "s")
    monkeypatch.setenv("IDEMLINK_TIMEOUT", "0.3")
    args = parse("read", "--profile", str(profile), "--timeout", "0.1", "mode")
    assert args.regmap == str(regmap)  # the profile's, beside it
    assert (args.timeout, args.parity, args.baudrate, args.stopbits, args.attempts,
            args.bytesize) == (0.1, "S", 19200, 2, 9, 8)
    assert args.settings_from == {
        "regmap": str(profile), "timeout": "command line", "modbus_rtu": "default",
        "port": "default", "baudrate": str(profile), "bytesize": "default",
        "parity": "IDEMLINK_PARITY", "stopbits": f"{regmap} [link]",
        "attempts": f"{regmap} [link]", "modbus_tcp": "default"}


def test_the_profile_can_come_from_the_environment(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"port": "/dev/ttyUSB7", "modbus_rtu": True, "unit": 3}))
    monkeypatch.setenv("IDEMLINK_PROFILE", str(profile))
    args = parse("read", "mode")
    assert (args.port, args.ports, args.modbus_rtu, args.unit, args.parity) == (
        "/dev/ttyUSB7", ["/dev/ttyUSB7"], True, 3, "E")
    assert parse("read", "--port", "loop://", "mode").ports == ["loop://"]  # the line wins
    assert parse("read", "--ports-file", "f", "mode").port is None  # so does a ports file


def test_a_unit_counts_only_for_modbus_rtu(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit from the environment, a profile or a map waits for ``modbus_rtu`` (from any
    source); one on the command line without it stays an error (exit 1, one line)."""
    monkeypatch.setenv("IDEMLINK_UNIT", "9")
    assert parse("read", "mode").unit is None
    assert parse("read", "--modbus-rtu", "mode").unit == 9
    regmap = map_with_link(tmp_path / "dev.toml", "modbus_rtu = true\nunit = 4\n")
    monkeypatch.delenv("IDEMLINK_UNIT")
    args = parse("read", "--regmap", str(regmap), "mode")
    assert (args.modbus_rtu, args.unit, args.parity) == (True, 4, "E")


def test_send_and_receive_still_need_a_port_from_somewhere(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("receive", "--dir", ".")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "required: --port (or IDEMLINK_PORT" in err, err
    monkeypatch.setenv("IDEMLINK_PORT", "loop://")
    assert parse("receive", "--dir", ".").port == "loop://"


def test_sim_never_takes_its_port_from_a_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator serves a new pty unless --port says otherwise: IDEMLINK_PORT names the
    device a host should open, not where a simulator should serve."""
    monkeypatch.setenv("IDEMLINK_PORT", "/dev/ttyUSB0")
    monkeypatch.setenv("IDEMLINK_MODBUS_RTU", "yes")
    monkeypatch.setenv("IDEMLINK_PARITY", "o")
    args = parse("sim")
    assert args.port is None and args.modbus_rtu is True and args.parity == "O"


def test_a_map_link_serves_and_drives_the_same_line(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``sim`` and ``read`` given the same map agree on what its [link] says: a Modbus RTU
    slave at unit 3 — each side from the map alone."""
    from idemlink.commands import sim_cmd
    from idemlink.device_sim.pty import open_pty

    regmap = map_with_link(tmp_path / "dev.toml", "modbus_rtu = true\nunit = 3\n")
    pair = open_pty()
    stop = threading.Event()
    served: list[object] = []

    def serve(args: object, serve_fn: object) -> int:
        served.append(serve_fn.func.__self__)  # type: ignore[attr-defined]
        serve_fn(pair.transport(), stop)  # type: ignore[operator]
        return 0

    monkeypatch.setattr(sim_cmd, "_serve_until_signal", serve)
    args = parse("sim", "--regmap", str(regmap))
    th = threading.Thread(target=args.handler, args=(args,), daemon=True)
    th.start()
    try:
        rc = main(["read", "--port", pair.slave_path, "--regmap", str(regmap), "mode",
                   "--timeout", "0.2"])
    finally:
        stop.set()
        th.join(5)
        pair.close()
    assert rc == 0
    assert served and served[0].unit == 3  # type: ignore[attr-defined]


# -------------------------------------------------------------------- bad values, one line


@pytest.mark.parametrize(("name", "value", "says"), [
    ("IDEMLINK_PARITY", "X", "IDEMLINK_PARITY='X': parity: 'X': one of N (none)"),
    ("IDEMLINK_BAUDRATE", "fast", "IDEMLINK_BAUDRATE='fast': baudrate: 'fast' is not an integer"),
    ("IDEMLINK_UNIT", "0", "IDEMLINK_UNIT='0': unit: '0': a Modbus unit id is 1..247"),
    ("IDEMLINK_TIMEOUT", "nan", "IDEMLINK_TIMEOUT='nan': timeout: 'nan': expected seconds"),
    ("IDEMLINK_MODBUS_RTU", "maybe", "IDEMLINK_MODBUS_RTU='maybe': modbus_rtu: 'maybe': true or"),
    ("IDEMLINK_STOPBITS", "3", "IDEMLINK_STOPBITS='3': stopbits: '3': stop bits are one of"),
])
def test_a_bad_environment_variable_is_a_usage_error(
        name: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        main(["read", "mode", "--json"])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"idemlink read: error: {says}"), err
    assert "Traceback" not in err
    doc = json.loads(out)
    assert (doc["schema"], doc["command"], doc["exit"]) == ("idemlink.error/1", "read", 2)


def test_a_variable_the_command_line_overrides_is_not_even_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEMLINK_PARITY", "X")
    assert parse("read", "--parity", "E", "mode").parity == "E"


@pytest.mark.parametrize(("text", "says"), [
    ('unit = 300\nmodbus_rtu = true\n', "unit: 300: a Modbus unit id is 1..247"),
    ('parity = "X"\n', "parity: 'X': one of N (none)"),
    ('baudrate = "9600"\n', "baudrate: '9600' is not an integer"),
    ('bytesize = 9\n', "bytesize: 9: data bits are one of 5, 6, 7, 8"),
    ('attempts = 0\n', "attempts: 0: sends per command, an integer >= 1"),
    ('modbus_rtu = "yes"\n', "modbus_rtu: 'yes': true or false"),
    ('speed = 9600\n', "unknown setting(s) ['speed']; settings are port, baudrate"),
    ('parity = \n', "not valid TOML"),
])
def test_a_bad_profile_is_one_line_exit_1(text: str, says: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["read", "--profile", str(profile), "mode"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"idemlink read: {profile}: "), err
    assert says in err, err


def test_a_missing_profile_named_by_the_environment_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("IDEMLINK_PROFILE", str(tmp_path / "nowhere.toml"))
    with pytest.raises(SystemExit) as exc:
        main(["watch", "mode", "--json"])
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert "cannot read the profile: No such file or directory (named by $IDEMLINK_PROFILE)" in err
    assert json.loads(out)["exit"] == 1


@pytest.mark.parametrize(("link", "says"), [
    ('parity = "Q"\n', "[link]: parity: 'Q'"),
    ('regmap = "other.toml"\n', "[link]: regmap: a map's link cannot name a map"),
    ('port = 7\n', "[link]: port: 7: need a non-empty path"),
])
def test_a_bad_map_link_is_one_line_exit_1(link: str, says: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    regmap = map_with_link(tmp_path / "dev.toml", link)
    with pytest.raises(SystemExit) as exc:
        main(["read", "--regmap", str(regmap), "mode"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{regmap} {says}" in err, err


def test_every_key_has_its_variable_and_one_rule() -> None:
    assert [ENV[k] for k in PROFILE_KEYS] == [
        "IDEMLINK_PORT", "IDEMLINK_BAUDRATE", "IDEMLINK_BYTESIZE", "IDEMLINK_PARITY",
        "IDEMLINK_STOPBITS", "IDEMLINK_UNIT", "IDEMLINK_TIMEOUT", "IDEMLINK_ATTEMPTS",
        "IDEMLINK_MODBUS_RTU", "IDEMLINK_REGMAP", "IDEMLINK_MODBUS_TCP"]
    doc = (Path(__file__).resolve().parent.parent / "docs" / "CLI.md").read_text("utf-8")
    assert all(f"`{name}`" in doc for name in ENV.values())
