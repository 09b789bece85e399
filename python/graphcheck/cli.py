"""The ``graphcheck`` command line of the Python package (``python -m graphcheck``, or the
``graphcheck`` console script a wheel installs).

It is the Rust binary's own command line (``graphcheck_cli::main_impl``, through
``graphcheck._native.main``): the same arguments, help, output bytes and exit codes —
0 no finding / equal / found, 1 findings / the documents differ / nothing matched,
2 bad input or usage.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from . import _native


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one command (``argv`` without the program name; default ``sys.argv[1:]``) and
    returns its exit code. Output goes to the process's stdout and stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    # The command writes to file descriptors 1 and 2 directly: what Python buffered goes
    # first.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    return _native.main(["graphcheck", *args])


if __name__ == "__main__":
    sys.exit(main())
