"""The gateway's runtime: the ports it owns, and every call through the call layer's rules.

Contract (docs/GATEWAY.md):

- ``Gateway`` owns one or more ports: an idemlink device (``AsyncDevice``) or a plain Modbus RTU
  slave through its map (``AsyncRtuDevice``). A port that cannot be opened, or fails, is *down*:
  calls on it are NOT_EXECUTED (503, safe to retry) and a task re-opens it (0.2 s doubling to
  5 s); when it is back, the calls it left unsettled are settled first.
- A call with an effect (``call``) follows ``idemlink.gateway.calls``: the record is on disk
  (``CallStore.begin``) before anything else; the request runs by ``execute_recorded``, whose
  ``record`` hook writes the (epoch, seq) and PDU it travels under to the store *before* it leaves.
  Same key and content while it runs: the second caller awaits the first's outcome (marked
  replayed); after: the stored outcome, replayed.
- UNKNOWN is settled by the device's evidence when it can be (``reconcile``: the request re-sent
  under its own number): it ran → OK, never ran → NOT_EXECUTED (key released); no evidence → a
  final UNKNOWN, listed in ``open_items`` and blocking calls with an effect on its port until
  acknowledged (``acknowledge``: who and why are recorded).
- At start (and when a port returns) every call left ``started`` by a gateway that stopped is
  settled the same way — re-sent under the number on disk, the device replays its answer — and
  every call left ``accepted`` (nothing was sent) is released.
- Every call with an effect, refused or run, is in the audit log.

Calls return ``Answer`` (HTTP status, JSON body, headers): the HTTP shell only moves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from idemlink.gateway import calls
from idemlink.gateway.calls import CallError, Decision
from idemlink.gateway.store import MAX_TEXT, CallRecord, CallStore, StoreError, StoreFull
from idemlink.host.aio import AsyncDevice, AsyncDriver, AsyncRtuDevice
from idemlink.host.command import (
    Command,
    CommandBuilder,
    CommandKind,
    Result,
    SentRequest,
    raw_in,
)
from idemlink.host.errors import LinkLost, NoDevice, PortError, UnknownOutstanding
from idemlink.host.frame_view import trigger_code_name
from idemlink.host.operations import reissuable
from idemlink.output import register_entry
from idemlink.protocol.outcome import IdemlinkError, Outcome, Status
from idemlink.protocol.registers import RegisterMap

log = logging.getLogger(__name__)

OPERATIONS = ("write", "clear", "trigger")
"""The calls with an effect, each needing an ``Idempotency-Key``."""

MAX_VALUES = 64
REISSUES = 3
"""How many times a set-only write caught by a device reboot is run again in the new epoch."""
MAX_NAMES = 64
READ_TABLES: dict[str, tuple[bool, bool]] = {"holding": (False, False), "input": (False, True),
                                             "coils": (True, False), "discrete": (True, True)}
"""A raw read's table -> (bits, input function)."""
REFUSAL_AUDIT_BURST = 100
REFUSAL_AUDITS_PER_SECOND = 1.0
"""The HTTP shell's refusals audited at most this fast after a burst (``audit_refusal``): at most
86,400 a day, under the audit log's bound even when every request is a refusal."""
MAX_RELEASED = 10_000
"""How many released background calls' outcomes the status resource remembers."""
SYNC_YIELDS = 3
"""How many turns of the event loop a call's answer waits for another call's synced write to
carry its outcome to disk before syncing it itself."""


class UnknownPort(CallError):
    reason = "UNKNOWN_PORT"
    http = 404


class UnknownCall(CallError):
    reason = "UNKNOWN_CALL"
    http = 404


class AmbiguousOpenItem(CallError):
    """Several callers have an open item under one key text; the acknowledgement must name
    whose (``?caller=ID``)."""

    reason = "AMBIGUOUS_OPEN_ITEM"
    http = 409


class BadArguments(CallError, ValueError):
    """The call's arguments do not make a command of this port's map: REJECTED, nothing sent."""

    reason = "REJECTED"
    http = 422


@dataclass(frozen=True, slots=True)
class PortSpec:
    name: str
    url: str
    regmap: RegisterMap
    rtu: bool = False
    unit: int = 1
    baudrate: int = 115200
    timeout: float = 0.2
    bytesize: int = 8
    parity: str = "N"
    stopbits: float = 1
    #: an idemlink port's private key file (docs/SECURITY.md), read at each open (a rotated
    #: file is taken when the port reopens); the spec holds the path, never the key
    key_file: str | None = None


@dataclass(slots=True)
class Answer:
    http: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Port:
    spec: PortSpec
    device: AsyncDriver | None = None
    reason: str = "not opened yet"
    reopening: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return self.device is not None


