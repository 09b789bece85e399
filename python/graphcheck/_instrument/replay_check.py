"""The check before a replay: after a transition graphcheck can see (its sleep allocator's
wake, a torch_memory_saver resume, ``Module.load_state_dict``, or an explicit
:func:`mark_transition`), the next replay of each recorded graph first verifies what that
graph reads, and raises (or warns) before its kernels run.

The state here is one counter, the transition *epoch*, and what the latest transition
said. A graph keeps the epoch it was last checked at; a replay compares the two (one
attribute read and one comparison: the price of a replay with nothing pending), and only
where they differ is anything checked. One live snapshot and one verify serve every graph
of an instrumentation per epoch; each graph is judged by the findings that name it.

Contents are compared against the digests of the latest capture, except those an update
since then rewrote: an ``updated`` transition says which tensors it wrote
(``Module.load_state_dict`` by itself, an engine with ``written=``), and everything else
must still hold what it held, at that check and at every later ``preserved`` one (verl
over SGLang resumes the weights, loads new ones, then resumes the KV cache: the new
weights are no finding there, a lost constant is). An update that does not say what it
wrote stops content comparisons until the next capture.

Which findings stop a replay: the live ones (``vanished``, ``drifted``, ``freed``,
``reused``, ``reshaped``, ``stale``), the memory the graph reads changed since capture.
Capture-time findings (``unowned``, ``unregistered``, ``mispooled``) were there before the
transition and say what could go wrong, not that it has: they are in the report, and
``graphcheck verify`` is where they fail a run.

Graphs that torch itself will never replay again are left out of the check and named as
*superseded*: a graph of torch.compile's CUDA-graph trees whose static input (a parameter
or buffer, at the address the tree recorded) is now held at another address by its owner
path. The tree re-records a new graph for the new address instead of replaying the old
one (seen on the H200 with torch 2.11), so the old graph's stale addresses are no hazard.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .. import _args, _native, _registry
from .. import sleep as _sleep
from .._native import GraphcheckError
from .._snapshot import snapshot

#: The finding kinds that say a graph's memory changed since capture (docs/findings.md,
#: "Live checks"): the ones a replay check stops for. The core's list.
LIVE_KINDS = frozenset(_native.LIVE_KINDS)

#: The environment variable that turns the replay check on for :func:`instrument` (and
#: ``GRAPHCHECK_DIR``'s zero-code attach): ``raise`` or ``warn``; ``off`` or empty: off.
ENV_VERIFY_ON_REPLAY = "GRAPHCHECK_VERIFY_ON_REPLAY"

ON_FINDINGS = ("raise", "warn")

_LOCK = threading.RLock()

# [epoch, event, contents]: the latest transition. A list, so that the replay path reads
# one global and indexes it.
_STATE: list = [0, None, "preserved"]


class ReplayCheckError(GraphcheckError):
    """A replay refused: the graph reads memory that changed since it was captured.
    ``report`` is the :class:`graphcheck.Report` of the check, ``graph`` the graph's name,
    ``findings`` the findings that name it."""

    def __init__(self, message: str, *, report, graph: str, findings: list):
        super().__init__(message)
        self.report = report
        self.graph = graph
        self.findings = findings


def epoch() -> int:
    """The current transition epoch (0 before any transition)."""
    return _STATE[0]


def mark_transition(
    event: str = "reload", contents: str = "preserved", written: Any = None
) -> int:
    """Says that the memory graphs read may have changed: after ``reload_weights()``, a
    wake, a resume. ``contents`` is ``preserved`` (every persistent tensor must still hold
    what it held at capture; digests are compared where the manifest has them) or
    ``updated`` (new weights: addresses must hold, contents may change). Each recorded
    graph is checked at its next replay, where an instrumentation has
    ``verify_on_replay``. Returns the new epoch.

    ``written`` (``updated`` only) says what the update wrote: a tensor, a module (its
    parameters and buffers) or an iterable of them. Digests of everything else are still
    compared, at this check and at every later one, so that a constant the reload did not
    restore is ``stale``. Without it, anything may have been rewritten: contents are not
    compared again until the next capture (``Module.load_state_dict`` says what it wrote
    by itself)."""
    event = _args.text("event", event)
    contents = _args.choice("contents", contents, ("preserved", "updated"))
    if written is not None and contents != "updated":
        raise GraphcheckError(
            f"written says what an update wrote: it takes contents='updated', not {contents!r}"
        )
    storages = None if written is None else _storages("written", written)
    with _LOCK:
        now = _STATE[0] + 1
        _STATE[:] = [now, event, contents]
        if contents == "updated":
            _WRITES.append((now, storages))
            if len(_WRITES) > _WRITES_KEPT:
                _FORGOTTEN[0] = _WRITES.pop(0)[0]
        return now


# The updated transitions, oldest first: (epoch, frozenset of (device, storage address) the
# update wrote, or None: unknown). The oldest are forgotten past _WRITES_KEPT; a check of a
# manifest older than the last one forgotten (_FORGOTTEN) knows nothing of what was written.
_WRITES: list = []
_WRITES_KEPT = 1024
_FORGOTTEN = [0]


def _storages(name: str, value: Any) -> frozenset:
    """(device, storage address) of every tensor ``value`` names: a tensor, a module's
    parameters and buffers, or an iterable of them."""
    torch = _registry._torch()
    out = set()
    todo = [value]
    # Modules and iterables entered, by id (kept, so that no id is reused meanwhile): a
    # list that holds itself, or modules sharing a child, are read once.
    entered: dict = {}
    while todo:
        v = todo.pop()
        if not isinstance(v, torch.Tensor):
            if id(v) in entered:
                continue
            entered[id(v)] = v
        if isinstance(v, torch.Tensor):
            # A wrapper subclass (a DTensor) has no storage of its own: its inner tensors
            # are what the walk digests, and what the update wrote.
            if type(v) not in (torch.Tensor, torch.nn.Parameter) and hasattr(
                type(v), "__tensor_flatten__"
            ):
                try:
                    names, _ = v.__tensor_flatten__()
                    todo.extend(getattr(v, n) for n in names)
                    continue
                except Exception:  # noqa: BLE001 - read as a tensor below
                    pass
            try:
                out.add((_registry._device_name(v), v.untyped_storage().data_ptr()))
            except (RuntimeError, NotImplementedError):
                pass  # no storage (sparse, meta): nothing the walk digests either
        elif isinstance(v, torch.nn.Module):
            todo.extend(v.parameters())
            todo.extend(v.buffers())
        elif isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise GraphcheckError(
                f"{name} takes tensors, modules or an iterable of them, not {_args.show(v)}"
            )
        else:
            todo.extend(v)
    return frozenset(out)


def rewritten_since(epoch: int) -> Optional[frozenset]:
    """What updates after ``epoch`` wrote: (device, storage address) pairs, or ``None`` where
    one of them did not say (anything may have been rewritten)."""
    with _LOCK:
        if epoch < _FORGOTTEN[0]:
            return None
        out: set = set()
        for at, storages in _WRITES:
            if at <= epoch:
                continue
            if storages is None:
                return None
            out |= storages
        return frozenset(out)


def _live_findings(report, name: Optional[str] = None) -> list:
    return [
        f
        for f in report.findings
        if f.severity == "error" and f.kind in LIVE_KINDS and (name is None or name in f.graphs)
    ]


def _describe(findings: list, limit: int = 12) -> str:
    lines = []
    for f in findings[:limit]:
        owners = ", ".join(o.path for o in f.owners) or f.subject
        lines.append(f"  {f.kind}: {owners}: {f.detail}")
    if len(findings) > limit:
        lines.append(f"  … and {len(findings) - limit} more (the report has them all)")
    return "\n".join(lines)


class GraphState:
    """What the check keeps per recorded graph object: its name in each instrumentation
    that recorded it, and the static inputs torch guards (CUDA-graph trees)."""

    __slots__ = ("names", "static_ptrs", "static_paths", "tree")

    def __init__(self):
        self.names: dict = {}  # id(instrumentation) -> graph name
        self.static_ptrs: tuple = ()
        # static input address -> the owner paths that held it at capture
        self.static_paths: dict = {}
        self.tree: Optional[str] = None

    def learn_paths(self, registry) -> None:
        """The owner paths of the static inputs, from the registry of the capture (a walk
        after the graph is gone could no longer name a parameter that was replaced)."""
        if not self.static_ptrs or registry is None:
            return
        want = set(self.static_ptrs)
        for o in registry.owners:
            ptr = registry.tensors[o.tensor].data_ptr
            if ptr in want:
                self.static_paths.setdefault(ptr, []).append(o.path)


def tree_node_of(cuda_graph, depth: int = 12):
    """The torch.compile CUDA-graph tree node whose graph ``cuda_graph`` is, found on the
    calling frames at ``capture_begin`` (the node's ``_record`` runs the capture), with
    the inputs it records; ``(None, None)`` for any other capture. Reads frames only."""
    import sys

    try:
        frame = sys._getframe(1)
    except ValueError:
        return None, None
    for _ in range(depth):
        if frame is None:
            break
        # Only the tree's own frame is looked into: reading any frame's f_locals keeps a
        # snapshot of its locals alive (Python 3.11), which would hold the caller's objects.
        code = frame.f_code
        if code.co_name == "_record" and code.co_filename.endswith("cudagraph_trees.py"):
            node = frame.f_locals.get("self")
            if getattr(node, "graph", None) is cuda_graph:
                return node, frame.f_locals.get("inputs")
        frame = frame.f_back
    return None, None


#: Torch attribute names (torch/_inductor/cudagraph_trees.py) already warned missing: each
#: is said once per process, not at every capture.
_TREE_WARNED: set = set()

#: Returned by :func:`_tree_attr` for an attribute torch does not have.
_MISSING = object()

_NO_SHAPES = "tree graphs are named without their batch shapes"
_NO_NAME = "tree graphs get the default names (capture0, ...) instead of inductor_fn<f>_graph<g>"
_NO_STATIC = (
    "the static inputs torch guards are unknown, so a graph torch re-records after a "
    "rebinding is reported as findings instead of superseded"
)


def _tree_attr(obj, chain: str, lost: str):
    """``obj``'s attribute ``chain`` (dotted, as torch's CUDA-graph tree names it), or
    :data:`_MISSING` after warning, once per name, that this torch lacks it and what is
    lost: a torch that renamed it must not turn graphcheck's guards off in silence."""
    value = obj
    for name in chain.split("."):
        try:
            value = getattr(value, name)
        except AttributeError:
            if chain not in _TREE_WARNED:
                _TREE_WARNED.add(chain)
                from .host import _warn

                _warn(
                    f"graphcheck: this torch's CUDA-graph tree node has no `{chain}` "
                    f"(torch/_inductor/cudagraph_trees.py): {lost}"
                )
            return _MISSING
    return value


