"""Recording: :class:`Recorder` collects the walked graphs of one model (one per batch
size, say) and builds their manifest in the core, keeping the owners current as graphs
are added (``_capture.graph`` is ``torch.cuda.graph`` that records into one).
"""

from __future__ import annotations

import json
import uuid
import weakref
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Union

from . import _args, _caching_allocator, _native, _ranges, _sleep_state
from ._caching_allocator import AllocSites, pool_key, pool_segments
from ._digest import digests_arg
from ._native import GraphcheckError
from ._paths import attr_hop, key_hop
from ._producer import producer as producer_block
from ._lifetimes import death_noter, number_storages, owners_by_storage
from ._registry import Registry
from ._torch_import import import_torch
from ._walk import DEFAULT_MAX_DEPTH, root_arg, walk_roots

__all__ = ["Frozen", "OwnersNotCurrent", "Recorder", "fatal", "tensors_arg", "walk_graph"]


def walk_graph(handle: int):
    """The walked graph of a ``cudaGraph_t``, by the Rust walker, kept on the Rust side
    (``_native.Walked``): on the capture path no JSON is made or parsed."""
    walker = getattr(_native, "walk", None)
    if walker is None:
        raise GraphcheckError(
            "this build of graphcheck has no CUDA graph walker (the crate feature `cuda`)"
        )
    return walker(handle)


class OwnersNotCurrent(GraphcheckError):
    """:meth:`Recorder.add_graph` added the graph, but could not walk the roots to keep its
    owners current (the cause is chained)."""


_POOL_KINDS = ("default", "graph", "weights", "kv_cache", "other")
_SLEEP = ("untouched", "restored", "discarded")


class Frozen(NamedTuple):
    """What :meth:`Recorder.freeze` read: the facts of one moment a manifest is built from.

    ``graphs``, ``walked`` and ``epochs`` are the recorder's own lists with their lengths
    then (``(list, n)``; :meth:`upto`): a freeze at every capture copied all three, which
    made recording N graphs cost N² (1.0 s of the 1.5 s instrument() added to 1,718
    captures on the H200). The recorder only ever appends to a list a freeze may hold;
    anything else (a graph moved to the end, an entry changed) makes a new list and new
    entries."""

    registry: Registry
    tensors: Optional[list]  # the tensor specs, where digests were taken then
    raw_segments: list
    pools: list
    pool_ranges: list
    pool_bindings: list
    graphs: tuple  # (the recorder's graph entries, how many were recorded then)
    walked: tuple  # (its _native.Walked list, its length then)
    producer: dict
    digests: Optional[str]
    epochs: tuple = ([], 0)  # each graph's event (Recorder._epochs), in the order of graphs
    #: With digests, the digests of the blocks holding what the graphs read that nothing
    #: known explained, read then (``_ranges.frozen_digests``), which the build looks up.
    ranges: Optional[dict] = None

    @staticmethod
    def upto(held: tuple) -> list:
        """The first n items of a held ``(list, n)``."""
        items, n = held
        return items[:n]


