"""Receipt journal and content-derived keys.

Covers: key derivation (golden values recomputed by hand from the documented byte layout, prefix
code / injectivity by hypothesis), every journal refusal (limits, malformed and duplicate ids,
symlink, FIFO, directory, socket, device, permissions, corrupt content), file mode 0600 under any
umask, atomic replacement against a concurrent reader in another process, the step state table,
the runner's UNKNOWN handling, and kill-and-restart: a subprocess killed with SIGKILL at seeded
random moments, restarted until done, every side effect exactly once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from idemlink.host import journal as J
from idemlink.host import journal_file as JL
from idemlink.host import journal_format as JF
from idemlink.host.keys import (
    KeyFieldError,
    KeySource,
    MalformedKeyError,
    encode_fields,
    parse_key,
    source_namespace,
    step_key,
)
from idemlink.protocol.outcome import Outcome

# ------------------------------------------------------------------------------------ helpers


def u(n: int) -> uuid.UUID:
    """A deterministic distinct UUID per n (not derived by the code under test)."""
    return uuid.UUID(int=(0x1234 << 112) | n)


@dataclass(frozen=True)
class Step:
    key: uuid.UUID
    name: str = ""


class Recorder:
    """An ``execute`` that records the keys it ran and answers OK unless told otherwise."""

    def __init__(
        self, calls: list[uuid.UUID] | None = None, outcomes: dict[uuid.UUID, Outcome] | None = None
    ) -> None:
        self.calls: list[uuid.UUID] = [] if calls is None else calls
        self.outcomes = outcomes or {}

    def __call__(self, step: Step) -> Outcome:
        self.calls.append(step.key)
        return self.outcomes.get(step.key, Outcome.OK)


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    return tmp_path / "receipts.json"


def write_raw(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.write_bytes(data)
    os.chmod(path, mode)


def doc_bytes(done: list[str], pending: list[str], **extra: object) -> bytes:
    doc: dict[str, object] = {
        "format": "idemlink.receipt-journal",
        "version": 1,
        "done": done,
        "pending": pending,
    }
    doc.update(extra)
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


# ----------------------------------------------------------------------------------- keys


def by_hand_name(*fields: bytes | str | int) -> bytes:
    """The documented layout, written out independently: tag, u32 BE length, payload."""
    out = b""
    for f in fields:
        if isinstance(f, bytes):
            out += b"B" + len(f).to_bytes(4, "big") + f
        elif isinstance(f, str):
            p = f.encode("utf-8")
            out += b"S" + len(p).to_bytes(4, "big") + p
        else:
            p = f.to_bytes(f.bit_length() // 8 + 1, "big", signed=True)
            out += b"I" + len(p).to_bytes(4, "big") + p
    return out


def decode_name(name: bytes) -> tuple[bytes | str | int, ...]:
    """Parse the documented layout back into a typed tuple (proves it is a prefix code)."""
    out: list[bytes | str | int] = []
    i = 0
    while i < len(name):
        tag = name[i : i + 1]
        n = int.from_bytes(name[i + 1 : i + 5], "big")
        payload = name[i + 5 : i + 5 + n]
        assert len(payload) == n
        i += 5 + n
        if tag == b"B":
            out.append(payload)
        elif tag == b"S":
            out.append(payload.decode("utf-8"))
        else:
            assert tag == b"I"
            out.append(int.from_bytes(payload, "big", signed=True))
    return tuple(out)


def test_namespaces_are_the_documented_uuid5_values() -> None:
    for source, literal in (
        (KeySource.PLAN_STEP, "b3dedddc-c5dd-5803-801e-ac62c1d708a2"),
        (KeySource.FILE_SEND, "1787f46d-04c5-5dc2-bc8f-c0c45b8e07d5"),
    ):
        derived = uuid.uuid5(uuid.NAMESPACE_URL, "urn:idemlink:key-source:" + source.value)
        assert str(derived) == literal
        assert source_namespace(source) == derived == source.namespace
    assert len({s.namespace for s in KeySource}) == len(KeySource)


GOLDEN = [
    # (source, fields, the name bytes written out by hand, frozen key)
    (KeySource.PLAN_STEP, ("ab", "c"), b"S\0\0\0\x02abS\0\0\0\x01c",
     "4e74f9a0-7e7d-58da-91d7-a5bf56ede28b"),
    (KeySource.PLAN_STEP, ("a", "bc"), b"S\0\0\0\x01aS\0\0\0\x02bc",
     "c0fc97a6-a84e-5530-a4a0-9b71a9a52625"),
    (KeySource.FILE_SEND, (b"\x00", 1, -128),
     b"B\0\0\0\x01\x00I\0\0\0\x01\x01I\0\0\0\x02\xff\x80",
     "bd607863-0513-54f8-87d7-25fcfea983ac"),
    (KeySource.PLAN_STEP, (), b"", "ff42b57d-f413-583a-ab36-5d2df097993a"),
]


@pytest.mark.parametrize(("source", "fields", "name", "frozen"), GOLDEN)
def test_golden_keys(
    source: KeySource, fields: tuple[bytes | str | int, ...], name: bytes, frozen: str
) -> None:
    assert encode_fields(*fields) == name == by_hand_name(*fields)
    expected = uuid.UUID(bytes=hashlib.sha1(source.namespace.bytes + name).digest()[:16], version=5)
    if all(b < 0x80 for b in name):
        # uuid.uuid5 itself agrees wherever its str-only API can express the name.
        assert expected == uuid.uuid5(source.namespace, name.decode("ascii"))
    key = step_key(source, *fields)
    assert key == expected
    assert key.version == 5 and key.variant == uuid.RFC_4122
    assert str(key) == frozen


def test_no_separator_or_type_ambiguity() -> None:
    def k(*f: bytes | str | int) -> uuid.UUID:
        return step_key(KeySource.PLAN_STEP, *f)

    assert k("ab", "c") != k("a", "bc")
    assert k("a", "") != k("a") != k("", "a")
    assert len({k("1"), k(b"1"), k(1)}) == 3
    assert k("x") != step_key(KeySource.FILE_SEND, "x")


@pytest.mark.parametrize("bad", [True, 1.0, None, ["a"], "\udc80", bytearray(b"x")])
def test_key_field_refusals(bad: object) -> None:
    with pytest.raises(KeyFieldError):
        step_key(KeySource.PLAN_STEP, "ok", bad)  # type: ignore[arg-type]


fields_st = st.lists(
    st.one_of(st.binary(max_size=20), st.text(max_size=20), st.integers()), max_size=6
).map(tuple)


@given(fields_st)
def test_layout_is_a_prefix_code(fields: tuple[bytes | str | int, ...]) -> None:
    assert encode_fields(*fields) == by_hand_name(*fields)
    assert decode_name(encode_fields(*fields)) == fields


@given(fields_st, fields_st)
def test_keys_injective_on_typed_tuples(
    a: tuple[bytes | str | int, ...], b: tuple[bytes | str | int, ...]
) -> None:
    same = len(a) == len(b) and all(type(x) is type(y) and x == y for x, y in zip(a, b, strict=False))
    assert (step_key(KeySource.PLAN_STEP, *a) == step_key(KeySource.PLAN_STEP, *b)) == same


@given(st.uuids())
def test_parse_key_round_trip(key: uuid.UUID) -> None:
    assert parse_key(str(key)) == key


MALFORMED = [
    "",
    "not-a-uuid",
    "0F0E0D0C-0B0A-4908-8706-050403020100",  # upper case
    "{0f0e0d0c-0b0a-4908-8706-050403020100}",
    "urn:uuid:0f0e0d0c-0b0a-4908-8706-050403020100",
    "0f0e0d0c0b0a49088706050403020100",
    " 0f0e0d0c-0b0a-4908-8706-050403020100",
    "0f0e0d0c-0b0a-4908-8706-050403020100\n",
    "0f0e0d0c-0b0a-4908-8706-05040302010",
    "0f0e0d0c-0b0a-4908-8706-0504030201000",
    "0f0e0d0c-0b0a-4908-8706-05040302010g",
    "0f0e0d0c-0b0a4-908-8706-050403020100",
]


@pytest.mark.parametrize("text", [*MALFORMED, 7, None, b"0f0e0d0c-0b0a-4908-8706-050403020100"])
def test_parse_key_refuses_non_canonical(text: object) -> None:
    with pytest.raises(MalformedKeyError):
        parse_key(text)


# ----------------------------------------------------------------------- encoding and limits


def test_encoding_golden_bytes() -> None:
    snap = JF.Snapshot(frozenset({u(2), u(1)}), frozenset({u(3)}))
    assert JF.encode(snap) == (
        b'{"format":"idemlink.receipt-journal","version":1,"done":['
        b'"12340000-0000-0000-0000-000000000001","12340000-0000-0000-0000-000000000002"],'
        b'"pending":["12340000-0000-0000-0000-000000000003"]}\n'
    )


@given(
    st.sets(st.uuids(), max_size=40),
    st.sets(st.uuids(), max_size=40),
    st.dictionaries(st.text(min_size=1).filter(lambda s: s not in JF._KNOWN_FIELDS),
                    st.one_of(st.integers(), st.text(), st.booleans(), st.none()), max_size=3),
)
def test_encode_decode_round_trip(
    done: set[uuid.UUID], pending: set[uuid.UUID], extra: dict[str, object]
) -> None:
    snap = JF.Snapshot(frozenset(done), frozenset(pending - done), extra)
    assert JF.decode(JF.encode(snap)) == snap


def test_missing_file_is_the_empty_set(jpath: Path) -> None:
    assert JL.load(jpath) == JF.Snapshot()
    j = J.ReceiptJournal.open(jpath)
    assert j.done == j.pending == frozenset()
    assert j.state(u(1)) is JF.StepState.ABSENT
    assert not jpath.exists()  # opening creates nothing


def test_exactly_max_ids_is_accepted_one_more_is_refused(jpath: Path) -> None:
    full = JF.Snapshot(frozenset(u(i) for i in range(1023)), frozenset({u(5000)}))
    JL.save(jpath, full)
    assert JL.load(jpath) == full
    before = jpath.read_bytes()
    j = J.ReceiptJournal.open(jpath)
    with pytest.raises(JF.JournalLimitError) as err:
        j.begin(u(9999))
    assert (err.value.limit, err.value.actual) == (1024, 1025)
    assert jpath.read_bytes() == before and j.snapshot == full  # nothing changed
    j.complete(u(5000))  # moving within the set stays allowed at the limit
    assert len(JL.load(jpath).done) == 1024


def test_over_max_ids_refused_on_save_and_in_a_file(jpath: Path) -> None:
    with pytest.raises(JF.JournalLimitError):
        JL.save(jpath, JF.Snapshot(frozenset(u(i) for i in range(1025))))
    assert not jpath.exists()
    write_raw(jpath, doc_bytes([str(u(i)) for i in range(1000)], [str(u(i)) for i in range(1000, 1025)]))
    with pytest.raises(JF.JournalLimitError):
        JL.load(jpath)


def test_runner_refuses_too_many_steps_before_running_any(jpath: Path) -> None:
    calls: list[uuid.UUID] = []
    steps = [Step(u(i)) for i in range(1025)]
    with pytest.raises(JF.JournalLimitError):
        J.run_steps(jpath, steps, Recorder(calls))
    assert calls == [] and not jpath.exists()
    # The limit counts what the journal already holds too.
    JL.save(jpath, JF.Snapshot(frozenset(u(10_000 + i) for i in range(1000))))
    with pytest.raises(JF.JournalLimitError):
        J.run_steps(jpath, steps[:25], Recorder(calls))
    assert calls == []


def padded(total: int) -> JF.Snapshot:
    base = len(JF.encode(JF.Snapshot(frozenset({u(1)}), extra={"pad": ""})))
    return JF.Snapshot(frozenset({u(1)}), extra={"pad": "x" * (total - base)})


def test_exactly_64kib_is_accepted_one_byte_more_is_refused(jpath: Path) -> None:
    ok = padded(65536)
    assert len(JF.encode(ok)) == 65536
    JL.save(jpath, ok)
    assert JL.load(jpath) == ok
    before = jpath.read_bytes()
    with pytest.raises(JF.JournalLimitError) as err:
        JL.save(jpath, padded(65537))
    assert (err.value.limit, err.value.actual) == (65536, 65537)
    assert jpath.read_bytes() == before


def test_oversized_file_is_refused_not_truncated(jpath: Path) -> None:
    data = JF.encode(padded(65536))
    write_raw(jpath, data[:-3] + b'x"}\n')  # one more pad byte: still valid JSON
    assert len(jpath.read_bytes()) == 65537
    with pytest.raises(JF.JournalLimitError):
        JL.load(jpath)
    with pytest.raises(JF.JournalLimitError):
        JF.decode(jpath.read_bytes())


# --------------------------------------------------------------------------- id validation


@pytest.mark.parametrize("bad", MALFORMED[:4])
def test_malformed_id_refused_by_the_api(jpath: Path, bad: str) -> None:
    j = J.ReceiptJournal.open(jpath)
    with pytest.raises(JF.JournalKeyError):
        j.begin(bad)
    assert not jpath.exists()


def test_string_keys_in_canonical_form_are_accepted(jpath: Path) -> None:
    j = J.ReceiptJournal.open(jpath)
    j.begin(str(u(7)))
    assert JL.load(jpath).pending == {u(7)}


def test_runner_refuses_a_non_uuid_key(jpath: Path) -> None:
    with pytest.raises(JF.JournalKeyError):
        J.run_steps(jpath, [Step(str(u(1)))], lambda s: Outcome.OK)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [*MALFORMED[:4], "0f0e0d0c-0b0a-4908-8706-050403020100 "])
def test_malformed_id_in_a_file_is_corrupt(jpath: Path, bad: str) -> None:
    write_raw(jpath, doc_bytes([str(u(1)), bad], []))
    with pytest.raises(JF.JournalCorruptError, match="done\\[1\\]"):
        JL.load(jpath)


def test_duplicate_ids_refused(jpath: Path) -> None:
    for done, pending in (([u(1), u(1)], []), ([], [u(2), u(2)]), ([u(3)], [u(3)])):
        write_raw(jpath, doc_bytes([str(k) for k in done], [str(k) for k in pending]))
        with pytest.raises(JF.JournalCorruptError, match="duplicate"):
            JL.load(jpath)
    with pytest.raises(JF.JournalDuplicateError):
        JF.Snapshot(frozenset({u(1)}), frozenset({u(1)}))
    jpath.unlink()
    j = J.ReceiptJournal.open(jpath)
    j.begin(u(1))
    j.complete(u(1))
    before = jpath.read_bytes()
    with pytest.raises(JF.JournalDuplicateError):
        j.begin(u(1))
    assert jpath.read_bytes() == before
    calls: list[uuid.UUID] = []
    with pytest.raises(JF.JournalDuplicateError):
        J.run_steps(jpath, [Step(u(5)), Step(u(6)), Step(u(5))], Recorder(calls))
    assert calls == [] and jpath.read_bytes() == before


# --------------------------------------------------------------------- file type and mode


def assert_unsafe_everywhere(path: Path) -> None:
    with pytest.raises(JF.JournalUnsafeFileError):
        JL.load(path)
    with pytest.raises(JF.JournalUnsafeFileError):
        J.ReceiptJournal.open(path)
    calls: list[uuid.UUID] = []
    with pytest.raises(JF.JournalUnsafeFileError):
        J.run_steps(path, [Step(u(1))], Recorder(calls))
    assert calls == []


@pytest.fixture
def alarm() -> Iterator[None]:
    """Turn a hang (e.g. blocking on a FIFO) into a failure instead of a stuck suite."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError("blocked")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(5)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_symlink_refused_even_to_a_good_journal(tmp_path: Path, jpath: Path) -> None:
    real = tmp_path / "real.json"
    JL.save(real, JF.Snapshot(frozenset({u(1)})))
    jpath.symlink_to(real)
    assert_unsafe_everywhere(jpath)
    with pytest.raises(JF.JournalUnsafeFileError):
        JL.save(jpath, JF.Snapshot(frozenset({u(2)})))
    assert JL.load(real) == JF.Snapshot(frozenset({u(1)}))  # the target was not touched
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    assert_unsafe_everywhere(dangling)
    assert not (tmp_path / "nowhere.json").exists()


