"""torch's CUDA caching allocator as graphcheck reads it: its segments and blocks
(``torch.cuda.memory_snapshot()``: pools, free blocks, allocation sites where memory
history is on), pool ids, the ``MemPool`` regions of torch_memory_saver, and the tagged
allocations of vLLM's sleep allocator (``CuMemAllocator``). The recorder
(:mod:`graphcheck._recorder`) and the live snapshot (:mod:`graphcheck._snapshot`) both
read them here. (Not :class:`graphcheck.sleep.SleepAllocator`, graphcheck's own allocator,
which torch loads as a pluggable one.)
"""

from __future__ import annotations

import bisect
import os
from typing import Any, Iterable, Mapping

from . import _args
from ._native import GraphcheckError
from ._torch_import import import_torch

__all__ = [
    "ALLOC_SITE_FRAMES",
    "CUMEM_MODULE",
    "TAG_KINDS",
    "AllocSites",
    "cumem_pool_ranges",
    "cumem_regions",
    "memory_segments",
    "pool_key",
    "pool_segments",
    "segment_facts",
    "tms_pools",
]


def pool_key(pool_id) -> tuple:
    """A torch pool id (``(a, b)``, a ``MemPool``, a graph pool handle) as a tuple."""
    pid = getattr(pool_id, "id", pool_id)
    try:
        # A set has no order: (a, b) and (b, a) are different pools.
        if isinstance(pid, (str, bytes, set, frozenset)):
            raise TypeError
        return tuple(int(x) for x in pid)
    except (TypeError, ValueError):
        raise GraphcheckError(
            "a torch pool is a MemPool, a graph pool handle (torch.cuda.graph_pool_handle()) "
            f"or its id, a pair of integers; not {_args.show(pool_id)}"
        ) from None


#: Pool kinds of the tags engines use (graphcheck.sleep and torch_memory_saver alike).
TAG_KINDS = {"weights": "weights", "kv_cache": "kv_cache"}


def tms_pools() -> list:
    """torch_memory_saver's regions, where that package is imported and has made one:
    ``(name, kind, sleep, MemPool)`` per region it keeps a ``MemPool`` for (one per tag,
    CPU backup, disk backup, backup backend and device; its ``torch`` and ``preload``
    modes alike), so that manifests and snapshots attribute its memory to its tags
    without the user declaring them. A region paused without a CPU or disk backup comes
    back with its contents lost: ``discarded``; with one, ``restored``. The name is the tag,
    and where several regions share a tag, the tag with what sets the region apart
    (``kv_cache (cpu backup)``, ``weights (device 1)``). Read from the package's private
    state (``torch_memory_saver.torch_memory_saver._impl._mem_pools``, version 0.0.10);
    a package whose state looks otherwise gives none."""
    import sys

    module = sys.modules.get("torch_memory_saver")
    saver = getattr(module, "torch_memory_saver", None) if module is not None else None
    impl = saver.__dict__.get("_impl") if hasattr(saver, "__dict__") else None
    pools = getattr(impl, "_mem_pools", None) if impl is not None else None
    if not isinstance(pools, Mapping):
        return []
    regions = []
    for key, pool in list(pools.items()):
        if not (isinstance(key, tuple) and len(key) >= 3 and isinstance(key[0], str)):
            continue
        regions.append((key, pool))
    shared: dict = {}
    for key, _ in regions:
        shared[key[0]] = shared.get(key[0], 0) + 1
    out = []
    for key, pool in regions:
        tag, cpu, disk = key[0], bool(key[1]), bool(key[2])
        device = key[4] if len(key) > 4 else None
        name = tag
        if shared[tag] > 1:
            apart = ["cpu backup" if cpu else "disk backup" if disk else "no backup"]
            if isinstance(device, int) and device != 0:
                apart.append(f"device {device}")
            name = f"{tag} ({', '.join(apart)})"
        sleep = "restored" if cpu or disk else "discarded"
        out.append((name, TAG_KINDS.get(tag, "other"), sleep, pool))
    return out


#: The module of vLLM's sleep allocator, looked up where it is imported (never imported).
CUMEM_MODULE = "vllm.device_allocator.cumem"


