"""Instrumentation: record every CUDA graph capture of the process with no change to the
engine's code (:func:`instrument`, :func:`register_model`). ``torch.cuda.CUDAGraph`` is
patched with a subclass that keeps the graph template and records at ``capture_end``.

The process-wide state (the live instrumentations, the roots named before any, what the
patch replaced, and the lock over them) lives here and nowhere else.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import warnings
import weakref
from typing import Callable, Iterable, Optional, Union

from .. import _args, _discover, _native
from .._native import GraphcheckError
from .._recorder import Recorder, _fatal, _OwnersNotCurrent, _walk_graph
from . import replay_check as _guard
from . import transitions as _transitions
from .host import (
    _claim_manifest_path,
    _each_sink,
    _force_keep_graph,
    _rank_and_world,
    _restore,
    _warn,
)
from .._registry import _torch
from .._walk import DEFAULT_MAX_DEPTH, root_arg

#: The environment variable that turns :func:`instrument` on for a whole process tree.
ENV_DIR = "GRAPHCHECK_DIR"

# Roots register_model() named while no instrumentation was on: the next instrument()
# takes them. (root, object or weak reference)
_PENDING_ROOTS: list = []
# The live instrumentations, in order; the patch stays while any is live.
_ACTIVE: list = []
# (owner, attribute, original, installed) of what the patch replaced (host._restore).
_PATCHED: list = []
_LOCK = threading.RLock()


_NOT_WRITTEN = "the manifest was not written (the captures are kept; the next write retries)"


def _instrumented_class(base: type) -> type:
    """A subclass of ``base`` (``torch.cuda.CUDAGraph``) that keeps the graph template,
    records every capture at ``capture_end`` and then instantiates as ``base`` would have.

    ``__new__`` and ``__init__`` both pass ``keep_graph=True``: torch's ``CUDAGraph.__new__``
    takes it for the Python side and the C++ ``_CUDAGraph.__init__`` for the graph itself
    (seen on the H200; passing it to one alone is not enough)."""

    class CUDAGraph(base):
        __doc__ = base.__doc__
        _graphcheck_base = base

        def __new__(cls, *args, **kwargs):
            args, kwargs, _ = _force_keep_graph(args, kwargs)
            parent = super().__new__
            if parent is object.__new__:
                return parent(cls)
            return parent(cls, *args, **kwargs)

        def __init__(self, *args, **kwargs):
            args, kwargs, asked = _force_keep_graph(args, kwargs)
            super().__init__(*args, **kwargs)
            # keep_graph=True asked by the caller: they instantiate (or replay does).
            self._graphcheck_keep = asked
            self._graphcheck_pool = None
            # The transition epoch this graph was last checked at (_guard), and what the
            # check keeps of it (None: not recorded).
            self._graphcheck_epoch = _guard._STATE[0]
            self._graphcheck_state = None

        def capture_begin(self, *args, **kwargs):
            pool = args[0] if args else kwargs.get("pool")
            self._graphcheck_pool = pool
            # A graph of torch.compile's CUDA-graph trees: the tree node recording it, found
            # once on the calling frames, and the shapes of its batch inputs (cleared from
            # the node by capture_end); held until capture_end only.
            self._graphcheck_tree = (None, None)
            try:
                if _ACTIVE:
                    node, inputs = _guard.tree_node_of(self)
                    if node is not None:
                        self._graphcheck_tree = (node, _guard.tree_input_shapes(node, inputs))
            except Exception:  # noqa: BLE001 - a name without shapes, never a failed capture
                pass
            return super().capture_begin(*args, **kwargs)

        def capture_end(self):
            super().capture_end()
            try:
                _on_capture(self)
            finally:
                self._graphcheck_epoch = _guard._STATE[0]
                if not getattr(self, "_graphcheck_keep", False):
                    self.instantiate()

        def replay(self):
            # Nothing pending: one attribute read and one comparison.
            if self._graphcheck_epoch != _guard._STATE[0]:
                _check_before_replay(self)
            return super().replay()

    CUDAGraph.__qualname__ = f"graphcheck.{base.__qualname__}"
    return CUDAGraph


def _check_before_replay(cuda_graph) -> None:
    """The replay check (_guard.before_replay) of a graph whose epoch is behind. A
    :class:`_guard.ReplayCheckError` goes to the caller, as asked; any other failure of the
    check is kept in ``errors`` and warned, and the replay goes ahead."""
    with _LOCK:
        sinks = [ins for ins in _ACTIVE if ins._checker is not None]
    state = getattr(cuda_graph, "_graphcheck_state", None)
    if not sinks or state is None:
        cuda_graph._graphcheck_epoch = _guard._STATE[0]
        return
    try:
        _guard.before_replay(cuda_graph, state, sinks)
    except _guard.ReplayCheckError:
        raise
    except BaseException as e:  # noqa: BLE001 - a broken check never stops the engine
        if _fatal(e):
            raise
        cuda_graph._graphcheck_epoch = _guard._STATE[0]
        for ins in sinks:
            ins.errors.append(e)
        _warn(f"graphcheck: the check before replay failed, replaying unchecked: {e}")


def _on_capture(cuda_graph) -> None:
    with _LOCK:
        sinks = list(_ACTIVE)
        if any(ins._checker is not None for ins in sinks):
            _transitions.patch(_PATCHED)  # torch_memory_saver imported since instrument()
    if not sinks:
        return
    # A graph of torch.compile's CUDA-graph trees: its name and the static inputs torch
    # guards come from the tree node recording it.
    node, shapes = getattr(cuda_graph, "_graphcheck_tree", (None, None))
    cuda_graph._graphcheck_tree = (None, None)
    state = _guard.GraphState()
    hint = None
    if node is not None:
        hint = _guard.tree_graph_name(node, shapes)
        state.static_ptrs = _guard.tree_static_ptrs(node)
        state.tree = hint
    cuda_graph._graphcheck_state = state
    pool = getattr(cuda_graph, "_graphcheck_pool", None)
    if pool is None:
        try:
            pool = cuda_graph.pool()
        except Exception:  # noqa: BLE001 - a graph without a pool: none recorded
            pool = None
    try:
        walked = _walk_graph(cuda_graph.raw_cuda_graph())
    except BaseException as e:  # noqa: BLE001 - reported by each sink
        if _fatal(e):
            raise
        _each_sink(sinks, lambda sink: sink._failed(e))
        return
    _each_sink(sinks, lambda sink: sink._record(walked, pool, state=state, hint=hint))


#: The writer thread writes once no capture came for this long (seconds): a burst of
#: captures is built and written once, at its end.
WRITE_QUIET_S = 0.2

#: How long :meth:`Instrumentation.flush` (at exit too) waits for the writer thread
#: (seconds); a writer stuck past it (a hung file system) is reported and left behind.
FLUSH_WAIT_S = 120.0


def _built(frozen: list) -> str:
    """The manifest of ``frozen`` ([captures, manifest or Frozen, epoch]) as JSON text,
    built from its facts at the first ask and kept."""
    value = frozen[1]
    if isinstance(value, str):
        return value
    text = Recorder.build_frozen(value)
    frozen[1] = text  # one list item stored: another thread sees the facts or the text
    return text


class Instrumentation:
    """What :func:`instrument` returns: the recorder every capture of the process goes
    into, and the manifest file it writes (``path``, ``None`` until the first capture or
    without a directory). A context manager: leaving it uninstruments."""

    def __init__(
        self,
        directory,
        *,
        name: Union[str, Callable[[int], str]],
        strict: bool,
        recorder_args: dict,
        write_every: int = 1,
        verify_on_replay: Optional[str] = None,
        discover: bool = True,
    ):
        write_every = _args.integer("write_every", write_every, minimum=1)
        self.directory = None if directory is None else _args.path("directory", directory)
        if self.directory is not None and os.path.exists(self.directory) and not os.path.isdir(
            self.directory
        ):
            # Found at the first write otherwise, after the captures it should have kept.
            raise GraphcheckError(
                f"directory {self.directory!r} exists and is not a folder: instrument() "
                "writes its manifests into a folder (made if missing)"
            )
        #: Rewrite the manifest after every this many captures (and at exit): rebuilding it
        #: costs more as graphs accumulate, and an engine may capture dozens.
        self.write_every = write_every
        self._unwritten = 0
        self.name = name
        self.strict = strict
        self._recorder_args = recorder_args
        self.recorder = Recorder(None, **recorder_args)
        self.path: Optional[str] = None
        #: Captures recorded, and errors met (when not ``strict``), in this process.
        self.captures = 0
        self.errors: list = []
        self._pid = os.getpid()
        #: The replay check (``verify_on_replay``), or None.
        self._checker = (
            None if verify_on_replay is None else _guard.Checker(self, verify_on_replay)
        )
        # Graph name -> _guard.GraphState, for the graphs this instrumentation recorded.
        self._states: dict = {}
        #: Graphs the last :func:`check` left out: torch will not replay them again.
        self.superseded: list = []
        # [captures, manifest, epoch] of the latest capture: the manifest as JSON text, or
        # the facts it is built from (Frozen) until something asks for it (None: built
        # when asked, from the facts of then).
        self._frozen: Optional[list] = None
        # The writer thread and what it has to write: manifests of the first `_want`
        # captures asked for, of the first `_done` written (see _write_later).
        self._writer: Optional[threading.Thread] = None
        self._cv = threading.Condition()
        self._want = self._done = 0
        self._urgent = False
        self.discover = discover
        #: Root names discovery chose (zero-code attach), empty where roots were named.
        self.discovered: list = []

    # Recording ----------------------------------------------------------------------

    def _fork_check(self) -> None:
        """A forked child starts its own manifest: the parent's graphs are not its own."""
        if os.getpid() != self._pid:
            roots = self.recorder._roots
            self.recorder = Recorder(None, **self._recorder_args)
            self.recorder._roots = list(roots)
            self.path, self.captures, self.errors, self._pid = None, 0, [], os.getpid()
            self._frozen = None
            # The parent's writer thread is not in the child.
            self._writer, self._cv, self._want, self._done = None, threading.Condition(), 0, 0
            self._urgent = False

    def _graph_name(self, hint: Optional[str] = None) -> str:
        if callable(self.name):
            return str(self.name(self.captures))
        if hint is not None and self.name == DEFAULT_NAME:
            return hint
        return self.name.format(index=self.captures, pid=os.getpid())

    def _discover_roots(self) -> None:
        """Zero-code attach (:mod:`graphcheck._discover`): at the first capture of an
        instrumentation with no root, the top-level modules alive become its roots."""
        if not self.discover or self.discovered or self.recorder._roots:
            return
        self.discover = False  # once: a process with no module stays bare
        try:
            found = _discover.discover(_torch())
        except Exception as e:  # noqa: BLE001 - the graph is recorded bare instead
            self._failed(e, f"the model could not be discovered (graphs are recorded without owners): {e}")
            return
        for root, module in found or ():
            self.recorder.add_root(module, root, weak=True)
            self.discovered.append(root)

    def _tree_states(self) -> dict:
        """Graph name -> state, for the graphs of torch.compile's CUDA-graph trees."""
        return {n: s for n, s in self._states.items() if s.static_ptrs}

    def _record(self, walked, pool, state=None, hint: Optional[str] = None) -> None:
        # A graph the recorder took counts as recorded even where what follows fails (its
        # owners' walk, the write): the warning says what was lost, and no more.
        later: list = []
        try:
            with _LOCK:
                self._fork_check()
                name = self._graph_name(hint)
                self._discover_roots()
                try:
                    self.recorder.add_graph(name, walked, pool=pool)
                except _OwnersNotCurrent as e:
                    later.append((e, str(e)))
                if state is not None:
                    state.names[id(self)] = name
                    state.learn_paths(self.recorder.registry)
                    self._states[name] = state
                    if state.static_ptrs:
                        self.recorder.guard_graph(
                            name, [(p, state.static_paths.get(p, ())) for p in state.static_ptrs]
                        )
                self.captures += 1
                # The facts of the manifest are read now, while the allocator, the owners
                # and the contents are the capture's: one built after a wake would digest
                # the poison, and after a step would see a freed intermediate as free
                # memory. The manifest is built from them when a write or a check asks
                # (with digests, now: the ranges no owner explains are digested at the
                # build). A directory with write_every > 1 (and no check or digest asking
                # for capture-time facts) reads them at the captures it writes at only.
                if (
                    self.directory is None
                    or self._unwritten + 1 >= self.write_every
                    or self._checker is not None
                    or self.recorder.digests
                ):
                    try:
                        built = self._build_json() if self.recorder.digests else self._freeze()
                        self._frozen = [self.captures, built, _guard.epoch()]
                    except BaseException as e:  # noqa: BLE001 - built when asked instead
                        if _fatal(e):
                            raise
                        # Said already where it matters (a failed owner walk above); a
                        # write or a check builds it again and says so if it fails.
                        self._frozen = None
                self._unwritten += 1
                if self.directory is not None and self._unwritten >= self.write_every:
                    try:
                        self._write_later()
                    except BaseException as e:  # noqa: BLE001 - a panic too
                        if _fatal(e):
                            raise
                        later.append((e, f"{_NOT_WRITTEN}: {e}"))
        except BaseException as e:  # noqa: BLE001 - a panic too, never into the engine
            if _fatal(e):
                raise
            self._failed(e)
        for e, message in later:
            self._failed(e, message)

    def _failed(self, e: BaseException, message: Optional[str] = None) -> None:
        """Keeps a recording failure in :attr:`errors` and warns (``strict``: raises it).
        ``message`` says what was lost (default: the capture, for ``e``)."""
        if self.strict:
            raise e
        self.errors.append(e)
        _warn(f"graphcheck: {message or f'a capture was not recorded: {e}'}")

    # Output -------------------------------------------------------------------------

    def manifest_path(self) -> Optional[str]:
        """``<directory>/graphcheck-<rank>-<pid>.json``, fixed at the first write; where
        another instrumentation of this process wrote into the directory before,
        ``<directory>/instrumentation-<n>/graphcheck-<rank>-<pid>.json`` for the n-th, with
        a warning saying so (:func:`instrument`)."""
        with _LOCK:
            if self.path is None and self.directory is not None:
                self.path, n = _claim_manifest_path(self.directory)
                if n > 1:
                    _warn(
                        f"graphcheck: an earlier instrumentation of this process has its "
                        f"manifest in {self.directory!r}; this one writes {self.path!r} "
                        "(each folder holds one manifest per process, as `graphcheck verify "
                        "DIR` takes a run: verify the folders one by one)"
                    )
            return self.path

    def manifest_json(self) -> str:
        """The manifest of every capture recorded so far in this process, as JSON text:
        as built at the latest capture (the facts of then), else built now."""
        return self._manifest_and_epoch()[0]

    def _manifest_and_epoch(self) -> tuple:
        """The manifest and the transition epoch its facts (digests) are of."""
        with _LOCK:
            self._fork_check()
            frozen = self._frozen
            if frozen is None or frozen[0] != self.captures:
                return self._build_json(), _guard.epoch()
        return _built(frozen), frozen[2]

    def _producer_rank(self) -> None:
        rank, world = _rank_and_world()
        self.recorder.producer.setdefault("rank", rank)
        self.recorder.producer.setdefault("world_size", world)

    def _freeze(self):
        with _LOCK:
            self._producer_rank()
            return self.recorder.freeze()

    def _build_json(self) -> str:
        with _LOCK:
            self._producer_rank()
            return self.recorder.manifest_json()

    def _write_later(self) -> None:
        """Has the writer thread write the manifest of the latest capture: the build (the
        core's part without the GIL) and the write leave the capture path, and a writer
        still busy when more captures come writes only the latest once done. A manifest
        not frozen at this capture, or ``strict``, is written here and now."""
        frozen = self._frozen
        if self.strict or frozen is None or frozen[0] != self.captures:
            self.write()
            return
        self.manifest_path()
        self._unwritten = 0
        with self._cv:
            self._want = max(self._want, frozen[0])
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_loop, name="graphcheck-writer", daemon=True
                )
                try:
                    self._writer.start()
                except BaseException:
                    # No thread to wait for (a process out of threads): flush writes it,
                    # and the next capture tries a thread again.
                    self._writer = None
                    self._unwritten = max(self._unwritten, 1)
                    raise
            self._cv.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while self._want <= self._done:
                    if not self._cv.wait(timeout=5.0) and self._want <= self._done:
                        self._writer = None  # idle: the next capture starts another
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
            with _LOCK:
                frozen, path = self._frozen, self.path
            try:
                if frozen is None:  # the latest capture's facts could not be read
                    raise GraphcheckError("the facts of the latest capture were not read")
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                _native.write_atomic(path, _built(frozen).encode())
            except BaseException as e:  # noqa: BLE001 - a panic too, never into the engine
                if not _fatal(e):
                    with _LOCK:
                        self._unwritten = max(self._unwritten, 1)  # flush tries again
                    self._failed(e, f"{_NOT_WRITTEN}: {e}")
            with self._cv:
                self._done = max(self._done, asked if frozen is None else frozen[0])
                self._cv.notify_all()

    def _wait_for_writer(self, timeout: Optional[float] = None) -> bool:
        """Has the writer thread write what it was asked to now, and waits until it did
        (at most ``timeout``, default :data:`FLUSH_WAIT_S`); returns whether it did."""
        with self._cv:
            self._urgent = True
            self._cv.notify_all()
            try:
                return self._cv.wait_for(
                    lambda: self._done >= self._want or self._writer is None,
                    FLUSH_WAIT_S if timeout is None else timeout,
                )
            finally:
                self._urgent = False

    def manifest(self) -> dict:
        """The manifest of every capture recorded so far in this process."""
        return json.loads(self.manifest_json())

    def write(self, path=None) -> str:
        """Writes the manifest atomically (to ``path``, or :meth:`manifest_path`); returns
        the path."""
        target = _args.path("path", path) if path is not None else self.manifest_path()
        if target is None:
            raise GraphcheckError("instrument() has no directory: pass write() a path")
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        # Compact JSON straight from the core: no Python parse and dump after every capture.
        _native.write_atomic(target, self.manifest_json().encode())
        if path is None:
            self._unwritten = 0
        return target

    def flush(self) -> Optional[str]:
        """Writes the manifest if captures were recorded since the last write (with a
        directory); returns the path written, if any. Runs at interpreter exit, and when
        the instrumentation stops."""
        if os.getpid() != self._pid:
            return None
        if not self._wait_for_writer():
            self._failed(
                GraphcheckError(f"the writer thread did not finish in {FLUSH_WAIT_S:g} s"),
                f"the manifest of the latest captures may not be written: the writer thread "
                f"was still busy after {FLUSH_WAIT_S:g} s (a stalled file system?)",
            )
        with _LOCK:
            # Addresses the recorder's walks left waiting (Recorder.catch_up): walked for
            # now, and the manifest built again with what that walk found.
            try:
                if self.recorder.catch_up():
                    self._frozen = None
                    self._unwritten = max(self._unwritten, 1)
            except BaseException as e:  # noqa: BLE001 - the manifest is written without it
                if _fatal(e):
                    raise
                self._failed(e, f"the walk for the addresses left waiting failed: {e}")
        if self.directory is None or self._unwritten == 0:
            return None
        try:
            return self.write()
        except BaseException as e:  # noqa: BLE001 - reported like a failed recording
            if _fatal(e):
                raise
            self._failed(e, f"{_NOT_WRITTEN}: {e}")
            return None

    def register_model(self, model, root: str = "model") -> None:
        """Adds a root to this instrumentation's walks (held weakly); a root of the same
        name is replaced (a model loaded again)."""
        root_arg("model", model)
        with _LOCK:
            rec = self.recorder
            self._frozen = None  # the next manifest walks the new root
            # A root named explicitly replaces the discovered ones.
            gone = set(self.discovered) | {root}
            self.discovered = []
            self.discover = False
            rec._roots = [(r, x) for r, x in rec._roots if r not in gone]
            if rec.root in gone:
                rec.model = None
            rec.add_root(model, root, weak=True)

    def close(self) -> None:
        """Stops this instrumentation; the patch goes when no other is live."""
        uninstrument(self)

    def __enter__(self) -> "Instrumentation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _patch_torch() -> None:
    torch = _torch()
    if _PATCHED:
        return
    graphs = getattr(torch.cuda, "graphs", None)
    found = torch.cuda.CUDAGraph
    if getattr(found, "_graphcheck_base", None) is None:
        original, cls = found, _instrumented_class(found)
    elif "_graphcheck_base" in vars(found):
        # Ours, put back by someone else after an uninstrument left their replacement (see
        # _restore): recorded as this patch, so that the next uninstrument puts torch's
        # class back.
        original, cls = found._graphcheck_base, found
    else:
        # A class derived from ours, someone else's, left in place by an uninstrument: its
        # captures record already (a second subclass would record twice), and it stays.
        return
    for module in (torch.cuda, graphs):
        if module is not None and getattr(module, "CUDAGraph", None) is found:
            _PATCHED.append((module, "CUDAGraph", original, cls))
            setattr(module, "CUDAGraph", cls)


