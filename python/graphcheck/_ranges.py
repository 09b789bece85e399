"""Address ranges the recorder works with: ``(base, size)`` pairs packed for the native
side, checked where a caller gives them, and the memory graphs read that no owner
explains, digested at the moment a manifest's facts are frozen (issue 32).

A manifest with digests records the allocator blocks holding its ``unowned`` addresses
with their contents (the manifest's ``ranges``), as they were at the latest capture. Which
blocks those are is known only from the whole build; the build itself may run later (on
the writer thread, or at the check after a wake, when the contents are no longer the
capture's). So the freeze digests a superset now, the blocks holding any address a graph
read that nothing the recorder knew explained at its capture (in a pool the recorder
declares), and the build looks the digests up (:func:`looked_up`) instead of reading
memory: a capture no longer builds the manifest of every graph so far."""

from __future__ import annotations

import array
import bisect
from typing import Callable, Iterable, Mapping

from . import _args, _digest
from ._native import GraphcheckError

__all__ = ["blocks_holding", "digested", "frozen_digests", "looked_up", "pack", "ranges_arg"]

#: The block states of memory a tensor holds (``graphcheck::resolve::facts::BlockState``).
_ACTIVE = ("active_allocated", "active_pending_free")


def pack(ranges: Iterable[tuple]) -> bytes:
    """``(base, size)`` pairs as native-endian ``u64`` words (``Walked.unexplained``)."""
    flat = array.array("Q")
    for base, size in ranges:
        if 0 <= base < 1 << 64 and 0 < size < 1 << 64:
            flat.append(base)
            flat.append(size)
    return flat.tobytes()


def ranges_arg(ranges) -> list:
    """``(base, size)`` pairs of non-negative integers."""
    if isinstance(ranges, (str, bytes, Mapping)) or not _args.iterable(ranges):
        raise GraphcheckError(f"ranges is a list of (base, size) pairs, not {_args.show(ranges)}")
    out = []
    for i, pair in enumerate(ranges):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise GraphcheckError(f"ranges[{i}] is a (base, size) pair, not {_args.show(pair)}")
        out.append((
            _args.integer(f"ranges[{i}] base", pair[0], minimum=0),
            _args.integer(f"ranges[{i}] size", pair[1], minimum=0),
        ))
    return out


def blocks_holding(raw_segments: list, addrs: Iterable[int], bound: Iterable[tuple], declared: list) -> list:
    """The active blocks of the allocator's segments (torch's memory snapshot) holding one of
    ``addrs``, sorted, each once, as the build finds them (``spec::blocks_holding``), where
    the address is in a declared pool: its segment's pool key is one of ``bound``, or a
    ``(base, size)`` of ``declared`` holds it (the build digests those only)."""
    addrs = sorted(set(addrs))
    if not addrs or not raw_segments:
        return []
    bound = set(bound)
    segs = sorted((s["address"], s["total_size"], i) for i, s in enumerate(raw_segments))
    starts = [s[0] for s in segs]
    out = set()
    for a in addrs:
        i = bisect.bisect_right(starts, a) - 1
        if i < 0 or a - segs[i][0] >= segs[i][1]:
            continue
        seg = raw_segments[segs[i][2]]
        key = tuple(int(x) for x in seg.get("segment_pool_id", (0, 0)))
        if key not in bound and not any(base <= a < base + size for base, size in declared):
            continue
        for b in seg.get("blocks", ()):
            if b["state"] in _ACTIVE and 0 <= a - b["address"] < b["size"]:
                out.add((b["address"], b["size"]))
                break
    return sorted(out)


def digested(blocks: list) -> list:
    """The digests :func:`graphcheck._digest.range_digests` gives for ``blocks`` now, one per
    block (``None``: not read), checked to be one per block."""
    if not blocks:
        return []
    got = _digest.range_digests(blocks)  # looked up at each call: the CPU tests fake it
    try:
        got = list(got)
    except TypeError as e:
        raise GraphcheckError(f"ranges: returns a list of digests (str or None): {e}") from None
    if len(got) != len(blocks):
        raise GraphcheckError(f"ranges: returned {len(got)} digests for {len(blocks)} ranges")
    return got


def frozen_digests(raw_segments: list, addrs: Iterable[int], bound: Iterable[tuple], pool_ranges: list) -> dict:
    """``{(base, size): digest}`` of the blocks :func:`blocks_holding` finds, read now.
    ``pool_ranges`` are the freeze's (``{"base": hex, "size": n, ...}``)."""
    declared = [(int(r["base"], 16), int(r["size"])) for r in pool_ranges]
    blocks = blocks_holding(raw_segments, addrs, bound, declared)
    return dict(zip(blocks, digested(blocks)))


def looked_up(digests: dict, late: Callable[[list], list]) -> Callable[[list], list]:
    """The build's digester (``_native.build_manifest``'s ``ranges``): each block's digest as
    frozen; ``late`` gives those of the blocks the freeze did not digest."""

    def ranges(wanted: list) -> list:
        wanted = [tuple(r) for r in wanted]
        missing = [r for r in wanted if r not in digests]
        found = dict(zip(missing, late(missing))) if missing else {}
        return [digests[r] if r in digests else found[r] for r in wanted]

    return ranges
