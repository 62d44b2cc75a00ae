"""``idemlink trigger [NAME] [--reset | --status]``: start a one-shot action, re-arm it, or
read its state.

Contract: the answer code says what happened: ACCEPTED (started now), RUNNING or DONE (nothing
started) all exit 0 — the device acted at most once; a code the contract does not define is
UNKNOWN (exit 5). ``--reset`` writes 0 (IDLE); ``--status`` reads the state. On a Modbus RTU
slave the same codes come from ``RtuDevice.trigger`` (the master reads the state first and writes
1 only in IDLE; the read-then-write is two requests, not atomic: docs/MODBUS_RTU.md). A plain
device's ``command`` register (docs/REGMAP.md) is started the same way (1 written only when it
reads 0; RUNNING while it reads a command), is the default when the map has no trigger, and has
no ``--reset`` (it returns to 0 by itself); ``--status`` says ``idle`` or the running command.
"""

from __future__ import annotations

import argparse
from typing import Any

from idemlink.cli import UserError, regmap_from
from idemlink.commands.common import (
    add_rtu_options,
    device_options,
    only_register,
    reading_entry,
    result_json,
)
from idemlink.commands.device_io import finish, link_guarded, open_any_device
from idemlink.commands.selection import resolve
from idemlink.host.frame_view import trigger_code_name
from idemlink.output import add_json_option
from idemlink.protocol.registers import (
    RegisterKind,
    RegisterMap,
    RegisterSpec,
    TriggerState,
    TriggerStatus,
)


def register(sub: Any) -> None:
    p = sub.add_parser("trigger", parents=[device_options()],
                       help="start a one-shot action, or reset/query")
    add_rtu_options(p)
    p.add_argument("name", nargs="?", metavar="NAME", help="trigger register (default: the only one)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--reset", action="store_true", help="reset the trigger to IDLE (write 0)")
    g.add_argument("--status", action="store_true", help="read the trigger state only")
    add_json_option(p, "idemlink.trigger/1")
    p.set_defaults(handler=link_guarded(run_trigger))


TRIGGER_MEANING: dict[int, str] = {
    TriggerStatus.ACCEPTED: "started",
    TriggerStatus.RUNNING: "already running: nothing started",
    TriggerStatus.DONE: "already done: nothing started (`--reset` to re-arm)",
    TriggerStatus.ABNORMAL_STATE: "abnormal state",
    TriggerStatus.ILLEGAL_VALUE: "illegal value",
}


def _state_name(value: int) -> str:
    try:
        return TriggerState(value).name
    except ValueError:
        return f"0x{value:04X}"


def _started_register(regmap: RegisterMap, name: str | None) -> RegisterSpec:
    """The trigger register to use, or a plain device's command register (named, or the map's
    only one when it has no trigger)."""
    if name is None and not regmap.of_kind(RegisterKind.TRIGGER) and regmap.of_kind(
            RegisterKind.COMMAND):
        return only_register(regmap, RegisterKind.COMMAND, None, "use")
    if name is not None and resolve(regmap, name).kind is RegisterKind.COMMAND:
        return resolve(regmap, name)
    return only_register(regmap, RegisterKind.TRIGGER, name, "use")


def _command_state(spec: RegisterSpec, value: int) -> str:
    if value == 0:
        return "idle"
    label = spec.label_of(value)
    return f"running command {value}" + (f" ({label})" if label else "")


def run_trigger(args: argparse.Namespace) -> int:
    spec = _started_register(regmap_from(args), args.name)
    command = spec.kind is RegisterKind.COMMAND
    if command and args.reset:
        raise UserError(f"{spec.name} is a command register: it returns to 0 by itself when its "
                        "command is done; there is nothing to reset (nothing was sent)")
    with open_any_device(args) as dev:
        doc: dict[str, Any] = {"register": spec.name}
        if args.status:
            r = dev.trigger_status(spec.name)
            doc.update(result_json(r))
            if r.ok:
                doc["state"] = (_command_state(spec, r.values[0]) if command
                                else _state_name(r.values[0]))
                doc["value"] = r.values[0]
                doc["registers"] = [reading_entry(spec, r)]
                lines = [f"{spec.name}: {doc['state']}"]
            else:
                lines = [f"{spec.name}: {r.describe()}"]
        else:
            r = dev.trigger_reset(spec.name) if args.reset else dev.trigger(spec.name)
            doc.update(result_json(r))
            doc["action"] = "reset" if args.reset else "start"
            if r.ok and r.code is not None:
                doc["code"] = r.code
                doc["code_name"] = trigger_code_name(r.code)
                meaning = "reset to IDLE" if args.reset and r.code == 0 else (
                    TRIGGER_MEANING.get(r.code, "unknown code"))
                lines = [f"{spec.name}: {doc['code_name']} (0x{r.code:04X}): {meaning}"]
            else:
                lines = [f"{spec.name}: {r.describe()}"]
        return finish(args, dev, [r], doc, lines)
