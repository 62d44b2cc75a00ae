"""Which answer a host session takes for which request (the sans-I/O sessions, both ends).

- A new host process is handed numbers a window apart from those a dead one may still have in
  flight, and never takes the dead one's delayed answer for its own; an answer that does not fit
  its request (``modbus.answer_fits``) is dropped.
- ``open()`` is refused while requests are in flight; ``abandon`` settles them.
- A pipeline never runs more than the replay cache ahead of its oldest outstanding request, so a
  retry of a request whose answer was lost still finds it.
- A stale EPOCH_MISMATCH from an older boot, under a number reused in the new boot, does not roll
  the host's epoch back.
- TRIGGER codes ILLEGAL_VALUE / ABNORMAL_STATE are not OK (``modbus.classify_answer``).
"""

from __future__ import annotations

import struct

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.device_core import EffectKind
from idemlink.protocol.device_session import DeviceSession
from idemlink.protocol.frame import Frame, FrameType, decode_frames, encode_frame
from idemlink.protocol.host_session import Completion, HostSession
from idemlink.protocol.modbus import answer_fits
from idemlink.protocol.outcome import LocalProtocolError, ModbusException, Outcome, Status
from idemlink.protocol.payloads import encode_response_payload

HASH = b"12345678"
READ = b"\x03\x00\x04\x00\x01"
W100 = struct.pack(">BHH", 6, 4, 100)
W500 = struct.pack(">BHH", 6, 4, 500)
CLEAR = b"\x06\x00\x07\x00\x01"  # a W1C clear: not set-only


def dev_reply(dev: DeviceSession | SimulatedDevice, data: bytes, now: float) -> bytes:
    """What the device answers to ``data`` received at ``now``."""
    dev.receive_data(data, now)
    return dev.data_to_send()


class Exec:
    def __init__(self) -> None:
        self.calls: list[tuple[int, bytes]] = []

    def __call__(self, pdu: bytes, now: float, seq: int) -> bytes:
        self.calls.append((seq, pdu))
        return b"\x03\x02\x01\x5e" if pdu[:1] == b"\x03" else pdu


def frames(data: bytes) -> list[Frame]:
    return [f for f in decode_frames(data) if isinstance(f, Frame)]


def completions(host: HostSession) -> dict[object, Completion]:
    return {e.tag: e for e in list(iter(host.next_event, None)) if isinstance(e, Completion)}


def opened(host: HostSession, dev: DeviceSession, now: float = 0.0) -> None:
    host.open(now)
    host.receive_data(dev_reply(dev, host.data_to_send(), now), now)
    list(iter(host.next_event, None))


def test_a_new_host_process_never_takes_a_dead_ones_delayed_answer() -> None:
    ex = Exec()
    dev = DeviceSession(ex, 0xB0B0, contract_hash=HASH)
    h1 = HostSession(contract_hash=HASH, hello_nonce=1, timeout=0.1, attempts=1)
    opened(h1, dev)
    h1.submit(W100, 0.0, set_only=True, tag="p1")
    delayed = h1.data_to_send()  # the line holds this frame; process 1 gives up and exits
    h1.tick(0.2)
    assert completions(h1)["p1"].outcome is Outcome.UNKNOWN

    h2 = HostSession(contract_hash=HASH, hello_nonce=2)
    opened(h2, dev, 1.0)
    h2.submit(W500, 1.0, set_only=True, tag="p2")
    back = dev_reply(dev, delayed, 1.0) + dev_reply(dev, h2.data_to_send(), 1.0)
    h2.receive_data(back, 1.0)
    done = completions(h2)["p2"]
    assert done.outcome is Outcome.OK and done.pdu == W500
    assert [pdu for _, pdu in ex.calls] == [W100, W500]  # both ran, each once
    assert len({seq for seq, _ in ex.calls}) == 2  # under different numbers


def test_hello_hands_out_starts_a_window_apart_even_before_any_command() -> None:
    dev = DeviceSession(Exec(), 7, contract_hash=HASH)
    first, second = dev.device_info().next_seq, 0
    opened(HostSession(contract_hash=HASH, hello_nonce=1), dev)
    second = dev.device_info().next_seq
    assert first == 1 and second == 1 + dev.window.size


