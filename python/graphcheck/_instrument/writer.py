"""The writer thread of an instrumentation: a capture asks for the manifest of its
captures to be written and goes on; the thread builds and writes it (the core's build runs
without the GIL), once a burst of captures is over, and only the latest of what it was
asked for. :meth:`ManifestWriter.wait` has it write now and waits for it."""

from __future__ import annotations

import threading
from typing import Callable, Optional

__all__ = ["FLUSH_WAIT_S", "WRITE_QUIET_S", "ManifestWriter"]

#: The writer thread writes once no capture came for this long (seconds): a burst of
#: captures is built and written once, at its end.
WRITE_QUIET_S = 0.2

#: How long :meth:`ManifestWriter.wait` waits by default (seconds; flush, at exit too): a
#: writer stuck past it (a hung file system) is reported and left behind.
FLUSH_WAIT_S = 120.0


class ManifestWriter:
    """Writes on its own thread what ``write()`` writes: the manifest of the latest
    captures, returning how many captures it holds (``None``: nothing could be read to
    write). The thread starts at the first :meth:`ask` and ends after 5 s with nothing
    asked; the next ask starts another."""

    def __init__(self, write: Callable[[], Optional[int]]):
        self._write = write
        self._thread: Optional[threading.Thread] = None
        self._cv = threading.Condition()
        # Manifests of the first `_want` captures asked for, of the first `_done` written.
        self._want = self._done = 0
        self._urgent = False
        self._closed = False

    def ask(self, captures: int) -> None:
        """Has the thread write the manifest of the first ``captures`` captures (or a
        later one); raises where no thread could be started."""
        with self._cv:
            self._want = max(self._want, captures)
            self._closed = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="graphcheck-writer", daemon=True
                )
                try:
                    self._thread.start()
                except BaseException:
                    # No thread to wait for (a process out of threads): the caller's flush
                    # writes it, and the next ask tries a thread again.
                    self._thread = None
                    raise
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._want <= self._done:
                    if self._closed or (
                        not self._cv.wait(timeout=5.0) and self._want <= self._done
                    ):
                        self._thread = None  # idle: the next ask starts another
                        return
                # Captures come in bursts (a batch size after another): the write waits
                # until none came for WRITE_QUIET_S, so that a burst is built once, unless
                # a flush wants it now.
                while not self._urgent:
                    seen = self._want
                    self._cv.wait(timeout=WRITE_QUIET_S)
                    if self._want == seen:
                        break
            with self._cv:
                asked = self._want
            wrote = self._write()
            with self._cv:
                self._done = max(self._done, asked if wrote is None else wrote)
                self._cv.notify_all()

    def close(self) -> None:
        """Has the thread end once it has written what it was asked (the instrumentation
        stopped): an idle thread holds its instrumentation, and all it recorded, for the
        5 s it waits otherwise. A later :meth:`ask` starts another."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Has the thread write what it was asked to now, and waits until it did (at most
        ``timeout``, default :data:`FLUSH_WAIT_S`); returns whether it did."""
        with self._cv:
            self._urgent = True
            self._cv.notify_all()
            try:
                return self._cv.wait_for(
                    lambda: self._done >= self._want or self._thread is None,
                    FLUSH_WAIT_S if timeout is None else timeout,
                )
            finally:
                self._urgent = False
