"""The owner registry a walk fills (:class:`Registry`): one :class:`TensorRecord` per storage
view, held weakly, and one :class:`OwnerRecord` per owner path that reaches it.

The walk that fills it is :mod:`graphcheck._walk`, which also says what the records mean;
a view's metadata is :mod:`graphcheck._tensors`', its digests :mod:`graphcheck._digest`'s.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

from . import _native
from ._digest import digest_all, gc128
from ._tensors import meta_and_key, spec_dict, view_key

__all__ = ["OwnerRecord", "Registry", "TensorRecord", "exception_text", "gc_paused"]


def exception_text(e: BaseException) -> str:
    """``Type: message`` of an exception that user code raised while the walk read it,
    for :attr:`Registry.skipped` (a message that itself raises is said so)."""
    try:
        message = str(e)
    except Exception:  # noqa: BLE001 - the type still says what happened
        message = "(its message could not be read)"
    return f"{type(e).__name__}: {message}" if message else type(e).__name__


def _weak(obj):
    """A weak reference to ``obj``, or ``obj`` itself where it takes none (held, as
    before weak references)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


def _deref(ref):
    return ref() if isinstance(ref, weakref.ref) else ref


def _mark_died(flag: list, _ref) -> None:
    """Weak-reference callback of :meth:`Registry.storage_ranges`: a watched storage died."""
    flag[0] = True


def _storage_at(storage, meta: tuple) -> bool:
    """Whether ``storage`` (a storage object or ``None``) is alive at ``meta``'s storage
    base and size."""
    if storage is None:
        return False
    try:
        return storage.data_ptr() == meta[0] and storage.nbytes() == meta[1]
    except Exception:  # noqa: BLE001 - a storage that cannot say where it is
        return False


@dataclass
class TensorRecord:
    """One storage view: the first tensor object seen for it and its storage object (both
    held weakly), and its metadata (:attr:`spec` is its ``TensorSpec`` dict).

    The registry must not keep tensors alive: a recorder that held the tensors of its
    capture would stop the very frees and reuses that break graphs after a reload (a
    rebuilt derived tensor's old storage would never be released), and verify would miss
    them. The storage object is the view's identity beyond its address: torch keeps one
    Python object per live storage (a weak reference to it dies with the storage, not with
    the tensor object), so a new tensor the allocator puts where a dead one was, with the
    same layout, is told apart from the one the record describes."""

    ref: Any = field(repr=False)
    #: (storage base, storage bytes, byte offset, byte span, shape, stride, dtype,
    #: itemsize, device): a tuple, as a dict per view costs a third of a large walk.
    meta: tuple
    #: The ``untyped_storage()`` object (weakly), ``None`` where it was not read.
    storage: Any = field(default=None, repr=False)
    #: ``[number, first, end]`` of the storage, shared by its records, where a recorder
    #: noted it: its number among the storages the recorder saw, and the graphs (by the
    #: order added) at whose capture it was alive, ``end`` ``None`` while it lives.
    lifetime: Optional[list] = field(default=None, repr=False, compare=False)

    @property
    def spec(self) -> dict:
        """The view's ``TensorSpec`` (a new dict)."""
        return spec_dict(self.meta)

    @property
    def storage_base(self) -> int:
        return self.meta[0]

    @property
    def storage_nbytes(self) -> int:
        return self.meta[1]

    @property
    def device(self) -> str:
        return self.meta[8]

    @property
    def tensor(self):
        """The tensor, or ``None`` once it has been freed."""
        return _deref(self.ref)

    def current(self) -> bool:
        """Whether the record still describes live memory: its storage is alive and still
        has the recorded address and size (a storage resized in place has moved). The
        storage, not the tensor object: while a storage lives (held by another view, say)
        the allocator cannot hand its memory to a new tensor."""
        return _storage_at(_deref(self.storage), self.meta)

    def same_storage(self, other: "TensorRecord") -> bool:
        """Whether both records are views of one live storage object (an address and a
        layout alone do not say so: a dead tensor's memory is handed to new ones)."""
        s = _deref(self.storage)
        return s is not None and s is _deref(other.storage)

    @property
    def data_ptr(self) -> int:
        return self.meta[0] + self.meta[2]


@dataclass(frozen=True)
class OwnerRecord:
    """One owner path of a view: ``tensor`` is its position in :attr:`Registry.tensors`."""

    path: str
    tensor: int
    registration: str
    holder: Optional[str] = None


