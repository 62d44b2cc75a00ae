"""Device and host sessions: replay, conflict, eviction, epochs, and every outcome for its reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.device import Device
from idemlink.host.errors import IncompatibleDevice, UnknownOutstanding
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import Flags, Frame, FrameType, decode_frames, encode_frame
from idemlink.protocol.host_session import HostSession
from idemlink.protocol.outcome import Outcome, Status
from idemlink.protocol.payloads import decode_response_payload

EPOCH = 0xA5A5A5A5
HASH = b"12345678"


def dev_reply(dev: DeviceSession, data: bytes, now: float) -> bytes:
    """What the device answers to ``data`` received at ``now``."""
    dev.receive_data(data, now)
    return dev.data_to_send()


class CountingExecutor:
    def __init__(self) -> None:
        self.calls: list[tuple[bytes, int]] = []

    def __call__(self, pdu: bytes, now: float, seq: int) -> bytes:
        self.calls.append((pdu, seq))
        if pdu[:1] == b"\x03":  # a one-register read: the shape a host accepts as its answer
            return b"\x03\x02\x00" + bytes([len(self.calls)])
        return b"\x06" + pdu[1:] + bytes([len(self.calls)])  # answer differs per execution


def exchange(dev: DeviceSession, seq: int, payload: bytes, epoch: int = EPOCH,
             flags: int = 0) -> Frame:
    out = dev_reply(dev, encode_frame(FrameType.REQUEST, seq, epoch, payload, flags), 0.0)
    (frame,) = decode_frames(out)
    assert isinstance(frame, Frame)
    return frame


def status_of(frame: Frame) -> int:
    decoded = decode_response_payload(frame.payload)
    assert decoded is not None
    return decoded[0]


def make(**kw: int) -> tuple[DeviceSession, CountingExecutor]:
    ex = CountingExecutor()
    return DeviceSession(ex, EPOCH, contract_hash=HASH, **kw), ex


def test_duplicate_gets_the_exact_first_answer_marked_replay() -> None:
    dev, ex = make()
    first = exchange(dev, 5, b"\x06\x00\x04\x01\x90")
    again = exchange(dev, 5, b"\x06\x00\x04\x01\x90", flags=Flags.RETRANSMIT)
    assert len(ex.calls) == 1
    assert again.payload == first.payload and status_of(again) == Status.OK
    assert again.flags & Flags.REPLAY and not first.flags & Flags.REPLAY


def test_same_seq_other_content_is_a_conflict_and_runs_nothing() -> None:
    dev, ex = make()
    exchange(dev, 5, b"\x06\x00\x04\x01\x90")
    conflict = exchange(dev, 5, b"\x06\x00\x04\x01\x91")
    assert status_of(conflict) == Status.IDEMPOTENCY_CONFLICT and len(ex.calls) == 1


def test_evicted_answer_is_its_own_status() -> None:
    dev, ex = make(replay_slots=2)
    for seq in (1, 2, 3):
        exchange(dev, seq, bytes([6, 0, seq]))
    assert status_of(exchange(dev, 1, bytes([6, 0, 1]))) == Status.ANSWER_EVICTED
    assert status_of(exchange(dev, 3, bytes([6, 0, 3]))) == Status.OK  # still kept: replayed
    assert len(ex.calls) == 3


def test_too_old_is_its_own_status() -> None:
    dev, ex = make(ring_bits=64)  # window 32
    exchange(dev, 100, b"\x03a")
    assert status_of(exchange(dev, 60, b"\x03b")) == Status.TOO_OLD
    assert status_of(exchange(dev, 80, b"\x03c")) == Status.OK  # inside the window, first time
    assert [s for _, s in ex.calls] == [100, 80]


def test_wrong_epoch_is_refused_not_committed_and_answered_with_ours() -> None:
    dev, ex = make()
    refused = exchange(dev, 7, b"\x06x", epoch=EPOCH ^ 1)
    assert status_of(refused) == Status.EPOCH_MISMATCH and refused.epoch == EPOCH
    assert ex.calls == []
    assert status_of(exchange(dev, 7, b"\x06x")) == Status.OK  # the number was not consumed
    assert len(ex.calls) == 1


def test_corrupted_far_ahead_frame_does_not_move_the_window() -> None:
    dev, _ex = make()
    exchange(dev, 10, b"\x03a")
    bad = bytearray(encode_frame(FrameType.REQUEST, 10 + 5000, EPOCH, b"\x03z"))
    bad[5] ^= 0x10
    assert dev_reply(dev, bytes(bad), 0.0) == b""
    assert status_of(exchange(dev, 9, b"\x03b")) == Status.OK  # still inside the window
    assert dev.counters["decode_errors"] == 1


def test_late_answer_is_never_taken_for_another_request() -> None:
    host = HostSession(contract_hash=HASH, timeout=1.0, max_inflight=4)
    dev, _ = make()
    host.open(0.0)
    host.receive_data(dev_reply(dev, host.data_to_send(), 0.0), 0.0)
    list(iter(host.next_event, None))
    host.submit(b"\x03\x00\x00\x00\x01", 0.0, set_only=False, tag="a")
    sent = host.data_to_send()
    answer = dev_reply(dev, sent, 0.0)
    host.receive_data(answer, 0.0)
    (done,) = list(iter(host.next_event, None))
    host.submit(b"\x03\x00\x01\x00\x01", 0.0, set_only=False, tag="b")
    host.data_to_send()
    host.receive_data(answer, 0.1)  # the first answer arrives again, late
    assert list(iter(host.next_event, None)) == [] and host.counters.late_answers == 1
    assert done.tag == "a" and done.outcome is Outcome.OK


# ---- host over the simulator: each outcome class for the right reason -------------------------


def connect(link: LinkConfig | None = None, **kw: float) -> tuple[Device, SimTransport]:
    t = SimTransport(SimulatedDevice(seed=3, trigger_duration=1.0), link)
    dev = Device(t, timeout=0.02, attempts=int(kw.get("attempts", 6)))
    dev.connect()
    return dev, t


LOSSY = LinkConfig(baud=115200, latency=0.001, frame_loss=0.3, frame_dup=0.2, seed=5)


def test_every_command_through_a_lossy_link_acts_once() -> None:
    dev, t = connect(LOSSY, attempts=12)
    sim = t.device
    results = [
        dev.write({"threshold": 400}),
        dev.write({"threshold": 410, "mode": 2, "fan_setpoint": 10}),
        dev.read("threshold", 3),
        dev.trigger(),
        dev.trigger(),
        dev.clear_faults(1),
        dev.trigger_reset(),
    ]
    assert [r.outcome for r in results] == [Outcome.OK] * 7
    assert results[2].values == (410, 2, 10)
    assert results[3].code == 0 and results[4].code == 0x0101
    assert sim.core.count(sim.core.log[0].kind.__class__.TRIGGER_STARTED) == 1
    per_seq = {}
    for e in sim.executions:
        per_seq[(e.epoch, e.seq)] = per_seq.get((e.epoch, e.seq), 0) + 1
    assert set(per_seq.values()) == {1}
    assert dev.session.counters.retries > 0  # the faults were real


def test_not_executed_for_a_failed_guard_and_nothing_changes() -> None:
    dev, t = connect(LOSSY, attempts=12)
    gen = dev.read("generation").values[0]
    dev.write({"mode": 0})
    r = dev.write_if_generation(gen, {"fan_setpoint": 99})
    assert r.outcome is Outcome.NOT_EXECUTED and r.status is Status.GUARD_FAILED
    assert t.device.core.value("fan_setpoint") != 99


def test_rejected_for_out_of_range_and_input_writes() -> None:
    dev, t = connect(LOSSY, attempts=12)
    r = dev.write({"threshold": 60000})
    assert r.outcome is Outcome.REJECTED and r.exception is not None
    assert r.exception.name == "ILLEGAL_DATA_VALUE"
    r2 = dev.write({"temperature": 5})
    assert r2.outcome is Outcome.REJECTED and r2.exception is not None
    assert r2.exception.name == "ILLEGAL_DATA_ADDRESS"
    assert t.device.core.value("threshold") != 60000


def test_unknown_when_no_answer_blocks_until_acknowledged() -> None:
    dev, t = connect()
    # Cut the answers only: the request runs, the host cannot know.
    t.drop_answers = True
    r = dev.trigger()
    assert r.outcome is Outcome.UNKNOWN and r.status is Status.NO_ANSWER
    with pytest.raises(UnknownOutstanding):
        dev.read("threshold")
    t.drop_answers = False
    rec = dev.reconcile()
    assert rec is not None and rec.intended_state_holds is True  # the trigger did start
    dev.acknowledge_unknown()
    assert dev.read("threshold").ok


def test_reboot_mid_flight_reissues_set_only_and_reports_others_unknown() -> None:
    from idemlink.host.command import Command, CommandKind

    dev, t = connect()
    t.drop_answers = True  # the first attempts run, their answers are lost...
    real_reboot = t.device.reboot

    def reboot_and_heal(now: float) -> None:  # ...then the device reboots and answers again
        real_reboot(now)
        t.drop_answers = False

    t.device.reboot = reboot_and_heal  # type: ignore[method-assign]
    t.schedule_reboot(t.now() + 0.03)
    trig_addr = dev.spec("self_clean").address
    write, trig = dev.run([dev.write_command({"threshold": 333}),
                           Command(CommandKind.TRIGGER, trig_addr)])
    assert len(t.device.epochs) == 2, "the reboot happened"
    assert write.outcome is Outcome.OK and write.reissued == 1
    assert trig.outcome is Outcome.UNKNOWN and trig.status is Status.EPOCH_CHANGED_IN_FLIGHT
    assert t.device.core.value("threshold") == 333
    # The trigger ran once before the reboot; a reboot resets it (volatile), and it never re-ran.
    assert sum(1 for e in t.device.executions if e.request[0] == 0x42) == 1


def test_incompatible_contract_is_refused() -> None:
    t = SimTransport(SimulatedDevice(seed=1))
    t.device._hash = b"\x00" * 8
    t.device.session = t.device._new_session()
    with pytest.raises(IncompatibleDevice, match="contract"):
        Device(t).connect()


def test_a_device_of_a_newer_protocol_version_is_refused_clearly() -> None:
    from idemlink.protocol import cobs
    from idemlink.protocol.frame import crc32c

    class NewerDevice:
        """Answers every HELLO with a version-2 frame (which we must not try to parse)."""

        def __init__(self) -> None:
            self.out = b""

        def write(self, data: bytes) -> None:
            for frame in decode_frames(data):
                assert isinstance(frame, Frame)
                raw = bytes([2, 2, 0]) + frame.seq.to_bytes(4, "little") * 2 + b"\x00\x00"
                raw += crc32c(raw).to_bytes(4, "little")
                self.out += b"\x00" + cobs.encode(raw) + b"\x00"

        def read(self, timeout: float) -> bytes:
            out, self.out = self.out, b""
            self.t += timeout if not out else 0.0
            return out

        t = 0.0

        def now(self) -> float:
            return self.t

        def close(self) -> None:
            pass

    with pytest.raises(IncompatibleDevice, match="version 2"):
        Device(NewerDevice()).connect()  # type: ignore[arg-type]



@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(FrameType)), st.integers(0, 40),
                          st.sampled_from([EPOCH, EPOCH ^ 1]), st.binary(max_size=40),
                          st.sampled_from([0, 1, 2, 3])), max_size=60),
       st.binary(max_size=200))
def test_device_session_never_raises_and_runs_each_number_once(
    frames: list[tuple[FrameType, int, int, bytes, int]], junk: bytes
) -> None:
    dev, ex = make(ring_bits=64, replay_slots=4)
    wire = junk + b"".join(encode_frame(t, s, e, p, f) for t, s, e, p, f in frames)
    for i in range(0, len(wire), 7):
        dev_reply(dev, wire[i : i + 7], 0.0)
    seqs = [s for _, s in ex.calls]
    assert len(seqs) == len(set(seqs))  # at most one execution per sequence number
    for _pdu, seq in ex.calls:  # and only for requests that really carried our epoch
        assert (FrameType.REQUEST, seq, EPOCH) in {(t, s, e) for t, s, e, _, _ in frames}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.sampled_from([EPOCH, EPOCH ^ 1]),
                          st.integers(0, 0x40), st.binary(max_size=12), st.booleans()),
                max_size=40),
       st.binary(max_size=100), st.integers(1, 8))
def test_host_session_ends_every_request_exactly_once_whatever_arrives(
    answers: list[tuple[int, int, int, bytes, bool]], junk: bytes, n: int
) -> None:
    from idemlink.protocol.host_session import Completion
    from idemlink.protocol.payloads import encode_response_payload

    host = HostSession(contract_hash=HASH, timeout=0.1, attempts=3, max_inflight=4)
    dev, _ = make()
    host.open(0.0)
    host.receive_data(dev_reply(dev, host.data_to_send(), 0.0), 0.0)
    list(iter(host.next_event, None))
    for i in range(n):
        host.submit(b"\x03\x00\x00\x00\x01", 0.0, set_only=i % 2 == 0, tag=i)
    now = 0.0
    wire = junk + b"".join(
        encode_frame(FrameType.RESPONSE, seq, epoch, encode_response_payload(status, pdu),
                     Flags.REPLAY if replay else 0)
        for seq, epoch, status, pdu, replay in answers)
    done: list[Completion] = []
    for i in range(0, len(wire), 5):
        now += 0.01
        host.receive_data(wire[i : i + 5], now)
        host.tick(now)
        done += [e for e in list(iter(host.next_event, None)) if isinstance(e, Completion)]
    for _ in range(50):  # silence: everything still out must time out, exactly once
        now += 0.1
        host.tick(now)
        done += [e for e in list(iter(host.next_event, None)) if isinstance(e, Completion)]
    assert sorted(c.tag for c in done) == list(range(n))
    assert host.outstanding == 0


def test_a_hand_built_write_to_a_trigger_is_not_reissued_after_a_reboot() -> None:
    from idemlink.host.command import Command, CommandKind

    dev, t = connect()
    t.drop_answers = True
    real_reboot = t.device.reboot

    def reboot_and_heal(now: float) -> None:
        real_reboot(now)
        t.drop_answers = False

    t.device.reboot = reboot_and_heal  # type: ignore[method-assign]
    t.schedule_reboot(t.now() + 0.03)
    trig = dev.spec("self_clean").address
    (res,) = dev.run([Command(CommandKind.WRITE, trig, 1, (1,))])  # FC06 1 to the trigger
    assert res.outcome is Outcome.UNKNOWN and res.status is Status.EPOCH_CHANGED_IN_FLIGHT
    assert sum(1 for e in t.device.executions if e.request[:1] == b"\x06") == 1


def test_a_malformed_read_answer_carries_no_values_and_never_raises() -> None:
    from idemlink.host.command import Command, CommandKind, answer_of

    read3 = Command(CommandKind.READ, 4, 3)
    assert answer_of(read3, bytes([3, 6, 0, 1, 0, 2, 0, 3])) == ((1, 2, 3), None)
    for bad in (b"\x03", bytes([3, 4, 0, 1, 0, 2]), bytes([3, 6, 0, 1]), bytes([3, 200])):
        assert answer_of(read3, bad) == ((), None)


def test_hello_numbers_start_at_the_shells_nonce() -> None:
    host = HostSession(contract_hash=HASH, hello_nonce=0xDEADBEEF)
    host.open(0.0)
    (hello,) = decode_frames(host.data_to_send())
    assert isinstance(hello, Frame) and hello.seq == 0xDEADBEF0
