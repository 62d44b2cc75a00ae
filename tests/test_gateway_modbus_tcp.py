"""The gateway's Modbus TCP face against real Modbus clients (pymodbus's TCP client, ``mbpoll -m
tcp``): a real ``idemlink gateway --modbus-tcp`` process in front of the simulator on a pty;
ground truth from the device's own execution log and registers."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pymodbus.client import ModbusTcpClient
from support.gateway import Gw, running_gateway, served_sim
from support.timing import read_line, scaled

from idemlink.host.command import CommandBuilder
from idemlink.protocol.modbus_tcp_face import Plan, answer_pdu, plan
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.regmap_file import DEFAULT_MAP

B = CommandBuilder(DEFAULT_MAP)


def test_the_face_rules() -> None:
    """What passes, and the exception each outcome gives (the rules, without a server)."""
    read = plan(bytes.fromhex("0300040002"))
    assert read.plan is Plan.READ
    assert answer_pdu(read, Outcome.OK, values=(7, 8)) == bytes.fromhex("0304" "0007" "0008")
    assert answer_pdu(read, Outcome.UNKNOWN, "NO_ANSWER") == bytes.fromhex("830b")
    assert answer_pdu(read, Outcome.NOT_EXECUTED, "PORT_DOWN") == bytes.fromhex("830a")
    assert answer_pdu(read, Outcome.NOT_EXECUTED, "BUSY") == bytes.fromhex("8306")
    assert answer_pdu(read, Outcome.REJECTED, "", 2) == bytes.fromhex("8302")
    write = plan(bytes.fromhex("0600040190"))
    assert write.plan is Plan.WRITE
    assert answer_pdu(write, Outcome.OK) == bytes.fromhex("0600040190")
    assert answer_pdu(write, Outcome.REJECTED, "") == bytes.fromhex("8603")
    for refused in ("0f00000001" "0101", "1600040000ffff", "4200080001", "08"):
        p = plan(bytes.fromhex(refused))
        assert p.plan is Plan.REFUSE and answer_pdu(p, None)[0] & 0x80


def _modbus_address(gw: Gw) -> tuple[str, int]:
    assert gw.proc.stdout is not None
    line = read_line(gw.proc.stdout, gw.proc, timeout=30)
    assert line.startswith("idemlink gateway: modbus tcp on "), line
    host, _, port = line.rsplit(" ", 1)[1].rpartition(":")
    return host, int(port)


def _mbpoll(host: str, port: int, *args: str,
            values: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mbpoll", "-m", "tcp", "-p", str(port), "-a", "1", "-0", "-1",
                           "-o", "2", *args, host, *values], capture_output=True, text=True,
                          timeout=scaled(20))


def _values(out: str) -> dict[int, int]:
    return {int(a): int(v) for a, v in re.findall(r"^\[(\d+)\]:\s+(-?\d+)", out, re.M)}


@contextmanager
def _face(tmp_path: Path) -> Iterator[tuple[Any, Gw, ModbusTcpClient]]:
    with served_sim(tmp_path) as sim, running_gateway(
            tmp_path, [f"{sim.link}=dev"], "--modbus-tcp", "127.0.0.1:0",
            "--timeout", "0.1") as gw:
        host, port = _modbus_address(gw)
        c = ModbusTcpClient(host, port=port, timeout=scaled(3), retries=0)
        assert c.connect()
        try:
            yield sim, gw, c
        finally:
            c.close()


def _pipelined(c: ModbusTcpClient, n: int) -> list[int]:
    """The transaction ids of the answers to ``n`` reads sent in one write, before any answer."""
    import socket
    import struct

    address = (c.comm_params.host, c.comm_params.port)
    with socket.create_connection(address, timeout=scaled(10)) as s:
        s.sendall(b"".join(struct.pack(">HHHB", tid, 0, 6, 1) + bytes([3, 0, 4, 0, 1])
                           for tid in range(n)))
        got = b""
        while len(got) < 11 * n and (chunk := s.recv(65536)):
            got += chunk
    return [struct.unpack(">H", got[i:i + 2])[0] for i in range(0, len(got), 11)]


def test_modbus_clients_read_and_write_through_the_gateway(tmp_path: Path) -> None:
    with _face(tmp_path) as (sim, gw, c):
        r = c.read_holding_registers(4, count=3, device_id=1)
        assert not r.isError() and r.registers == [350, 1, 50]  # the device's defaults
        assert not c.write_register(4, 412, device_id=1).isError()
        assert len(sim.executions_of(B.write_command({"threshold": 412}).pdu())) == 1
        assert not c.write_registers(5, [2, 70], device_id=1).isError()
        assert c.read_holding_registers(4, count=3, device_id=1).registers == [412, 2, 70]
        bad = c.write_registers(5, [1, 500], device_id=1)  # 500 > the map's 100
        assert bad.isError() and bad.exception_code == 3
        assert c.read_holding_registers(5, count=1, device_id=0).registers == [2]  # untouched
        assert c.read_holding_registers(20, count=4, device_id=255).exception_code == 2
        assert c.read_holding_registers(4, count=1, device_id=7).exception_code == 0x0A
        audit = gw.call("GET", "/v1/audit?limit=10").body["entries"]
        assert audit[0]["caller"] == "modbus-tcp@127.0.0.1" and audit[0]["http"] == 422
        assert _pipelined(c, 100) == list(range(100))  # all answered, in order, none dropped
        # a dead unit: the device stops answering; the client gets 0x0B, not its own timeout
        assert sim.line is not None
        sim.line.mute = True
        asked = time.monotonic()
        dead = c.read_holding_registers(4, count=1, device_id=1)
        took = time.monotonic() - asked
        assert dead.isError() and dead.exception_code == 0x0B
        # within the stated time: the port's own wait, --timeout 0.1 x 5 attempts (0.5 s)
        assert 0.45 <= took < 0.5 + scaled(0.5), took


@pytest.mark.slow
def test_modbus_clients_at_once_triggers_and_open_items(tmp_path: Path) -> None:
    with _face(tmp_path) as (sim, gw, c):
        host, port = c.comm_params.host, c.comm_params.port
        assert c.read_input_registers(0, count=1, device_id=1).registers[0] > 0
        trig = c.write_register(8, 1, device_id=1)  # the trigger: the gateway's trigger call
        assert not trig.isError()
        assert len(sim.executions_of(B.trigger_command().pdu())) == 1
        audit = gw.call("GET", "/v1/audit?limit=10").body["entries"]
        assert audit[0]["caller"] == "modbus-tcp@127.0.0.1"
        assert audit[0]["path"] == "/v1/ports/dev/trigger"
        assert not c.write_registers(4, [412, 2, 70], device_id=1).isError()

        # several clients at once, each its own register span: no answer mixed up
        expect = {4: [412, 2, 70], 5: [2, 70], 6: [70]}
        wrong: list[object] = []

        def poll(first: int) -> None:
            mine = ModbusTcpClient(host, port=port, timeout=scaled(3), retries=0)
            assert mine.connect()
            try:
                for _ in range(20):
                    got = mine.read_holding_registers(first, count=len(expect[first]),
                                                      device_id=1)
                    if got.isError() or got.registers != expect[first]:
                        wrong.append(got)
            finally:
                mine.close()

        threads = [threading.Thread(target=poll, args=(a,)) for a in (4, 5, 6) * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []

        if shutil.which("mbpoll") is not None:
            m = _mbpoll(host, port, "-t", "4", "-r", "4", "-c", "3")
            assert m.returncode == 0 and _values(m.stdout) == {4: 412, 5: 2, 6: 70}, m.stdout
            m = _mbpoll(host, port, "-t", "4", "-r", "6", values=("33",))
            assert m.returncode == 0, m.stdout + m.stderr
            assert c.read_holding_registers(6, count=1, device_id=1).registers == [33]

        # a write the device ran but whose answer was lost: 0x0B, an open item blocking the port
        assert sim.line is not None
        sim.line.mute = True
        lost = c.write_register(4, 399, device_id=1)
        assert lost.isError() and lost.exception_code == 0x0B
        sim.line.mute = False
        assert len(sim.executions_of(B.write_command({"threshold": 399}).pdu())) == 1
        assert [i["args"] for i in gw.call("GET", "/v1/open-items").body["open_items"]] == [
            {"values": {"threshold": 399}}]
        blocked = c.write_register(6, 40, device_id=1)  # the port is blocked: nothing sent
        assert blocked.isError() and blocked.exception_code == 0x0A


def test_bad_modbus_units_are_one_line(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from support.gateway import tokens_file

    from idemlink.cli import main

    assert main(["gateway", "--port", "/dev/null=dev", "--tokens", str(tokens_file(tmp_path)),
                 "--store", str(tmp_path / "calls.db"), "--modbus-tcp", "127.0.0.1:0",
                 "--modbus-unit", "3=nope"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--modbus-unit" in err


class _StubGateway:
    """What the face needs of a ``Gateway`` for reads: one port whose registers hold their
    address."""

    def __init__(self) -> None:
        self.ports = {"dev": object()}

    async def read_words(self, port: str, address: int, count: int, table: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(body={"outcome": "OK", "words": list(range(address,
                                                                          address + count))})


def test_hostile_modbus_clients_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Garbled MBAP (protocol id not 0, a length over an ADU, a frame cut short), an unknown
    unit (0x0A), a function the face does not pass (01) — each answered or dropped alone, the
    next request on the same connection served. At most ``MAX_CONNECTIONS`` connections at once
    (one more is closed at once), and a connection that completes no request for
    ``IDLE_SECONDS`` (silent, or a slowloris frame never finished) is closed: its place serves
    the next client."""
    import asyncio
    import contextlib
    import struct

    from idemlink.gateway import modbus_tcp
    from idemlink.gateway.modbus_tcp import ModbusFace

    monkeypatch.setattr(modbus_tcp, "MAX_CONNECTIONS", 3)

    def adu(tid: int, unit: int, pdu: bytes, proto: int = 0, length: int | None = None) -> bytes:
        return struct.pack(">HHHB", tid, proto, len(pdu) + 1 if length is None else length,
                           unit) + pdu

    async def ask(port: int, data: bytes) -> bytes:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(data)
        got = await asyncio.wait_for(r.read(9 + 255), scaled(5))
        w.close()
        return got

    async def closed(reader: asyncio.StreamReader) -> bool:
        return await asyncio.wait_for(reader.read(1), scaled(5)) == b""

    async def run() -> None:
        face = ModbusFace(_StubGateway(), {1: "dev"})  # type: ignore[arg-type]
        server = await asyncio.start_server(face.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        read = bytes.fromhex("0300040002")
        try:
            ok = adu(9, 1, read)
            assert await ask(port, ok) == adu(9, 1, bytes.fromhex("0304" "0004" "0005"))
            for junk in (adu(1, 1, read, proto=1), adu(2, 1, read, length=0xFFFF),
                         adu(3, 1, read, length=1)):  # dropped (with all the connection
                r, w = await asyncio.open_connection("127.0.0.1", port)  # holds), then served
                w.write(junk)
                got = b""
                while not got:  # the client's retry, as a Modbus client does after its timeout
                    w.write(ok)
                    with contextlib.suppress(TimeoutError):
                        got = await asyncio.wait_for(r.read(9 + 255), 0.1)
                assert got == adu(9, 1, bytes.fromhex("030400040005"))
                w.close()
            assert await ask(port, adu(4, 7, read)) == adu(4, 7, bytes.fromhex("830a"))
            assert await ask(port, adu(5, 1, bytes.fromhex("2b0e0100"))) == adu(
                5, 1, bytes.fromhex("ab01"))
            # three silent clients take every place; a fourth is closed at once
            monkeypatch.setattr(modbus_tcp, "IDLE_SECONDS", 0.3)
            silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)
            slow_w.write(ok[:5])  # a frame begun and never finished
            extra_r, extra_w = await asyncio.open_connection("127.0.0.1", port)
            assert await closed(extra_r)
            extra_w.close()
            # idle past IDLE_SECONDS: closed, and a new client is served
            assert all([await closed(r) for r, _ in silent]) and await closed(slow_r)
            for _, w in [*silent, (slow_r, slow_w)]:
                w.close()
            assert await ask(port, ok) == adu(9, 1, bytes.fromhex("030400040005"))
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(run())


