"""The MQTT bridge: a fleet's callers send commands through a broker, the gateway runs them
through its call layer and publishes one outcome per key, the register values on change and its
own presence (docs/GATEWAY.md, "The fleet"; topics and payloads: ``mqtt_topics``).

Contract:

- One MQTT 5 session per gateway (client id ``idemlink-gw-GW``), persistent (clean start off, a
  session expiry of ``SESSION_EXPIRY`` seconds): commands published while the gateway is away
  wait on the broker. Its last will is ``{"state": "offline"}`` on its presence topic
  (retained); once connected it publishes ``online`` with its ports' states.
- A command message is acknowledged (PUBACK, sent by hand in arrival order) only once it is in
  the inbox on disk (``mqtt_inbox``): a QoS 1 redelivery — the gateway gone before its PUBACK,
  the broker restarted — is a copy of a row already there and adds nothing; other content under
  the key is refused as ``IDEMPOTENCY_CONFLICT`` on ``P/refused/CALLER``. A copy of a command
  whose call never ran (the key released: NOT_EXECUTED "safe to retry", or REJECTED before
  anything was stored) is the caller's retry: run again under the key, answered again.
- A command published retained is refused (``RETAINED_COMMAND``), never run: the gateway
  subscribes with "retain as published" to see the flag and without retained messages at
  subscribe, so one left on the broker is never handed to a later connection as if sent again.
- Who may: the topic's caller must be a caller of the tokens file (``UNKNOWN_CALLER``) whose
  role may make the call — the role the HTTP route of the same operation needs
  (``app.needed_role``: ``operator`` for write, clear, trigger) — else ``FORBIDDEN``, as over
  HTTP: refused on arrival (and again before it runs, for a command kept from a run under
  another tokens file), published on ``P/refused/CALLER`` and audited. Every refusal made here
  is audited (method ``MQTT``, path the topic) under the gateway's refusal flood guard
  (``Gateway.audit_refusal``).
- One worker a port runs its commands in arrival order through ``Gateway.call`` (the same keys,
  caller ids, digests, store, audit and shared device pipeline as HTTP; audited with method
  ``MQTT``). A call the store refuses as full (``STORE_FULL``: NOT_EXECUTED, safe to retry) is
  refused at once — published on ``P/refused/CALLER``, its row dropped so the key is free for
  the caller's later retry — not asked again; so is a command that finds the store's file at
  its size limit when it arrives. Keys are judged against the store's retention setting. A
  call that did not run for a passing reason (busy, port down, an open UNKNOWN blocks the
  port) is asked again under its key until its ``wait`` runs out; a call in flight when its port went down is
  asked again until it is settled. Then its outcome — the call's stored body — is written to
  the inbox and published on ``P/outcome/CALLER/KEY`` (QoS 1, retained, expiring with the key's
  record); the row is ``published`` when the broker acknowledges it.
- Exactly one outcome message per key: a gateway that reconnects (or restarts) with outcomes
  written but not acknowledged first looks for each on the broker — it subscribes to their
  topics and to a probe topic, publishes the probe, and every retained outcome the broker
  holds arrives before the probe comes back — and publishes only those it does not find. Each
  connection is a new client, so no library re-sends a message behind the bridge's back.
- Bounded: the broker may have at most ``RECEIVE_MAXIMUM`` commands out to the gateway not yet
  acknowledged, none larger than ``MAX_PACKET`` (MQTT 5 CONNECT properties: the broker holds
  a flood, and drops a message too large, never delivered); the inbox holds at most
  ``mqtt_inbox.MAX_OPEN`` commands not yet answered (more: ``INBOX_FULL``).
- Register values (``Watcher``) are published retained on change, and all of them again after
  each connect; a broker that is down costs nothing but the messages' delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import ssl
import stat
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from idemlink.gateway import mqtt_topics
from idemlink.gateway.app import needed_role
from idemlink.gateway.calls import CallError
from idemlink.gateway.mqtt_inbox import Added, Entry, Inbox, InboxFull
from idemlink.gateway.mqtt_topics import Refused, RetainedCommand, Topics, payload
from idemlink.gateway.service import Gateway, UnknownPort
from idemlink.gateway.store import StoreError, StoreFull
from idemlink.gateway.tokens import DEFAULT_ROLE, allows
from idemlink.gateway.watch import Event, Watcher
from idemlink.protocol.outcome import LocalProtocolError

log = logging.getLogger(__name__)

SESSION_EXPIRY = 7 * 24 * 3600
"""How long the broker keeps the gateway's session (its subscription and queued commands)."""
RECEIVE_MAXIMUM = 16
"""Commands the broker may have delivered to the gateway and not yet had acknowledged (MQTT 5
Receive Maximum): a flood waits on the broker, not in the gateway's memory."""
MAX_PACKET = 1024 * 1024
"""The largest packet the broker may send the gateway (MQTT 5 Maximum Packet Size): a larger
message is dropped by the broker, never read; one over ``mqtt_topics.MAX_PAYLOAD`` and under
this is refused (``MALFORMED_COMMAND``)."""
KEEPALIVE = 10
RETRY_FIRST = 0.1
RETRY_MAX = 2.0
"""A call that did not run for a passing reason is asked again after 0.1 s, doubling to 2 s."""
RECONNECT_MAX = 5.0


