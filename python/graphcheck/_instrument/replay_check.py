"""The check before a replay: after a transition graphcheck can see (its sleep allocator's
wake, a torch_memory_saver resume, ``Module.load_state_dict``, or an explicit
:func:`mark_transition`), the next replay of each recorded graph first verifies what that
graph reads, and raises (or warns) before its kernels run.

A graph keeps the transition epoch (:mod:`.transitions`) it was last checked at; a
replay compares it with the current one (the price of a replay with nothing pending), and
only where they differ is anything checked. One live snapshot and one verify serve every
graph of an instrumentation per epoch; each graph is judged by the findings that name it.

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

import os
import threading
from typing import Any, Optional

from .. import _args, _native
from .._api import verify
from .._native import GraphcheckError
from .._recorder import fatal
from .._retarget import retarget
from .._snapshot import live_text
from .host import warn
from .transitions import latest, rewritten_since

__all__ = [
    "ENV_VERIFY_ON_REPLAY",
    "LIVE_KINDS",
    "ON_FINDINGS",
    "Checker",
    "GraphState",
    "ReplayCheckError",
    "before_replay",
    "describe",
    "live_findings",
    "on_findings_arg",
    "retarget_before_replay",
    "run_check",
]

#: The finding kinds that say a graph's memory changed since capture (docs/findings.md,
#: "Live checks"): the ones a replay check stops for. The core's list.
LIVE_KINDS = frozenset(_native.LIVE_KINDS)

#: The environment variable that turns the replay check on for :func:`instrument` (and
#: ``GRAPHCHECK_DIR``'s zero-code attach): ``raise``, ``warn`` or ``retarget``; ``off`` or
#: empty: off.
ENV_VERIFY_ON_REPLAY = "GRAPHCHECK_VERIFY_ON_REPLAY"

ON_FINDINGS = ("raise", "warn", "retarget")

# One check at a time: its result is kept for the epoch it was made at.
_LOCK = threading.RLock()


class ReplayCheckError(GraphcheckError):
    """A replay refused: the graph reads memory that changed since it was captured.
    ``report`` is the :class:`graphcheck.Report` of the check, ``graph`` the graph's name,
    ``findings`` the findings that name it."""

    def __init__(self, message: str, *, report, graph: Optional[str], findings: list):
        super().__init__(message)
        self.report = report
        self.graph = graph
        self.findings = findings


def live_findings(report, name: Optional[str] = None) -> list:
    return [
        f
        for f in report.findings
        if f.severity == "error" and f.kind in LIVE_KINDS and (name is None or name in f.graphs)
    ]


def describe(findings: list, limit: int = 12) -> str:
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


class Checker:
    """The replay check of one instrumentation: one report per epoch for all its graphs."""

    def __init__(self, instrumentation, on_findings: str):
        self.ins = instrumentation
        self.on_findings = on_findings
        self._epoch: Optional[int] = None
        self._result: Optional[tuple] = None  # (report, superseded names)
        # The live findings of the kept report by graph name: each graph's replay looks
        # its own up (a scan of every finding per graph was quadratic at 1,700 graphs).
        self._live: Optional[dict] = None

    def result(self, event: str, contents: str, at_epoch: Optional[int]):
        """The report and superseded graphs for ``at_epoch`` (``None``: fresh, not kept)."""
        with _LOCK:
            if at_epoch is not None and self._epoch == at_epoch and self._result is not None:
                return self._result
            result = run_check(self.ins, event=event, contents=contents, transition=True)
            self._live = None
            if at_epoch is not None:
                self._epoch, self._result = at_epoch, result
            return result

    def live_of(self, report, name: str) -> list:
        """:func:`live_findings` of ``report`` for graph ``name``, indexed once per kept
        report."""
        with _LOCK:
            if self._result is None or self._result[0] is not report:
                return live_findings(report, name)
            if self._live is None:
                by_graph: dict = {}
                for f in live_findings(report):
                    for g in dict.fromkeys(f.graphs):
                        by_graph.setdefault(g, []).append(f)
                self._live = by_graph
            return self._live.get(name, [])


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
    # As a Text, the same object at each check of this manifest: the snapshot's facts of it
    # are read once (_snapshot), and the verify takes the manifest the snapshot parsed.
    manifest, at = ins._manifest_and_epoch(as_text=True)
    rec = ins.recorder
    rewritten = rewritten_since(at)
    if contents == "updated" and not transition:
        rewritten = None
    # Where what the updates wrote is known, everything else must hold what it held.
    contents = "updated" if rewritten is None else "preserved"
    if digests is None:
        digests = contents == "preserved" and bool(rec.digests)
    # The snapshot stays the core's text into verify: no dict made of it and written out
    # again (at 1,700 graphs that round trip cost as much as the check).
    live = live_text(
        None,
        manifest,
        event=event,
        contents=contents,
        digests=digests,
        roots=rec.roots() or None,
        root=rec.root,
        runtime_state=rec.runtime_state,
        max_depth=rec.max_depth,
        recorder=rec,
        _rewritten=rewritten or frozenset(),
        _keep_parsed=True,
    )
    report = verify(manifest, _native.Text(live))
    return report, set(report.superseded)


def before_replay(cuda_graph, state: GraphState, instrumentations: list) -> None:
    """Runs at a replay whose graph was last checked at an older epoch: checks it in every
    instrumentation with a replay check that recorded it, then marks it checked. Raises
    :class:`ReplayCheckError` (``raise``) or warns (``warn``) when it reads changed memory;
    a graph refused stays unchecked, so every later replay is refused too, until a new
    transition is marked and the check passes."""
    at, event, contents = latest()
    for ins in instrumentations:
        checker = getattr(ins, "_checker", None)
        name = state.names.get(id(ins))
        if checker is None or name is None:
            continue
        report, gone = checker.result(event or "transition", contents, at)
        if name in gone:
            continue
        found = checker.live_of(report, name)
        if not found:
            continue
        why_not = ""
        if checker.on_findings == "retarget":
            if name in report.retarget:
                why_not = retarget_before_replay(
                    ins, checker, name, cuda_graph, f"verify_on_replay after {event or 'a transition'}"
                )
                if not why_not:
                    continue
            else:
                why_not = "the retarget plan refuses it (graphcheck retarget says why)"
        message = (
            f"graphcheck: graph {name!r} reads memory that changed since capture "
            f"(after {event!r}): {len(found)} finding{'s' if len(found) != 1 else ''}; "
            f"{'replaying anyway' if checker.on_findings == 'warn' else 'replay refused'}"
            f"{f' (not retargeted: {why_not})' if why_not else ''}\n"
            f"{describe(found)}"
        )
        if checker.on_findings in ("raise", "retarget"):
            raise ReplayCheckError(message, report=report, graph=name, findings=found)
        # Shown, never raised, where the filters make warnings errors: asked to warn, the
        # check must not read as a failure of its own (nor stop the graphs after this one).
        warn(message)
    cuda_graph._graphcheck_epoch = at


def retarget_before_replay(ins, checker: "Checker", name: str, cuda_graph, event: str) -> str:
    """Patches graph ``name`` (``cuda_graph``) to read what its owners hold now
    (``graphcheck.torch.retarget``), all or nothing; returns ``""`` when it was, else why
    not. The instrumentation's manifest and the check's report are made again afterwards:
    the next check reads the patched graph."""
    try:
        res = retarget(ins.recorder, graphs={name: cuda_graph}, event=event)
    except BaseException as e:  # noqa: BLE001 - the graph is refused, saying why
        if fatal(e):
            raise
        return f"{type(e).__name__}: {e}"
    if name not in res.retargeted:
        return res.refused.get(name, "the plan does not retarget it")
    with _LOCK:
        ins._frozen = None
        checker._epoch, checker._result, checker._live = None, None, None
    return ""


def on_findings_arg(value: Any) -> Optional[str]:
    """``verify_on_replay``: ``None`` (the environment variable decides), ``False``/"off",
    ``True``/"raise", "warn", or "retarget" (patch a graph the retarget plan fixes before
    its replay, refuse the rest as "raise" does)."""
    if value is None:
        value = os.environ.get(ENV_VERIFY_ON_REPLAY, "").strip().lower() or "off"
        if value not in ON_FINDINGS + ("off",):
            raise GraphcheckError(
                f"{ENV_VERIFY_ON_REPLAY} is 'raise', 'warn', 'retarget' or 'off', not {value!r}"
            )
    if value is True:
        return "raise"
    if value is False or value == "off":
        return None
    return _args.choice("verify_on_replay", value, ON_FINDINGS + ("off",))
