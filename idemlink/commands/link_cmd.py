"""``idemlink link``: run the link emulator between two ports or pseudo-terminals, in real time.

Each of ``--a``/``--b`` is a pty or device path or a pyserial URL; a side left out gets a new
pseudo-terminal. The paths of both sides are printed first, one per line (a, then b), so a script
can connect its programs; then the proxy serves until SIGINT or SIGTERM, exits 0 and leaves no pty
behind. ``--stats`` prints the fault counters as JSON on stderr at exit. ``--json``: the first
line is ``{"schema": "idemlink.link/1", "a", "b"}`` instead of the two paths, and the counters
are one ``idemlink.link-stats/1`` object on stdout at exit. An existing side is opened with
``--bytesize``/``--parity``/``--stopbits`` (default 8N1; a pty takes none but the stop bits:
``idemlink.host.transport.opened_format``); the emulated pacing counts 10 bits per byte.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from idemlink.cli import (
    UserError,
    add_baudrate_option,
    add_char_format_options,
    add_hidden_alias,
    add_regmap_option,
    regmap_from,
)
from idemlink.output import add_json_option, print_json
from idemlink.protocol.registers import RegisterMap

DESCRIPTION = """\
Run the link emulator between two ports or pseudo-terminals, in real time.

Each of --a/--b is a pty or device path or a pyserial URL; a side left out gets a new
pseudo-terminal. The paths of both sides are printed first, one per line (a, then b), so a script
can connect its programs; then the proxy serves until SIGINT or SIGTERM, exits 0 and leaves no pty
behind. --stats prints the fault counters as JSON on stderr at exit; with --json the paths and
the counters are JSON objects on stdout (docs/CLI.md).

