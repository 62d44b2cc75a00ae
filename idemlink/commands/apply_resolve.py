"""``idemlink apply PLAN.json --resolve KEY --executed|--not-executed [--device ID]``: settle by
hand a one-shot step that a cut-off run left in flight (the receipts are ``DeviceJournal``'s).

Contract: resolving a key the way the journal already has it is a harmless retry ("already
resolved", exit 0); the other way than recorded is one error line; several devices holding the key
in flight need ``--device ID``. A journal that cannot be used is one line, nothing sent
(``journal_refused``, shared with ``apply``).
"""

from __future__ import annotations

import argparse

from idemlink.cli import EXIT_OK, UserError
from idemlink.host.journal import DeviceJournal
from idemlink.host.journal_file import lock_journal
from idemlink.host.journal_format import JournalBusyError, JournalError, StepState
from idemlink.output import emit
from idemlink.protocol.outcome import Outcome

APPLY_SCHEMA = "idemlink.apply/1"  #: the schema of apply's JSON, resolving included


def journal_problem(journal_path: str, exc: JournalError) -> str:
    """``journal PATH: what is wrong``, naming the path once (most journal errors start with it)."""
    text = str(exc)
    if text.startswith("journal "):
        return text
    for prefix in (f"{journal_path}: ", f"{journal_path} "):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    return f"journal {journal_path}: {text}"


def journal_refused(journal_path: str, exc: JournalError) -> UserError:
    """The one line for a journal that cannot be used (nothing was sent)."""
    if isinstance(exc, JournalBusyError):  # its message names the journal already
        return UserError(f"{exc}; nothing sent")
    return UserError(journal_problem(journal_path, exc))


def resolve_step(args: argparse.Namespace, journal_path: str) -> int:
    """``apply --resolve KEY --executed|--not-executed [--device ID]``: settle by hand. Resolving
    a key the way the journal already has it is a harmless retry (``already resolved``, exit 0):
    receipted for ``--executed``; not in flight and receipted nowhere for ``--not-executed``
    (the journal keeps no record of a step that did not run: "never began" reads the same).
    The other way than recorded stays an error."""
    if args.executed == args.not_executed:
        raise UserError("--resolve KEY needs --executed or --not-executed (check the device first)")
    verdict = "executed" if args.executed else "not_executed"
    try:
        with lock_journal(journal_path):
            j = DeviceJournal.open(journal_path)
            in_state = {s: sorted(d for d in j.snapshot.devices
                                  if j.state(d, args.resolve) is s
                                  and args.device in (None, d)) for s in StepState}
            holders = in_state[StepState.PENDING]
            if not holders:
                return already_resolved(args, journal_path, verdict, in_state[StepState.DONE])
            if len(holders) > 1:
                raise UserError(f"journal {journal_path}: {args.resolve} is in flight on "
                                f"{len(holders)} devices ({', '.join(holders)}): add --device ID")
            j.resolve(holders[0], args.resolve, executed=args.executed)
    except JournalError as exc:
        raise journal_refused(journal_path, exc) from None
    emit(args, APPLY_SCHEMA, {"outcome": Outcome.OK.name, "journal": journal_path,
                              "resolved": args.resolve, "device": holders[0], "as": verdict},
         [f"{args.resolve}: resolved as {verdict.replace('_', ' ')} on device {holders[0]} "
          f"(journal {journal_path})"])
    return EXIT_OK


def already_resolved(args: argparse.Namespace, journal_path: str, verdict: str,
                     receipted: list[str]) -> int:
    """A key no device has in flight: exit 0 when the journal already says what ``verdict``
    says, one UserError line otherwise."""
    on_device = f" for device {args.device}" if args.device else ""
    if args.executed and not receipted:
        raise UserError(f"journal {journal_path}: {args.resolve} is not in flight{on_device}")
    if args.not_executed and receipted:
        raise UserError(f"journal {journal_path}: {args.resolve} is receipted as executed on "
                        f"device {', '.join(receipted)}: it cannot be resolved as not executed")
    if args.executed:
        where = f"on device {', '.join(receipted)}"
        line = f"{args.resolve}: already resolved as executed {where} (journal {journal_path})"
    else:
        line = (f"{args.resolve}: already resolved as not executed{on_device}: not in flight, "
                f"the journal holds no receipt, the step may run (journal {journal_path})")
    device = receipted[0] if len(receipted) == 1 else args.device
    emit(args, APPLY_SCHEMA, {"outcome": Outcome.OK.name, "journal": journal_path,
                              "resolved": args.resolve, "device": device, "as": verdict,
                              "already": True}, [line])
    return EXIT_OK
