"""CLI subcommands: one module per command family, each exposing ``register(subparsers)``.

``host.cli`` imports every module listed in ``COMMAND_MODULES`` in order; adding a command is
adding a module here and one line to that list.
"""

COMMAND_MODULES: tuple[str, ...] = (
    "host.commands.contract_cmd",
    "host.commands.soak_cmd",
    "host.commands.demo_cmd",
    "host.commands.ymodem_cmd",
    "host.commands.sim_cmd",
    "host.commands.regmap_cmd",
    "host.commands.device_cmds",
    "host.commands.link_cmd",
)
