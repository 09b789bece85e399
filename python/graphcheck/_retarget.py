"""Retarget instead of recapture (issue 29, ``docs/retarget.md``): after a reload moved
tensors the graphs read, :func:`retarget` plans the word edits that make each graph read
what its owners hold now (``graphcheck retarget``'s plan), patches each retargetable graph
in place, all or nothing, through the driver (template and executable graph), and gives
the manifest that describes the patched graphs, so that a later verify checks what they
now read. A graph the plan refuses (a tensor reshaped, freed with no owner that moved, a
word in a child-graph body, ...) must be captured again; it is left as it is.

The recorder does not keep the ``torch.cuda.CUDAGraph`` objects it recorded: pass them as
``graphs={name: graph}``. Each must have been made with ``keep_graph=True`` (the template
is patched, so a later walk reads the new words). Where torch exposes the executable graph
(``raw_cuda_graph_exec()``, torch 2.8 and newer, 2.11 included), it is patched in place;
otherwise the template alone is, and the graph is instantiated again from it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from . import _args, _native
from ._api import Allow, Document, document_source
from ._native import GraphcheckError
from ._recorder import Recorder, walk_graph
from ._snapshot import forget_facts, live_text
from ._torch_import import import_torch

__all__ = ["RetargetResult", "plan", "retarget"]


@dataclass(frozen=True)
class RetargetResult:
    """What :func:`retarget` did.

    ``plan``: the plan (``graphcheck retarget --format json``), as a dict. ``retargeted``:
    the graphs patched, every edit made and read back. ``refused``: graph name → why it was
    not patched (the plan's refusals, a graph not given, or the driver's refusal; the graph
    is as it was unless the reason says it must not be replayed). ``manifest``: the manifest
    after applying (the recorder's where nothing was patched), made from the documents the
    plan was made from when it is first read (the replay check never reads it: at the
    anchor model's size, making it and reading it into a dict was a fifth of a retarget).
    ``outcomes``: graph name → the native outcome (``applied``, ``edits``, ``why``,
    ``restored``) of each graph tried.
    """

    plan: dict
    retargeted: tuple = ()
    refused: dict = field(default_factory=dict)
    outcomes: dict = field(default_factory=dict)
    #: Makes the manifest after applying (its JSON text); called once, by ``manifest``.
    _after: Optional[Callable[[], str]] = field(default=None, repr=False, compare=False)

    @property
    def manifest(self) -> dict:
        """The manifest after applying, as a dict (made when first read, then kept)."""
        made = self.__dict__.get("_manifest")
        if made is None:
            made = json.loads(self._after()) if self._after is not None else {}
            object.__setattr__(self, "_manifest", made)
        return made

    @property
    def ok(self) -> bool:
        """No graph with a finding is left unpatched."""
        return not self.refused


def plan(manifest: Document, live: Document, allow: Optional[Allow] = None) -> dict:
    """The retarget plan of ``manifest`` against its live snapshot ``live``, as a dict:
    per graph ``keep``, ``retarget`` (with its word edits) or ``recapture`` (with why)."""
    text = _native.retarget_plan(
        document_source(manifest, "manifest"), document_source(live, "live"), **_allow_args(allow)
    )
    return json.loads(text)


def _allow_args(allow: Optional[Allow]) -> dict:
    """An allowlist file as a path, entries (dicts) as data, as ``graphcheck.verify``
    passes them; the core checks the entries and names the bad one."""
    if allow is None:
        return {}
    if isinstance(allow, (str, os.PathLike)):
        return {"allow": _args.path("allow", allow)}
    if isinstance(allow, (bytes, Mapping)):
        raise GraphcheckError(f"allow is an allowlist file or a list of entries (dicts), not {_args.show(allow)}")
    entries = [_args.mapping(f"allow[{i}]", e, "an entry (a dict)") for i, e in enumerate(allow)]
    return {"allow_entries": _args.to_json("allow", [dict(e) for e in entries])}


def _refusal(g: Mapping[str, Any]) -> str:
    whys = [r.get("why", "") for r in g.get("refusals", [])]
    return "; ".join(w for w in whys if w) or f"the plan does not retarget {g['graph']!r}"


def _handles(name: str, cuda_graph) -> tuple:
    """(name, template, executable graph or None) of one torch graph, as
    ``_native.apply_plan_cuda`` takes them."""
    template = _args.integer(f"graphs[{name!r}].raw_cuda_graph()", cuda_graph.raw_cuda_graph(), minimum=1)
    exec_of = getattr(cuda_graph, "raw_cuda_graph_exec", None)
    exec_handle: Optional[int] = None
    if exec_of is not None:
        try:
            exec_handle = int(exec_of())
        except RuntimeError:  # not instantiated yet: replay instantiates the patched template
            exec_handle = None
    return (name, template, exec_handle)


def _apply_cuda(plan_text: str, graphs: Mapping[str, Any]) -> dict:
    """Patches each torch graph of ``graphs`` (name → graph) by its part of the plan, in
    one native call (the plan parsed once); returns name → the native outcome."""
    handles = [_handles(name, g) for name, g in graphs.items()]
    outcomes = _native.apply_plan_cuda(plan_text, handles)
    out = {}
    for (name, _, exec_handle), outcome in zip(handles, outcomes):
        cuda_graph = graphs[name]
        if outcome["applied"] and exec_handle is None and getattr(cuda_graph, "raw_cuda_graph_exec", None) is None:
            # No executable graph to patch: instantiate again from the patched template.
            instantiate = getattr(cuda_graph, "instantiate", None)
            if instantiate is not None:
                instantiate()
        out[name] = dict(outcome)
    return out


def _snapshot_text(recorder: Recorder, m_doc: Document, own: bool, walked: list) -> Any:
    """The live snapshot of ``recorder``'s roots against ``m_doc``, as the core's text,
    walked as the recorder walks (a weight past the default depth is no vanished owner,
    nor runtime state a persistent tensor); its walk's registry is put in ``walked``.
    ``own``: ``m_doc`` is the Text made for this call, so the core keeps its parse for the
    plan, and nothing holds it after."""
    try:
        return _native.Text(
            live_text(
                None, m_doc, roots=recorder.roots(), root=recorder.root, recorder=recorder,
                max_depth=recorder.max_depth, runtime_state=recorder.runtime_state,
                _keep_parsed=own, _walked=walked,
            )
        )
    finally:
        if own:
            forget_facts(m_doc)


def retarget(
    recorder: Recorder,
    live: Optional[Document] = None,
    *,
    graphs: Optional[Mapping[str, Any]] = None,
    allow: Optional[Allow] = None,
    apply: bool = True,
    manifest: Optional[Document] = None,
    event: str = "graphcheck.torch.retarget",
) -> RetargetResult:
    """Plans and applies the retarget of ``recorder``'s graphs.

    ``live`` is the live snapshot after the reload (taken now, over the recorder's roots,
    when not given). ``graphs`` maps each graph name to its ``torch.cuda.CUDAGraph``
    (``keep_graph=True``); a graph to retarget that is not given is refused, untouched.
    ``apply=False`` only plans. ``manifest`` is the manifest to plan from (the recorder's
    by default); planned from the recorder's, each patched graph is walked again into the
    recorder (:meth:`Recorder.replace_walked`) and the roots walked, so that the recorder's
    manifest from then on describes what the patched graphs read, and
    :attr:`Recorder.retargets` notes the retarget (graphs, edits, time, ``event``), as does
    each patched graph's ``retargets`` in the manifest. Each graph is patched all or nothing, after ``torch.cuda.synchronize()``:
    no replay may be in flight, nor run from another thread during the call."""
    if not isinstance(recorder, Recorder):
        raise GraphcheckError(
            f"recorder is a graphcheck.torch.Recorder, not {_args.show(recorder)}"
        )
    apply = _args.flag("apply", apply)
    event = _args.text("event", event)
    given = dict(_args.optional_mapping("graphs", graphs) or {})
    # The recorder's manifest and the snapshot stay the core's text: both only go back to
    # the core (a dict of each, written out again, was a fifth of the anchor model's
    # retarget on the H200).
    m_doc: Document = (
        manifest if manifest is not None else _native.Text(recorder.manifest_json())
    )
    # The registry of the snapshot's walk, where retarget took the snapshot: the recorder
    # takes it after the patch instead of walking the same roots again.
    walked: list = []
    if live is None:
        # The manifest's parse is kept with its Text, for the plan after the snapshot (a
        # Text made here, let go with this call).
        live = _snapshot_text(recorder, m_doc, manifest is None, walked)
    m_src = document_source(m_doc, "manifest")
    l_src = document_source(live, "live")
    plan_text = _native.retarget_plan(m_src, l_src, **_allow_args(allow))
    p = json.loads(plan_text)
    refused: dict = {}
    to_patch: dict = {}
    for g in p["graphs"]:
        name = g["graph"]
        if g["action"] == "recapture":
            refused[name] = _refusal(g)
            continue
        if g["action"] != "retarget" or not apply:
            continue
        cuda_graph = given.get(name)
        if cuda_graph is None or not hasattr(cuda_graph, "raw_cuda_graph"):
            refused[name] = (
                f"no torch.cuda.CUDAGraph (keep_graph=True) given for {name!r} (graphs={{name: graph}})"
            )
            continue
        if getattr(cuda_graph, "_graphcheck_template", True) is False:
            refused[name] = (
                f"graph {name!r} kept no template to patch through: instrument() walked it "
                "while its capture was open and torch destroyed the template at instantiate "
                "(instrument(keep_templates=True), or verify_on_replay='retarget', keeps it)"
            )
            continue
        to_patch[name] = cuda_graph
    outcomes: dict = {}
    if to_patch:
        import_torch("graphcheck.torch.retarget").cuda.synchronize()
        outcomes = _apply_cuda(plan_text, to_patch)
    done = [name for name, o in outcomes.items() if o["applied"]]
    refused.update((name, o["why"]) for name, o in outcomes.items() if not o["applied"])
    patched = list(done)
    if isinstance(m_src, _native.Text) and isinstance(l_src, _native.Text):
        # Both documents are text held here: the manifest after is made when first read.
        def after() -> str:
            return _native.retargeted_manifest(m_src, l_src, plan_text, patched)
    else:
        # A path (or text the caller passed) is read now, while it says what was planned.
        text = _native.retargeted_manifest(m_src, l_src, plan_text, patched)

        def after() -> str:
            return text

    if done and manifest is None:
        # The recorder describes the patched graphs from now on: each is walked again (its
        # template holds the new words), and the roots are walked for the owners of what
        # they read now.
        # All in one pass over the recorder's graphs each (a call per graph copies every
        # list each time: quadratic in the graphs).
        now = time.time()
        recorder._replace_walks({name: walk_graph(given[name].raw_cuda_graph()) for name in done})
        recorder._note_retargets(
            {name: {"event": event, "edits": outcomes[name]["edits"], "time": now} for name in done}
        )
        if walked:
            recorder._take_walk(walked[0])
        else:
            recorder.rewalk()
        recorder.retargets.append(
            {
                "graphs": list(done),
                "edits": sum(outcomes[n]["edits"] for n in done),
                "time": now,
                "event": event,
            }
        )
    return RetargetResult(
        plan=p, retargeted=tuple(done), refused=refused, outcomes=outcomes, _after=after
    )