Fault probabilities name their unit: --byte-loss/--byte-dup/--byte-corrupt apply to each byte
(as the faulty:// URL's loss/dup/corrupt), --frame-loss/--frame-dup/--frame-corrupt to each
0x00-delimited frame (as soak's and demo's options and the URL's frame_loss...).
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "link",
        help="emulate a paced, lossy serial line between two ports or new ptys",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--a", metavar="PATH|URL", help="side a (default: create a pty)")
    p.add_argument("--b", metavar="PATH|URL", help="side b (default: create a pty)")
    add_baudrate_option(p, default=None, text="line rate, 10 bits/byte (default: unpaced)")
    add_char_format_options(p, default=True)
    p.add_argument("--latency-ms", type=float, default=0.0, help="one-way latency in ms")
    p.add_argument("--byte-loss", dest="loss", type=float, default=0.0, metavar="P",
                   help="probability that a byte is lost, per byte (default 0)")
    p.add_argument("--byte-dup", dest="dup", type=float, default=0.0, metavar="P",
                   help="probability that a byte is duplicated, per byte (default 0)")
    p.add_argument("--byte-corrupt", dest="corrupt", type=float, default=0.0, metavar="P",
                   help="probability that a byte gets a bit flip, per byte (default 0)")
    for old in ("loss", "dup", "corrupt"):  # the spelling before the unit was named
        add_hidden_alias(p, f"--{old}", old, float)
    p.add_argument("--frame-loss", type=float, default=0.0, metavar="P",
                   help="probability that a frame (0x00-delimited) is lost, per frame (default 0)")
    p.add_argument("--frame-dup", type=float, default=0.0, metavar="P",
                   help="probability that a frame is duplicated, per frame (default 0)")
    p.add_argument("--frame-corrupt", type=float, default=0.0, metavar="P",
                   help="probability that a frame gets a bit flip, per frame (default 0)")
    p.add_argument("--reorder", type=float, default=0.0, help="per-frame swap with the next")
    p.add_argument("--frame-gap-ms", type=float, default=None,
                   help="silence that also ends a frame (for traffic without 0x00 delimiters)")
    p.add_argument("--noise-rate", type=float, default=0.0, help="noise bursts per second")
    p.add_argument("--adversary", type=float, default=0.0, metavar="P",
                   help="an attacker in the line: per host REQUEST, the probability of one "
                        "forged, replayed, reflected, stripped, truncated or flipped frame "
                        "(docs/SECURITY.md)")
    p.add_argument("--seed", type=int, default=0, help="seed of every fault (default 0)")
    p.add_argument("--stats", action="store_true",
                   help="print fault counters (JSON) on stderr at exit (stdout with --json)")
    add_json_option(p, "idemlink.link/1 then idemlink.link-stats/1")
    add_regmap_option(p)
    p.add_argument("--monitor", action="store_true",
                   help="decode and print the idemlink frames crossing the line, both ways")
    p.set_defaults(handler=run)


def _monitor_tap(regmap: RegisterMap, as_json: bool = False) -> Callable[[str, bytes, float], None]:
    """A spy on the line: one frame decoder per direction, one describer (so an answer is shown
    with the registers its request named). With ``--json`` each frame is an ``idemlink.monitor/1``
    object with its direction (``dir``), so stdout carries JSON objects only."""
    from idemlink.host.frame_view import FrameDescriber
    from idemlink.output import print_json
    from idemlink.protocol.frame import FrameDecoder

    decoders = {"a->b": FrameDecoder(), "b->a": FrameDecoder()}
    describer = FrameDescriber(regmap)

    def tap(direction: str, data: bytes, t: float) -> None:
        decoder = decoders[direction]
        decoder.receive_data(data)
        for item in iter(decoder.next_event, None):
            described = describer.describe(item)
            if as_json:
                print_json("idemlink.monitor/1", {"t": round(t, 3), "dir": direction, **described})
            else:
                print(f"+{t:9.3f}s {direction} {described['text']}", flush=True)

    return tap


def _port_options(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """The character format an existing side is opened with (a pty's: 8N, the stop bits)."""
    from idemlink.host.transport import opened_format
    from idemlink.protocol.char_format import CharFormat

    fmt = opened_format(spec, CharFormat(args.bytesize, args.parity, args.stopbits))
    return {"bytesize": fmt.bytesize, "parity": fmt.parity, "stopbits": fmt.stopbits}


def run(args: argparse.Namespace) -> int:
    from idemlink.device_sim.link import LinkConfig, LinkConfigError
    from idemlink.device_sim.link_proxy import LinkProxy

    try:
        config = LinkConfig(
            baud=args.baudrate,
            latency=args.latency_ms / 1000.0,
            loss=args.loss,
            dup=args.dup,
            corrupt=args.corrupt,
            frame_loss=args.frame_loss,
            frame_dup=args.frame_dup,
            frame_corrupt=args.frame_corrupt,
            reorder=args.reorder,
            frame_gap=None if args.frame_gap_ms is None else args.frame_gap_ms / 1000.0,
            noise_rate=args.noise_rate,
            adversary=getattr(args, "adversary", 0.0),
            seed=args.seed,
        )
    except LinkConfigError as exc:
        raise UserError(str(exc)) from None
    regmap = regmap_from(args)  # a bad --regmap is refused even without --monitor
    tap = _monitor_tap(regmap, bool(getattr(args, "json", False))) if args.monitor else None
    try:
        proxy = LinkProxy(args.a, args.b, config, tap=tap,
                          port_options=lambda spec: _port_options(spec, args))
    except (OSError, ValueError) as exc:  # serial.SerialException is an OSError
        raise UserError(f"cannot open a side: {exc}") from None
    with proxy:

        def on_signal(signum: int, frame: FrameType | None) -> None:
            proxy.stop()

        # before the paths are printed: a script may signal as soon as it has read them
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if args.json:
                print_json("idemlink.link/1", {"a": proxy.a_path, "b": proxy.b_path})
            else:
                print(proxy.a_path, flush=True)
                print(proxy.b_path, flush=True)
            proxy.serve()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if args.json:
        print_json("idemlink.link-stats/1", proxy.link.stats())
    elif args.stats:
        print(json.dumps(proxy.link.stats(), sort_keys=True), file=sys.stderr)
    return 0