def _owner_record(path, tensor, registration, holder, _new=object.__new__):
    """``OwnerRecord(...)`` without the frozen dataclass's ``__setattr__`` detours (a
    third of the cost of a record; the walk makes one per owner path)."""
    o = _new(OwnerRecord)
    d = o.__dict__
    d["path"] = path
    d["tensor"] = tensor
    d["registration"] = registration
    d["holder"] = holder
    return o


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector off for a walk, or for building the specs of its
    tensors: each allocates a few objects per tensor and frees none, so on a large model
    every collection it triggers scans the whole heap for nothing (about half the walk's
    time at 100,000 tensors, two thirds of ``tensor_specs``')."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class Registry:
    """Every tensor view a model reaches and the owner paths that reach it."""

    root: str
    tensors: list = field(default_factory=list)
    owners: list = field(default_factory=list)
    #: (path, why) for what the walk did not enter or could not read.
    skipped: list = field(default_factory=list)
    #: Owner records of paths that hold another storage now than when an earlier walk
    #: read them (a parameter rebound between two captures): the storages the graphs
    #: captured before may have read through them (:meth:`absorb`). Not in
    #: :meth:`by_path`, which says what each path holds now.
    held_before: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tensors)

    def by_path(self) -> dict:
        """Owner path → :class:`OwnerRecord`."""
        return {o.path: o for o in self.owners}

    def tensor_at(self, path: str):
        """The tensor an owner path reaches, or ``None``."""
        o = self.by_path().get(path)
        return None if o is None else self.tensors[o.tensor].tensor

    def tensor_specs(self, digests: Optional[str] = None, skip: frozenset = frozenset()) -> list:
        """``TensorSpec`` dicts in registry order, with digests of ``digests``' algorithm
        (all of one device in one call, for ``gc128``), except for views of the storages
        in ``skip`` ((device, storage address) pairs)."""
        with gc_paused():
            return self._tensor_specs(digests, skip)

    def _tensor_specs(self, digests: Optional[str], skip: frozenset) -> list:
        out: list = []
        todo: list = []  # (position, tensor)
        for rec in self.tensors:
            t = rec.tensor
            # A record whose storage moved would digest other bytes than its address's.
            if (
                digests
                and t is not None
                and rec.current()
                and (not skip or (rec.meta[8], rec.meta[0]) not in skip)
            ):
                todo.append((len(out), t))
            out.append(rec.spec)
        if todo and digests == "gc128":
            # The views from the walk's metadata: no tensor property is read again.
            metas = [self.tensors[i].meta for i, _ in todo]
            values = gc128(_native.TensorViews.from_metas(metas), [t for _, t in todo])
        elif todo and digests:  # without digests, nothing is to do
            values = digest_all([t for _, t in todo], digests)
        if todo:
            for (i, _), value in zip(todo, values):
                out[i]["digest"] = value
        return out

    def owner_specs(self) -> list:
        """Owner dicts of a build spec (``tensor`` is a position in :attr:`tensors`): what
        each path holds now, then :attr:`held_before`."""
        return [
            {
                "path": o.path,
                "tensor": o.tensor,
                "registration": o.registration,
                **({"holder": o.holder} if o.holder else {}),
            }
            for o in (*self.owners, *self.held_before)
        ]

    def add(self, t, path: str, registration: str, holder: Optional[str]) -> Optional[int]:
        """Adds an owner path of a plain strided tensor; returns its view's position."""
        try:
            meta, key, storage = meta_and_key(t)
        except Exception as e:  # noqa: BLE001 - any tensor the walk cannot read is listed
            self.skipped.append((path, f"storage not readable: {exception_text(e)}"))
            return None
        if meta[2] + meta[3] > meta[1]:
            self.skipped.append((path, "view extends past its storage"))
            return None
        index = self._views.get(key)
        # The same view of another storage (one that died, whose memory `t` now has) is
        # another tensor: graphs captured before read the dead one.
        if index is None or _deref(self.tensors[index].storage) is not storage:
            index = len(self.tensors)
            self._views[key] = index
            try:
                refs = weakref.ref(t), weakref.ref(storage)
            except TypeError:  # an object without weak references: held, as before
                refs = _weak(t), _weak(storage)
            self.tensors.append(TensorRecord(refs[0], meta, refs[1]))
        if path not in self._paths:
            self._paths.add(path)
            self.owners.append(_owner_record(path, index, registration, holder))
        return index

    def __post_init__(self):
        self._views: dict = {}
        self._paths: set = set()
        # storage_ranges' poll list, and how many records it was made from; its last
        # answer, kept until a polled storage dies (a weak-reference callback sets the
        # flag) or a record is added.
        self._poll: list = []
        self._polled = -1
        self._ranges: Optional[list] = None
        self._storage_died = [False]
        self._death_watch: list = []

    def copy(self) -> "Registry":
        """A registry with the same records, to add owners to without changing this one."""
        other = Registry(
            self.root, list(self.tensors), list(self.owners), list(self.skipped), list(self.held_before)
        )
        other._views, other._paths = dict(self._views), set(self._paths)
        return other

    def absorb(self, earlier: "Registry") -> None:
        """Adds the owners an earlier walk found that this one does not have: a recorder
        that walks again keeps, for the graphs captured before, the owners they were
        captured with (a tensor since dropped from the model stays owned by its old path,
        and verify's live checks say what became of it). Where both walks have a path,
        this walk's view wins, and the earlier one, where it is another storage (the path
        was rebound), is kept in :attr:`held_before`: a graph captured before read it
        through that path. An earlier path joins a view of this walk only where both are
        views of one live storage object; otherwise (its tensor died, and a new one may
        sit at its address with its layout) its record comes along as a tensor of its
        own, its capture-time metadata kept without reading the tensor."""
        kept: dict = {}  # earlier position -> position here
        now: Optional[dict] = None  # path -> this walk's position, made where needed
        before = {(o.path, o.tensor) for o in self.held_before}

        def place(position: int) -> int:
            index = kept.get(position)
            if index is None:
                rec = earlier.tensors[position]
                key = view_key(rec.meta)
                index = self._views.get(key)
                if index is None or not self.tensors[index].same_storage(rec):
                    index = len(self.tensors)
                    self._views.setdefault(key, index)
                    self.tensors.append(rec)
                kept[position] = index
            return index

        for o in earlier.owners:
            if o.path in self._paths:
                continue
            self._paths.add(o.path)
            self.owners.append(_owner_record(o.path, place(o.tensor), o.registration, o.holder))
        for o in (*earlier.owners, *earlier.held_before):
            if o.path not in self._paths:
                continue
            if now is None:
                now = {x.path: x.tensor for x in self.owners}
            rec = earlier.tensors[o.tensor]
            held = [now[o.path]] + [t for p, t in before if p == o.path]
            if any(self.tensors[t] is rec or self.tensors[t].same_storage(rec) for t in held):
                continue
            index = place(o.tensor)
            if (o.path, index) not in before:
                before.add((o.path, index))
                self.held_before.append(_owner_record(o.path, index, o.registration, o.holder))
        seen = set(self.skipped)
        self.skipped.extend(s for s in earlier.skipped if s not in seen)

    def storage_ranges(self) -> list:
        """``(base, size)`` of the storage of every view that is still :meth:`current
        <TensorRecord.current>`, once each, in registry order: the memory the registry can
        still explain. A dead tensor's range is left out, so that a new tensor the allocator
        puts there is not taken for it."""
        # Asked at every captured graph (Recorder), so the answer is kept: polling every
        # storage per graph (0.2-0.3 µs each) cost about 1 ms a graph on the anchor model
        # (H200 A/B). A storage dying sets `_storage_died` through a weak-reference
        # callback, and only then, or when records were added, is everything polled again.
        # A storage whose data moves while it lives (`resize_`) is seen at the next poll.
        if self._polled != len(self.tensors):
            storages: dict = {}
            # One callback for every watched storage (a closure each cost more than the
            # weak reference itself).
            mark_died = functools.partial(_mark_died, self._storage_died)
            watch = []
            for r in self.tensors:
                ref, meta = r.storage, r.meta
                if not isinstance(ref, weakref.ref):  # held, or never read
                    ref = functools.partial(_deref, ref)
                else:
                    obj = ref()
                    if obj is not None:  # weakly referenceable: `ref` is a weak reference to it
                        watch.append(weakref.ref(obj, mark_died))
                storages.setdefault((id(r.storage), meta[0], meta[1]), (ref, meta[0], meta[1]))
            self._poll, self._polled = list(storages.values()), len(self.tensors)
            self._death_watch, self._ranges = watch, None
        if self._ranges is not None and not self._storage_died[0]:
            return self._ranges
        self._storage_died[0] = False
        try:
            live = [
                (b, n)
                for ref, b, n in self._poll
                if (s := ref()) is not None and s.data_ptr() == b and s.nbytes() == n
            ]
        except Exception:  # noqa: BLE001 - a storage that cannot say where it is: one by one
            live = [(b, n) for ref, b, n in self._poll if _storage_at(ref(), (b, n))]
        self._ranges = list(dict.fromkeys(live))
        return self._ranges
