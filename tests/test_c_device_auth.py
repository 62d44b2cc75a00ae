"""The keyed C device on POSIX (issue 23, docs/SECURITY.md): ``idemlink-device --key-file F``
(``make device`` builds IDL_AUTH=1 in) driven by the keyed host: writes, reads and a trigger run
signed; an unkeyed host's request is answered AUTHENTICATION_REQUIRED and never runs; a host with
another key refuses the device (no downgrade); ``idemlink info`` says "authenticated: yes, key id
…"; a key file that group or others can read is refused in one line, before the device serves.
Under the link's adversary (``soak --authenticated --adversary --device-cmd``) the device runs no
attack, judged from its own effects record; the unkeyed control runs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from support import firmware
from support.timing import scaled

from idemlink.campaign import CampaignConfig, CampaignReport
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice
from idemlink.protocol.auth import key_id
from idemlink.protocol.outcome import Outcome, Status
from idemlink.soak_device import run_device_campaign

KEY = bytes(range(1, 33))
OTHER = bytes(range(33, 65))


def _key_file(path: Path, *keys: bytes, mode: int = 0o600) -> Path:
    path.write_text("".join(k.hex() + "\n" for k in keys), encoding="ascii")
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def device_bin() -> Path:
    return firmware.device_binary()


def test_the_keyed_c_device_runs_signed_commands_and_refuses_the_rest(device_bin: Path,
                                                                     tmp_path: Path) -> None:
    keys = _key_file(tmp_path / "key", KEY)
    flash = tmp_path / "flash"
    flash.mkdir()
    dev = firmware.RunningDevice(device_bin, flash, "--key-file", str(keys))
    try:
        with Device.open(dev.path, key=keys, timeout=0.3) as d:
            d.connect()
            info = d.session.info
            assert info is not None and info.key_id == key_id(KEY)
            assert d.write({"mode": 2}).ok
            assert d.read("mode").values == (2,)
            assert d.trigger().code == 0
        with Device.open(dev.path, timeout=0.2, attempts=2) as d:  # an unkeyed host
            r = d.write({"mode": 3})
            assert (r.outcome, r.status) == (Outcome.NOT_EXECUTED,
                                              Status.AUTHENTICATION_REQUIRED)
        with pytest.raises(IncompatibleDevice, match="key id"), \
                Device.open(dev.path, key=OTHER, timeout=0.2, attempts=2) as d:
            d.connect()
        with Device.open(dev.path, key=KEY, timeout=0.3) as d:
            assert d.read("mode").values == (2,)  # the unkeyed write never ran
        out = subprocess.run([sys.executable, "-m", "idemlink", "info", "--port", dev.path,
                              "--key-file", str(keys)], capture_output=True, text=True,
                             timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert f"yes, key id {key_id(KEY):08x}" in out.stdout
        assert KEY.hex() not in out.stdout + out.stderr
    finally:
        stats = dev.stop()
    assert stats["executed"] == 4 and stats["unauthenticated"] >= 1


def test_a_key_file_others_can_read_is_refused_in_one_line(device_bin: Path,
                                                          tmp_path: Path) -> None:
    for mode in (0o644, 0o640, 0o604):
        keys = _key_file(tmp_path / f"key{mode:o}", KEY, mode=mode)
        proc = subprocess.run([str(device_bin), "--key-file", str(keys)], capture_output=True,
                              text=True, timeout=10, check=False)
        assert proc.returncode == 1 and "0600" in proc.stderr and "refused" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and KEY.hex() not in proc.stderr
    bad = tmp_path / "bad"
    bad.write_text("zz\n", encoding="ascii")
    os.chmod(bad, 0o600)
    proc = subprocess.run([str(device_bin), "--key-file", str(bad)], capture_output=True,
                          text=True, timeout=10, check=False)
    assert proc.returncode == 1 and "line 1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1



def test_a_bad_key_file_is_refused_in_one_line_at_once(device_bin: Path,
                                                        tmp_path: Path) -> None:
    """A FIFO, a directory, a missing file: one line, exit 1, without waiting for a writer (the
    host's rule, protocol/regular_file.py: opened without blocking); an empty file, a binary key,
    a key cut short or too long, five keys: one line, exit 1, the key never in it."""
    os.mkfifo(tmp_path / "fifo", 0o600)
    (tmp_path / "dir").mkdir(mode=0o700)
    for name, data in (("empty", b""), ("binary", KEY), ("short", KEY.hex()[:-2].encode()),
                       ("long", KEY.hex().encode() + b"00"), ("five", 5 * (KEY.hex() + "\n")
                                                                .encode())):
        (tmp_path / name).write_bytes(data)
        (tmp_path / name).chmod(0o600)
    for name, why in (("fifo", "not a regular file"), ("dir", "not a regular file"),
                      ("missing", "No such file"), ("empty", "no key in it"),
                      ("binary", "line 1 is not one key"), ("short", "line 1 is not one key"),
                      ("long", "line 1 is not one key"), ("five", "more than 4 keys")):
        proc = subprocess.run([str(device_bin), "--key-file", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=scaled(10), check=False,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 1 and why in proc.stderr, (name, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and KEY.hex()[:8] not in proc.stderr

# ---- the adversary on the line (issue 23's proof, docs/SOAK.md "--device-cmd") ----------------

POSIX_RETRY = 0.01
"""Seconds (before ``scaled``) the host waits for the posix device (tests/test_c_device_soak.py)."""


def _attacked(commands: int, seed: int, authenticated: bool = True) -> CampaignConfig:
    """The soak's faults on an unpaced line, reboots and host crashes every ~40 commands, the
    attacker on ~30 % of the host's requests."""
    return CampaignConfig(commands=commands, seed=seed, reboot_every=40, restart_every=40,
                          baud=None, latency=0.0, max_batch=8, trigger_duration=0.05,
                          authenticated=authenticated, adversary=0.3)


def _template(device_bin: Path, keyed: bool = True) -> str:
    return (f"{device_bin} --port {{port}} --flash-dir {{flash}} --effects {{effects}} "
            f"--trigger-duration 0.05 --stats" + (" --key-file {key}" if keyed else ""))


def _assert_refused_all(rep: CampaignReport, commands: int) -> None:
    assert rep.commands == commands and not rep.interrupted
    assert (rep.duplicated_effects, rep.lost_acknowledged_writes, rep.misclassified,
            rep.register_semantics, rep.attacks_executed) == (0, 0, 0, 0, 0), rep.verdict()
    assert sum(rep.attacks_delivered.values()) > 0 and rep.refused.get("bad_mac", 0) > 0
    assert rep.refused.get("unauthenticated", 0) > 0 and rep.reboots >= 1


def test_the_keyed_posix_device_runs_no_attack(device_bin: Path) -> None:
    """Forged, replayed (this session's, an older one's), reflected, stripped, truncated and
    bit-flipped frames on a lossy line with reboots: none runs, judged from the device's own
    effects record against the frames the host wrote; legitimate traffic keeps its figures."""
    rep = run_device_campaign(_attacked(120, seed=11), _template(device_bin),
                              retry_timeout=scaled(POSIX_RETRY))
    _assert_refused_all(rep, 120)


def test_the_same_attacks_run_on_an_unkeyed_device(device_bin: Path) -> None:
    """The control: without keys the attacker's forged and flipped frames run, and the judge
    says so (attacks executed, duplicated effects): the test above can fail."""
    rep = run_device_campaign(_attacked(60, seed=12, authenticated=False),
                              _template(device_bin, keyed=False),
                              retry_timeout=scaled(POSIX_RETRY))
    assert rep.attacks_executed > 0 and rep.duplicated_effects > 0


@pytest.mark.slow
def test_the_keyed_posix_device_runs_no_attack_in_a_long_soak(device_bin: Path) -> None:
    rep = run_device_campaign(_attacked(3000, seed=13), _template(device_bin),
                              retry_timeout=scaled(POSIX_RETRY))
    _assert_refused_all(rep, 3000)
    assert rep.reboots >= 20


@pytest.mark.slow
def test_libfuzzer_reaches_the_handshake_and_the_mac_check(tmp_path: Path) -> None:
    """``make fuzz-core`` (IDL_AUTH=1) fuzzes a few seconds, then its keyed seed alone (first byte
    0xFC: a keyed HELLO, then signed, wrongly signed and unsigned frames) covers the handshake
    and the tag check: libFuzzer's own coverage report says so."""
    firmware.need_libfuzzer()
    firmware.make("fuzz-core", "FUZZ_TIME=5")
    corpus = tmp_path / "keyed"
    corpus.mkdir()
    (corpus / "keyed").write_bytes((firmware.FW / "fuzz" / "seeds_core" / "keyed").read_bytes())
    out = subprocess.run([str(firmware.BUILD / "fuzz_core"), "-print_coverage=1", "-runs=0",
                          str(corpus)], capture_output=True, text=True, timeout=120, check=False)
    covered = {line.split()[5] for line in out.stderr.splitlines()
               if line.startswith("COVERED_FUNC")}
    assert {"compress", "idl_frame_encode_signed"} <= covered
    # the tag check's both ends (a refused tag, BAD_MAC, and a verified one, its signer) and the
    # handshake's end (a session key derived): lines, the handshake being inlined in the session
    ends = {}
    for name, marks in (("idl_frame.c", ("return IDL_DECODE_BAD_MAC;",
                                         "out->signer = d->mac_key;")),
                        ("idl_session.c", ("s->keyed = 2u;",))):
        source = (firmware.FW / "src" / name).read_text(encoding="utf-8").splitlines()
        ends[name] = {str(n) for n, line in enumerate(source, 1)
                      if any(mark in line for mark in marks)}
        assert len(ends[name]) == len(marks), name
    for name, lines in ends.items():
        uncovered = {line.rsplit(":", 1)[-1] for line in out.stderr.splitlines()
                     if line.strip().startswith("UNCOVERED_PC") and name in line}
        assert uncovered, f"no uncovered line of {name} listed: the report was not read"
        assert not uncovered & lines, out.stderr[-2000:]


@pytest.mark.slow
def test_the_keyed_microbit_qemu_device_runs_no_attack() -> None:
    """The keyed firmware on QEMU's micro:bit (Cortex-M0; ``make qemu-device-m0
    IDL_OPTS=-DIDL_AUTH=1``, its own BUILD directory), keyed through ``qemu-device --key-file``:
    the attacker's frames run on none of its boots."""
    firmware.make("qemu-device-m0", "IDL_OPTS=-DIDL_AUTH=1", "BUILD=build/qemu-auth",
                  tools=("arm-none-eabi-gcc", "qemu-system-arm"))
    elf = firmware.BUILD / "qemu-auth" / "qemu-microbit" / "idemlink-device.elf"
    template = (f"{sys.executable} {firmware.QEMU_TOOL} --board microbit --elf {elf} "
                f"--port {{port}} --flash-dir {{flash}} --effects {{effects}} "
                f"--trigger-duration 0.05 --key-file {{key}}")
    cfg = replace(_attacked(150, seed=14), reboot_every=100, restart_every=70)
    rep = run_device_campaign(cfg, template, retry_timeout=scaled(0.05))
    assert rep.commands == 150 and not rep.interrupted
    assert (rep.duplicated_effects, rep.lost_acknowledged_writes, rep.misclassified,
            rep.register_semantics, rep.attacks_executed) == (0, 0, 0, 0, 0), rep.verdict()
    assert sum(rep.attacks_delivered.values()) > 0 and rep.reboots >= 1


# ---- the cost figures (make bench-auth): written into README.md by the tool, never typed -------

def _bench_tool():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_auth_docs", firmware.FW / "tools" / "bench_auth_docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_bench_tool_writes_between_the_markers_only(tmp_path: Path) -> None:
    out = tmp_path / "bench.txt"
    out.write_text("cpu=cortex-m0plus module=auth text=0 text_auth=300 delta=300\n"
                   "cpu=cortex-m0plus module=total text=10 text_auth=310 delta=300 "
                   "budget_text=1024 ram=5 ram_auth=9 ram_delta=4 budget_ram=128\n"
                   "cpu=cortex-m0plus model=m0plus-zero-wait case=tag instructions=3 cycles=4 "
                   "us_at_48MHz=0.1 budget_cycles=20000\n")
    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- bench_auth:begin -->\nold\n<!-- bench_auth:end -->\nend\n")
    run = [sys.executable, str(firmware.FW / "tools" / "bench_auth_docs.py"), str(out), str(doc)]
    assert subprocess.run(run, check=False).returncode == 0
    text = doc.read_text()
    assert text.startswith("intro\n<!-- bench_auth:begin -->\n| module") and "old" not in text
    assert "| auth | 0 / 300 (+300) |" in text and "724 B to spare" in text
    assert text.endswith("| 3 | 4 | 0.1 |\n<!-- bench_auth:end -->\nend\n")
    doc.write_text("no markers\n")
    r = subprocess.run(run, capture_output=True, text=True, check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "markers" in r.stderr


@pytest.mark.slow  # two cross builds of five modules and a traced QEMU run
def test_the_readme_quotes_make_bench_auth(tmp_path: Path) -> None:
    """The README's cost table is ``make bench-auth``'s output now (arm-none-eabi-gcc 12's code;
    the cycle counts are the traced run's, exact for a given image); the RAM and the short
    frame's cycles within issue 23's budget."""
    out = firmware.make("bench-auth", f"BUILD={tmp_path}",
                        tools=("arm-none-eabi-gcc", "qemu-system-arm"))
    text = (firmware.FW / "README.md").read_text(encoding="utf-8")
    tool = _bench_tool()
    block = text.split(tool.BEGIN + "\n", 1)[1].split(tool.END, 1)[0]
    assert block == tool.table(out)
    rows = tool.parse(out)
    m0 = next(r for r in rows if r.get("module") == "total" and r["cpu"] == "cortex-m0plus")
    assert int(m0["ram_delta"]) <= int(m0["budget_ram"])
    tag = next(r for r in rows if r.get("case") == "tag")
    assert int(tag["cycles"]) <= int(tag["budget_cycles"])


def test_the_keyed_c_device_shows_its_key_nowhere(device_bin: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """docs/SECURITY.md "Keys never leak", for the C device: not in its stdout/stderr (``--stats``
    included), its effects record, its flash directory, the host's ``--trace`` file, ``info
    --json`` or a command's output — neither the long-term key nor a session key, in any form."""
    import base64

    from idemlink.cli import main

    keys = _key_file(tmp_path / "key", KEY)
    flash, effects, trace = tmp_path / "flash", tmp_path / "effects.jsonl", tmp_path / "t.jsonl"
    flash.mkdir()
    dev = firmware.RunningDevice(device_bin, flash, "--key-file", str(keys), "--effects",
                                 str(effects))
    secrets = {KEY}
    seen: list[tuple[str, bytes]] = []
    try:
        with Device.open(dev.path, key=keys, timeout=0.3) as d:
            assert d.write({"mode": 2}).ok
            auth = d.session.auth
            assert auth is not None and auth.session is not None
            secrets.add(auth.session.key)  # the device derived the same one
        k = ("--port", dev.path, "--key-file", str(keys))
        for argv in (("info", *k, "--json"), ("write", *k, "--json", "--trace", str(trace),
                                              "mode=1")):
            assert main(list(argv)) == 0, argv
            out, err = capsys.readouterr()
            seen.append((f"{argv[0]} output", (out + err).encode()))
    finally:
        dev.proc.terminate()
        out, err = dev.proc.communicate(timeout=scaled(10))
    assert dev.proc.returncode == 0 and "executed=2" in err, err
    seen.append(("the device's stdout and stderr", (out + err).encode()))
    seen.append(("--trace file", trace.read_bytes()))
    seen.append(("effects record", effects.read_bytes()))
    seen += [(f"flash file {p.name}", p.read_bytes()) for p in flash.rglob("*") if p.is_file()]
    assert len(seen) >= 5 and b'"authenticated": true' in seen[0][1] and len(secrets) == 2
    assert trace.stat().st_size > 0 and any(w.startswith("flash file") for w, _ in seen)
    for what, blob in seen:
        for key in secrets:
            for form in (key, key.hex().encode(), key.hex().upper().encode(),
                         base64.b64encode(key), key.hex()[:32].encode()):
                assert form not in blob, what


def test_keyed_and_unkeyed_peers_never_downgrade_on_the_command_line(
        device_bin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A keyed host against the unkeyed C device: one line, exit 1, nothing sent but HELLO; an
    unkeyed host against the keyed C device: NOT_EXECUTED (AUTHENTICATION_REQUIRED), exit 3; a
    host with another key: one line, exit 1. Nothing ran on either device."""
    from idemlink.cli import main

    keys = _key_file(tmp_path / "key", KEY)
    other = _key_file(tmp_path / "other", OTHER)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    unkeyed = firmware.RunningDevice(device_bin, tmp_path / "a")
    keyed = firmware.RunningDevice(device_bin, tmp_path / "b", "--key-file", str(keys))
    fast = ("--timeout", "0.2", "--attempts", "2")
    try:
        for port, key, rc, want in (
                (unkeyed.path, keys, 1, "not keyed (it does not advertise AUTH)"),
                (keyed.path, None, 3, "NOT_EXECUTED (AUTHENTICATION_REQUIRED)"),
                (keyed.path, other, 1, f"the device holds key id {key_id(KEY):08x}")):
            argv = ["write", "--port", port, *fast, "mode=2"]
            argv += ["--key-file", str(key)] if key is not None else []
            assert main(argv) == rc, argv
            out, err = capsys.readouterr()
            assert want in out + err, (argv, out, err)
            if rc == 1:
                assert out == "" and len(err.strip().splitlines()) == 1, err
        assert main(["info", "--port", keyed.path, *fast]) == 0  # "is authentication on?"
        out, _ = capsys.readouterr()
        assert f"no: the device is keyed (key id {key_id(KEY):08x})" in out, out
    finally:
        stats = [unkeyed.stop(), keyed.stop()]
    assert [s["executed"] for s in stats] == [0, 0] and stats[1]["unauthenticated"] >= 1


def test_qemu_device_takes_the_key_files_the_host_takes(tmp_path: Path) -> None:
    """``tools/qemu-device --key-file``, the host's rules (protocol/key_file.py): a symbolic link
    to a private file is read (the QEMU start fails later, here on purpose); a FIFO is refused in
    one line at once, not waited on; a file others can read is refused. No QEMU needed."""
    keys = _key_file(tmp_path / "key", KEY)
    (tmp_path / "link").symlink_to(keys)
    os.mkfifo(tmp_path / "fifo", 0o600)
    wide = _key_file(tmp_path / "wide", KEY, mode=0o644)
    elf = tmp_path / "fake.elf"
    elf.write_bytes(b"")
    (tmp_path / "flash").mkdir()
    for path, refused in ((tmp_path / "link", None), (tmp_path / "fifo", "not a regular file"),
                          (wide, "0600 or stricter")):
        proc = subprocess.run(
            [sys.executable, str(firmware.QEMU_TOOL), "--flash-dir", str(tmp_path / "flash"),
             "--elf", str(elf), "--qemu", "/bin/false", "--key-file", str(path)],
            capture_output=True, text=True, timeout=scaled(10), check=False,
            stdin=subprocess.DEVNULL)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        if refused is None:
            assert "--key-file" not in proc.stderr and "QEMU" in proc.stderr, proc.stderr
        else:
            assert f"--key-file {path}: " in proc.stderr and refused in proc.stderr
        assert KEY.hex() not in proc.stderr


def test_the_posix_device_reads_every_key_file_the_host_reads(device_bin: Path,
                                                              tmp_path: Path) -> None:
    """protocol/key_file.py's format (``bytes.fromhex`` per line: blanks between bytes, ``#``
    comments, CRLF, through a symbolic link): the device serves with such a file, keyed with its
    key; and refuses what the host refuses (a blank inside a byte)."""
    spaced = " ".join(KEY.hex()[i:i + 2] for i in range(0, 64, 2))
    keys = tmp_path / "spaced"
    keys.write_bytes(f"# the device's key\r\n  {spaced}  # current\r\n".encode())
    keys.chmod(0o600)
    (tmp_path / "link").symlink_to(keys)  # followed, as the host does (the file's mode counts)
    flash = tmp_path / "flash"
    flash.mkdir()
    dev = firmware.RunningDevice(device_bin, flash, "--key-file", str(tmp_path / "link"))
    try:
        with Device.open(dev.path, key=keys, timeout=0.3) as d:
            assert d.write({"mode": 1}).ok
    finally:
        assert dev.stop()["executed"] == 1
    bad = _key_file(tmp_path / "bad", KEY)
    bad.write_text("a" + " " + KEY.hex()[1:] + "\n", encoding="ascii")
    proc = subprocess.run([str(device_bin), "--key-file", str(bad)], capture_output=True,
                          text=True, timeout=scaled(10), check=False)
    assert proc.returncode == 1 and "line 1" in proc.stderr, proc.stderr


def test_a_key_file_with_plain_modbus_rtu_is_refused(device_bin: Path, tmp_path: Path) -> None:
    """A plain Modbus RTU slave has no frames to sign: a device given a key and ``--modbus-rtu``
    would serve everyone unauthenticated (a silent downgrade). Refused in one line, exit 1, before
    it serves (the host's rule for ``--key-file`` with ``--modbus-rtu``, docs/SECURITY.md)."""
    keys = _key_file(tmp_path / "key", KEY)
    proc = subprocess.run([str(device_bin), "--flash-dir", str(tmp_path), "--modbus-rtu",
                           "--key-file", str(keys)], capture_output=True, text=True,
                          timeout=scaled(10), check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert "--modbus-rtu" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