def tree_input_shapes(node, inputs) -> Optional[list]:
    """At ``capture_begin`` of a tree graph: the shapes of the inputs that are not static
    (the batch the graph is recorded for). By ``capture_end`` the tree's boxed call has
    cleared its input list."""
    static = _tree_attr(node, "wrapped_function.static_input_idxs", _NO_SHAPES)
    if static is _MISSING:
        return None
    static = set(static or ())
    return [
        "x".join(str(int(d)) for d in t.shape) or "scalar"
        for i, t in enumerate(inputs or ())
        if i not in static and hasattr(t, "shape")
    ]


def tree_graph_name(node, shapes) -> Optional[str]:
    """``inductor_fn<function>_graph<id>`` and the shapes of the inputs that are not
    static (the batch the graph was recorded for), e.g. ``inductor_fn0_graph1[8x256]``."""
    fn = _tree_attr(node, "wrapped_function.id.id", _NO_NAME)
    gid = _tree_attr(node, "id.id", _NO_NAME)
    if fn is _MISSING or gid is _MISSING:
        return None
    shapes = shapes or []
    suffix = f"[{','.join(shapes[:3])}]" if shapes else ""
    return f"inductor_fn{fn}_graph{gid}{suffix}"


def tree_static_ptrs(node) -> tuple:
    """The addresses of the static inputs (parameters, buffers) a tree node recorded."""
    ptrs = _tree_attr(node, "static_input_data_ptrs", _NO_STATIC)
    if ptrs is _MISSING:
        return ()
    return tuple(p for p in (ptrs or ()) if p)