#: Graph names where nothing better is known; a torch.compile tree graph is named by its
#: tree instead (``inductor_fn0_graph1[8x256]``).
DEFAULT_NAME = "capture{index}"


def instrument(
    directory=None,
    *,
    model=None,
    root: str = "model",
    name: Union[str, Callable[[int], str]] = DEFAULT_NAME,
    digests: Union[bool, str] = False,
    runtime_state: Iterable[str] = (),
    max_depth: int = DEFAULT_MAX_DEPTH,
    strict: bool = False,
    write_every: int = 1,
    verify_on_replay: Union[None, bool, str] = None,
    discover: bool = True,
) -> Instrumentation:
    """Records every CUDA graph capture of the process, with no change to the engine's
    code: ``torch.cuda.CUDAGraph`` (and ``torch.cuda.graphs.CUDAGraph``) become a subclass
    that keeps the graph template (``keep_graph=True``), walks it at ``capture_end`` and
    then instantiates it, so ``with torch.cuda.graph(g, pool=pool):`` and direct
    ``capture_begin``/``capture_end`` callers work unchanged. Code that bound the class
    before (``from torch.cuda import CUDAGraph``) is not reached: instrument first.

    ``directory`` (``None``, the default: ``$GRAPHCHECK_DIR`` where it is set, else the
    manifest is kept in memory; ``False``: in memory whatever that variable says)
    receives one manifest per process and rank, ``graphcheck-<rank>-<pid>.json``,
    rewritten atomically after every capture. A second instrumentation of the process
    writing into the same directory (one stopped before counts) writes
    ``instrumentation-2/graphcheck-<rank>-<pid>.json`` there instead, the n-th
    ``instrumentation-<n>/``, with a warning: none overwrites another's manifest, and each
    folder stays one run for ``graphcheck verify DIR`` (one manifest per rank). The
    capture reads what the manifest needs (owners, the allocator's segments, pools) and a
    writer thread builds and writes it:
    the capture does not wait, and a burst of captures (none for 0.2 s after the last) is
    written once, as the latest (``strict=True`` writes at the capture); :meth:`Instrumentation.flush`
    waits for it, and runs when the instrumentation stops and at exit. ``name`` names the
    graphs: a format string with ``{index}`` (and ``{pid}``) or a callable of the index.

    Owners: a capture has no model argument. ``model`` (under ``root``) and every
    :func:`register_model` root are walked at the first capture, again after a root is
    added, and again at any capture that reads an address the recorder cannot explain
    without a walk (:class:`Recorder`); without any, graphs are recorded with no owners and
    every address they hold is bare (``unowned`` at verify). A recording failure warns (``RuntimeWarning``) and is
    kept in ``errors``; the capture itself always completes. ``strict=True`` raises
    instead, once every live instrumentation got the capture (the first error; a later
    strict one's is kept in its ``errors`` and warned). ``write_every=N`` rewrites the file after every N captures instead of every
    one (an engine capturing dozens of graphs pays the rebuild N times less); what is left
    is written when the instrumentation stops and at interpreter exit. Returns the
    :class:`Instrumentation`; :func:`uninstrument` restores torch. Every wrong argument is
    a :class:`GraphcheckError` naming it, raised before torch is patched.

    ``verify_on_replay`` (default: ``$GRAPHCHECK_VERIFY_ON_REPLAY``, else off) checks
    each graph at its first replay after a transition (:func:`mark_transition`, this
    package's sleep allocator waking, a torch_memory_saver resume,
    ``Module.load_state_dict``): ``"raise"`` (or ``True``) raises
    :class:`ReplayCheckError` before the kernels run when the graph reads memory that
    changed since capture; ``"warn"`` warns and replays. A replay with nothing pending
    costs one comparison.

    With no ``model`` and no :func:`register_model` root, ``discover`` (default on) finds
    the model at the first capture: the top-level ``nn.Module`` objects alive then (none
    another's child) become roots, named by class (``llama_for_causal_lm``; the rule and
    how to override it: :mod:`graphcheck._discover`); :attr:`Instrumentation.discovered`
    lists them.

    Graph names: ``name`` formatted; where ``name`` is the default and the capture is one
    of torch.compile's CUDA-graph trees, the tree's function and graph ids and the shapes
    of the inputs it was recorded for (``inductor_fn0_graph1[8x256]``)."""
    if directory is None:
        directory = os.environ.get(ENV_DIR) or None
    elif directory is False:
        directory = None
    root = _args.text("root", root)
    _native.check_path(root)
    if model is not None:
        root_arg("model", model)
    name = _args.callable_or_text("name", name)
    if isinstance(name, str):
        try:  # a name that does not format would fail at every capture instead
            name.format(index=0, pid=0)
        except (KeyError, IndexError, ValueError) as e:
            raise GraphcheckError(
                f"name is a format string with {{index}} and {{pid}}, or a callable: "
                f"{name!r} does not format ({type(e).__name__}: {e})"
            ) from None
    strict = _args.flag("strict", strict)
    on_replay = _guard.on_findings_arg(verify_on_replay)
    ins = Instrumentation(
        directory,
        name=name,
        strict=strict,
        recorder_args=dict(
            digests=digests,
            # A list, so that a forked child's recorder gets the same globs again.
            runtime_state=_args.strings("runtime_state", runtime_state, "owner-path globs"),
            max_depth=max_depth,
        ),
        write_every=write_every,
        verify_on_replay=on_replay,
        discover=_args.flag("discover", discover),
    )
    atexit.register(ins.flush)
    with _LOCK:
        for r, ref in _PENDING_ROOTS:
            obj = ref() if isinstance(ref, weakref.ref) else ref
            if obj is not None and (model is None or r != root):
                ins.register_model(obj, r)
        if model is not None:
            ins.register_model(model, root)
        _patch_torch()
        if on_replay is not None:
            _transitions.patch(_PATCHED)
        _ACTIVE.append(ins)
    return ins