def cumem_regions() -> list:
    """vLLM's sleep allocator (``CuMemAllocator``), where the process has one: ``(tag, kind,
    sleep, ranges)`` per tag of its allocations, sorted by tag, ``ranges`` the ``(base,
    size)`` of each allocation under the tag, sorted. Read from the allocator's own table
    (``CuMemAllocator.instance.pointer_to_data``: allocation base to ``AllocationData``,
    whose ``handle`` is ``(device, size, base, handle)`` and ``tag`` the tag of the
    ``use_memory_pool`` context it was made in; vLLM 0.24.0), so a tensor's pool is the tag
    of the allocation holding its address, whatever ``MemPool`` torch made it in.

    The sleep policy is vLLM's worker's (``Worker.sleep``): ``sleep(level=1)`` backs up
    ``weights`` to the host and discards every other tag, ``sleep(level=2)`` discards them
    all and the engine reloads the weights. So ``weights`` is ``restored`` (its parameters
    and buffers come back, by copy or by reload) and any other tag (``kv_cache``, vLLM's
    ``default``) ``discarded``, at either level. (The allocator called directly as
    ``CuMemAllocator.sleep()``, with no tags, backs up ``default`` instead: not what the
    worker does.)

    A process where vLLM's module is not imported, or its allocator not made, has none. An
    allocator whose table does not read as above warns (what is off) and gives none: its
    pools would be guesses."""
    import sys

    module = sys.modules.get(CUMEM_MODULE)
    cls = getattr(module, "CuMemAllocator", None) if module is not None else None
    instance = getattr(cls, "instance", None) if cls is not None else None
    if instance is None:
        return []
    table = getattr(instance, "pointer_to_data", None)
    by_tag: dict = {}
    problem = None
    if not isinstance(table, Mapping):
        problem = f"pointer_to_data is {type(table).__name__}, not a dict"
    else:
        for base, data in list(table.items()):
            handle, tag = getattr(data, "handle", None), getattr(data, "tag", None)
            if not (
                isinstance(base, int)
                and isinstance(tag, str)
                and isinstance(handle, tuple)
                and len(handle) == 4
                and all(isinstance(x, int) for x in handle)
                and handle[2] == base
                and handle[1] > 0
            ):
                key = hex(base) if isinstance(base, int) else _args.show(base)
                problem = (
                    f"pointer_to_data[{key}] is not an allocation: handle {_args.show(handle)}, "
                    f"tag {_args.show(tag)}; vLLM's is a (device, size, base, handle) tuple "
                    "and a str"
                )
                break
            by_tag.setdefault(tag, []).append((base, handle[1]))
    if problem is not None:
        import warnings

        message = (
            f"graphcheck: vLLM's CuMemAllocator reads otherwise than vLLM 0.24.0's ({problem}); "
            "its tags are not read into pools"
        )
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001 - a warning made an error must not lose the manifest
            print(message, file=sys.stderr)
        return []
    return [
        (tag, TAG_KINDS.get(tag, "other"), "restored" if tag == "weights" else "discarded", sorted(ranges))
        for tag, ranges in sorted(by_tag.items())
    ]


def cumem_pool_ranges(regions: list, pool_ids: Mapping[str, int]) -> list:
    """The ``pool_ranges`` the core's builders take (``{"base", "size", "pool"}``) of
    :func:`cumem_regions`'s ``regions``, each tag's allocations in the pool ``pool_ids``
    names for it; a tag without one is left out. The manifest's and the live snapshot's
    alike."""
    return [
        {"base": hex(base), "size": size, "pool": pool_ids[tag]}
        for tag, _, _, ranges in regions
        if tag in pool_ids
        for base, size in ranges
    ]


def memory_segments() -> list:
    """``torch.cuda.memory_snapshot()``: the caching allocator's segments as torch gives
    them (blocks with their ``frames`` where memory history is on); [] where CUDA is not in
    use. Called once per :meth:`Recorder.build_spec` and per :func:`snapshot`: the segments
    serve pool attribution, probes and allocation sites alike."""
    torch = import_torch()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    try:  # torch >= 2.13 can leave the trace ring out (cheaper); older takes no argument
        return torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:
        return torch.cuda.memory_snapshot()


#: Frames kept per allocation site, innermost first.
ALLOC_SITE_FRAMES = 16


