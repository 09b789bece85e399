"""Patching torch and putting it back: ``torch.cuda.CUDAGraph`` becomes a subclass that
walks each capture while it is open (or its kept template, where an instrumentation keeps
templates), hands it to the live instrumentations at ``capture_end`` and checks a replay
after a transition; and the process-wide state of
that patch (the live instrumentations, what it replaced, the lock over them)."""

from __future__ import annotations

import threading

from .. import _native, _sleep_state
from .._native import GraphcheckError
from .._recorder import fatal, walk_graph
from .._torch_import import import_torch
from . import transitions
from .host import current_stream, each_sink, force_keep_graph, restore, warn
from .replay_check import GraphState, ReplayCheckError, before_replay
from .transitions import epoch
from .trees import tree_graph_name, tree_input_shapes, tree_node_of, tree_static_ptrs

__all__ = [
    "ACTIVE",
    "LOCK",
    "PATCHED",
    "instrumented_class",
    "keeps_templates",
    "patch_torch",
    "start",
    "stop",
    "walk_open_capture",
]

#: The live instrumentations, in order; the patch stays while any is live.
ACTIVE: list = []
#: (owner, attribute, original, installed) of what the patch replaced (:func:`host.restore`).
PATCHED: list = []
#: The lock over this state, and over each instrumentation's own.
LOCK = threading.RLock()


def keeps_templates() -> bool:
    """Whether a graph made now keeps its template for graphcheck: where a live
    instrumentation retargets (``keep_templates``); the others walk the graph while its
    capture is still open and leave the template to torch, which destroys it at
    instantiate (about 129 KiB of host memory a graph on the H200)."""
    return any(getattr(ins, "keep_templates", True) for ins in list(ACTIVE))


def instrumented_class(base: type) -> type:
    """A subclass of ``base`` (``torch.cuda.CUDAGraph``) that records every capture at
    ``capture_end``.

    A graph walks its own capture before it ends (``_native.capturing_graph`` on the
    stream ``capture_begin`` captured on), and torch then instantiates it and destroys the
    template as it would have. Where an instrumentation keeps templates (for retarget),
    ``__new__`` and ``__init__`` both pass ``keep_graph=True`` instead: torch's
    ``CUDAGraph.__new__`` takes it for the Python side and the C++ ``_CUDAGraph.__init__``
    for the graph itself (seen on the H200; passing it to one alone is not enough); the
    kept template is walked after ``capture_end`` and then instantiated."""

    class CUDAGraph(base):
        __doc__ = base.__doc__
        _graphcheck_base = base

        def __new__(cls, *args, **kwargs):
            keep = keeps_templates()
            args, kwargs, _ = force_keep_graph(args, kwargs, keep)
            parent = super().__new__
            obj = parent(cls) if parent is object.__new__ else parent(cls, *args, **kwargs)
            obj._graphcheck_template = keep  # __init__ passes the same
            return obj

        def __init__(self, *args, **kwargs):
            keep = getattr(self, "_graphcheck_template", None)
            if keep is None:  # no __new__ of ours ran
                keep = keeps_templates()
            args, kwargs, asked = force_keep_graph(args, kwargs, keep)
            super().__init__(*args, **kwargs)
            # keep_graph=True asked by the caller: they instantiate (or replay does).
            self._graphcheck_keep = asked
            # The template is torch's to keep (asked), or graphcheck's (kept for retarget):
            # else it is walked while the capture is open.
            self._graphcheck_template = keep or asked
            self._graphcheck_pool = None
            # The transition epoch this graph was last checked at (replay_check), and what
            # the check keeps of it (None: not recorded).
            self._graphcheck_epoch = epoch()
            self._graphcheck_state = None

        def capture_begin(self, *args, **kwargs):
            pool = args[0] if args else kwargs.get("pool")
            self._graphcheck_pool = pool
            # A graph of torch.compile's CUDA-graph trees: the tree node recording it, found
            # once on the calling frames, and the shapes of its batch inputs (cleared from
            # the node by capture_end); held until capture_end only.
            self._graphcheck_tree: tuple = (None, None)
            # The capture's stream, or why it could not be read (capture_end walks there).
            self._graphcheck_stream: int | str | None = None
            try:
                if ACTIVE:
                    node, inputs = tree_node_of(self)
                    if node is not None:
                        self._graphcheck_tree = (node, tree_input_shapes(node, inputs))
            except Exception:  # noqa: BLE001 - a name without shapes, never a failed capture
                pass
            if ACTIVE and not getattr(self, "_graphcheck_template", True):
                try:  # torch captures on the current stream
                    self._graphcheck_stream = current_stream()
                except Exception as e:  # noqa: BLE001 - said at capture_end, as not walked
                    # The message, not the exception: its traceback would hold the graph.
                    self._graphcheck_stream = f"{type(e).__name__}: {e}"
            return super().capture_begin(*args, **kwargs)

        def capture_end(self):
            walked = None
            try:
                if ACTIVE and not getattr(self, "_graphcheck_template", True):
                    walked = walk_open_capture(self)
            finally:  # the capture ends whatever the walk did (an interrupt included)
                self._graphcheck_stream = None
                super().capture_end()
            try:
                on_capture(self, walked)
            finally:
                self._graphcheck_epoch = epoch()
                if getattr(self, "_graphcheck_template", True) and not getattr(
                    self, "_graphcheck_keep", False
                ):
                    self.instantiate()

        def replay(self):
            # Nothing pending: one attribute read, one call and one comparison.
            if self._graphcheck_epoch != epoch():
                check_before_replay(self)
            return super().replay()

    CUDAGraph.__qualname__ = f"graphcheck.{base.__qualname__}"
    return CUDAGraph


