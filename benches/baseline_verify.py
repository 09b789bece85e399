#!/usr/bin/env python3
"""The benchmark's baseline: `graphcheck verify` in plain Python, json and dicts only.

This script mirrors docs/findings.md, the contract `graphcheck verify` implements, so that
benches/verify_bench.py can time graphcheck against what a competent Python engineer would
write instead: `json.load` both documents, index them with dicts, and compute every
finding kind (vanished, drifted, freed, reused, reshaped, stale, unregistered, mispooled,
unowned, and unused_allow under an allowlist). Where an interval lookup is needed (probes
inside a subject's span, live tensors containing an address) it uses sorted arrays with
`bisect` and a sweep, never a quadratic scan; storages and views are looked up in dicts. It is meant as a fair baseline, not a
strawman; tests/python/test_baseline.py proves it reports what the fixture index expects.

It reads both format versions: format 1 as it is, and format 2 (columns) the way such a
script would: each column table zipped into records, and each node's touch arrays read in
place, an absolute address computed only for the touches that need one (`read`). `expand`
turns a format 2 document into format 1's layout whole; tests/python/test_baseline.py holds
both to what graphcheck's own reader gives.

Usage: baseline_verify.py MANIFEST [LIVE] [--allow FILE]

Prints a JSON list of {"kind", "subject"} in report order (kind, then subject) and exits
0 when there is no finding but warnings (`unused_allow`), 1 when there are findings, 2 on
bad input or usage.
"""

import argparse
import gc
import heapq
import json
import re
import sys
from bisect import bisect_left
from pathlib import Path

# The documents' and the allowlist's reading, in a module beside this one (also when this
# file is loaded by path, as the tests do).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline_documents import (  # noqa: E402
    KIND_ORDER,
    KIND_RANK,
    BadInput,
    apply_allowlist,
    data_ptr,
    expand,
    glob_regex,
    load_allowlist,
    read,
    suspect_touches,
    touched_tensors,
)

CAPTURE_TIME_KINDS = ("unregistered", "mispooled", "unowned", "unused_allow")

REGISTERED = frozenset(("parameter", "buffer", "buffer_non_persistent", "held"))
NOT_PERSISTENT = frozenset(("graph_input", "graph_pool", "runtime_state"))

EXIT_CLEAN, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


def span_end(t, start):
    """End (exclusive) of a view's span; an empty view spans one byte."""
    return start + max(t["nbytes"], 1)


def same_layout(a, b):
    return (
        a["shape"] == b["shape"]
        and a["stride"] == b["stride"]
        and a["dtype"] == b["dtype"]
        and a["offset"] == b["offset"]
    )


def algorithm(digest):
    """The part of `alg:hex` before the first colon ("" when there is none)."""
    return digest.partition(":")[0] if ":" in digest else ""


def differs(a, b):
    """Two digests of the same algorithm that differ; absent ones never differ."""
    return a is not None and b is not None and algorithm(a) == algorithm(b) and a != b


def is_stale(captured, live_tensor, preserved):
    """The `stale` test: the live contents differ from a fresh load's, or from capture
    across an event that preserves them."""
    return differs(live_tensor.get("reference_digest"), live_tensor.get("digest")) or (
        preserved and differs(captured.get("digest"), live_tensor.get("digest"))
    )


def view_key(t):
    return (data_ptr(t), tuple(t["shape"]), tuple(t["stride"]), t["dtype"])


def storage_of(t):
    return (int(t["storage_base"], 16), t["storage_nbytes"])


def same_storage_object(a, b):
    """Whether `b` may be a view of `a`'s storage object by what the manifest numbers
    (`storage`): where both records carry a number they must agree, since two numbers are
    two storages whatever their addresses; an absent number says nothing either way."""
    x, y = a.get("storage"), b.get("storage")
    return x is None or y is None or x == y


