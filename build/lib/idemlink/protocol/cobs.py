"""Consistent Overhead Byte Stuffing (COBS), the frame delimiting of idemlink.

Contract:

- ``encode(data)`` returns bytes containing no 0x00; the overhead is at most
  ``1 + len(data) // 254`` bytes (``max_encoded_len``).
- ``decode(enc)`` inverts ``encode`` and returns ``None`` (never raises) for any input that no
  ``encode`` call could have produced (a zero byte inside, a code that runs past the end).

On the wire every frame is sent as ``00 <cobs(frame)> 00``: the leading delimiter terminates any
garbage that arrived before the frame, so garbage costs only itself and a damaged frame costs only
itself (see docs/PROTOCOL.md, "Resynchronisation").
"""

from __future__ import annotations

_MAX_RUN = 254


def max_encoded_len(n: int) -> int:
    """Upper bound of ``len(encode(x))`` for ``len(x) == n``."""
    return n + 1 + n // _MAX_RUN


def encode(data: bytes) -> bytes:
    """COBS-encode ``data`` (no trailing delimiter)."""
    out = bytearray()
    for chunk in data.split(b"\x00"):
        while len(chunk) >= _MAX_RUN:
            out.append(0xFF)
            out += chunk[:_MAX_RUN]
            chunk = chunk[_MAX_RUN:]
        out.append(len(chunk) + 1)
        out += chunk
    return bytes(out)


def decode(enc: bytes | bytearray | memoryview) -> bytes | None:
    """COBS-decode one delimiter-free block; ``None`` if it is not valid COBS."""
    out = bytearray()
    i = 0
    n = len(enc)
    while i < n:
        code = enc[i]
        j = i + code
        if code == 0 or j > n:
            return None
        block = enc[i + 1 : j]
        if 0 in block:
            return None
        out += block
        i = j
        if code != 0xFF and i < n:
            out.append(0)
    return bytes(out)


def decode_segment(enc: bytes) -> bytes | None:
    """``decode`` for a block already split on 0x00 (so it holds no zero): the decoder's hot path.

    Runs shorter than 254 bytes (every small frame) are joined with the implied zeros in one call.
    """
    n = len(enc)
    parts = []
    i = 0
    while i < n:
        code = enc[i]
        j = i + code
        if code == 0xFF or j > n:
            return None if j > n else decode(enc)
        parts.append(enc[i + 1 : j])
        i = j
    return b"\x00".join(parts)
