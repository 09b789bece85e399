"""Instrumentation: every CUDA graph capture of the process recorded with no change to the
engine's code (:func:`instrument`, :func:`register_model`, :func:`check`,
:func:`uninstrument`). Its modules, each importing only those before it:

- ``host``: what instrumentation needs of the host process (warnings that never raise
  into the engine, rank and world size, manifest files, putting a patch back);
- ``trees``: readers of torch.compile's CUDA-graph tree nodes;
- ``transitions``: the transition epoch and the transitions seen without the engine;
- ``replay_check``: the check before a replay after a transition;
- ``writer``: the writer thread;
- ``patch``: the ``CUDAGraph`` subclass, patching torch and putting it back, the live
  instrumentations;
- ``instrumentation``: :class:`Instrumentation`.
"""

from __future__ import annotations

import atexit
import os
import warnings
import weakref
from typing import Callable, Iterable, Optional, Union

from .. import _args, _native
from .._native import GraphcheckError
from .._recorder import fatal
from .._walk import DEFAULT_MAX_DEPTH, root_arg
from . import replay_check
from .instrumentation import DEFAULT_NAME, Instrumentation
from .patch import ACTIVE, LOCK, start, stop

__all__ = [
    "DEFAULT_NAME",
    "ENV_DIGESTS",
    "ENV_DIR",
    "Instrumentation",
    "check",
    "digests_arg",
    "instrument",
    "instrumented",
    "register_model",
    "uninstrument",
]

#: The environment variable that turns :func:`instrument` on for a whole process tree.
ENV_DIR = "GRAPHCHECK_DIR"

# Roots register_model() named while no instrumentation was on: the next instrument()
# takes them. (root, object or weak reference)
_PENDING_ROOTS: list = []


