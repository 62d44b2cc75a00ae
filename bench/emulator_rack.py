"""Many links of the link emulator in one process (``LinkProxy`` threads), for the many-device
benchmark: one ``idemlink link`` process per device would need more cores than the bench machine
has. Each proxy waits in ``select`` and wakes at most every ``--quantum-ms`` while bytes fly.

Usage: ``python3 bench/emulator_rack.py [--baud 115200] [--latency-ms L] [--quantum-ms Q] TARGET...``
prints one host-side pty path per TARGET, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import threading

from idemlink.device_sim.link import LinkConfig
from idemlink.device_sim.link_proxy import LinkProxy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--baud", type=int, default=115200)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--quantum-ms", type=float, default=0.2)
    args = ap.parse_args()
    cfg = LinkConfig(baud=args.baud, latency=args.latency_ms / 1000)
    proxies = [LinkProxy(None, t, cfg, quantum=args.quantum_ms / 1000).start()
               for t in args.targets]
    for p in proxies:
        print(p.a_path, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    for p in proxies:
        p.close()


if __name__ == "__main__":
    main()
