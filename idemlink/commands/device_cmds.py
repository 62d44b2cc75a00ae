"""The names the device commands used to share from this one module, kept importable.

Contract: nothing is defined here. Each device command now has its own module (``read_cmd``,
``write_cmd``, ``faults_cmd``, ``clear_cmd``, ``trigger_cmd``, ``monitor_cmd``, ``ports_cmd``);
what they share is in ``idemlink.commands.common`` (options, exit codes, values) and
``idemlink.commands.device_io`` (opening, reporting). This module re-exports those names for
code written against the former layout; new code imports from where they live.
"""

from __future__ import annotations

from idemlink.commands.clear_cmd import fault_mask, run_clear
from idemlink.commands.common import (
    EXIT_OF_OUTCOME,
    MAX_SECONDS,
    MAX_TIMEOUT,
    SEVERITY,
    add_rtu_options,
    check_seconds,
    device_options,
    not_sent,
    parse_int,
    parse_value,
    reading_entry,
    result_json,
    rtu_unit,
    schema_of,
    shown,
    worst,
)
from idemlink.commands.device_io import (
    AnyDevice,
    after_unknown,
    answers_modbus_rtu,
    finish,
    link_guarded,
    open_any_device,
    open_device,
    reconcile_json,
)
from idemlink.commands.faults_cmd import decode_fault_word, run_faults
from idemlink.commands.monitor_cmd import run_monitor
from idemlink.commands.ports_cmd import run_ports
from idemlink.commands.read_cmd import run_read
from idemlink.commands.selection import resolve
from idemlink.commands.trigger_cmd import TRIGGER_MEANING, run_trigger
from idemlink.commands.write_cmd import (
    Assignment,
    contiguous_runs,
    map_refusal,
    parse_assignments,
    run_write,
)

__all__ = [
    "EXIT_OF_OUTCOME", "MAX_SECONDS", "MAX_TIMEOUT", "SEVERITY", "TRIGGER_MEANING", "AnyDevice",
    "Assignment", "add_rtu_options", "after_unknown", "answers_modbus_rtu", "check_seconds",
    "contiguous_runs", "decode_fault_word", "device_options", "fault_mask", "finish",
    "link_guarded", "map_refusal", "not_sent", "open_any_device", "open_device",
    "parse_assignments", "parse_int", "parse_value", "reading_entry", "reconcile_json", "resolve",
    "result_json", "rtu_unit", "run_clear", "run_faults", "run_monitor", "run_ports", "run_read",
    "run_trigger", "run_write", "schema_of", "shown", "worst",
]
