"""``python -m idemlink``: the same entry point as the ``idemlink`` console script."""

from __future__ import annotations

import sys

try:
    from idemlink.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command modules load: nothing was sent yet
    sys.exit(130)

sys.exit(main())
