"""Opening the device a command names and reporting what the command's requests did.

Contract:

- ``open_any_device(args)``: the idemlink device at ``--port`` (``Device.open``, DTR/RTS low,
  exclusive), or with ``--modbus-rtu`` the standard slave (``RtuDevice``), the port opened with
  the command's baud rate and character format (``line_settings``). Tests may inject the
  device: ``args.open_device()`` is used when the namespace has it. No port, no device answering,
  a busy port, a device serving another map: one ``UserError`` line, nothing sent. A framed command
  that finds no idemlink device but a Modbus RTU slave at unit 1 (``AnswersModbusRtu`` from
  ``Device.open``, asked on the command's own line and format) says "this port answers Modbus
  RTU, not idemlink: add --modbus-rtu".
- ``link_guarded(handler)``: the handler on every ``--port`` (several: ``idemlink.commands.many``),
  with a port that fails mid-command reported in one line instead of a traceback (exit 5 if a
  request was out, else 1) and a Ctrl-C that interrupted a request which may have had an effect
  said once (exit 130). Through a gateway (``--port idemlink+http://...``): what the gateway does
  not carry is one line, exit 1 (nothing sent); a gateway that stops answering mid-call, one line
  with the call's key, exit 5.
- ``-v`` (INFO on the logger ``idemlink.cli``): the device connected to, and one line per request
  (``log_result``: what was sent, to which register, its outcome and attempts).
- ``finish``: prints the command's result (text, or ``idemlink.COMMAND/1`` with ``--json``) with
  its worst outcome; after an UNKNOWN that may have had an effect it reads back what the request
  touched (``Device.reconcile``) and reports it. An unanswered read changed nothing: not read back.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from idemlink.cli import (
    EXIT_INTERRUPTED,
    EXIT_LOCAL_ERROR,
    EXIT_UNKNOWN,
    UserError,
    mark_reported,
    regmap_from,
)
from idemlink.commands.common import (
    EXIT_OF_OUTCOME,
    MAX_TIMEOUT,
    bus_address,
    bus_addresses,
    check_seconds,
    half_duplex,
    host_key,
    line_settings,
    refuse_key_with_modbus,
    result_json,
    rtu_unit,
    rtu_units,
    schema_of,
    tcp_address,
    worst,
)
from idemlink.commands.connection import describe_sources
from idemlink.commands.many import ports_of, run_on_ports
from idemlink.host.command import Reconciliation, Result
from idemlink.host.device import Device
from idemlink.host.errors import AnswersModbusRtu, IncompatibleDevice, LinkLost, NoDevice, PortBusy, PortError
from idemlink.host.gateway_client import GatewayUnreachable
from idemlink.host.gateway_device import NotThroughGateway
from idemlink.host.port_hint import busy_message
from idemlink.host.rtu_device import RtuDevice
from idemlink.host.tcp_device import DEFAULT_TCP_TIMEOUT, TcpDevice
from idemlink.output import emit, error_json
from idemlink.protocol.outcome import Outcome
from idemlink.protocol.registers import RegisterMap

log = logging.getLogger("idemlink.cli")


def open_device(args: argparse.Namespace) -> Device:
    """The device at ``args.port`` (or ``args.open_device()`` when a test injected one)."""
    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    injected: Callable[[], Device] | None = getattr(args, "open_device", None)
    if injected is not None:
        return injected()
    if not args.port:
        raise UserError("--port is required (a device path or pyserial URL; see `idemlink ports`)")
    regmap = regmap_from(args)
    trace = getattr(args, "trace", None)
    key = host_key(args)
    log_sources(args)
    try:
        dev = Device.open(args.port, **line_settings(args), **half_duplex(args),
                          timeout=args.timeout, attempts=args.attempts, regmap=regmap,
                          trace=trace, address=bus_address(args), key=key)
    except OSError as exc:  # the trace file (the port's own failures are PortError)
        raise UserError(f"--trace {trace}: {exc.strerror or exc}") from None
    except NoDevice as exc:
        raise no_device(args.port, exc) from None
    except PortBusy:  # the hint's watching command carries the user's --regmap
        raise UserError(busy_message(args.port, getattr(args, "regmap", None))) from None
    except (PortError, IncompatibleDevice, NotThroughGateway) as exc:
        raise UserError(port_said_once(args.port, exc)) from None
    info = dev.info
    log.info("%s: connected to device %s (%s), map %s", args.port,
             info.device_id if info is not None else "?", info.name if info is not None else "?",
             regmap.name)
    return dev


def log_sources(args: argparse.Namespace) -> None:
    """``-v``: the connection settings the command line did not give, and where they came from."""
    said = describe_sources(args)
    if said:
        log.info("settings: %s", said)


def port_said_once(port: str, exc: BaseException) -> str:
    """``PORT: message``, or the message alone when it names the port already."""
    text = str(exc)
    return text if port in text else f"{port}: {text}"


AnyDevice = Device | RtuDevice | TcpDevice
"""An idemlink device or, with ``--modbus-rtu``, a standard Modbus RTU slave, or with
``--modbus-tcp`` a Modbus TCP device."""


def open_any_device(args: argparse.Namespace) -> AnyDevice:
    """``open_device``, or with ``--modbus-rtu`` the slave at ``args.port``, unit ``args.unit``,
    or with ``--modbus-tcp`` the device at that address (``open_tcp_device``)."""
    unit = rtu_unit(args)
    if unit is None:
        return open_device(args)
    injected: Callable[[], RtuDevice] | None = getattr(args, "open_device", None)
    if injected is not None:
        return injected()
    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    address = tcp_address(args)
    if address is None and not args.port:
        raise UserError("--port is required (a device path or pyserial URL; see `idemlink ports`)")
    how = "--modbus-rtu" if address is None else "--modbus-tcp"
    refuse_key_with_modbus(args, how)
    if getattr(args, "trace", None) is not None:
        raise UserError(f"--trace decodes idemlink frames: it does not apply with {how}")
    if getattr(args, "if_generation", None) is not None:
        raise UserError("--if-generation needs the idemlink conditional write (function 0x41), "
                        f"which a standard Modbus {'RTU slave' if address is None else 'TCP device'} "
                        "does not have; nothing was sent")
    log_sources(args)
    if address is not None:
        return open_tcp_device(args, address, unit)
    try:
        return RtuDevice.open(args.port, unit=unit, **line_settings(args), **half_duplex(args),
                              timeout=args.timeout, attempts=args.attempts,
                              regmap=regmap_from(args))
    except (PortError, NoDevice) as exc:
        raise UserError(port_said_once(args.port, exc)) from None


def tcp_timeout(args: argparse.Namespace) -> float:
    """``--timeout``, or Modbus TCP's own default (``DEFAULT_TCP_TIMEOUT``, 1 s: a gateway polls
    a serial line behind it) when no source gave one."""
    if getattr(args, "settings_from", {}).get("timeout", "default") == "default":
        return DEFAULT_TCP_TIMEOUT
    timeout: float = args.timeout
    return timeout


def open_tcp_device(args: argparse.Namespace, address: str, unit: int,
                    regmap: RegisterMap | None = None) -> TcpDevice:
    """The Modbus TCP device at ``address``, unit ``unit`` (``UserError`` naming the address when
    it cannot be reached or nothing answers)."""
    try:
        return TcpDevice.open(address, unit=unit, timeout=tcp_timeout(args),
                              attempts=args.attempts,
                              regmap=regmap if regmap is not None else regmap_from(args))
    except (PortError, NoDevice) as exc:
        raise UserError(port_said_once(address, exc)) from None


def no_device(port: str, exc: NoDevice, *, hint: str = "add --modbus-rtu") -> UserError:
    """The one line for a port where no idemlink device answered: naming the port, and saying
    so when a Modbus RTU slave answers there instead (``Device.open`` asked it:
    ``AnswersModbusRtu``; ``hint``: what to do about it)."""
    if isinstance(exc, AnswersModbusRtu):
        return UserError(f"{port}: {AnswersModbusRtu.SAYS}: {hint}")
    return UserError(port_said_once(port, exc))


def run_on_addresses(args: argparse.Namespace, handler: Callable[[argparse.Namespace], int],
                     port: str, addresses: list[int], *, modbus_rtu: bool = False) -> int:
    """``--address 1,2,5-8`` (``modbus_rtu``: ``--modbus-rtu --unit 1,2,5-8``): ``handler``
    once per address on one opened bus (``idemlink.host.bus.Bus``: one transaction on the line
    at a time, round-robin), reported as several ports are (``run_on_ports``: one block per
    ``PORT@ADDRESS``, the worst exit status)."""
    from idemlink.host.bus import Bus

    check_seconds("--timeout", args.timeout, MAX_TIMEOUT)
    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    if getattr(args, "trace", None) is not None:
        raise UserError("--trace records one device: give one --address"
                        if not modbus_rtu else "--trace decodes idemlink frames: it does not "
                        "apply with --modbus-rtu")
    if modbus_rtu and getattr(args, "command", None) == "apply":
        raise UserError("apply keys its journal by --device-id, one per plain slave: run it "
                        "once per --unit")
    if modbus_rtu and getattr(args, "if_generation", None) is not None:
        raise UserError("--if-generation needs the idemlink conditional write (function 0x41), "
                        "which a standard Modbus RTU slave does not have; nothing was sent")
    regmap = regmap_from(args)
    log_sources(args)
    if modbus_rtu:  # plain units have no authentication: --key-file refused, the env's unused
        refuse_key_with_modbus(args, "--modbus-rtu")
        key = None
    else:  # one key (or rotation) for every address: the API takes one each
        key = host_key(args)
    try:
        bus = Bus.open(port, **line_settings(args), **half_duplex(args), regmap=regmap,
                       timeout=args.timeout, attempts=args.attempts, modbus_rtu=modbus_rtu,
                       key=key)
    except PortBusy:
        raise UserError(busy_message(port, getattr(args, "regmap", None))) from None
    except PortError as exc:
        raise UserError(port_said_once(port, exc)) from None

    def one(ns: argparse.Namespace) -> int:
        address = int(ns.port.rpartition("@")[2])
        ns.port, ns.ports = port, [port]
        if modbus_rtu:
            ns.unit = address
        else:
            ns.address = str(address)

        def opened() -> AnyDevice:
            dev = bus.device(address)
            try:
                dev.connect()
            except NoDevice as exc:
                raise no_device(port, exc) from None
            except IncompatibleDevice as exc:
                raise UserError(port_said_once(port, exc)) from None
            return dev

        ns.open_device = opened
        return handler(ns)

    try:
        return run_on_ports(args, one, [f"{port}@{a}" for a in addresses])
    finally:
        bus.close()


def link_guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler``, with a port that fails mid-command reported instead of a traceback: exit 5
    (UNKNOWN) if a request was out — it may have run — else exit 1 (nothing was sent); the hint to
    read back is given only if one that was out may have had an effect (not for a read). An
    interrupt (Ctrl-C) still exits 130, after one line if a request that may have had an effect
    was out."""

    def guarded(args: argparse.Namespace) -> int:
        ports = ports_of(args)
        addresses = bus_addresses(args)
        units = rtu_units(args) if getattr(args, "modbus_tcp", None) is None else None
        if units is not None and len(units) > 1:
            if len(ports) != 1:
                raise UserError("--unit with several units runs on one line: give one --port")
            return run_on_addresses(args, one_port, ports[0], units, modbus_rtu=True)
        if addresses is not None and len(addresses) > 1:
            if len(ports) != 1:
                raise UserError("--address with several addresses runs on one bus: give one "
                                "--port")
            return run_on_addresses(args, one_port, ports[0], addresses)
        if len(ports) > 1:
            return run_on_ports(args, one_port, ports)
        args.port = ports[0] if ports else None
        return one_port(args)

    def one_port(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except LinkLost as exc:
            outcome = Outcome.UNKNOWN if exc.unknown else None
            hint = ""
            if any(r.outcome is Outcome.UNKNOWN and r.command.may_have_effect for r in exc.results):
                hint = ("; once the port is back, `idemlink apply` again reads the step back"
                        if args.command == "apply" else
                        "; once the port is back, read back what it touched before going on")
            print(f"idemlink {args.command}: {exc}{hint}",
                  file=sys.stderr)
            status = EXIT_UNKNOWN if exc.unknown else EXIT_LOCAL_ERROR
            error_json(args, f"{exc}{hint}", status, outcome=outcome.name if outcome else None,
                       error=str(exc), results=[result_json(r) for r in exc.results])
            return status
        except NotThroughGateway as exc:  # --port idemlink+http://...: nothing was sent
            raise UserError(port_said_once(args.port or "", exc)) from None
        except GatewayUnreachable as exc:  # the call may have arrived: ask again under its key
            print(f"idemlink {args.command}: {exc}", file=sys.stderr)
            error_json(args, str(exc), EXIT_UNKNOWN, outcome=Outcome.UNKNOWN.name,
                       error=str(exc))
            return EXIT_UNKNOWN
        except KeyboardInterrupt as exc:
            results: tuple[Result, ...] = getattr(exc, "settled_results", ())
            sent = [r for r in results if r.outcome is Outcome.UNKNOWN and r.command.may_have_effect]
            if sent:
                message = (f"interrupted; {len(sent)} request(s) may have run (UNKNOWN, "
                           "CANCELLED): read back what it touched before going on")
                print(f"idemlink {args.command}: {message}", file=sys.stderr)
                error_json(args, message, EXIT_INTERRUPTED, outcome=Outcome.UNKNOWN.name,
                           error="interrupted", results=[result_json(r) for r in results])
                mark_reported(exc)
            raise

    guarded.__name__ = handler.__name__
    guarded.__doc__ = handler.__doc__
    return guarded


def log_result(regmap: RegisterMap, r: Result) -> None:
    """One INFO line per request (``-v``): what was sent, to which registers, and how it ended,
    e.g. ``WRITE threshold(4) [400]: OK after 1 attempt(s)``."""
    c = r.command
    spec = regmap.spec_at(c.address, c.space)
    where = f"{spec.name}({c.address})" if spec is not None else f"@{c.address}"
    values = f" {list(c.values)}" if c.values else ""
    got = f" -> {list(r.values)}" if r.values else ""
    log.info("%s %s%s: %s after %d attempt(s)%s", c.kind.name, where, values, r.describe(),
             r.attempts, got)


def reconcile_json(dev: AnyDevice, r: Result) -> tuple[dict[str, Any], str]:
    """Settle the UNKNOWN command ``r`` by the device's evidence and read back what it touched
    (``reconcile``): its JSON and its text line."""
    return reconcile_doc(dev.reconcile(r))


def reconcile_doc(rec: Reconciliation | None) -> tuple[dict[str, Any], str]:
    """The JSON and the text line of a reconciliation: what holds now, and whether the command
    ran by the device's evidence (``executed``: true, false or null; ``evidence`` says how)."""
    if rec is None:  # pragma: no cover - reconcile(r) answers for every command
        return {"observed": {}, "intended_state_holds": None, "summary": "nothing to read",
                "executed": None, "evidence": ""}, ""
    doc: dict[str, Any] = {"observed": rec.observed, "intended_state_holds": rec.intended_state_holds,
                           "summary": rec.summary, "executed": rec.executed,
                           "evidence": rec.evidence}
    if rec.resent is not None:
        doc["resent"] = result_json(rec.resent)
    head = {True: "UNKNOWN settled: it ran", False: "UNKNOWN settled: it did not run",
            None: "UNKNOWN: it may have run"}[rec.executed]
    line = " ".join([f"{head} ({rec.evidence}); read back: {rec.summary}",
                     *(f"{k}={rec.shown.get(k, v)}" for k, v in rec.observed.items())])
    return doc, line


def after_unknown(dev: AnyDevice, results: Sequence[Result], doc: dict[str, Any],
                  lines: list[str]) -> list[Outcome]:
    """Ask the device about every UNKNOWN command that may have had an effect, read back what it
    touched and add it to the output: ``reconcile`` is the first one's (the one blocking the
    handle), ``reconciles`` lists each in command order. An unanswered read has nothing to read
    back. Returns each result's outcome as the device's evidence settled it (``settled``)."""
    each: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    for r in results:
        if r.outcome is not Outcome.UNKNOWN or not r.command.may_have_effect:
            outcomes.append(r.outcome)
            continue
        rec = dev.reconcile(r)
        entry, line = reconcile_doc(rec)
        each.append(entry)
        lines.append(line)
        outcomes.append(settled(rec))
    if each:
        doc["reconcile"] = each[0]
        doc["reconciles"] = each
    return outcomes


def settled(rec: Reconciliation | None) -> Outcome:
    """An UNKNOWN command's outcome once the device was asked: the answer its re-send got when
    the device answered it (replayed or run now: what the command did), NOT_EXECUTED when the
    device proves it never ran; UNKNOWN otherwise — also when the device says it ran but its
    answer is gone (whether it took effect is not known)."""
    if rec is None or rec.executed is None:
        return Outcome.UNKNOWN
    if rec.executed is False:
        return Outcome.NOT_EXECUTED
    resent = rec.resent
    return resent.outcome if resent is not None and resent.answered else Outcome.UNKNOWN


def finish(args: argparse.Namespace, dev: AnyDevice, results: Sequence[Result],
           doc: dict[str, Any], lines: list[str]) -> int:
    """Print the command's result (``idemlink.COMMAND/1`` with ``--json``): the worst outcome,
    and on UNKNOWN what was read back; return its exit status."""
    for r in results:
        log_result(dev.regmap, r)
    outcome = worst(r.outcome for r in results)
    if outcome is Outcome.UNKNOWN:
        outcome = worst(after_unknown(dev, results, doc, lines))
        if outcome is not Outcome.UNKNOWN:
            doc["settled_by"] = "evidence"  # every UNKNOWN was settled by the device's answer
            lines.append(f"{outcome.name}: settled by the device's answer to the same request "
                         "re-sent under its own number")
    doc["outcome"] = outcome.name
    emit(args, schema_of(args), doc, lines)
    return EXIT_OF_OUTCOME[outcome]
