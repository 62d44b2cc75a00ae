"""``idemlink demo``: the simulator on a pseudo-terminal behind a lossy line, a scripted session,
and a summary proving every retry was absorbed with zero duplicated effects.

The device runs in a background thread on the master side of a pty, behind the link emulator
(real-time pacing at 115200 baud, latency, frame loss, duplication and corruption both ways); the
host opens the pty's path with ``idemlink.host.device.Device.open`` exactly as it would open hardware.
Finishes in seconds and leaves no thread, process or pty behind. ``--json`` prints one
``idemlink.demo/1`` object instead of the text: ``{"summary": {...}, "steps": [{"label",
"outcome", "status", "attempts"}], "exit"}``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from idemlink.cli import add_frame_fault_options
from idemlink.device_sim.device import SimulatedDevice
from idemlink.device_sim.link import Link, LinkConfig
from idemlink.device_sim.lossy_transport import LossyTransport
from idemlink.device_sim.pty import open_pty
from idemlink.device_sim.serve import LockedDevice, serve
from idemlink.host.command import Result
from idemlink.host.device import Device
from idemlink.output import add_json_option, print_json
from idemlink.protocol.outcome import Outcome


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run a scripted session against the simulator behind a lossy line")
    add_frame_fault_options(p, loss=0.1, dup=0.05, corrupt=0.03)
    p.add_argument("--seed", type=int, default=3, help="seed of the line's faults (default 3)")
    p.add_argument("--burst", type=int, default=150, help="pipelined commands in the burst step")
    add_json_option(p, "idemlink.demo/1")
    p.set_defaults(handler=run)


def _duplicated_effects(sim: SimulatedDevice) -> int:
    per_key = Counter((e.epoch, e.seq) for e in sim.executions)
    return sum(n - 1 for n in per_key.values() if n > 1)


def run(args: argparse.Namespace) -> int:
    text = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="idemlink-demo-") as flash, \
            contextlib.redirect_stdout(text) if args.json else contextlib.nullcontext():
        status, summary, rows = _run(args, Path(flash))
    if args.json:
        print_json("idemlink.demo/1", {
            "summary": summary, "exit": status,
            "steps": [{"label": label, "outcome": r.outcome.name,
                       "status": r.status.name if r.status is not None else None,
                       "attempts": r.attempts} for label, r in rows]})
    return status


def _run(args: argparse.Namespace,
         flash: Path) -> tuple[int, dict[str, int | float], list[tuple[str, Result]]]:
    sim = SimulatedDevice(seed=args.seed, trigger_duration=0.3, flash_dir=flash / "device")
    shared = LockedDevice(sim)
    cfg = LinkConfig(baud=115200, latency=0.001, frame_loss=args.loss, frame_dup=args.dup,
                     frame_corrupt=args.corrupt, seed=args.seed)
    back = LinkConfig(baud=115200, latency=0.001, frame_loss=args.loss, frame_dup=args.dup,
                      frame_corrupt=args.corrupt, seed=args.seed + 1)
    pair = open_pty()
    stop = threading.Event()
    transport = LossyTransport(pair.transport(), Link(cfg, back))
    thread = threading.Thread(target=serve, args=(shared, transport, stop), daemon=True)
    thread.start()
    rows: list[tuple[str, Result]] = []
    t0 = time.monotonic()
    try:
        print(f"simulated device on {pair.slave_path}, behind a line with {args.loss:.0%} loss, "
              f"{args.dup:.0%} duplication, {args.corrupt:.0%} corruption each way")
        with Device.open(pair.slave_path, timeout=0.05, attempts=10) as dev:

            def step(label: str, res: Result) -> Result:
                rows.append((label, res))
                extra = f" code=0x{res.code:04X}" if res.code is not None else ""
                vals = f" values={list(res.values)}" if res.values else ""
                print(f"  {label:<46} {res.describe():<48} attempts={res.attempts}{extra}{vals}")
                return res

            step("write threshold=400", dev.write({"threshold": 400}))
            step("write threshold,mode,fan_setpoint (atomic)",
                 dev.write({"threshold": 420, "mode": 2, "fan_setpoint": 70}))
            gen = step("read generation", dev.read("generation")).values[0]
            step("another client sets mode=1", dev.write({"mode": 1}))
            step(f"conditional write if generation=={gen} (stale)",
                 dev.write_if_generation(gen, {"fan_setpoint": 90}))
            step("trigger self_clean", dev.trigger())
            step("trigger self_clean again (running)", dev.trigger())
            with shared.lock:
                sim.core.set_input("temperature", 500, time.monotonic())
            step("read faults (over-temperature latched)", dev.read("faults"))
            step("clear over_temperature while still hot", dev.clear_faults(1))
            step("read faults (re-latched: condition persists)", dev.read("faults"))
            with shared.lock:
                sim.core.set_input("temperature", 250, time.monotonic())
            step("clear over_temperature after cooling", dev.clear_faults(1))
            step("read faults", dev.read("faults"))
            step("write threshold=5000 (out of range)", dev.write({"threshold": 5000}))
            with shared.lock:
                sim.reboot(time.monotonic())
            step("device rebooted; write threshold=380", dev.write({"threshold": 380}))
            burst = [dev.write_command({"fan_setpoint": i % 100}) if i % 2
                     else dev.read_command("temperature", 9) for i in range(args.burst)]
            results = dev.run(burst)
            print(f"  {'pipelined burst of ' + str(args.burst) + ' reads/writes':<46} "
                  f"{sum(r.ok for r in results)} OK")
            rows += [("burst", r) for r in results]
            # The line now carries YMODEM, whose frames the emulator cannot see: faults are
            # drawn per byte while the file crosses it.
            payload = flash / "settings.bin"
            payload.write_bytes(random.Random(args.seed).randbytes(3000))
            byte_faults = LinkConfig(baud=115200, latency=0.001, loss=0.00005, corrupt=0.0003,
                                     seed=args.seed)
            transport.link.a_to_b.reconfigure(byte_faults)
            transport.link.b_to_a.reconfigure(byte_faults)
            res, report = dev.send_files([str(payload)])
            transport.link.a_to_b.reconfigure(cfg)
            transport.link.b_to_a.reconfigure(back)
            arrived = sim.files_dir / payload.name
            same = arrived.is_file() and arrived.read_bytes() == payload.read_bytes()
            print(f"  {'send settings.bin (3000 bytes) by YMODEM':<46} "
                  f"{'complete, identical on the device' if report and report.ok and same else 'FAILED'}"
                  f" in {report.seconds if report else 0:.1f} s")
            rows.append(("file hand-over", res))
            step("read threshold (framed again)", dev.read("threshold"))
            stats = dev.session.counters
    finally:
        stop.set()
        thread.join(timeout=5)
        pair.close()
    outcomes = Counter(r.outcome.name for _, r in rows)
    dups = _duplicated_effects(sim)
    fault_keys = ("bytes_lost", "bytes_duplicated", "bytes_corrupted", "frames_lost",
                  "frames_duplicated", "frames_corrupted", "frames_reordered", "noise_bursts")
    faults = sum(d.get(k, 0) for d in transport.link.stats().values() if isinstance(d, dict)
                 for k in fault_keys)
    print()
    print("summary")
    table = [
        ("commands", "commands", len(rows)),
        ("frames_sent", "frames sent by the host", stats.sent),
        ("retries", "retries (same sequence number)", stats.retries),
        ("replays", "answers replayed by the device", stats.replays),
        ("reissued_set_only", "set-only writes re-issued after reboot", stats.reissued),
        ("faults_injected", "faults injected by the line", faults),
        *[(f"outcome_{o.name}", f"outcome {o.name}", outcomes.get(o.name, 0)) for o in Outcome],
        ("duplicated_effects", "duplicated effects", dups),
        ("seconds", "seconds", round(time.monotonic() - t0, 1)),
    ]
    width = max(len(label) for _, label, _ in table)
    for _, label, v in table:
        print(f"  {label:<{width}}  {v}")
    files_ok = same and report is not None and report.ok
    status = 0 if dups == 0 and outcomes.get("UNKNOWN", 0) == 0 and files_ok else 5
    return status, {key: v for key, _, v in table}, rows
