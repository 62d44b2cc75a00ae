"""``idemlink soak``: the fault campaign that proves the promise (see ``idemlink.campaign``).

The device under test is the in-process simulator on a simulated clock, or with
``--device-cmd "CMD … {port} … {effects}"`` any device program, spawned and restarted for
reboots, judged from the effects file it appends (``idemlink.soak_device``, docs/SOAK.md).

Output: the report (text, or ``--json``), then one line ``PASS: …`` or ``FAIL: …`` (on stderr
with ``--json``). Progress: a bar on a terminal, else a line on stderr every tenth of the run.
Ctrl-C stops the campaign after the batch in flight: the counts so far are printed the same way
(``interrupted`` in JSON); a second Ctrl-C interrupts at once.
Exit 0 when the oracle found nothing wrong (130 if interrupted), 6 when it did, 1 (one line on
stderr) when the campaign could not start: bad settings, a device command that does not run, or
no opening HELLO got through (``--loss 1.0``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemlink.campaign import CampaignConfig, CampaignReport

EXIT_INTERRUPTED = 130


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "soak", help="mixed commands through a lossy link with reboots, judged by an oracle",
        description="Exit 0 when the oracle found zero duplicated effects, zero lost "
        "acknowledged writes, zero misclassified outcomes and zero register-semantics "
        "violations; exit 6 otherwise.",
    )
    p.add_argument("--commands", type=int, default=20_000)
    p.add_argument("--loss", type=float, default=0.1, help="per-frame loss, each direction")
    p.add_argument("--dup", type=float, default=0.02, help="per-frame duplication, each direction")
    p.add_argument("--corrupt", type=float, default=0.02, help="per-frame bit flips, each direction")
    p.add_argument("--reorder", type=float, default=0.0, help="per-frame reordering")
    p.add_argument("--noise", type=float, default=0.0, help="noise bursts per simulated second")
    p.add_argument("--reboot-every", type=int, default=500, help="mean commands between reboots")
    p.add_argument("--restart-every", type=int, default=250,
                   help="mean commands between host-process crashes (0: never)")
    p.add_argument("--batch", type=int, default=4, help="max commands pipelined together")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device-cmd", metavar="CMD",
                   help="run the device as this command: {port} is the pty it serves, {effects} "
                        "the file it appends its record to, {flash} a directory kept across its "
                        "restarts (docs/SOAK.md)")
    p.add_argument("--trigger-duration", type=float, default=None,
                   help="seconds a trigger stays RUNNING on the device (0.05 in-process; give "
                        "the device command's value with --device-cmd)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first problem")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.set_defaults(handler=run)


def _progress(total: int, use_bar: bool) -> tuple[Callable[[int], None], Callable[[], None]]:
    """A bar on a terminal; else a line on stderr every tenth of the run (and every 30 s)."""
    if use_bar:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="cmd", desc="soak")

        def update(n: int) -> None:
            bar.update(n)

        return update, bar.close
    done = 0
    step = max(1, total // 10)
    last = time.monotonic()

    def tick(n: int) -> None:
        nonlocal done, last
        before, done = done, done + n
        now = time.monotonic()
        if done // step != before // step or now - last > 30:
            last = now
            print(f"soak: {done}/{total} commands", file=sys.stderr, flush=True)

    return tick, lambda: None


def _first_interrupt_stops() -> tuple[Callable[[], bool], Callable[[], None]]:
    """The first Ctrl-C asks the campaign to stop after the batch in flight (its results are
    judged and counted); a second one interrupts at once."""
    asked = threading.Event()

    def handler(signum: int, frame: object) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: no handler, Ctrl-C interrupts as usual
        return asked.is_set, lambda: None
    def restore() -> None:
        signal.signal(signal.SIGINT, previous)

    return asked.is_set, restore


def run(args: argparse.Namespace) -> int:
    from idemlink.campaign import CampaignConfig, run_campaign
    from idemlink.cli import UserError
    from idemlink.device_sim.link import LinkConfigError
    from idemlink.host.device import IncompatibleDevice, NoDevice, PortError
    from idemlink.soak_device import DeviceCommandError, run_device_campaign

    if args.commands < 1 or args.reboot_every < 0 or args.restart_every < 0:
        raise UserError("--commands must be >= 1, --reboot-every and --restart-every >= 0")
    duration = args.trigger_duration if args.trigger_duration is not None else 0.05
    if not duration >= 0:
        raise UserError(f"--trigger-duration {duration} must be >= 0 seconds")
    cfg = CampaignConfig(
        commands=args.commands, loss=args.loss, dup=args.dup, corrupt=args.corrupt,
        reorder=args.reorder, noise_rate=args.noise, reboot_every=args.reboot_every,
        restart_every=args.restart_every, seed=args.seed, max_batch=max(1, args.batch),
        trigger_duration=duration,
    )
    tick, close = _progress(cfg.commands, sys.stderr.isatty() and not args.json)
    report: CampaignReport
    stop, restore = _first_interrupt_stops()
    try:
        if args.device_cmd:
            report = run_device_campaign(cfg, args.device_cmd, tick, stop,
                                         fail_fast=args.fail_fast)
        else:
            report = run_campaign(cfg, tick, stop, fail_fast=args.fail_fast)
    except LinkConfigError as exc:  # a probability or rate out of range: the user's mistake
        raise UserError(str(exc)) from None
    except (NoDevice, IncompatibleDevice) as exc:  # e.g. --loss 1.0: no handshake gets through
        raise UserError(f"the opening HELLO failed, no command was run: {exc}") from None
    except (DeviceCommandError, PortError) as exc:
        raise UserError(f"--device-cmd: {exc}") from None
    finally:
        restore()
        close()
    _print(report, cfg, args.json)
    if not report.passed:
        return 6
    return EXIT_INTERRUPTED if report.interrupted else 0


def _print(report: CampaignReport, cfg: CampaignConfig, as_json: bool) -> None:
    d = report.as_dict()
    d["verdict"] = report.verdict()
    if as_json:
        print(json.dumps(d, indent=1, sort_keys=True))
        print(d["verdict"], file=sys.stderr)
        return
    oc = d["outcomes"]
    print(f"commands {d['commands']}{' (interrupted)' if d['interrupted'] else ''}  "
          f"(seed {cfg.seed}, loss {cfg.loss}, dup {cfg.dup}, corrupt {cfg.corrupt}, "
          f"reboots {d['reboots']}, host restarts {d['host_restarts']})")
    print("outcomes  " + "  ".join(f"{k} {oc.get(k, 0)}" for k in
                                   ("OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN")))
    print(f"executions {d['executions']} (late {d['late_executions']}, read-backs "
          f"{d['reconcile_reads']})  retries {d['retries']}  replays {d['replays']}  "
          f"set-only re-issued {d['reissued_set_only']}")
    print(f"unknown reconciled {d['unknown_reconciled']}  unresolved {d['unknown_unresolved']}  "
          f"dead host's requests reconciled {d['dead_reconciled']}")
    print(f"duplicated effects {d['duplicated_effects']}  lost acknowledged writes "
          f"{d['lost_acknowledged_writes']}  misclassified {d['misclassified']}  "
          f"register semantics {d['register_semantics']}")
    print(f"{d['commands_per_second']} commands/s wall, {d['simulated_seconds']:.1f} s on the "
          "device's clock")
    for p in d["problems"]:
        print("PROBLEM", p)
    print(d["verdict"])
