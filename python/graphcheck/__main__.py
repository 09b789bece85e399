"""``python -m graphcheck``: the command line (see :mod:`graphcheck.cli`)."""

import sys

from .cli import main

sys.exit(main())
