"""The framed protocol's part of the operations: the HELLO handshake, the map check, numbers.

``FramedOperations`` is ``idemlink.host.operations.Operations`` over the framed protocol's
sans-I/O ``HostSession``: what only an idemlink device has lives here, everything else (the
pipeline, the blocking rule, the read-back) is the base class's, shared with a plain Modbus RTU
slave's ``RtuOperations``.

Contract:

- ``connect_steps``: the HELLO handshake; a device speaking another protocol version or
  contract, or serving another register map (``check_map``, unless turned off), is refused with
  ``IncompatibleDevice``; no answer is ``NoDevice``.
- ``open_steps`` (what ``Device.open`` / ``AsyncDevice.open`` run): the handshake and, when no
  idemlink device answered, one read at unit 1 as a Modbus RTU master on the same port
  (``answers_modbus_rtu_steps``): a slave answering makes it ``AnswersModbusRtu`` ("this port
  answers Modbus RTU, not idemlink") instead of only "no HELLO_REPLY".
- Numbers: a request's (epoch, seq) is known before it leaves (``next_number``), and a request
  whose answer never came can be re-sent under it while the device is in that epoch
  (``resend_steps``): the device's own evidence of whether it ran (``idemlink.host.evidence``).
"""

from __future__ import annotations

import secrets

from idemlink.host.command import Command, Result
from idemlink.host.errors import AnswersModbusRtu, IncompatibleDevice, LinkLost, NoDevice
from idemlink.host.operations import Clock, Operations, Steps
from idemlink.host.rtu_operations import answers_modbus_rtu_steps
from idemlink.protocol.auth import HostAuth, key_id
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.frame import PROTOCOL_VERSION
from idemlink.protocol.host_session import HelloFailed, HostSession, SessionOpened, SessionState
from idemlink.protocol.key_file import host_keys
from idemlink.protocol.outcome import LocalProtocolError
from idemlink.protocol.payloads import Capability, DeviceInfo, printable
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP


def check_map(info: DeviceInfo, regmap: RegisterMap) -> None:
    """Refuse a device whose advertised register map is not ``regmap`` (naming both hashes). A
    device too old to advertise one is taken at its word only for the built-in default map."""
    theirs = info.map_hash
    if theirs is None:
        if regmap.hash != DEFAULT_MAP.hash:
            raise IncompatibleDevice(
                f"device {info.name!r} does not advertise its register map (an older firmware); "
                f"cannot confirm it serves {regmap.name} {regmap.hash.hex()}")
        return
    if theirs != regmap.hash:
        if info.map_name == regmap.name:  # one map, two versions: the firmware or the file moved on
            advice = ("the device was built from another version of this map: rebuild and "
                      "flash its firmware from this file (C device: `idemlink contract --regmap "
                      "FILE --out DIR`, then `make -C firmware_ref device REGMAP_H=DIR/"
                      "idemlink_regmap.h`), or open it with the file it was built from "
                      "(regmap=FILE; --regmap FILE on the command line)")
        else:
            advice = ("open it with its map file (regmap=FILE; --regmap FILE on the command "
                      "line)")
        raise IncompatibleDevice(
            f"device {printable(info.device_id or info.name)} serves register map "
            f"{printable(info.map_name or '?')} {theirs.hex()}, ours is {regmap.name} "
            f"{regmap.hash.hex()}: {advice}")


MAX_INFLIGHT = 8
"""Requests in flight at once by default (the device's advertised window may allow fewer)."""
ADDRESSED_MAX_INFLIGHT = 1
"""The default with ``address=N``: a bus address means a shared line, usually half-duplex RS-485,
where a second request in flight collides with the answer to the first (docs/BUS.md). Pass
``max_inflight`` to pipeline on a full-duplex shared line."""


