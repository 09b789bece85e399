"""The ``graphcheck`` command line of the Python package (``python -m graphcheck``, or the
``graphcheck`` console script a wheel installs).

It is the Rust binary's own command line (``graphcheck_cli::main_impl``, through
``graphcheck._native.main``): the same arguments, help, output bytes and exit codes —
0 no finding / equal / found, 1 findings / the documents differ / nothing matched,
2 bad input or usage.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Optional, Sequence

from . import _native

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one command (``argv`` without the program name; default ``sys.argv[1:]``) and
    returns its exit code. Output goes to the process's stdout and stderr.

    Without ``argv`` this is the program (the console script, ``python -m graphcheck``):
    Ctrl-C (SIGINT) ends the process at once, as it ends the Rust binary, killed by the
    signal (a shell's exit status 130), with no traceback. Called with ``argv`` inside a
    program of its own, the command runs to its end, since it writes its output (stdout,
    ``--output``) and must not write after its caller was told it stopped; a SIGINT
    meanwhile is raised as ``KeyboardInterrupt`` when it returns. (The functions of
    :mod:`graphcheck`, which write nothing, raise it at once.)"""
    args = list(sys.argv[1:] if argv is None else argv)
    # The command writes to file descriptors 1 and 2 directly: what Python buffered goes
    # first.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    command = ["graphcheck", *args]
    # Only Python's own handler is replaced: an ignored SIGINT (nohup, a background job)
    # stays ignored, as the binary inherits it, and a handler the program set stays.
    if (
        argv is None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            return _native.main(command)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return _native.main(command)


if __name__ == "__main__":
    sys.exit(main())
