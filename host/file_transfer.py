"""A file batch through the device: the rules around the YMODEM hand-over, free of any port.

Before a batch: the names are checked (``prepare_batch``: YMODEM's rules and the read-back's
length limit, before the device is switched), the local size and CRC-32C of each file taken
(``idemlink.protocol.regular_file.file_digest``, as the device computes it), and the device
asked what it already holds (``already_there_steps``, FILE_INFO): an identical file is not sent
again, a different one without ``overwrite`` is refused. After it:
``batch_done`` forgets YMODEM's bytes (and a completed batch settles an UNKNOWN hand-over), then
every file YMODEM reported ok or unconfirmed is read back (``to_verify``) and judged against the
local digest (``judge_files``; ``not_verified`` when the read-back itself was lost).

The drivers (``Device.send_files``, ``AsyncDevice.send_files``) run these steps around the
YMODEM batch itself (``idemlink.host.ymodem_io.send_files``), each in its own way of doing I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from idemlink.host.command import Command, CommandKind, Result
from idemlink.host.operations import Operations, Steps
from idemlink.protocol.modbus import MAX_FILE_INFO_NAME, FileInfoStatus
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.regular_file import file_digest

if TYPE_CHECKING:
    from idemlink.protocol.ymodem_files import FileResult, TransferReport


@dataclass(frozen=True, slots=True)
class Batch:
    """A checked batch: the paths, their local (size, CRC-32C) by name, the hand-over command."""

    paths: list[str]
    digests: dict[str, tuple[int, int]]
    handover: Command


def prepare_batch(paths: Iterable[str], overwrite: bool) -> Batch:
    """Check a batch's names, take the local digests, build the hand-over command (nothing
    is sent: a bad name raises ``ValueError`` first)."""
    from idemlink.host.ymodem_io import check_batch_names

    paths = list(paths)
    check_batch_names(paths)  # before the device is switched: it would wait for a sender
    for p in paths:  # every name must fit the read-back's request, or it could not be verified
        if len(Path(p).name.encode("utf-8", "surrogateescape")) > MAX_FILE_INFO_NAME:
            raise ValueError(f"file name {Path(p).name!r} is longer than the "
                             f"{MAX_FILE_INFO_NAME} bytes a read-back (FILE_INFO) can ask for")
    digests = {Path(p).name: file_digest(p) for p in paths}
    return Batch(paths, digests, Command(CommandKind.FILE_RECEIVE, 0,
                                         values=(1,) if overwrite else ()))


def already_there_steps(ops: Operations, batch: Batch, overwrite: bool
                        ) -> Steps[tuple[list[FileResult], Result]]:
    """Ask the device (FILE_INFO, read-only) what it holds under each name before sending:
    the same size and CRC-32C -> that file is not sent again (``identical``); different bytes
    without ``overwrite`` -> ``ValueError`` naming the file and ``--overwrite`` before anything
    is switched. A question that got no answer decides nothing: the file is sent."""
    from idemlink.protocol.ymodem_files import FileResult

    cmds = [Command(CommandKind.FILE_INFO, 0, name=Path(p).name) for p in batch.paths]
    answers = yield from ops.wave_steps(cmds)
    identical: list[FileResult] = []
    for p, r in zip(batch.paths, answers, strict=True):
        name = Path(p).name
        info = r.file
        if info is None or info.status is not FileInfoStatus.PRESENT:
            continue
        size, crc = batch.digests[name]
        if (info.size, info.crc32c) == (size, crc):
            identical.append(FileResult(name, size, ok=True, seconds=0.0, verified=True,
                                        identical=True,
                                        detail="already on the device, identical"))
        elif not overwrite:
            raise ValueError(
                f"{name}: the device already has a different {name} ({info.size} bytes, "
                f"CRC-32C {info.crc32c:08x}; this one: {size} bytes, CRC-32C {crc:08x}); "
                "send with --overwrite to replace it")
    return identical, answers[-1]


def still_to_send(batch: Batch, identical: list[FileResult]) -> list[str]:
    """The paths of the batch the device does not already hold byte for byte."""
    there = {f.name for f in identical}
    return [p for p in batch.paths if Path(p).name not in there]


def batch_done(ops: Operations, handover: Result, report: TransferReport) -> None:
    """Back in framed mode after a batch: forget YMODEM's bytes; a completed batch proves an
    UNKNOWN hand-over did happen."""
    ops.session.resync()
    if handover.outcome is Outcome.UNKNOWN and report.ok and ops.unknown is handover:
        ops.unknown = None  # the receiver answered: the hand-over did happen


def to_verify(files: list[FileResult], digests: Mapping[str, tuple[int, int]]) -> list[FileResult]:
    """The files of a batch to read back: those YMODEM reported ok or unconfirmed."""
    return [f for f in files if (f.ok or f.unconfirmed) and f.name in digests]


def read_back_commands(files: list[FileResult]) -> list[Command]:
    """The FILE_INFO read-back of ``files`` (one wave: reads commute)."""
    return [Command(CommandKind.FILE_INFO, 0, name=f.name) for f in files]


def not_verified(todo: list[FileResult], exc: BaseException) -> None:
    """The read-back was lost (``exc``): each file keeps YMODEM's verdict, marked not verified."""
    for f in todo:
        f.verified = None
        f.detail = _join(f.detail, f"not verified: {exc}")


def judge_files(todo: list[FileResult], back: list[Result],
                digests: Mapping[str, tuple[int, int]]) -> None:
    """Settle each file's verdict from its FILE_INFO read-back."""
    for f, r in zip(todo, back, strict=True):
        size, crc = digests[f.name]
        info = r.file
        if info is None:
            f.verified = None
            f.detail = _join(f.detail, f"not verified: read-back {r.describe()}")
        elif info.status is FileInfoStatus.ABSENT:
            f.ok, f.verified = False, False
            f.detail = ("the device does not have it (read back after the batch: absent)"
                        + (", though YMODEM reported it ok" if not f.unconfirmed else ""))
        elif (info.size, info.crc32c) != (size, crc):
            f.ok, f.verified = False, False
            f.detail = (f"the device holds different bytes: {info.size} bytes, CRC-32C "
                        f"{info.crc32c:08x}; sent {size} bytes, CRC-32C {crc:08x}")
        else:
            was_unconfirmed = not f.ok
            f.ok, f.verified = True, True
            f.detail = ("YMODEM could not confirm it; the read-back did"
                        if was_unconfirmed else "")


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


__all__ = ["Batch", "already_there_steps", "batch_done", "judge_files", "not_verified",
           "prepare_batch", "read_back_commands", "still_to_send", "to_verify"]
