"""``idemlink soak``: the fault campaign that proves the promise (see ``idemlink.campaign``).

Exit 0 when the oracle found nothing wrong, 6 when it did, 1 (one line on stderr) when the
campaign could not start: bad settings, or no opening HELLO got through (``--loss 1.0``).
``--json`` prints the report as one ``idemlink.soak/1`` object. Progress goes to stderr
(``idemlink.output.Progress``); Ctrl-C prints one line with the commands run so far, exit 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from idemlink.cli import EXIT_INTERRUPTED, mark_reported
from idemlink.output import Progress, add_json_option, error_json, print_json


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "soak", help="mixed commands through a lossy link with reboots, judged by an oracle",
        description="Exit 0 when the oracle found zero duplicated effects, zero lost "
        "acknowledged writes and zero misclassified outcomes; exit 6 otherwise.",
    )
    p.add_argument("--commands", type=int, default=20_000,
                   help="commands to run (default 20000)")
    p.add_argument("--loss", type=float, default=0.1, help="per-frame loss, each direction")
    p.add_argument("--dup", type=float, default=0.02, help="per-frame duplication, each direction")
    p.add_argument("--corrupt", type=float, default=0.02, help="per-frame bit flips, each direction")
    p.add_argument("--reorder", type=float, default=0.0, help="per-frame reordering")
    p.add_argument("--noise", type=float, default=0.0, help="noise bursts per simulated second")
    p.add_argument("--reboot-every", type=int, default=500, help="mean commands between reboots")
    p.add_argument("--batch", type=int, default=4, help="max commands pipelined together")
    p.add_argument("--seed", type=int, default=1, help="seed of every fault and command (default 1)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line every 5 s)")
    add_json_option(p, "idemlink.soak/1")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw retries, replays, UNKNOWN and reboots along the run (matplotlib)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from idemlink.campaign import CampaignConfig, TimelinePoint, run_campaign
    from idemlink.cli import UserError
    from idemlink.device_sim.link import LinkConfigError
    from idemlink.host.device import IncompatibleDevice, NoDevice

    if args.commands < 1 or args.reboot_every < 0:
        raise UserError("--commands must be >= 1 and --reboot-every >= 0")
    timeline: list[TimelinePoint] | None = None
    if args.plot is not None:
        from idemlink.soak_plot import PlotUnavailable, check_plot_path

        try:
            check_plot_path(args.plot)  # before the campaign: a bad path costs nothing
        except PlotUnavailable as exc:
            raise UserError(str(exc)) from None
        timeline = []
    cfg = CampaignConfig(
        commands=args.commands, loss=args.loss, dup=args.dup, corrupt=args.corrupt,
        reorder=args.reorder, noise_rate=args.noise, reboot_every=args.reboot_every,
        seed=args.seed, max_batch=max(1, args.batch),
    )
    bar = Progress("soak", "commands", enabled=not args.no_progress)

    def tick(n: int) -> None:
        bar.update(bar.done + n, cfg.commands)

    try:
        report = run_campaign(cfg, progress=tick, timeline=timeline)
    except KeyboardInterrupt as exc:
        message = (f"interrupted after {bar.done} of {cfg.commands} commands; no verdict (the "
                   "oracle judges a finished campaign)")
        print(f"idemlink soak: {message}", file=sys.stderr)
        error_json(args, message, EXIT_INTERRUPTED, commands_run=bar.done,
                   commands=cfg.commands)
        raise mark_reported(exc) from None
    except LinkConfigError as exc:  # a probability or rate out of range: the user's mistake
        raise UserError(str(exc)) from None
    except (NoDevice, IncompatibleDevice) as exc:  # e.g. --loss 1.0: no handshake gets through
        raise UserError(f"the opening HELLO failed, no command was run: {exc}") from None
    finally:
        bar.close()
    if timeline is not None:
        _plot(args.plot, timeline, cfg, report)
    d = report.as_dict()
    if args.json:
        print_json("idemlink.soak/1", d)
    else:
        oc = d["outcomes"]
        print(f"commands {d['commands']}  (seed {cfg.seed}, loss {cfg.loss}, dup {cfg.dup}, "
              f"corrupt {cfg.corrupt}, reboots {d['reboots']})")
        print("outcomes  " + "  ".join(f"{k} {oc.get(k, 0)}" for k in
                                       ("OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN")))
        print(f"retries {d['retries']}  replays {d['replays']}  unknown reconciled "
              f"{d['unknown_reconciled']}  unresolved {d['unknown_unresolved']}  "
              f"set-only re-issued {d['reissued_set_only']}")
        print(f"duplicated effects {d['duplicated_effects']}  lost acknowledged writes "
              f"{d['lost_acknowledged_writes']}  misclassified {d['misclassified']}")
        print(f"{d['commands_per_second']} commands/s wall, {d['simulated_seconds']:.1f} s simulated")
        for p in d["problems"]:
            print("PROBLEM", p)
    return 0 if report.passed else 6


def _plot(path: str, timeline: list[Any], cfg: Any, report: Any) -> None:
    from idemlink.cli import UserError
    from idemlink.soak_plot import PlotUnavailable, plot_timeline

    caption = (f"{report.commands} commands, seed {cfg.seed}, up to {cfg.max_batch} pipelined; "
               f"reboot every ~{cfg.reboot_every} commands\nper frame each way: loss {cfg.loss}, "
               f"dup {cfg.dup}, corrupt {cfg.corrupt}, reorder {cfg.reorder}")
    try:
        plot_timeline(timeline, path, caption)
    except PlotUnavailable as exc:
        raise UserError(str(exc)) from None
    print(f"plot written to {path}", file=sys.stderr)