def test_an_answer_that_does_not_fit_the_request_is_dropped() -> None:
    """Defence in depth: an OK answer under our number for other content (another process's
    request) is counted and dropped; the retry then learns the truth (a conflict: not executed)."""
    ex = Exec()
    dev = DeviceSession(ex, 0xB0B0, contract_hash=HASH)
    host = HostSession(contract_hash=HASH, hello_nonce=3, timeout=0.1)
    opened(host, dev)
    host.submit(W500, 0.0, set_only=True, tag="mine")
    (mine,) = frames(host.data_to_send())
    # Someone else's write ran under our number first; its answer reaches us.
    foreign = dev_reply(dev, encode_frame(FrameType.REQUEST, mine.seq, mine.epoch, W100), 0.0)
    host.receive_data(foreign, 0.0)
    assert completions(host) == {} and host.counters.mismatched_answers == 1
    host.tick(0.2)  # retry of ours: same number, other content
    host.receive_data(dev_reply(dev, host.data_to_send(), 0.2), 0.2)
    done = completions(host)["mine"]
    assert done.outcome is Outcome.NOT_EXECUTED and done.status is Status.IDEMPOTENCY_CONFLICT
    assert [pdu for _, pdu in ex.calls] == [W100]


@pytest.mark.parametrize(("request_pdu", "answer", "fits"), [
    (READ, b"\x03\x02\x00\x07", True),
    (READ, b"\x03\x04\x00\x07\x00\x08", False),  # two registers for a one-register read
    (READ, b"\x83\x02", True),
    (READ, b"\x86\x02", False),
    (W500, W500, True),
    (W500, W100, False),
    (b"\x10\x00\x04\x00\x02\x04\x00\x01\x00\x02", b"\x10\x00\x04\x00\x02", True),
    (b"\x10\x00\x04\x00\x02\x04\x00\x01\x00\x02", b"\x10\x00\x05\x00\x02", False),
    (b"\x42\x00\x08\x00\x01", b"\x42\x00\x08\x01\x01", True),
    (b"\x42\x00\x08\x00\x01", b"\x42\x00\x09\x00\x00", False),
    (b"\x41\x00\x01\x00\x04\x00\x01\x02\x00\x05", b"\x41\x00\x00\x02", True),
    (b"", b"\x80\x03", True),  # an empty request: nothing to compare with
    (READ, b"", False),
])
def test_answer_fits(request_pdu: bytes, answer: bytes, fits: bool) -> None:
    assert answer_fits(request_pdu, answer) is fits


def test_open_is_refused_while_requests_are_outstanding_and_abandon_settles_them() -> None:
    dev = DeviceSession(Exec(), 0xC0, contract_hash=HASH)
    host = HostSession(contract_hash=HASH, hello_nonce=4, max_inflight=1)
    opened(host, dev)
    host.submit(W100, 0.0, set_only=True, tag="sent")
    host.submit(W500, 0.0, set_only=True, tag="queued")  # waits for the one slot
    assert len(frames(host.data_to_send())) == 1
    with pytest.raises(LocalProtocolError):
        host.open(0.01)
    host.abandon(Status.LINK_LOST)
    done = completions(host)
    assert done["sent"].outcome is Outcome.UNKNOWN and done["sent"].status is Status.LINK_LOST
    assert done["queued"].outcome is Outcome.NOT_EXECUTED and done["queued"].sent_as == ()
    assert host.outstanding == 0
    host.open(0.02)  # now allowed


def _pipeline_with_one_lost_answer(slots: int, n: int = 120) -> tuple[Completion, DeviceSession]:
    """Host defaults of host.device.Device against a device keeping ``slots`` answers, a 115200-baud
    full-duplex line modelled by byte time; the line loses exactly the first answer."""
    byte = 10 / 115200
    dev = DeviceSession(Exec(), 0xE1, contract_hash=HASH, replay_slots=slots)
    host = HostSession(contract_hash=HASH, timeout=0.2, attempts=5, max_inflight=8)
    opened(host, dev)
    now = 0.0
    for i in range(n):
        host.submit(READ, now, set_only=True, tag=i)
    lost: int | None = None
    done: dict[object, Completion] = {}
    while len(done) < n and now < 10:
        out = host.data_to_send()
        back = dev_reply(dev, out, now) if out else b""
        keep = b""
        for f in frames(back):
            if lost is None:
                lost = f.seq
                continue
            keep += f.encode()
        now += max(len(out), len(back)) * byte
        host.receive_data(keep, now)
        done.update(completions(host))
        if not out and not keep:
            now = max(now, host.next_deadline() or now)
        host.tick(now)
        done.update(completions(host))
    assert len(done) == n
    assert all(c.outcome is Outcome.OK for c in done.values())
    return done[0], dev


