"""What several test files share: the one place test helpers live.

Test files import helpers only from here (``from support.firmware import RunningDevice``), never
from each other. ``tests/`` is on ``sys.path`` through ``pythonpath`` in pyproject.toml's pytest
settings, so this works in every import mode; nothing here is collected (no ``test_*`` modules).

- ``support.timing``: deadlines that scale with the machine, waiting on a condition or a child's
  first line instead of sleeping.
- ``support.firmware``: ``make -C firmware_ref`` once per session per target (skipping, naming the
  tool, when one is missing), the posix C device on a pty (``RunningDevice``), the firmware on
  QEMU (``QemuDevice``).
- ``support.fixtures``: the session-scoped fixtures over those builds (``device_bin``,
  ``qemu_elf``, ``lib_path``, ``pump_build``), loaded by ``tests/conftest.py``.
- ``support.rtu``: driving the plain Modbus RTU face (``rtu_reply``, ``LossyWire``, the RTU
  simulator as a child process).
- ``support.aio``: ``WaitingTransport``, an asyncio transport whose reads really wait.
- ``support.ymodem``: the in-process YMODEM pair on a virtual clock (``Pair``, ``files_of``).
- ``support.c_ymodem``: the C YMODEM receiver and the Python one side by side (``Pair``).
- ``support.doc_runner``: running a Markdown document's marked examples.
- ``support.kill_bench``: the bench of ``test_apply_kills.py`` (apply processes killed on a pty line).
"""
