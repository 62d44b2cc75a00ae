"""Bounded exhaustive exploration of the authenticated HELLO (issue 23), driving the real sans-I/O
machines: a keyed ``HostSession`` (``HostAuth``) and a keyed ``DeviceSession`` (``DeviceAuth``)
over a ``DeviceCore``, through ``idemlink.explore``'s explorer (every schedule of at most
``depth`` faults, states merged).

Contract: ``explore_auth(depth, reboots=1)`` returns an ``Exploration``. The line's faults are the
explorer's — loss, duplication (a copy delivered now and kept in flight, so it may arrive much
later, after a new handshake or a reboot: a frame of an older session), reorder, delay — plus a
device reboot (new epoch, no session key: the EPOCH_MISMATCH hint, the host shakes hands again)
and a downgrade: a copy of a host frame in flight delivered with its AUTH flag and tag stripped.
Nonces come from seeded counters (``_Nonces``), so a schedule is reproducible and states merge.
The host opens a session, then pipelines a set-only write and a trigger.

Properties, checked at every execution and at the end of every schedule:

- **nothing executed without a valid tag**: whenever a request runs, the frame being delivered
  carries a tag (``UNSIGNED-EXECUTED`` otherwise: a stripped copy ran) ...
- **no frame of an older session accepted**: ... and that tag verifies under the device's
  *current* session key, checked here with ``verify_frame``, not taken from the device
  (``OLD-SESSION-ACCEPTED``: a duplicate from before a new HELLO or a reboot ran);
- **the session converges**: at the end (nothing in flight, no deadline) the host either failed
  its handshake cleanly (``HelloFailed``), or one more read sent then, with the line now
  fault-free, ends OK under a session key both sides hold (``DIVERGED``); every request settled
  exactly once (``HANG``/``SETTLED-TWICE``);
- the sessions explorer's outcome rules (``MISCLASSIFIED``, ``DUPLICATED-EFFECT``,
  ``UNCLAIMED``), unchanged.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from collections.abc import Callable
from functools import partial

from idemlink.explore import (
    HASH,
    Exploration,
    _Executor,
    _explore,
    _SessionWorld,
    _World,
)
from idemlink.protocol.auth import DeviceAuth, DeviceKeys, HostAuth, verify_frame
from idemlink.protocol.cobs import decode_segment, encode
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import (
    AUTH_TAG_LEN,
    CRC_LEN,
    Direction,
    Flags,
    Frame,
    FrameType,
    crc32c,
)
from idemlink.protocol.frame import decode_frames as _decode
from idemlink.protocol.host_session import HostSession
from idemlink.protocol.outcome import Outcome

KEY = hashlib.blake2s(b"idemlink explore key").digest()
PROBE = struct.pack(">BHH", 0x03, 4, 1)  #: a read after the faults: does the session converge?
MAX_SETTLE = 200


class _Nonces:
    """A reproducible nonce source (a counter under a label): a copied world draws what the
    original would have."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.drawn = 0

    def __call__(self, n: int) -> bytes:
        self.drawn += 1
        return hashlib.blake2s(f"{self.label}/{self.drawn}".encode()).digest()[:n]


class _AuthExecutor(_Executor):
    """The register core, checking each execution: the frame being delivered carries a tag that
    verifies — checked here, by ``verify_frame``, not by the device's decision — under the
    device's current session key."""

    world: _AuthWorld

    def __call__(self, pdu: bytes, now: float, seq: int) -> bytes:
        w = self.world
        f = w.arriving
        auth = w.dev.auth
        where = f"{self.epoch}:{seq} {pdu.hex()}"
        if f is None or f.tag is None:
            w.errors.append(f"UNSIGNED-EXECUTED: {where}")
        elif auth is None or auth.session is None or not verify_frame(
                f, auth.session, Direction.HOST_TO_DEVICE):
            w.errors.append(f"OLD-SESSION-ACCEPTED: {where} (its tag is not the current "
                            "session's)")
        return super().__call__(pdu, now, seq)


