"""The committed generated artifacts match the Python declarations, and drift is caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from idemlink.cli import main
from idemlink.protocol import contract

ROOT = Path(__file__).resolve().parent.parent


def test_committed_artifacts_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "--check", "--root", str(ROOT)]) == 0


def test_check_names_the_drifted_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rel in contract.render_all():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert main(["contract", "--check", "--root", str(tmp_path)]) == 0
    header = tmp_path / contract.HEADER_PATH
    header.write_text(header.read_text().replace("IDL_MAX_PAYLOAD 512u", "IDL_MAX_PAYLOAD 511u"))
    capsys.readouterr()
    assert main(["contract", "--check", "--root", str(tmp_path)]) == 6
    out = capsys.readouterr().out
    assert contract.HEADER_PATH in out and contract.PROTOCOL_MD_PATH not in out


def test_changing_a_declared_constant_without_regenerating_is_caught(tmp_path: Path) -> None:
    # A copy of the repository with one constant edited in the Python declaration and the
    # generated files left alone: the check must fail and name the drifted files.
    # idemlink/ holds the installed layout (idemlink/protocol -> ../protocol, ...): copied with
    # its links followed and first on PYTHONPATH, the copy, not the editable install, runs.
    pkg = tmp_path / "site" / "idemlink"
    shutil.copytree(ROOT / "idemlink", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in [*contract.render_all(), "pyproject.toml"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    src = pkg / "protocol" / "frame.py"
    text = src.read_text()
    assert "MAX_PAYLOAD = 512\n" in text
    src.write_text(text.replace("MAX_PAYLOAD = 512\n", "MAX_PAYLOAD = 600\n"))
    r = subprocess.run(
        [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())",
         "contract", "--check", "--root", str(tmp_path)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 6, r.stdout + r.stderr
    assert contract.HEADER_PATH in r.stdout and contract.PROTOCOL_MD_PATH in r.stdout


def test_header_compiles_as_c99(tmp_path: Path) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "t.c"
    src.write_text('#include "idemlink_proto.h"\nint main(void){return IDL_HEADER_LEN == 13u ? 0 : 1;}\n')
    r = subprocess.run(
        [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic",
         "-I", str(ROOT / "firmware_ref" / "include"), str(src), "-o", str(tmp_path / "t")],
        capture_output=True, text=True, check=False,
    )
    assert r.returncode == 0, r.stderr
    assert subprocess.run([str(tmp_path / "t")], check=False).returncode == 0


def test_contract_hash_changes_with_the_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    before = contract.contract_hash()
    import idemlink.protocol.frame as frame

    monkeypatch.setattr(frame, "MAX_PAYLOAD", 256)
    assert contract.contract_hash() != before


def test_host_local_statuses_added_later_leave_the_contract_hash_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host-local status added after the first devices were built (ANSWER_MISMATCH) never
    travels: adding it must not make those devices incompatible, so the hash is the one they
    carry (44d2f2230a344059, the committed header's since before it). A wire status, or one of
    the local statuses hashed from the start, does change the hash."""
    from idemlink.protocol import outcome

    before = contract.contract_hash()
    assert before.hex() == "44d2f2230a344059"
    first = {s: i for s, i in outcome.STATUS_TABLE.items()
             if s < outcome.FIRST_LOCAL_STATUS or s in outcome.HASHED_LOCAL_STATUSES}
    monkeypatch.setattr(outcome, "STATUS_TABLE", first)
    assert contract.contract_hash() == before
    del first[outcome.Status.BUSY]
    assert contract.contract_hash() != before


def test_the_addressed_and_authenticated_revision_leaves_the_contract_hash_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issues 22 and 23's revision (ADDRESSED and AUTH_LONG, the address byte, the MAC, the
    status AUTHENTICATION_REQUIRED, HELLO_REPLY's capabilities) is declared ``additive``: every
    device built before it keeps its hash, 44d2f2230a344059. Taking the additions away changes
    nothing; a member of the first contract's tables still does."""
    from idemlink.protocol import outcome

    before = contract.contract_hash()
    assert before.hex() == "44d2f2230a344059"
    without = {s: i for s, i in outcome.STATUS_TABLE.items()
               if s not in outcome.ADDITIVE_WIRE_STATUSES}
    monkeypatch.setattr(outcome, "STATUS_TABLE", without)
    assert contract.contract_hash() == before
    import idemlink.protocol.frame as frame

    monkeypatch.setattr(frame, "FIRST_CONTRACT_FLAGS", (frame.Flags.RETRANSMIT, frame.Flags.REPLAY))
    assert contract.contract_hash() != before


