"""``python -m idemlink``: the same entry point as the ``idemlink`` console script."""

from __future__ import annotations

import sys

from idemlink.console import main

sys.exit(main())