@pytest.mark.parametrize("slots", [64, 8])
def test_a_busy_pipeline_never_outruns_the_replay_cache(slots: int) -> None:
    first, dev = _pipeline_with_one_lost_answer(slots)
    assert first.outcome is Outcome.OK and first.replay and first.attempts == 2
    assert dev.counters["evicted"] == 0 and dev.counters["executed"] == 120


def test_device_never_advertises_more_in_flight_than_answers_kept() -> None:
    dev = DeviceSession(Exec(), 1, contract_hash=HASH, replay_slots=8, max_inflight=32)
    assert dev.device_info().max_inflight == 8


def test_a_stale_epoch_mismatch_for_a_reused_number_is_ignored() -> None:
    """Boot Z → A: a request of Z is refused in A (the line keeps a copy of that refusal). Boot
    B: a new host's clear travels under the same number; the stale refusal names epoch Z, not the
    clear's epoch B, so it is a late answer — the clear's real OK is taken."""
    ex_b = Exec()
    boot_z = DeviceSession(Exec(), 0x2222, contract_hash=HASH)
    h1 = HostSession(contract_hash=HASH, hello_nonce=111)
    opened(h1, boot_z)
    boot_a = DeviceSession(Exec(), 0xAAAA, contract_hash=HASH)
    h1.submit(READ, 0.0, set_only=True, tag="r")
    stale = dev_reply(boot_a, h1.data_to_send(), 0.0)
    boot_b = DeviceSession(ex_b, 0xBBBB, contract_hash=HASH)
    h2 = HostSession(contract_hash=HASH, hello_nonce=999)
    opened(h2, boot_b)
    h2.submit(CLEAR, 1.0, set_only=False, tag="clear")
    (sent,) = frames(h2.data_to_send())
    assert sent.seq == frames(stale)[0].seq  # the collision this test is about
    answer = dev_reply(boot_b, sent.encode(), 1.0)
    h2.receive_data(stale + answer, 1.0)
    done = completions(h2)["clear"]
    assert done.outcome is Outcome.OK and h2.epoch == 0xBBBB and len(ex_b.calls) == 1


def test_epoch_mismatch_names_the_refused_request_epoch() -> None:
    dev = DeviceSession(Exec(), 0xAAAA, contract_hash=HASH)
    (answer,) = frames(dev_reply(dev, encode_frame(FrameType.REQUEST, 5, 0x1234, READ), 0.0))
    assert answer.epoch == 0xAAAA
    assert answer.payload == encode_response_payload(Status.EPOCH_MISMATCH, (0x1234).to_bytes(4, "little"))


def test_trigger_codes_that_started_nothing_are_not_ok() -> None:
    sim = SimulatedDevice(seed=1)
    host = HostSession(contract_hash=contract_hash(), hello_nonce=5)
    host.open(0.0)
    host.receive_data(dev_reply(sim, host.data_to_send(), 0.0), 0.0)
    list(iter(host.next_event, None))
    addr = sim.core.regmap.named("self_clean").address
    sim.core.force_trigger_state("self_clean", 0x7777)  # an impossible state
    got = {}
    for tag, value in (("abnormal", 1), ("illegal", 2)):
        host.submit(struct.pack(">BHH", 0x42, addr, value), 0.0, set_only=False, tag=tag)
        host.receive_data(dev_reply(sim, host.data_to_send(), 0.0), 0.0)
        got[tag] = completions(host)[tag]
    assert got["abnormal"].outcome is Outcome.UNKNOWN
    assert got["abnormal"].exception is ModbusException.SERVER_DEVICE_FAILURE
    assert got["illegal"].outcome is Outcome.REJECTED
    assert got["illegal"].exception is ModbusException.ILLEGAL_DATA_VALUE
    assert sim.core.count(EffectKind.TRIGGER_STARTED) == 0


@pytest.mark.parametrize("slots", [64, 8])
def test_run_ahead_is_measured_from_the_oldest_outstanding_request(slots: int) -> None:
    """The same lost answer, but the line carries one frame at a time and every answer is
    delivered on its own (the lockstep test above empties the pipeline between batches, which hid
    a limit measured from the newest outstanding number instead of the oldest)."""
    dev = DeviceSession(Exec(), 0xE1, contract_hash=HASH, replay_slots=slots)
    host = HostSession(contract_hash=HASH, timeout=0.2, attempts=5, max_inflight=8)
    opened(host, dev)
    n, now = 200, 0.0
    for i in range(n):
        host.submit(READ, now, set_only=True, tag=i)
    lost: int | None = None
    done: dict[object, Completion] = {}
    widest = 0
    while len(done) < n and now < 30:
        out = host.data_to_send()
        for f in frames(out):
            back = dev_reply(dev, f.encode(), now)
            now += 0.001
            for a in frames(back):
                if lost is None:
                    lost = a.seq
                    continue
                host.receive_data(a.encode(), now)
                done.update(completions(host))
                if 0 not in done:
                    widest = max(widest, (host._next_seq - lost) & 0xFFFFFFFF)
        if not out:
            now = max(now, host.next_deadline() or now)
        host.tick(now)
        done.update(completions(host))
    assert len(done) == n and all(c.outcome is Outcome.OK for c in done.values())
    assert done[0].replay and dev.counters["evicted"] == 0
    assert widest <= slots  # the pipeline waited for the stuck oldest request


