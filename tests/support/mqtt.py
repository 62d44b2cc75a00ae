"""A real Mosquitto broker for tests (its own config, passwords, access list and persistence in
a temporary directory, on a free port; ready when it logs "running", never a sleep), an MQTT
proxy that cuts a connection at a PUBACK (the sender never learns its message arrived: the
broker or the client must send it again), and a caller's client (paho) that records every
outcome and refusal it is sent."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support.timing import read_line, scaled, wait_until

LONG_USER = "a-broker-user-whose-name-is-longer-than-any-caller-id-of-a-tokens-file"
"""A broker user whose name (over 64 characters) can be no caller id."""
PASSWORDS = {"gw1": "gw1-secret-pass", "gw2": "gw2-secret-pass", "alice": "alice-secret",
             "bob": "bob-secret-pass", "mallory": "mallory-secret", "vic": "vic-secret-pass",
             LONG_USER: "long-secret-pass"}

DOC = Path(__file__).resolve().parents[2] / "docs" / "GATEWAY.md"


def acl(gateways: tuple[str, ...]) -> str:
    """The broker's access list: docs/GATEWAY.md's (for gw1), a user block per other gateway."""
    m = re.search(r"<!-- acl -->\n```text\n(.*?)```", DOC.read_text("utf-8"), re.S)
    assert m is not None, "docs/GATEWAY.md lost its access list"
    shared, sep, gw1 = m.group(1).partition("user gw1\n")
    assert sep, "the access list has no `user gw1` block"
    return shared + "".join(f"user {g}\n" + gw1.replace("gw1", g) for g in gateways)


def need_mosquitto() -> None:
    for tool in ("mosquitto", "mosquitto_passwd"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            pytest.skip(f"{tool} is not installed (apt-get install mosquitto)")
    try:
        import paho.mqtt.client  # noqa: F401
    except ImportError:
        pytest.skip("paho-mqtt is not installed (pip install 'idemlink[test]')")


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Broker:
    directory: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log: list[str] = field(default_factory=list)

    def start(self) -> None:
        conf = self.directory / "mosquitto.conf"
        self.proc = subprocess.Popen([_tool("mosquitto"), "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while True:
            line = read_line(self.proc.stderr, self.proc, timeout=30)
            self.log.append(line)
            if " running" in line:
                break
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            self.log.append(raw.decode(errors="replace").rstrip())

    def published(self, client_id: str, topic_part: str) -> Counter[str]:
        """How many PUBLISH packets the broker received from ``client_id`` on each topic
        containing ``topic_part`` (its debug log: ``Received PUBLISH from ID (d0, q1, r1, m3,
        'TOPIC', ...``), re-sends (``d1``) included."""
        pattern = re.compile(rf"Received PUBLISH from {re.escape(client_id)} \(d\d, q\d, r\d, "
                             r"m\d+, '([^']*)'")
        return Counter(m.group(1) for line in list(self.log)
                       if (m := pattern.search(line)) and topic_part in m.group(1))

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (Mosquitto saves its sessions, queued and retained messages) or SIGKILL."""
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(scaled(20))
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextmanager
def broker(directory: Path, gateways: tuple[str, ...] = ("gw1",), *,
           debug: bool = False, extra: str = "") -> Iterator[Broker]:
    """A broker; ``debug``: it logs every packet (``Broker.published`` counts what it received);
    ``extra``: more lines of its config."""
    need_mosquitto()
    d = directory / "broker"
    d.mkdir()
    pw = d / "passwords"
    for n, (user, password) in enumerate(PASSWORDS.items()):
        subprocess.run([_tool("mosquitto_passwd"), "-b", *(["-c"] if n == 0 else []), str(pw),
                        user, password], check=True, capture_output=True, timeout=scaled(30))
    pw.chmod(0o600)
    (d / "acl").write_text(acl(gateways))
    (d / "acl").chmod(0o600)
    port = free_port()
    (d / "mosquitto.conf").write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous false\n"
        f"password_file {pw}\n"
        f"acl_file {d / 'acl'}\n"
        "persistence true\n"
        f"persistence_location {d}/\n"
        "autosave_interval 1\n"
        "max_queued_messages 100000\n"
        "log_dest stderr\n"
        "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
        + ("log_type debug\n" if debug else "")
        + extra
        + "user root\n")
    b = Broker(d, port)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def password_file(directory: Path, user: str) -> Path:
    p = directory / f"{user}.password"
    p.write_text(PASSWORDS[user] + "\n")
    p.chmod(0o600)
    return p


