"""A file batch through the device: the rules around the YMODEM hand-over, free of any port.

``send_files_steps`` is the whole sequence as one operation (``idemlink.host.operations.Steps``),
the one place it is written; every driver's ``send_files`` runs it with its request loop:

1. Refused before anything is sent: a handle blocked by an UNKNOWN (``UnknownOutstanding``), a
   session that cannot carry the hand-over (a plain Modbus RTU slave), a driver that cannot lend
   its port to YMODEM (``LocalProtocolError``), a bad name (``prepare_batch``:
   YMODEM's rules and the read-back's length limit, ``ValueError``).
2. The local size and CRC-32C of each file (``idemlink.protocol.regular_file.file_digest``, as
   the device computes it; a ``Job``: off the event loop in the asyncio drivers), and the device
   asked what it already holds (``already_there_steps``, FILE_INFO): an identical file is not
   sent again, a different one without ``overwrite`` is refused.
3. The hand-over (FILE_RECEIVE); unless it is OK or UNKNOWN the batch stops there. An UNKNOWN
   hand-over is attempted anyway: a device that did switch answers the sender's header.
4. The YMODEM batch on the driver's own port (``idemlink.host.ymodem_io.send_files``, a ``Job``
   with the port lent to it); then ``batch_done`` forgets YMODEM's bytes (and a completed batch
   settles an UNKNOWN hand-over).
5. Every file YMODEM reported ok or unconfirmed is read back (``to_verify``, one wave, allowed
   while the handle is blocked) and judged against the local digest (``judge_files``;
   ``not_verified`` when the read-back itself was lost to a failing port).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemlink.host.command import Command, CommandKind, Result
from idemlink.host.errors import LinkLost
from idemlink.host.operations import Operations, Steps, job_steps
from idemlink.protocol.host_session import HostSession
from idemlink.protocol.modbus import MAX_FILE_INFO_NAME, FileInfoStatus
from idemlink.protocol.outcome import LocalProtocolError, ModbusException, Outcome
from idemlink.protocol.regular_file import file_digest

if TYPE_CHECKING:
    from idemlink.protocol.ymodem_files import FileResult, ProgressCallback, TransferReport
    from idemlink.protocol.ymodem_sender import SenderConfig


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


def send_files_steps(ops: Operations[Any], paths: Iterable[str], *, lends_port: bool,
                     progress: ProgressCallback | None = None, config: SenderConfig | None = None,
                     overwrite: bool = False) -> Steps[tuple[Result, TransferReport | None]]:
    """The whole file batch as one operation (the module docstring's five steps): the hand-over's
    Result and the batch's report (None when the device did not switch). ``lends_port``: the
    driver can lend its pyserial port to YMODEM."""
    from idemlink.host.ymodem_io import send_files
    from idemlink.protocol.ymodem_files import TransferReport

    ops.refuse_if_blocked()
    ops.refuse_unsupported(Command(CommandKind.FILE_RECEIVE, 0))  # a plain slave has no hand-over
    if not lends_port:
        raise LocalProtocolError("file transfer needs a serial transport")
    batch = yield from job_steps(lambda _: prepare_batch(paths, overwrite))
    identical, asked = yield from already_there_steps(ops, batch, overwrite)
    todo = still_to_send(batch, identical)
    if not todo:  # every file is on the device byte for byte: nothing to hand over
        return asked, TransferReport(files=identical, ok=True)
    (res,) = yield from ops.run_steps([batch.handover])
    if res.outcome not in (Outcome.OK, Outcome.UNKNOWN):
        if res.exception is ModbusException.ILLEGAL_FUNCTION and not res.detail:
            res = replace(res, detail="the device does not serve file transfer (FILE_RECEIVE; "
                                      "a C device built with IDL_FILE_RECEIVE=0)")
        return res, None
    report = yield from job_steps(lambda port: send_files(port, todo, config, progress=progress),
                                  on_port=True)
    batch_done(ops, res, report)
    check = to_verify(report.files, batch.digests)
    if check:  # read back (allowed while the handle is blocked, like reconcile)
        try:
            back = yield from ops.wave_steps(read_back_commands(check))
        except LinkLost as exc:
            not_verified(check, exc)
        else:
            judge_files(check, back, batch.digests)
    report.files[:0] = identical
    return res, report


def already_there_steps(ops: Operations[Any], batch: Batch, overwrite: bool
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


def batch_done(ops: Operations[Any], handover: Result, report: TransferReport) -> None:
    """Back in framed mode after a batch: forget YMODEM's bytes; a completed batch proves an
    UNKNOWN hand-over did happen."""
    if isinstance(ops.session, HostSession):  # the only session a hand-over reaches
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


__all__ = ["Batch", "already_there_steps", "batch_done", "judge_files",
           "not_verified", "prepare_batch", "read_back_commands", "send_files_steps",
           "still_to_send", "to_verify"]
