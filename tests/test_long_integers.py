"""An integer too long for Python to convert (more than 4300 digits) in a file a person wrote is
refused naming the field (or the line and key in TOML), in one line, never with Python's advice
to call ``sys.set_int_max_str_digits()`` and never as a traceback: register maps (TOML and JSON),
plans, receipt journals, the soak's map and effects records (config.json: the shared vectors of
``tests/test_flash_dir_rules.py``). The rule holds whatever limit the process set."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.host import journal_format
from idemlink.oracle import MapTruth, OracleError, parse_effects_line
from idemlink.protocol.long_integers import (
    LongIntegerError,
    TooLong,
    json_int,
    load_json,
    load_toml,
    max_digits,
)
from idemlink.protocol.outcome import IdemlinkError
from idemlink.protocol.regmap_file import RegmapFileError, load_regmap, parse_regmap

LONG = "9" * 5000
ADVICE = "set_int_max_str_digits"

MAP_TOML = f"""name = "big"
[[registers]]
address = 0
name = "generation"
kind = "generation"

[[registers]]
address = 1
name = "speed"
kind = "holding"
max = {LONG}
"""
MAP_JSON = json.dumps({"name": "big", "registers": [
    {"address": 0, "name": "generation", "kind": "generation"},
    {"address": 1, "name": "speed", "kind": "holding", "max": 0}]}).replace('"max": 0',
                                                                           f'"max": {LONG}')


@pytest.fixture
def int_limit() -> Iterator[None]:
    """Restore the process's integer conversion limit after a test changes it."""
    before = sys.get_int_max_str_digits()
    yield
    sys.set_int_max_str_digits(before)


def test_json_names_the_field() -> None:
    text = '{"a": [1, 2, {"b": [0, ' + "9" * 4301 + ']}], "z": -' + LONG + "}"
    with pytest.raises(LongIntegerError) as err:
        load_json(text)
    assert str(err.value) == "a[2].b[1]: integer too long (4301 digits, more than 4300)"
    assert isinstance(err.value, IdemlinkError) and isinstance(err.value, ValueError)
    assert load_json('{"n": -' + "9" * 4300 + "}")["n"] == -int("9" * 4300)  # at the bound
    assert json_int(LONG) == TooLong(5000)


@pytest.mark.parametrize(("line", "where"), [
    (f"max = {LONG}", "line 1: max"),
    (f"max = -{LONG}", "line 1: max"),
    (f"max = +{'9_' * 4400}9", "line 1: max"),
    (f'labels = {{ off = 0, on = {LONG} }}', "line 1: on"),
    (f"values = [1, {LONG}]", "line 1: values"),
    (f'"quoted key" = {LONG}', "line 1: quoted key"),
])
def test_toml_names_the_line_and_key(line: str, where: str) -> None:
    with pytest.raises(LongIntegerError, match=f"^{where}: integer too long") as err:
        load_toml(line + "\n")
    assert ADVICE not in str(err.value)


def test_toml_in_a_multi_line_array_names_the_line() -> None:
    with pytest.raises(LongIntegerError, match=r"^line 3: integer too long"):
        load_toml(f"values = [\n  1,\n  {LONG},\n]\n")


def test_the_rule_holds_whatever_the_process_allows(int_limit: None) -> None:
    sys.set_int_max_str_digits(0)  # unlimited: tomllib converts it, the rule still refuses it
    with pytest.raises(LongIntegerError, match=r"^max: integer too long \(more than 4300"):
        load_toml(f"max = {LONG}\n")
    with pytest.raises(LongIntegerError, match=r"^max: integer too long \(5000 digits"):
        load_json(f'{{"max": {LONG}}}')
    sys.set_int_max_str_digits(640)  # a lower limit: that one is the bound
    assert max_digits() == 640
    with pytest.raises(LongIntegerError, match=r"^line 1: max: integer too long \(700 digits, "
                                               r"more than 640\)"):
        load_toml(f"max = {'9' * 700}\n")
    with pytest.raises(LongIntegerError, match=r"^max: integer too long \(700 digits"):
        load_json(f'{{"max": {"9" * 700}}}')


# ------------------------------------------------------------------------ register map files


@pytest.mark.parametrize(("name", "text", "where"), [
    ("big.toml", MAP_TOML, "big.toml: line 11: max: integer too long (5000 digits, more than "
                           "4300)"),
    ("big.json", MAP_JSON, "big.json: registers[1].max: integer too long (5000 digits, more than "
                           "4300)"),
])
def test_a_map_file_says_which_field(name: str, text: str, where: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RegmapFileError) as err:
        parse_regmap(text, source=name, fmt=name.rsplit(".", 1)[1])
    assert str(err.value) == where
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(RegmapFileError, match="integer too long"):
        load_regmap(path)
    main(["regmap", str(path), "--check"])
    out = capsys.readouterr()
    said = (out.out + out.err).strip()
    assert said.count("\n") == 0 and "integer too long" in said, said
    assert ADVICE not in said and "Traceback" not in said


def test_a_device_command_with_such_a_map_says_it_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_text(MAP_TOML)
    proc = subprocess.run([sys.executable, "-m", "idemlink", "read", "--port", "/dev/null",
                           "--regmap", str(path), "speed"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1, proc
    assert proc.stderr.count("\n") == 1 and "line 11: max: integer too long" in proc.stderr
    assert ADVICE not in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------- plans


def test_a_plan_says_which_step_and_register(tmp_path: Path) -> None:
    """It was a traceback: ``json.loads`` raised a plain ValueError, not a JSONDecodeError."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"steps": [{"write": {"mode": 1}}, {"write": {"threshold": ' + LONG + "}}]}")
    proc = subprocess.run([sys.executable, "-m", "idemlink", "apply", "--port", "/dev/null",
                           str(plan)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr == (f"idemlink apply: plan {plan}: steps[1].write.threshold: integer too "
                           "long (5000 digits, more than 4300)\n")
    assert not (tmp_path / "plan.json.journal").exists()


# ---------------------------------------------------------------------------------- journals


@pytest.mark.parametrize("decode", [journal_format.decode, journal_format.decode_keyed])
def test_a_journal_says_which_field(decode: object) -> None:
    assert callable(decode)
    for text, field in ((f'{{"format": "idemlink.receipt-journal", "version": {LONG}}}\n',
                         "version"),
                        ('{"format": "idemlink.receipt-journal", "version": 1, "done": [], '
                         f'"pending": [], "note": [{LONG}]}}\n', "note[0]")):
        with pytest.raises(journal_format.JournalCorruptError) as err:
            decode(text.encode(), "receipts.json")
        message = str(err.value)
        assert f"{field}: integer too long (5000 digits" in message and ADVICE not in message


# --------------------------------------------------------------------- the soak's own readers


def test_the_soak_oracle_says_which_field() -> None:
    with pytest.raises(OracleError, match="epoch: integer too long") as err:
        parse_effects_line(f'{{"epoch": {LONG}, "seq": 1, "request": "", "response": "", '
                           '"time": 0}')
    assert ADVICE not in str(err.value)
    with pytest.raises(OracleError, match="line 11: max: integer too long"):
        MapTruth.parse(MAP_TOML)
    with pytest.raises(OracleError, match=r"registers\[1\].max: integer too long"):
        MapTruth.parse(MAP_JSON, fmt="json")