class FramedOperations(Operations[HostSession]):
    """The operations on an idemlink device (``HostSession``). See the module docstring."""

    numbered = True

    def __init__(self, clock: Clock, *, regmap: RegisterMap = DEFAULT_MAP, timeout: float = 0.2,
                 attempts: int = 5, max_inflight: int | None = None, check_map: bool = True,
                 address: int | None = None,
                 key: bytes | tuple[bytes, ...] | None = None) -> None:
        keys = host_keys(key)
        if max_inflight is None:  # a bus address: a shared, usually half-duplex line
            max_inflight = ADDRESSED_MAX_INFLIGHT if address is not None else MAX_INFLIGHT
        session = HostSession(
            contract_hash=contract_hash(), timeout=timeout, attempts=attempts,
            max_inflight=max_inflight, hello_attempts=max(attempts, 1),
            hello_nonce=secrets.randbits(32), address=address,
            auth=None if keys is None else HostAuth(keys[0], secrets.token_bytes),
        )
        super().__init__(clock, session, regmap)
        self.check_map = check_map
        #: the host's keys (the first used first; the other of a rotation after it): never shown
        self._keys = keys

    def __repr__(self) -> str:
        ids = "none" if self._keys is None else ", ".join(f"{key_id(k):08x}" for k in self._keys)
        return f"FramedOperations(key ids {ids})"

    @property
    def key_id(self) -> int | None:
        """The id of the key this session uses (None: an unkeyed host); never the key."""
        auth = self.session.auth
        return None if auth is None else auth.key_id

    @property
    def authenticated(self) -> bool:
        """Whether the session is authenticated (a keyed host whose HELLO_REPLY verified)."""
        auth = self.session.auth
        return auth is not None and auth.session is not None and self.session.info is not None

    @property
    def info(self) -> DeviceInfo | None:
        """What the device advertised at HELLO (None before ``connect``)."""
        return self.session.info

    # ------------------------------------------------------------------ connecting
    def connect_steps(self) -> Steps[None]:
        """HELLO handshake; refuses an incompatible device (``IncompatibleDevice``, ``NoDevice``).
        A keyed host holding the keys of a rotation (docs/SECURITY.md) shakes hands with the
        first; a device naming another key id the host also holds gets a second handshake with
        that key (both authenticated: never a fall-back to no key)."""
        try:
            yield from self._hello_steps()
        except IncompatibleDevice as exc:
            other = self._other_key(str(exc))
            if other is None:
                raise
            self.session.auth = HostAuth(other, secrets.token_bytes)
            yield from self._hello_steps()

    def _other_key(self, refusal: str) -> bytes | None:
        """The host key whose id a key-id refusal names (``HostAuth.on_hello_reply``: "the
        device holds key id XXXXXXXX, ours is YYYYYYYY"), if it is not the one just used."""
        auth = self.session.auth
        if self._keys is None or auth is None or not refusal.startswith("the device holds key id"):
            return None
        named = refusal.split()[5] if len(refusal.split()) > 5 else ""
        for k in self._keys:
            kid = key_id(k)
            if kid != auth.key_id and f"{kid:08x}" == named.rstrip(","):
                return k
        return None

    def _hello_steps(self) -> Steps[None]:
        s = self.session
        s.open(self.clock.now())
        opened: list[SessionOpened | HelloFailed] = []
        yield from self._exchange(lambda: bool(opened), opened)
        ev = opened[0]
        if isinstance(ev, HelloFailed):
            if ev.incompatible:
                raise IncompatibleDevice(ev.reason)
            at = "" if s.address is None else f" at address {s.address}"
            raise NoDevice(f"no idemlink device answered{at}: {ev.reason}")
        if ev.info.version != PROTOCOL_VERSION:
            raise IncompatibleDevice(
                f"device speaks protocol version {ev.info.version}, we speak {PROTOCOL_VERSION}")
        if ev.info.contract_hash != contract_hash():
            raise IncompatibleDevice(
                f"device protocol contract {ev.info.contract_hash.hex()} differs from ours "
                f"{contract_hash().hex()} (a different idemlink version: frame layout or codes)")
        address = s.address
        if address is not None and not (ev.info.serves(Capability.ADDRESSED)
                                        and ev.info.address == address):
            raise IncompatibleDevice(
                f"the device that answered at address {address} says it is "
                + (f"address {ev.info.address}" if ev.info.serves(Capability.ADDRESSED)
                   else "not addressable (no ADDRESSED capability)"))
        if self.check_map:
            check_map(ev.info, self.regmap)

    def open_steps(self) -> Steps[None]:
        """The handshake; without an idemlink device, a Modbus RTU slave answering one read at
        unit 1 makes the refusal ``AnswersModbusRtu``."""
        try:
            yield from self.connect_steps()
        except NoDevice as exc:
            if self.session.address is not None:  # a bus: no unit-1 probe among its devices
                raise
            if (yield from answers_modbus_rtu_steps(self.clock, self.regmap,
                                                    self.session.timeout)):
                raise AnswersModbusRtu(f"{AnswersModbusRtu.SAYS}: open it with RtuDevice or "
                                       f"AsyncRtuDevice ({exc})") from exc
            raise

    def require_open(self) -> None:
        if self.session.state is SessionState.CLOSED:
            if self.session.gone is not None:  # a board swapped on the line: not ours any more
                raise LinkLost(self.session.gone)
            # Without a session nothing would ever be sent, and the loop would wait forever.
            raise LocalProtocolError("not connected: call connect() first (HELLO handshake)")

    # ------------------------------------------------------------------ numbers
    def open_epoch(self) -> int | None:
        s = self.session
        return s.epoch if s.state is SessionState.OPEN else None

    def next_number(self) -> tuple[int, int] | None:
        return self.session.next_number()

    def queued_number(self) -> tuple[int, int] | None:
        return self.session.queued_number()

    def resend_steps(self, c: Command, number: tuple[int, int]) -> Steps[Result]:
        """``c`` sent again under its original ``number`` (``HostSession.resend``)."""
        self.require_open()
        self._tag += 1
        tag = self._tag
        self.awaiting[tag] = c
        self.session.resend(c.pdu(), number, self.clock.now(), tag=tag)
        yield from self._exchange(lambda: tag in self.completions)
        return self.result(self.awaiting.pop(tag), self.completions.pop(tag))


__all__ = ["FramedOperations", "check_map"]
