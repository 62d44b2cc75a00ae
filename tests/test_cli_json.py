"""Every command's ``--json`` against its schema in docs/CLI.md ("JSON output").

Each command runs for real (in process against a simulator on a pty, or as a subprocess for the
ones that serve until a signal); every line it prints on stdout must be one JSON object whose
``schema`` the table in docs/CLI.md documents, holding every key the table requires and no key the
table does not name (unless the row is open, ``…``). Every schema of the table must be seen.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idemlink.cli import main
from idemlink.device_sim.pty import open_pty
from idemlink.protocol.frame import FrameType, encode_frame
from idemlink.protocol.modbus import WriteSingleRegister, encode_request
from idemlink.pytest_plugin import PtySim, start_pty_sim

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from idemlink.cli import main; sys.exit(main())"]
needs_pty = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pty")


def documented_schemas() -> dict[str, tuple[set[str], set[str], bool]]:
    """schema -> (required keys, optional keys, open) from the table of docs/CLI.md."""
    out: dict[str, tuple[set[str], set[str], bool]] = {}
    for line in (ROOT / "docs" / "CLI.md").read_text("utf-8").splitlines():
        m = re.match(r"\| `(idemlink\.[a-z-]+/\d+)` \|[^|]*\| (.*) \|$", line)
        if not m:
            continue
        keys = m.group(2)
        required = {k for k, opt in re.findall(r"`(\w+)`(\??)", keys) if not opt}
        optional = {k for k, opt in re.findall(r"`(\w+)`(\??)", keys) if opt}
        out[m.group(1)] = (required, optional, "…" in keys)
    return out


SCHEMAS = documented_schemas()
SEEN: set[str] = set()

#: test_every_documented_schema_was_checked reads what the tests above it saw, so the file runs in
#: one xdist worker (``--dist loadgroup`` in pyproject's addopts), in file order.
pytestmark = pytest.mark.xdist_group("cli_json")


def check(stdout: str) -> list[dict[str, Any]]:
    """Every stdout line is one documented object; the objects."""
    docs: list[dict[str, Any]] = []
    lines = stdout.splitlines()
    assert lines, "nothing on stdout"
    for line in lines:
        doc = json.loads(line)
        assert isinstance(doc, dict), line
        schema = doc.get("schema")
        assert schema in SCHEMAS, f"undocumented schema {schema!r}: {line}"
        required, optional, is_open = SCHEMAS[schema]
        keys = set(doc) - {"schema"}
        assert required <= keys, f"{schema}: missing {required - keys}"
        if not is_open:
            assert keys <= required | optional, f"{schema}: undocumented {keys - required - optional}"
        assert line == json.dumps(doc, sort_keys=True, ensure_ascii=False), f"keys unsorted: {line}"
        for reading in readings(doc):
            check_reading(reading)
        SEEN.add(schema)
        docs.append(doc)
    return docs


def readings(doc: Any) -> Iterator[dict[str, Any]]:
    """Every register reading in an object (a dict with ``raw``: ``registers`` entries, a watch
    line), at any depth."""
    if isinstance(doc, dict):
        if "raw" in doc:
            yield doc
        for value in doc.values():
            yield from readings(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from readings(value)


def check_reading(reading: dict[str, Any]) -> None:
    """One shape in every command: ``value`` a number (null without a value), ``label`` apart."""
    assert {"name", "address", "raw", "value", "label", "unit"} <= set(reading), reading
    value = reading["value"]
    assert value is None or (isinstance(value, int | float) and not isinstance(value, bool)), reading
    assert reading["label"] is None or isinstance(reading["label"], str), reading


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]]]:
    rc = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, check(out)


@pytest.fixture
def sim() -> Iterator[PtySim]:
    s = start_pty_sim()
    try:
        yield s
    finally:
        s.close()


def test_the_table_documents_the_schemas() -> None:
    assert {"idemlink.read/1", "idemlink.error/1", "idemlink.send/1"} <= set(SCHEMAS)
    assert SCHEMAS["idemlink.read/1"][0] >= {"outcome", "registers"}


@needs_pty
def test_device_commands(sim: PtySim, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = ("--port", sim.path)
    rc, [doc] = run(capsys, "read", *p, "threshold", "mode")
    assert rc == 0 and doc["schema"] == "idemlink.read/1"
    assert doc["registers"][0] == {"name": "threshold", "address": 4, "raw": 350, "value": 35.0,
                                   "label": None, "unit": "°C", "outcome": "OK"}
    assert doc["registers"][1]["value"] == 1 and doc["registers"][1]["label"] == "auto"
    assert doc["values"]["threshold"] == 350
    rc, [doc] = run(capsys, "write", *p, "threshold=42.0", "mode=2")
    assert rc == 0 and [r["raw"] for r in doc["registers"]] == [420, 2]
    assert doc["writes"][0]["registers"][0]["value"] == 42.0
    rc, [doc] = run(capsys, "write", *p, "threshold=200")  # refused by the map, not sent
    assert rc == 4 and doc["outcome"] == "REJECTED"
    rc, [doc] = run(capsys, "faults", *p)
    assert rc == 0 and doc["registers"][0]["name"] == "faults" and "latched" in doc["registers"][0]
    rc, [doc] = run(capsys, "clear", *p)
    assert rc == 0 and doc["registers"][0]["name"] == "faults"
    rc, [doc] = run(capsys, "trigger", *p)
    assert rc == 0 and doc["code_name"] == "ACCEPTED"
    rc, [doc] = run(capsys, "trigger", *p, "--status")
    assert rc == 0 and doc["registers"][0]["name"] == "self_clean"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [{"write": {"fan_setpoint": 80}}]}))
    rc, [doc] = run(capsys, "apply", *p, str(plan))
    assert rc == 0 and doc["steps"][0]["state"] == "written"
    rc, [doc] = run(capsys, "info", *p)
    assert rc == 0 and doc["port"] == sim.path
    rc, docs = run(capsys, "watch", *p, "--count", "1", "--interval", "0.01", "mode")
    assert rc == 0 and docs[0]["name"] == "mode"
    rc, [doc] = run(capsys, "read", *p, "--port", str(tmp_path / "missing"), "mode")
    assert rc == 1 and [d["outcome"] for d in doc["devices"]] == ["OK", "ERROR"]


def test_errors_are_json_too(capsys: pytest.CaptureFixture[str]) -> None:
    """``write --json tresh=1`` used to print nothing on stdout."""
    rc, [doc] = run(capsys, "write", "--port", "loop://", "tresh=1")
    assert rc == 1 and doc["schema"] == "idemlink.error/1" and doc["exit"] == 1
    assert doc["command"] == "write" and "no register 'tresh'" in doc["message"]
    with pytest.raises(SystemExit) as exc:  # a usage error: argparse's exit 2, same object
        main(["read", "--json", "--no-such-flag"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "unrecognized arguments" in err
    [doc] = check(out)
    assert doc["exit"] == 2 and doc["command"] == "read"


def test_local_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, [doc] = run(capsys, "ports")
    assert rc == 0 and isinstance(doc["ports"], list)
    rc, [doc] = run(capsys, "regmap")
    assert rc == 0 and doc["name"] == "thermal-controller"
    rc, [doc] = run(capsys, "regmap", "--check")
    assert rc == 0 and doc["ok"] is True
    rc, [doc] = run(capsys, "contract", "--check", "--root", str(ROOT))
    assert rc == 0 and doc["drifted"] == []
    rc, [doc] = run(capsys, "soak", "--commands", "200", "--no-progress")
    assert rc == 0 and doc["passed"] is True and doc["commands"] == 200


@needs_pty
def test_send_and_receive(sim: PtySim, capsys: pytest.CaptureFixture[str],
                          tmp_path: Path) -> None:
    from idemlink.device_sim.link import LinkConfig
    from idemlink.device_sim.link_proxy import LinkProxy
    from idemlink.host.ymodem_io import send_files

    f = tmp_path / "a.bin"
    f.write_bytes(bytes(range(256)) * 20)
    rc, [doc] = run(capsys, "send", "--port", sim.path, str(f), "--no-progress")
    assert rc == 0 and doc["files"][0]["verified"] is True and doc["exit"] == 0

    import serial

    proxy = LinkProxy(None, None, LinkConfig())
    with proxy:
        thread = threading.Thread(target=proxy.serve, daemon=True)
        thread.start()
        sender_port = serial.serial_for_url(proxy.b_path, timeout=0.002)

        def sender() -> None:
            send_files(sender_port, [str(f)])

        t = threading.Thread(target=sender, daemon=True)
        t.start()
        out_dir = tmp_path / "in"
        out_dir.mkdir()
        try:
            rc, [doc] = run(capsys, "receive", "--port", proxy.a_path, "--dir", str(out_dir),
                            "--idle-timeout", "10", "--no-progress")
        finally:
            t.join(timeout=10)
            sender_port.close()
            proxy.stop()
            thread.join(timeout=5)
    assert rc == 0 and doc["files"][0]["name"] == "a.bin" and doc["complete"] is True


@needs_pty
def test_monitor(capsys: pytest.CaptureFixture[str]) -> None:
    pair = open_pty()
    frame = encode_frame(FrameType.REQUEST, 8, 0xABCD, encode_request(WriteSingleRegister(4, 400)))

    done = threading.Event()

    def feed() -> None:
        """The frame again every 50 ms until monitor has one: a copy written before monitor
        opened (and flushed) the port is lost, one after it is read (no guess how long that
        takes)."""
        while not done.is_set():
            os.write(pair.master_fd, frame)
            done.wait(0.05)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        rc, [doc] = run(capsys, "monitor", "--port", pair.slave_path, "--count", "1",
                        "--seconds", "30")
    finally:
        done.set()
        t.join()
        pair.close()
    assert rc == 0 and doc["type"] == "REQUEST"


def first_line(proc: subprocess.Popen[bytes], deadline: float) -> str:
    assert proc.stdout is not None
    buf = b""
    while b"\n" not in buf and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode()


@needs_pty
@pytest.mark.parametrize("command", [["sim"], ["link", "--stats"]])
def test_serving_commands(command: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*CLI, *command, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        head = first_line(proc, time.monotonic() + 20)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    docs = check(head + out.decode())
    if command[0] == "sim":
        assert docs[0]["schema"] == "idemlink.sim/1" and docs[0]["mode"] == "framed"
    else:
        assert [d["schema"] for d in docs] == ["idemlink.link/1", "idemlink.link-stats/1"]
        assert err == b""  # the counters went to stdout with --json


@needs_pty
def test_gateway_and_calls_through_it(sim: PtySim, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("json-test-token-0123456789 tester\n")
    tokens.chmod(0o600)
    proc = subprocess.Popen([*CLI, "gateway", "--port", f"{sim.path}=dev", "--listen",
                             "127.0.0.1:0", "--tokens", str(tokens), "--store",
                             str(tmp_path / "calls.db"), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        head = first_line(proc, time.monotonic() + 30)
        [ready] = check(head)
        assert ready["schema"] == "idemlink.gateway/1"
        env = {**os.environ, "IDEMLINK_GATEWAY_TOKEN": "json-test-token-0123456789"}
        for action in (["write", "threshold=40.0"], ["read", "threshold"]):
            r = subprocess.run([*CLI, "--gateway", ready["url"], *action, "--json"],
                               capture_output=True, text=True, env=env, timeout=60)
            assert r.returncode == 0, r.stderr
            [doc] = check(r.stdout)
            assert doc["schema"] == "idemlink.gateway-call/1" and doc["outcome"] == "OK"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


@pytest.mark.slow
def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    rc, [doc] = run(capsys, "demo", "--burst", "10")
    assert doc["exit"] == rc and doc["summary"]["duplicated_effects"] == 0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version", "--json"])
    [doc] = check(capsys.readouterr().out)
    assert doc["schema"] == "idemlink.version/1"


def test_broadcast_refused_by_the_map(capsys: pytest.CaptureFixture[str]) -> None:
    """A broadcast's own object (each device's, inside ``idemlink.devices/1``, in
    tests/test_bus_cli.py): the map refuses the value, nothing is opened or sent."""
    rc, [doc] = run(capsys, "broadcast", "--port", "loop://", "--address", "1",
                    "threshold=333")
    assert rc == 4 and doc["schema"] == "idemlink.broadcast/1" and doc["outcome"] == "REJECTED"


def test_every_documented_schema_was_checked(request: pytest.FixtureRequest) -> None:
    """Runs last (file order): every schema of the table was printed by a test above (trace goes
    to a file, demo is slow; the error schema of an interrupt is tested in test_cli_progress)."""
    if request.config.getoption("-k") or request.config.option.markexpr:
        pytest.skip("a selection of the tests ran")
    if os.environ.get("PYTEST_XDIST_WORKER") and "@cli_json" not in request.node.nodeid:
        pytest.fail("pytest-xdist did not group this file on one worker (--dist loadgroup): "
                    "pytest 9.2 breaks it (pytest-xdist issue 1386); install '.[test]' again")
    skipped = {"idemlink.trace/1", "idemlink.demo/1"}
    assert set(SCHEMAS) - skipped <= SEEN
