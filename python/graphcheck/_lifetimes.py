"""Storage lifetimes of a :class:`graphcheck._recorder.Recorder`: when each storage the
walks saw was born and died, counted in graph events (each added graph, and each graph
walked again after a retarget), and how the build spec says which storage each graph read
(``storage`` numbers and ``alive`` positions, ``docs/format.md``)."""

from __future__ import annotations

import bisect

from ._registry import Registry
from ._tensors import view_key

__all__ = ["death_noter", "number_storages", "owners_by_storage"]


def death_noter(recorder_ref, life: list):
    """The callback that ends a storage's lifetime at the graphs added when it dies."""

    def died(_ref) -> None:
        recorder = recorder_ref()
        if recorder is not None and life[2] is None:
            life[2] = recorder._epoch

    return died


def _alive(life: list, epochs: list) -> list:
    """A lifetime's graph events as positions among the graphs (``TensorSpec.alive``):
    the first graph whose event is at or after its birth, and the first at or after its
    death (``None`` while it lives). The graphs are in the order of their events."""
    first = bisect.bisect_left(epochs, life[1])
    return [first, None if life[2] is None else bisect.bisect_left(epochs, life[2])]


def number_storages(specs: list, records: list, epochs: list) -> None:
    """Where two records have one view but are different storages (one died, another
    took its memory), each spec says its storage's number and the graphs alive at its
    capture, so that each graph names the one it read; other specs are left as they are."""
    by_view: dict = {}
    for i, rec in enumerate(records):
        by_view.setdefault(view_key(rec.meta), []).append(i)
    for same in by_view.values():
        lives = [records[i].lifetime for i in same]
        if len(same) < 2 or len({life[0] for life in lives if life is not None}) < 2:
            continue
        for i, life in zip(same, lives):
            if life is not None and i < len(specs):
                specs[i]["storage"] = life[0]
                specs[i]["alive"] = _alive(life, epochs)


def owners_by_storage(specs: list, reg: Registry, epochs: list) -> list:
    """The owner specs, with each path a walk found holding another storage than an
    earlier walk did (:attr:`Registry.held_before`) given once per storage: each of its
    storages numbered, with the graphs alive at its capture, so that a graph captured
    before the rebinding names the storage it read. A path whose storages cannot all be
    numbered (an object without weak references has no lifetime) is given once, as
    before."""
    owners = reg.owner_specs()
    if not reg.held_before:
        return owners
    now = {o.path: o.tensor for o in reg.owners}
    groups: dict = {}
    for o in reg.held_before:
        groups.setdefault(o.path, [now[o.path]]).append(o.tensor)
    unnumbered = set()
    for path, group in groups.items():
        lives = [reg.tensors[i].lifetime for i in group]
        if any(life is None for life in lives) or len({life[0] for life in lives}) < len(lives):
            unnumbered.add(path)
            continue
        for i, life in zip(group, lives):
            specs[i]["storage"] = life[0]
            specs[i]["alive"] = _alive(life, epochs)
    if not unnumbered:
        return owners
    first = len(reg.owners)
    return owners[:first] + [o for o in owners[first:] if o["path"] not in unnumbered]