class MqttConfigError(LocalProtocolError, ValueError):
    """The ``--mqtt`` options cannot be used (a bad URL, an unsafe password file)."""


class UnknownCaller(CallError):
    """A command under a caller id the gateway's tokens file does not name."""

    reason = "UNKNOWN_CALLER"
    http = 403


class Forbidden(CallError):
    """A command its caller's role may not make (the tokens file's third word): nothing sent."""

    reason = "FORBIDDEN"
    http = 403


class KeyConflict(CallError):
    """A command under a key the caller used for other content: nothing sent."""

    reason = "IDEMPOTENCY_CONFLICT"
    http = 409


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """``mqtt://[USER@]HOST[:PORT]`` (``mqtts://``: TLS, port 8883), the gateway's id in the
    fleet, the topic prefix, and the password (from a file only its owner may read)."""

    host: str
    port: int
    gateway: str
    prefix: str = mqtt_topics.DEFAULT_PREFIX
    username: str | None = None
    password: str | None = None
    tls: bool = False

    @property
    def client_id(self) -> str:
        return f"idemlink-gw-{self.gateway}"

    @classmethod
    def parse(cls, url: str, gateway: str, prefix: str = mqtt_topics.DEFAULT_PREFIX,
              password_file: str | None = None) -> MqttConfig:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("mqtt", "mqtts") or not u.hostname or u.path not in ("", "/"):
            raise MqttConfigError(f"--mqtt {url!r}: expected mqtt://[USER@]HOST[:PORT] (or "
                                  "mqtts://)")
        if u.password is not None:
            raise MqttConfigError("--mqtt: no password in the URL (it would show in `ps`); use "
                                  "--mqtt-password-file")
        try:
            port = u.port or (8883 if u.scheme == "mqtts" else 1883)
        except ValueError as exc:
            raise MqttConfigError(f"--mqtt {url!r}: {exc}") from exc
        try:
            Topics(gateway, prefix)
        except ValueError as exc:
            raise MqttConfigError(str(exc)) from exc
        return cls(u.hostname, port, gateway, prefix, u.username,
                   _password(password_file) if password_file else None, u.scheme == "mqtts")