def instrument(
    directory=None,
    *,
    model=None,
    root: str = "model",
    name: Union[str, Callable[[int], str]] = DEFAULT_NAME,
    digests: Union[None, bool, str] = None,
    runtime_state: Iterable[str] = (),
    max_depth: int = DEFAULT_MAX_DEPTH,
    strict: bool = False,
    write_every: int = 1,
    verify_on_replay: Union[None, bool, str] = None,
    discover: bool = True,
    keep_templates: Optional[bool] = None,
) -> Instrumentation:
    """Records every CUDA graph capture of the process, with no change to the engine's
    code: ``torch.cuda.CUDAGraph`` (and ``torch.cuda.graphs.CUDAGraph``) become a subclass
    that walks the graph at ``capture_end``, while its capture is still open, and then
    lets torch end it and instantiate it as before, so ``with torch.cuda.graph(g,
    pool=pool):`` and direct ``capture_begin``/``capture_end`` callers work unchanged.
    Code that bound the class before (``from torch.cuda import CUDAGraph``) is not
    reached: instrument first.

    ``keep_templates`` keeps each graph's template (``keep_graph=True``) for
    :func:`retarget`, which patches through it: the default keeps them where
    ``verify_on_replay`` is ``"retarget"`` only. A kept template costs host memory (about
    129 KiB a graph, 217 MiB for 1,718 graphs on the H200) for as long as its graph lives;
    without one, retarget refuses the graph and says why. Whether a graph keeps its
    template is decided when the graph object is made: it does while any live
    instrumentation keeps templates.

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

    ``digests`` (default: ``$GRAPHCHECK_DIGESTS``: ``1`` or an algorithm name, else off)
    digests every tensor the graphs read at each manifest, so that a check after a
    transition compares contents too (``stale``).

    ``verify_on_replay`` (default: ``$GRAPHCHECK_VERIFY_ON_REPLAY``, else off) checks
    each graph at its first replay after a transition (:func:`mark_transition`, this
    package's sleep allocator waking, a torch_memory_saver resume,
    ``Module.load_state_dict``): ``"raise"`` (or ``True``) raises
    :class:`ReplayCheckError` before the kernels run when the graph reads memory that
    changed since capture; ``"warn"`` warns and replays; ``"retarget"`` patches a graph
    whose every such finding the retarget plan fixes (``docs/retarget.md``: its words made
    to read what the owners hold now, all or nothing, through the driver) and replays it,
    and refuses the others as ``"raise"`` does, saying why. A replay with nothing pending
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
    digests = digests_arg(digests)
    on_replay = replay_check.on_findings_arg(verify_on_replay)
    if keep_templates is None:
        keep_templates = on_replay == "retarget"
    else:
        keep_templates = _args.flag("keep_templates", keep_templates)
        if not keep_templates and on_replay == "retarget":
            raise GraphcheckError(
                "keep_templates=False with verify_on_replay='retarget': the retarget patches "
                "each graph through its template (pass keep_templates=True, or leave it out)"
            )
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
        keep_templates=keep_templates,
    )
    with LOCK:
        _flush_at_exit_once()
        for r, ref in _PENDING_ROOTS:
            obj = ref() if isinstance(ref, weakref.ref) else ref
            if obj is not None and (model is None or r != root):
                ins.register_model(obj, r)
        if model is not None:
            ins.register_model(model, root)
        start(ins, with_replay_check=on_replay is not None)
    return ins


_AT_EXIT: list = []


def _flush_at_exit_once() -> None:
    """Registers :func:`_flush_live` with ``atexit``, at the first :func:`instrument` of the
    process. One hook for them all, not one bound ``flush`` each: a bound method held by
    ``atexit`` kept every instrumentation, stopped or not, and all it recorded (walked
    graphs, manifests, the registry) alive until the process exited."""
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        atexit.register(_flush_live)


def _flush_live() -> None:
    """At interpreter exit: flushes every instrumentation still live (a stopped one was
    flushed when it stopped)."""
    with LOCK:
        live = list(ACTIVE)
    for ins in live:
        try:
            ins.flush()
        except BaseException as e:  # noqa: BLE001 - a strict one's failure, the others flushed
            if fatal(e):
                raise
            warnings.warn(
                f"graphcheck: an instrumentation's manifest could not be flushed at exit: {e}",
                RuntimeWarning,
                stacklevel=1,
            )


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
    stop(instrumentation)
    if instrumentation is None:
        with LOCK:
            _PENDING_ROOTS.clear()


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
        # Retargeting needs the graph objects, which a replay has: check() only reports.
        on_findings = _args.choice("on_findings", on_findings, ("raise", "warn"))
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
    # Looked up at each call: the tests count and break the checks there.
    report, gone = replay_check.run_check(
        instrumentation, event=event, contents=contents, digests=digests
    )
    instrumentation.superseded = sorted(gone)
    found = replay_check.live_findings(report)
    if found and on_findings is not None:
        graphs = sorted({g for f in found for g in f.graphs})
        message = (
            f"graphcheck: {len(graphs)} graph{'s' if len(graphs) != 1 else ''} "
            f"({', '.join(graphs)}) read memory that changed since capture (at {event!r}):\n"
            f"{replay_check.describe(found)}"
        )
        if on_findings == "raise":
            raise replay_check.ReplayCheckError(message, report=report, graph=None, findings=found)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return report


#: The environment variable that turns digests on for :func:`instrument` (and
#: ``GRAPHCHECK_DIR``'s zero-code attach): ``1``/``on``/``true``, or an algorithm name;
#: ``0``/``off``/``false`` or empty: off.
ENV_DIGESTS = "GRAPHCHECK_DIGESTS"


def digests_arg(value: Union[None, bool, str]) -> Union[bool, str]:
    """``digests``: ``None`` (the environment variable decides), a flag, or an algorithm
    name (checked where the recorder takes it)."""
    if value is not None:
        return value
    from .._digest import DIGEST_ALGORITHMS

    env = os.environ.get(ENV_DIGESTS, "").strip().lower()
    if env in ("", "0", "off", "false", "no"):
        return False
    if env in ("1", "on", "true", "yes"):
        return True
    if env not in DIGEST_ALGORITHMS:
        raise GraphcheckError(
            f"{ENV_DIGESTS} is 1, on, true, 0, off, false or an algorithm "
            f"({', '.join(DIGEST_ALGORITHMS)}), not {env!r}"
        )
    return env


def instrumented() -> list:
    """The live instrumentations."""
    with LOCK:
        return list(ACTIVE)


def register_model(model, root: str = "model") -> None:
    """Names an object whose tensors instrumented captures read (the engine's model, a
    draft model, a KV-cache manager) under ``root``, held weakly. Live instrumentations
    walk it from their next manifest on; one started later takes it too."""
    _native.check_path(_args.text("root", root))
    root_arg("model", model)
    with LOCK:
        if ACTIVE:
            for ins in ACTIVE:
                ins.register_model(model, root)
            return
        try:
            ref = weakref.ref(model)
        except TypeError:
            ref = model
        _PENDING_ROOTS[:] = [(r, x) for r, x in _PENDING_ROOTS if r != root] + [(root, ref)]
