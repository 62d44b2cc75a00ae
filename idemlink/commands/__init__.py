"""CLI subcommands: one module per command (``read_cmd``, ``write_cmd``...; ``ymodem_cmd`` holds
``send`` and ``receive``), each exposing ``register(subparsers)``.

``idemlink.cli`` imports every module listed in ``COMMAND_MODULES`` in order; adding a command is
adding a module here and one line to that list. What the device commands share lives in
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
)
