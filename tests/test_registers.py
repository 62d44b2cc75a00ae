"""The register-map schema: it refuses non-idempotent kinds, validates the map whole, and the
default map (and its contract/JSON forms) covers every kind."""

from __future__ import annotations

import json

import pytest

from idemlink.cli import main
from idemlink.protocol.registers import (
    CoreKind,
    FaultBit,
    RegisterKind,
    RegisterSchemaError,
    RegisterSpec,
    TriggerStatus,
    contract_section,
    make_map,
    map_defines,
    map_markdown,
    register,
)
from idemlink.protocol.regmap_file import DEFAULT_MAP


@pytest.mark.parametrize("kind", ["increment", "INCREMENT", "decrement", "toggle",
                                  "read-to-clear", "read_to_clear", "pulse", "counter", ""])
def test_schema_refuses_non_idempotent_kinds(kind: str) -> None:
    with pytest.raises(RegisterSchemaError):
        register(10, "x", kind)


@pytest.mark.parametrize("option", ["clear_on_read", "increment", "toggle", "on_read", "step"])
def test_schema_refuses_behaviour_options(option: str) -> None:
    with pytest.raises(RegisterSchemaError, match="unknown register option"):
        register(10, "x", "holding", **{option: True})


def test_there_are_exactly_eight_kinds_and_the_contract_knows_five() -> None:
    assert {k.name for k in RegisterKind} == {"INPUT", "HOLDING", "FAULT", "TRIGGER",
                                              "GENERATION", "COIL", "DISCRETE_INPUT", "COMMAND"}
    # the framed device's register table (C enum, contract hash) is the five it always was:
    # coils and discrete inputs live in Modbus tables of their own, on the RTU path; a plain
    # device's COMMAND register is served by the Modbus RTU simulator only
    assert {k.name: k.value for k in CoreKind} == {
        "INPUT": 0, "HOLDING": 1, "FAULT": 2, "TRIGGER": 3, "GENERATION": 4}
    assert all(RegisterKind[k.name].value == k.value for k in CoreKind)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: register(0x10000, "x", "input"),
        lambda: register(-1, "x", "input"),
        lambda: register(1, "Bad-Name", "input"),
        lambda: register(1, "x", "holding", minimum=10, maximum=5),
        lambda: register(1, "x", "holding", minimum=0, maximum=5, default=6),
        lambda: register(1, "x", "holding", maximum=0x10000),
        lambda: register(1, "x", "fault"),  # no bits
        lambda: register(1, "x", "fault", bits=(FaultBit(16, "b"),)),
        lambda: register(1, "x", "fault", bits=(FaultBit(1, "a"), FaultBit(1, "b"))),
        lambda: register(1, "x", "holding", bits=(FaultBit(1, "a"),)),
        lambda: register(1, "x", "trigger", default=1),
    ],
)
def test_bad_specs_are_refused(bad: object) -> None:
    with pytest.raises(RegisterSchemaError):
        bad()  # type: ignore[operator]


def test_map_validation() -> None:
    gen = register(0, "gen", "generation")
    with pytest.raises(RegisterSchemaError, match="twice"):
        make_map([gen, register(0, "a", "input")])
    with pytest.raises(RegisterSchemaError, match="twice"):
        make_map([gen, register(1, "gen", "input")])
    assert make_map([register(1, "a", "input")]).generation is None  # a third-party device
    with pytest.raises(RegisterSchemaError, match="at most one GENERATION"):
        make_map([gen, register(1, "gen2", "generation")])


def test_default_map_covers_every_core_kind_and_is_contiguous() -> None:
    kinds = {r.kind for r in DEFAULT_MAP}
    assert {k.value for k in kinds} == {k.value for k in CoreKind}
    assert [r.address for r in DEFAULT_MAP] == list(range(len(DEFAULT_MAP)))
    assert DEFAULT_MAP.named("threshold").kind is RegisterKind.HOLDING
    assert DEFAULT_MAP.generation is not None and DEFAULT_MAP.generation.name == "generation"
    assert {b.name for b in DEFAULT_MAP.named("faults").bits} >= {
        "over_temperature", "sensor_fault", "fan_stall"}


def test_map_defines_declare_addresses_limits_bits_and_labels() -> None:
    defines = {d.name: d.value for d in map_defines(DEFAULT_MAP.registers)}
    assert defines["IDL_REG_THRESHOLD"] == "0x0004u"
    assert defines["IDL_REG_THRESHOLD_MAX"] == "1000u"
    assert defines["IDL_FAULT_FAN_STALL"] == "(1u << 2)"
    assert defines["IDL_REG_MODE_MANUAL"] == "2u"
    assert "| 0x0008 | self_clean | TRIGGER |" in map_markdown(DEFAULT_MAP)


def test_protocol_section_declares_kinds_and_trigger_codes_not_a_map() -> None:
    sec = contract_section()
    defines = {d.name: d.value for d in sec.defines}
    assert not any(n.startswith("IDL_REG_") for n in defines)
    codes = {n[len("IDL_TRIGGER_STATUS_"):]: v for n, v in defines.items()
             if n.startswith("IDL_TRIGGER_STATUS_")}
    assert codes == {"ACCEPTED": "0x0000u", "RUNNING": "0x0101u", "DONE": "0x0102u",
                     "ABNORMAL_STATE": "0xFF00u", "ILLEGAL_VALUE": "0xFF01u"}
    kinds = {e.type_name: {m.name: int(m.value) for m in e.members} for e in sec.enums}
    assert kinds["idl_trigger_state_t"] == {"IDLE": 0, "RUNNING": 1, "DONE": 2}
    json.dumps(sec.data)  # serialisable, feeds the contract hash
    assert sec.data["trigger_status"]["RUNNING"] == 0x0101
    assert int(TriggerStatus.RUNNING) == 0x0101


def test_regmap_json_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regmap", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema"], doc["name"]) == ("idemlink.regmap/1", "thermal-controller")
    rows = doc["registers"]
    by_name = {r["name"]: r for r in rows}
    assert by_name["threshold"] == {"address": 4, "name": "threshold", "kind": "holding",
                                    "unit": "°C", "description": "over-temperature threshold",
                                    "min": 0, "max": 1000, "default": 350, "scale": "0.1",
                                    "persist": True}
    assert by_name["temperature"]["default"] == 250  # an input's simulated reading
    assert by_name["mode"]["labels"] == {"off": 0, "auto": 1, "manual": 2}
    assert by_name["faults"]["bits"][0] == {"bit": 0, "name": "over_temperature",
                                            "description": "temperature above threshold"}
    assert {r["kind"] for r in rows} == {"input", "holding", "fault", "trigger", "generation"}


def test_regmap_table_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regmap"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("thermal-controller (hash ")
    assert lines[1].split() == ["address", "name", "kind", "min", "max", "default", "scale",
                                "unit", "values"]
    assert lines[6].split()[:8] == ["0x0004", "threshold", "holding", "0", "1000", "350", "0.1",
                                    "°C"]


def test_spec_writability() -> None:
    assert not RegisterSpec(0, "a", RegisterKind.INPUT).writable
    assert not RegisterSpec(0, "g", RegisterKind.GENERATION).writable
    assert RegisterSpec(0, "h", RegisterKind.HOLDING).writable