def test_fifo_refused_without_blocking(jpath: Path, alarm: None) -> None:
    os.mkfifo(jpath, 0o600)
    assert_unsafe_everywhere(jpath)
    with pytest.raises(JF.JournalUnsafeFileError):
        JL.save(jpath, JF.Snapshot())
    assert stat.S_ISFIFO(os.lstat(jpath).st_mode)


def test_directory_refused(jpath: Path) -> None:
    jpath.mkdir(mode=0o700)
    assert_unsafe_everywhere(jpath)
    with pytest.raises(JF.JournalUnsafeFileError):
        JL.save(jpath, JF.Snapshot())
    assert jpath.is_dir()


def test_socket_refused(jpath: Path, alarm: None) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(jpath))
        assert_unsafe_everywhere(jpath)
    finally:
        s.close()


def test_device_refused(jpath: Path, alarm: None) -> None:
    try:
        os.mknod(jpath, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null
    except PermissionError:
        pytest.skip("mknod needs privileges")
    assert_unsafe_everywhere(jpath)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o606, 0o660])
def test_journal_readable_by_others_is_refused(jpath: Path, mode: int) -> None:
    write_raw(jpath, doc_bytes([], []), mode)
    assert_unsafe_everywhere(jpath)


def test_journal_owned_by_someone_else_is_refused(jpath: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    write_raw(jpath, doc_bytes([], []))
    os.chown(jpath, 4242, 4242)
    assert_unsafe_everywhere(jpath)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o277])