class Checker:
    """The replay check of one instrumentation: one report per epoch for all its graphs."""

    def __init__(self, instrumentation, on_findings: str):
        self.ins = instrumentation
        self.on_findings = on_findings
        self._epoch = None
        self._result = None  # (report, superseded names)

    def result(self, event: str, contents: str, at_epoch: Optional[int]):
        """The report and superseded graphs for ``at_epoch`` (``None``: fresh, not kept)."""
        with _LOCK:
            if at_epoch is not None and self._epoch == at_epoch and self._result is not None:
                return self._result
            result = run_check(self.ins, event=event, contents=contents, transition=True)
            if at_epoch is not None:
                self._epoch, self._result = at_epoch, result
            return result


def run_check(ins, *, event: str, contents: str, digests=None, transition: bool = False):
    """Snapshot of the instrumentation's roots against its manifest, verified (the core
    leaves superseded tree graphs out: the manifest records what each guards). Returns
    ``(report, superseded names)``.

    Contents are compared against the manifest's digests (taken at the latest capture)
    except where an update since then rewrote them: the tensors it says it wrote are not
    digested, and after an update that did not say, nothing is (``contents`` is then
    ``updated`` whatever the caller said). ``transition``: ``contents`` is the latest
    marked transition's, already among the updates; else an ``updated`` asked for here
    (``check()``) is one more update that does not say what it wrote."""
    from .._api import verify

    manifest, at = ins._manifest_and_epoch()
    rec = ins.recorder
    rewritten = rewritten_since(at)
    if contents == "updated" and not transition:
        rewritten = None
    # Where what the updates wrote is known, everything else must hold what it held.
    contents = "updated" if rewritten is None else "preserved"
    if digests is None:
        digests = contents == "preserved" and bool(rec.digests)
    live = snapshot(
        None,
        manifest,
        event=event,
        contents=contents,
        digests=digests,
        roots=rec.roots() or None,
        root=rec.root,
        runtime_state=rec.runtime_state,
        max_depth=rec.max_depth,
        _rewritten=rewritten or frozenset(),
    )
    report = verify(manifest, live)
    return report, set(report.superseded)