def storage_holds(storage, t):
    """Whether a storage `(base, nbytes)` holds every byte of view `t`'s span."""
    start = data_ptr(t)
    return storage[0] <= start and start + t["nbytes"] <= storage[0] + storage[1]


_HOP = re.compile(r'\.([^.\[\]"]+)|\[(-?\d+)\]|\["((?:[^"\\]|\\.)*)"\]')


def hops(path):
    """An owner path's hops as (kind, value), or None where it does not parse."""
    root = re.match(r'[^.\[\]"]+', path)
    if root is None:
        return None
    out, i = [("attr", root.group(0))], root.end()
    while i < len(path):
        h = _HOP.match(path, i)
        if h is None:
            return None
        if h.group(1) is not None:
            out.append(("attr", h.group(1)))
        elif h.group(2) is not None:
            out.append(("index", int(h.group(2))))
        else:
            out.append(("key", h.group(3)))
        i = h.end()
    return out


def shift_siblings(a, b):
    """Two paths that differ in exactly one hop, a list index in both."""
    x, y = hops(a), hops(b)
    if x is None or y is None or len(x) != len(y):
        return False
    diff = [(p, q) for p, q in zip(x, y) if p != q]
    return len(diff) == 1 and diff[0][0][0] == "index" and diff[0][1][0] == "index"


class Subject:
    """A touched storage view: touched tensors sharing a view key and storage number (two
    numbered storages that held one address at different captures are two subjects), with
    all their owners."""

    __slots__ = (
        "tensor", "start", "end", "tensor_ids", "owners", "persistent", "all_shift", "carriers"
    )

    def __init__(self, tensor, start):
        self.tensor = tensor  # the first in document order: its layout, pool and digest
        self.start = start
        self.end = span_end(tensor, start)
        self.tensor_ids = []
        self.owners = []
        self.persistent = []  # the owners whose tensor must survive sleep/wake and reload
        self.all_shift = True  # no persistent path rebound to a tensor the manifest lacks
        self.carriers = None  # (paths, same-view tensor), computed where needed


def subject_of(owners):
    return " = ".join(sorted({o["path"] for o in owners}))



# --- verify ----------------------------------------------------------------------------


def build_subjects(manifest):
    """Touched tensors grouped by view key and storage number, plus the touches no owned
    tensor explains."""
    tensors = manifest["tensors"]
    owners_of = {}
    for o in manifest["owners"]:
        owners_of.setdefault(o["tensor"], []).append(o)

    touched = touched_tensors(manifest)
    # Touches naming no tensor, or a tensor without owners, are `unowned` candidates; they
    # are rare, so a second pass collects them only when there are any.
    suspects = []  # (touch, tensor id or None)
    if None in touched or any(tid not in owners_of for tid in touched):
        suspects = suspect_touches(manifest, owners_of)
    touched.discard(None)

    by_key = {}
    subject_of_tensor = {}
    for t in tensors:
        tid = t["id"]
        if tid not in touched:
            continue
        start = data_ptr(t)
        # The storage number keeps apart two storages that held this view at different
        # captures, so each is judged for the graphs that captured it; absent (None), the
        # records of one view are one subject as before.
        key = (start, tuple(t["shape"]), tuple(t["stride"]), t["dtype"], t.get("storage"))
        s = by_key.get(key)
        if s is None:
            s = by_key[key] = Subject(t, start)
        s.tensor_ids.append(tid)
        s.owners.extend(owners_of.get(tid, ()))
        subject_of_tensor[tid] = s
    subjects = list(by_key.values())
    for s in subjects:
        s.persistent = [o for o in s.owners if o["registration"] not in NOT_PERSISTENT]
    return subjects, subject_of_tensor, suspects


