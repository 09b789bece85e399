"""What instrumentation needs of the host process it runs in: a warning that never raises
into the engine, one capture handed to every instrumentation with at most one error
raised, this process's rank and world size, its manifest files, ``CUDAGraph(...)``'s
arguments with ``keep_graph`` forced on, and putting back what a patch replaced."""

from __future__ import annotations

import os
import types
from typing import Callable

from .._producer import rank_and_world
from .._recorder import fatal
from .._torch_import import import_torch

__all__ = [
    "claim_manifest_path",
    "current_stream",
    "each_sink",
    "force_keep_graph",
    "rank_and_world",
    "restore",
    "warn",
]


def warn(message: str) -> None:
    """Warns with a ``RuntimeWarning`` that never raises: this runs inside the engine's
    ``capture_end``. Where the filters turn the warning into an error (``-W error``,
    pytest's ``filterwarnings = error``), it is shown instead, through
    ``warnings.showwarning`` (which pytest records); the filters' ``ignore`` still holds."""
    import sys
    import warnings

    try:
        warnings.warn(message, RuntimeWarning, stacklevel=4)
    except Exception:  # noqa: BLE001 - the warning as an error: never into the engine
        try:
            frame = sys._getframe(3)
            where = (frame.f_code.co_filename, frame.f_lineno)
        except ValueError:
            where = (__file__, 0)
        try:
            warnings.showwarning(RuntimeWarning(message), RuntimeWarning, *where)
        except Exception:  # noqa: BLE001 - nowhere to show it: it is in `errors`
            pass


def each_sink(sinks: list, call: Callable) -> None:
    """``call(sink)`` for every instrumentation, even where one raises (a ``strict`` one's
    failed recording): each gets the capture. Then the first error is raised; a later
    one, which cannot be raised beside it, is kept in its instrumentation's ``errors`` and
    warned, as for one that is not strict, and noted on the raised exception (Python
    3.11+: ``add_note``). An interrupt or exit goes at once."""
    raised: list = []  # (instrumentation, exception)
    for sink in sinks:
        try:
            call(sink)
        except BaseException as e:  # noqa: BLE001 - the others still get the capture
            if fatal(e):
                raise
            raised.append((sink, e))
    if not raised:
        return
    first = raised[0][1]
    for sink, other in raised[1:]:
        if other is first:  # one failure (the graph's walk) raised by several: raised once
            continue
        sink.errors.append(other)
        warn(f"graphcheck: a capture was not recorded: {other} (not raised: another "
             f"instrumentation's error was, {type(first).__name__}: {first})")
        add_note = getattr(first, "add_note", None)
        if add_note is not None:
            try:
                add_note(f"graphcheck: another instrumentation failed at this capture too "
                         f"(kept in its errors): {type(other).__name__}: {other}")
            except Exception:  # noqa: BLE001 - the note is a courtesy: the warning said it
                pass
    raise first


# The manifest files this process's instrumentations write (absolute paths): each
# instrumentation claims its own at its first write, for the life of the process, so that
# none overwrites another's (one stopped before included).
_CLAIMED: set = set()


def claim_manifest_path(directory: str) -> tuple:
    """The manifest file of an instrumentation writing into ``directory``, claimed for it,
    and which instrumentation of this process into that folder it is (1, 2…):
    ``<directory>/graphcheck-<rank>-<pid>.json`` for the first,
    ``<directory>/instrumentation-<n>/graphcheck-<rank>-<pid>.json`` for the n-th. A folder
    so holds at most one manifest of each process, as ``graphcheck verify DIR`` takes a
    run (one manifest per rank): the first instrumentations of every rank's process are
    one run, the second ones another. The caller holds the instrumentation lock."""
    rank, _ = rank_and_world()
    name = f"graphcheck-{rank}-{os.getpid()}.json"
    n = 1
    while True:
        folder = directory if n == 1 else os.path.join(directory, f"instrumentation-{n}")
        path = os.path.join(folder, name)
        key = os.path.abspath(path)
        if key not in _CLAIMED:
            _CLAIMED.add(key)
            return path, n
        n += 1


def force_keep_graph(args: tuple, kwargs: dict, keep: bool = True) -> tuple:
    """``CUDAGraph(...)``'s arguments with ``keep_graph=True`` where ``keep`` (else as the
    caller gave them), and what the caller asked."""
    kwargs = dict(kwargs)
    if args:
        asked = bool(args[0])
        args = (asked or keep,) + tuple(args[1:])
    else:
        asked = bool(kwargs.pop("keep_graph", False))
        args = (asked or keep,)
    return args, kwargs, asked


def current_stream() -> int:
    """torch's current CUDA stream on the current device, as the ``CUstream`` integer the
    driver takes (``torch.cuda.Stream.cuda_stream``): where ``capture_begin`` captures."""
    return int(import_torch().cuda.current_stream().cuda_stream)


_MISSING = object()


def _name_of(obj) -> str:
    """``module.qualname`` of a class or function, a module's name; else its type's name
    (a message's word for it, reading nothing that could raise into the engine)."""
    try:
        if isinstance(obj, types.ModuleType):
            return obj.__name__
        qualname = getattr(obj, "__qualname__", None)
        module = getattr(obj, "__module__", None)
        if isinstance(qualname, str):
            return f"{module}.{qualname}" if isinstance(module, str) else qualname
    except Exception:  # noqa: BLE001 - an object whose attributes raise: its type
        pass
    return f"a {type(obj).__name__}"


def restore(patched: list) -> None:
    """Puts back what a patch replaced: ``patched`` holds ``(owner, attribute, original,
    installed)``, the latest last, and is emptied. An attribute that no longer holds what
    was installed there (something replaced it since: another tool's patch, a test's
    monkeypatch, a deletion) is left as it is, with a warning naming what it holds:
    putting the original back would undo that replacement."""
    while patched:
        owner, attr, original, installed = patched.pop()
        # The owner's own dict: what setattr changed, not what its bases hold.
        current = vars(owner).get(attr, _MISSING)
        if current is installed:
            setattr(owner, attr, original)
            continue
        found = "nothing (it was deleted)" if current is _MISSING else _name_of(current)
        warn(
            f"graphcheck: uninstrument() left {_name_of(owner)}.{attr} as it is: it holds "
            f"{found}, not what graphcheck installed there; something replaced it since, "
            f"and putting back the original ({_name_of(original)}) would undo that"
        )