def _password(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise MqttConfigError(f"password file {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise MqttConfigError(f"password file {path}: not a regular file readable by its "
                                  "owner only; chmod 600 it")
        text = os.read(fd, 4097).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    if not text or len(text) > 4096 or "\n" in text:
        raise MqttConfigError(f"password file {path}: one line, 1-4096 characters")
    return text


class Bridge:
    """The MQTT side of one gateway (see the module docstring)."""

    def __init__(self, gateway: Gateway, watcher: Watcher, config: MqttConfig,
                 callers: set[str], roles: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.gateway = gateway
        self.watcher = watcher
        self.config = config
        self.callers = callers
        self.roles = dict(roles or {})  #: caller -> role (``DEFAULT_ROLE`` for one not named)
        self.clock = clock
        self.topics = Topics(config.gateway, config.prefix)
        self.limits = gateway.store.limits
        self.inbox = Inbox(gateway.store.path, self.limits)
        self.counts = {"received": 0, "duplicates": 0, "conflicts": 0, "refused": 0,
                       "outcomes": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._connected = asyncio.Event()
        self._acks: dict[int, asyncio.Future[bool]] = {}
        self._seen: dict[str, bytes] = {}  #: retained outcomes found while looking (topic -> payload)
        self._looking: set[str] = set()
        self._probe: tuple[str, asyncio.Future[None]] | None = None
        self._outbox = asyncio.Event()
        self._wake = {name: asyncio.Event() for name in gateway.ports}
        self._tasks: list[asyncio.Task[Any]] = []
        self._unlisten: Callable[[], None] | None = None
        self._closing = False
        self._ended = asyncio.Event()
        self._ready: Any = None  #: the client whose connection looked for its outcomes
        self._served = False  #: the current connection was accepted by the broker
        self._failures = 0  #: connections in a row the broker did not accept

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._unlisten = self.watcher.listen(self._watched)
        self._tasks = [asyncio.ensure_future(self._forever("the connection", self._sessions)),
                       asyncio.ensure_future(self._forever("the publisher", self._publisher)),
                       *(asyncio.ensure_future(self._forever(
                           f"port {name}'s worker", functools.partial(self._worker, name)))
                         for name in self.gateway.ports)]

    async def _forever(self, what: str, loop: Callable[[], Any]) -> None:
        """Run ``loop`` again after a failure (a store that cannot be read, a fault of the
        bridge): logged, never a silent stop of the fleet's commands."""
        while True:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("MQTT: %s failed; again in 1 s", what)
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Say offline (when connected), disconnect, stop."""
        self._closing = True
        if self._unlisten is not None:
            self._unlisten()
        client = self._client
        if client is not None and self._connected.is_set():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._publish(client, self.topics.presence,
                                                     self._presence("offline"), retain=True), 2)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if client is not None:
            await asyncio.to_thread(self._stop_client, client)
        self.inbox.close()
        log.info("MQTT: stopped; %s", ", ".join(f"{n} {k}" for k, n in self.counts.items()))

    # ------------------------------------------------------------------ the connection
    def _new_client(self) -> Any:
        from paho.mqtt.client import Client
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

        c = self.config
        client = Client(CallbackAPIVersion.VERSION2, client_id=c.client_id,
                        protocol=MQTTProtocolVersion.MQTTv5, reconnect_on_failure=False,
                        manual_ack=True)
        if c.username is not None:
            client.username_pw_set(c.username, c.password)
        if c.tls:
            client.tls_set_context(ssl.create_default_context())
        client.will_set(self.topics.presence, self._presence("offline"), qos=1, retain=True)
        client.reconnect_delay_set(1, int(RECONNECT_MAX))
        loop = self._loop
        assert loop is not None

        def later(fn: Callable[..., None], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the gateway stopped
                loop.call_soon_threadsafe(fn, client, *args)

        client.on_connect = lambda _c, _u, _f, rc, _p: later(self._on_connect, not rc.is_failure,
                                                              str(rc))
        client.on_disconnect = lambda _c, _u, _f, _rc, _p: later(self._on_disconnect)
        client.on_publish = lambda _c, _u, mid, rc, _p: later(self._on_ack, mid, not rc.is_failure)
        client.on_subscribe = lambda _c, _u, mid, rcs, _p: later(
            self._on_ack, mid, not any(rc.is_failure for rc in rcs))
        client.on_message = lambda _c, _u, m: later(self._on_message, m.topic, bytes(m.payload),
                                                     m.mid, m.qos, bool(m.retain))
        return client

    @staticmethod
    def _stop_client(client: Any) -> None:
        with contextlib.suppress(Exception):
            client.disconnect()
        with contextlib.suppress(Exception):
            client.loop_stop()

    async def _sessions(self) -> None:
        """Connect, serve until the connection ends, connect again with a new client."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        while True:
            self._ended = asyncio.Event()
            client = self._new_client()
            self._client = client
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = SESSION_EXPIRY
            props.ReceiveMaximum = RECEIVE_MAXIMUM
            props.MaximumPacketSize = MAX_PACKET
            client.connect_async(self.config.host, self.config.port, KEEPALIVE,
                                 clean_start=False, properties=props)
            client.loop_start()
            await self._ended.wait()
            self._connected.clear()
            self._ready = None
            await asyncio.to_thread(self._stop_client, client)
            for fut in self._acks.values():
                if not fut.done():
                    fut.set_result(False)
            self._acks.clear()
            if self._probe is not None and not self._probe[1].done():
                self._probe[1].set_exception(ConnectionResetError("the connection ended"))
            # at once after a connection that served; slower after each one that did not
            self._failures = 0 if self._served else self._failures + 1
            self._served = False
            await asyncio.sleep(min(0.2 * 2 ** self._failures, RECONNECT_MAX))

    def _on_connect(self, client: Any, ok: bool, why: str = "") -> None:
        if client is not self._client:
            return
        if not ok:  # the broker's reason: a wrong password is the usual one at setup
            log.warning("MQTT: the broker %s:%d refused the connection of user %s: %s",
                        self.config.host, self.config.port, self.config.username or "(none)",
                        why or "no reason given")
            return
        log.info("MQTT: connected to %s:%d", self.config.host, self.config.port)
        self._served = True
        self._spawn(self._connected_session(client))

    async def _connected_session(self, client: Any) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        try:
            # retained commands are never sent at subscribe, and a command's retain flag is
            # delivered as it was published: one published retained is refused
            if not await self._subscribe(client, [(self.topics.commands, SubscribeOptions(
                    qos=1, retainAsPublished=True,
                    retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND))]):
                log.error("MQTT: the broker refused the subscription %s", self.topics.commands)
            try:
                await self._look_for_published(client)
            except TimeoutError:  # published again: a caller may see an outcome twice
                log.warning("MQTT: the probe did not come back; outcomes not acknowledged are "
                            "published again")
            if client is not self._client:  # this connection ended meanwhile: the next one
                return  # looks for itself before anything is published on it
            self._ready = client
            self._connected.set()
            self._outbox.set()
            await self._publish(client, self.topics.presence, self._presence("online"),
                                retain=True)
            for name, port in self.watcher.snapshot().items():
                for reg in port["registers"].values():
                    self._publish_value(client, name, reg)
        except Exception:
            log.exception("MQTT: the connection's start failed")

    def _on_disconnect(self, client: Any) -> None:
        if client is self._client:
            log.info("MQTT: disconnected")
            self._ended.set()

    def _on_ack(self, client: Any, mid: int, ok: bool) -> None:
        fut = self._acks.pop(mid, None) if client is self._client else None
        if fut is not None and not fut.done():
            fut.set_result(ok)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    async def _acked(self, client: Any, info: tuple[int, int]) -> bool:
        rc, mid = info
        if rc != 0 or client is not self._client:
            return False
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._acks[mid] = fut
        return await fut

    async def _subscribe(self, client: Any, topics: list[tuple[str, Any]]) -> bool:
        return await self._acked(client, client.subscribe(topics))

    async def _publish(self, client: Any, topic: str, data: bytes, *, retain: bool = False,
                       expiry: int | None = None) -> bool:
        """Publish with QoS 1; True once the broker acknowledged it."""
        props = None
        if expiry is not None:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.MessageExpiryInterval = expiry
        info = client.publish(topic, data, qos=1, retain=retain, properties=props)
        return await self._acked(client, (info.rc, info.mid))

    def _presence(self, state: str) -> bytes:
        body: dict[str, Any] = {"state": state, "gateway": self.config.gateway}
        if state == "online":
            body["ports"] = {n: ("up" if p.up else "down") for n, p in self.gateway.ports.items()}
        return payload(body)

    # ------------------------------------------------------------------ incoming
    def _on_message(self, client: Any, topic: str, data: bytes, mid: int, qos: int,
                    retain: bool = False) -> None:
        if client is not self._client:
            return  # an old connection's: not acknowledged, the broker sends it again
        try:
            if self.topics.caller_of(topic) is not None:
                if retain and data:  # (empty and retained: the caller clearing one: nothing)
                    self.counts["received"] += 1
                    self._refuse(client, topic, RetainedCommand(
                        "a command must be published with retain off (the broker would hand "
                        "a retained one to every later subscription); clear it with an empty "
                        "retained message: nothing sent"), _key_of(data), data)
                elif not retain:
                    self._command(client, topic, data)
            elif (sender := self.topics.sender_of(topic)) is not None:  # no caller id at all
                self.counts["received"] += 1
                self._refuse(client, topic, UnknownCaller(
                    f"caller {sender[:80]!r} is not in the gateway's tokens file (a caller id is "
                    "1-64 of A-Z a-z 0-9 _ . : @ -)"), _key_of(data), data)
            elif self._probe is not None and topic == self._probe[0]:
                if not self._probe[1].done():
                    self._probe[1].set_result(None)
            elif topic in self._looking:
                self._seen[topic] = data
        except Exception as exc:  # StoreError above all: the caller sends it again
            log.error("MQTT: a command on %s not taken: %s", topic, exc)
            self._refuse(client, topic, exc, _key_of(data), data)  # which one: its key
        finally:
            if qos > 0:
                client.ack(mid, qos)

    def _command(self, client: Any, topic: str, data: bytes) -> None:
        self.counts["received"] += 1
        now = self.clock()
        try:
            cmd = self.topics.parse(topic, data, now, self.limits.retention_seconds)
            self._check_caller(cmd.caller, cmd.op)
            if cmd.port not in self.gateway.ports:
                raise UnknownPort(f"no port named {cmd.port!r} on gateway "
                                         f"{self.config.gateway}")
        except CallError as exc:
            self._refuse(client, topic, exc, _key_of(data), data)
            return
        added = self.inbox.add(cmd, int(now * 1000))
        if added is Added.DUPLICATE:
            self.counts["duplicates"] += 1
            entry = self.inbox.get(cmd.caller, cmd.key)
            # its call never ran and freed the key (NOT_EXECUTED "safe to retry", REJECTED
            # before anything was stored): this copy is the caller's retry, run as HTTP's is
            if (entry is not None and entry.state != "pending"
                    and self.gateway.store.get(cmd.caller, cmd.key) is None
                    and self.inbox.again(entry, int(now * 1000) + int(cmd.wait * 1000))):
                self._wake[cmd.port].set()
        elif added is Added.CONFLICT:
            self._refuse(client, topic, KeyConflict(f"key {cmd.key} was used for other content: "
                                                 "nothing sent"), cmd.key, data)
        else:
            self._wake[cmd.port].set()

    def _check_caller(self, caller: str, op: str) -> None:
        """``UnknownCaller`` or ``Forbidden`` unless ``caller`` may make ``op`` — the role the
        HTTP route of ``op`` needs (``needed_role``), the same tokens file's roles."""
        if caller not in self.callers:
            raise UnknownCaller(f"caller {caller!r} is not in the gateway's tokens file")
        needed = needed_role("POST", f"/v1/ports/{{port}}/{op}")
        role = self.roles.get(caller, DEFAULT_ROLE)
        if not allows(role, needed):
            raise Forbidden(f"caller {caller} is a {role}: this needs the role {needed} (the "
                            "tokens file's third word)")

    def _refuse(self, client: Any, topic: str, exc: Exception, key: str | None,
                data: bytes = b"") -> None:
        """Refuse a message that is not (or not yet) a call: published on ``P/refused/CALLER``
        (kept on disk until the broker has it) and audited like the HTTP shell's refusals."""
        caller = self.topics.caller_of(topic)
        to = caller or self.topics.sender_of(topic)  # a user whose name is no caller id too
        self.counts["conflicts" if isinstance(exc, KeyConflict) else "refused"] += 1
        log.warning("MQTT: %s refused: %s", topic[:200], exc)
        err = exc if isinstance(exc, CallError) else Refused(str(exc))
        body = mqtt_topics.refusal(err, topic, key)
        if isinstance(exc, KeyConflict):  # as over HTTP: nothing ran, and it will not
            body.update(outcome="NOT_EXECUTED")
        if not isinstance(exc, CallError):  # not taken: nothing stored, nothing sent
            reason, http = (("INBOX_FULL", 503) if isinstance(exc, InboxFull) else
                            ("STORE_FULL", 503) if isinstance(exc, StoreFull) else
                            ("STORE_ERROR", 503) if isinstance(exc, StoreError) else
                            ("INTERNAL_ERROR", 500))
            body.update(outcome="NOT_EXECUTED", action="safe to retry", reason=reason, http=http)
        content = {"body": data[:1000].decode("utf-8", "replace")} if data else {}
        self.gateway.audit_refusal(caller or "-", "MQTT", topic[:300], content, key,
                                   str(body["outcome"]), int(body["http"]))
        if to is None:
            return
        try:
            self._keep_refusal(self.topics.refused(to), body)
        except StoreError:  # the store is what failed: said now, not kept
            client.publish(self.topics.refused(to), payload(body), qos=1)

    def _keep_refusal(self, topic: str, body: dict[str, Any], entry: Entry | None = None) -> None:
        if not self.inbox.refuse(topic, payload(body), entry):
            log.warning("MQTT: too many refusals waiting; not kept: %s", body.get("message"))
        self._outbox.set()

    # ------------------------------------------------------------------ the workers
    async def _worker(self, name: str) -> None:
        wake = self._wake[name]
        while True:
            wake.clear()
            entries = self.inbox.pending(name)
            if not entries:
                await wake.wait()
                continue
            for entry in entries:
                await self._run(entry)

    async def _run(self, entry: Entry) -> None:
        try:  # a row kept from a run under another tokens file: judged by today's
            self._check_caller(entry.caller, entry.op)
        except CallError as exc:
            log.warning("MQTT: key %s refused: %s", entry.key, exc)
            self.counts["refused"] += 1
            body = mqtt_topics.refusal(exc, self.topics.command(entry.caller, entry.port,
                                                                  entry.op), entry.key)
            self.gateway.audit_refusal(entry.caller, "MQTT", str(body["topic"]), entry.args,
                                       entry.key, str(body["outcome"]), exc.http)
            self._keep_refusal(self.topics.refused(entry.caller), body, entry)
            return
        delay = RETRY_FIRST
        while True:
            try:
                answer = await self.gateway.call(entry.caller, entry.key, entry.port, entry.op,
                                                 entry.args, via="MQTT")
                if self._resolve(entry, answer.body):
                    break
            except StoreError as exc:  # asked again under its key: the call layer decides
                log.error("MQTT: key %s: %s", entry.key, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
        self._outbox.set()

    def _resolve(self, entry: Entry, body: dict[str, Any]) -> bool:
        """Write the message that ends ``entry`` if its call has ended; False: ask again."""
        extra = {"gateway": self.config.gateway, "port": entry.port, "op": entry.op,
                 "key": entry.key}
        if body.get("reason") == "IDEMPOTENCY_CONFLICT":  # an HTTP call took the key first
            self.counts["conflicts"] += 1
            self._keep_refusal(self.topics.refused(entry.caller), {**body, **extra}, entry)
            return True
        if body.get("reason") == "STORE_FULL":  # refused at once, as over HTTP (audited by
            self.counts["refused"] += 1  # the call); the key stays free for a later retry
            self._keep_refusal(self.topics.refused(entry.caller), {
                **body, **extra, "topic": self.topics.command(entry.caller, entry.port,
                                                              entry.op)}, entry)
            return True
        rec = self.gateway.store.get(entry.caller, entry.key)
        if rec is not None:
            if rec.state != "done" or rec.body is None:
                return False  # in flight: settled by the device's evidence, then asked again
            final = rec.body
        else:  # nothing ran (released) or refused before anything was stored
            passing = body.get("action") == "safe to retry" or body.get(
                "reason") == "UNKNOWN_OUTSTANDING"
            if passing and self.clock() * 1000 < entry.deadline_ms:
                return False
            final = body
        self.inbox.finish(entry, self.topics.outcome(entry.caller, entry.key),
                          payload({**final, **extra, "replayed": False}), retained=True)
        return True

    # ------------------------------------------------------------------ outgoing
    async def _look_for_published(self, client: Any) -> None:
        """Mark ``published`` every written outcome the broker already holds (retained): a
        previous connection published it and lost the acknowledgement."""
        rows = [e for e in self.inbox.done(limit=1000) if e.retained and e.topic]
        if not rows:
            return
        nonce = secrets.token_hex(8)
        probe = self.topics.probe(nonce)
        came_back: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        looking = {str(e.topic) for e in rows}
        self._looking, self._seen, self._probe = looking, {}, (probe, came_back)
        subs = [(t, 1) for t in sorted(looking)] + [(probe, 1)]
        try:
            if not await self._subscribe(client, subs):
                return
            if not await self._publish(client, probe, b"{}"):
                return
            await asyncio.wait_for(came_back, 30)
            if client is not self._client:
                return  # the connection ended: what arrived may be short of the truth
            for e in rows:
                if e.topic is not None and self._seen.get(e.topic) == e.payload:
                    self.inbox.published(e.id)
                    log.info("MQTT: outcome of key %s was on the broker already", e.key)
        except ConnectionResetError:  # the connection ended before the probe came back
            return
        finally:
            if self._probe is not None and self._probe[1] is came_back:
                self._looking, self._probe = set(), None
            with contextlib.suppress(Exception):
                client.unsubscribe([t for t, _ in subs])

    async def _publisher(self) -> None:
        while True:
            await self._connected.wait()
            client = self._ready  # a connection that has looked for its outcomes already
            if client is None or client is not self._client:
                await asyncio.sleep(0.05)
                continue
            self._outbox.clear()
            refusals = self.inbox.refusals()
            failed = False
            for rid, topic, data in refusals:  # answers to messages: at least once
                if not await self._publish(client, topic, data):
                    failed = True
                    break
                self.inbox.refusal_sent(rid)
            if failed:  # disconnected, or the broker refused it: again shortly
                self._refused_publish(client, "a refusal")
                await asyncio.sleep(0.2)
                continue
            rows = self.inbox.done()
            if not rows and not refusals:
                await self._outbox.wait()
                continue
            for e in rows:
                assert e.topic is not None and e.payload is not None
                ok = await self._publish(client, e.topic, e.payload, retain=e.retained,
                                         expiry=mqtt_topics.outcome_expiry(
                                             self.limits.retention_seconds)
                                         if e.retained else None)
                if not ok:  # disconnected (the next connection looks first), or refused
                    self._refused_publish(client, f"the outcome of key {e.key}")
                    await asyncio.sleep(0.2)
                    break
                self.inbox.published(e.id)
                self.counts["outcomes"] += 1

    def _refused_publish(self, client: Any, what: str) -> None:
        if client is self._client and self._connected.is_set():  # still connected: refused
            log.warning("MQTT: the broker refused %s (its access list?); trying again", what)

    def _watched(self, event: Event) -> None:
        client = self._ready
        if client is None or client is not self._client:
            return
        if event["type"] == "value":
            self._publish_value(client, event["port"], event["register"])
        elif event["type"] == "port":
            client.publish(self.topics.presence, self._presence("online"), qos=1, retain=True)

    def _publish_value(self, client: Any, port: str, reg: dict[str, Any]) -> None:
        client.publish(self.topics.value(port, reg["name"]),
                       payload({**reg, "port": port, "gateway": self.config.gateway,
                                "at_ms": int(self.clock() * 1000)}), qos=1, retain=True)


def _key_of(data: bytes) -> str | None:
    import json

    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    key = body.get("key") if isinstance(body, dict) else None
    return key[:64] if isinstance(key, str) else None


__all__ = ["MAX_PACKET", "RECEIVE_MAXIMUM", "SESSION_EXPIRY", "Bridge", "Forbidden",
           "KeyConflict", "MqttConfig", "MqttConfigError", "UnknownCaller"]