class _AuthWorld(_SessionWorld):
    def __init__(self, reboots: int) -> None:
        super().__init__(reboots)
        exe = _AuthExecutor()
        exe.world = self
        self.exe = exe
        self.dev = self._device()
        self.host = HostSession(contract_hash=HASH, timeout=1.0, attempts=3, max_inflight=2,
                                hello_attempts=3, hello_nonce=77,
                                auth=HostAuth(KEY, _Nonces("host")))
        self.strips_left = 1
        self.arriving: Frame | None = None  #: the frame being delivered to the device
        self.net = []
        self.host.open(0.0)

    def _device(self) -> DeviceSession:
        return DeviceSession(self.exe, self.exe.epoch, contract_hash=HASH, device_id="dev-1",
                             map_hash=b"m" * 8,
                             auth=DeviceAuth(DeviceKeys((KEY,)),
                                             _Nonces(f"device/{self.exe.epoch}")))

    def fingerprint(self) -> bytes:
        import pickle

        return pickle.dumps((super().fingerprint(), self.strips_left))

    def deliver(self, direction: str, data: bytes) -> None:
        self.arriving = None
        if direction == "host>dev":
            frames = [f for f in _decode(data) if isinstance(f, Frame)]
            self.arriving = frames[0] if len(frames) == 1 else None
        super().deliver(direction, data)
        self.arriving = None

    def extra_faults(self) -> list[tuple[str, Callable[[_World], None]]]:
        out: list[tuple[str, Callable[[_World], None]]] = (
            [] if self.reboots_left <= 0 else [("reboot", _reboot_keyed)])
        if self.strips_left > 0:
            for i, (direction, data) in enumerate(self.net):
                if direction == "host>dev" and _strippable(data):
                    out.append((f"STRIP {self.describe(direction, data)}",
                                partial(_strip, i=i)))
        return out

    def check(self) -> list[str]:
        v = super().check()
        if self.hello_failed:
            return v
        probe = self._probe()
        v += [e for e in probe.errors if e not in self.errors]
        done = probe.done.get("probe")
        hauth, dauth = probe.host.auth, probe.dev.auth
        same = (hauth is not None and dauth is not None and hauth.session is not None
                and dauth.session is not None and hauth.session.key == dauth.session.key)
        if done is not None and done.outcome is Outcome.OK and same:
            return v
        v.append(f"DIVERGED: a request after the faults ended "
                 f"{'unsettled' if done is None else done.outcome.name}, the two sides' "
                 f"session keys {'agree' if same else 'differ'}")
        return v

    def _probe(self) -> _AuthWorld:
        """A copy of this end state in which the host sends one more read and the line
        carries everything without a fault until nothing moves: the session converges if the
        read ends OK under a session key both sides hold."""
        w = copy.deepcopy(self)
        w.host.submit(PROBE, w.now, set_only=True, tag="probe")
        w.collect()
        for _ in range(MAX_SETTLE):
            moves = list(w.actions(w.faults))  # no fault left: deliveries and timeouts only
            if not moves:
                break
            moves[0][1](w)
            w.collect()
        return w


def _strippable(data: bytes) -> bool:
    raw = decode_segment(data[:-1]) if data.endswith(b"\x00") else None
    return raw is not None and len(raw) > 15 and raw[1] == FrameType.REQUEST and bool(
        raw[2] & Flags.AUTH)


def _strip(w: _World, i: int) -> None:
    """Deliver a copy of message ``i`` with its AUTH flag and tag removed (CRC recomputed)."""
    assert isinstance(w, _AuthWorld)
    w.strips_left -= 1
    raw = decode_segment(w.net[i][1][:-1])
    assert raw is not None
    body = raw[:-CRC_LEN - AUTH_TAG_LEN]
    body = body[:2] + bytes((body[2] & ~int(Flags.AUTH),)) + body[3:]
    w.deliver("host>dev", b"\x00" + encode(body + crc32c(body).to_bytes(4, "little")) + b"\x00")


def _reboot_keyed(w: _World) -> None:
    assert isinstance(w, _AuthWorld)
    w.reboots_left -= 1
    w.exe.epoch += 1
    w.exe.core.reset_volatile(w.now)
    w.dev = w._device()


def explore_auth(depth: int, reboots: int = 1) -> Exploration:
    """Every schedule of the authenticated handshake and two requests with at most ``depth``
    faults (a reboot or a stripped copy counts as one). See the module docstring."""
    return _explore(_AuthWorld(reboots), depth)


__all__ = ["KEY", "explore_auth"]