def test_file_mode_is_0600_whatever_the_umask(jpath: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        j = J.ReceiptJournal.open(jpath)
        j.begin(u(1))
        assert stat.S_IMODE(os.stat(jpath).st_mode) == 0o600
        j.complete(u(1))
        assert stat.S_IMODE(os.stat(jpath).st_mode) == 0o600
    finally:
        os.umask(old)
    assert JL.load(jpath).done == {u(1)}
    assert sorted(p.name for p in jpath.parent.iterdir()) == [jpath.name]  # no temp left


def test_temp_files_are_unique_and_stale_ones_are_never_used(jpath: Path) -> None:
    # Temp names are unique per save (mkstemp), so two processes never share one: a file left at
    # any fixed name by a crash is neither read nor written through, and no temp file remains.
    tmp = jpath.parent / f".{jpath.name}.tmp"
    tmp.write_bytes(b"half a jour")
    os.chmod(tmp, 0o644)
    JL.save(jpath, JF.Snapshot(frozenset({u(1)})))
    assert tmp.read_bytes() == b"half a jour"
    assert JL.load(jpath).done == {u(1)}
    tmp.unlink()
    victim = jpath.parent / "victim"
    victim.write_bytes(b"keep")
    tmp.symlink_to(victim)
    JL.save(jpath, JF.Snapshot(frozenset({u(2)})))
    assert victim.read_bytes() == b"keep" and JL.load(jpath).done == {u(2)}
    assert sorted(p.name for p in jpath.parent.iterdir()) == sorted(
        [jpath.name, tmp.name, "victim"])


# ----------------------------------------------------------------------------- corruption

GOOD = doc_bytes([str(u(1))], [str(u(2))])

CORRUPT = {
    "empty": b"",
    "newline only": b"\n",
    "no trailing newline": GOOD[:-1],
    "two lines": GOOD + GOOD,
    "binary": b"\xff\xfe\x00garbage\n",
    "utf-16": GOOD.decode().encode("utf-16"),
    "bom": b"\xef\xbb\xbf" + GOOD,
    "array": b"[]\n",
    "string": b'"idemlink.receipt-journal"\n',
    "wrong format": GOOD.replace(b"receipt-journal", b"receipt-journak"),
    "no format": doc_bytes([], []).replace(b'"format":"idemlink.receipt-journal",', b""),
    "version as str": GOOD.replace(b'"version":1', b'"version":"1"'),
    "version as bool": GOOD.replace(b'"version":1', b'"version":true'),
    "version 0": GOOD.replace(b'"version":1', b'"version":0'),
    "missing done": GOOD.replace(b'"done":["12340000-0000-0000-0000-000000000001"],', b""),
    "missing pending": GOOD.replace(b',"pending":["12340000-0000-0000-0000-000000000002"]', b""),
    "done not a list": GOOD.replace(b'"done":[', b'"done":{"a":').replace(b'01"]', b'01"}'),
    "id not a string": GOOD.replace(b'"done":["', b'"done":[12,"'),
    "duplicate object key": GOOD[:-2] + b',"done":[]}\n',
    "NaN": doc_bytes([], [], extra=float("nan")),
    "invalid utf-8 in a string": GOOD.replace(b'"version":1', b'"x":"\xc3\x28","version":1'),
}


@pytest.mark.parametrize("data", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_file_is_refused_never_empty(jpath: Path, data: bytes) -> None:
    write_raw(jpath, data)
    with pytest.raises(JF.JournalCorruptError):
        JL.load(jpath)
    calls: list[uuid.UUID] = []
    with pytest.raises(JF.JournalCorruptError):
        J.run_steps(jpath, [Step(u(3))], Recorder(calls))
    assert calls == [] and jpath.read_bytes() == data


def test_every_proper_prefix_of_a_journal_is_refused() -> None:
    assert JF.decode(GOOD).done == {u(1)}
    for n in range(len(GOOD)):
        with pytest.raises(JF.JournalCorruptError):
            JF.decode(GOOD[:n])


def test_newer_version_is_refused_as_such(jpath: Path) -> None:
    # Version 2 is the device-keyed layout (DeviceJournal); 3 is the first unknown one.
    write_raw(jpath, GOOD.replace(b'"version":1', b'"version":3'))
    with pytest.raises(JF.JournalVersionError, match="newer"):
        JL.load(jpath)
    with pytest.raises(JF.JournalVersionError, match="newer"):
        JL.load_keyed(jpath)
    write_raw(jpath, JF.encode_keyed(JF.KeyedSnapshot({"dev-1": JF.Snapshot(frozenset({u(1)}))})))
    with pytest.raises(JF.JournalVersionError, match="keyed by device"):
        JL.load(jpath)


def test_unknown_fields_survive_a_rewrite(jpath: Path) -> None:
    write_raw(jpath, doc_bytes([str(u(1))], [], note={"by": "a newer idemlink", "n": [1, 2]}))
    j = J.ReceiptJournal.open(jpath)
    j.begin(u(2))
    doc = json.loads(jpath.read_bytes())
    assert doc["note"] == {"by": "a newer idemlink", "n": [1, 2]}
    assert doc["pending"] == [str(u(2))]


# -------------------------------------------------------------------------- state machine


@pytest.mark.parametrize("state", list(JF.StepState))
@pytest.mark.parametrize("event", list(JF.StepEvent))
def test_transition_table_is_what_the_journal_does(
    jpath: Path, state: JF.StepState, event: JF.StepEvent
) -> None:
    key = u(1)
    j = J.ReceiptJournal.open(jpath)
    if state is not JF.StepState.ABSENT:
        j.begin(key)
    if state is JF.StepState.DONE:
        j.complete(key)
    assert j.state(key) is state
    before = j.snapshot
    actions: dict[JF.StepEvent, Callable[[], None]] = {
        JF.StepEvent.BEGIN: lambda: j.begin(key),
        JF.StepEvent.EXECUTED: lambda: j.resolve(key, executed=True),
        JF.StepEvent.NOT_EXECUTED: lambda: j.resolve(key, executed=False),
    }
    act = actions[event]
    allowed = {
        (JF.StepState.ABSENT, JF.StepEvent.BEGIN): JF.StepState.PENDING,
        (JF.StepState.PENDING, JF.StepEvent.EXECUTED): JF.StepState.DONE,
        (JF.StepState.PENDING, JF.StepEvent.NOT_EXECUTED): JF.StepState.ABSENT,
    }
    assert allowed == JF.TRANSITIONS
    if (state, event) in allowed:
        act()
        assert j.state(key) is allowed[(state, event)]
        assert JL.load(jpath).state(key) is allowed[(state, event)]
    else:
        expected = JF.JournalDuplicateError if state is JF.StepState.DONE else JF.JournalStateError
        with pytest.raises(expected):
            act()
        assert j.snapshot == before and JL.load(jpath) == before


class JournalMachine(RuleBasedStateMachine):
    """The journal against a dict model; every change is re-read from disk."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "j.json")
        self.j = J.ReceiptJournal.open(self.path)
        self.model: dict[uuid.UUID, JF.StepState] = {}

    keys = st.integers(0, 5).map(u)

    def _expect(self, key: uuid.UUID, ok_from: JF.StepState, to: JF.StepState, act: object) -> None:
        current = self.model.get(key, JF.StepState.ABSENT)
        if current is ok_from:
            act()  # type: ignore[operator]
            if to is JF.StepState.ABSENT:
                self.model.pop(key, None)
            else:
                self.model[key] = to
        else:
            with pytest.raises(JF.JournalError):
                act()  # type: ignore[operator]

    @rule(key=keys)
    def begin(self, key: uuid.UUID) -> None:
        self._expect(key, JF.StepState.ABSENT, JF.StepState.PENDING, lambda: self.j.begin(key))

    @rule(key=keys)
    def complete(self, key: uuid.UUID) -> None:
        self._expect(key, JF.StepState.PENDING, JF.StepState.DONE, lambda: self.j.complete(key))

    @rule(key=keys, executed=st.booleans())
    def resolve(self, key: uuid.UUID, executed: bool) -> None:
        to = JF.StepState.DONE if executed else JF.StepState.ABSENT
        self._expect(key, JF.StepState.PENDING, to, lambda: self.j.resolve(key, executed))

    @rule()
    def reopen(self) -> None:
        self.j = J.ReceiptJournal.open(self.path)

    @invariant()
    def matches_model_on_disk(self) -> None:
        on_disk = JL.load(self.path)
        for snap in (on_disk, self.j.snapshot):
            assert snap.done == {k for k, s in self.model.items() if s is JF.StepState.DONE}
            assert snap.pending == {k for k, s in self.model.items() if s is JF.StepState.PENDING}

    def teardown(self) -> None:
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


TestJournalMachine = JournalMachine.TestCase
TestJournalMachine.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)


# --------------------------------------------------------------------------------- runner


def test_runner_skips_receipted_steps(jpath: Path) -> None:
    steps = [Step(u(i)) for i in range(5)]
    first = Recorder(outcomes={u(3): Outcome.NOT_EXECUTED})
    r = J.run_steps(jpath, steps, first)
    assert r.outcome is Outcome.NOT_EXECUTED and r.stopped_at == u(3)
    assert first.calls == [u(0), u(1), u(2), u(3)]
    assert r.executed == (u(0), u(1), u(2)) and r.unknown == ()
    assert JL.load(jpath) == JF.Snapshot(frozenset({u(0), u(1), u(2)}))  # u(3) released
    second = Recorder()
    r = J.run_steps(jpath, steps, second)
    assert r.outcome is Outcome.OK
    assert second.calls == [u(3), u(4)]
    assert r.skipped == (u(0), u(1), u(2)) and r.executed == (u(3), u(4))
    third = Recorder()
    r = J.run_steps(jpath, steps, third)
    assert third.calls == [] and r.outcome is Outcome.OK and r.skipped == tuple(u(i) for i in range(5))


def test_rejected_step_is_released_and_stops(jpath: Path) -> None:
    rec = Recorder(outcomes={u(1): Outcome.REJECTED})
    r = J.run_steps(jpath, [Step(u(0)), Step(u(1)), Step(u(2))], rec)
    assert r.outcome is Outcome.REJECTED and r.stopped_at == u(1) and rec.calls == [u(0), u(1)]
    assert JL.load(jpath).pending == frozenset()


def test_unknown_blocks_until_reconciled(jpath: Path) -> None:
    steps = [Step(u(i)) for i in range(4)]
    rec = Recorder(outcomes={u(1): Outcome.UNKNOWN})
    r = J.run_steps(jpath, steps, rec)
    assert r.outcome is Outcome.UNKNOWN and r.unknown == (u(1),) and r.stopped_at == u(1)
    assert rec.calls == [u(0), u(1)]
    assert JL.load(jpath) == JF.Snapshot(frozenset({u(0)}), frozenset({u(1)}))

    for reconcile in (None, lambda s: None):
        again = Recorder()
        r = J.run_steps(jpath, steps, again, reconcile)
        assert r.outcome is Outcome.UNKNOWN and r.unknown == (u(1),) and again.calls == []

    asked: list[uuid.UUID] = []

    def found_it(step: Step) -> bool:
        asked.append(step.key)
        return True

    final = Recorder()
    r = J.run_steps(jpath, steps, final, found_it)
    assert asked == [u(1)]
    assert r.outcome is Outcome.OK and r.reconciled == (u(1),)
    assert final.calls == [u(2), u(3)]  # u(1) not re-executed
    assert r.skipped == (u(0),) and r.executed == (u(2), u(3))


def test_reconciled_as_not_executed_runs_again(jpath: Path) -> None:
    steps = [Step(u(0)), Step(u(1))]
    J.run_steps(jpath, steps, Recorder(outcomes={u(0): Outcome.UNKNOWN}))
    rec = Recorder()
    r = J.run_steps(jpath, steps, rec, lambda s: False)
    assert r.outcome is Outcome.OK and rec.calls == [u(0), u(1)] and r.reconciled == ()


def test_exception_in_a_step_leaves_it_in_flight(jpath: Path) -> None:
    def boom(step: Step) -> Outcome:
        raise OSError("port vanished")

    with pytest.raises(OSError):
        J.run_steps(jpath, [Step(u(0))], boom)
    assert JL.load(jpath).pending == {u(0)}
    r = J.run_steps(jpath, [Step(u(0))], Recorder())
    assert r.outcome is Outcome.UNKNOWN and r.unknown == (u(0),)


def test_foreign_in_flight_key_blocks_until_resolved_by_hand(jpath: Path) -> None:
    JL.save(jpath, JF.Snapshot(pending=frozenset({u(99)})))
    rec = Recorder()
    r = J.run_steps(jpath, [Step(u(0))], rec, lambda s: True)
    assert r.outcome is Outcome.UNKNOWN and r.unknown == (u(99),) and rec.calls == []
    J.ReceiptJournal.open(jpath).resolve(u(99), executed=False)
    r = J.run_steps(jpath, [Step(u(0))], rec)
    assert r.outcome is Outcome.OK and rec.calls == [u(0)]


# ------------------------------------------------------------------------------ atomicity

WRITER = textwrap.dedent(
    """
    import sys, uuid
    from idemlink.host import journal_file as JL
    from idemlink.host import journal_format as JF
    path, rounds = sys.argv[1], int(sys.argv[2])
    small = JF.Snapshot(frozenset({uuid.UUID(int=1)}))
    big = JF.Snapshot(frozenset(uuid.UUID(int=i) for i in range(2, 600)),
                     frozenset({uuid.UUID(int=600)}))
    JL.save(path, small)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    for i in range(rounds):
        JL.save(path, big if i % 2 == 0 else small)
    """
)


def test_concurrent_reader_never_sees_a_partial_journal(jpath: Path) -> None:
    small = JF.Snapshot(frozenset({uuid.UUID(int=1)}))
    big = JF.Snapshot(
        frozenset(uuid.UUID(int=i) for i in range(2, 600)), frozenset({uuid.UUID(int=600)})
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(jpath), "200"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    seen = {"small": 0, "big": 0}
    while proc.poll() is None:
        snap = JL.load(jpath)  # raises on a partial file
        raw = jpath.read_bytes()  # and a plain reader decodes too
        assert JF.decode(raw) in (small, big)
        if snap == small:
            seen["small"] += 1
        else:
            assert snap == big
            seen["big"] += 1
    assert proc.wait() == 0
    assert JL.load(jpath) == small  # the last round (199) writes small
    assert seen["small"] > 0 and seen["big"] > 0, seen


# ------------------------------------------------------------------------- kill and restart

CHILD = textwrap.dedent(
    """
    import json, os, random, signal, sys, time, uuid
    from idemlink.host.journal import run_steps
    from idemlink.host.keys import KeySource, step_key
    from idemlink.protocol.outcome import Outcome

    journal, log_path, n, job = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    kill_at = os.environ.get("KILL_AT", "")
    jitter = random.Random(os.environ["JITTER"]) if os.environ.get("JITTER") else None

    class Step:
        def __init__(self, index):
            self.index = index
            self.key = step_key(KeySource.PLAN_STEP, job, index)

    def point(index, phase):
        if kill_at == f"{index}:{phase}":
            os.kill(os.getpid(), signal.SIGKILL)
        if jitter is not None:
            time.sleep(jitter.random() * 0.003)  # widen the windows for the parent's kill

    def execute(step):
        point(step.index, "before-effect")
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, (str(step.key) + "\\n").encode())
        os.fsync(fd)
        os.close(fd)
        sys.stdout.write(f"effect {step.index}\\n"); sys.stdout.flush()
        point(step.index, "after-effect")
        return Outcome.OK

    def reconcile(step):
        try:
            with open(log_path) as f:
                return str(step.key) in f.read().split()
        except FileNotFoundError:
            return False

    steps = [Step(i) for i in range(n)]
    rec = reconcile if os.environ.get("RECONCILE") == "1" else None
    r = run_steps(journal, steps, execute, rec)
    sys.stdout.write("report " + json.dumps({
        "outcome": r.outcome.name,
        "skipped": [str(k) for k in r.skipped],
        "reconciled": [str(k) for k in r.reconciled],
        "executed": [str(k) for k in r.executed],
        "unknown": [str(k) for k in r.unknown],
    }) + "\\n")
    """
)


def run_child(
    tmp: Path, n: int, job: str, *, kill_at: str = "", kill_after_lines: int | None = None,
    jitter: str = "", reconcile: bool = False,
) -> tuple[int, list[str]]:
    env = dict(os.environ, KILL_AT=kill_at, JITTER=jitter, RECONCILE="1" if reconcile else "0")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp / "j.json"), str(tmp / "effects.log"), str(n), job],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    if kill_after_lines == 0:
        proc.send_signal(signal.SIGKILL)
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if kill_after_lines is not None and len(lines) >= kill_after_lines:
            proc.send_signal(signal.SIGKILL)
            lines.extend(x.rstrip("\n") for x in proc.stdout)
            break
    return proc.wait(), lines


def effects(tmp: Path) -> list[str]:
    try:
        return (tmp / "effects.log").read_text().split()
    except FileNotFoundError:
        return []


#: two seeds in the default suite (each is up to 80 killed and restarted children); all six slow
@pytest.mark.parametrize("seed", [1, 2, *(pytest.param(s, marks=pytest.mark.slow) for s in range(3, 7))])
def test_killed_at_random_moments_every_effect_exactly_once(tmp_path: Path, seed: int) -> None:
    n = 12
    job = f"job-{seed}"
    keys = [str(step_key(KeySource.PLAN_STEP, job, i)) for i in range(n)]
    rng = random.Random(seed)
    kills = unknown_reports = exact_unknown_checks = 0
    reconcile_next = False
    for _attempt in range(80):
        before = effects(tmp_path)
        choice = rng.random() * (0.75 if _attempt < 3 else 1.0)  # the first runs always die
        kill_at, kill_after, jitter = "", None, ""
        if choice < 0.35:
            index = rng.randrange(min(len(before), n - 1), n)
            kill_at = f"{index}:{rng.choice(['before-effect', 'after-effect'])}"
        elif choice < 0.75:
            kill_after = rng.randrange(0, n - len(before) + 1)
            jitter = f"{seed}-{_attempt}"
        rc, lines = run_child(tmp_path, n, job, kill_at=kill_at, kill_after_lines=kill_after,
                              jitter=jitter, reconcile=reconcile_next)
        after = effects(tmp_path)
        assert after[: len(before)] == before  # the log only grows
        assert len(after) == len(set(after)), "a step ran twice"
        if rc == -signal.SIGKILL:
            kills += 1
            reconcile_next = False  # first let the restart report what was in flight
            if kill_at.endswith("after-effect"):
                index = int(kill_at.split(":")[0])
                if f"effect {index}" in lines:
                    # Killed between its effect and its receipt: the restart must say UNKNOWN
                    # for exactly that step, and run nothing.
                    rc2, lines2 = run_child(tmp_path, n, job)
                    assert rc2 == 0
                    report = json.loads(lines2[-1].removeprefix("report "))
                    assert report["outcome"] == "UNKNOWN" and report["unknown"] == [keys[index]]
                    assert effects(tmp_path) == after
                    exact_unknown_checks += 1
                    reconcile_next = True
            continue
        assert rc == 0, lines
        report = json.loads(lines[-1].removeprefix("report "))
        if report["outcome"] == "UNKNOWN":
            unknown_reports += 1
            assert not reconcile_next, "reconciling against the ground truth always settles"
            assert after == before, "nothing runs while a step is UNKNOWN"
            assert set(report["unknown"]) == {str(k) for k in JL.load(tmp_path / "j.json").pending}
            assert len(report["unknown"]) == 1
            reconcile_next = True
            continue
        assert report["outcome"] == "OK"
        assert not set(report["executed"]) & set(before), "re-executed a receipted step"
        # Reconciled steps were found in the ground truth and were not run again.
        assert set(report["reconciled"]) <= set(before)
        break
    else:
        pytest.fail("job did not finish")
    assert effects(tmp_path) == keys  # every effect exactly once, in order
    assert JL.load(tmp_path / "j.json") == JF.Snapshot(frozenset(uuid.UUID(k) for k in keys))
    assert kills > 0
    # A finished job runs nothing more.
    rc, lines = run_child(tmp_path, n, job)
    assert rc == 0 and json.loads(lines[-1].removeprefix("report "))["skipped"] == keys
    assert effects(tmp_path) == keys


def report_of(lines: list[str]) -> dict[str, list[str] | str]:
    assert lines and lines[-1].startswith("report "), lines
    result: dict[str, list[str] | str] = json.loads(lines[-1].removeprefix("report "))
    return result


@pytest.mark.parametrize("phase", ["before-effect", "after-effect"])
def test_step_killed_in_flight_is_unknown_until_reconciled(tmp_path: Path, phase: str) -> None:
    n, job = 5, "exact-window"
    keys = [str(step_key(KeySource.PLAN_STEP, job, i)) for i in range(n)]
    rc, _ = run_child(tmp_path, n, job, kill_at=f"2:{phase}")
    assert rc == -signal.SIGKILL
    ran = keys[:3] if phase == "after-effect" else keys[:2]
    assert effects(tmp_path) == ran
    for _restart in range(2):  # however often restarted: UNKNOWN, and nothing runs
        rc, lines = run_child(tmp_path, n, job)
        assert rc == 0
        report = report_of(lines)
        assert report["outcome"] == "UNKNOWN" and report["unknown"] == [keys[2]]
        assert report["executed"] == [] and effects(tmp_path) == ran
    rc, lines = run_child(tmp_path, n, job, reconcile=True)
    report = report_of(lines)
    assert report["outcome"] == "OK"
    if phase == "after-effect":  # its effect is in the ground truth: receipted, not re-run
        assert report["reconciled"] == [keys[2]] and report["executed"] == keys[3:]
    else:  # no effect: released and run, once
        assert report["reconciled"] == [] and report["executed"] == keys[2:]
    assert report["skipped"] == keys[:2]
    assert effects(tmp_path) == keys


def test_execute_returning_a_non_outcome_leaves_the_step_in_flight(jpath: Path) -> None:
    with pytest.raises(TypeError):
        J.run_steps(jpath, [Step(u(0))], lambda s: 0)  # type: ignore[arg-type,return-value]
    assert JL.load(jpath).pending == {u(0)}


# ----------------------------------------------------------------------- keyed by device


def test_keyed_journal_round_trip_and_scopes(jpath: Path) -> None:
    snap = JF.KeyedSnapshot({"dev-a": JF.Snapshot(frozenset({u(1)}), frozenset({u(2)})),
                            "dev-b": JF.Snapshot(frozenset({u(1)}))},
                           JF.Snapshot(frozenset({u(3)})), {"note": "kept"})
    JL.save_keyed(jpath, snap)
    assert JL.load_keyed(jpath) == snap
    assert jpath.stat().st_mode & 0o777 == 0o600
    j = J.DeviceJournal.open(jpath)
    assert j.state("dev-a", u(1)) is JF.StepState.DONE and j.state("dev-c", u(1)) is \
        JF.StepState.ABSENT  # a receipt on one device says nothing about another
    j.begin("dev-c", u(1))
    j.complete("dev-c", u(1))
    with pytest.raises(JF.JournalDuplicateError):
        j.begin("dev-c", u(1))
    assert JL.load_keyed(jpath).scope("dev-c").done == {u(1)}
    with pytest.raises(JF.JournalKeyError):
        j.begin("bad id/../x", u(4))


def test_keyed_limits_count_every_device(jpath: Path) -> None:
    half = frozenset(u(i) for i in range(512))
    full = JF.KeyedSnapshot({"a": JF.Snapshot(half), "b": JF.Snapshot(half)})
    JL.save_keyed(jpath, full)
    j = J.DeviceJournal.open(jpath)
    with pytest.raises(JF.JournalLimitError):
        j.begin("c", u(9999))
    assert JL.load_keyed(jpath) == full  # refused, nothing changed


@pytest.mark.parametrize("body", [
    b'"devices":{"bad id":{"done":[],"pending":[]}}',
    b'"devices":{"a":{"done":[]}}',
    b'"devices":[]',
    b'"devices":{"a":{"done":["12340000-0000-0000-0000-000000000001"],'
    b'"pending":["12340000-0000-0000-0000-000000000001"]}}',
])
def test_keyed_corrupt_files_are_refused(jpath: Path, body: bytes) -> None:
    write_raw(jpath, b'{"format":"idemlink.receipt-journal","version":2,' + body + b"}\n")
    with pytest.raises(JF.JournalCorruptError):
        JL.load_keyed(jpath)
