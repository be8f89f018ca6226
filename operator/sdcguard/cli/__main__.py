"""``python -m sdcguard.cli``: the same as ``kubectl sdc``."""

import sys

from sdcguard.cli.main import main

sys.exit(main())