class Storages:
    """The manifest's tensors and owners by storage, view and path, built on first use.
    Views of one storage share its base, so tensors are grouped by base. A manifest may give
    a path once per storage it held at one capture or another (a parameter rebound between
    two captures), so `owners_at` keeps every record of a path, in document order."""

    def __init__(self, manifest):
        self.manifest = manifest
        self._by_base = None
        self._by_view = None
        self.owners_of = {}
        self.owners_at = {}
        for o in manifest["owners"]:
            self.owners_of.setdefault(o["tensor"], []).append(o)
            self.owners_at.setdefault(o["path"], []).append(o)
        self.tensors = {t["id"]: t for t in manifest["tensors"]}

    def holders(self, t):
        """Manifest tensors whose storage holds every byte of view `t`, of `t`'s storage
        object where the manifest numbers storages: a storage that died and one the
        allocator put in its block share an address, not bytes a reload restores."""
        if self._by_base is None:
            self._by_base = {}
            for m in self.manifest["tensors"]:
                self._by_base.setdefault(storage_of(m)[0], []).append(m)
        return [
            m
            for m in self._by_base.get(storage_of(t)[0], ())
            if storage_holds(storage_of(m), t) and same_storage_object(m, t)
        ]

    def known(self, t):
        """Whether the manifest has a tensor with `t`'s view key and storage."""
        if self._by_view is None:
            self._by_view = {(view_key(m), storage_of(m)) for m in self.manifest["tensors"]}
        return (view_key(t), storage_of(t)) in self._by_view

    def registered_through(self, t):
        """Registered owners of the tensors whose storage holds `t`'s bytes."""
        return [
            o
            for m in self.holders(t)
            for o in self.owners_of.get(m["id"], ())
            if o["registration"] in REGISTERED
        ]


def capture_checks(manifest, subjects, out, storages):
    pool_sleep = {p["id"]: p["sleep"] for p in manifest.get("pools", ())}
    for s in subjects:
        persistent = s.persistent
        if not persistent:
            continue
        paths = [o["path"] for o in persistent]
        # A view into a registered tensor's storage is registered through its owner.
        if not any(o["registration"] in REGISTERED for o in persistent) and not (
            storages.registered_through(s.tensor)
        ):
            out.append(("unregistered", subject_of(persistent), paths))
        pool = s.tensor.get("pool")
        if pool is not None and pool_sleep.get(pool) == "discarded":
            out.append(("mispooled", subject_of(persistent), paths))


class AllocationLookup:
    """The allocation containing an address, for touches that do not name theirs."""

    def __init__(self, allocations):
        ordered = sorted(allocations, key=lambda a: int(a["base"], 16))
        self.starts = [int(a["base"], 16) for a in ordered]
        self.ends = [s + a["size"] for s, a in zip(self.starts, ordered)]
        self.allocs = ordered
        # Running maximum of ends lets the backward scan stop early despite overlaps.
        self.max_end = []
        m = 0
        for e in self.ends:
            m = max(m, e)
            self.max_end.append(m)

    def at(self, addr):
        i = bisect_left(self.starts, addr + 1) - 1
        found = None
        while i >= 0 and self.max_end[i] > addr:
            if self.ends[i] > addr:
                found = self.allocs[i]  # keep going: the smallest start wins
            i -= 1
        return found


def unowned_checks(manifest, subject_of_tensor, suspects, out):
    """`unowned` for every group of touches no owner explains; returns the groups, subject
    -> (the allocation the first touch lay in, or None; the addresses), for the live check."""
    allocations = {a["id"]: a for a in manifest.get("allocations", ())}
    pool_kind = {p["id"]: p["kind"] for p in manifest.get("pools", ())}
    tensors = {t["id"]: t for t in manifest["tensors"]} if suspects else {}
    lookup = None
    groups = {}
    # Bare touches first, then those of ownerless tensors: a group's allocation is its
    # first touch's, as graphcheck takes it.
    for touch, tid in sorted(suspects, key=lambda st: st[1] is not None):
        if tid is not None and subject_of_tensor[tid].owners:
            continue  # an alias of this view has an owner
        aid = touch.get("allocation")
        if aid is not None:
            alloc = allocations[aid]
        else:
            if lookup is None:
                lookup = AllocationLookup(allocations.values())
            alloc = lookup.at(int(touch["addr"], 16))
        if alloc is not None and pool_kind.get(alloc.get("pool")) == "graph":
            continue
        # Named by the ownerless tensor, else by the allocation, else by the address.
        if tid is not None:
            subject = hex(data_ptr(tensors[tid]))
        elif alloc is not None:
            subject = hex(int(alloc["base"], 16))
        else:
            subject = hex(int(touch["addr"], 16))
        groups.setdefault(subject, (alloc, set()))[1].add(int(touch["addr"], 16))
    out.extend(("unowned", addr, ()) for addr in groups)
    return groups


