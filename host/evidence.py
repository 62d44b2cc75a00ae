"""Did a request whose answer never came run? Only the device can say: the one place it is judged.

Contract (docs/DESIGN.md, "Reconcile by evidence"):

- No answer is not "did not run", and an effect seen is not "ran": a fault bit a reboot cleared,
  or values that were already set, look the same as a command that ran. "It ran" therefore rests
  only on the device's own record, asked for by re-sending the request under its original
  (epoch, sequence number) with the same content (``HostSession.resend``).
- The device's answer to that re-send is the evidence, judged by ``PROOFS`` (one row per kind of
  answer): a replayed stored answer or ANSWER_EVICTED — it ran before; a first answer — it had not
  arrived and ran now, once; IDEMPOTENCY_CONFLICT — another request holds that number, so this
  one never ran under it (a pinned request travels under one number only); TOO_OLD, no answer, a
  new boot epoch — no evidence: it stays unknown.
- A re-send is possible only in the boot epoch the request was sent in (``resend_number``): after
  a reboot the device's window is gone, and a plain Modbus device keeps no record at all. What a
  read-back sees then is reported as what holds now — never as "it ran".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from idemlink.host.command import Reconciliation, Result
from idemlink.protocol.outcome import Status


class Proof(Enum):
    """What the device's answer to a re-send proves about the first send."""

    REPLAYED = "replayed"  #: it answered from its replay cache
    EVICTED = "evicted"  #: the number ran; the answer is no longer kept
    RAN_NOW = "ran_now"  #: it never arrived before: it ran now, once
    NEVER_RAN = "never_ran"  #: another request holds the number: this one never ran under it
    NONE = "none"  #: no evidence (too old, no answer, another boot, no re-send possible)


@dataclass(frozen=True, slots=True)
class ProofRule:
    executed: bool | None  #: did the request run on the device (True also for "ran now")
    says: str  #: the sentence a user reads


PROOFS: dict[Proof, ProofRule] = {
    Proof.REPLAYED: ProofRule(True, "it replayed its answer: it ran before"),
    Proof.EVICTED: ProofRule(True, "it says this number ran before (ANSWER_EVICTED: its answer "
                                   "is no longer kept)"),
    Proof.RAN_NOW: ProofRule(True, "it had not reached the device: re-sent under its number, it "
                                   "ran now, once"),
    Proof.NEVER_RAN: ProofRule(False, "it holds another request under this number "
                                      "(IDEMPOTENCY_CONFLICT): this one never ran"),
    Proof.NONE: ProofRule(None, "no evidence from the device"),
}
"""Every kind of evidence and what it settles: the rule, in one table."""


def proof_of(resent: Result) -> Proof:
    """What the answer to a re-send (``HostSession.resend``) proves."""
    if resent.answered:
        return Proof.REPLAYED if resent.replay else Proof.RAN_NOW
    if resent.status is Status.ANSWER_EVICTED:
        return Proof.EVICTED
    if resent.status is Status.IDEMPOTENCY_CONFLICT:
        return Proof.NEVER_RAN
    return Proof.NONE


def resend_number(sent_as: tuple[tuple[int, int], ...], epoch: int | None) -> tuple[int, int] | None:
    """The (epoch, seq) a request can be re-sent under to ask the device whether it ran: the last
    number it travelled under, if that is in the device's current ``epoch`` (None: no re-send can
    tell — another boot, or never sent)."""
    if not sent_as or epoch is None:
        return None
    last = sent_as[-1]
    return last if last[0] == epoch else None


def no_resend_reason(sent_as: tuple[tuple[int, int], ...], epoch: int | None,
                     *, numbered: bool = True) -> str:
    """Why ``resend_number`` found nothing to ask, in a user's words (``numbered``: the protocol
    numbers its requests; a plain Modbus slave does not)."""
    if not numbered:
        return "a plain Modbus device keeps no record of what it ran"
    if epoch is None:
        return "the session to the device is not open: nothing could ask it"
    if not sent_as:
        return "no number was recorded for it"
    return (f"the device restarted since (boot epoch {sent_as[-1][0]:08x}, now {epoch:08x}): "
            "its record of that boot is gone")


def with_evidence(read_back: Reconciliation, resent: Result | None,
                  why_no_resend: str) -> Reconciliation:
    """``read_back`` (what holds now) with the verdict of the device's evidence: the re-send's
    proof (``PROOFS``), or, without a re-send, unknown for the reason given. What holds now never
    decides "it ran"."""
    if resent is None:
        return dataclasses.replace(read_back, executed=None, evidence=why_no_resend)
    proof = proof_of(resent)
    rule = PROOFS[proof]
    says = rule.says if proof is not Proof.NONE else f"re-sent, no evidence: {resent.describe()}"
    return dataclasses.replace(read_back, executed=rule.executed, evidence=says, resent=resent)


__all__ = ["PROOFS", "Proof", "ProofRule", "no_resend_reason", "proof_of", "resend_number",
           "with_evidence"]
