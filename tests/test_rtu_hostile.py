"""Hostile checks of the Modbus RTU client: a slave that answers after the master gave up,
exception 04 on a set-only write. Ground truth: the in-process slave's core."""

from __future__ import annotations

from support.rtu import rtu_reply

from idemlink.device_sim.rtu_server import RtuServer
from idemlink.host.errors import LinkLost, UnknownOutstanding
from idemlink.host.rtu_device import RtuDevice
from idemlink.protocol.device_core import DeviceCore
from idemlink.protocol.outcome import Outcome, Status
from idemlink.protocol.regmap_file import DEFAULT_MAP

TH, MODE = 4, 5  # addresses in the default map



class LateWire:
    """``RtuDevice``'s transport on a simulated clock: the slave runs each request when it
    arrives and its answer reaches the host ``delay`` seconds later (after the master's wait)."""

    def __init__(self, delay: float) -> None:
        self.core = DeviceCore(DEFAULT_MAP)
        self.server = RtuServer(self.core, unit=1)
        self.delay = delay
        self.t = 0.0
        self.requests: list[bytes] = []
        self._pending: list[tuple[float, bytes]] = []  # (due, answer bytes)

    def write(self, data: bytes) -> None:
        self.requests.append(data)
        answer = rtu_reply(self.server, data, self.t)
        if answer:
            self._pending.append((self.t + self.delay, answer))

    def read(self, timeout: float) -> bytes:
        until = self.t + timeout
        due = [p for p in self._pending if p[0] <= until]
        if not due:
            self.t = until
            return b""
        first = min(d for d, _ in due)
        self.t = max(self.t, first)
        ready = [a for d, a in self._pending if d <= self.t]
        self._pending = [p for p in self._pending if p[0] > self.t]
        return b"".join(ready)

    def now(self) -> float:
        return self.t

    def close(self) -> None:
        pass


def test_an_answer_buffered_before_a_request_is_sent_is_not_its_answer() -> None:
    """The threshold read's answer arrives after the master gave up, and sits in the input
    buffer while the program does something else; the next read (same function, same count)
    must not take it: it read 420 as the mode."""
    wire = LateWire(delay=0.5)
    wire.core.write(TH, (420,), 0.0)
    dev = RtuDevice(wire, timeout=0.1, attempts=1)
    first = dev.read("threshold")
    assert (first.outcome, first.status) == (Outcome.UNKNOWN, Status.NO_ANSWER)
    wire.t += 1.0  # the late answer is now buffered at the host
    wire.delay = 0.0  # the slave is back to answering at once
    mode = dev.read("mode")
    assert mode.outcome is Outcome.OK
    assert mode.values == wire.core.read(MODE, 1) != (420,)


def test_exception_04_on_a_set_only_write_is_unknown_sent_once_and_blocks() -> None:
    """SERVER_DEVICE_FAILURE: the slave may have changed part of its state; the write is not
    repeated automatically (an answer arrived, so nothing was lost), the handle blocks."""
    wire = LateWire(delay=0.0)
    orig = wire.server.core.execute

    def failing(pdu: bytes, now: float, **kw: object) -> bytes:
        if pdu[0] == 0x06:
            return bytes([0x86, 0x04])
        return orig(pdu, now, **kw)  # type: ignore[arg-type]

    wire.server.core.execute = failing  # type: ignore[method-assign]
    dev = RtuDevice(wire, timeout=0.1, attempts=5)
    r = dev.write({"threshold": 10})
    assert r.outcome is Outcome.UNKNOWN and r.attempts == 1 and len(wire.requests) == 1
    try:
        dev.read("mode")
    except UnknownOutstanding:
        pass
    else:
        raise AssertionError("an UNKNOWN write must block the handle")


class DeadWire(LateWire):
    def read(self, timeout: float) -> bytes:
        raise OSError(5, "Input/output error")


def test_a_port_failing_before_a_request_is_sent_ran_nothing() -> None:
    wire = DeadWire(delay=0.0)
    dev = RtuDevice(wire, timeout=0.1)
    try:
        dev.trigger()
    except LinkLost as exc:
        assert [r.outcome for r in exc.results] == [Outcome.NOT_EXECUTED]
        assert not exc.unknown and "nothing was out" in str(exc)
    else:
        raise AssertionError("a failing port must raise LinkLost")
    assert wire.requests == [] and dev.unknown is None


class DiesAfterFirstRequest(LateWire):
    """The port fails at the first read after a request went out."""

    def read(self, timeout: float) -> bytes:
        if self.requests:
            raise OSError(5, "Input/output error")
        return super().read(timeout)


def test_a_port_failing_mid_run_settles_the_commands_not_sent() -> None:
    """LinkLost names every command of the run it interrupted: the one out UNKNOWN, the ones
    never sent NOT_EXECUTED (they were missing: the JSON results listed only the first)."""
    wire = DiesAfterFirstRequest(delay=0.0)
    dev = RtuDevice(wire, timeout=0.1)
    cmds = [dev.write_command({"threshold": 5}), dev.write_command({"fan_setpoint": 1})]
    try:
        dev.run(cmds)
    except LinkLost as exc:
        assert [(r.command, r.outcome) for r in exc.results] == [
            (cmds[0], Outcome.UNKNOWN), (cmds[1], Outcome.NOT_EXECUTED)]
    else:
        raise AssertionError("a failing port must raise LinkLost")
    assert len(wire.requests) == 1


def test_an_interrupted_run_settles_the_commands_not_sent() -> None:
    wire = LateWire(delay=0.0)

    def interrupt(timeout: float) -> bytes:
        if wire.requests:
            raise KeyboardInterrupt
        return b""

    wire.read = interrupt  # type: ignore[method-assign]
    dev = RtuDevice(wire, timeout=0.1)
    cmds = [dev.write_command({"threshold": 5}), dev.read_command("mode")]
    try:
        dev.run(cmds)
    except KeyboardInterrupt as exc:
        settled = exc.settled_results  # type: ignore[attr-defined]
        assert [(r.command, r.outcome, r.status) for r in settled] == [
            (cmds[0], Outcome.UNKNOWN, Status.CANCELLED), (cmds[1], Outcome.NOT_EXECUTED, None)]
    else:
        raise AssertionError("the interrupt must propagate")
    assert dev.unknown is not None
