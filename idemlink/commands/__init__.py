"""CLI subcommands: one module per command family, each exposing ``register(subparsers)``.

``idemlink.cli`` imports every module listed in ``COMMAND_MODULES`` in order; adding a command is
adding a module here and one line to that list.
"""

COMMAND_MODULES: tuple[str, ...] = (
    "idemlink.commands.contract_cmd",
    "idemlink.commands.soak_cmd",
    "idemlink.commands.demo_cmd",
    "idemlink.commands.ymodem_cmd",
    "idemlink.commands.sim_cmd",
    "idemlink.commands.regmap_cmd",
    "idemlink.commands.device_cmds",
    "idemlink.commands.apply_cmd",
    "idemlink.commands.info_cmd",
    "idemlink.commands.watch_cmd",
    "idemlink.commands.link_cmd",
)
