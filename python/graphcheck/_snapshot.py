"""The live snapshot (:func:`snapshot`): after sleep/wake or a reload, the registry walk of
the live model plus, for every address the manifest's graphs hold, whether it is still an
active allocation, with digests where asked.

On CUDA that comes from ``torch.cuda.memory_snapshot()`` (segments and blocks). CPU memory
has no such record, so for CPU addresses (the CI tests) an address inside the storage of a
tensor the live walk found is ``active`` and any other address ``unmapped``: a tensor the
model no longer reaches counts as freed, whether or not the C allocator has released it.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Optional, Union

from . import _args, _caching_allocator, _digest, _native, _sleep_state
from ._api import FORMAT_VERSION, document_source, version_arg
from ._caching_allocator import AllocSites, pool_key
from ._digest import DEFAULT_DIGEST, digests_choice
from ._native import GraphcheckError
from ._producer import producer as producer_block
from ._walk import DEFAULT_MAX_DEPTH, root_pairs, walk, walk_roots

__all__ = ["forget_facts", "live_text", "snapshot"]


# -- snapshot -----------------------------------------------------------------------------


def _algorithm(digests: Union[bool, str], recorded: Optional[str]) -> Optional[str]:
    """The digest algorithm to use: the manifest's own (``recorded``) where it has digests,
    so that the two compare; else the default (gc128)."""
    if not digests:
        return None
    if isinstance(digests, str):
        return digests
    return recorded or DEFAULT_DIGEST


#: The facts of the latest manifest :func:`live_text` read: (the manifest as given, its
#: pools by name, its digest algorithm). A replay check after every transition hands the
#: same manifest text again; reading it into Python objects each time cost more than the
#: rest of the snapshot at 1,700 graphs (benches/engine_scale.py).
#: One tuple, replaced whole: a thread reading it never sees one manifest's pools with
#: another's algorithm.
_FACTS: list = [(None, None, None)]


def _manifest_facts(manifest, keep: bool = False) -> tuple:
    """``(pool id by name, digest algorithm or None)`` of ``manifest``, loaded (and so
    checked) once per manifest object where it is text; ``keep`` keeps the core's parse
    with a :class:`Text` for the calls of it that follow (``build_live``, ``verify``, the
    retarget plan)."""
    text = isinstance(manifest, (str, bytes, _native.Text))
    held, pools, algorithm = _FACTS[0]
    if text and held is manifest:
        return pools, algorithm
    # The core reads (and checks) the manifest for the two facts, making no dict of it.
    pools, algorithm = _native.manifest_facts(
        document_source(manifest, "manifest"), "<manifest>", keep=keep
    )
    if text:
        _FACTS[0] = (manifest, pools, algorithm)
    return pools, algorithm


def forget_facts(manifest) -> None:
    """Lets go of ``manifest`` where :func:`live_text` holds its facts (with the parse the
    core kept with it): a manifest made for one call (a retarget's) is not held after."""
    if _FACTS[0][0] is manifest:
        _FACTS[0] = (None, None, None)


def snapshot(
    model,
    manifest,
    *,
    event: str = "reload",
    contents: str = "preserved",
    digests: Union[bool, str, None] = None,
    reference: Any = None,
    root: str = "model",
    max_depth: int = DEFAULT_MAX_DEPTH,
    runtime_state: Iterable[str] = (),
    pools: Optional[Mapping[Any, str]] = None,
    producer: Optional[Mapping[str, Any]] = None,
    roots: Optional[Mapping[str, Any]] = None,
    format_version: int = FORMAT_VERSION,
    recorder: Any = None,
) -> dict:
    """The live snapshot of ``model`` against ``manifest`` after sleep/wake or a reload.

    ``contents`` is ``preserved`` (every persistent tensor must hold what it held at
    capture) or ``updated`` (new weights; ``reference`` says what they must be: a model
    loaded fresh, walked the same way, or a mapping of owner path → digest). ``digests``
    (``True`` or an algorithm) digests every live tensor, with the manifest's algorithm
    when it has digests; ``None`` (the default) digests where the manifest has digests and
    ``contents`` is ``preserved`` (what ``stale`` compares), ``False`` never. ``pools`` maps torch pool ids to the manifest's pool names, for
    CUDA probes (the sleep allocator's tags are mapped without asking). ``roots`` (root name → object) walks several roots instead of ``model``
    (the roots a :class:`Recorder` or :func:`instrument` recorded); ``model`` is then
    ``None`` or added as ``root``. ``recorder`` (the :class:`Recorder` whose manifest
    ``manifest`` is) numbers each storage as the recorder did, in the recorder's session:
    verify then tells a new storage the allocator put in a dead one's block (a rebind
    chain, each new weight in the block the previous one freed) from the captured one,
    which addresses alone cannot. Where PyTorch's memory history is on, CUDA tensors carry
    their allocation site. Returns the snapshot as a dict, checked by the core, in format
    ``format_version`` (2, as graphcheck writes it, by default; 1 is the expanded form
    :func:`graphcheck.load` gives). Every wrong argument is a :class:`GraphcheckError`
    naming it."""
    # Every parameter, as given: live_text takes the same (and one more, the replay
    # check's own: what an update wrote, left out of the digests).
    return json.loads(live_text(**locals()))


def live_text(
    model,
    manifest,
    *,
    event: str = "reload",
    contents: str = "preserved",
    digests: Union[bool, str, None] = None,
    reference: Any = None,
    root: str = "model",
    max_depth: int = DEFAULT_MAX_DEPTH,
    runtime_state: Iterable[str] = (),
    pools: Optional[Mapping[Any, str]] = None,
    producer: Optional[Mapping[str, Any]] = None,
    roots: Optional[Mapping[str, Any]] = None,
    format_version: int = FORMAT_VERSION,
    recorder: Any = None,
    _rewritten: frozenset = frozenset(),
    _keep_parsed: bool = False,
    _walked: Optional[list] = None,
) -> str:
    """:func:`snapshot`, as the core's JSON text: for a caller that only hands the snapshot
    back to the core (:func:`graphcheck.torch.retarget`), which a dict would cost a read and
    a write more. ``_walked``, a list, gets the registry of the walk (the retarget's
    recorder takes it as its next walk)."""
    version = version_arg(format_version)
    event = _args.text("event", event)
    contents = _args.choice("contents", contents, ("preserved", "updated"))
    digests = digests_choice("digests", digests)
    root = _args.text("root", root)
    pools = _args.optional_mapping("pools", pools)
    producer = _args.optional_mapping("producer", producer)
    if recorder is not None and not callable(getattr(recorder, "storage_numbers", None)):
        raise GraphcheckError(
            f"recorder is a graphcheck.torch.Recorder, not {_args.show(recorder)}"
        )
    if isinstance(reference, Mapping):  # owner path -> digest; any other object is a model
        for path, value in reference.items():
            _args.text("reference: an owner path", path)
            _args.text(f"reference[{path!r}]", value)
    pool_ids, recorded = _manifest_facts(manifest, keep=_keep_parsed)
    pairs = [] if model is None and roots else [(root, model)]
    pairs.extend(root_pairs("roots", roots) if roots is not None else [])
    registry = walk_roots(pairs, max_depth=max_depth, runtime_state=runtime_state)
    if _walked is not None:
        _walked.append(registry)
    if digests is None:
        # A manifest recorded with digests is compared: without live digests a preserved
        # tensor whose contents changed would verify clean.
        digests = contents == "preserved" and recorded is not None
    algorithm = _algorithm(digests, recorded)
    if reference is not None and algorithm is None:
        algorithm = _algorithm(True, recorded)
    references = _reference_digests(reference, algorithm, root, max_depth) if reference is not None else {}

    bindings = {}
    # The sleep allocator's and torch_memory_saver's pools, where the manifest declares
    # their tags; `pools` wins.
    alloc = _sleep_state.allocator()
    auto = {} if alloc is None else {k: n for k, n in alloc.pool_names().items() if n in pool_ids}
    for name, _, _, pool in _caching_allocator.tms_pools():
        if name in pool_ids:
            auto.setdefault(pool.id, name)
    for key, name in {**auto, **(pools or {})}.items():
        if not isinstance(name, str) or name not in pool_ids:
            raise GraphcheckError(f"pools: the manifest has no pool named {name!r}")
        bindings[pool_key(key)] = pool_ids[name]
    # vLLM's CuMemAllocator: each allocation under a tag the manifest has a pool of, by
    # its range (its MemPool is one of many, made per use_memory_pool context). A range
    # wins over any binding, `pools` included, as it did in the manifest.
    pool_ranges = _caching_allocator.cumem_pool_ranges(_caching_allocator.cumem_regions(), pool_ids)

    # Looked up in _caching_allocator at each call, as the recorder does: one place where
    # the allocator's snapshot is read, and where the CPU tests fake it.
    raw_segments = _caching_allocator.memory_segments()
    # (device, storage address) an update rewrote (the replay check): left undigested.
    specs = registry.tensor_specs(algorithm, skip=_rewritten)
    AllocSites(raw_segments).annotate(specs, registry.tensors)
    block = producer_block(producer)
    if recorder is not None:
        block.setdefault("session", recorder.session)
        for spec, number in zip(specs, recorder.storage_numbers(registry.tensors)):
            if number is not None:
                spec["storage"] = number
    # The core builds the snapshot from these facts (graphcheck::resolve::live): segments
    # to allocations and pools, probes of the captured addresses, and the document check.
    spec = {
        "producer": block,
        "event": {"name": event, "contents": contents},
        "tensors": specs,
        "owners": registry.owner_specs(),
        "segments": _caching_allocator.segment_facts(raw_segments),
        "pool_bindings": [{"key": list(k), "pool": v} for k, v in bindings.items()],
        "pool_ranges": pool_ranges,
        "reference_digests": references,
    }
    # The manifest's `ranges` (memory read that no owner explains) digested again.
    ranges = _digest.range_digests if algorithm is not None else None
    # _keep_parsed (the replay check, which verifies against the same Text next and checks
    # again at each transition until the next capture): the core keeps the manifest it
    # parses here with that Text, for every later snapshot and verify of it.
    return _native.build_live(
        _native.Text(json.dumps(spec)), document_source(manifest), version, ranges=ranges,
        keep=_keep_parsed,
    )


def _reference_digests(reference, algorithm: Optional[str], root: str, max_depth: int) -> dict:
    """Owner path → digest of what a fresh load holds there."""
    if isinstance(reference, Mapping):
        return dict(reference)
    registry = walk(reference, root=root, max_depth=max_depth)
    if not registry.owners:
        # Nothing to compare with: every updated tensor would pass unchecked.
        raise GraphcheckError(
            "reference is a model loaded fresh (walked as model is) or a mapping of owner "
            f"path to digest; {_args.show(reference)} holds no tensor"
        )
    specs = registry.tensor_specs(algorithm)
    return {o.path: specs[o.tensor]["digest"] for o in registry.owners}