def test_additive_entries_are_no_member_of_the_hashed_data() -> None:
    """A section's ``additive`` part may name a table of its ``data`` (flags, status) with the
    members added since, never a member already hashed: one member, one place."""
    for sec in contract.sections():
        for key, added in sec.additive.items():
            hashed = sec.data.get(key)
            if hashed is None:
                continue
            assert isinstance(hashed, dict) and isinstance(added, dict), (sec.name, key)
            assert not set(hashed) & set(added), (sec.name, key)
            values = {json.dumps(v) for v in hashed.values()}
            assert not values & {json.dumps(v) for v in added.values()}, (sec.name, key)


def test_the_c_trigger_tables_are_generated_from_the_python_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``idl_tables.h`` is rendered from ``device_core.TRIGGER_TABLE`` (a changed row changes the
    C table, which ``--check`` then finds stale), and the contract's hash does not cover it."""
    from idemlink.protocol import device_core
    from idemlink.protocol.device_core import TriggerAction, TriggerEvent
    from idemlink.protocol.registers import TriggerState, TriggerStatus

    before, digest = contract.render_tables(), contract.contract_hash()
    assert "/* DONE    */ { IDL_TRIGGER_IDLE, IDL_TRIGGER_DONE }" in before
    table = dict(device_core.TRIGGER_TABLE)
    table[(TriggerState.DONE, TriggerEvent.WRITE_1)] = (
        TriggerState.RUNNING, TriggerAction.START, TriggerStatus.ACCEPTED)
    monkeypatch.setattr(device_core, "TRIGGER_TABLE", table)
    after = contract.render_tables()
    assert "/* DONE    */ { IDL_TRIGGER_IDLE, IDL_TRIGGER_RUNNING }" in after
    assert "/* DONE    */ { IDL_TRIGGER_STATUS_ACCEPTED, IDL_TRIGGER_STATUS_ACCEPTED }" in after
    assert contract.contract_hash() == digest


def test_the_c_ymodem_table_is_generated_from_the_python_transitions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from idemlink.protocol import ymodem_tables
    from idemlink.protocol.ymodem_tables import RxAction, RxIn, RxState

    first = "{ E(1, A_ACCEPT_HEADER), E(6, A_REFUSE_HEADER), E(5, A_END_BATCH), X,"
    assert first in contract.render_tables()
    table = dict(ymodem_tables.RX_TRANSITIONS)
    table[(RxState.WAIT_HEADER, RxIn.HEADER)] = (RxState.ABORTED, RxAction.CANCEL_SEQUENCE)
    monkeypatch.setattr(ymodem_tables, "RX_TRANSITIONS", table)
    assert "{ E(6, A_CANCEL_SEQUENCE), E(6, A_REFUSE_HEADER)," in contract.render_tables()


def test_rendering_a_map_with_coils_says_the_c_core_does_not_serve_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The C core's table is the 16-bit register space only: a user map with coils, discrete
    inputs or mask_write renders fine, and ``contract --regmap`` says in one line each what the C
    device will answer 01 for, where the simulator serves it; a map without them, nothing."""
    generation = '[[registers]]\naddress = 0\nname = "generation"\nkind = "generation"\n'
    base = 'name = "bits"\n' + generation
    bits = ('name = "bits"\nmask_write = true\n' + generation
            + '[[registers]]\naddress = 0\nname = "pump"\nkind = "coil"\n'
            + '[[registers]]\naddress = 0\nname = "door"\nkind = "discrete_input"\n')
    for text, notes in ((base, 0), (bits, 3)):
        (tmp_path / "m.toml").write_text(text, encoding="utf-8")
        assert main(["contract", "--regmap", str(tmp_path / "m.toml"), "--out",
                     str(tmp_path / "out")]) == 0
        err = capsys.readouterr().err.splitlines()
        assert len(err) == notes and all(
            line.startswith("idemlink contract: note: the C device core serves no ")
            for line in err), err
    assert "coils (pump): FC01, FC05 and FC15 answer exception 01" in err[0]
    assert "discrete inputs (door): FC02" in err[1] and "mask write: FC22" in err[2]