def unowned_live_checks(manifest, live, groups, out):
    """`freed` / `reused` for the unowned groups whose captured allocation is known: a probe
    at one of their addresses free, or unmapped where the captured allocation lay in a
    declared pool (memory another library mapped is unmapped to torch while alive); else
    one active in a live allocation that
    does not hold the captured one and whose base and size no allocation of the manifest
    has."""
    groups = {k: v for k, v in groups.items() if v[0] is not None}
    if not groups:
        return
    probe_at = {}
    for p in live["probes"]:
        probe_at.setdefault(int(p["addr"], 16), p)
    live_allocations = {a["id"]: a for a in live.get("allocations", ())}
    extents = {(int(a["base"], 16), a["size"]) for a in manifest.get("allocations", ())}
    for subject, (captured, addrs) in groups.items():
        probes = [probe_at[a] for a in addrs if a in probe_at]
        in_pool = captured.get("pool") is not None
        if any(p["state"] == "free" or (p["state"] == "unmapped" and in_pool) for p in probes):
            out.append(("freed", subject, ()))
            continue
        lo = int(captured["base"], 16)
        hi = lo + captured["size"]
        for p in probes:
            a = live_allocations.get(p.get("allocation"))
            if a is None:
                continue
            base = int(a["base"], 16)
            holds = base <= lo and hi <= base + a["size"]
            if not holds and (base, a["size"]) not in extents:
                out.append(("reused", subject, ()))
                break


class LiveIndex:
    """The live snapshot by path, tensor and data pointer, and the carriers of subjects."""

    def __init__(self, live, storages):
        self.storages = storages
        self.preserved = live["event"]["contents"] == "preserved"
        tensors = {t["id"]: t for t in live["tensors"]}
        self.at_path = {o["path"]: (o, tensors[o["tensor"]]) for o in live["owners"]}
        self.owners_of = {}
        for o in live["owners"]:
            self.owners_of.setdefault(o["tensor"], []).append(o)
        self.tensors = live["tensors"]
        self._by_ptr = None

    def at_ptr(self, ptr):
        if self._by_ptr is None:
            self._by_ptr = {}
            for t in self.tensors:
                self._by_ptr.setdefault(data_ptr(t), []).append(t)
        return self._by_ptr.get(ptr, ())

    def still_held(self, path):
        """Whether a tensor `path` held at capture is still held, by a persistent owner,
        with its view and storage. A path rebound between two captures held several: any
        of them still held means the path's old tensor moved on, as a shift moves it."""
        for o in self.storages.owners_at.get(path, ()):
            was = self.storages.tensors[o["tensor"]]
            if any(
                view_key(t) == view_key(was)
                and storage_of(t) == storage_of(was)
                and any(
                    q["registration"] not in NOT_PERSISTENT for q in self.owners_of.get(t["id"], ())
                )
                for t in self.at_ptr(data_ptr(was))
            ):
                return True
        return False

    def carriers(self, s):
        """(paths, a carrying tensor with the subject's view) of the live owners, none of
        the subject's, that still reach its bytes: the same storage through a path that
        held it at capture, or a sibling list slot the tensor shifted to."""
        if s.carriers is not None:
            return s.carriers
        t = s.tensor
        mine = {o["path"] for o in s.persistent}
        paths, same_view = set(), None
        for held in self.storages.holders(t):
            for o in self.storages.owners_of.get(held["id"], ()):
                if o["registration"] in NOT_PERSISTENT or o["path"] in mine:
                    continue
                hit = self.at_path.get(o["path"])
                if hit is None:
                    continue
                now, lq = hit
                if now["registration"] not in NOT_PERSISTENT and storage_of(lq) == storage_of(held):
                    paths.add(now["path"])
                    if same_view is None and view_key(lq) == view_key(t):
                        same_view = lq
        for lq in self.at_ptr(s.start):
            if (
                view_key(lq) != view_key(t)
                or storage_of(lq) != storage_of(t)
                or is_stale(t, lq, self.preserved)
            ):
                continue
            for q in self.owners_of.get(lq["id"], ()):
                if (
                    q["registration"] not in NOT_PERSISTENT
                    and q["path"] not in mine
                    and any(shift_siblings(p, q["path"]) for p in mine)
                    and (s.all_shift or self.still_held(q["path"]))
                ):
                    paths.add(q["path"])
                    if same_view is None:
                        same_view = lq
        s.carriers = (paths, same_view)
        return s.carriers

    def drifted_through(self, s):
        """Whether the owners a view is registered through all left its storage, one of
        them for another tensor."""
        moved = False
        for o in self.storages.registered_through(s.tensor):
            hit = self.at_path.get(o["path"])
            if hit is None:
                continue
            if storage_of(hit[1]) == storage_of(self.storages.tensors[o["tensor"]]):
                return False
            moved = True
        return moved


