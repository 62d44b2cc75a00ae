"""Host-side cost of authentication (issue 23), in µs per frame on this machine.

    python3 bench/bench_auth.py [--n 20000]

Measured with ``time.perf_counter`` over ``--n`` frames each (best of 5 runs): encoding a REQUEST
(a 5-byte PDU, the shape of a one-register write) with and without the 8-byte MAC, decoding a
RESPONSE with and without verification (the device's decoder ``MacCheck`` path; the host's
re-signing check ``auth.verify_frame``), and one session-key derivation (once per HELLO).
The difference between the keyed and unkeyed rows is what authentication adds per frame.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from idemlink.protocol.auth import verify_frame
from idemlink.protocol.frame import (
    Direction,
    Frame,
    FrameType,
    MacCheck,
    MacKey,
    decode_frames,
    derive_session_key,
    encode_frame,
)

KEY = MacKey(bytes(range(32)))
PDU = b"\x06\x00\x01\x01\x2c"


def best(fn: Callable[[], object], n: int) -> float:
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return min(runs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    n = ap.parse_args(argv).n
    plain = encode_frame(FrameType.RESPONSE, 7, 0x1234, b"\x00" + PDU)
    signed = encode_frame(FrameType.RESPONSE, 7, 0x1234, b"\x00" + PDU, key=KEY,
                          direction=Direction.DEVICE_TO_HOST)
    check = MacCheck(KEY, Direction.DEVICE_TO_HOST)
    (frame,) = decode_frames(signed)
    assert isinstance(frame, Frame)
    rows = [
        ("encode REQUEST, unkeyed", best(lambda: encode_frame(FrameType.REQUEST, 7, 0x1234, PDU), n)),
        ("encode REQUEST, 8-byte MAC", best(lambda: encode_frame(
            FrameType.REQUEST, 7, 0x1234, PDU, key=KEY, direction=Direction.HOST_TO_DEVICE), n)),
        ("decode RESPONSE, unkeyed", best(lambda: decode_frames(plain), n)),
        ("decode RESPONSE, MAC verified in the decoder", best(lambda: decode_frames(signed, check),
                                                              n)),
        ("host check of a decoded RESPONSE (verify_frame)",
         best(lambda: verify_frame(frame, KEY, Direction.DEVICE_TO_HOST), n)),
        ("session key derivation (once per HELLO)", best(lambda: derive_session_key(
            KEY.key, b"h" * 16, b"d" * 16, b"sim-0123456789abcdef", None), n)),
    ]
    print("| operation | µs per frame |\n|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
