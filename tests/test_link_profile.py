"""Connection profiles and a map's ``[link]`` as files (``idemlink.protocol.link_profile``): read,
checked key by key, relative paths resolved, and a map's ``[link]`` kept outside its register
contract — the same map, the same hash, left out of ``regmap --json``, checked by ``regmap
--check``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.protocol.link_profile import ProfileError, load_profile, map_link
from idemlink.protocol.regmap_file import load_regmap

THERMAL = resources.files("idemlink.protocol").joinpath("maps", "thermal-controller.toml")


def map_with_link(path: Path, link: str) -> Path:
    """The built-in thermal controller's map file with a ``[link]`` table."""
    path.write_text(THERMAL.read_text("utf-8") + "\n[link]\n" + link, encoding="utf-8")
    return path


# ------------------------------------------------------- the link is not the map's contract


def test_a_map_link_changes_neither_the_map_nor_its_hash(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain.toml"
    plain.write_text(THERMAL.read_text("utf-8"), encoding="utf-8")
    linked = map_with_link(tmp_path / "linked.toml", 'parity = "E"\nbaudrate = 19200\n')
    assert load_regmap(linked) == load_regmap(plain)
    assert load_regmap(linked).hash == load_regmap(plain).hash
    link = map_link(linked)
    assert link is not None and dict(link.values) == {"parity": "E", "baudrate": 19200}
    assert map_link(plain) is None
    assert main(["regmap", str(linked), "--json"]) == 0
    assert "link" not in json.loads(capsys.readouterr().out)
    json_map = tmp_path / "linked.json"
    assert main(["regmap", str(plain), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    json_map.write_text(json.dumps({**doc, "link": {"parity": "E"}}))
    assert load_regmap(json_map).hash == load_regmap(plain).hash  # the "hash" field still checks
    link = map_link(json_map)
    assert link is not None and dict(link.values) == {"parity": "E"}


def test_a_profile_regmap_is_relative_to_the_profile_but_a_builtin_name_stays_a_name(
        tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    p = tmp_path / "sub" / "p.toml"
    p.write_text('regmap = "dev.toml"\n')
    assert load_profile(p).values["regmap"] == str(tmp_path / "sub" / "dev.toml")
    p.write_text('regmap = "pump-controller"\n')
    assert load_profile(p).values["regmap"] == "pump-controller"
    p.write_text('regmap = "/abs/dev.toml"\n')
    assert load_profile(p).values["regmap"] == "/abs/dev.toml"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(p)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    import os

    path = tmp_path / "fifo.toml"
    os.mkfifo(path)
    yield path


def test_a_profile_that_is_no_regular_file_is_refused_without_hanging(fifo: Path) -> None:
    with pytest.raises(ProfileError, match="a FIFO; a profile is a regular file"):
        load_profile(fifo)


def test_regmap_check_refuses_a_map_whose_link_a_command_would_refuse(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = map_with_link(tmp_path / "good.toml", 'parity = "E"\n')
    assert main(["regmap", "--check", str(good)]) == 0
    assert capsys.readouterr().out.startswith("ok: thermal-controller")
    bad = map_with_link(tmp_path / "bad.toml", "stopbits = 3\n")
    assert main(["regmap", "--check", str(bad)]) == 6
    assert capsys.readouterr().out.strip() == (
        f"invalid: {bad} [link]: stopbits: 3: stop bits are one of 1, 1.5, 2")


def test_an_integer_too_long_is_named_not_pythons_advice(tmp_path: Path) -> None:
    """As in a map (protocol/long_integers.py): the key and line, not
    sys.set_int_max_str_digits()."""
    p = tmp_path / "p.toml"
    p.write_text('port = "/dev/ttyUSB0"\nbaudrate = ' + "9" * 5000 + "\n")
    with pytest.raises(ProfileError) as exc:
        load_profile(p)
    assert str(exc.value).startswith(f"{p}: line 2: baudrate: integer too long (5000 digits")
    assert "set_int_max_str_digits" not in str(exc.value)
    j = tmp_path / "p.json"
    j.write_text('{"unit": ' + "1" * 5000 + "}")
    with pytest.raises(ProfileError, match=r"unit: integer too long \(5000 digits"):
        load_profile(j)
    linked = map_with_link(tmp_path / "dev.toml", "unit = " + "2" * 5000 + "\n")
    with pytest.raises(Exception, match="integer too long"):
        load_regmap(linked)  # the map loader names it first; map_link would too