# ------------------------------------------------------------------ the cutting proxy

def _packets(buf: bytearray) -> Iterator[bytes]:
    """Complete MQTT packets at the front of ``buf`` (taken out of it)."""
    while len(buf) >= 2:
        length, mult, i = 0, 1, 1
        while True:
            if i >= len(buf):
                return
            byte = buf[i]
            length += (byte & 0x7F) * mult
            mult *= 128
            i += 1
            if not byte & 0x80:
                break
        if len(buf) < i + length:
            return
        packet = bytes(buf[:i + length])
        del buf[:i + length]
        yield packet


def _publish_id(packet: bytes) -> tuple[str, int] | None:
    """(topic, packet id) of a QoS 1 or 2 PUBLISH packet; None for any other packet."""
    if packet[0] >> 4 != 3 or not (packet[0] >> 1) & 3:
        return None
    i = 1
    while packet[i] & 0x80:
        i += 1
    i += 1
    n = int.from_bytes(packet[i:i + 2], "big")
    topic = packet[i + 2:i + 2 + n].decode(errors="replace")
    return topic, int.from_bytes(packet[i + 2 + n:i + 4 + n], "big")


def _puback_id(packet: bytes) -> int | None:
    if packet[0] >> 4 != 4:
        return None
    return int.from_bytes(packet[2:4], "big")


class CuttingProxy:
    """A TCP proxy in front of the broker. ``cut(n, side, topic)``: the next ``n`` PUBACKs sent
    by ``side`` ("client": the subscriber acknowledging a delivery; "broker": the broker
    acknowledging a publish) — of a message whose topic contains ``topic``, when given — are
    dropped and the connection closed with them: the sender never learns its message arrived.
    ``hold``: the client's PUBLISHes on topics containing it vanish (the broker never has them,
    the client never hears back)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.cuts_left = 0
        self.side = "client"
        self.topic: str | None = None
        self.cuts = 0
        self.commands = 0  #: command messages (``/cmd/``) the broker sent through the proxy
        self.hold: str | None = None  #: the client's PUBLISHes on such topics are swallowed
        self.held = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, n: int, side: str = "client", topic: str | None = None) -> None:
        with self.lock:
            self.cuts_left, self.side, self.topic = n, side, topic

    def close(self) -> None:
        self.closed = True
        self.server.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            watched: set[int] = set()  #: ids of this connection's publishes whose PUBACK is cut
            for src, dst, side in ((client, upstream, "client"), (upstream, client, "broker")):
                threading.Thread(target=self._pump, args=(src, dst, side, watched),
                                 daemon=True).start()

    def _drop(self, packet: bytes, side: str, watched: set[int]) -> bool:
        with self.lock:
            published = _publish_id(packet)
            if published is not None and side == "broker" and "/cmd/" in published[0]:
                self.commands += 1
            if published is not None and self.side != side and self.topic is not None and (
                    self.topic in published[0]):
                watched.add(published[1])
            acked = _puback_id(packet)
            if acked is None or self.side != side or self.cuts_left <= 0:
                return False
            if self.topic is not None and acked not in watched:
                return False
            self.cuts_left -= 1
            self.cuts += 1
            return True

    def _swallow(self, packet: bytes, side: str) -> bool:
        """A client's PUBLISH on a ``hold`` topic: never forwarded, never acknowledged."""
        with self.lock:
            published = _publish_id(packet)
            if side == "client" and self.hold is not None and published is not None and (
                    self.hold in published[0]):
                self.held += 1
                return True
            return False

    def _pump(self, src: socket.socket, dst: socket.socket, side: str, watched: set[int]) -> None:
        buf = bytearray()
        try:
            while data := src.recv(65536):
                buf += data
                for packet in _packets(buf):
                    if self._drop(packet, side, watched):
                        raise ConnectionAbortedError
                    if self._swallow(packet, side):
                        continue
                    dst.sendall(packet)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


