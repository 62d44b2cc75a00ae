"""Reconcile by evidence: whether an UNKNOWN ran is the device's word, never an appearance.

The device's record is the ground truth here (``SimulatedDevice.executions``): every kind of
answer to a re-send under the original number (``HostSession.resend``) is produced for real and
its verdict (``idemlink.host.evidence.PROOFS``) checked against what the device ran; the
sans-I/O rules of pinned numbers are driven without a device.
"""

from __future__ import annotations

from typing import Any

import pytest

from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.simlink import SimTransport
from idemlink.host.command import SentRequest
from idemlink.host.device import Device
from idemlink.host.evidence import PROOFS, Proof, proof_of
from idemlink.protocol.contract import contract_hash
from idemlink.protocol.host_session import HostSession
from idemlink.protocol.outcome import LocalProtocolError, Outcome


def connected(device: SimulatedDevice) -> Device:
    dev = Device(SimTransport(device), attempts=3, timeout=0.05)
    dev.connect()
    return dev


def runs(device: SimulatedDevice, pdu: bytes) -> list[tuple[int, int]]:
    return [(e.epoch, e.seq) for e in device.executions if e.request == pdu]


# ------------------------------------------------------------------ sans-I/O rules


def test_no_number_is_promised_unless_the_session_is_open_and_idle() -> None:
    s = HostSession(contract_hash=contract_hash())
    assert s.next_number() is None  # closed
    s.open(0.0)
    assert s.next_number() is None  # handshake under way


def test_a_pinned_request_that_would_get_another_number_is_never_sent() -> None:
    dev = connected(SimulatedDevice(seed=1))
    s = dev.session
    number = s.next_number()
    assert number is not None
    epoch, seq = number
    s.submit(b"\x03\x00\x00\x00\x01", 0.0, set_only=True, tag="t", number=(epoch, seq + 1))
    assert s.data_to_send() == b""
    ev = s.next_event()
    assert ev is not None and ev.outcome is Outcome.NOT_EXECUTED and not ev.sent_as  # type: ignore[union-attr]


def test_a_queued_number_is_the_one_it_travels_under_behind_what_is_out() -> None:
    """``queued_number`` promises a number while others are out (the gateway's pipelined
    calls): each request submitted with the number it was given travels under it; one given a
    number that turns out otherwise (here: one ahead) is never sent."""
    s = HostSession(contract_hash=contract_hash())
    assert s.queued_number() is None  # closed
    dev = connected(SimulatedDevice(seed=1))
    s = dev.session
    read = b"\x03\x00\x00\x00\x01"
    first = s.queued_number()
    assert first is not None and s.next_number() == first
    s.submit(read, 0.0, set_only=True, tag="a", number=first)
    second = s.queued_number()
    assert second == (first[0], first[1] + 1) and s.next_number() is None  # one is out
    s.submit(read, 0.0, set_only=True, tag="b", number=second)
    before = s.counters.sent
    assert s.data_to_send() and s.outstanding == 2
    third = s.queued_number()
    assert third == (first[0], first[1] + 2)
    s.submit(read, 0.0, set_only=True, tag="c", number=(third[0], third[1] + 1))
    assert s.data_to_send() == b"" and s.counters.sent == before
    ev = s.next_event()
    assert ev is not None and ev.tag == "c" and ev.outcome is Outcome.NOT_EXECUTED  # type: ignore[union-attr]


def test_a_resend_of_another_boot_is_refused_and_changes_nothing() -> None:
    dev = connected(SimulatedDevice(seed=1))
    s = dev.session
    with pytest.raises(LocalProtocolError, match="another boot"):
        s.resend(b"\x42\x00\x08\x00\x01", ((s.epoch + 1) & 0xFFFFFFFF, 5), 0.0)
    assert s.outstanding == 0 and s.data_to_send() == b""


# ------------------------------------------------------------------ every kind of evidence


