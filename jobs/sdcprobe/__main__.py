"""``python -m sdcprobe``: see :mod:`sdcprobe.cli`."""

from __future__ import annotations

import sys

from sdcprobe.cli import main

if __name__ == "__main__":
    sys.exit(main())