def refusal(outcome: Outcome, reason: str, message: str, *, status: Status | None = None,
            key: str | None = None, may_have_effect: bool = True) -> Answer:
    """An answer built from the call layer's table (``calls.rule_for``)."""
    rule = calls.rule_for(outcome, status, reason)
    body = {"outcome": outcome.name, "reason": reason, "message": message,
            "action": calls.action_for(outcome, status, reason, may_have_effect=may_have_effect),
            "replayed": False, "http": rule.http}
    if key is not None:
        body["key"] = key
    headers = {"Retry-After": "1"} if rule.http == 503 else {}
    return Answer(rule.http, body, headers)


def error_answer(exc: CallError, key: str | None = None) -> Answer:
    body: dict[str, Any] = {"outcome": Outcome.REJECTED.name, "reason": exc.reason,
                            "message": str(exc), "action": "do not retry", "replayed": False,
                            "http": exc.http}
    if key is not None:
        body["key"] = key
    return Answer(exc.http, body)


def result_fields(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {"status": r.status.name if r.status is not None else None,
                           "device_replay": r.replay, "attempts": r.attempts,
                           "detail": r.describe()}
    if r.sent_as:
        out["epoch"], out["seq"] = r.sent_as[-1]
    if r.values:
        out["values"] = list(r.values)
    if r.exception_code is not None:
        out["exception_code"] = r.exception_code
    if r.code is not None:
        out["code"] = r.code
        if r.command.kind.name.startswith("TRIGGER"):
            out["code_name"] = trigger_code_name(r.code)
    return out


class Gateway:
    """The ports and the call layer (see the module docstring)."""

    def __init__(self, store: CallStore, specs: list[PortSpec],
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.ports = {s.name: Port(s) for s in specs}
        self.clock = clock
        self._running: dict[tuple[str, str], asyncio.Future[Answer]] = {}
        #: the outcome of background calls that released their key (nothing ran), for their
        #: status resource; the newest ``MAX_RELEASED``, in memory (a restart forgets them:
        #: then 404, and the key may simply be sent again)
        self.released: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        #: the refusal audit's token bucket (``audit_refusal``) and what it did not write
        self._refusal_budget = float(REFUSAL_AUDIT_BURST)
        self._refusal_at = time.monotonic()
        self.refusals_suppressed = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        #: called with the port's name when a call with an effect has its answer
        self.after_call: list[Callable[[str], None]] = []

    # ------------------------------------------------------------------ ports
    async def start(self) -> None:
        """Open every port (a port that does not open is down and re-opened in the background)
        and settle what a stopped gateway left."""
        for port in self.ports.values():
            try:
                await self._open(port)
            except (IdemlinkError, OSError) as exc:
                self._down(port, exc)
        for port in self.ports.values():
            if port.up:
                await self._settle_port(port)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for port in self.ports.values():
            if port.reopening is not None:
                port.reopening.cancel()
            if port.device is not None:
                with contextlib.suppress(Exception):
                    await port.device.close()
                port.device = None

    async def _open(self, port: Port) -> None:
        s = port.spec
        dev: AsyncDriver
        if s.rtu:
            dev = await AsyncRtuDevice.open(s.url, unit=s.unit, regmap=s.regmap,
                                            baudrate=s.baudrate, timeout=s.timeout,
                                            bytesize=s.bytesize, parity=s.parity,
                                            stopbits=s.stopbits)
        else:
            dev = await AsyncDevice.open(s.url, regmap=s.regmap, baudrate=s.baudrate,
                                         timeout=s.timeout, bytesize=s.bytesize,
                                         parity=s.parity, stopbits=s.stopbits, key=s.key_file)
        port.device = dev
        port.reason = ""
        log.info("port %s: open (%s)", s.name, s.url)

    def _down(self, port: Port, exc: BaseException) -> None:
        dev, port.device = port.device, None
        port.reason = f"{type(exc).__name__}: {exc}"
        log.warning("port %s: down (%s)", port.spec.name, port.reason)
        if dev is not None:
            self._spawn(self._close_quietly(dev))
        if port.reopening is None or port.reopening.done():
            port.reopening = asyncio.ensure_future(self._reopen(port))

    async def _close_quietly(self, dev: AsyncDriver) -> None:
        with contextlib.suppress(Exception):
            await dev.close()

    async def _reopen(self, port: Port) -> None:
        delay = 0.2
        while not port.up:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            try:
                await self._open(port)
            except (IdemlinkError, OSError) as exc:
                port.reason = f"{type(exc).__name__}: {exc}"
                continue
            await self._settle_port(port)

    def _port(self, name: str) -> Port:
        port = self.ports.get(name)
        if port is None:
            raise UnknownPort(f"no port named {name!r} (this gateway has: "
                              f"{', '.join(sorted(self.ports))})")
        return port

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ reads
    def port_list(self) -> list[dict[str, Any]]:
        return [self.identity(name) for name in sorted(self.ports)]

    def identity(self, name: str) -> dict[str, Any]:
        port = self._port(name)
        s = port.spec
        out: dict[str, Any] = {"name": s.name, "url": s.url,
                               "kind": "modbus-rtu" if s.rtu else "idemlink",
                               "state": "up" if port.up else "down", "map": s.regmap.name,
                               "map_hash": s.regmap.hash.hex()}
        if s.rtu:
            out["unit"] = s.unit
        if not port.up:
            out["reason"] = port.reason
        info = port.device.info if port.device is not None else None
        if info is not None:
            ops = port.device.ops if port.device is not None else None
            out["device"] = {"name": info.name, "device_id": info.device_id,
                             "epoch": ops.open_epoch() if ops is not None else None,
                             "window": info.window, "max_inflight": info.max_inflight,
                             # issue 23: the id of the device's key (never the key); whether
                             # the session is authenticated is the identity's "authenticated"
                             "key_id": None if info.key_id is None else f"{info.key_id:08x}"}
            out["authenticated"] = (getattr(ops, "authenticated", None)
                                    if ops is not None else None)
            out["info"] = {k: v.hex() if isinstance(v, bytes) else v
                           for k, v in dataclasses.asdict(info).items()}
        out["open_items"] = sum(1 for r in self.store.open_items() if r.port == name)
        return out

    async def read(self, name: str, names: list[str]) -> Answer:
        """Read registers by name (and the generation counter, as the ETag)."""
        port = self._port(name)
        builder = CommandBuilder(port.spec.regmap)
        if not names or len(names) > MAX_NAMES:
            raise BadArguments(f"name 1 to {MAX_NAMES} registers (names=a,b)")
        try:
            commands = [builder.read_command(n) for n in names]
        except (IdemlinkError, ValueError, KeyError) as exc:
            raise BadArguments(str(exc).strip("'\"")) from exc
        gen = port.spec.regmap.generation
        if gen is not None:
            commands.append(builder.read_command(gen.name))
        results = await self._run_reads(port, name, commands)
        if isinstance(results, Answer):
            return results
        bad = next((r for r in results if not r.ok), None)
        registers: dict[str, Any] = {}
        for n, r in zip(names, results, strict=False):
            spec = builder.spec(n)  # the shape every CLI schema gives a reading
            raw = raw_in(spec, r.command, r.values) if r.ok and r.values else None
            registers[n] = {**register_entry(spec, raw), "outcome": r.outcome.name}
        headers: dict[str, str] = {}
        body: dict[str, Any] = {"registers": registers}
        if gen is not None and results[-1].ok:
            body["generation"] = results[-1].values[0]
            headers["ETag"] = calls.etag(results[-1].values[0])
        if bad is None:
            body.update(outcome="OK", reason="OK", action="none", http=200)
            return Answer(200, body, headers)
        status = bad.status
        rule = calls.rule_for(bad.outcome, status)
        body.update(outcome=bad.outcome.name, reason=status.name if status else bad.outcome.name,
                    action=calls.action_for(bad.outcome, status, may_have_effect=False),
                    http=rule.http, detail=bad.describe())
        return Answer(rule.http, body, headers)

    async def _run_reads(self, port: Any, name: str,
                         commands: list[Command]) -> list[Result] | Answer:
        """Run read-only ``commands`` on ``port``'s device: their results, or the refusal a
        down port, a lost link or a blocking UNKNOWN gives (nothing with an effect was sent)."""
        dev = port.device
        if dev is None:
            return refusal(Outcome.NOT_EXECUTED, "PORT_DOWN", f"port {name} is down: {port.reason}",
                           may_have_effect=False)
        try:
            return list(await dev.run(commands))
        except LinkLost as exc:
            self._down(port, exc)
            return refusal(Outcome.UNKNOWN, "LINK_LOST", str(exc), status=Status.LINK_LOST,
                           may_have_effect=False)
        except UnknownOutstanding as exc:
            return refusal(Outcome.NOT_EXECUTED, "UNKNOWN_OUTSTANDING", str(exc),
                           may_have_effect=False)
        except PortError as exc:
            self._down(port, exc)
            return refusal(Outcome.NOT_EXECUTED, "PORT_DOWN", str(exc), may_have_effect=False)

    async def read_words(self, name: str, address: int, count: int, table: str) -> Answer:
        """Read ``count`` words (bits, for ``coils``/``discrete``) of one table from
        ``address`` — the raw read a remote ``Device`` (``idemlink.host.gateway_device``) makes
        of what a command covers; ``words`` in the body. Read-only, like ``read``."""
        port = self._port(name)
        if table not in READ_TABLES:
            raise BadArguments(f"table must be one of {', '.join(READ_TABLES)}")
        if not 0 <= address <= 0xFFFF or not 1 <= count <= 125:
            raise BadArguments("address 0..65535 and count 1..125")
        bits, inputs = READ_TABLES[table]
        command = Command(CommandKind.READ, address, count, input_registers=inputs, bits=bits)
        ran = await self._run_reads(port, name, [command])
        if isinstance(ran, Answer):
            return ran
        (r,) = ran
        status = r.status
        rule = calls.rule_for(r.outcome, status)
        body: dict[str, Any] = {
            "outcome": r.outcome.name, "reason": status.name if status else r.outcome.name,
            "action": calls.action_for(r.outcome, status, may_have_effect=False),
            "http": rule.http, "words": list(r.values), "result": result_fields(r)}
        return Answer(rule.http, body)

    # ------------------------------------------------------------------ calls with an effect
    def command_for(self, regmap: RegisterMap, op: str, args: Mapping[str, Any]) -> Command:
        """The command a call asks for, built by the host's ``CommandBuilder``; ``BadArguments``
        when it cannot be (nothing is stored or sent)."""
        b = CommandBuilder(regmap)
        try:
            if op == "write":
                values = args.get("values")
                if (not isinstance(values, dict) or not values or len(values) > MAX_VALUES
                        or not all(isinstance(v, int | str) and not isinstance(v, bool)
                                   for v in values.values())):
                    raise BadArguments(f'"values" must map 1 to {MAX_VALUES} register names to '
                                       'raw integers or text in the register\'s unit ("42.5", '
                                       "a label): a JSON fraction such as 42.5 is not taken")
                gen = args.get("if_match")
                if gen is not None:
                    return b.write_if_generation_command(int(gen), values)
                return b.write_command(values)
            if op == "clear":
                mask = args.get("mask")
                if not isinstance(mask, int) or isinstance(mask, bool) or not 0 < mask <= 0xFFFF:
                    raise BadArguments('"mask" must be the fault bits to clear, 1..65535')
                return b.clear_faults_command(mask, args.get("register"))
            if op == "trigger":
                reset = args.get("reset", False)
                if not isinstance(reset, bool):
                    raise BadArguments('"reset" must be true or false')
                return b.trigger_command(args.get("register"), reset=reset)
        except CallError:
            raise
        except (IdemlinkError, ValueError, KeyError, TypeError) as exc:
            raise BadArguments(str(exc).strip("'\"")) from exc
        raise BadArguments(f"no operation {op!r} (one of {', '.join(OPERATIONS)})")

    async def call(self, caller: str, key: str | None, name: str, op: str,
                   args: Mapping[str, Any], *, background: bool = False,
                   via: str = "POST") -> Answer:
        """A call with an effect, under the call layer's rules; audited (``via``: the audit
        entry's method, ``POST`` over HTTP, ``MQTT`` through the bridge)."""
        answer = await self._call(caller, key, name, op, dict(args), background)
        for hook in self.after_call:  # e.g. the watcher: read the port again now
            hook(name)
        path = f"/v1/ports/{name}/{op}"
        if answer.http == 202:
            self._audit(caller, via, path, args, key, Answer(202, {"outcome": "ACCEPTED"}))
            running = self._running.get((caller, str(key)))
            if running is not None:  # the outcome is audited when it is known
                running.add_done_callback(
                    lambda t: None if t.cancelled() or t.exception() else
                    self._background_done(caller, str(key), path, args, t.result(), via))
            return answer
        self._audit(caller, via, path, args, key, answer)
        return answer

    def _background_done(self, caller: str, key: str, path: str, args: Mapping[str, Any],
                         answer: Answer, via: str = "POST") -> None:
        """A background call's outcome: audited; one that released its key (nothing ran) is
        kept for its status resource (``released``), which would otherwise not know the key."""
        self._audit(caller, via, path, args, key, answer)
        if "outcome" in answer.body and (caller, key) not in self._running:
            with contextlib.suppress(StoreError):
                if self.store.get(caller, key) is None:
                    self.released[(caller, key)] = dict(answer.body)
                    while len(self.released) > MAX_RELEASED:
                        self.released.popitem(last=False)

    def audit_refusal(self, caller: str, method: str, path: str,
                      content: Mapping[str, Any] | None, key: str | None, outcome: str,
                      http: int) -> None:
        """A refusal the HTTP shell made (401, 403, a malformed body, a failed read...):
        audited like a call, at most ``REFUSAL_AUDIT_BURST`` at once and
        ``REFUSAL_AUDITS_PER_SECOND`` after (a flood of bad requests — anyone can send 401s —
        must not fill the audit log and so stop calls with an effect: ``StoreFull``); those
        beyond are counted, logged, and the next entry says how many (``suppressed``)."""
        now = time.monotonic()
        self._refusal_budget = min(REFUSAL_AUDIT_BURST, self._refusal_budget + (
            now - self._refusal_at) * REFUSAL_AUDITS_PER_SECOND)
        self._refusal_at = now
        if self._refusal_budget < 1:
            self.refusals_suppressed += 1
            if self.refusals_suppressed in (1, 10, 100) or self.refusals_suppressed % 1000 == 0:
                log.warning("%d refusals not audited (over %g a second): the last %s %s %s by "
                            "%s", self.refusals_suppressed, REFUSAL_AUDITS_PER_SECOND, http,
                            method, path, caller)
            return
        self._refusal_budget -= 1
        if self.refusals_suppressed:
            content = {**(content or {}), "suppressed": self.refusals_suppressed}
            self.refusals_suppressed = 0
        self._audit(caller, method, path, content, key, Answer(http, {"outcome": outcome}))

    def _audit(self, caller: str, method: str, path: str, content: Mapping[str, Any] | None,
               key: str | None, answer: Answer) -> None:
        """One audit entry; a store that cannot take it is logged, never turned into a wrong
        answer for a call that already has its outcome."""
        outcome = str(answer.body.get("outcome", ""))
        try:
            try:
                self.store.audit(int(self.clock() * 1000), caller, method, path, content, key,
                                 outcome, answer.http)
            except StoreFull as exc:  # a record over MAX_TEXT: kept without its content
                if "audit log is full" in str(exc):
                    raise
                self.store.audit(int(self.clock() * 1000), caller, method, path,
                                 {"omitted": "over the store's size limit"}, key, outcome,
                                 answer.http)
        except StoreError as exc:
            log.error("audit entry lost (%s %s by %s, key %s, %s %s): %s", method, path, caller,
                      key, outcome, answer.http, exc)

    async def _call(self, caller: str, key: str | None, name: str, op: str,
                    args: dict[str, Any], background: bool) -> Answer:
        now = self.clock()
        try:
            if key is None:
                key = calls.check_key(key, now, self.store.limits.retention_seconds)
            calls.key_time_ms(key)
            port = self._port(name)
            command = self.command_for(port.spec.regmap, op, args)
            if len(calls.canonical(args)) > MAX_TEXT // 2:
                raise BadArguments(f"the call's arguments are over {MAX_TEXT // 2} bytes")
            dig = calls.digest(name, op, args)
            rec = self.store.get(caller, key)
            if rec is None:  # a key with a record is answered by it, even past the window
                calls.check_key(key, now, self.store.limits.retention_seconds)
        except CallError as exc:
            return error_answer(exc, key)
        except StoreError as exc:
            return refusal(Outcome.NOT_EXECUTED, "STORE_ERROR", str(exc), key=key)
        decision = calls.decide(rec.digest if rec else None,
                                rec is not None and rec.state == "done", dig)
        if decision is Decision.REPLAY and (caller, key) in self._running:
            decision = Decision.WAIT  # its outcome is written, not yet synced: await it
        if decision is Decision.CONFLICT:
            return refusal(Outcome.NOT_EXECUTED, "IDEMPOTENCY_CONFLICT",
                           f"key {key} was used for other content (a different call): nothing "
                           "sent", status=Status.IDEMPOTENCY_CONFLICT, key=key)
        if decision is Decision.REPLAY:
            assert rec is not None and rec.body is not None
            return self._replayed(rec.body)
        if decision is Decision.WAIT:
            assert rec is not None
            running = self._running.get((caller, key))
            if running is None:  # left by a stopped gateway, or its port went down
                if port.device is None:
                    return refusal(Outcome.UNKNOWN, "PORT_DOWN",
                                   f"the call is in flight and port {name} is down: it is "
                                   "settled when the port returns; ask again with the same key",
                                   status=Status.LINK_LOST, key=key)
                running = self._start(self._settle(port, rec), caller, key)
            if background:
                return self._accepted(key, "started" if rec.state == "done" else rec.state)
            return self._replayed((await asyncio.shield(running)).body)
        # NEW
        if any(r.port == name for r in self.store.open_items()):
            return refusal(Outcome.NOT_EXECUTED, "UNKNOWN_OUTSTANDING",
                           f"port {name} has an UNKNOWN call nobody acknowledged "
                           "(GET /v1/open-items): nothing sent", key=key)
        if port.device is None:
            return refusal(Outcome.NOT_EXECUTED, "PORT_DOWN",
                           f"port {name} is down: {port.reason}", key=key)
        try:
            self.store.begin(caller, key, calls.key_time_ms(key), dig, name, op, args,
                             int(now * 1000))
        except StoreFull as exc:
            return refusal(Outcome.NOT_EXECUTED, "STORE_FULL", str(exc), key=key)
        except StoreError as exc:
            log.error("call %s refused: %s", key, exc)
            return refusal(Outcome.NOT_EXECUTED, "STORE_ERROR", str(exc), key=key)
        self.released.pop((caller, key), None)
        running = self._start(self._execute(port, caller, key, command), caller, key)
        if background:
            return self._accepted(key, "accepted")
        return (await asyncio.shield(running))

    def _start(self, coro: Any, caller: str, key: str) -> asyncio.Future[Answer]:
        task = self._spawn(self._then_synced(coro))
        self._running[(caller, key)] = task
        task.add_done_callback(lambda _: self._running.pop((caller, key), None))
        return task

    async def _then_synced(self, coro: Any) -> Answer:
        """The call's answer once what it wrote is on disk. Its outcome was written unsynced
        (``_final``); the next call's ``started`` — usually already waiting for the device —
        syncs it along with its own number (group commit), else this syncs it."""
        answer: Answer = await coro
        seen = self.store.syncs
        for _ in range(SYNC_YIELDS):
            if not self.store.unsynced or self.store.syncs != seen:
                return answer
            await asyncio.sleep(0)
        try:
            self.store.sync()
        except StoreError as exc:
            log.error("an outcome not synced: %s", exc)
            answer.body["message"] = (f"{answer.body.get('message', '')} the outcome is not "
                                      f"stored ({exc}): a retry with the same key asks the "
                                      "device again").strip()
        return answer

    @staticmethod
    def _replayed(body: Mapping[str, Any]) -> Answer:
        out = dict(body)
        out["replayed"] = True
        return Answer(int(out["http"]), out, {"Idempotent-Replayed": "true"})

    @staticmethod
    def _accepted(key: str, state: str) -> Answer:
        location = f"/v1/calls/{key}"
        return Answer(202, {"state": state, "key": key, "status_url": location},
                      {"Location": location})

    def status(self, caller: str, key: str) -> Answer:
        """The status resource of a call (its state, and its outcome once done)."""
        rec = self.store.get(caller, key)
        if rec is None:
            gone = self.released.get((caller, key))
            if gone is not None:  # it never ran and its key was released: say so
                return Answer(200, {"key": key, "state": "done", "port": gone.get("port"),
                                    "op": gone.get("op"), "result": gone})
            return error_answer(UnknownCall(f"no call with key {key} for this caller"), key)
        state = rec.state
        if state == "done" and (caller, key) in self._running:
            state = "started"  # its outcome is written, not yet synced
        out: dict[str, Any] = {"key": key, "state": state, "port": rec.port, "op": rec.op}
        if rec.body is not None and state == "done":
            out["result"] = rec.body
        return Answer(200, out)

    async def settled_or(self, caller: str, key: str, timeout: float) -> None:
        """Return when the call under (caller, key) has ended, or after ``timeout`` seconds (a
        watcher's wait between looks at the status resource)."""
        running = self._running.get((caller, key))
        if running is None:
            await asyncio.sleep(timeout)
        else:
            await asyncio.wait({running}, timeout=timeout)

    async def _execute(self, port: Port, caller: str, key: str, command: Command) -> Answer:
        dev = port.device
        assert dev is not None

        failed: list[StoreError] = []

        def record(sent: SentRequest) -> None:
            try:
                self.store.started(caller, key, sent.number, sent.pdu)
            except StoreError as exc:
                failed.append(exc)
                raise

        async def send() -> Result:
            """The call on the device's shared pipeline, its number on disk before it leaves
            (``run_recorded``): independent calls — reads and other writes — share the line;
            commands that do not commute (the same registers, a conditional write next to a
            write) keep their order. A plain Modbus slave takes one request at a time anyway."""
            if port.spec.rtu:
                return await dev.execute_recorded(command, record)
            result = await dev.run_recorded(command, record)
            if failed:
                raise failed[-1]
            return result

        try:
            if not port.spec.rtu and not reissuable(command, port.spec.regmap):
                # A trigger or fault clear cannot be run again if a reboot catches it, and a
                # device that rebooted while idle refuses the old boot's number in a way the
                # session cannot tell from a late copy's refusal (UNKNOWN). So it asks the
                # device first (HELLO): a reboot since is learnt here, and the command leaves
                # in the boot it will run in. One round trip a trigger or clear.
                await dev.connect()
            result = await send()
            caught: Result | None = None  # the first copy, which may have run before a reboot
            for _ in range(REISSUES):
                # The session's own rule, for a request pinned to one number: a set-only write
                # caught by a reboot is harmless to repeat, so it runs again in the new epoch
                # under a new number, on disk before it leaves as the first was.
                # And one the session had no number for yet (a handshake under way) never
                # left: it goes once the handshake is through.
                if (result.status is Status.EPOCH_CHANGED_IN_FLIGHT
                        and reissuable(command, port.spec.regmap)):
                    caught = caught or result
                    dev.acknowledge_unknown()
                elif not (result.outcome is Outcome.NOT_EXECUTED and result.status is None
                          and not result.sent_as):
                    break
                elif dev.unknown is not None:  # another call's UNKNOWN blocks the device: this
                    raise UnknownOutstanding(  # one never left; it waits for the reconciling
                        "another call on this port is UNKNOWN: nothing sent")
                await dev.connect()
                result = await send()
            if caught is not None and result.outcome is not Outcome.OK:
                result = caught  # not run again: the first copy may have run, UNKNOWN it stays
        except UnknownOutstanding as exc:
            self.store.release(caller, key)
            return refusal(Outcome.NOT_EXECUTED, "UNKNOWN_OUTSTANDING", str(exc), key=key)
        except StoreError as exc:  # the number could not be recorded: the request never left
            log.error("call %s not sent: %s", key, exc)
            with contextlib.suppress(StoreError):  # else released at the next look or start
                self.store.release(caller, key)
            return refusal(Outcome.NOT_EXECUTED, "STORE_ERROR", str(exc), key=key)
        except (PortError, NoDevice) as exc:
            self._down(port, exc)
            rec = self.store.get(caller, key)
            if rec is None or rec.state == "accepted":
                self.store.release(caller, key)
                return refusal(Outcome.NOT_EXECUTED, "PORT_DOWN", str(exc), key=key)
            return refusal(Outcome.UNKNOWN, "LINK_LOST",
                           f"{exc}: the request was out; it is settled by the device's evidence "
                           "when the port returns; ask again with the same key",
                           status=Status.LINK_LOST, key=key)
        except (IdemlinkError, ValueError) as exc:
            self.store.release(caller, key)
            return error_answer(BadArguments(str(exc)), key)
        if result.outcome is Outcome.UNKNOWN and command.may_have_effect:
            return await self._reconcile_now(port, caller, key, result)
        return self._final(caller, key, result)

    def _final(self, caller: str, key: str, result: Result, reason: str = "",
               note: str = "") -> Answer:
        status = result.status
        outcome = result.outcome
        word = reason or (status.name if status is not None else outcome.name)
        rule = calls.rule_for(outcome, status, reason)
        body: dict[str, Any] = {"outcome": outcome.name, "reason": word,
                                "action": calls.action_for(outcome, status, reason),
                                "replayed": False, "http": rule.http, "key": key,
                                "result": result_fields(result)}
        if note:
            body["message"] = note
        try:
            if calls.keeps_key(outcome, status, reason):  # synced before it is answered
                self.store.finish(caller, key, outcome.name, body, synced=False)
            else:
                self.store.release(caller, key)
        except StoreError as exc:
            # The outcome is true but not on disk: the record still says ``started`` with its
            # number, so a retry under the key asks the device again (its replayed answer).
            log.error("call %s: outcome %s not stored: %s", key, outcome.name, exc)
            body["message"] = (f"{note + '; ' if note else ''}the outcome is not stored ({exc}): "
                               "a retry with the same key asks the device again")
        return Answer(rule.http, body, {"Retry-After": "1"} if rule.http == 503 else {})

    async def _reconcile_now(self, port: Port, caller: str, key: str, result: Result) -> Answer:
        dev = port.device
        assert dev is not None
        try:
            rec = await dev.reconcile(result)
        except (IdemlinkError, OSError) as exc:
            if isinstance(exc, LinkLost):
                self._down(port, exc)
            return self._unknown(caller, key, result, f"no evidence: {exc}")
        assert rec is not None
        return self._verdict(dev, caller, key, result, rec.executed, rec.resent, rec.evidence)

    def _verdict(self, dev: AsyncDriver, caller: str, key: str, result: Result,
                 executed: bool | None, resent: Result | None, evidence: str) -> Answer:
        if executed is None:
            return self._unknown(caller, key, result, evidence)
        dev.acknowledge_unknown()  # the device's own record settled it
        if executed:
            shown = resent if resent is not None and resent.ok else result
            done = Result(shown.command, Outcome.OK, Status.OK, values=shown.values,
                          code=shown.code, replay=True if resent is None else resent.replay,
                          attempts=shown.attempts, sent_as=shown.sent_as or result.sent_as,
                          answered=True)
            return self._final(caller, key, done, "OK", f"settled by the device's evidence: "
                                                      f"{evidence}")
        self.store.release(caller, key)
        return refusal(Outcome.NOT_EXECUTED, "NOT_EXECUTED_RETRY",
                       f"settled by the device's evidence: {evidence}", key=key)

    def _unknown(self, caller: str, key: str, result: Result, evidence: str) -> Answer:
        return self._final(caller, key, result, "", f"UNKNOWN, open until acknowledged "
                                                    f"(POST /v1/open-items/{key}/acknowledge): "
                                                    f"{evidence}")

    # ------------------------------------------------------------------ settling after a stop
    async def _settle_port(self, port: Port) -> None:
        for rec in self.store.unsettled(port.spec.name):
            if (rec.caller, rec.key) in self._running:
                continue
            try:
                await self._start(self._settle(port, rec), rec.caller, rec.key)
            except (IdemlinkError, OSError) as exc:  # it stays unsettled; the others go on
                log.warning("call %s could not be settled: %s", rec.key, exc)

    async def _settle(self, port: Port, rec: CallRecord) -> Answer:
        """A call a stopped gateway (or a lost port) left: never sent → released; sent → re-sent
        under the number on disk and judged by the device's answer."""
        if rec.state == "accepted" or (rec.pdu is None):
            self.store.release(rec.caller, rec.key)
            return refusal(Outcome.NOT_EXECUTED, "NOT_EXECUTED_RETRY",
                           "the gateway stopped before the request left: nothing sent",
                           key=rec.key)
        dev = port.device
        if dev is None:
            return refusal(Outcome.UNKNOWN, "PORT_DOWN", f"port {port.spec.name} is down",
                           status=Status.LINK_LOST, key=rec.key)
        try:
            command = self.command_for(port.spec.regmap, rec.op, rec.args)
        except CallError as exc:  # the map changed since: nothing can ask the device about it
            body = {"outcome": Outcome.UNKNOWN.name, "reason": "UNKNOWN", "http": 502,
                    "action": calls.action_for(Outcome.UNKNOWN, None), "replayed": False,
                    "key": rec.key, "message": f"cannot be re-sent as it was: {exc}; open "
                                               "until acknowledged"}
            self.store.finish(rec.caller, rec.key, Outcome.UNKNOWN.name, body)
            return Answer(502, body)
        sent_as: tuple[tuple[int, int], ...] = (
            ((rec.epoch, rec.seq),) if rec.epoch is not None and rec.seq is not None else ())
        pending = Result(command, Outcome.UNKNOWN, Status.NO_ANSWER, sent_as=sent_as)
        if command.pdu() != rec.pdu:
            return self._unknown(rec.caller, rec.key, pending,
                                 "the map changed since: the request cannot be re-sent as it was")
        try:
            # The re-send's verdict alone: a read-back would travel under new numbers, and
            # the new session's first number puts every other old number still to be asked
            # behind the device's window (TOO_OLD: an UNKNOWN the design absorbs).
            recon = await dev.reconcile_sent(command, sent_as, read_back=False)
        except LinkLost as exc:
            self._down(port, exc)
            return refusal(Outcome.UNKNOWN, "LINK_LOST", str(exc), status=Status.LINK_LOST,
                           key=rec.key)
        log.info("call %s settled after a stop: %s", rec.key, recon.evidence)
        return self._verdict(dev, rec.caller, rec.key, pending, recon.executed, recon.resent,
                             recon.evidence)

    # ------------------------------------------------------------------ open items
    def open_items(self) -> list[dict[str, Any]]:
        return [r.summary() for r in self.store.open_items()]

    def acknowledge(self, by: str, key: str, reason: str, owner: str | None = None) -> Answer:
        """Settle the open item under ``key``: ``owner``'s when named, else the acknowledging
        caller's own, else the only one under that key text (keys are scoped to callers, so two
        callers may each have one: then the owner must be named)."""
        if not reason.strip():
            return error_answer(BadArguments('"reason" is required: say why it is settled'), key)
        items = [r for r in self.store.find_key(key) if r.open_item]
        if owner is not None:
            items = [r for r in items if r.caller == owner]
        elif len(items) > 1:
            items = [r for r in items if r.caller == by] or items
        if len(items) > 1:
            return error_answer(AmbiguousOpenItem(
                f"{len(items)} callers ({', '.join(sorted(r.caller for r in items))}) have an "
                f"open item under key {key}: name whose with ?caller=ID"), key)
        if not items:
            return error_answer(UnknownCall(f"no open item with key {key}"
                                            + (f" of caller {owner}" if owner else "")), key)
        item = items[0]
        self.store.acknowledge(item.caller, key, by, reason, int(self.clock() * 1000))
        port = self.ports.get(item.port)
        if port is not None and port.device is not None and port.device.unknown is not None:
            port.device.acknowledge_unknown()
        answer = Answer(200, {"key": key, "caller": item.caller, "port": item.port,
                              "acknowledged_by": by, "reason": reason})
        self._audit(by, "POST", f"/v1/open-items/{key}/acknowledge",
                    {"reason": reason, "caller": item.caller}, key,
                    Answer(200, {"outcome": "ACKNOWLEDGED"}))
        return answer


__all__ = ["OPERATIONS", "AmbiguousOpenItem", "Answer", "BadArguments", "Gateway", "Port",
           "PortSpec", "UnknownCall",
           "UnknownPort", "refusal"]
