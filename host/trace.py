"""``--trace FILE``: every frame the host sends or receives, decoded, as JSON lines.

``TracingTransport(inner, path, regmap)`` wraps any transport of the driver. Each frame that
crosses it (both directions, each with its own streaming decoder) is written as one line
``{"schema": "idemlink.trace/1", "time", "dir": "tx"|"rx", "type", "epoch", "seq", "flags",
"text", ...}`` with what ``FrameDescriber`` decoded (function, status, registers with raw and
shown values, trigger code, the device's identity in a HELLO reply). Undecodable bytes appear as
``{"type": "ERROR", ...}`` lines. The file is appended to and flushed per line, so a trace
survives a crash of the host up to its last frame. Tracing never changes what is sent.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from idemlink.host.frame_view import FrameDescriber
from idemlink.protocol.frame import FrameDecoder
from idemlink.protocol.registers import RegisterMap


class TracingTransport:
    """A transport that writes every decoded frame to a JSON-lines file (see the module doc)."""

    def __init__(self, inner: Any, path: str | os.PathLike[str], regmap: RegisterMap) -> None:
        self.inner = inner
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()
        self._decoders = {"tx": FrameDecoder(), "rx": FrameDecoder()}
        self._describer = FrameDescriber(regmap)

    def __getattr__(self, name: str) -> Any:  # ``port`` and the like, for file transfer
        return getattr(self.inner, name)

    def write(self, data: bytes) -> None:
        self._log("tx", data)
        self.inner.write(data)

    def read(self, timeout: float) -> bytes:
        data: bytes = self.inner.read(timeout)
        if data:
            self._log("rx", data)
        return data

    def now(self) -> float:
        now: float = self.inner.now()
        return now

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._file.close()

    def _log(self, direction: str, data: bytes) -> None:
        self._decoders[direction].receive_data(data)
        for item in iter(self._decoders[direction].next_event, None):
            record = {"schema": "idemlink.trace/1", "time": round(time.time(), 6),
                      "dir": direction, **self._describer.describe(item)}
            self._file.write(json.dumps(record, sort_keys=True) + "\n")
