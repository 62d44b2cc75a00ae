"""``idemlink soak``: the fault campaign that proves the promise (see ``idemlink.campaign``).

The device under test is the in-process simulator on a simulated clock, or with
``--device-cmd "CMD … {port} … {effects}"`` any device program, spawned and restarted for
reboots, judged from the effects file it appends (``idemlink.soak_device``, docs/SOAK.md); with
``{control}`` in the command the map's fault conditions and inputs move through the device's
control FIFO, as they move in-process (``--conditions``).

Output: the report (text, ending with one line ``PASS: …`` or ``FAIL: …``; or with ``--json``
one ``idemlink.soak/1`` object with a ``verdict`` key, the verdict line then on stderr). Progress
goes to stderr (``idemlink.output.Progress``). The first Ctrl-C stops the campaign after the batch
in flight: the counts so far are printed, then one line ``idemlink soak: interrupted after N of M
commands; …`` (with ``--json``: one ``idemlink.error/1`` object carrying ``commands_run`` and the
counts); a second Ctrl-C interrupts at once. Exit 0 when the oracle found nothing wrong (130 if
interrupted), 6 when it did, 1 (one line on stderr) when the campaign could not start: bad
settings, a device command that does not run, or no opening HELLO got through (``--frame-loss 1.0``).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from idemlink.cli import EXIT_INTERRUPTED, add_frame_fault_options, add_regmap_option, regmap_from
from idemlink.output import Progress, add_json_option, error_json, print_json

if TYPE_CHECKING:
    from idemlink.campaign import CampaignConfig, CampaignReport, TimelinePoint

EXIT_FOUND = 6


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "soak", help="mixed commands through a lossy link with reboots, judged by an oracle",
        description="Exit 0 when the oracle found zero duplicated effects, zero lost "
        "acknowledged writes, zero misclassified outcomes and zero register-semantics "
        "violations; exit 6 otherwise.",
    )
    p.add_argument("--commands", type=int, default=20_000,
                   help="commands to run (default 20000)")
    add_frame_fault_options(p, loss=0.1, dup=0.02, corrupt=0.02)
    p.add_argument("--reorder", type=float, default=0.0, help="per-frame reordering")
    p.add_argument("--noise", type=float, default=0.0, help="noise bursts per simulated second")
    p.add_argument("--reboot-every", type=int, default=500,
                   help="mean commands between device reboots (default 500; 0: never)")
    p.add_argument("--restart-every", type=int, default=250,
                   help="mean commands between host-process crashes (default 250; 0: never)")
    p.add_argument("--outage-every", type=int, default=250, metavar="N",
                   help="mean commands between outages of the line, one way or both, long enough "
                        "that every attempt of the batch sent into them is lost (default 250; "
                        "0: never)")
    p.add_argument("--outage-seconds", type=float, default=None, metavar="S",
                   help="how long an outage lasts (default 1.5 x attempts x retry timeout)")
    p.add_argument("--late", type=float, default=0.01, metavar="P",
                   help="per-frame probability, each way, that a copy of the frame arrives again "
                        "much later: after its answer left the replay cache (default 0.01)")
    p.add_argument("--late-frames", type=int, default=300, metavar="N",
                   help="a late copy arrives after about this many further frames (default 300)")
    p.add_argument("--conditions", type=float, default=0.02, metavar="P",
                   help="per batch, the probability that the external condition of one of the "
                        "map's declared fault bits comes or goes (default 0.02; with --device-cmd "
                        "only when it has {control})")
    p.add_argument("--batch", type=int, default=4, help="max commands pipelined together")
    p.add_argument("--seed", type=int, default=1, help="seed of every fault and command (default 1)")
    p.add_argument("--device-cmd", metavar="CMD",
                   help="run the device as this command: {port} is the pty it serves, {effects} "
                        "the file it appends its record to, {flash} a directory kept across its "
                        "restarts, {control} (optional) a FIFO the soak writes the map's fault "
                        "conditions and inputs to (the device's --control; docs/SOAK.md)")
    p.add_argument("--trigger-duration", type=float, default=None,
                   help="seconds a trigger stays RUNNING on the device (0.05 in-process; with "
                        "--device-cmd a device whose boot line declares its own is judged by it)")
    p.add_argument("--retry-timeout", type=float, default=None, metavar="SECONDS",
                   help="with --device-cmd: seconds without an answer before a retry (default "
                        "0.1, for a device in Python on a loaded machine; a device in C answers "
                        "within milliseconds, and an early retry is answered by replay)")
    p.add_argument("--bus", type=int, default=None, metavar="N",
                   help="soak N simulated devices (addresses 1..N) on one half-duplex bus, each "
                        "judged by its own oracle: per-device faults, reboots of single devices "
                        "(--reboot-every: mean commands of one device), one device dead for a "
                        "stretch, broadcasts (docs/SOAK.md, 'On a bus')")
    p.add_argument("--broadcast-every", type=int, default=25, metavar="N",
                   help="with --bus: mean commands between broadcasts (default 25; 0: never)")
    p.add_argument("--dead", type=int, default=-1, metavar="ADDRESS",
                   help="with --bus: the device taken off the bus for 30..55%% of the run "
                        "(default the last; 0: none)")
    p.add_argument("--c-devices", type=int, default=0, metavar="K",
                   help="with --bus: the last K devices are the posix C device, each its own "
                        "process on the medium, judged from its effects file; the run is then on "
                        "the real clock (docs/SOAK.md, 'On a bus')")
    p.add_argument("--c-binary", metavar="PATH", default=None,
                   help="the posix C device for --c-devices (default: "
                        "firmware_ref/build/posix/idemlink-device of the checkout)")
    p.add_argument("--qemu-devices", type=int, default=0, metavar="K",
                   help="with --bus: K devices (the addresses after the C devices') are the C "
                        "device on QEMU (firmware_ref/tools/qemu-device, an image with the bus)")
    p.add_argument("--qemu-board", choices=("mps2", "microbit"), default="mps2",
                   help="the QEMU board of --qemu-devices (default mps2)")
    p.add_argument("--qemu-elf", metavar="ELF", default=None,
                   help="the image for --qemu-devices (default: firmware_ref/build/bus/qemu"
                        "[-microbit]/idemlink-device.elf, make qemu-device IDL_OPTS=-DIDL_BUS=1 "
                        "BUILD=build/bus)")
    p.add_argument("--authenticated", action="store_true",
                   help="a keyed device and host: every frame signed (a test key drawn from "
                        "--seed; docs/SECURITY.md); the oracle takes only signed answers as "
                        "evidence")
    p.add_argument("--adversary", type=float, default=0.0, metavar="RATE",
                   help="an attacker in the line: per host request, with probability RATE, one "
                        "forged, replayed, reflected, stripped, truncated or bit-flipped frame "
                        "(docs/SECURITY.md); an execution of any request the host did not send "
                        "fails the run (default 0)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first problem")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line every 5 s)")
    add_regmap_option(p)
    add_json_option(p, "idemlink.soak/1")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw retries, replays, UNKNOWN and reboots along the run (matplotlib)")
    p.set_defaults(handler=run)


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


def _config(args: argparse.Namespace) -> CampaignConfig:
    from idemlink.campaign import CampaignConfig
    from idemlink.cli import UserError

    if args.commands < 1 or args.reboot_every < 0 or args.restart_every < 0:
        raise UserError("--commands must be >= 1, --reboot-every and --restart-every >= 0")
    if args.outage_every < 0:
        raise UserError("--outage-every must be >= 0")
    if not 0.0 <= args.conditions <= 1.0:
        raise UserError(f"--conditions {args.conditions} must be a probability (0..1)")
    outage = args.outage_seconds
    if outage is not None and not (math.isfinite(outage) and 0 < outage <= 3600):
        raise UserError(f"--outage-seconds {outage} must be between 0 and 3600 seconds")
    duration = args.trigger_duration if args.trigger_duration is not None else 0.05
    if not duration >= 0:
        raise UserError(f"--trigger-duration {duration} must be >= 0 seconds")
    regmap = args.regmap if args.regmap is not None else "thermal-controller"
    loaded = regmap_from(args)  # a map file that cannot be loaded: one line, before anything starts
    if loaded.generation is None:
        raise UserError(f"the map {loaded.name} has no generation register: the soak drives a "
                        "framed idemlink device, which needs one")
    typed = [r.name for r in loaded if r.type_text or r.space.value != "register"]
    if typed:
        raise UserError(f"the map {loaded.name} has registers of other types than u16, coils "
                        f"or discrete inputs ({', '.join(typed[:3])}"
                        f"{', ...' if len(typed) > 3 else ''}): the soak's oracle models 16-bit "
                        "registers only")
    return CampaignConfig(
        regmap=regmap, commands=args.commands, loss=args.loss, dup=args.dup, corrupt=args.corrupt,
        reorder=args.reorder, noise_rate=args.noise, reboot_every=args.reboot_every,
        restart_every=args.restart_every, seed=args.seed, max_batch=max(1, args.batch),
        trigger_duration=duration, outage_every=args.outage_every, outage_length=outage,
        late=args.late, late_frames=args.late_frames, conditions=args.conditions,
        authenticated=args.authenticated, adversary=args.adversary,
    )


#: Options whose faults the bus campaign does not make (docs/SOAK.md, "On a bus"), with their
#: defaults: given another value than the default or 0 with --bus, they are refused.
NOT_ON_A_BUS = {"restart_every": 250, "outage_every": 250, "late": 0.01, "reorder": 0.0,
                "noise": 0.0, "outage_seconds": None, "device_cmd": None, "plot": None,
                "retry_timeout": None, "authenticated": False, "adversary": 0.0,
                "conditions": 0.02}


def _run_bus(args: argparse.Namespace) -> int:
    from idemlink.bus_campaign import BusCampaignConfig, run_bus_campaign
    from idemlink.cli import UserError
    from idemlink.device_sim.bus_station import StationError
    from idemlink.device_sim.link import LinkConfigError
    from idemlink.protocol.outcome import LocalProtocolError

    for name, default in NOT_ON_A_BUS.items():
        value = getattr(args, name)
        if value not in (default, 0, None):
            raise UserError(f"--{name.replace('_', '-')} is not done on a bus (--bus): host "
                            "crashes, outages, late copies, reordering, noise, the condition "
                            "rate, authentication and its adversary, a device command and the "
                            "plot are the point-to-point soak's")
    if args.commands < 1 or args.reboot_every < 0 or args.broadcast_every < 0:
        raise UserError("--commands must be >= 1, --reboot-every and --broadcast-every >= 0")
    regmap = args.regmap if args.regmap is not None else "thermal-controller"
    regmap_from(args)
    processes: dict[str, Any] = {}
    if args.c_devices or args.qemu_devices:
        from idemlink.commands.sim_cmd import checkout_file

        if args.c_devices:
            processes["c_binary"] = checkout_file(
                args.c_binary, "firmware_ref/build/posix/idemlink-device",
                "posix C device (make -C firmware_ref device)")
        if args.qemu_devices:
            sub = "qemu" if args.qemu_board == "mps2" else "qemu-microbit"
            processes.update(
                qemu_tool=checkout_file(None, "firmware_ref/tools/qemu-device",
                                         "QEMU device tool"),
                qemu_elf=checkout_file(args.qemu_elf,
                                        f"firmware_ref/build/bus/{sub}/idemlink-device.elf",
                                        "QEMU image with the bus (make -C firmware_ref "
                                        "qemu-device IDL_OPTS=-DIDL_BUS=1 BUILD=build/bus)"),
                qemu_board=args.qemu_board)
    try:
        cfg = BusCampaignConfig(
            c_devices=args.c_devices, qemu_devices=args.qemu_devices, **processes,
            devices=args.bus, commands=args.commands, loss=args.loss, dup=args.dup,
            corrupt=args.corrupt, reboot_every=args.reboot_every,
            broadcast_every=args.broadcast_every, dead=None if args.dead == 0 else args.dead,
            seed=args.seed, max_batch=max(1, args.batch), regmap=regmap,
            trigger_duration=args.trigger_duration if args.trigger_duration is not None
            else 0.05)
        if cfg.dead_address is not None and not 1 <= cfg.dead_address <= cfg.devices:
            raise UserError(f"--dead {args.dead}: no device at that address (1..{args.bus})")
    except LocalProtocolError as exc:
        raise UserError(str(exc)) from None
    bar = Progress("soak", "commands", enabled=not args.no_progress)
    stop, restore = _first_interrupt_stops()
    try:
        report = run_bus_campaign(cfg, lambda n: bar.update(bar.done + n, cfg.commands), stop,
                                  fail_fast=args.fail_fast)
    except (LinkConfigError, StationError) as exc:
        raise UserError(str(exc)) from None
    finally:
        restore()
        bar.close()
    status = EXIT_FOUND if not report.passed else EXIT_INTERRUPTED if report.interrupted else 0
    d = report.as_dict()
    if args.json:
        print_json("idemlink.soak/1", d)
        print(d["verdict"], file=sys.stderr)
        return status
    mixed = (f" ({cfg.python_devices} simulated, {cfg.c_devices} C, {cfg.qemu_devices} QEMU; "
             "real time)" if cfg.live else "")
    print(f"bus of {cfg.devices} devices{mixed}, {report.commands} commands (seed {cfg.seed}, loss "
          f"{cfg.loss}, dup {cfg.dup}, corrupt {cfg.corrupt} per device each way)")
    dead = (f"device {cfg.dead_address} dead from command {report.dead_stretch[0]} to "
            f"{report.dead_stretch[1]}" if report.dead_stretch else "no device dead")
    print(f"broadcasts {report.broadcasts} (verified " + ", ".join(
        f"{k} {v}" for k, v in sorted(report.broadcast_outcomes.items())) +
        f"; executions {report.broadcast_executions})  {dead}; breaker refused "
        f"{report.breaker_refused}")
    m = report.medium
    print(f"medium: {m['transmissions']} transmissions, {m['collisions']} collided; "
          f"{report.simulated_seconds:.1f} s {'on the clock' if cfg.live else 'simulated'} in "
          f"{report.wall_seconds:.1f} s")
    for a, r in report.devices.items():
        oc = r.outcomes
        print(f"  device {a}: {r.commands} commands, reboots {r.reboots}, " + "  ".join(
            f"{k} {oc.get(k, 0)}" for k in ("OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN"))
            + f"  -> {r.verdict().split(':')[0]}")
        for p in r.problems[:10]:
            print(f"PROBLEM device {a}: {p}")
    print(report.verdict())
    return status


def run(args: argparse.Namespace) -> int:
    if getattr(args, "bus", None) is not None:
        return _run_bus(args)
    return _run_point_to_point(args)


def _run_point_to_point(args: argparse.Namespace) -> int:
    from idemlink.campaign import run_campaign
    from idemlink.cli import UserError
    from idemlink.device_sim.link import LinkConfigError
    from idemlink.host.errors import IncompatibleDevice, NoDevice, PortError
    from idemlink.soak_device import DeviceCommandError, run_device_campaign

    cfg = _config(args)
    timeline: list[TimelinePoint] | None = None
    if args.plot is not None:
        from idemlink.soak_plot import PlotUnavailable, check_plot_path

        try:
            check_plot_path(args.plot)  # before the campaign: a bad path costs nothing
        except PlotUnavailable as exc:
            raise UserError(str(exc)) from None
        timeline = []
    bar = Progress("soak", "commands", enabled=not args.no_progress)

    def tick(n: int) -> None:
        bar.update(bar.done + n, cfg.commands)

    retry = args.retry_timeout
    if retry is not None and not (math.isfinite(retry) and 0.001 <= retry <= 60):
        raise UserError(f"--retry-timeout {retry} must be between 0.001 and 60 seconds")
    if retry is not None and not args.device_cmd:
        raise UserError("--retry-timeout is for --device-cmd (the in-process line runs on "
                        "simulated time)")
    stop, restore = _first_interrupt_stops()
    try:
        if args.device_cmd:
            report = run_device_campaign(cfg, args.device_cmd, tick, stop,
                                         fail_fast=args.fail_fast, timeline=timeline,
                                         retry_timeout=retry)
        else:
            report = run_campaign(cfg, tick, stop, fail_fast=args.fail_fast, timeline=timeline)
    except LinkConfigError as exc:  # a probability or rate out of range: the user's mistake
        raise UserError(str(exc)) from None
    except (NoDevice, IncompatibleDevice) as exc:  # e.g. --frame-loss 1.0: no handshake gets through
        raise UserError(f"the opening HELLO failed, no command was run: {exc}") from None
    except (DeviceCommandError, PortError) as exc:
        raise UserError(f"--device-cmd: {exc}") from None
    finally:
        restore()
        bar.close()
    if timeline is not None:
        _plot(args.plot, timeline, cfg, report)
    status = EXIT_FOUND if not report.passed else EXIT_INTERRUPTED if report.interrupted else 0
    _print(args, report, cfg, status)
    return status


def _print(args: argparse.Namespace, report: CampaignReport, cfg: CampaignConfig,
           status: int) -> None:
    d = report.as_dict()
    d["verdict"] = report.verdict()
    interrupted = (f"interrupted after {report.commands} of {cfg.commands} commands; "
                   + ("the oracle found nothing wrong so far" if report.passed
                      else "the oracle found problems"))
    if args.json:
        if report.interrupted:
            error_json(args, interrupted, status, commands_run=report.commands,
                       commands=cfg.commands, report=d)
        else:
            print_json("idemlink.soak/1", d)
        print(d["verdict"], file=sys.stderr)
    else:
        for line in _text(d, cfg):
            print(line)
    if report.interrupted:
        print(f"idemlink soak: {interrupted}", file=sys.stderr)


def _text(d: dict[str, Any], cfg: CampaignConfig) -> list[str]:
    oc = d["outcomes"]
    lines = [
        f"commands {d['commands']}{' (interrupted)' if d['interrupted'] else ''}  "
        f"(seed {cfg.seed}, loss {cfg.loss}, dup {cfg.dup}, corrupt {cfg.corrupt}, "
        f"reboots {d['reboots']}, host restarts {d['host_restarts']})",
        "outcomes  " + "  ".join(f"{k} {oc.get(k, 0)}" for k in
                                 ("OK", "NOT_EXECUTED", "REJECTED", "UNKNOWN")),
        f"executions {d['executions']} (late {d['late_executions']}, read-backs "
        f"{d['reconcile_reads']})  retries {d['retries']}  replays {d['replays']}  "
        f"set-only re-issued {d['reissued_set_only']}",
        f"unknown reconciled {d['unknown_reconciled']}  unresolved {d['unknown_unresolved']}  "
        f"dead host's requests reconciled {d['dead_reconciled']}",
        f"outages {d['outages']} (with an effect: ran, every answer lost {d['ran_unanswered']}; "
        f"never delivered {d['never_delivered']})  late answers "
        + (", ".join(f"{k} {v}" for k, v in sorted(d["late_answers"].items())) or "0"),
        f"fault conditions set {d['conditions_set']}  faults latched {d['faults_latched']}  "
        f"cleared {d['faults_cleared']}  clears while the condition held "
        f"{d['clears_while_held']}",
        *([f"authenticated: attacks {sum(d['attacks_sent'].values())} sent ("
           + ", ".join(f"{k} {v}" for k, v in sorted(d["attacks_sent"].items()))
           + f"), {sum(d['attacks_delivered'].values())} delivered, "
           f"{d['attacks_executed']} executed; device refused: "
           + ", ".join(f"{k} {v}" for k, v in sorted(d["refused"].items()))]
          if cfg.authenticated or cfg.adversary else []),
        f"duplicated effects {d['duplicated_effects']}  lost acknowledged writes "
        f"{d['lost_acknowledged_writes']}  misclassified {d['misclassified']}  "
        f"register semantics {d['register_semantics']}",
        f"{d['commands_per_second']} commands/s wall, {d['simulated_seconds']:.1f} s on the "
        "device's clock",
    ]
    lines += [f"PROBLEM {p}" for p in d["problems"]]
    lines.append(d["verdict"])
    return lines


def _plot(path: str, timeline: list[TimelinePoint], cfg: CampaignConfig,
          report: CampaignReport) -> None:
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