def test_a_request_that_ran_is_replayed_not_run_again() -> None:
    device = SimulatedDevice(seed=2)
    dev = connected(device)
    r = dev.trigger()
    assert r.ok
    rec = dev.reconcile_sent(r.command, r.sent_as)
    assert rec.resent is not None and proof_of(rec.resent) is Proof.REPLAYED
    assert rec.executed is True and len(runs(device, r.command.pdu())) == 1


def test_a_request_that_never_arrived_runs_now_once() -> None:
    device = SimulatedDevice(seed=3)
    dev = connected(device)
    cmd = dev.trigger_command()
    number = dev.session.next_number()
    assert number is not None  # recorded, then the process died before sending
    rec = dev.reconcile_sent(cmd, (number,))
    assert rec.resent is not None and proof_of(rec.resent) is Proof.RAN_NOW
    assert rec.executed is True and runs(device, cmd.pdu()) == [number]
    again = dev.reconcile_sent(cmd, (number,))  # asking twice never runs it twice
    assert again.resent is not None and proof_of(again.resent) is Proof.REPLAYED
    assert runs(device, cmd.pdu()) == [number]


def test_a_number_holding_another_request_proves_this_one_never_ran() -> None:
    device = SimulatedDevice(seed=4)
    dev = connected(device)
    sent: list[SentRequest] = []
    assert dev.execute_recorded(dev.write_command({"mode": 2}), sent.append).ok
    mine = dev.trigger_command()  # a request journaled under that number, never sent
    rec = dev.reconcile_sent(mine, (sent[0].number,))  # type: ignore[arg-type]
    assert rec.resent is not None and proof_of(rec.resent) is Proof.NEVER_RAN
    assert rec.executed is False and runs(device, mine.pdu()) == []


def test_an_evicted_answer_still_proves_it_ran() -> None:
    device = SimulatedDevice(seed=5)
    dev = connected(device)
    r = dev.trigger()
    slots = dev.info.replay_slots if dev.info is not None else 8
    for _ in range(slots + 2):  # push its answer out of the replay cache, not out of the window
        assert dev.read("mode").ok
    rec = dev.reconcile_sent(r.command, r.sent_as)
    assert rec.resent is not None and proof_of(rec.resent) is Proof.EVICTED
    assert rec.executed is True and len(runs(device, r.command.pdu())) == 1


def test_after_a_reboot_nothing_can_be_asked_and_the_state_decides_nothing() -> None:
    device = SimulatedDevice(seed=6)
    dev = connected(device)
    r = dev.trigger()
    device.reboot(1.0)
    dev2 = connected(device)
    rec = dev2.reconcile_sent(r.command, r.sent_as)
    assert rec.resent is None and rec.executed is None
    assert "restarted since" in rec.evidence
    assert len(runs(device, r.command.pdu())) == 1


def test_every_proof_has_a_rule_and_only_device_answers_say_ran() -> None:
    assert set(PROOFS) == set(Proof)
    assert {p for p, rule in PROOFS.items() if rule.executed} == {
        Proof.REPLAYED, Proof.EVICTED, Proof.RAN_NOW}
    assert PROOFS[Proof.NONE].executed is None


def test_mutant_reconcile_taking_the_state_for_evidence_fails_the_soak(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The soak's oracle checks every reconcile() verdict of "it ran" / "it never ran" against the
    device's record of that number: a reconcile that judges by what holds now must fail it
    (``idemlink soak --commands 5000 --reboot-every 5 --seed 2``)."""
    import dataclasses

    import idemlink.host.operations as operations
    from idemlink.campaign import CampaignConfig, run_campaign

    def appearance(read_back: Any, resent: Any, why: str) -> Any:
        return dataclasses.replace(read_back, executed=read_back.intended_state_holds,
                                   evidence="read back", resent=resent)

    monkeypatch.setattr(operations, "with_evidence", appearance)
    rep = run_campaign(CampaignConfig(commands=5000, reboot_every=5, seed=2), fail_fast=True)
    assert rep.misclassified > 0
    assert any("reconcile() said" in p for p in rep.problems), rep.problems[:3]
