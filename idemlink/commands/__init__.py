"""CLI subcommands: one module per command (``read_cmd``, ``write_cmd``...; ``ymodem_cmd`` holds
``send`` and ``receive``), each exposing ``register(subparsers)``.

``idemlink.cli`` imports every module listed in ``COMMAND_MODULES`` in order; adding a command is
adding a module here, one line to that list and its name(s) to ``COMMAND_NAMES`` (with a command
name on the command line, ``idemlink.cli.main`` imports only that command's module: a child
process pays for the imports of one command, not of seventeen; ``tests/test_cli_entry.py``
keeps the table true to what each module registers). What the device commands share lives in
``common`` (options, exit status per outcome, values), ``device_io`` (opening a device, reporting
outcomes), ``selection`` (which registers) and ``many`` (several ports at once).
"""

COMMAND_MODULES: tuple[str, ...] = (
    "idemlink.commands.contract_cmd",
    "idemlink.commands.soak_cmd",
    "idemlink.commands.demo_cmd",
    "idemlink.commands.ymodem_cmd",
    "idemlink.commands.sim_cmd",
    "idemlink.commands.regmap_cmd",
    "idemlink.commands.read_cmd",
    "idemlink.commands.write_cmd",
    "idemlink.commands.faults_cmd",
    "idemlink.commands.clear_cmd",
    "idemlink.commands.trigger_cmd",
    "idemlink.commands.monitor_cmd",
    "idemlink.commands.ports_cmd",
    "idemlink.commands.apply_cmd",
    "idemlink.commands.info_cmd",
    "idemlink.commands.watch_cmd",
    "idemlink.commands.link_cmd",
    "idemlink.commands.scan_cmd",
    "idemlink.commands.gateway_cmd",
    "idemlink.commands.gateway_call_cmd",
    "idemlink.commands.broadcast_cmd",
)

#: the command names each module of ``COMMAND_MODULES`` registers
COMMAND_NAMES: dict[str, str] = {
    "contract": "idemlink.commands.contract_cmd",
    "soak": "idemlink.commands.soak_cmd",
    "demo": "idemlink.commands.demo_cmd",
    "send": "idemlink.commands.ymodem_cmd",
    "receive": "idemlink.commands.ymodem_cmd",
    "sim": "idemlink.commands.sim_cmd",
    "regmap": "idemlink.commands.regmap_cmd",
    "read": "idemlink.commands.read_cmd",
    "write": "idemlink.commands.write_cmd",
    "faults": "idemlink.commands.faults_cmd",
    "clear": "idemlink.commands.clear_cmd",
    "trigger": "idemlink.commands.trigger_cmd",
    "monitor": "idemlink.commands.monitor_cmd",
    "ports": "idemlink.commands.ports_cmd",
    "apply": "idemlink.commands.apply_cmd",
    "info": "idemlink.commands.info_cmd",
    "watch": "idemlink.commands.watch_cmd",
    "link": "idemlink.commands.link_cmd",
    "scan": "idemlink.commands.scan_cmd",
    "gateway": "idemlink.commands.gateway_cmd",
    "gateway-call": "idemlink.commands.gateway_call_cmd",
    "broadcast": "idemlink.commands.broadcast_cmd",
}