def test_after_an_epoch_change_the_host_takes_numbers_from_the_new_boot_only() -> None:
    """Host 1 learns of a reboot from an EPOCH_MISMATCH and must re-issue its write. Had it used
    a number of its own (its counter ran on from the old boot), the new boot — which has seen
    nothing — would hand host 2 those very numbers; host 1 dies with the re-issue still on the
    line, the frame lands and runs under host 2's number, and host 2's own request is refused as a
    conflict. It says HELLO first instead, and the new boot hands out numbers a window apart."""
    ex = Exec()
    old = DeviceSession(ex, 0xE0, contract_hash=HASH)
    h1 = HostSession(contract_hash=HASH, hello_nonce=1, timeout=0.1, attempts=3)
    opened(h1, old)
    h1.submit(W100, 0.0, set_only=True, tag="p1")
    h1.data_to_send()  # lost: the device reboots
    new = DeviceSession(ex, 0xE1, contract_hash=HASH)
    h1.tick(0.2)  # the retry meets the new boot
    h1.receive_data(dev_reply(new, h1.data_to_send(), 0.2), 0.2)
    out = h1.data_to_send()
    assert [f.type for f in frames(out)] == [FrameType.HELLO]  # not a re-issue numbered by itself
    h1.receive_data(dev_reply(new, out, 0.2), 0.2)
    delayed = h1.data_to_send()  # the re-issue, under the new boot's number; host 1 dies
    assert [f.type for f in frames(delayed)] == [FrameType.REQUEST]

    h2 = HostSession(contract_hash=HASH, hello_nonce=2)
    opened(h2, new, 1.0)
    h2.submit(W500, 1.0, set_only=True, tag="p2")
    h2.submit(READ, 1.0, set_only=True, tag="p3")
    back = dev_reply(new, delayed, 1.0) + dev_reply(new, h2.data_to_send(), 1.0)
    h2.receive_data(back, 1.0)
    done = completions(h2)
    assert done["p2"].outcome is Outcome.OK and done["p3"].outcome is Outcome.OK
    assert [pdu for _, pdu in ex.calls] == [W100, W500, READ]  # each ran once
    assert len({seq for seq, _ in ex.calls}) == 3


def test_an_unanswered_handshake_after_an_epoch_change_settles_what_waits_and_goes_on() -> None:
    ex = Exec()
    old = DeviceSession(ex, 0xE0, contract_hash=HASH)
    host = HostSession(contract_hash=HASH, hello_nonce=5, timeout=0.1, attempts=3,
                       hello_attempts=2)
    opened(host, old)
    host.submit(W100, 0.0, set_only=True, tag="w")
    host.data_to_send()  # lost
    new = DeviceSession(ex, 0xE1, contract_hash=HASH)
    host.tick(0.2)
    host.receive_data(dev_reply(new, host.data_to_send(), 0.2), 0.2)  # EPOCH_MISMATCH
    host.data_to_send()  # HELLO, lost
    host.tick(0.35)
    host.data_to_send()  # HELLO again, lost: the round of hello_attempts is over
    host.tick(0.5)
    done = completions(host)["w"]
    assert done.outcome is Outcome.UNKNOWN and done.status is Status.EPOCH_CHANGED_IN_FLIGHT
    host.submit(READ, 0.5, set_only=True, tag="r")  # the session is still usable
    out = host.data_to_send()
    assert [f.type for f in frames(out)] == [FrameType.HELLO]  # the handshake goes on
    host.receive_data(dev_reply(new, out, 0.5), 0.5)
    host.receive_data(dev_reply(new, host.data_to_send(), 0.5), 0.5)
    assert completions(host)["r"].outcome is Outcome.OK
    assert ex.calls and ex.calls[-1][1] == READ and W100 not in [pdu for _, pdu in ex.calls]
