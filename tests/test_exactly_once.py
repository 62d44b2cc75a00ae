"""The exactly-once promise at its edges: a received file that cannot be stored cancels cleanly, a
stale epoch refusal does not roll the host back, an UNKNOWN holds the later waves of a batch, and a
plain write to a trigger or fault word is refused before it could be re-issued as set-only."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.command import Command, CommandKind
from idemlink.host.device import Device
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.host_session import Completion, HostSession
from idemlink.protocol.outcome import LocalProtocolError, Outcome, Status
from idemlink.protocol.ymodem_events import drain_events
from idemlink.protocol.ymodem_files import DirectorySink, ReceiverDriver, exchange
from idemlink.protocol.ymodem_sender import Sender, SendFile
from idemlink.protocol.ymodem_tables import TxState
from idemlink.protocol.ymodem_wire import CAN

HASH = b"12345678"
READ = b"\x03\x00\x00\x00\x01"
CLEAR = b"\x06\x00\x20\x00\x01"  # a W1C fault clear: FC06, but not set-only


def dev_reply(dev: DeviceSession, data: bytes, now: float) -> bytes:
    """What the device answers to ``data`` received at ``now``."""
    dev.receive_data(data, now)
    return dev.data_to_send()


class Executor:
    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def __call__(self, pdu: bytes, now: float, seq: int) -> bytes:
        self.calls.append(pdu)
        if pdu[:1] == b"\x03":  # a read: as many register values as asked for
            count = int.from_bytes(pdu[3:5], "big")
            return bytes((3, 2 * count)) + bytes(2 * count)
        return pdu  # a write: its echo


def _run_ymodem(tx: Sender, drv: ReceiverDriver, step: float = 0.01, until: float = 600.0) -> bytes:
    """Sender and driver in virtual time with no loss; returns every byte the driver sent."""
    now = 0.0
    tx.start(now)
    drv.start(now)
    to_tx = drv.data_to_send()
    sent = bytearray(to_tx)
    while now < until:
        if to_tx:
            tx.receive_data(to_tx, now)
        tx.tick(now)
        drain_events(tx)
        to_tx = exchange(drv, tx.data_to_send(), now)
        sent += to_tx
        if drv.finished and tx.state in (TxState.DONE, TxState.ABORTED):
            break
        now += step
    return bytes(sent)


def test_unrepresentable_mtime_cancels_cleanly_and_leaves_no_partial_file(tmp_path: Path) -> None:
    """A block 0 may carry an mtime of up to 22 octal digits (the size rule accepts it), i.e. up
    to 2^66 - 1 seconds. ``os.utime`` raises OverflowError (not OSError) for a time_t that large,
    so ``DirectorySink.commit`` let it escape: the driver crashed out of ``feed`` instead of
    cancelling with CAN CAN, and the fsynced ``.ymodem-*.part`` temporary stayed in the target
    directory. The sink's contract is that any refusal cancels the batch and deletes the
    temporary file."""
    hostile = SendFile.from_bytes("late.bin", b"payload", mtime=8**22 - 1, mode=0o644)
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender([hostile])
    sent = _run_ymodem(tx, drv)
    assert sent.count(CAN) >= 2 and tx.state is TxState.ABORTED
    assert list(tmp_path.iterdir()) == []
    assert not drv.report.ok


def test_temporary_file_creation_error_cancels_instead_of_crashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError while ``DirectorySink.open`` creates its temporary file (no space or no inode
    left, too many open files, a read-only directory) is a ``SinkRefused``, not an OSError out of
    ``ReceiverDriver.receive_data`` (in the simulator that would kill the serving thread, and the
    sender would never be told to stop). The contract: any refusal or write error cancels the batch with
    CAN CAN."""
    real_open = os.open

    def full_disk(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        if os.fspath(path).endswith(".part"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", full_disk)
    drv = ReceiverDriver(DirectorySink(tmp_path))
    tx = Sender([SendFile.from_bytes("a.bin", b"data", mtime=1_700_000_000, mode=0o644)])
    sent = _run_ymodem(tx, drv)
    assert sent.count(CAN) >= 2 and tx.state is TxState.ABORTED
    assert list(tmp_path.iterdir()) == []
    assert "No space left" in drv.report.reason


def _completions(host: HostSession) -> dict[object, Completion]:
    return {e.tag: e for e in list(iter(host.next_event, None)) if isinstance(e, Completion)}


def test_stale_epoch_mismatch_from_an_older_boot_does_not_roll_the_epoch_back() -> None:
    """Two reboots (Z -> A -> B) and a line that duplicates and delays one answer.

    The first request, sent in Z, is refused by the device in A with EPOCH_MISMATCH(A); the line
    delivers that answer and keeps a copy. The host moves to A, later to B. A fault clear (not
    set-only) then runs once in B; before its OK arrives, the delayed copy of EPOCH_MISMATCH(A)
    does. That copy answers a number no longer outstanding, so by the session's own rule it is a
    late answer to drop. The session instead took it as an epoch change: it moved back to A and
    settled the fault clear UNKNOWN (EPOCH_CHANGED_IN_FLIGHT), then dropped the real OK as late,
    so a command that ran exactly once and was answered was reported UNKNOWN and blocked the
    handle."""
    host = HostSession(contract_hash=HASH, timeout=1.0, attempts=3, max_inflight=4)
    ex_z, ex_a, ex_b = Executor(), Executor(), Executor()
    boot_z = DeviceSession(ex_z, 0x2222, contract_hash=HASH)
    host.open(0.0)
    host.receive_data(dev_reply(boot_z, host.data_to_send(), 0.0), 0.0)
    list(iter(host.next_event, None))
    assert host.epoch == 0x2222

    boot_a = DeviceSession(ex_a, 0xAAAA, contract_hash=HASH)  # reboot: Z -> A
    host.submit(READ, 0.0, set_only=True, tag="r1")
    refused_in_a = dev_reply(boot_a, host.data_to_send(), 0.0)
    stale_copy = refused_in_a  # the line duplicates this answer and delays the copy
    host.receive_data(refused_in_a, 0.0)
    host.receive_data(dev_reply(boot_a, host.data_to_send(), 0.0), 0.0)  # HELLO to A
    host.receive_data(dev_reply(boot_a, host.data_to_send(), 0.0), 0.0)  # r1 re-issued in A
    assert _completions(host)["r1"].outcome is Outcome.OK

    boot_b = DeviceSession(ex_b, 0xBBBB, contract_hash=HASH)  # reboot: A -> B
    host.submit(READ, 0.0, set_only=True, tag="r2")
    host.receive_data(dev_reply(boot_b, host.data_to_send(), 0.0), 0.0)
    host.receive_data(dev_reply(boot_b, host.data_to_send(), 0.0), 0.0)  # HELLO to B
    host.receive_data(dev_reply(boot_b, host.data_to_send(), 0.0), 0.0)  # r2 re-issued in B
    assert _completions(host)["r2"].outcome is Outcome.OK and host.epoch == 0xBBBB

    host.submit(CLEAR, 0.0, set_only=False, tag="clear")
    answer = dev_reply(boot_b, host.data_to_send(), 0.0)
    assert ex_b.calls.count(CLEAR) == 1  # it ran, once, in B
    host.receive_data(stale_copy + answer, 0.0)
    done = _completions(host)
    assert done["clear"].outcome is Outcome.OK and done["clear"].status is Status.OK
    assert host.epoch == 0xBBBB


class _AnswersLostForTriggers(SimTransport):
    """A line that loses every answer while a trigger start (FC 0x42, value 1) is being sent."""

    lossy = True  #: False: the line is mended

    def write(self, data: bytes) -> None:
        from idemlink.protocol.frame import Frame, decode_frames

        for f in decode_frames(data):
            if isinstance(f, Frame) and f.payload[:1] == b"\x42":
                self.drop_answers = self.lossy and f.payload[-2:] == b"\x00\x01"
        super().write(data)


def test_an_unknown_in_one_wave_holds_the_later_waves_of_the_same_batch() -> None:
    """``Device.run([trigger, trigger_reset])`` on one register is split into two waves (the two
    do not commute). The trigger runs but every answer is lost: UNKNOWN, which must hold further
    commands until reconciled. ``run`` checked the block only on entry, so the second wave was
    still sent: the reset aborted the run that had just started, ``reconcile()`` then read IDLE
    and said the trigger's intended state does not hold, and a caller following it would
    trigger again - the action running twice. Later waves must stay unsent (NOT_EXECUTED)."""
    t = _AnswersLostForTriggers(SimulatedDevice(seed=3, trigger_duration=1.0))
    dev = Device(t, timeout=0.02, attempts=4)
    dev.connect()
    addr = dev.spec("self_clean").address
    trig, reset = dev.run([Command(CommandKind.TRIGGER, addr),
                           Command(CommandKind.TRIGGER_RESET, addr)])
    assert trig.outcome is Outcome.UNKNOWN and dev.unknown is trig
    ran = [e.request for e in t.device.executions if e.request[:1] == b"\x42"]
    assert len(ran) == 1 and ran[0][-2:] == b"\x00\x01", "only the trigger reached the device"
    assert reset.outcome is Outcome.NOT_EXECUTED and not reset.sent_as
    t.lossy = t.drop_answers = False
    rec = dev.reconcile()
    # the trigger re-sent under its own number: the device replays its answer, runs nothing
    assert rec is not None and rec.executed is True and rec.resent is not None
    assert rec.resent.replay and rec.resent.sent_as == trig.sent_as
    assert len([e for e in t.device.executions if e.request[:1] == b"\x42"]) == 1
    assert rec is not None and rec.intended_state_holds is True


def test_a_plain_write_to_a_trigger_or_fault_word_is_refused_not_sent_as_set_only() -> None:
    """``Device.write({"self_clean": 1})`` encoded FC06 to the TRIGGER register, which the device
    executes as a trigger start, but the command kind was WRITE and so *set-only*: when the
    device rebooted with it in flight (it had run, its answer lost), the host re-issued it in the
    new epoch, the trigger started a second time, and the call returned OK. The same holds for a
    W1C fault word (a re-issued clear can erase a fault latched after the reboot). The CLI already
    refuses these (`use idemlink clear / trigger`); the API now refuses them too, before sending."""
    t = SimTransport(SimulatedDevice(seed=3, trigger_duration=1.0))
    dev = Device(t, timeout=0.02, attempts=6)
    dev.connect()
    before = len(t.device.executions)
    for register in ("self_clean", "faults"):
        with pytest.raises(LocalProtocolError):
            dev.write({register: 1})
        with pytest.raises(LocalProtocolError):
            dev.write_command({register: 1})
    assert len(t.device.executions) == before, "nothing was sent"
    assert dev.write({"threshold": 400}).ok  # holding registers are unaffected
