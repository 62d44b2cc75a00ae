"""Payloads of the session frames: the HELLO handshake and the REQUEST/RESPONSE envelopes.

- HELLO (host → device): ``HELLO_PAYLOAD`` — the host's protocol version and contract hash. The frame's
  epoch is 0 and its seq is echoed back, so a host matches the reply; HELLO has no side effect and
  is never de-duplicated.
- HELLO_REPLY (device → host): ``DEVICE_INFO`` — what a host must know before sending commands:
  protocol version, de-duplication window, payload limit, replay-cache slots, pipelining depth,
  contract hash, the first sequence number a new host session should use (1 on a fresh boot, else a
  window beyond both the highest number seen and the last start handed out, so a new host process
  never reuses a number a dead one may still have in flight; see ``DeviceSession.first_seq``) and
  a name. The frame header carries the device's current boot epoch.
- REQUEST payload: a Modbus-style PDU (function code + data), see ``idemlink.protocol.modbus``.
- RESPONSE payload: ``status u8`` (``idemlink.protocol.outcome.Status``) followed by the response PDU (empty
  unless the status is OK; for EPOCH_MISMATCH, the refused request's epoch as u32 LE, so a host
  can tell a refusal of its own request from a delayed one of an older boot's). A replayed answer
  is the exact bytes of the first one, with the REPLAY flag set in the header.

Additive evolution: fields are only ever appended to DEVICE_INFO; a reader ignores bytes after the
fields it knows (``GreedyBytes`` tail), so an old host reads a newer device's reply. The first
extension (``DEVICE_INFO_IDENTITY``) carries the device's register-map hash, its stable device id
and its map's name; a reply without it (an older device) decodes with those fields ``None``.
The second (``DEVICE_INFO_CAPABILITIES``) says which later additions of the contract the device
serves (``Capability``: addressed frames, authentication) and its bus address; a reply without it
decodes with ``capabilities`` ``None`` and a host uses none of them. These additions are not in
the contract hash (``ContractSection.additive``): an old host and a new device keep the same hash
and the old host never reads the bytes it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag

import construct as cs

from idemlink.protocol.auth import contract_additive as auth_additive
from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from idemlink.protocol.outcome import LocalProtocolError, RemoteProtocolError

CONTRACT_HASH_LEN = 8

HELLO_PAYLOAD = cs.Struct(
    "version" / cs.Int8ul,
    "contract_hash" / cs.Bytes(CONTRACT_HASH_LEN),
    "_extensions" / cs.GreedyBytes,
)

DEVICE_INFO = cs.Struct(
    "version" / cs.Int8ul,
    "window" / cs.Int16ul,
    "max_payload" / cs.Int16ul,
    "replay_slots" / cs.Int16ul,
    "max_inflight" / cs.Int8ul,
    "contract_hash" / cs.Bytes(CONTRACT_HASH_LEN),
    "next_seq" / cs.Int32ul,
    "name" / cs.PascalString(cs.Int8ul, "utf8"),
    "_extensions" / cs.GreedyBytes,
)

#: Appended to DEVICE_INFO: which device this is and which register map it serves.
DEVICE_INFO_IDENTITY = cs.Struct(
    "map_hash" / cs.Bytes(CONTRACT_HASH_LEN),
    "device_id" / cs.PascalString(cs.Int8ul, "utf8"),
    "map_name" / cs.PascalString(cs.Int8ul, "utf8"),
    "_extensions" / cs.GreedyBytes,
)
MAX_DEVICE_ID_LEN = 64


class Capability(IntFlag):
    """What a device serves of the contract's later additions (HELLO_REPLY's ``capabilities``).
    A host sends an addressed or authenticated frame only to a device that advertised it."""

    NONE = 0
    ADDRESSED = 0x0001  #: decodes ADDRESSED frames: answers its own address, acts on broadcast
    AUTH = 0x0002  #: keyed: verifies MAC tags, refuses unauthenticated frames (protocol.auth)


#: Appended after DEVICE_INFO_IDENTITY (the second extension): the device's capabilities and
#: its bus address (0: none configured; 1..247 when ADDRESSED).
DEVICE_INFO_CAPABILITIES = cs.Struct(
    "capabilities" / cs.Int16ul,
    "address" / cs.Int8ul,
    "_extensions" / cs.GreedyBytes,
)
#: Appended after DEVICE_INFO_CAPABILITIES by a device that serves ADDRESSED (the third
#: extension): the first broadcast number a host should use (``DeviceSession.broadcast_next``).
DEVICE_INFO_BUS = cs.Struct(
    "broadcast_next" / cs.Int32ul,
    "_extensions" / cs.GreedyBytes,
)
#: Appended after DEVICE_INFO_BUS by a keyed device, present exactly when ``capabilities`` has AUTH
#: (the fourth extension; a keyed device sends the bus extension too, ``broadcast_next`` 1 when
#: it has no address): the id of the key it used (or holds, when the host named none it has)
#: and its nonce for the session key (``idemlink.protocol.auth``, docs/SECURITY.md).
DEVICE_INFO_AUTH = cs.Struct(
    "key_id" / cs.Int32ul,
    "device_nonce" / cs.Bytes(16),
    "_extensions" / cs.GreedyBytes,
)
NO_DEVICE_ADDRESS = 0
"""``address`` in HELLO_REPLY of a device without a configured bus address (0 is the broadcast
address, never a device's own)."""

#: How far ahead of the highest number seen a HELLO may hand out a start: half the RFC 1982
#: "ahead" range, so a start and the numbers after it are always NEW to the window
#: (``DeviceSession.first_seq``).
HANDOUT_SPAN = 1 << 30

RESPONSE_PAYLOAD = cs.Struct(
    "status" / cs.Int8ul,
    "pdu" / cs.GreedyBytes,
)


class MalformedDeviceInfo(RemoteProtocolError, ValueError):
    """A HELLO_REPLY payload that does not parse (the message is one line naming the field)."""


def _parse(struct: cs.Struct, data: bytes, what: str) -> cs.Container:
    try:
        return struct.parse(data)
    except (cs.ConstructError, UnicodeDecodeError) as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        field = lines[0].rpartition("-> ")[2] if lines[0].startswith("Error in path") else ""
        detail = " ".join(line.strip() for line in (lines[1:] if field else lines))
        raise MalformedDeviceInfo(f"malformed {what}: " + (f"field {field}: " if field else "")
                                  + detail) from None


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What the device advertises in HELLO_REPLY."""

    version: int
    window: int
    max_payload: int
    replay_slots: int
    max_inflight: int
    contract_hash: bytes
    next_seq: int
    name: str
    map_hash: bytes | None = None  #: the register map's hash (None: an older device)
    device_id: str | None = None  #: stable id of this device (MCU unique id, sim's id file)
    map_name: str | None = None  #: the register map's name
    #: the contract's later additions the device serves (None: an older device, none of them)
    capabilities: int | None = None
    address: int = NO_DEVICE_ADDRESS  #: its bus address (0: none configured)
    #: the first broadcast number to use (None: the device sent no bus extension)
    broadcast_next: int | None = None
    #: a keyed device's key id (None: not keyed) and its HELLO nonce (the fourth extension)
    key_id: int | None = None
    device_nonce: bytes | None = None

    def serves(self, capability: Capability) -> bool:
        """Whether the device advertised ``capability`` (an older device advertises none)."""
        return self.capabilities is not None and bool(self.capabilities & capability)

    def encode(self) -> bytes:
        identity = b""
        caps = b""
        if self.capabilities is not None:
            if self.map_hash is None:
                raise LocalProtocolError("HELLO_REPLY capabilities follow the identity extension: "
                                         "a reply with capabilities needs a map hash")
            auth = b"" if self.device_nonce is None else bytes(DEVICE_INFO_AUTH.build(
                {"key_id": self.key_id or 0, "device_nonce": self.device_nonce,
                 "_extensions": b""}))
            nxt = 1 if self.broadcast_next is None and auth else self.broadcast_next
            bus = b"" if nxt is None else bytes(DEVICE_INFO_BUS.build(
                {"broadcast_next": nxt, "_extensions": auth}))
            caps = bytes(DEVICE_INFO_CAPABILITIES.build({
                "capabilities": self.capabilities, "address": self.address,
                "_extensions": bus}))
        if self.map_hash is not None:
            identity = bytes(DEVICE_INFO_IDENTITY.build({
                "map_hash": self.map_hash, "device_id": self.device_id or "",
                "map_name": self.map_name or "", "_extensions": caps}))
        return bytes(
            DEVICE_INFO.build(
                {
                    "version": self.version, "window": self.window,
                    "max_payload": self.max_payload, "replay_slots": self.replay_slots,
                    "max_inflight": self.max_inflight, "contract_hash": self.contract_hash,
                    "next_seq": self.next_seq, "name": self.name, "_extensions": identity,
                }
            )
        )

    @classmethod
    def decode(cls, payload: bytes) -> DeviceInfo:
        """Parse a HELLO_REPLY payload; raises ``MalformedDeviceInfo`` (one line naming the
        field) on short or malformed input, including a truncated identity extension."""
        c = _parse(DEVICE_INFO, payload, "HELLO_REPLY")
        map_hash = device_id = map_name = None
        capabilities: int | None = None
        address = NO_DEVICE_ADDRESS
        broadcast_next: int | None = None
        kid: int | None = None
        nonce: bytes | None = None
        if c._extensions:
            ident = _parse(DEVICE_INFO_IDENTITY, c._extensions, "HELLO_REPLY identity extension")
            map_hash, device_id, map_name = bytes(ident.map_hash), ident.device_id, ident.map_name
            if ident._extensions:
                cap = _parse(DEVICE_INFO_CAPABILITIES, ident._extensions,
                             "HELLO_REPLY capabilities extension")
                capabilities, address = cap.capabilities, cap.address
                if cap._extensions:
                    bus = _parse(DEVICE_INFO_BUS, cap._extensions, "HELLO_REPLY bus extension")
                    broadcast_next = bus.broadcast_next
                    if capabilities & Capability.AUTH:  # present iff AUTH is advertised
                        au = _parse(DEVICE_INFO_AUTH, bus._extensions,
                                    "HELLO_REPLY auth extension")
                        kid, nonce = au.key_id, bytes(au.device_nonce)
        return cls(c.version, c.window, c.max_payload, c.replay_slots, c.max_inflight,
                   bytes(c.contract_hash), c.next_seq, c.name, map_hash, device_id, map_name,
                   capabilities, address, broadcast_next, kid, nonce)


def printable(text: str) -> str:
    """``text`` safe to show on one line: non-printable characters (newlines, terminal escapes)
    escaped as ``\\n``, ``\\x1b``. A device's id and names come from the device: any bytes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def encode_hello(version: int, contract_hash: bytes) -> bytes:
    return bytes(HELLO_PAYLOAD.build(
        {"version": version, "contract_hash": contract_hash, "_extensions": b""}))


def encode_response_payload(status: int, pdu: bytes = b"") -> bytes:
    """RESPONSE payload (fast path of ``RESPONSE_PAYLOAD.build``)."""
    return bytes((status,)) + pdu


def decode_response_payload(payload: bytes) -> tuple[int, bytes] | None:
    """``(status, pdu)`` or ``None`` for an empty payload."""
    if not payload:
        return None
    return payload[0], payload[1:]


def contract_section() -> ContractSection:
    text = "1 + n (u8 length, UTF-8)"
    rows = [[sc.name, sc.sizeof() if sc.name != "name" else text]
            for sc in DEVICE_INFO.subcons if not sc.name.startswith("_")]
    rows += [[sc.name, sc.sizeof() if sc.name == "map_hash" else text]
             for sc in DEVICE_INFO_IDENTITY.subcons if not sc.name.startswith("_")]
    rows += [[sc.name, sc.sizeof()]
             for sc in (*DEVICE_INFO_CAPABILITIES.subcons, *DEVICE_INFO_BUS.subcons)
             if not sc.name.startswith("_")]
    md = (
        "## Session\n\n"
        "A host opens a session with HELLO (epoch 0, any seq; payload: version u8, contract hash "
        "8 bytes). The device answers HELLO_REPLY with the same seq, its current boot epoch in the "
        "header and this payload (little-endian; fields are only ever appended, readers ignore "
        "trailing bytes):\n\n"
        + md_table(["field", "size"], rows)
        + "\n`map_hash` (8 bytes of SHA-256 over the register map's meaning), `device_id` (a "
        "stable id: the MCU's unique id, or the simulator's) and `map_name` are the first "
        "extension; a reply that ends after `name` comes from an older device.\n"
        "\n`capabilities` (u16 bits: "
        + ", ".join(f"{c.name} 0x{int(c):04X}" for c in Capability if c)
        + ") and `address` (the device's bus address, 0 when none is configured) are the second "
        "extension: what the device serves of the contract's later additions. A host sends an "
        "ADDRESSED or AUTH frame only to a device that advertised it; a reply that ends after "
        "`map_name` advertises none. The second extension is not in the contract hash (it is "
        "declared additive): an old host keeps the hash and reads the reply as before. "
        "`broadcast_next` (the third extension, only from a device that serves ADDRESSED) is "
        "the first broadcast number a host should use: one window beyond the highest the "
        "device has run, so numbers a dead host may still have in flight are not reused.\n"
        + "\n`next_seq` is 1 on a fresh boot, else the window size beyond both the highest number "
        "seen and the last `next_seq` handed out (a new host process never reuses a number a dead "
        "one may still have in flight).\n\n"
        "REQUEST payload: a Modbus-style PDU (function code, data). RESPONSE payload: "
        "`status u8` then the response PDU (for EPOCH_MISMATCH: the refused request's epoch, "
        "u32 LE; the header carries the device's current epoch). A replayed RESPONSE carries the "
        "exact bytes of the first answer with the REPLAY flag set.\n"
    )
    return ContractSection(
        name="session",
        defines=[CDefine("IDL_CONTRACT_HASH_LEN", CONTRACT_HASH_LEN, "bytes of contract hash"),
                 CDefine("IDL_MAP_HASH_LEN", CONTRACT_HASH_LEN, "bytes of register-map hash"),
                 CDefine("IDL_MAX_DEVICE_ID_LEN", MAX_DEVICE_ID_LEN, "bytes of device id"),
                 CDefine("IDL_HANDOUT_SPAN", f"0x{HANDOUT_SPAN:08X}u",
                         "a HELLO's next_seq stays at most this far ahead of the highest seen")],
        enums=[CEnum("idl_capability_t", "IDL_CAP", Capability,
                     "HELLO_REPLY capability bits (the contract's later additions)")],
        markdown=md,
        additive={"device_info_capabilities": [sc.name for sc in DEVICE_INFO_CAPABILITIES.subcons],
                  "device_info_bus": [sc.name for sc in DEVICE_INFO_BUS.subcons],
                  "device_info_auth": [sc.name for sc in DEVICE_INFO_AUTH.subcons],
                  **auth_additive(),
                  "capabilities": {c.name: int(c) for c in Capability if c},
                  "no_device_address": NO_DEVICE_ADDRESS},
        data={"handout_span": HANDOUT_SPAN,
              "device_info": [sc.name for sc in DEVICE_INFO.subcons],
              "device_info_identity": [sc.name for sc in DEVICE_INFO_IDENTITY.subcons],
              "hello": [sc.name for sc in HELLO_PAYLOAD.subcons],
              "response": [sc.name for sc in RESPONSE_PAYLOAD.subcons]},
    )