def live_owner_checks(index, subjects, out):
    preserved = index.preserved
    for s in subjects:
        persistent = s.persistent
        if not persistent:
            continue
        t = s.tensor
        kept, gone, rebound = [], [], []  # rebound: (path, known)
        for o in persistent:
            path = o["path"]
            hit = index.at_path.get(path)
            if hit is None:
                gone.append(path)
            elif data_ptr(hit[1]) == s.start:
                kept.append((path, hit[1]))
            else:
                rebound.append((path, index.storages.known(hit[1])))
        s.all_shift = all(known for _, known in rebound)
        # Identity follows the storage: a gone or shifted path is no hazard while the
        # captured bytes are reached.
        reached = bool(kept) or bool(index.carriers(s)[0])
        vanished = [] if reached else gone
        drifted = [p for p, known in rebound if not (known and reached)]
        reshaped, stale = [], []
        for path, lt in kept:
            if not same_layout(t, lt):
                reshaped.append(path)
            elif is_stale(t, lt, preserved):
                stale.append(path)
        all_paths = [o["path"] for o in persistent]
        if not drifted and not any(o["registration"] in REGISTERED for o in persistent):
            if index.drifted_through(s):
                drifted = all_paths
        if not stale and not kept and reached:
            same_view = index.carriers(s)[1]
            if same_view is not None and is_stale(t, same_view, preserved):
                stale = all_paths
        for kind, paths in (
            ("vanished", vanished),
            ("drifted", drifted),
            ("reshaped", reshaped),
            ("stale", stale),
        ):
            if paths:
                out.append((kind, " = ".join(sorted(set(paths))), paths))


