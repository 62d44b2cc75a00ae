"""Modbus TCP (``--modbus-tcp``): MBAP framing and ``TcpMaster`` byte by byte on a simulated
clock, then ``TcpDevice`` / ``AsyncTcpDevice`` and the CLI against pymodbus's own Modbus TCP
server, directly and behind a gateway (``support.modbus_tcp.Gateway``) that refuses (0x0A),
loses answers of executed requests (0x0B, or nothing), and answers late. Ground truth: the
server's log of executed writes and the gateway's log of what it received."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.modbus_tcp import DROP, FORWARD, Gateway, PymodbusTcp
from support.timing import scaled

from idemlink.cli import main
from idemlink.host.aio import AsyncTcpDevice
from idemlink.host.errors import NoDevice, PortError, UnknownOutstanding
from idemlink.host.tcp_device import TcpDevice, socket_url
from idemlink.protocol.modbus import (
    FunctionCode,
    ReadRegisters,
    TriggerRequest,
    WriteSingleRegister,
    encode_request,
)
from idemlink.protocol.modbus_tcp import (
    MAX_ADU,
    MAX_PENDING,
    MbapDecoder,
    MbapFrame,
    TcpAddressError,
    TcpMaster,
    encode_mbap,
    parse_tcp_address,
)
from idemlink.protocol.outcome import IdemlinkError, LocalProtocolError, Outcome, Status
from idemlink.protocol.registers import TriggerStatus
from idemlink.protocol.regmap_file import DEFAULT_MAP

TH, MODE, FAULTS, TRIG = 4, 5, 7, 8
READ_TH = encode_request(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, TH, 1))
READ_MODE = encode_request(ReadRegisters(FunctionCode.READ_HOLDING_REGISTERS, MODE, 1))


# ------------------------------------------------------------------------- MBAP (sans-I/O)


def test_mbap_vector_whole_byte_by_byte_and_with_trailing_bytes() -> None:
    adu = encode_mbap(0x1234, 1, READ_TH)
    assert adu == bytes.fromhex("1234 0000 0006 01 03 0004 0001")
    answer = encode_mbap(0x1234, 1, bytes.fromhex("03 02 01 5e"))
    want = [MbapFrame(0x1234, 1, READ_TH), MbapFrame(0x1234, 1, bytes.fromhex("03 02 01 5e"))]
    for chunks in ([adu + answer], [bytes([b]) for b in adu + answer], [adu + answer[:3]]):
        d = MbapDecoder()
        got = []
        for c in chunks:
            d.receive_data(c)
            while (f := d.next_event()) is not None:
                got.append(f)
        assert got == want[:len(got)] and len(got) == (1 if len(chunks) == 1 and
                                                         len(chunks[0]) < len(adu + answer)
                                                         else 2)
    assert d.buffered == 3 and d.resyncs == 0


@pytest.mark.parametrize("garbled", [
    bytes.fromhex("0001 0001 0006 01 03 0004 0001"),  # protocol id 1
    bytes.fromhex("0001 0000 0001 01"),  # length 1: not even a function code
    bytes.fromhex("0001 0000 0100 01 03"),  # length 256: more than an ADU holds
])
def test_a_garbled_header_drops_the_buffer_and_is_counted(garbled: bytes) -> None:
    d = MbapDecoder()
    d.receive_data(garbled + encode_mbap(2, 1, READ_TH))  # what follows it in the buffer goes too
    assert d.next_event() is None and d.resyncs == 1 and d.buffered == 0
    d.receive_data(encode_mbap(3, 1, READ_TH))  # the next segment starts afresh
    assert d.next_event() == MbapFrame(3, 1, READ_TH)


def test_buffers_are_bounded() -> None:
    d = MbapDecoder()
    d.receive_data(encode_mbap(1, 1, bytes(253))[:-1])
    assert d.buffered == MAX_ADU - 1 and d.next_event() is None
    d = MbapDecoder()
    d.receive_data(b"".join(encode_mbap(i, 1, READ_TH) for i in range(MAX_PENDING + 10)))
    assert d.dropped == 10 and d.next_event() == MbapFrame(10, 1, READ_TH)


@pytest.mark.parametrize(("text", "want"), [
    ("plc.local", ("plc.local", 502)), ("10.0.0.5:1502", ("10.0.0.5", 1502)),
    ("[::1]", ("::1", 502)), ("[fe80::1]:503", ("fe80::1", 503)),
])
def test_addresses(text: str, want: tuple[str, int]) -> None:
    assert parse_tcp_address(text) == want


@pytest.mark.parametrize("bad", ["", ":502", "h:0", "h:70000", "h:x", "::1", "[::1", "[::1]x"])
def test_bad_addresses_are_typed_errors(bad: str) -> None:
    with pytest.raises(TcpAddressError) as exc:
        parse_tcp_address(bad)
    assert isinstance(exc.value, IdemlinkError) and isinstance(exc.value, ValueError)
    assert socket_url("[::1]:1502") == "socket://[::1]:1502"


# ----------------------------------------------------------------- TcpMaster (sans-I/O)


class Clocked:
    """A ``TcpMaster`` on a simulated clock: what it sent, as (tid, unit, pdu)."""

    def __init__(self, **kw: float) -> None:
        self.m = TcpMaster(DEFAULT_MAP, timeout=1.0, attempts=int(kw.pop("attempts", 3)))
        self.t = 0.0

    def submit(self, pdu: bytes) -> None:
        self.m.submit(pdu, self.t, tag=pdu)

    def sent(self) -> list[MbapFrame]:
        self.m.tick(self.t)
        d = MbapDecoder()
        d.receive_data(self.m.data_to_send())
        out = []
        while (f := d.next_event()) is not None:
            out.append(f)
        return out

    def answer(self, tid: int, pdu: bytes) -> None:
        self.m.receive_data(encode_mbap(tid, 1, pdu), self.t)

    def wait(self, seconds: float) -> None:
        self.t += seconds
        self.m.tick(self.t)

    def done(self) -> list[tuple[Outcome, Status | None, str]]:
        out = []
        while (c := self.m.next_event()) is not None:
            out.append((c.outcome, c.status, c.detail))
        return out


def test_a_late_answer_of_an_earlier_request_is_never_taken_for_a_later_one() -> None:
    """Read threshold times out (UNKNOWN, one attempt); read mode goes out; the threshold's
    answer arrives now: it fits the mode read byte for byte (FC03, one register) — over RTU it
    would be taken (docs/MODBUS_RTU.md's one limit) — but its transaction id is not the mode
    read's: ignored and counted; the mode read takes its own answer."""
    c = Clocked(attempts=1)
    c.submit(READ_TH)
    (a,) = c.sent()
    c.wait(1.01)
    assert c.done() == [(Outcome.UNKNOWN, Status.NO_ANSWER, "")]
    c.submit(READ_MODE)
    (b,) = c.sent()
    assert b.tid != a.tid
    c.answer(a.tid, bytes.fromhex("03 02 01 5e"))
    assert c.done() == [] and c.m.late == 1
    c.answer(b.tid, bytes.fromhex("03 02 00 01"))
    assert c.done() == [(Outcome.OK, Status.OK, "")]


def test_a_retry_carries_a_new_id_and_either_send_answers_the_request() -> None:
    for answered in (0, 1):
        c = Clocked()
        c.submit(READ_TH)
        first = c.sent()
        c.wait(1.01)
        second = c.sent()
        assert [f.pdu for f in first + second] == [READ_TH, READ_TH]
        assert first[0].tid != second[0].tid
        c.answer((first + second)[answered].tid, bytes.fromhex("03 02 01 5e"))
        assert c.done() == [(Outcome.OK, Status.OK, "")] and c.m.late == 0


def test_a_truncated_answer_is_never_completed_by_the_next_answers_bytes() -> None:
    """Issue 21 (review): the first send's answer stops after its byte count (9 of 11 bytes);
    the retry's whole answer then arrives. Its first two bytes (the transaction id) must not
    complete the truncated one (that read the retry's id as the value, OK): the partial frame
    is dropped before the retry leaves, and the retry's own answer is the value. Fed whole and
    byte by byte; the same holds when the request ran out of attempts and the next request's
    answer comes after the truncated one."""
    for byte_by_byte in (False, True):
        c = Clocked()
        c.submit(READ_TH)
        (first,) = c.sent()
        c.m.receive_data(encode_mbap(first.tid, 1, bytes.fromhex("03 02 01 5e"))[:9], c.t)
        c.wait(1.01)
        (retry,) = c.sent()
        whole = encode_mbap(retry.tid, 1, bytes.fromhex("03 02 01 5e"))
        for chunk in ([bytes([b]) for b in whole] if byte_by_byte else [whole]):
            c.m.receive_data(chunk, c.t)
        events = []
        while (e := c.m.next_event()) is not None:
            events.append(e)
        assert [(e.outcome, e.pdu) for e in events] == [(Outcome.OK, bytes.fromhex("03 02 01 5e"))]
        assert c.m.resyncs == 1
    c = Clocked(attempts=1)
    c.submit(READ_TH)
    (first,) = c.sent()
    c.m.receive_data(encode_mbap(first.tid, 1, bytes.fromhex("03 02 01 5e"))[:9], c.t)
    c.wait(1.01)
    assert c.done() == [(Outcome.UNKNOWN, Status.NO_ANSWER, "")]
    c.submit(READ_MODE)
    (b,) = c.sent()
    c.answer(b.tid, bytes.fromhex("03 02 00 01"))
    events = []
    while (e := c.m.next_event()) is not None:
        events.append(e)
    assert [(e.outcome, e.pdu) for e in events] == [(Outcome.OK, bytes.fromhex("03 02 00 01"))]


def test_gateway_path_unavailable_is_not_executed_unless_an_earlier_send_went_unanswered() -> None:
    write = encode_request(WriteSingleRegister(TH, 410))
    c = Clocked()
    c.submit(write)
    (f,) = c.sent()
    c.answer(f.tid, bytes([0x86, 0x0A]))
    ((outcome, status, detail),) = c.done()
    assert (outcome, status) == (Outcome.NOT_EXECUTED, None)
    assert "0x0A GATEWAY_PATH_UNAVAILABLE: nothing reached the device" in detail
    c.submit(write)  # the first send unanswered (it may have run), the retry refused
    c.sent()
    c.wait(1.01)
    (g,) = c.sent()
    c.answer(g.tid, bytes([0x86, 0x0A]))
    ((outcome, status, detail),) = c.done()
    assert (outcome, status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
    assert "after 1 unanswered send(s)" in detail


def test_gateway_target_failed_is_no_answer() -> None:
    """0x0B: a read (harmless) is sent again, and ends UNKNOWN after its attempts; a trigger's
    write (sent once) is UNKNOWN at once; a trigger start's state read wrote nothing."""
    c = Clocked(attempts=2)
    c.submit(READ_TH)
    tids = []
    for _ in range(2):
        (f,) = c.sent()
        tids.append(f.tid)
        c.answer(f.tid, bytes([0x83, 0x0B]))
    assert len(set(tids)) == 2
    ((outcome, status, detail),) = c.done()
    assert (outcome, status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
    assert "0x0B GATEWAY_TARGET_FAILED" in detail
    c.submit(encode_request(TriggerRequest(TRIG, 1)))
    (read,) = c.sent()
    c.answer(read.tid, bytes([0x83, 0x0B]))
    (read2,) = c.sent()
    c.answer(read2.tid, bytes([0x83, 0x0B]))
    ((outcome, status, detail),) = c.done()
    assert outcome is Outcome.NOT_EXECUTED and "nothing written" in detail
    c.submit(encode_request(TriggerRequest(TRIG, 1)))
    (read,) = c.sent()
    c.answer(read.tid, bytes.fromhex("03 02 00 00"))  # IDLE: now the write of 1, sent once
    (write,) = c.sent()
    assert write.pdu == encode_request(WriteSingleRegister(TRIG, 1))
    c.answer(write.tid, bytes([0x86, 0x0B]))
    assert c.sent() == []
    ((outcome, status, detail),) = c.done()
    assert (outcome, status) == (Outcome.UNKNOWN, Status.NO_ANSWER)


# --------------------------------------------------------------- against pymodbus's server


@pytest.fixture
def server() -> Iterator[PymodbusTcp]:
    s = PymodbusTcp([spec.default for spec in DEFAULT_MAP])
    yield s
    s.close()


@pytest.fixture
def gateway(server: PymodbusTcp) -> Iterator[Gateway]:
    g = Gateway(server)
    yield g
    g.close()


def test_the_driver_reads_writes_and_triggers_once(server: PymodbusTcp) -> None:
    with TcpDevice.open(server.address, timeout=scaled(0.5)) as dev:
        assert dev.read("threshold").values == (350,)
        assert dev.write({"threshold": 410}).ok
        assert dev.read("threshold").values == (410,)
        first, second = dev.trigger(), dev.trigger()
        assert (first.outcome, first.code) == (Outcome.OK, TriggerStatus.ACCEPTED)
        assert (second.outcome, second.code) == (Outcome.OK, TriggerStatus.RUNNING)
        with pytest.raises(LocalProtocolError, match="0x41"):  # nothing sent: not in the log
            dev.write_if_generation(0, {"threshold": 1})
    assert server.writes == [(TH, [410]), (TRIG, [1])]


def test_a_peer_that_truncates_an_answer_never_gets_a_wrong_value_reported(tmp_path: Path) -> None:
    """Issue 21 (review, ``f4-short:once``): a real socket peer answers the first read with its
    first 9 bytes only, then answers the retry whole. ``read`` must report the true value (was
    the retry's transaction id read as the value, OK, exit 0)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    answers: list[bytes] = []

    def peer() -> None:
        conn, _ = listener.accept()
        with conn:
            buf = b""
            while len(answers) < 2:
                data = conn.recv(256)
                if not data:
                    return
                buf += data
                while len(buf) >= 12:
                    req, buf = buf[:12], buf[12:]
                    adu = req[:4] + b"\x00\x05" + req[6:8] + b"\x02\x01\x5e"
                    conn.sendall(adu[:9] if not answers else adu)
                    answers.append(adu)

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    try:
        with TcpDevice.open(f"127.0.0.1:{port}", timeout=scaled(0.3), probe=False) as dev:
            result = dev.read("threshold")
        assert (result.outcome, result.values) == (Outcome.OK, (0x015E,))
        assert dev.master.resyncs == 1 and len(answers) == 2
    finally:
        listener.close()
        thread.join(5)


def test_a_silent_unit_and_nothing_listening(server: PymodbusTcp, gateway: Gateway) -> None:
    gateway.script = [DROP, DROP]
    with pytest.raises(NoDevice, match="no Modbus TCP device answered at unit 1"):
        TcpDevice.open(gateway.address, timeout=scaled(0.2), attempts=2)
    assert len(gateway.log) == 2 and server.writes == []
    address = gateway.address
    gateway.close()
    with pytest.raises(PortError, match="refused"):
        TcpDevice.open(address)


def test_an_answer_dropped_after_the_write_executed_is_unknown_and_read_back(
        server: PymodbusTcp, gateway: Gateway) -> None:
    with TcpDevice.open(gateway.address, timeout=scaled(0.3), attempts=2) as dev:
        gateway.script = [DROP, DROP]
        r = dev.write({"threshold": 410})
        assert (r.outcome, r.status, r.attempts) == (Outcome.UNKNOWN, Status.NO_ANSWER, 2)
        with pytest.raises(UnknownOutstanding):
            dev.read("threshold")
        rec = dev.reconcile()
        assert rec is not None and rec.intended_state_holds is True and rec.executed is None
        dev.acknowledge_unknown()
        assert dev.read("threshold").values == (410,)
    assert server.writes == [(TH, [410]), (TH, [410])]  # set-only: the retry was harmless


def test_gateway_exceptions_against_the_device_behind_it(server: PymodbusTcp,
                                                         gateway: Gateway) -> None:
    with TcpDevice.open(gateway.address, timeout=scaled(0.5)) as dev:
        gateway.script = [("refuse", 0x0A)]
        r = dev.trigger()
        assert r.outcome is Outcome.NOT_EXECUTED and r.attempts == 0
        assert r.detail == ("the trigger's state read: gateway exception 0x0A "
                            "GATEWAY_PATH_UNAVAILABLE; nothing written")
        gateway.script = [("refuse", 0x0A)]
        r = dev.write({"threshold": 410})
        assert (r.outcome, r.attempts) == (Outcome.NOT_EXECUTED, 1)
        assert r.detail == "gateway exception 0x0A GATEWAY_PATH_UNAVAILABLE: nothing reached the device"
        assert dev.unknown is None and server.writes == []  # not blocked, nothing ran
        gateway.script = [("lose", 0x0B)]
        r = dev.read("threshold")  # a read: sent again
        assert (r.outcome, r.values, r.attempts) == (Outcome.OK, (350,), 2)
        gateway.script = [FORWARD, ("lose", 0x0B)]  # state read, then the write lost
        r = dev.trigger()
        assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
        assert "0x0B GATEWAY_TARGET_FAILED" in r.detail and dev.unknown is r
        rec = dev.reconcile()
        assert rec is not None and rec.executed is None
    assert server.writes == [(TRIG, [1])]  # it did run, once


def test_late_answers_are_never_taken_for_a_later_request(server: PymodbusTcp,
                                                          gateway: Gateway) -> None:
    t = scaled(0.4)
    with TcpDevice.open(gateway.address, timeout=t, attempts=1) as dev:
        gateway.script = [("late", 1.5 * t), ("late", 0.8 * t)]
        r = dev.read("threshold")
        assert (r.outcome, r.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
        r = dev.read("mode")  # the threshold's answer (350) arrives while this is out
        assert (r.outcome, r.values) == (Outcome.OK, (1,))
        assert dev.master.late == 1


def test_the_asyncio_driver(server: PymodbusTcp) -> None:
    async def go() -> None:
        async with AsyncTcpDevice.open(server.address, timeout=scaled(0.5)) as dev:
            assert (await dev.read("threshold")).values == (350,)
            assert (await dev.write({"mode": 2})).ok
            first, second = await dev.trigger(), await dev.trigger()
            assert (first.code, second.code) == (TriggerStatus.ACCEPTED, TriggerStatus.RUNNING)

    asyncio.run(go())
    assert server.writes == [(MODE, [2]), (TRIG, [1])]


# ------------------------------------------------------------------------------ the CLI


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_commands_take_modbus_tcp(server: PymodbusTcp, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    tcp = ("--modbus-tcp", server.address, "--timeout", str(scaled(0.5)))
    rc, out, _ = cli(capsys, "read", "threshold", *tcp, "--json")
    assert rc == 0 and json.loads(out)["values"] == {"threshold": 350}
    assert cli(capsys, "write", "threshold=41", *tcp)[0] == 0
    rc, out, _ = cli(capsys, "trigger", *tcp)
    assert rc == 0 and out == "self_clean: ACCEPTED (0x0000): started\n"
    rc, out, _ = cli(capsys, "clear", *tcp)
    assert rc == 0 and "OK" in out
    rc, out, _ = cli(capsys, "watch", "threshold", *tcp, "--count", "1", "--interval", "0.01")
    assert rc == 0 and "41.0" in out
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"name": "tcp", "steps": [{"write": {"fan_setpoint": 80}},
                                                         {"trigger": "self_clean"}]}))
    rc, out, _ = cli(capsys, "apply", str(plan), *tcp, "--device-id", "boiler-1")
    assert rc == 3 and "fan_setpoint=80 (80 %): written: OK" in out  # the trigger: RUNNING
    assert "not started: the trigger is RUNNING" in out
    rc, _, err = cli(capsys, "info", "--modbus-tcp", server.address)
    assert rc == 1 and "nothing was sent" in err
    rc, _, err = cli(capsys, "read", *tcp, "--modbus-rtu")
    assert rc != 0 and "--modbus-tcp" in err
    rc, _, err = cli(capsys, "read", "--modbus-tcp", "::1")
    assert rc == 1 and "brackets" in err and len(err.splitlines()) == 1
    assert (TH, [410]) in server.writes and (TRIG, [1]) in server.writes
    assert (FAULTS, [7]) in server.writes and (6, [80]) in server.writes
    assert server.writes.count((TRIG, [1])) == 1  # apply's trigger found it RUNNING: not again


def test_cli_gateway_outcomes_and_exit_statuses(server: PymodbusTcp, gateway: Gateway,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    tcp = ("--modbus-tcp", gateway.address, "--timeout", str(scaled(0.5)))
    gateway.script = [FORWARD, ("refuse", 0x0A)]  # the open's probe read, then the write
    rc, out, _ = cli(capsys, "write", "mode=2", *tcp)
    assert rc == 3 and out == ("mode=2 (manual): NOT_EXECUTED (gateway exception 0x0A "
                               "GATEWAY_PATH_UNAVAILABLE: nothing reached the device)\n")
    gateway.script = [FORWARD, FORWARD, ("lose", 0x0B)]  # probe, the state read, the write
    rc, out, _ = cli(capsys, "trigger", *tcp)
    assert rc == 5 and out.startswith(
        "self_clean: UNKNOWN (NO_ANSWER: gateway exception 0x0B GATEWAY_TARGET_FAILED_TO_RESPOND: the "
        "device did not answer the gateway)\n")
    assert "read back: trigger state RUNNING" in out
    assert server.writes == [(TRIG, [1])]


def test_a_device_busy_exception_keeps_its_code_and_name(gateway: Gateway,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 (review, ``f4-exc06``): pymodbus answering exception 06 was shown as
    SERVER_DEVICE_FAILURE. It is SERVER_DEVICE_BUSY, NOT_EXECUTED (the device did nothing),
    in the line and in ``--json``; a code the spec does not define is shown by its number."""
    tcp = ("--modbus-tcp", gateway.address, "--timeout", str(scaled(0.5)))
    gateway.script = [FORWARD, ("refuse", 0x06)]  # the open's probe read, then the read
    rc, out, _ = cli(capsys, "read", "mode", *tcp, "--json")
    doc = json.loads(out)
    assert rc == 3 and doc["outcome"] == "NOT_EXECUTED", out
    assert "SERVER_DEVICE_FAILURE" not in out
    assert doc["results"]["mode"]["exception"] == "SERVER_DEVICE_BUSY"
    gateway.script = [FORWARD, ("refuse", 0x42)]
    rc, out, _ = cli(capsys, "read", "mode", *tcp)
    assert "0x42 (a code the Modbus spec does not define)" in out and "UNKNOWN" in out, out


def test_a_nan_or_infinite_float_is_null_and_text_in_json(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    """Issue 21 (review): an f32 holding NaN printed ``"value": NaN`` in ``read --json`` and
    ``watch --json`` — not JSON. The value is null and ``text`` says NaN, Infinity or
    -Infinity; every line parses with a strict parser."""
    words = [0x7FC0, 0, 0x7F80, 0, 0xFF80, 0, 0x4020, 0]
    server = PymodbusTcp(words)
    try:
        path = tmp_path / "floats.toml"
        path.write_text('name = "floats"\n' + "".join(
            f'[[registers]]\naddress = {a}\nname = "{n}"\nkind = "holding"\ntype = "f32"\n'
            'word_order = "big"\n' for a, n in ((0, "nan"), (2, "inf"), (4, "ninf"), (6, "x"))))
        tcp = ("--modbus-tcp", server.address, "--timeout", str(scaled(0.5)), "--regmap",
               str(path))

        def strict(text: str) -> dict[str, object]:
            def refuse(word: str) -> object:
                raise AssertionError(f"{word} in JSON output: {text}")
            doc: dict[str, object] = json.loads(text, parse_constant=refuse)
            return doc

        rc, out, _ = cli(capsys, "read", "--all", "--json", *tcp)
        assert rc == 0, out
        regs = {r["name"]: r for r in strict(out)["registers"]}  # type: ignore[attr-defined]
        assert [(regs[n]["value"], regs[n].get("text")) for n in ("nan", "inf", "ninf", "x")] == [
            (None, "NaN"), (None, "Infinity"), (None, "-Infinity"), (2.5, None)]
        rc, out, _ = cli(capsys, "watch", "nan", "--count", "1", "--interval", "0.1", "--json",
                         *tcp)
        lines = [strict(line) for line in out.splitlines()]
        assert rc == 0 and lines and "NaN" in out
    finally:
        server.close()


def test_opening_probes_with_the_first_registers_own_function(gateway: Gateway,
                                                             tmp_path: Path) -> None:
    """Issue 21 (review): opening always probed with FC03, even when the map's first register
    is an input register (FC04) — a device that serves only input registers may not answer an
    FC03. The probe reads the first register with its own function."""
    from idemlink.host.rtu_operations import probe_command
    from idemlink.protocol.regmap_file import parse_regmap

    regmap = parse_regmap('name = "inputs"\n[[registers]]\naddress = 3\nname = "temp"\n'
                          'kind = "input"\n[[registers]]\naddress = 0\nname = "relay"\n'
                          'kind = "coil"\n')
    assert probe_command(regmap).pdu() == bytes.fromhex("04 00 03 00 01")
    with TcpDevice.open(gateway.address, regmap=regmap, timeout=scaled(0.5)):
        pass
    assert gateway.log and gateway.log[0][7:] == bytes.fromhex("04 00 03 00 01")


def test_port_and_modbus_tcp_on_one_command_line_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 (review): ``--port X --modbus-tcp H`` silently ignored --port. Both on the
    command line is a usage error (exit 2, nothing opened)."""
    with pytest.raises(SystemExit) as exit_:
        main(["read", "threshold", "--port", "/dev/ttyUSB9", "--modbus-tcp", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--port and --modbus-tcp exclude each other" in err, err


def test_the_read_back_line_shows_values_as_the_map_reads_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 (review): after an UNKNOWN write of an i32 and an f32 the read-back line showed
    raw unsigned integers (comp=4294967291). It shows each value as ``read`` does."""
    server = PymodbusTcp([0] * 6)
    gateway = Gateway(server)
    try:
        path = tmp_path / "typed.toml"
        path.write_text('name = "typed"\n'
                        '[[registers]]\naddress = 0\nname = "comp"\nkind = "holding"\n'
                        'type = "i32"\nword_order = "big"\n'
                        '[[registers]]\naddress = 2\nname = "flow"\nkind = "holding"\n'
                        'type = "f32"\nword_order = "little"\nunit = "m3/h"\n')
        gateway.script = [FORWARD, DROP]  # the open's probe, then the write: executed, unanswered
        rc, out, _ = cli(capsys, "write", "comp=-5", "flow=2.5", "--modbus-tcp", gateway.address,
                         "--timeout", str(scaled(0.3)), "--attempts", "1", "--regmap", str(path))
        assert rc == 0 or "UNKNOWN" in out, out
        assert "comp=-5 flow=2.5 m3/h" in out and "4294967291" not in out, out
    finally:
        gateway.close()
        server.close()


def test_the_address_as_a_connection_setting(server: PymodbusTcp, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``IDEMLINK_MODBUS_TCP`` / a profile's ``modbus_tcp``; the command line's choice of
    --modbus-rtu or --modbus-tcp wins over a profile's other one."""
    monkeypatch.setenv("IDEMLINK_MODBUS_TCP", server.address)
    monkeypatch.setenv("IDEMLINK_UNIT", "1")
    rc, out, _ = cli(capsys, "read", "mode", "--json")
    assert rc == 0 and json.loads(out)["values"] == {"mode": 1}
    monkeypatch.delenv("IDEMLINK_MODBUS_TCP")
    profile = tmp_path / "line.toml"
    profile.write_text('modbus_rtu = true\nport = "/nonexistent/tty"\n')
    rc, out, _ = cli(capsys, "read", "mode", "--profile", str(profile), "--modbus-tcp",
                     server.address)
    assert rc == 0 and "auto (1)" in out
    profile.write_text(f'modbus_tcp = "{server.address}"\n')
    rc, out, _ = cli(capsys, "read", "mode", "--profile", str(profile))
    assert rc == 0 and "auto (1)" in out
    monkeypatch.setenv("IDEMLINK_MODBUS_TCP", "::1")
    with pytest.raises(SystemExit) as exc:  # a bad variable is a usage error, as a bad option
        main(["read", "mode"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "IDEMLINK_MODBUS_TCP='::1'" in err and "brackets" in err