def walk_open_capture(cuda_graph):
    """The walk of the graph ``cuda_graph`` is capturing, before its capture ends: a
    ``_native.Walked``, or the exception that stopped it (reported by :func:`on_capture`
    once the capture has ended; never raised into the capture)."""
    stream = getattr(cuda_graph, "_graphcheck_stream", None)
    try:
        if isinstance(stream, str):
            raise GraphcheckError(f"the capture's stream could not be read at capture_begin: {stream}")
        if stream is None:
            raise GraphcheckError("the capture began before instrument(): its stream is not known")
        return walk_graph(_native.capturing_graph(stream))
    except BaseException as e:  # noqa: BLE001 - reported after the capture ends
        if fatal(e):
            raise
        return e


def check_before_replay(cuda_graph) -> None:
    """The replay check (:func:`.replay_check.before_replay`) of a graph whose epoch is
    behind. A :class:`ReplayCheckError` goes to the caller, as asked; any other failure of
    the check is kept in ``errors`` and warned, and the replay goes ahead."""
    with LOCK:
        sinks = [ins for ins in ACTIVE if ins._checker is not None]
    state = getattr(cuda_graph, "_graphcheck_state", None)
    if not sinks or state is None:
        cuda_graph._graphcheck_epoch = epoch()
        return
    try:
        before_replay(cuda_graph, state, sinks)
    except ReplayCheckError:
        raise
    except BaseException as e:  # noqa: BLE001 - a broken check never stops the engine
        if fatal(e):
            raise
        cuda_graph._graphcheck_epoch = epoch()
        for ins in sinks:
            ins.errors.append(e)
        warn(f"graphcheck: the check before replay failed, replaying unchecked: {e}")


def on_capture(cuda_graph, walked=None) -> None:
    """Hands a graph to every live instrumentation at ``capture_end``: ``walked`` as
    :func:`walk_open_capture` gave it (a walk, or why there is none), else the kept
    template walked now."""
    with LOCK:
        sinks = list(ACTIVE)
        if any(ins._checker is not None for ins in sinks):
            transitions.patch(PATCHED)  # torch_memory_saver or vLLM imported since instrument()
    if not sinks:
        return
    # A graph of torch.compile's CUDA-graph trees: its name and the static inputs torch
    # guards come from the tree node recording it.
    node, shapes = getattr(cuda_graph, "_graphcheck_tree", (None, None))
    cuda_graph._graphcheck_tree = (None, None)
    state = GraphState()
    hint = None
    if node is not None:
        hint = tree_graph_name(node, shapes)
        state.static_ptrs = tree_static_ptrs(node)
        state.tree = hint
    cuda_graph._graphcheck_state = state
    pool = getattr(cuda_graph, "_graphcheck_pool", None)
    if pool is None:
        try:
            pool = cuda_graph.pool()
        except Exception:  # noqa: BLE001 - a graph without a pool: none recorded
            pool = None
    try:
        if isinstance(walked, BaseException):
            raise walked
        if walked is None:
            if not getattr(cuda_graph, "_graphcheck_template", True):
                raise GraphcheckError(
                    "the graph was not walked while its capture was open (instrument() "
                    "began during the capture), and torch keeps no template to walk"
                )
            walked = walk_graph(cuda_graph.raw_cuda_graph())
    except BaseException as e:  # noqa: BLE001 - reported by each sink
        if fatal(e):
            raise
        each_sink(sinks, lambda sink: sink._failed(e))
        return
    each_sink(sinks, lambda sink: sink._record(walked, pool, state=state, hint=hint))


def patch_torch() -> None:
    """Replaces ``torch.cuda.CUDAGraph`` (and ``torch.cuda.graphs.CUDAGraph``) with the
    recording subclass; what it replaced goes into :data:`PATCHED`. The caller holds
    :data:`LOCK`."""
    torch = import_torch()
    if PATCHED:
        return
    graphs = getattr(torch.cuda, "graphs", None)
    found = torch.cuda.CUDAGraph
    if getattr(found, "_graphcheck_base", None) is None:
        original, cls = found, instrumented_class(found)
    elif "_graphcheck_base" in vars(found):
        # Ours, put back by someone else after an uninstrument left their replacement (see
        # host.restore): recorded as this patch, so that the next uninstrument puts torch's
        # class back.
        original, cls = found._graphcheck_base, found
    else:
        # A class derived from ours, someone else's, left in place by an uninstrument: its
        # captures record already (a second subclass would record twice), and it stays.
        return
    for module in (torch.cuda, graphs):
        if module is not None and getattr(module, "CUDAGraph", None) is found:
            PATCHED.append((module, "CUDAGraph", original, cls))
            setattr(module, "CUDAGraph", cls)


def start(ins, with_replay_check: bool) -> None:
    """Makes ``ins`` live: torch patched (and the transitions a replay check sees, where
    it has one), the sleep allocator's wake hook in place. The caller holds :data:`LOCK`."""
    patch_torch()
    if with_replay_check:
        transitions.patch(PATCHED)
    _sleep_state.add_wake_hook(transitions.after_wake)
    ACTIVE.append(ins)


def stop(instrumentation=None) -> None:
    """Flushes and stops one live instrumentation (``None``: every one); when none is left,
    puts back what the patch replaced and takes the wake hook away."""
    with LOCK:
        stopping = list(ACTIVE) if instrumentation is None else [instrumentation]
    for ins in stopping:
        try:
            ins.flush()
        finally:  # its writer thread lets go of it, even where a strict flush raised
            ins._writer.close()
    with LOCK:
        if instrumentation is None:
            ACTIVE.clear()
        elif instrumentation in ACTIVE:
            ACTIVE.remove(instrumentation)
        if not ACTIVE:
            restore(PATCHED)
            _sleep_state.remove_wake_hook(transitions.after_wake)