def live_address_checks(live, subjects, out, index):
    probes = live["probes"]
    probe_addr = [int(p["addr"], 16) for p in probes]
    by_addr = sorted(range(len(probes)), key=probe_addr.__getitem__)
    sorted_addr = [probe_addr[i] for i in by_addr]

    # Subjects whose first probe (in document order) says the address is still active.
    active = []
    for s in subjects:
        persistent = s.persistent
        if not persistent:
            continue
        lo = bisect_left(sorted_addr, s.start)
        hi = bisect_left(sorted_addr, s.end, lo)
        if lo == hi:
            continue
        state = probes[min(by_addr[lo:hi])]["state"]
        if state == "active":
            active.append((s, persistent))
        else:  # free or unmapped
            out.append(("freed", subject_of(persistent), [o["path"] for o in persistent]))
    if not active:
        return

    # Which owned live tensors contain each active subject's data pointer: a sweep over
    # addresses, keeping the tensors open at the current point (a heap evicts by end).
    paths_of = {}
    for o in live["owners"]:
        paths_of.setdefault(o["tensor"], []).append(o["path"])
    spans = []
    for t in live["tensors"]:
        paths = paths_of.get(t["id"])
        if paths:
            start = data_ptr(t)
            spans.append((start, span_end(t, start), paths))
    spans.sort(key=lambda x: x[0])
    active.sort(key=lambda x: x[0].start)
    open_spans = {}
    ends = []
    j = 0
    for s, persistent in active:
        point = s.start
        while j < len(spans) and spans[j][0] <= point:
            heapq.heappush(ends, (spans[j][1], j))
            open_spans[j] = spans[j][2]
            j += 1
        while ends and ends[0][0] <= point:
            del open_spans[heapq.heappop(ends)[1]]
        if not open_spans:
            continue
        # "An owner path of the subject": any of its owners, persistent or not; a carrier
        # holds the captured storage itself.
        mine = {o["path"] for o in s.owners}
        here = [p for paths in open_spans.values() for p in paths]
        if not any(p in mine for p in here):
            carriers = index.carriers(s)[0]
            if not any(p in carriers for p in here):
                out.append(("reused", subject_of(persistent), [o["path"] for o in persistent]))


def report_order(found):
    pairs = [(kind, subject) for kind, subject, _ in found]
    pairs.sort(key=lambda f: (KIND_RANK[f[0]], f[1]))
    return pairs


def verify(manifest, live=None, allow=None):
    """(findings, allowed): (kind, subject) pairs, each list in report order. The
    documents are as `json.load` gives them, in either format version."""
    manifest = read(manifest)
    live = read(live) if live is not None else None
    subjects, subject_of_tensor, suspects = build_subjects(manifest)
    found = []  # (kind, subject, the owner paths an allowlist entry may match)
    storages = Storages(manifest)
    capture_checks(manifest, subjects, found, storages)
    unowned = unowned_checks(manifest, subject_of_tensor, suspects, found)
    if live is not None:
        index = LiveIndex(live, storages)
        live_owner_checks(index, subjects, found)
        live_address_checks(live, subjects, found, index)
        unowned_live_checks(manifest, live, unowned, found)
    allowed = []
    if allow is not None:
        checked = KIND_ORDER if live is not None else CAPTURE_TIME_KINDS
        found, allowed = apply_allowlist(found, allow, checked)
    return report_order(found), report_order(allowed)


def load_document(path, kind):
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: {e}") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format_version") not in (1, 2)
        or doc.get("kind") != kind
    ):
        raise BadInput(f"{path}: not a format 1 or 2 `{kind}` document")
    return doc


def main(argv=None):
    # Loading builds millions of dicts; the cyclic collector would rescan them again and
    # again for nothing (the documents hold no cycles). Every bulk loader does this.
    gc.disable()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest")
    parser.add_argument("live", nargs="?")
    parser.add_argument("--allow", metavar="FILE", help="allowlist (TOML)")
    args = parser.parse_args(argv)
    try:
        manifest = load_document(args.manifest, "manifest")
        live = load_document(args.live, "live") if args.live else None
        allow = load_allowlist(args.allow) if args.allow else None
        findings, _ = verify(manifest, live, allow)
    except (BadInput, KeyError, TypeError, ValueError) as e:
        print(f"baseline_verify: bad input: {e!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out = sys.stdout
    out.write("[\n" if findings else "[")
    out.write(",\n".join(json.dumps({"kind": k, "subject": s}) for k, s in findings))
    out.write("\n]\n" if findings else "]\n")
    # An unused allowlist entry is a warning: printed, but it does not fail the run.
    failing = [k for k, _ in findings if k != "unused_allow"]
    return EXIT_FINDINGS if failing else EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
