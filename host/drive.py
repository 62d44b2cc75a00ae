"""The request loop every driver runs an operation with: one loop, spelled blocking and awaited.

An operation (``idemlink.host.operations.Steps``) asks for I/O rounds and jobs; ``rounds`` runs
it on a blocking ``Transport`` (``Device``, ``RtuDevice``), ``drive_async`` on an
``AsyncTransport`` (``AsyncDevice``, ``AsyncRtuDevice``). The two are the same lines but for
``await`` (and ``between()`` where the blocking one yields to hand a ``stream`` its results):
``tests/test_drive.py`` compares them line for line, so a change to one that is not made to the
other fails there. They move bytes and nothing else:

- an I/O round: write the bytes the operation gives, read for as long as it says, send it what
  came;
- a ``Job``: ``run_job(job)`` (the driver's: it lends its port, or a worker thread), then the
  operation is sent ``b""``; what the job raised is raised inside the operation;
- a transport that fails (``TRANSPORT_ERRORS``): the operation's requests are settled and the
  ``LinkLost`` carrying them is raised inside the operation (``Operations.link_lost``): an
  operation may go on without the port (``send_files`` keeps its files' verdicts), else it
  propagates;
- anything else that stops the operation (KeyboardInterrupt, asyncio cancellation, leaving a
  ``stream`` early, an error raised inside it): its requests are settled as CANCELLED
  (``Operations.interrupted``) before it propagates. Nothing is left in the session to run
  behind the caller's back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from idemlink.host.errors import TRANSPORT_ERRORS, LinkLost
from idemlink.host.operations import Job, Operations, Steps

if TYPE_CHECKING:  # the blocking drivers need no event loop
    from idemlink.host.aio_transport import AsyncTransport
    from idemlink.host.transport import Transport

T = TypeVar("T")


def rounds(ops: Operations[Any], transport: Transport, run_job: Callable[[Job[Any]], None],
           steps: Steps[T]) -> Generator[None, None, T]:
    """Run ``steps`` on a blocking transport, one I/O round per ``next()``; returns its result."""
    try:
        request = next(steps)
        while True:
            if isinstance(request, Job):
                try:
                    run_job(request)
                except BaseException as exc:  # the job's own failure, raised where it was asked
                    request = steps.throw(exc)
                    continue
                request = steps.send(b"")
                continue
            out, wait = request
            try:
                if out:
                    transport.write(out)
                data = transport.read(wait)
            except TRANSPORT_ERRORS as exc:
                request = steps.throw(ops.link_lost(exc))
                continue
            request = steps.send(data)
            yield
    except StopIteration as stop:
        result: T = stop.value
        return result
    except LinkLost:
        raise
    except BaseException as exc:
        ops.interrupted(exc)
        raise
    finally:
        steps.close()


async def drive_async(ops: Operations[Any], transport: AsyncTransport,
                      run_job: Callable[[Job[Any]], Awaitable[None]], steps: Steps[T],
                      between: Callable[[], None]) -> T:
    """``rounds`` awaited: run ``steps`` on an asyncio transport, calling ``between()`` after
    each I/O round; returns its result."""
    try:
        request = next(steps)
        while True:
            if isinstance(request, Job):
                try:
                    await run_job(request)
                except BaseException as exc:  # the job's own failure, raised where it was asked
                    request = steps.throw(exc)
                    continue
                request = steps.send(b"")
                continue
            out, wait = request
            try:
                if out:
                    await transport.write(out)
                data = await transport.read(wait)
            except TRANSPORT_ERRORS as exc:
                request = steps.throw(ops.link_lost(exc))
                continue
            request = steps.send(data)
            between()
    except StopIteration as stop:
        result: T = stop.value
        return result
    except LinkLost:
        raise
    except BaseException as exc:
        ops.interrupted(exc)
        raise
    finally:
        steps.close()


def nothing() -> None:
    """``between`` for an operation whose results are not handed out between rounds."""


__all__ = ["drive_async", "nothing", "rounds"]