def uninstrument(instrumentation: Optional[Instrumentation] = None) -> None:
    """Stops one instrumentation (or, without an argument, all of them) and, when none is
    left, restores ``torch.cuda.CUDAGraph`` (and the transitions' methods). Graphs made
    meanwhile keep working (they are instances of the subclass, which keeps instantiating
    them). What something else replaced since graphcheck patched it (another tool's patch,
    a test's monkeypatch) is left as it is, with a ``RuntimeWarning`` naming what is there:
    putting graphcheck's original back would undo that replacement."""
    if instrumentation is not None and not isinstance(instrumentation, Instrumentation):
        raise GraphcheckError(
            f"uninstrument takes what instrument() returned (an Instrumentation) or nothing, "
            f"not {_args.show(instrumentation)}"
        )
    with _LOCK:
        stopping = list(_ACTIVE) if instrumentation is None else [instrumentation]
    for ins in stopping:
        ins.flush()
    with _LOCK:
        if instrumentation is None:
            _ACTIVE.clear()
            _PENDING_ROOTS.clear()
        elif instrumentation in _ACTIVE:
            _ACTIVE.remove(instrumentation)
        if not _ACTIVE:
            _restore(_PATCHED)


def check(
    instrumentation: Optional[Instrumentation] = None,
    *,
    event: str = "check",
    contents: str = "preserved",
    digests: Union[None, bool, str] = None,
    on_findings: Optional[str] = None,
):
    """Verifies now, on demand, every graph ``instrumentation`` (default: the only live
    one) recorded against the memory its roots hold now: a live snapshot and verify, as
    the replay check makes after a transition. Returns the :class:`graphcheck.Report`
    (capture-time findings included). Graphs torch will never replay again (a
    torch.compile tree graph whose guarded parameter moved) are left out; their names are
    in :attr:`Instrumentation.superseded`. ``on_findings="raise"`` raises
    :class:`ReplayCheckError` and ``"warn"`` warns when a graph reads memory that changed
    since capture (the live findings); by default the report is only returned.
    ``digests`` (default: where the manifest has digests and ``contents`` is
    ``preserved``) compares contents."""
    event = _args.text("event", event)
    contents = _args.choice("contents", contents, ("preserved", "updated"))
    if on_findings is not None:
        on_findings = _args.choice("on_findings", on_findings, _guard.ON_FINDINGS)
    if instrumentation is None:
        live = instrumented()
        if len(live) != 1:
            raise GraphcheckError(
                f"check() without an instrumentation needs exactly one live, not {len(live)}: "
                "pass what instrument() returned"
            )
        instrumentation = live[0]
    elif not isinstance(instrumentation, Instrumentation):
        raise GraphcheckError(
            f"check takes what instrument() returned (an Instrumentation), not "
            f"{_args.show(instrumentation)}"
        )
    report, gone = _guard.run_check(instrumentation, event=event, contents=contents, digests=digests)
    instrumentation.superseded = sorted(gone)
    found = _guard._live_findings(report)
    if found and on_findings is not None:
        graphs = sorted({g for f in found for g in f.graphs})
        message = (
            f"graphcheck: {len(graphs)} graph{'s' if len(graphs) != 1 else ''} "
            f"({', '.join(graphs)}) read memory that changed since capture (at {event!r}):\n"
            f"{_guard._describe(found)}"
        )
        if on_findings == "raise":
            raise _guard.ReplayCheckError(message, report=report, graph=None, findings=found)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return report


def instrumented() -> list:
    """The live instrumentations."""
    with _LOCK:
        return list(_ACTIVE)


def register_model(model, root: str = "model") -> None:
    """Names an object whose tensors instrumented captures read (the engine's model, a
    draft model, a KV-cache manager) under ``root``, held weakly. Live instrumentations
    walk it from their next manifest on; one started later takes it too."""
    _native.check_path(_args.text("root", root))
    root_arg("model", model)
    with _LOCK:
        if _ACTIVE:
            for ins in _ACTIVE:
                ins.register_model(model, root)
            return
        try:
            ref = weakref.ref(model)
        except TypeError:
            ref = model
        _PENDING_ROOTS[:] = [(r, x) for r, x in _PENDING_ROOTS if r != root] + [(root, ref)]
