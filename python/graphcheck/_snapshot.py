"""The live snapshot (:func:`snapshot`): after sleep/wake or a reload, the registry walk of
the live model plus, for every address the manifest's graphs hold, whether it is still an
active allocation (CUDA: the caching allocator's blocks; CPU: the storages the walk found,
as :mod:`graphcheck.torch`'s docstring says), with digests where asked.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

from . import _allocator, _native
from . import sleep as _sleep_module
from ._allocator import _AllocSites, _cuda_segments, _find, _pool_key, _producer, _Segment
from ._api import load
from ._native import GraphcheckError
from ._walk import DEFAULT_MAX_DEPTH, walk, walk_roots


def _touch_addresses(manifest: dict) -> list:
    """Every distinct address the manifest's graphs hold, in document order."""
    seen: dict = {}
    for g in manifest["graphs"]:
        for n in g["nodes"]:
            for t in n.get("touches", []):
                seen.setdefault(t["addr"], None)
    return list(seen)


# -- snapshot -----------------------------------------------------------------------------


def _algorithm(digests: Union[bool, str], manifest: dict) -> Optional[str]:
    """The digest algorithm to use: the manifest's own where it has digests, so that the
    two compare; else sha256."""
    if not digests:
        return None
    if isinstance(digests, str):
        return digests
    for t in manifest["tensors"]:
        if t.get("digest"):
            return t["digest"].split(":", 1)[0]
    return "sha256"


def snapshot(
    model,
    manifest,
    *,
    event: str = "reload",
    contents: str = "preserved",
    digests: Union[bool, str] = False,
    reference: Any = None,
    root: str = "model",
    max_depth: int = DEFAULT_MAX_DEPTH,
    runtime_state: Iterable[str] = (),
    pools: Optional[Mapping[Any, str]] = None,
    producer: Optional[Mapping[str, Any]] = None,
    roots: Optional[Mapping[str, Any]] = None,
) -> dict:
    """The live snapshot of ``model`` against ``manifest`` after sleep/wake or a reload.

    ``contents`` is ``preserved`` (every persistent tensor must hold what it held at
    capture) or ``updated`` (new weights; ``reference`` says what they must be: a model
    loaded fresh, walked the same way, or a mapping of owner path → digest). ``digests``
    (``True`` or an algorithm) digests every live tensor, with the manifest's algorithm
    when it has digests. ``pools`` maps torch pool ids to the manifest's pool names, for
    CUDA probes (the sleep allocator's tags are mapped without asking). ``roots`` (root name → object) walks several roots instead of ``model``
    (the roots a :class:`Recorder` or :func:`instrument` recorded); ``model`` is then
    ``None`` or added as ``root``. Where PyTorch's memory history is on, CUDA tensors carry
    their allocation site. Returns the snapshot as a dict, checked by the core."""
    m = load(manifest, expect="manifest")
    pairs = [] if model is None and roots else [(root, model)]
    pairs.extend((roots or {}).items())
    registry = walk_roots(pairs, max_depth=max_depth, runtime_state=runtime_state)
    algorithm = _algorithm(digests, m)
    if reference is not None and algorithm is None:
        algorithm = _algorithm(True, m)
    references = _reference_digests(reference, algorithm, root, max_depth) if reference is not None else {}

    pool_ids = {p["name"]: p["id"] for p in m.get("pools", [])}
    pool_of = {}
    # The sleep allocator's pools, where the manifest declares their tags; `pools` wins.
    alloc = _sleep_module._ALLOCATOR
    auto = {} if alloc is None else {k: n for k, n in alloc.pool_names().items() if n in pool_ids}
    for key, name in {**auto, **(pools or {})}.items():
        if name not in pool_ids:
            raise GraphcheckError(f"pools: the manifest has no pool named {name!r}")
        pool_of[_pool_key(key)] = pool_ids[name]

    # Looked up in _allocator at each call, as the recorder does: one place where the
    # allocator's snapshot is read, and where the CPU tests fake it.
    raw_segments = _allocator._memory_segments()
    segments = _cuda_segments(raw_segments)
    sites = _AllocSites(raw_segments)
    seg_starts = [s.base for s in segments]
    allocations: list = []
    alloc_of_segment: dict = {}

    def allocation(seg: _Segment) -> int:
        if seg.base not in alloc_of_segment:
            alloc_of_segment[seg.base] = len(allocations)
            a = {"id": len(allocations), "base": hex(seg.base), "size": seg.size}
            if seg.pool in pool_of:
                a["pool"] = pool_of[seg.pool]
            allocations.append(a)
        return alloc_of_segment[seg.base]

    tensors = []
    owners_of: dict = {}
    for o in registry.owners:
        owners_of.setdefault(o.tensor, []).append(o.path)
    specs = registry.tensor_specs(algorithm)
    sites.annotate(specs, registry.tensors)
    for i, (rec, spec) in enumerate(zip(registry.tensors, specs)):
        t = {"id": i, **spec}
        base = int(spec["storage_base"], 16)
        seg = _find(segments, seg_starts, base) if spec["device"].startswith("cuda") else None
        if seg is not None and base + spec["storage_nbytes"] <= seg.base + seg.size:
            t["allocation"] = allocation(seg)
            if seg.pool in pool_of:
                t["pool"] = pool_of[seg.pool]
        for path in owners_of.get(i, []):
            if path in references:
                t["reference_digest"] = references[path]
                break
        tensors.append(t)

    # CPU probes: the storages of the tensors the live walk found (graphcheck.torch's
    # docstring).
    storages = sorted(
        {(r.storage_base, max(r.storage_nbytes, 1)) for r in registry.tensors}
    )
    storage_starts = [s[0] for s in storages]
    probes = []
    for addr_hex in _touch_addresses(m):
        addr = int(addr_hex, 16)
        probe = {"addr": addr_hex}
        seg = _find(segments, seg_starts, addr)
        if seg is not None:
            starts = [b[0] for b in seg.blocks]
            block = _find(seg.blocks, starts, addr)
            probe["state"] = "active" if block is not None and block[2] == "active_allocated" else "free"
            probe["allocation"] = allocation(seg)
            if seg.pool in pool_of:
                probe["pool"] = pool_of[seg.pool]
        else:
            probe["state"] = "active" if _find(storages, storage_starts, addr) else "unmapped"
        probes.append(probe)

    live = {
        "format_version": _native.FORMAT_VERSION,
        "kind": "live",
        "producer": _producer(producer),
        "event": {"name": event, "contents": contents},
        "pools": m.get("pools", []),
        "allocations": allocations,
        "tensors": tensors,
        "owners": registry.owner_specs(),
        "probes": probes,
    }
    return load(live, expect="live")


def _reference_digests(reference, algorithm: str, root: str, max_depth: int) -> dict:
    """Owner path → digest of what a fresh load holds there."""
    if isinstance(reference, Mapping):
        return dict(reference)
    registry = walk(reference, root=root, max_depth=max_depth)
    specs = registry.tensor_specs(algorithm)
    return {o.path: specs[o.tensor]["digest"] for o in registry.owners}