def before_replay(cuda_graph, state: GraphState, instrumentations: list) -> None:
    """Runs at a replay whose graph was last checked at an older epoch: checks it in every
    instrumentation with a replay check that recorded it, then marks it checked. Raises
    :class:`ReplayCheckError` (``raise``) or warns (``warn``) when it reads changed memory;
    a graph refused stays unchecked, so every later replay is refused too, until a new
    transition is marked and the check passes."""
    at, event, contents = _STATE
    for ins in instrumentations:
        checker = getattr(ins, "_checker", None)
        name = state.names.get(id(ins))
        if checker is None or name is None:
            continue
        report, gone = checker.result(event or "transition", contents, at)
        if name in gone:
            continue
        found = _live_findings(report, name)
        if not found:
            continue
        message = (
            f"graphcheck: graph {name!r} reads memory that changed since capture "
            f"(after {event!r}): {len(found)} finding{'s' if len(found) != 1 else ''}; "
            f"{'replay refused' if checker.on_findings == 'raise' else 'replaying anyway'}\n"
            f"{_describe(found)}"
        )
        if checker.on_findings == "raise":
            raise ReplayCheckError(message, report=report, graph=name, findings=found)
        # Shown, never raised, where the filters make warnings errors: asked to warn, the
        # check must not read as a failure of its own (nor stop the graphs after this one).
        from .instrumentation import _warn

        _warn(message)
    cuda_graph._graphcheck_epoch = at


def on_findings_arg(value: Any) -> Optional[str]:
    """``verify_on_replay``: ``None`` (the environment variable decides), ``False``/"off",
    ``True``/"raise", or "warn"."""
    import os

    if value is None:
        value = os.environ.get(ENV_VERIFY_ON_REPLAY, "").strip().lower() or "off"
        if value not in ON_FINDINGS + ("off",):
            raise GraphcheckError(
                f"{ENV_VERIFY_ON_REPLAY} is 'raise', 'warn' or 'off', not {value!r}"
            )
    if value is True:
        return "raise"
    if value is False or value == "off":
        return None
    return _args.choice("verify_on_replay", value, ON_FINDINGS + ("off",))


def _after_wake(result: dict) -> None:
    if result.get("awake"):
        mark_transition("graphcheck.sleep wake", "preserved")


_sleep._WAKE_HOOKS.append(_after_wake)
