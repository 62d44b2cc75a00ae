"""YMODEM batch transfer, sans-I/O: the public names in one place, and the contract section.

The implementation lives in one module per reason to change:

- ``ymodem_wire``: control bytes, block framing, the block 0 header (build and parse);
- ``ymodem_names``: the file-name policy (``check_name``) and the permission rule;
- ``ymodem_events``: the events both machines emit, and their shared output queues;
- ``ymodem_tables``: every state, input, action and transition of both machines;
- ``ymodem_receiver`` / ``ymodem_sender``: the two machines (``Receiver``, ``Sender``), with the
  sans-I/O shape every protocol machine here has: ``receive_data(data, now)``, ``tick(now)``,
  ``next_event()``, ``data_to_send()``, ``next_deadline()``, commands ``start(now)`` and
  ``abort(reason)``;
- ``ymodem_files``: what a receiving shell does with the events (the safe directory sink).

Import each name from the module that defines it (``from idemlink.protocol.ymodem_sender import
Sender``): one import path per name (``tests/test_layers.py``). This module holds only
``contract_section()``, which gives the wire bytes to the C header and both tables to
docs/PROTOCOL.md.
"""

from __future__ import annotations

from idemlink.protocol.contract_section import CDefine, CEnum, ContractSection, md_table
from idemlink.protocol.ymodem_names import (
    MAX_NAME_BYTES,
)
from idemlink.protocol.ymodem_tables import (
    RX_TRANSITIONS,
    TX_TRANSITIONS,
)
from idemlink.protocol.ymodem_wire import (
    BLOCK_LARGE,
    BLOCK_SMALL,
    REGULAR_FILE,
    YmodemByte,
)

__all__ = [
    "contract_section",
]


def contract_section() -> ContractSection:
    """YMODEM wire bytes and the two transition tables."""
    rx_rows = [[s.value, i.value, t.value, a.value] for (s, i), (t, a) in RX_TRANSITIONS.items()]
    tx_rows = [[s.value, i.value, t.value, a.value] for (s, i), (t, a) in TX_TRANSITIONS.items()]
    md = (
        "## YMODEM\n\n"
        "CRC-16/XMODEM, 128-byte (SOH) and 1024-byte (STX) blocks, block 0 = "
        "`name NUL \"size mtime(octal) mode(octal) 0\"`; an empty name ends the batch.\n\n"
        "### Receiver transitions\n\n" + md_table(["state", "input", "next", "action"], rx_rows)
        + "\n### Sender transitions\n\n" + md_table(["state", "input", "next", "action"], tx_rows)
    )
    return ContractSection(
        name="ymodem",
        defines=[
            CDefine("IDL_YM_BLOCK_SMALL", BLOCK_SMALL, "SOH payload bytes"),
            CDefine("IDL_YM_BLOCK_LARGE", BLOCK_LARGE, "STX payload bytes"),
            CDefine("IDL_YM_MAX_NAME", MAX_NAME_BYTES, "longest accepted file name (bytes)"),
            CDefine("IDL_YM_S_IFREG", f"0{REGULAR_FILE:o}u", "regular-file bit sent with the mode"),
        ],
        enums=[CEnum("idl_ym_byte_t", "IDL_YM", YmodemByte, "YMODEM control bytes")],
        markdown=md,
        data={  # wire facts only: the tables are behaviour, documented but not hashed
            "bytes": {m.name: m.value for m in YmodemByte},
            "blocks": [BLOCK_SMALL, BLOCK_LARGE],
            "max_name": MAX_NAME_BYTES,
            "s_ifreg": REGULAR_FILE,
            "crc": "CRC-16/XMODEM",
        },
    )
