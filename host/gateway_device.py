"""The ``Device`` API through a gateway: ``Device.open("idemlink+http://HOST:PORT/PORTNAME")``.

Contract (docs/API.md, "Through a gateway"; docs/GATEWAY.md):

- ``GatewayDevice`` is a ``Device`` whose commands are calls of an ``idemlink gateway`` (over
  ``idemlink.host.gateway_client.GatewayClient``, standard library only): ``run``/``execute``
  and every named command (``read``, ``write``, ``write_if_generation``, ``clear_faults``,
  ``trigger``, ``trigger_reset``, ``trigger_status``) give the same ``Result`` a direct
  ``Device`` gives — its outcome, status, values, code, the (epoch, seq) it travelled under —
  built from the gateway's answer. ``AsyncGatewayDevice`` is the same for ``AsyncDevice``
  (``AsyncDevice.open`` of the same URL): each call runs the blocking client in a thread.
- **Keys.** Every command with an effect is one call under a new UUIDv7 key, made once and sent
  again on the client's own retries (connection lost, 503 "safe to retry", an UNKNOWN the gateway
  settles when its port returns): a retry is the same call, run at most once.
- **Reads** go by address (``GET .../registers?address=A&count=N&table=T``): the words the
  command covers, exactly as a direct read returns them.
- **What cannot go through** raises ``NotThroughGateway`` (a ``LocalProtocolError``: nothing
  sent): file transfers (``send_files``, ``file_info``), ``stream`` of commands whose order the
  gateway cannot keep (it is ``run`` one command after another here), ``execute_recorded``,
  ``reconcile_sent``, a mask write (FC22), coil writes, and a bus address in the URL. An UNKNOWN
  is the gateway's to settle (it asks the device by evidence and lists what stays unknown as an
  open item): ``reconcile`` says so (``executed`` None, the key in ``evidence``), and the handle
  is never blocked here — the gateway's open item blocks the port for every caller instead.
- **Token**: ``token``, else the file ``token_file``, else ``$IDEMLINK_GATEWAY_TOKEN``, else the
  file ``$IDEMLINK_GATEWAY_TOKEN_FILE``; none is ``NotThroughGateway``. The port name may be
  left out when the gateway has one port.
- The register map is the caller's, as with any ``Device``: one that is not the port's map (by
  hash) is refused (``IncompatibleDevice``) unless ``check_map`` is False. An unreachable gateway
  is ``PortError`` at open; during a call, ``GatewayUnreachable`` (with the call's key).
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from idemlink.host.aio import AsyncDevice
from idemlink.host.command import (
    Command,
    CommandBuilder,
    CommandKind,
    Reconciliation,
    Result,
    SentRequest,
)
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice, PortError
from idemlink.host.gateway_client import GatewayClient, GatewayUnreachable
from idemlink.host.operations import DriverStats
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.payloads import DeviceInfo
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP, resolve_regmap

if TYPE_CHECKING:
    from idemlink.host.operations import Operations
    from idemlink.protocol.host_session import HostSession
    from idemlink.protocol.ymodem_files import ProgressCallback, TransferReport
    from idemlink.protocol.ymodem_sender import SenderConfig

SCHEMES = ("idemlink+http://", "idemlink+https://")
"""The URL prefixes ``Device.open`` hands to this module."""
TOKEN_ENV = "IDEMLINK_GATEWAY_TOKEN"
TOKEN_FILE_ENV = "IDEMLINK_GATEWAY_TOKEN_FILE"
GATEWAY_TIMEOUT = 30.0
"""Seconds an HTTP call may take (the gateway answers after the device's own retries)."""


class NotThroughGateway(LocalProtocolError):
    """What a gateway does not carry (a file transfer, a mask write...), a bad gateway URL or no
    token: refused before anything is sent."""


def is_gateway_url(url: str) -> bool:
    return url.startswith(SCHEMES)


def parse_gateway_url(url: str) -> tuple[str, str | None]:
    """(the gateway's base URL, the port name or None) of ``idemlink+http://HOST:PORT/NAME``."""
    if not is_gateway_url(url):
        raise NotThroughGateway(f"{url!r} is not a gateway URL (idemlink+http://HOST:PORT/PORT)")
    parts = urllib.parse.urlsplit(url[len("idemlink+"):])
    if not parts.hostname or parts.query or parts.fragment:
        raise NotThroughGateway(f"{url!r}: expected idemlink+http://HOST:PORT/PORTNAME")
    path = [urllib.parse.unquote(p) for p in parts.path.split("/") if p]
    if len(path) > 1:
        raise NotThroughGateway(
            f"{url!r}: a bus address after the port name is not carried by the gateway yet "
            "(it names each device by its port)")
    base = f"{parts.scheme}://{parts.netloc}"
    return base, (path[0] if path else None)


def read_token(token: str | None = None, token_file: str | os.PathLike[str] | None = None,
               environ: Mapping[str, str] | None = None) -> str:
    """The bearer token (see the module docstring for where it is looked for)."""
    env = os.environ if environ is None else environ
    if token:
        return token.strip()
    path = token_file or env.get(TOKEN_FILE_ENV) or None
    if path is None:
        text = env.get(TOKEN_ENV, "").strip()
        if text:
            return text
        raise NotThroughGateway(f"no gateway token: give token=, token_file=, ${TOKEN_ENV} or "
                                f"${TOKEN_FILE_ENV}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as exc:
        raise NotThroughGateway(f"token file {os.fspath(path)}: {exc.strerror or exc}") from None
    if not text:
        raise NotThroughGateway(f"token file {os.fspath(path)} is empty")
    return text


_TABLES = {(False, False): "holding", (False, True): "input", (True, False): "coils",
           (True, True): "discrete"}


def result_of(command: Command, answer: Mapping[str, Any]) -> Result:
    """The ``Result`` a direct device would have given, from the gateway's answer body."""
    word = str(answer.get("outcome", ""))
    outcome = Outcome[word] if word in Outcome.__members__ else Outcome.UNKNOWN
    res: Mapping[str, Any] = answer.get("result") or {}
    said = res.get("status") or answer.get("reason")
    status = Status[said] if isinstance(said, str) and said in Status.__members__ else None
    values = tuple(answer.get("words") or res.get("values") or ())
    sent_as = ((int(res["epoch"]), int(res["seq"])),) if res.get("epoch") is not None else ()
    detail = str(answer.get("message") or res.get("detail") or "")
    if answer.get("key"):
        detail = f"{detail} (gateway key {answer['key']})".strip()
    return Result(command, outcome, status, values=values if outcome is Outcome.OK else (),
                  code=res.get("code"),
                  replay=bool(res.get("device_replay")) or bool(answer.get("replayed")),
                  attempts=int(res.get("attempts") or 0),
                  epoch=sent_as[-1][0] if sent_as else 0, seq=sent_as[-1][1] if sent_as else 0,
                  sent_as=sent_as, answered=outcome is Outcome.OK, detail=detail)


def _info_of(identity: Mapping[str, Any]) -> DeviceInfo | None:
    info = identity.get("info")
    if not isinstance(info, dict):
        return None
    fields = dict(info)
    for name in ("contract_hash", "map_hash", "device_nonce"):
        if isinstance(fields.get(name), str):
            fields[name] = bytes.fromhex(fields[name])
    try:
        return DeviceInfo(**fields)
    except TypeError:  # a newer gateway's field: not this host's to read
        return None


class _Remote:
    """The calls a remote device makes (shared by the blocking and the awaited one)."""

    def __init__(self, client: GatewayClient, port: str, regmap: RegisterMap) -> None:
        self.client = client
        self.port = port
        self.regmap = regmap
        self.builder = CommandBuilder(regmap)
        self.identity: dict[str, Any] = {}

    def look(self, check_map: bool) -> None:
        try:
            answer = self.client._once("GET", f"/v1/ports/{urllib.parse.quote(self.port, '')}")
        except (OSError, GatewayUnreachable) as exc:
            raise PortError(f"gateway {self.client.url}: {exc}") from None
        if "name" not in answer:
            raise PortError(f"gateway {self.client.url} port {self.port}: {answer.get('http')} "
                            f"{answer.get('reason')}: {answer.get('message', '')}")
        if check_map and answer.get("map_hash") != self.regmap.hash.hex():
            raise IncompatibleDevice(
                f"gateway port {self.port} serves the map {answer.get('map')} "
                f"({answer.get('map_hash')}), not {self.regmap.name} "
                f"({self.regmap.hash.hex()})")
        self.identity = answer

    def names(self, command: Command) -> dict[str, int]:
        """(name -> raw value) of each register a write covers (``named_values``)."""
        try:
            return self.builder.named_values(command)
        except LocalProtocolError as exc:
            raise NotThroughGateway(f"{exc}: the gateway writes registers by name") from None

    def call(self, command: Command) -> Result:
        c, port = self.client, self.port
        k = command.kind
        if command.bits and k is not CommandKind.READ:
            raise NotThroughGateway("a coil write does not go through the gateway")
        if k is CommandKind.READ:
            answer = c._retried("GET", f"/v1/ports/{urllib.parse.quote(port, '')}/registers?"
                                + urllib.parse.urlencode({
                                    "address": command.address, "count": command.count,
                                    "table": _TABLES[(command.bits, command.input_registers)]}),
                                None, None)
        elif k is CommandKind.WRITE:
            answer = c.write(port, self.names(command))
        elif k is CommandKind.WRITE_IF_GENERATION:
            answer = c.write(port, self.names(command), if_match=command.generation)
        elif k is CommandKind.CLEAR_FAULTS:
            spec = self.regmap.at(command.address)
            assert spec is not None
            answer = c.clear(port, command.values[0], spec.name)
        elif k in (CommandKind.TRIGGER, CommandKind.TRIGGER_RESET) and not command.values:
            spec = self.regmap.at(command.address)
            assert spec is not None
            answer = c.trigger(port, spec.name, reset=k is CommandKind.TRIGGER_RESET,
                               wait=GATEWAY_TIMEOUT)
            if answer.get("state") is not None:  # not done within the wait: still running
                return Result(command, Outcome.UNKNOWN, Status.NO_ANSWER,
                              detail=f"the gateway's call {answer.get('key')} is still "
                                     f"{answer.get('state')}: ask GET /v1/calls/KEY")
        else:
            raise NotThroughGateway(f"a {k.value} does not go through the gateway (read, write, "
                                    "conditional write, fault clear and trigger do)")
        return result_of(command, answer)

    def reconciliation(self, result: Result | None) -> Reconciliation | None:
        if result is None:
            return None
        return Reconciliation(result.command, {}, None,
                              "the gateway settles an UNKNOWN itself (by the device's evidence, "
                              "else an open item: GET /v1/open-items)",
                              None, f"the gateway's record: {result.detail}")


def _refuse(what: str) -> NotThroughGateway:
    return NotThroughGateway(f"{what} does not go through the gateway (docs/API.md, "
                             "\"Through a gateway\")")


def _opened_remote(url: str, regmap: RegisterMap | str | os.PathLike[str], check_map: bool,
                   token: str | None, token_file: str | os.PathLike[str] | None) -> _Remote:
    base, port = parse_gateway_url(url)
    rm = regmap if isinstance(regmap, RegisterMap) else resolve_regmap(regmap)
    client = GatewayClient(base, read_token(token, token_file), timeout=GATEWAY_TIMEOUT)
    if port is None:
        try:
            ports = client.ports().get("ports")
        except (OSError, GatewayUnreachable) as exc:
            raise PortError(f"gateway {base}: {exc}") from None
        names = [p["name"] for p in ports or []]
        if len(names) != 1:
            raise NotThroughGateway(f"the gateway {base} has {len(names)} ports "
                                    f"({', '.join(names)}): name one ({base}/NAME)")
        port = str(names[0])
    remote = _Remote(client, port, rm)
    remote.look(check_map)
    return remote


class GatewayDevice(Device):
    """A ``Device`` through a gateway (see the module docstring)."""

    def __init__(self, remote: _Remote) -> None:
        CommandBuilder.__init__(self, remote.regmap)
        self.remote = remote
        self.url = f"idemlink+{remote.client.url}/{remote.port}"

    @classmethod
    def open_url(cls, url: str, *, regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP,
                 check_map: bool = True, token: str | None = None,
                 token_file: str | os.PathLike[str] | None = None) -> GatewayDevice:
        return cls(_opened_remote(url, regmap, check_map, token, token_file))

    # the handle: nothing of a session here
    @property
    def unknown(self) -> Result | None:
        return None

    @property
    def info(self) -> DeviceInfo | None:
        return _info_of(self.remote.identity)

    @property
    def epoch(self) -> int | None:
        """The device's boot epoch as the gateway last saw it."""
        device = self.remote.identity.get("device") or {}
        epoch = device.get("epoch")
        return int(epoch) if epoch is not None else None

    @property
    def authenticated(self) -> bool | None:
        """Whether the gateway's session with the device is authenticated (None: not said)."""
        said = self.remote.identity.get("authenticated")
        return bool(said) if said is not None else None

    @property
    def session(self) -> HostSession:
        raise _refuse("the host session (epoch, sequence numbers)")

    @property
    def ops(self) -> Operations[Any]:  # type: ignore[override]
        raise _refuse("the driver's operations")

    @property
    def stats(self) -> DriverStats:
        raise _refuse("the line's statistics")

    @property
    def check_map(self) -> bool:
        return True

    def acknowledge_unknown(self) -> None:
        """Nothing to unblock here: the gateway's open item is acknowledged at the gateway."""

    def connect(self) -> None:
        self.remote.look(True)

    def close(self) -> None:
        """Nothing is held open between calls."""

    def run(self, commands: Iterable[Command]) -> list[Result]:
        cmds = list(commands)
        for c in cmds:  # refused before anything is sent, as a device's run is
            if c.kind not in (CommandKind.READ, CommandKind.WRITE, CommandKind.WRITE_IF_GENERATION,
                              CommandKind.CLEAR_FAULTS, CommandKind.TRIGGER,
                              CommandKind.TRIGGER_RESET):
                raise _refuse(f"a {c.kind.value}")
        return [self.remote.call(c) for c in cmds]

    def stream(self, commands: Iterable[Command]) -> Iterator[Result]:
        for c in commands:
            yield self.run([c])[0]

    def execute(self, command: Command) -> Result:
        return self.run([command])[0]

    def file_info(self, name: str) -> Result:
        raise _refuse("FILE_INFO")

    def send_files(self, paths: Iterable[str], *, progress: ProgressCallback | None = None,
                   config: SenderConfig | None = None,
                   overwrite: bool = False) -> tuple[Result, TransferReport | None]:
        raise _refuse("a file transfer")

    def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        return self.remote.reconciliation(result)

    def reconcile_sent(self, command: Command,
                       sent_as: tuple[tuple[int, int], ...] = (),
                       read_back: bool = True) -> Reconciliation:
        raise _refuse("reconcile_sent (the gateway keeps its own record)")

    def execute_recorded(self, command: Command,
                         record: Callable[[SentRequest], None]) -> Result:
        raise _refuse("execute_recorded (the gateway records every call itself)")

    def run_recorded(self, command: Command, record: Callable[[SentRequest], None]) -> Result:
        raise _refuse("run_recorded (the gateway records every call itself)")


class AsyncGatewayDevice(AsyncDevice):
    """An ``AsyncDevice`` through a gateway: ``GatewayDevice``'s calls, each in a thread."""

    def __init__(self, remote: _Remote) -> None:
        CommandBuilder.__init__(self, remote.regmap)
        self._blocking = GatewayDevice(remote)

    @classmethod
    async def open_url(cls, url: str, *,
                       regmap: RegisterMap | str | os.PathLike[str] = DEFAULT_MAP,
                       check_map: bool = True, token: str | None = None,
                       token_file: str | os.PathLike[str] | None = None) -> AsyncGatewayDevice:
        remote = await asyncio.to_thread(_opened_remote, url, regmap, check_map, token,
                                         token_file)
        return cls(remote)

    @property
    def unknown(self) -> Result | None:
        return None

    @property
    def info(self) -> DeviceInfo | None:
        return self._blocking.info

    @property
    def ops(self) -> Operations[Any]:  # type: ignore[override]
        raise _refuse("the driver's operations")

    def acknowledge_unknown(self) -> None:
        """Nothing to unblock here (``GatewayDevice.acknowledge_unknown``)."""

    async def connect(self) -> None:
        await asyncio.to_thread(self._blocking.connect)

    async def close(self) -> None:
        """Nothing is held open between calls."""

    async def run(self, commands: Iterable[Command]) -> list[Result]:
        return await asyncio.to_thread(self._blocking.run, list(commands))

    async def stream(self, commands: Iterable[Command]) -> AsyncIterator[Result]:
        for c in commands:
            yield (await self.run([c]))[0]

    async def file_info(self, name: str) -> Result:
        raise _refuse("FILE_INFO")

    async def send_files(self, paths: Iterable[str], *, progress: ProgressCallback | None = None,
                         config: SenderConfig | None = None,
                         overwrite: bool = False) -> tuple[Result, TransferReport | None]:
        raise _refuse("a file transfer")

    async def reconcile(self, result: Result | None = None) -> Reconciliation | None:
        return self._blocking.reconcile(result)

    async def reconcile_sent(self, command: Command,
                             sent_as: tuple[tuple[int, int], ...] = (),
                             read_back: bool = True) -> Reconciliation:
        raise _refuse("reconcile_sent (the gateway keeps its own record)")

    async def execute_recorded(self, command: Command,
                               record: Callable[[SentRequest], None]) -> Result:
        raise _refuse("execute_recorded (the gateway records every call itself)")

    async def run_recorded(self, command: Command,
                           record: Callable[[SentRequest], None]) -> Result:
        raise _refuse("run_recorded (the gateway records every call itself)")


__all__ = ["GATEWAY_TIMEOUT", "SCHEMES", "TOKEN_ENV", "TOKEN_FILE_ENV", "AsyncGatewayDevice",
           "GatewayDevice", "NotThroughGateway", "is_gateway_url", "parse_gateway_url",
           "read_token", "result_of"]