def test_a_modbus_client_that_never_reads_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sends requests and never reads their answers: once the socket's buffers
    are full the face waits at most ``IDLE_SECONDS`` to hand over an answer, then closes the
    connection — its place is not held for ever."""
    import asyncio
    import socket
    import struct

    from idemlink.gateway import modbus_tcp
    from idemlink.gateway.modbus_tcp import ModbusFace

    monkeypatch.setattr(modbus_tcp, "IDLE_SECONDS", 0.3)

    async def run() -> None:
        face = ModbusFace(_StubGateway(), {1: "dev"})  # type: ignore[arg-type]
        server = await asyncio.start_server(face.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(s, ("127.0.0.1", port))
        # 125 registers an answer (251 bytes) for 12 bytes asked: the answers fill the buffers
        ask = b"".join(struct.pack(">HHHB", i, 0, 6, 1) + bytes.fromhex("030000007d")
                       for i in range(30000))
        sending = loop.create_task(loop.sock_sendall(s, ask))
        try:
            end = loop.time() + scaled(15)
            while face.connections == 0 and loop.time() < end:
                await asyncio.sleep(0.01)
            while face.connections and loop.time() < end:
                await asyncio.sleep(0.05)
            assert face.connections == 0, "a client that never reads still holds its place"
        finally:
            sending.cancel()
            s.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())
