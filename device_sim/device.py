"""The simulated idemlink device: the register core behind the framed session, with reboots.

``SimulatedDevice`` is still sans-I/O, in the project's shape (docs/ARCHITECTURE.md); the shells in
``idemlink.device_sim.serve`` put it on a pseudo-terminal or any pyserial port, and
``idemlink.device_sim.simlink`` runs it in-process behind the link emulator.

- ``receive_data(data, now)`` takes received bytes, ``tick(now)`` lets time pass without any,
  ``data_to_send()`` drains what the device answers.
- Boot epochs: every boot draws a new one. A process start is a boot too: with a flash directory
  the persisted boot counter (``ConfigFlash.count_boot``) is mixed into the seed, and
  ``epoch_salt`` (``idemlink sim`` passes OS entropy when it has no flash directory) likewise.
- ``reboot(now)``: draws a new boot epoch (from the seeded generator), forgets the window, the
  replay cache and the volatile state (triggers, latched faults), keeps the configuration — in
  the simulated flash directory when one is given (``config.json``, replaced atomically).
- ``FILE_RECEIVE`` (0x44, framed only; ``44`` or ``44 01`` to allow replacing existing files): the
  device answers ``44 00`` and then hands its port to a YMODEM receiver for one batch
  (``take_file_receive()`` tells the serving shell, once); files land in ``files_dir``
  (``<flash-dir>/files``) and never replace an existing file unless the request allowed it.
  Like every command it runs once per sequence number: a
  retransmitted request gets the replayed answer and does not restart the batch.
- ``FILE_INFO`` (0x45, framed only, read-only): size and CRC-32C of a committed file in
  ``files_dir`` (status 1, size and CRC 0, when there is none; the hidden ``.part`` temporaries of a
  batch in progress are never visible); a name YMODEM's receiver would refuse is exception 03.
- ``executions``: the ground-truth log of the commands the device actually ran — epoch, sequence
  number, request PDU, response PDU, simulated time — one record per execution. It is a bounded
  ``ExecutionLog``: the last ``keep_executions`` (default ``DEFAULT_KEPT_EXECUTIONS``) records,
  indexed by absolute position (``len`` counts every execution, ``executions[mark:]`` is what ran
  since ``mark``), so a device serving for days keeps flat memory; an index already dropped raises
  ``ExecutionsEvicted`` rather than answering from a partial log. ``keep_executions=None`` keeps
  everything (for oracles that need the whole history). The register core's ``log`` holds every
  side effect. Tests and the fault-campaign oracle read both (the campaign consumes the log
  batch by batch). ``boots`` lists every boot as (epoch, simulated time).
- ``effects``: a file the device appends its record to, one JSON line per boot
  (``{"boot": epoch, "time": t}``) and per execution (``{"epoch", "seq", "request": hex,
  "response": hex, "time"}``), flushed line by line — the format ``idemlink soak --device-cmd``
  reads (docs/SOAK.md).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import random
import tempfile
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from idemlink.device_sim.flash import ConfigFlash, check_device_id, new_device_id
from idemlink.protocol.auth import DeviceAuth, DeviceKeys
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import ConfigSnapshot, DeviceCore, PersistError
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import check_address
from idemlink.protocol.key_rotation import ROTATION_SESSIONS, Button, ButtonEvent, KeyRing
from idemlink.protocol.modbus import (
    FileInfoResponse,
    FileInfoStatus,
    FunctionCode,
    ModbusPduError,
    decode_file_info_request,
    encode_response,
    exception_pdu,
)
from idemlink.protocol.outcome import IdemlinkError, ModbusException
from idemlink.protocol.registers import RegisterMap
from idemlink.protocol.regmap_file import DEFAULT_MAP
from idemlink.protocol.regular_file import file_digest
from idemlink.protocol.replay import DEFAULT_SLOTS
from idemlink.protocol.window import RING_BITS

BROADCAST_EPOCH = 0
"""The epoch a broadcast execution is recorded under (``Execution.epoch``): no boot has it."""

DEFAULT_FILE_QUOTA = 16 * 1024 * 1024
"""Bytes one YMODEM batch may store on the simulated device."""


@dataclass(frozen=True, slots=True)
class FileReceiveRequest:
    """A FILE_RECEIVE command ran: the serving shell owes the host one YMODEM batch."""

    overwrite: bool
    quota: int  #: bytes the batch may store (the simulated flash is finite)


DEFAULT_KEPT_EXECUTIONS = 10_000
"""Executions a ``SimulatedDevice`` keeps by default (about 2 MB)."""


class ExecutionsEvicted(IdemlinkError, LookupError):
    """The asked-for executions were already dropped from the bounded log."""


@dataclass(frozen=True, slots=True)
class Execution:
    """One command the device really ran."""

    epoch: int
    seq: int
    request: bytes
    response: bytes
    time: float


class ExecutionLog:
    """The last ``keep`` executions (every one with ``keep=None``), indexed by absolute position.

    ``len(log)`` is the number of executions since the device was built; ``log[mark:]`` (or
    ``since(mark)``) the ones from position ``mark`` on; iteration yields the records still kept.
    Asking for a position already dropped raises ``ExecutionsEvicted``."""

    def __init__(self, keep: int | None = DEFAULT_KEPT_EXECUTIONS) -> None:
        if keep is not None and keep < 1:
            raise ValueError("keep must be >= 1 (or None for every execution)")
        self._kept: deque[Execution] = deque(maxlen=keep)
        self._total = 0

    def append(self, execution: Execution) -> None:
        self._kept.append(execution)
        self._total += 1

    @property
    def first_kept(self) -> int:
        """Absolute position of the oldest record still kept."""
        return self._total - len(self._kept)

    def __len__(self) -> int:
        return self._total

    def __iter__(self) -> Iterator[Execution]:
        return iter(self._kept)

    def __eq__(self, other: object) -> bool:
        """Equal to a list of every execution since the start (``log == []``: nothing ran);
        a log that already dropped records equals no list."""
        if isinstance(other, list | tuple):
            return self.first_kept == 0 and list(self._kept) == list(other)
        return self is other

    __hash__ = None  # type: ignore[assignment]

    def since(self, mark: int, end: int | None = None) -> list[Execution]:
        """The executions at positions ``mark .. end-1`` (``end``: all so far)."""
        end = self._total if end is None else min(end, self._total)
        if mark < self.first_kept:
            raise ExecutionsEvicted(
                f"executions from #{mark} asked for, the log keeps #{self.first_kept} on "
                "(build the device with keep_executions=None to keep them all)")
        first = self.first_kept
        return list(itertools.islice(self._kept, mark - first, max(mark, end) - first))

    @overload
    def __getitem__(self, index: int) -> Execution: ...
    @overload
    def __getitem__(self, index: slice) -> list[Execution]: ...

    def __getitem__(self, index: int | slice) -> Execution | list[Execution]:
        if isinstance(index, slice):
            if index.step not in (None, 1):
                raise ValueError("execution log slices take no step")
            start = self.first_kept if index.start is None else self._absolute(index.start)
            stop = None if index.stop is None else self._absolute(index.stop)
            return self.since(start, stop)
        position = self._absolute(index)
        if not self.first_kept <= position < self._total:
            raise (ExecutionsEvicted if 0 <= position < self.first_kept else IndexError)(
                f"execution #{position} not kept")
        return self._kept[position - self.first_kept]

    def _absolute(self, index: int) -> int:
        return index + self._total if index < 0 else index



def _is_receive_temporary(name: str) -> bool:
    """The YMODEM receiver's uncommitted temporaries (protocol.ymodem_files.DirectorySink names them
    ``.ymodem-<random>.part``); any other name, dot-files included, may be a committed file."""
    return name.startswith(".ymodem-") and name.endswith(".part")

def _epoch_generator(seed: int | None, boot_count: int, salt: int | None) -> random.Random:
    """The generator of boot epochs. Unseeded: OS entropy. Seeded: the seed mixed with the
    persisted boot counter (a process start on the same flash directory is a new boot) and the
    caller's salt (``idemlink sim`` without a flash directory passes fresh OS entropy), so a
    restarted process never draws the epochs of the previous one again; a seeded device without
    flash or salt keeps ``Random(seed)`` (in-process runs stay reproducible)."""
    if seed is None:
        return random.Random()
    if boot_count == 0 and salt is None:
        return random.Random(seed)
    return random.Random(f"{seed}:boot{boot_count}:salt{salt}")


class MapNotServed(IdemlinkError, ValueError):
    """A register map the framed simulator cannot serve (one without a generation register)."""


class SimulatedDevice:
    """Register core + framed session + reboots + simulated flash. See the module docstring."""

    def __init__(
        self,
        *,
        seed: int | None = None,
        regmap: RegisterMap = DEFAULT_MAP,
        trigger_duration: float = 2.0,
        flash_dir: str | os.PathLike[str] | None = None,
        ring_bits: int = RING_BITS,
        replay_slots: int = DEFAULT_SLOTS,
        now: float = 0.0,
        name: str = "idemlink-sim",
        file_quota: int = DEFAULT_FILE_QUOTA,
        device_id: str | None = None,
        epoch_salt: int | None = None,
        keep_executions: int | None = DEFAULT_KEPT_EXECUTIONS,
        effects: str | os.PathLike[str] | None = None,
        address: int | None = None,
        keys: tuple[bytes, ...] | None = None,
    ) -> None:
        if regmap.generation is None:
            raise MapNotServed(
                f"the map {regmap.name} has no generation register: a framed idemlink device "
                "needs one (its conditional write guards on it); serve the map as a plain "
                "Modbus RTU slave (idemlink sim --modbus-rtu)")
        self.flash_dir = Path(flash_dir) if flash_dir is not None else None
        self.flash = ConfigFlash(self.flash_dir) if self.flash_dir is not None else None
        self.ring_bits = ring_bits
        self.replay_slots = replay_slots
        self.name = name
        self.file_quota = file_quota
        self._hash = contract_hash()
        # a refused flash changes nothing: every file is checked before the first is written
        saved = self._load_flash()
        if self.flash is not None:
            self.flash.claim_map(regmap.name, regmap.hash.hex(), record=False)
            self.flash.read_boots()
        with self.flash.naming_config() if self.flash is not None else contextlib.nullcontext():
            self.core = DeviceCore(regmap, trigger_duration=trigger_duration, now=now,
                                   config=saved)
        self.device_id = self._identity(device_id, seed)  # the last check, the first write
        #: its bus address (docs/BUS.md): given, else the one kept in the flash directory, else
        #: None (a point-to-point device); a given one is kept there for the next start
        self.address = (self.flash.address(address) if self.flash is not None
                        else None if address is None else check_address(address))
        #: long-term keys (docs/SECURITY.md): given (provisioned, kept in the flash), else the
        #: flash's, else None: an unkeyed device, the first contract's. A ring: the current key
        #: and, during a rotation window, the ones it replaced (``protocol.key_rotation``)
        self._ring: KeyRing | None = (self.flash.ring(keys) if self.flash is not None
                                      else None if keys is None else KeyRing.given(keys))
        self._counted: object = None  #: the session key whose first request was counted
        #: the provisioning button (a physical-presence step: ``provision_key``, ``factory_reset``)
        self.button = Button()
        self._regmap_args = (regmap, trigger_duration)
        if self.flash is not None:
            self.flash.claim_map(regmap.name, regmap.hash.hex())
        self.boot_count = self.flash.count_boot() if self.flash is not None else 0
        self._rng = _epoch_generator(seed, self.boot_count, epoch_salt)
        self.executions = ExecutionLog(keep_executions)
        self.epochs: list[int] = []
        self.boots: list[tuple[int, float]] = []
        self._effects = open(effects, "a", encoding="utf-8") if effects is not None else None  # noqa: SIM115
        self._file_receive: FileReceiveRequest | None = None
        self._files_dir: Path | None = None
        self._past_counters: Counter[str] = Counter()
        self.session = self._new_session(now)

    # ------------------------------------------------------------------ bytes and time
    def receive_data(self, data: bytes, now: float) -> None:
        self.core.tick(now)
        self.session.receive_data(data, now)

    def data_to_send(self) -> bytes:
        """What the device answered so far (drains it)."""
        return self.session.data_to_send()

    def tick(self, now: float) -> None:
        self.core.tick(now)

    @property
    def epoch(self) -> int:
        return self.session.epoch

    def reboot(self, now: float) -> None:
        """Power-cycle: new epoch, empty window and cache, volatile state reset, config kept,
        the generation at the saved ceiling (``DeviceCore``'s save policy). Nothing is written
        to flash: a boot, like a volatile write, costs no erase cycle."""
        self.core.reset_volatile(now)
        self.session = self._new_session(now)

    @property
    def files_dir(self) -> Path:
        """Where received files go: ``<flash-dir>/files`` (a private temporary dir without one).
        A symbolic link there is refused when the device starts (``ConfigFlash``); one put there
        later is never followed: FILE_INFO finds nothing and a batch is cancelled at its header."""
        if self._files_dir is None:
            if self.flash is not None:  # checked (not followed) at start and at each use
                self._files_dir = self.flash.dir / ConfigFlash.FILES
            else:
                self._files_dir = Path(tempfile.mkdtemp(prefix="idemlink-sim-")) / "files"
            with contextlib.suppress(FileExistsError):  # not a directory: refused when used
                self._files_dir.mkdir(exist_ok=True)
        return self._files_dir

    def take_file_receive(self) -> FileReceiveRequest | None:
        """Once after a FILE_RECEIVE command ran: the shell must now run a YMODEM batch."""
        request, self._file_receive = self._file_receive, None
        return request

    # ------------------------------------------------------------------ ground truth
    def executions_of(self, epoch: int, seq: int) -> list[Execution]:
        return [e for e in self.executions if e.epoch == epoch and e.seq == seq]

    # ------------------------------------------------------------------ internals
    def counters_total(self) -> Counter[str]:
        """The sessions' counters summed over every boot of this object (a reboot starts a new
        session with new counters): what the device refused, replayed, ran."""
        return self._past_counters + self.session.counters

    def _new_session(self, now: float | None = None) -> DeviceSession:
        now = self.core.now if now is None else now
        if hasattr(self, "session"):
            self._past_counters.update(self.session.counters)
        epoch = self._rng.getrandbits(32)
        while epoch in self.epochs or epoch == 0:
            epoch = self._rng.getrandbits(32)
        self.epochs.append(epoch)
        self.boots.append((epoch, now))
        self._record({"boot": epoch, "time": now,
                      "trigger_duration": self.core.trigger_duration})
        return DeviceSession(
            self._execute, epoch, contract_hash=self._hash, name=self.name,
            ring_bits=self.ring_bits, replay_slots=self.replay_slots,
            map_hash=self.core.regmap.hash, device_id=self.device_id,
            map_name=self.core.regmap.name, address=self.address,
            broadcast_ok=self.core.broadcast_ok, broadcast_executor=self._execute_broadcast,
            auth=None if self._ring is None else DeviceAuth(DeviceKeys(self._ring.accepted()),
                                                            os.urandom),
        )

    @property
    def keyed(self) -> bool:
        """Whether the device holds a key (it never says which: only key ids leave it)."""
        return self._ring is not None

    @property
    def key_ring(self) -> KeyRing | None:
        """The key ring (its ``repr`` shows key ids only)."""
        return self._ring

    def _keep_ring(self, ring: KeyRing | None) -> None:
        self._ring = ring
        if ring is not None and self.flash is not None:
            self.flash.save_ring(ring)

    def _session_used(self) -> None:
        """A request ran under a session key not counted yet: one session of the rotation
        window spent; at its end the replaced keys are refused from the next HELLO on."""
        auth = self.session.auth
        ring = self._ring
        if ring is None or auth is None or auth.session is None or auth.session is self._counted:
            return
        self._counted = auth.session
        if not ring.rotating and len(ring.keys) == 1:
            return
        new = ring.session_used()
        self._keep_ring(new)
        auth.keys = DeviceKeys(new.accepted())

    def press_button(self) -> None:
        self.button.event(ButtonEvent.PRESS)

    def release_button(self) -> None:
        self.button.event(ButtonEvent.RELEASE)

    def provision_key(self, key: bytes, now: float, window: int = ROTATION_SESSIONS) -> None:
        """A new current key, only while the button is held (``ProvisioningRefused``
        otherwise, nothing changed); the replaced key stays accepted for ``window``
        authenticated sessions. The device then reboots (a new epoch; every session ends)."""
        ring = (KeyRing((key,)) if self._ring is None else self._ring.provision(key, window))
        self.button.event(ButtonEvent.PROVISION)
        self._keep_ring(ring)
        self.reboot(now)

    def factory_reset(self, now: float) -> None:
        """The recovery path for a lost key (docs/SECURITY.md), only while the button is held:
        keys, configuration and received files erased, the device rebooted unkeyed with its
        map's defaults. The boot counter and the epochs drawn so far are kept, so the next
        epoch is new and no frame captured before the reset is ever in it."""
        self.button.event(ButtonEvent.FACTORY_RESET)
        if self.flash is not None:
            self.flash.factory_reset()
        elif self._files_dir is not None:
            for entry in self._files_dir.iterdir():
                if entry.is_file() or entry.is_symlink():
                    entry.unlink()
        self._ring = None
        regmap, duration = self._regmap_args
        self.core = DeviceCore(regmap, trigger_duration=duration, now=now)
        self.reboot(now)

    def _identity(self, given: str | None, seed: int | None) -> str:
        """The device id HELLO advertises: ``given`` (checked); else the one kept in the flash
        directory (created once, like an MCU's unique id it never changes); else one drawn from
        the seed (reproducible) or from the OS (a new device each run)."""
        if given is not None:
            return check_device_id(given)
        if self.flash is not None:
            return self.flash.device_id()
        if seed is not None:
            return f"sim-{random.Random(f'device-id:{seed}').getrandbits(64):016x}"
        return new_device_id()

    def _execute_broadcast(self, pdu: bytes, now: float, seq: int) -> bytes:
        """A broadcast runs like a request, recorded under epoch 0 (a broadcast belongs to no
        boot; no boot's epoch is 0) and its number in the broadcast space."""
        return self._execute(pdu, now, seq, BROADCAST_EPOCH)

    def _execute(self, pdu: bytes, now: float, seq: int, epoch: int | None = None) -> bytes:
        epoch = self.session.epoch if epoch is None else epoch
        if pdu[:1] == bytes([FunctionCode.FILE_RECEIVE]):
            response = self._request_file_receive(pdu)
        elif pdu[:1] == bytes([FunctionCode.FILE_INFO]):
            response = self._file_info(pdu)
        else:
            response = self.core.execute(pdu, now, tag=f"{epoch:08x}:{seq}",
                                         persist=self._persist if self.flash is not None else None)
        if epoch != BROADCAST_EPOCH:
            self._session_used()
        self.executions.append(Execution(epoch, seq, pdu, response, now))
        self._record({"epoch": epoch, "seq": seq, "request": pdu.hex(),
                      "response": response.hex(), "time": now})
        return response

    def _record(self, line: dict[str, object]) -> None:
        """Append one line to the effects file (docs/SOAK.md), flushed: a killed process
        loses nothing it ran."""
        if self._effects is not None:
            self._effects.write(json.dumps(line) + "\n")
            self._effects.flush()

    def close(self) -> None:
        """Close the effects file (if any)."""
        if self._effects is not None:
            self._effects.close()
            self._effects = None

    def _request_file_receive(self, pdu: bytes) -> bytes:
        if len(pdu) > 2 or pdu[1:] not in (b"", b"\x00", b"\x01"):
            return exception_pdu(FunctionCode.FILE_RECEIVE, ModbusException.ILLEGAL_DATA_VALUE)
        self._file_receive = FileReceiveRequest(overwrite=pdu[1:] == b"\x01",
                                                quota=self.file_quota)
        return bytes([FunctionCode.FILE_RECEIVE, 0])

    def _file_info(self, pdu: bytes) -> bytes:
        """Size and CRC-32C of a committed file (read-only). ``check_name`` already refuses
        every name that is not one plain component, so the path stays inside ``files_dir``; the
        receiver's own temporaries (``.ymodem-*.part``) are never committed files. A file too
        large for the answer's u32 size gets exception 04 (the host then says "not verified")."""
        try:
            name = decode_file_info_request(pdu).name
        except ModbusPduError as exc:
            return exception_pdu(FunctionCode.FILE_INFO, exc.exception)
        path = self.files_dir / name
        absent = FileInfoResponse(FileInfoStatus.ABSENT, 0, 0)
        if (_is_receive_temporary(name) or self.files_dir.is_symlink() or path.is_symlink()
                or not path.is_file()):
            return encode_response(absent)
        crc = 0
        try:
            size = path.stat().st_size
            if size <= 0xFFFFFFFF:  # never hash what the answer cannot describe
                size, crc = file_digest(path)
        except FileNotFoundError:  # removed meanwhile
            return encode_response(absent)
        except OSError as exc:
            logging.getLogger(__name__).error("FILE_INFO %s: %s", name, exc)
            return exception_pdu(FunctionCode.FILE_INFO, ModbusException.SERVER_DEVICE_FAILURE)
        if size > 0xFFFFFFFF:  # the answer's size is a u32: such a file cannot be described
            logging.getLogger(__name__).error("FILE_INFO %s: %d bytes exceed the u32 size", name,
                                              size)
            return exception_pdu(FunctionCode.FILE_INFO, ModbusException.SERVER_DEVICE_FAILURE)
        return encode_response(FileInfoResponse(FileInfoStatus.PRESENT, size, crc))

    def _load_flash(self) -> ConfigSnapshot | None:
        return self.flash.load() if self.flash is not None else None

    def _persist(self, snap: ConfigSnapshot) -> None:
        """Save the configuration a write is about to commit (persist first: a write that
        cannot be saved answers exception 04 and changes nothing)."""
        assert self.flash is not None
        try:
            self.flash.save(snap)
        except OSError as exc:
            logging.getLogger(__name__).error("configuration not saved (%s): write refused", exc)
            raise PersistError(str(exc)) from None