class Recorder:
    """Collects the graphs of one model (one per batch size, say) into one manifest.

    **Owners stay current.** The model (and every root) is walked when the first graph is
    added. Each later graph is checked against what the recorder knows, natively and
    without a walk: the storages of the registry's tensors (those still alive where the
    walk saw them: the memory of a tensor that died since may hold a new one), the graphs'
    declared inputs and outputs, the memory of graph pools (and of the graph's own
    allocation nodes), and the addresses earlier walks could not explain either (torch's
    cuBLAS workspace, a module-level global). A word outside all of them — a tensor made
    after the last walk, such as a later graph's input, a lazily allocated workspace or a
    tensor in a dead one's memory — makes the recorder walk again at once, while that
    tensor is alive. Where such walks explain nothing (each graph reading an input of its
    own that no root holds), the next ones wait: a walk that found none of the new
    addresses doubles how many graphs with unexplained words pass before the next (up to
    64), and one that finds something resets it; :meth:`catch_up` walks for the addresses
    left waiting (``instrument()`` does at its last write). Words the kernel's signature sets aside (index slots, torch's RNG
    state) never do. A new walk keeps what earlier walks found and it no longer reaches
    (:meth:`Registry.absorb`): graphs captured before keep their capture-time owners, a
    dead tensor as a tensor of its own even where a new one now has its address and
    layout. :attr:`walks` counts the walks; :meth:`rewalk` walks now. Where that walk
    fails, :meth:`add_graph` has added the graph and raises an error that says so: its
    owners may be stale until the next walk, which the next graph or manifest makes.

    What the check does not see: a tensor made inside a graph pool (allocated during a
    capture and kept), or in the storage of a tensor the registry knows (a new view of
    it), or at an address an earlier walk found ownerless, is not a reason to walk; the
    next walk, or :meth:`rewalk`, finds it.

    Graphs come as walked graphs (the core's WalkedGraph, as JSON or dict): :meth:`record`
    reads a captured ``torch.cuda.CUDAGraph`` with the Rust walker; :meth:`add_graph` takes
    one read any other way (the CPU tests write them by hand)."""

    def __init__(
        self,
        model,
        *,
        root: str = "model",
        max_depth: int = DEFAULT_MAX_DEPTH,
        runtime_state: Iterable[str] = (),
        digests: Union[bool, str] = False,
        producer: Optional[Mapping[str, Any]] = None,
    ):
        root = _args.text("root", root)
        _native.check_path(root)
        if model is not None:
            root_arg("model", model)
        self.model = model
        self.root = root
        # (root name, object or weak reference): model first, then add_root's.
        self._roots: list = [] if model is None else [(root, model)]
        self.max_depth = _args.integer("max_depth", max_depth, minimum=0)
        self.runtime_state = tuple(
            _args.strings("runtime_state", runtime_state, "owner-path globs")
        )
        self.digests: Optional[str] = digests_arg("digests", digests) or None
        self.producer = dict(_args.optional_mapping("producer", producer) or {})
        #: This recorder's producer session: its manifests and the snapshots taken with it
        #: (``snapshot(..., recorder=)``, the replay check, :func:`retarget`) number each
        #: storage object alike, so that verify tells a new storage the allocator put in a
        #: dead one's block from the captured one (``docs/format.md``, "Storage numbers").
        self.session = uuid.uuid4().hex
        self.registry: Optional[Registry] = None
        #: Walks of the roots so far (the first graph's, and every one a later graph's
        #: unexplained address asked for).
        self.walks = 0
        # A root was added since the last walk: the next graph or manifest walks.
        self._stale = False
        self._pools: list = []
        self._pool_by_key: dict = {}
        self._pool_ranges: list = []
        self._graphs: list = []
        # The storages the walks saw, each with the graphs alive at its capture: a tensor
        # a graph captured may die and another take its memory before the next capture.
        self._lifetimes: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()
        self._watched: list = []  # the weak references whose callbacks note a death
        # Lifetimes count graph events, not graphs: each added graph is one, and so is
        # each graph walked again after a retarget (it reads, from then on, what was alive
        # then), which moves to the end of the graphs. The graphs are thus in the order of
        # their events, `_epochs` holding each one's.
        self._epoch = 0  # graph events so far
        self._epochs: list = []  # the event of each of _graphs, increasing
        self._graphs_walked = 0  # graph events before the last walk
        self._walked: list = []  # _native.Walked objects, by graphs' walked_index
        #: The retargets applied to the recorded graphs (``graphcheck.torch.retarget``), in
        #: order: each ``{"graphs": [...], "edits": n, "time": seconds since the epoch}``.
        self.retargets: list = []
        self._extra: list = []  # (path, tensor, registration)
        # What explains an address without a walk (class docstring), packed as (base,
        # size) words for Walked.unexplained, each part when it changes: the storages of
        # the registry's records still current (checked at every graph: a tensor that died
        # since the walk explains nothing); the extra tensors' storages (appended); the
        # declared ranges and the allocator's segments of graph pools (read when a word
        # falls outside everything else); addresses a walk left ownerless.
        self._registry_ranges: Optional[list] = None
        self._registry_known = b""
        self._extra_ranges: set = set()
        self._extra_known = b""
        self._graph_pool_ranges: list = []
        self._graph_segments: list = []
        self._pool_known = b""
        self._ownerless: set = set()
        self._ownerless_known = b""
        # With digests: every address a graph read that the registry, the extra tensors
        # and the graph pools did not explain at its capture (the freeze digests the
        # blocks holding them: _ranges).
        self._unexplained_seen: set = set()
        # The graphs since the last walk that read addresses nothing explains, those
        # addresses, and how many such graphs pass before the next walk (doubled by a walk
        # that explained none).
        self._waiting: list = []
        self._waiting_addrs: set = set()
        self._backoff = 1
        self._known: Optional[bytes] = None

    def add_root(self, obj, root: str = "model", *, weak: bool = False) -> None:
        """Adds a root to walk beside the model (a draft model, a KV-cache manager), or the
        first root of a recorder made with ``model=None``. ``weak`` holds it by weak
        reference (a root that dies is left out). The next manifest walks again."""
        _native.check_path(_args.text("root", root))
        root_arg("obj", obj)
        weak = _args.flag("weak", weak)
        if any(r == root for r, _ in self._roots):
            raise GraphcheckError(f"root {root!r} is already recorded")
        ref = obj
        if weak:
            try:
                ref = weakref.ref(obj)
            except TypeError:
                pass
        self._roots.append((root, ref))
        if self.model is None and len(self._roots) == 1 and not weak:
            self.model, self.root = obj, root
        self._stale = True

    def roots(self) -> dict:
        """Root name → object, of the roots still alive."""
        out = {}
        for r, obj in self._roots:
            if isinstance(obj, weakref.ref):
                obj = obj()
                if obj is None:
                    continue
            out[r] = obj
        return out

    def replace_walked(self, name: str, walked: "_native.Walked") -> None:
        """Puts ``walked``, a new walk of graph ``name``'s template, in place of the walk it
        was recorded with: after a retarget patched the graph (``graphcheck.torch.retarget``)
        the manifest describes what it reads now. Raises :class:`GraphcheckError` for a
        name the recorder has not recorded."""
        self._replace_walks({name: walked})

    def _replace_walks(self, walks: Mapping[str, Any]) -> None:
        """:meth:`replace_walked` of each graph name → walk, in one pass over the graphs
        (one call per graph copied every list each time: quadratic at 1,700 graphs); none
        is replaced where one name is unknown."""
        at = self._first_entries(walks)
        # New lists and new entries: a freeze may hold the old ones (Frozen).
        moved = set(at.values())
        graphs = [e for i, e in enumerate(self._graphs) if i not in moved]
        epochs = [x for i, x in enumerate(self._epochs) if i not in moved]
        self._walked = list(self._walked)
        for name, walked in walks.items():
            entry = {k: v for k, v in self._graphs[at[name]].items() if k != "walked"}
            if "walked_index" in entry:
                self._walked[entry["walked_index"]] = walked
            else:
                entry["walked_index"] = len(self._walked)
                self._walked.append(walked)
            # A graph event of its own: its words name what is alive now, not what was at
            # its capture (a storage born since is what it reads; one that died since is
            # not), so it moves to the end, as a graph captured now.
            graphs.append(entry)
            epochs.append(self._epoch)
            self._epoch += 1
        self._graphs, self._epochs = graphs, epochs
        for walked in walks.values():
            self._note_unexplained(walked)

    def _first_entries(self, names: Iterable[str]) -> dict:
        """Name → index of the first graph entry of that name, for every name, or a
        :class:`GraphcheckError` naming one the recorder has not recorded."""
        want, at = set(names), {}
        for i, entry in enumerate(self._graphs):
            if entry["name"] in want and entry["name"] not in at:
                at[entry["name"]] = i
        for name in names:
            if name not in at:
                raise GraphcheckError(f"the recorder has no graph named {name!r}")
        return at

    def note_retarget(self, name: str, record: dict) -> None:
        """Notes a retarget applied to graph ``name`` (``{"event", "edits", "time"}``): the
        manifest's ``retargets`` of that graph."""
        self._note_retargets({name: record})

    def _note_retargets(self, records: Mapping[str, dict]) -> None:
        """:meth:`note_retarget` of each graph name → record, in one new list."""
        graphs = list(self._graphs)
        for name, i in self._first_entries(records).items():
            entry = graphs[i]
            graphs[i] = {**entry, "retargets": [*entry.get("retargets", ()), dict(records[name])]}
        self._graphs = graphs

    def rewalk(self) -> Registry:
        """Walks the model (and every root) now, keeping the owners earlier walks found
        that this one no longer reaches (:meth:`Registry.absorb`). A recorder without a
        model or root records graphs whose every address is bare."""
        return self._take_walk(
            walk_roots(
                self.roots() or [(self.root, None)],
                max_depth=self.max_depth,
                runtime_state=self.runtime_state,
            )
        )

    def _take_walk(self, fresh: Registry) -> Registry:
        """:meth:`rewalk` with ``fresh``, a walk of this recorder's roots made just now as
        it walks them (the snapshot :func:`graphcheck.torch.retarget` took, nothing
        changed since but the patched graphs), instead of walking again."""
        if self.registry is not None:
            fresh.absorb(self.registry)
        self.registry = fresh
        self._note_storages(fresh)
        self.walks += 1
        self._stale = False
        self._registry_ranges = None
        self._known = None
        return fresh

    def _note_storages(self, reg: Registry) -> None:
        """Gives each record the lifetime of its storage: one seen first by this walk was
        alive from the first graph added since the last walk (which that walk did not
        see); its death, when it comes, ends it at the graphs added by then."""
        born = self._graphs_walked
        for rec in reg.tensors:
            if rec.lifetime is not None or rec.storage is None:
                continue
            s = rec.storage()
            if s is None:
                continue
            try:
                life = self._lifetimes.get(s)
                if life is None:
                    life = [len(self._watched), born, None]
                    self._watched.append(weakref.ref(s, death_noter(weakref.ref(self), life)))
                    self._lifetimes[s] = life
            except TypeError:  # not weakly referenceable: no lifetime, as before
                continue
            rec.lifetime = life
        self._graphs_walked = self._epoch

    def storage_numbers(self, records: list) -> list:
        """For each :class:`TensorRecord <graphcheck._registry.TensorRecord>` of a walk
        (a live snapshot's), the number this recorder gave its storage object, or ``None``
        for a storage the recorder never saw (a new one, wherever the allocator put it)
        or that cannot be told (no weak references, or dead)."""
        out: list = []
        for rec in records:
            s = rec.storage() if rec.storage is not None else None
            life = None
            if s is not None:
                try:
                    life = self._lifetimes.get(s)
                except TypeError:  # not weakly referenceable: not numbered
                    life = None
            out.append(None if life is None else life[0])
        return out

    # Keeping owners current (class docstring) ------------------------------------------

    def _check_registry(self) -> None:
        """Reads which of the registry's storages are still current (a tensor that died
        since the walk, or a storage that moved, explains nothing: the allocator may have
        handed its memory to a new tensor that no walk has seen); repacks them where that
        changed."""
        reg = self.registry.storage_ranges() if self.registry is not None else []
        # The registry hands back the same list while nothing changed: no comparison.
        if reg is not self._registry_ranges and reg != self._registry_ranges:
            self._registry_ranges = reg
            self._registry_known = _ranges.pack(reg)
            self._known = None

    def _known_ranges(self) -> bytes:
        """Everything that explains an address without a walk, packed for
        ``_native.Walked.unexplained`` (the registry's part as last checked)."""
        if self._known is None:
            self._known = b"".join(
                (self._registry_known, self._extra_known, self._pool_known, self._ownerless_known)
            )
        return self._known

    def _unexplained(self, walked) -> list:
        """The addresses of ``walked`` nothing known explains; the allocator's segments of
        graph pools are read again first where some word falls outside everything else."""
        self._check_registry()
        missing = walked.unexplained(self._known_ranges())
        if missing and self._refresh_graph_segments():
            missing = walked.unexplained(self._known_ranges())
        return missing

    def _refresh_graph_segments(self) -> bool:
        """Reads the caching allocator's segments of the recorder's graph pools; returns
        whether they changed."""
        keys = [k for k, pid in self._pool_by_key.items() if self._pools[pid]["kind"] == "graph"]
        if not keys:
            return False
        torch = import_torch()
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return False
        segments = pool_segments(keys)
        if segments == self._graph_segments:
            return False
        self._graph_segments = segments
        self._pool_known = _ranges.pack(self._graph_pool_ranges + segments)
        self._known = None
        return True

    def _keep_current(self, walked) -> None:
        """Walks the roots again if ``walked`` (a ``_native.Walked``, or ``None`` where the
        graph came as JSON that does not parse: the build reports it) reads an address
        nothing known explains, unless walks have explained nothing lately (class
        docstring); then remembers what the walk left ownerless."""
        if self.registry is not None and not self._stale:
            if walked is None or not self._roots:
                return
            missing = self._unexplained(walked)
            if not missing:
                return
            self._waiting.append(walked)
            self._waiting_addrs.update(missing)
            if len(self._waiting) < self._backoff:
                return
            self._walk_for_waiting()
            return
        self.rewalk()
        if walked is not None and self._roots:
            self._waiting.append(walked)
            self._settle_waiting(None)

    def _walk_for_waiting(self) -> None:
        waiting = len(self._waiting_addrs)
        self.rewalk()
        self._settle_waiting(waiting)

    def _settle_waiting(self, before: Optional[int]) -> None:
        """After a walk: what the waiting graphs read that it did not explain is ownerless;
        a walk for addresses (``before``: how many waited) that explained none doubles the
        wait."""
        still = {a for w in self._waiting for a in self._unexplained(w)}
        if before is not None:
            self._backoff = min(self._backoff * 2, 64) if len(still) >= before else 1
        self._waiting.clear()
        self._waiting_addrs.clear()
        if still:
            self._ownerless.update(still)
            self._ownerless_known = _ranges.pack((a, 1) for a in sorted(self._ownerless))
            self._known = None

    def catch_up(self) -> bool:
        """Walks the roots for the unexplained addresses still waiting for a walk (class
        docstring); returns whether it walked."""
        if not self._waiting or self.registry is None:
            return False
        self._walk_for_waiting()
        return True

    def _add_extra(self, path: str, t, registration: str) -> None:
        self._extra.append((path, t, registration))
        try:
            storage = t.untyped_storage()
            r = (storage.data_ptr(), storage.nbytes())
        except Exception:  # noqa: BLE001 - not a tensor: the build says so
            return
        if r not in self._extra_ranges:
            self._extra_ranges.add(r)
            self._extra_known += _ranges.pack([r])
            self._known = None

    def add_pool(
        self,
        name: str,
        *,
        kind: str = "other",
        sleep: str = "untouched",
        torch_pool=None,
        ranges: Iterable[tuple] = (),
    ) -> int:
        """Declares a pool; returns its id. ``torch_pool`` (a ``MemPool``, graph pool
        handle or pool id) takes its ranges from the CUDA allocator's segments; ``ranges``
        gives ``(base, size)`` pairs directly."""
        name = _args.text("name", name)
        ranges = _ranges.ranges_arg(ranges)
        if kind not in _POOL_KINDS:
            raise GraphcheckError(f"pool kind is one of {_POOL_KINDS}, not {kind!r}")
        if sleep not in _SLEEP:
            raise GraphcheckError(f"pool sleep is one of {_SLEEP}, not {sleep!r}")
        pid = len(self._pools)
        self._pools.append({"name": name, "kind": kind, "sleep": sleep})
        for base, size in ranges:
            self._pool_ranges.append({"base": hex(base), "size": size, "pool": pid})
            if kind == "graph":
                self._graph_pool_ranges.append((base, size))
                self._pool_known = _ranges.pack(self._graph_pool_ranges + self._graph_segments)
                self._known = None
        if torch_pool is not None:
            self._pool_by_key[pool_key(torch_pool)] = pid
        return pid

    def _declare_sleep_pools(self) -> list:
        """Declares a pool for each tag of the process's sleep allocator (where one is in
        use), each region of torch_memory_saver (where that package is imported) and each
        tag of vLLM's ``CuMemAllocator`` (where it is made) that is not declared yet, with
        its kind and sleep policy, so that manifests attribute tensors to tags without the
        caller asking. Returns the ``pool_ranges`` of vLLM's allocations now (a pool
        declared under a tag's name by the caller takes that tag's allocations)."""
        alloc = _sleep_state.allocator()
        tags = []
        if alloc is not None:
            # By pool id (what a pool is keyed by), in the order of the tags.
            by_tag = sorted((tag, pid) for pid, tag in alloc.pool_names().items())
            tags = [(tag, *alloc.pool_policy(tag), pid) for tag, pid in by_tag]
        names = {p["name"] for p in self._pools}
        for tag, kind, policy, pool in tags + _caching_allocator.tms_pools():
            if pool_key(pool) in self._pool_by_key or tag in names:
                continue
            names.add(tag)
            self.add_pool(tag, kind=kind, sleep=policy, torch_pool=pool)
        # vLLM's CuMemAllocator: a pool per tag, its ranges read again at each freeze
        # (allocations come and go under a tag; the table is what holds now).
        regions = _caching_allocator.cumem_regions()
        for tag, kind, policy, _ in regions:
            if tag not in names:
                names.add(tag)
                self.add_pool(tag, kind=kind, sleep=policy)
        # The last pool of a name, as a snapshot finds pools by name (_snapshot).
        pool_ids = {p["name"]: i for i, p in enumerate(self._pools)}
        return _caching_allocator.cumem_pool_ranges(regions, pool_ids)

    def _pool_id(self, pool) -> Optional[int]:
        if isinstance(pool, bool):
            raise GraphcheckError(f"pool is a pool id, name or torch pool, not {pool!r}")
        if pool is None or isinstance(pool, int):
            return pool
        if isinstance(pool, str):
            for i, p in enumerate(self._pools):
                if p["name"] == pool:
                    return i
            raise GraphcheckError(f"no pool named {pool!r}")
        key = pool_key(pool)
        if key not in self._pool_by_key:
            self._pool_by_key[key] = self.add_pool(f"graph{key}", kind="graph")
        return self._pool_by_key[key]

    def add_graph(
        self,
        name: str,
        walked: Union[str, bytes, Mapping[str, Any], "_native.Walked"],
        *,
        pool=None,
        inputs: Optional[Mapping[str, Any]] = None,
        outputs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        """Adds a walked graph. ``pool`` is a pool id, name or torch pool; ``inputs`` and
        ``outputs`` name the static tensors the caller fills or reads around each replay
        (registration ``graph_input``, paths ``graphs["name"].inputs["x"]``).

        The roots are walked again when the graph reads an address nothing the recorder
        knows explains (class docstring); where that walk fails, the graph stays added and
        :class:`GraphcheckError` says so."""
        name = _args.text("name", name)
        extras = [
            ("inputs", tensors_arg("inputs", inputs)),
            ("outputs", tensors_arg("outputs", outputs)),
        ]
        entry: dict = {"name": name, "pool": self._pool_id(pool)}
        if isinstance(walked, _native.Walked):
            entry["walked_index"] = len(self._walked)
            self._walked.append(walked)
            native = walked
        else:
            entry["walked"] = _walked_arg(walked)
            text = _args.to_json("walked", entry["walked"])
            try:
                native = _native.Walked.from_json(text)
            except GraphcheckError:  # reported, with its JSON path, by the build
                native = None
        self._graphs.append(entry)
        self._epochs.append(self._epoch)
        self._epoch += 1
        base = key_hop("graphs", name)
        for hop, tensors in extras:
            for k, t in tensors.items():
                self._add_extra(key_hop(attr_hop(base, hop), k), t, "graph_input")
        try:
            self._keep_current(native)
        except BaseException as e:  # noqa: BLE001 - a panic too: the graph is in all the same
            if fatal(e):
                raise
            self._stale = True  # the next graph or manifest walks again
            self._note_unexplained(native)
            raise OwnersNotCurrent(
                f"graph {name!r} was recorded, but the walk that keeps its owners current "
                f"failed ({type(e).__name__}: {e}): its owners may be stale until the next walk"
            ) from e
        self._note_unexplained(native)

    def _note_unexplained(self, walked) -> None:
        """With digests, keeps what ``walked`` reads that the registry, the extra tensors
        and the graph pools do not explain now (addresses walks left ownerless included):
        where a manifest's ``unowned`` addresses can be, whenever it is built."""
        if self.digests and walked is not None:
            self._check_registry()
            known = self._registry_known + self._extra_known + self._pool_known
            self._unexplained_seen.update(walked.unexplained(known))

    def record(self, cuda_graph, name: str, *, pool=None, inputs=None, outputs=None) -> None:
        """Walks a captured ``torch.cuda.CUDAGraph`` (made with ``keep_graph=True``) and
        adds it."""
        name = _args.text("name", name)
        raw = getattr(cuda_graph, "raw_cuda_graph", None)
        if raw is None:
            raise GraphcheckError(
                "cuda_graph is a torch.cuda.CUDAGraph (keep_graph=True), "
                f"not {_args.show(cuda_graph)}"
            )
        walked = walk_graph(raw())
        self.add_graph(name, walked, pool=pool, inputs=inputs, outputs=outputs)

    def guard_graph(self, name: str, guards) -> None:
        """Records the static inputs torch's CUDA-graph trees guard for the latest graph
        named ``name``: ``(address, owner paths at capture)`` pairs (an empty list of
        paths: the manifest's owners of that address). Verify leaves the graph out where
        one of those paths holds another address (the trees record a new graph instead)."""
        at = next((i for i in reversed(range(len(self._graphs))) if self._graphs[i]["name"] == name), None)
        if at is None:
            raise GraphcheckError(f"guard_graph: no graph named {name!r}")
        entry = self._graphs[at]
        added = [{"addr": hex(int(addr)), "paths": [str(p) for p in paths]} for addr, paths in guards]
        self._replace_entry(at, {**entry, "guards": [*entry.get("guards", ()), *added]})

    def _replace_entry(self, i: int, entry: dict) -> None:
        """Graph entry ``i`` replaced, in a new list: a freeze may hold the old (Frozen)."""
        graphs = list(self._graphs)
        graphs[i] = entry
        self._graphs = graphs

    def freeze(self) -> "Frozen":
        """The facts a manifest of now needs that may change before it is built, read now:
        the owners (the registry, walked again where stale, with the declared inputs'
        views), the allocator's segments, the pools, the graphs so far, and with digests
        the tensors' digests. :meth:`build_frozen` builds the manifest of then from them,
        later (at a write, a check, on another thread) and with the same result (with
        digests, those of the memory no owner explains are read now too: ``_ranges``)."""
        reg = self.registry
        if reg is None or self._stale:
            reg = self.rewalk()
        # A walk makes a new registry and never changes it after: it is shared as it is,
        # and copied only to add the declared inputs' views.
        if self._extra:
            reg = reg.copy()
            for path, t, registration in self._extra:
                reg.add(t, path, registration, None)
        cumem_ranges = self._declare_sleep_pools()
        # Looked up in _caching_allocator at each call, as the snapshot does: one place
        # where the allocator's snapshot is read, and where the CPU tests fake it.
        raw_segments = _caching_allocator.memory_segments()
        pool_ranges = list(self._pool_ranges) + cumem_ranges
        return Frozen(
            registry=reg,
            tensors=reg.tensor_specs(self.digests) if self.digests else None,
            raw_segments=raw_segments,
            pools=[dict(p) for p in self._pools],
            pool_ranges=pool_ranges,
            pool_bindings=[{"key": list(k), "pool": v} for k, v in self._pool_by_key.items()],
            graphs=(self._graphs, len(self._graphs)),
            walked=(self._walked, len(self._walked)),
            producer={"session": self.session, **self.producer},
            digests=self.digests,
            epochs=(self._epochs, len(self._epochs)),
            ranges=_ranges.frozen_digests(
                raw_segments, self._unexplained_seen, self._pool_by_key, pool_ranges
            )
            if self.digests
            else None,
        )

    @staticmethod
    def _spec(f: "Frozen") -> dict:
        tensors = f.tensors if f.tensors is not None else f.registry.tensor_specs(None)
        AllocSites(f.raw_segments).annotate(tensors, f.registry.tensors)
        # Read at the build, not copied at the freeze: a storage that died since ends at
        # the graphs added by then, none fewer than the frozen ones, so they read the same.
        epochs = Frozen.upto(f.epochs)
        number_storages(tensors, f.registry.tensors, epochs)
        # Every storage with a lifetime carries its number: a snapshot of this session
        # numbers the storages it finds alike (`storage_numbers`).
        for spec, rec in zip(tensors, f.registry.tensors):
            if rec.lifetime is not None:
                spec.setdefault("storage", rec.lifetime[0])
        owners = owners_by_storage(tensors, f.registry, epochs)
        # The core reads the segments (graphcheck::resolve::spec): a bound pool's segments
        # are its ranges, free blocks are free memory (IgnoredReason::FreeMemory).
        return {
            "producer": producer_block(f.producer),
            "pools": f.pools,
            "pool_ranges": f.pool_ranges,
            "segments": _caching_allocator.segment_facts(f.raw_segments),
            "pool_bindings": f.pool_bindings,
            "tensors": tensors,
            "owners": owners,
            "graphs": Frozen.upto(f.graphs),
        }

    def build_spec(self) -> dict:
        """The build spec ``_native.build_manifest`` takes (with :attr:`walked_graphs`, which
        graphs' ``walked_index`` refers to)."""
        return self._spec(self.freeze())

    @classmethod
    def build_frozen(cls, f: "Frozen", late: Optional[Callable[[list], list]] = None) -> str:
        """The manifest of what :meth:`freeze` read, as JSON text. Touches nothing of the
        recorder's: it can run on another thread while the recorder takes more graphs.
        With digests, the memory the graphs read that no owner explains is digested too
        (the manifest's `ranges`: contents a sleep lost there are `stale` after it), as the
        freeze read it; ``late`` digests a block it did not (default: reads it now)."""
        ranges = None
        if f.digests:
            ranges = _ranges.looked_up(f.ranges or {}, late or _ranges.digested)
        return _native.build_manifest(json.dumps(cls._spec(f)), Frozen.upto(f.walked), ranges=ranges)

    @property
    def walked_graphs(self) -> list:
        """The walked graphs kept on the Rust side, in ``walked_index`` order."""
        return list(self._walked)

    def manifest_json(self) -> str:
        """The manifest of every graph added so far, resolved and checked by the core, as
        JSON text."""
        return self.build_frozen(self.freeze())

    def manifest(self) -> dict:
        """The manifest of every graph added so far, resolved and checked by the core."""
        return json.loads(self.manifest_json())

    def write(self, path) -> None:
        """Writes the manifest to ``path`` atomically."""
        path = _args.path("path", path)
        _native.write_atomic(path, self.manifest_json().encode())


def fatal(e: BaseException) -> bool:
    """Whether an exception must reach the caller as it is: an interrupt or an exit. Any
    other failure of a recording (``pyo3_runtime.PanicException`` included, a
    ``BaseException``) is graphcheck's and never the engine's."""
    return isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit))


def tensors_arg(name: str, tensors) -> Mapping:
    """``inputs``/``outputs``: ``None`` or a mapping of name to tensor."""
    if tensors is None:
        return {}
    _args.mapping(name, tensors, "a mapping of name to tensor")
    Tensor = import_torch().Tensor
    for k, t in tensors.items():
        if not isinstance(t, Tensor):
            raise GraphcheckError(f"{name}[{k!r}] is a torch.Tensor, not {_args.show(t)}")
    return tensors


def _walked_arg(walked) -> Mapping:
    """A walked graph handed over as JSON text or a dict, as a dict."""
    if isinstance(walked, (str, bytes)):
        try:
            value = json.loads(walked)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
            raise GraphcheckError(f"walked: not valid JSON: {e}") from None
        return _args.mapping("walked", value, "a walked graph (a JSON object)")
    if isinstance(walked, Mapping):
        return dict(walked)
    raise GraphcheckError(
        f"walked is a walked graph (_native.Walked, JSON text or dict), not {_args.show(walked)}"
    )