def _torch_dir() -> str:
    torch = import_torch()
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _python_frames(frames: list) -> list:
    """A block's frames as format ``Frame`` dicts, innermost first: the Python ones (those
    of ``_record_memory_history(stacks="all")`` from C++ are dropped where Python frames
    exist), without the innermost ones inside torch itself (``Module._apply`` of a
    ``.cuda()``, ``nn.Linear.__init__``: the caller's line is the site), at most
    :data:`ALLOC_SITE_FRAMES`."""
    out: list[tuple[bool, dict[str, Any]]] = []
    for f in frames:
        name = str(f.get("filename", ""))
        out.append(
            (
                name.endswith(".py") or name.startswith("<"),
                {"filename": name, "line": max(0, int(f.get("line", 0))), "name": str(f.get("name", ""))},
            )
        )
    python = [f for is_py, f in out if is_py] or [f for _, f in out]
    inside = _torch_dir()
    first = 0
    while first < len(python) - 1 and python[first]["filename"].startswith(inside):
        first += 1
    return python[first : first + ALLOC_SITE_FRAMES]


class AllocSites:
    """Allocation sites by address, from the blocks of allocator segments that carry
    ``frames`` (``torch.cuda.memory._record_memory_history`` on); empty otherwise, and then
    free to query."""

    def __init__(self, segments: list):
        blocks = []
        for s in segments:
            for b in s.get("blocks", []):
                if b.get("frames"):
                    blocks.append((b["address"], b["size"], b["frames"]))
        blocks.sort(key=lambda b: b[0])
        self.blocks = blocks
        self.starts = [b[0] for b in blocks]
        self.cache: dict = {}

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def at(self, addr: int) -> list:
        """The frames of the block holding ``addr`` ([] where none is known)."""
        if not self.blocks:
            return []
        block = _find(self.blocks, self.starts, addr)
        if block is None:
            return []
        key = block[0]
        if key not in self.cache:
            self.cache[key] = _python_frames(block[2])
        return self.cache[key]

    def annotate(self, specs: list, records: list) -> None:
        """Sets ``alloc_site`` on each ``TensorSpec`` (``specs[i]`` of ``records[i]``)."""
        if not self.blocks:
            return
        for spec, rec in zip(specs, records):
            site = self.at(rec.storage_base)
            if site:
                spec["alloc_site"] = site


def segment_facts(raw: list) -> list:
    """The allocator's segments as the core's builders take them
    (``graphcheck::resolve::facts::Segment``): base, size, pool and blocks."""
    return [
        {
            "base": hex(s["address"]),
            "size": s["total_size"],
            "pool": [int(x) for x in s.get("segment_pool_id", (0, 0))],
            "blocks": [
                {"addr": hex(b["address"]), "size": b["size"], "state": b["state"]}
                for b in s.get("blocks", [])
            ],
        }
        for s in raw
    ]


def pool_segments(keys: Iterable[tuple]) -> list:
    """``(base, size)`` of the caching allocator's segments in the pools ``keys``, sorted.
    One snapshot per pool where torch takes a pool id (cheap: a graph pool has few
    segments); else one snapshot of every segment, filtered."""
    torch = import_torch()
    keys = set(keys)
    found = set()
    try:
        for key in keys:
            try:
                segs = torch.cuda.memory_snapshot(mempool_id=key, include_traces=False)
            except TypeError:  # torch < 2.13 has no include_traces
                segs = torch.cuda.memory_snapshot(mempool_id=key)
            for s in segs:
                if tuple(s.get("segment_pool_id", key)) == key:
                    found.add((s["address"], s["total_size"]))
    except Exception:  # noqa: BLE001 - no per-pool snapshot in this torch
        found = {
            (s["address"], s["total_size"])
            for s in memory_segments()
            if tuple(s.get("segment_pool_id", (0, 0))) in keys
        }
    return sorted(found)


def _find(ranges: list, starts: list, addr: int):
    """The ``(base, size, …)`` tuple holding ``addr``."""
    i = bisect.bisect_right(starts, addr) - 1
    if i < 0:
        return None
    r = ranges[i]
    base, size = r[0], r[1]
    return r if base <= addr < base + size else None