# ------------------------------------------------------------------ a caller's client

class Caller:
    """A caller's MQTT client (persistent session): publishes commands with QoS 1 and records
    every live outcome and refusal message it is sent (retained copies are not counted)."""

    def __init__(self, port: int, user: str, *, client_id: str | None = None,
                 observe: tuple[str, ...] = ()) -> None:
        from paho.mqtt.client import Client
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.user = user
        self.outcomes: dict[str, list[dict[str, Any]]] = {}
        self.refused: list[dict[str, Any]] = []
        self.observed: list[tuple[str, dict[str, Any], bool]] = []
        self.redelivered = 0  #: the broker's QoS 1 retries of deliveries that had arrived
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.client = Client(CallbackAPIVersion.VERSION2, client_id=client_id or f"test-{user}",
                             protocol=MQTTProtocolVersion.MQTTv5)
        self.client.username_pw_set(user, PASSWORDS[user])
        self.client.reconnect_delay_set(1, 2)
        subs = [(f"idemlink/outcome/{user}/#", 1), (f"idemlink/refused/{user}", 1),
                *((t, 1) for t in observe)]

        def on_connect(c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
            if not rc.is_failure:
                c.subscribe(subs)

        def on_subscribe(c: Any, _u: Any, _mid: Any, _rcs: Any, _p: Any) -> None:
            self.connected.set()

        delivered: set[tuple[int, bytes]] = set()

        def on_message(c: Any, _u: Any, m: Any) -> None:
            body = json.loads(m.payload) if m.payload else {}
            with self.lock:
                # the broker's own QoS 1 retry of a delivery (DUP, the same packet id and
                # payload) whose first copy did arrive is one message, counted once
                copy = m.dup and (m.mid, bytes(m.payload)) in delivered
                delivered.add((m.mid, bytes(m.payload)))
                if copy:
                    self.redelivered += 1
                elif m.topic.startswith("idemlink/outcome/") and not m.retain:
                    self.outcomes.setdefault(m.topic.rsplit("/", 1)[1], []).append(body)
                elif m.topic.startswith("idemlink/refused/"):
                    self.refused.append(body)
                else:
                    self.observed.append((m.topic, body, bool(m.retain)))

        def on_disconnect(*_: Any) -> None:
            self.connected.clear()

        self.client.on_connect = on_connect
        self.client.on_subscribe = on_subscribe
        self.client.on_message = on_message
        self.client.on_disconnect = on_disconnect
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", port, 10, clean_start=False, properties=props)
        self.client.loop_start()
        assert self.connected.wait(scaled(20)), f"{user} could not connect"

    def command(self, port: str, op: str, body: dict[str, Any], *, gateway: str = "gw1",
                as_user: str | None = None) -> Any:
        """Publish a command (QoS 1); returns paho's MessageInfo."""
        topic = f"idemlink/cmd/{as_user or self.user}/{gateway}/{port}/{op}"
        return self.client.publish(topic, json.dumps(body), qos=1)

    def outcome(self, key: str, timeout: float = 30) -> dict[str, Any]:
        got: list[dict[str, Any]] = wait_until(lambda: self.outcomes.get(key), timeout=timeout,
                                               what=f"the outcome of {key}")
        return got[0]

    def seen(self, topic_part: str, pred: Any = lambda body: True) -> list[dict[str, Any]]:
        with self.lock:
            return [b for t, b, _r in self.observed if topic_part in t and pred(b)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
