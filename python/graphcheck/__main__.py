"""``python -m graphcheck``: the command line (see :mod:`graphcheck.cli`)."""

import sys

from .cli import main

__all__: list = []  # a script: nothing to import

sys.exit(main())
