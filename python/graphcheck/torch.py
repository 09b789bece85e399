"""graphcheck.torch: PyTorch glue — the owner registry walk, snapshots, digests, and the
recorder that turns captured graphs into a manifest.

torch is imported inside the functions, so ``import graphcheck.torch`` works without it.

**The owner registry** (:func:`walk`) lists every tensor a model reaches, one record per
storage view (data pointer, shape, stride, dtype), with every owner path that reaches it
(``model.layers[0].mlp.quant_method.kernel.workspace``, in the core's path grammar) and how
that path holds it — the ``registration`` of format v1:

- ``parameter``, ``buffer``, ``buffer_non_persistent`` (``_non_persistent_buffers_set``):
  from a module's ``_parameters`` and ``_buffers``;
- ``held``: a buffer named ``_held_*`` (vLLM's ``register_held_tensors``), or a tensor a
  non-module object lists in its ``persistent_tensors()``;
- ``module_attribute``: a plain attribute of a module; ``object_attribute``: an attribute
  of any other object (quant methods, kernel objects, dataclasses);
- ``container``: an element of a dict, list or tuple; ``partial``: an argument or keyword
  of a ``functools.partial``; ``closure``: a closure cell (or default argument) of a
  function;
- ``runtime_state``: any owner whose path matches one of the caller's ``runtime_state``
  globs (KV caches, per-step scratch).

A tensor subclass with ``__tensor_flatten__`` (TorchAO and other traceable wrappers) is
replaced by its inner tensors (``weight.qdata``), which keep the outer registration: they
are what kernels read, and they are restored with the wrapper.

The walk is read-only. It reads ``__dict__`` and ``__slots__`` directly instead of calling
``getattr``, so properties and ``__getattr__`` hooks never run; the only user code it calls
is ``persistent_tensors()``, the protocol whose purpose is to be called, and
``__tensor_flatten__``. Modules are followed through ``_modules`` without a depth limit (the
module tree is what ``named_modules()`` walks); from each module, chains of non-module
objects and containers are followed to ``max_depth`` hops (default 8). Every object is
entered once, so cycles end, and an object reached through two paths is listed under the
first. What the walk could not read is listed in :attr:`Registry.skipped`.

**Probes on CPU.** A live snapshot says, for every address the manifest's graphs hold,
whether it is still an active allocation. On CUDA that comes from
``torch.cuda.memory_snapshot()`` (segments and blocks). CPU memory has no such record, so
for CPU addresses (the CI tests) an address inside the storage of a tensor the live walk
found is ``active`` and any other address ``unmapped``: a tensor the model no longer
reaches counts as freed, whether or not the C allocator has released it.

**Digests** (``digests=True`` or an algorithm name) name their algorithm in their prefix,
and verify compares only digests of one algorithm:

- ``sha256:<hex>``: SHA-256 of the view's elements in row-major order (copied to host);
- ``sum64:<16 hex>``: the view's elements in row-major order as bytes, zero-padded to a
  multiple of 8, read as little-endian 64-bit words and summed modulo 2^64 (on the tensor's
  device; weaker, but reads at memory bandwidth).
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import ctypes
import dataclasses
import functools
import gc
import hashlib
import json
import os
import re
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

from . import GraphcheckError, __version__, _native, load
from . import sleep as _sleep_module
from .sleep import SleepAllocator, SleepError, SleepOutOfMemoryError, allocator as sleep_allocator
from .sleep import sleep, sleep_pool, wake

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "OwnerRecord",
    "Recorder",
    "Registry",
    "TensorRecord",
    "digest",
    "graph",
    "snapshot",
    "tensor_spec",
    "walk",
    "walk_roots",
    "ENV_DIR",
    "Instrumentation",
    "instrument",
    "instrumented",
    "register_model",
    "uninstrument",
    "SleepAllocator",
    "SleepError",
    "SleepOutOfMemoryError",
    "sleep",
    "sleep_allocator",
    "sleep_pool",
    "wake",
]

#: Hops of non-module objects and containers followed from each module.
DEFAULT_MAX_DEPTH = 8

# Attribute names `nn.Module.__init__` sets: its registries (walked on their own) and hooks.
_MODULE_INTERNALS = frozenset(
    {
        "training",
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
        "_modules",
    }
)

# Values that hold no tensor: never entered.
_ATOMS = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    memoryview,
    range,
    slice,
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    type(Ellipsis),
    type(NotImplemented),
)

# An attribute name the path grammar can spell as `.name`.
_ATTR = re.compile(r'^[^.\[\]"]+$')


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised without torch only
        raise GraphcheckError(f"graphcheck.torch needs PyTorch: {e}") from e
    return torch


# name -> whether it can be spelled as an attribute hop (names repeat across layers).
_ATTR_OK: dict = {}


def _attr(path: str, name: str) -> str:
    """``path.name``, or ``path["name"]`` where ``name`` cannot be an attribute hop."""
    ok = _ATTR_OK.get(name)
    if ok is None:
        ok = bool(_ATTR.match(name)) and not name.isdigit()
        if len(_ATTR_OK) < 65536:
            _ATTR_OK[name] = ok
    return f"{path}.{name}" if ok else _key(path, name)


def _key(path: str, key: Any) -> str:
    """``path[3]`` for an integer key, ``path["k"]`` for any other (its ``str``)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    text = str(key).replace("\\", "\\\\").replace('"', '\\"')
    return f'{path}["{text}"]'


def _child(path: str, name: str) -> str:
    """A submodule's hop: ``layers[0]`` for the numbered children of ``ModuleList`` and
    ``Sequential``, ``.name`` otherwise."""
    return f"{path}[{name}]" if name.isdigit() else _attr(path, name)


def _type_name(obj: Any) -> str:
    return type(obj).__name__


# -- tensors ------------------------------------------------------------------------------


def tensor_spec(t) -> dict:
    """The ``TensorSpec`` of a strided tensor view (``src/build.rs``): storage base and
    size, byte offset, byte span, shape, stride, dtype (without ``torch.``), itemsize,
    device."""
    return _spec_dict(_meta_and_key(t)[0])


def _spec_dict(meta: tuple) -> dict:
    """The ``TensorSpec`` dict of a view's metadata tuple (:func:`_meta_and_key`)."""
    base, storage_nbytes, offset, span, shape, stride, dtype, itemsize, device = meta
    return {
        "storage_base": hex(base),
        "storage_nbytes": storage_nbytes,
        "offset": offset,
        "nbytes": span,
        "shape": list(shape),
        "stride": list(stride),
        "dtype": dtype,
        "itemsize": itemsize,
        "device": device,
    }


# torch.dtype objects are singletons: name and itemsize once per dtype.
_DTYPES: dict = {}


def _device_name(t) -> str:
    # str(t.device) builds a device object and formats it (about 1 µs); the flags are cheap.
    if t.is_cuda:
        return f"cuda:{t.get_device()}"
    if t.is_cpu:
        return "cpu"
    return str(t.device)


def _meta_and_key(t) -> tuple:
    """The view's metadata as a tuple (storage base, storage bytes, byte offset, byte span,
    shape, stride, dtype, itemsize, device), its identity (first element's address,
    shape, stride, dtype, device) and its storage object, reading each property once: the
    registry walk's hot path, which keeps tuples and builds ``TensorSpec`` dicts only when
    asked."""
    storage = t.untyped_storage()
    dtype = t.dtype
    known = _DTYPES.get(dtype)
    if known is None:
        known = _DTYPES[dtype] = (str(dtype).replace("torch.", "", 1), t.element_size())
    dtype_name, itemsize = known
    shape = tuple(t.shape)
    stride = tuple(t.stride())
    if 0 in shape:
        span = 0
    else:
        span = 1
        for n, st in zip(shape, stride):
            span += (n - 1) * st
        span *= itemsize
    base = storage.data_ptr()
    offset = t.storage_offset() * itemsize
    device = _device_name(t)
    meta = (base, storage.nbytes(), offset, span, shape, stride, dtype_name, itemsize, device)
    return meta, (base + offset, shape, stride, dtype_name, device), storage


def _view_key(meta: tuple) -> tuple:
    """A view's identity (:func:`_meta_and_key`'s second value) from its metadata tuple."""
    return (meta[0] + meta[2], meta[4], meta[5], meta[6], meta[8])


def _flat_bytes(t):
    """The view's elements in row-major order, as a flat uint8 tensor on its device."""
    torch = _torch()
    x = t.detach()
    if x.dim() == 0:
        x = x.reshape(1)
    return x.contiguous().reshape(-1).view(torch.uint8)


def digest(t, algorithm: str = "sha256") -> str:
    """The content digest of a view, ``<algorithm>:<hex>`` (see the module docstring)."""
    torch = _torch()
    x = _flat_bytes(t)
    if algorithm == "sha256":
        host = x.cpu()
        data = ctypes.string_at(host.data_ptr(), host.numel()) if host.numel() else b""
        return "sha256:" + hashlib.sha256(data).hexdigest()
    if algorithm == "sum64":
        pad = (-x.numel()) % 8
        if pad:
            x = torch.cat([x, x.new_zeros(pad)])
        if x.numel() == 0:
            return "sum64:" + "0" * 16
        # Two 32-bit halves summed in int64 cannot overflow below 16 GiB; the 64-bit sum
        # is then exact in Python integers.
        halves = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        lo = int(halves[0::2].sum().item())
        hi = int(halves[1::2].sum().item())
        return f"sum64:{(lo + (hi << 32)) & 0xFFFFFFFFFFFFFFFF:016x}"
    raise GraphcheckError(f"unknown digest algorithm {algorithm!r} (sha256 or sum64)")


# -- the registry -------------------------------------------------------------------------


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

    @property
    def spec(self) -> dict:
        """The view's ``TensorSpec`` (a new dict)."""
        return _spec_dict(self.meta)

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


@dataclass
class Registry:
    """Every tensor view a model reaches and the owner paths that reach it."""

    root: str
    tensors: list = field(default_factory=list)
    owners: list = field(default_factory=list)
    #: (path, why) for what the walk did not enter or could not read.
    skipped: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tensors)

    def by_path(self) -> dict:
        """Owner path → :class:`OwnerRecord`."""
        return {o.path: o for o in self.owners}

    def tensor_at(self, path: str):
        """The tensor an owner path reaches, or ``None``."""
        o = self.by_path().get(path)
        return None if o is None else self.tensors[o.tensor].tensor

    def tensor_specs(self, digests: Optional[str] = None) -> list:
        """``TensorSpec`` dicts in registry order, with digests of ``digests``' algorithm."""
        out = []
        for rec in self.tensors:
            spec = rec.spec
            t = rec.tensor
            # A record whose storage moved would digest other bytes than its address's.
            if digests and t is not None and rec.current():
                spec["digest"] = digest(t, digests)
            out.append(spec)
        return out

    def owner_specs(self) -> list:
        """Owner dicts of a build spec (``tensor`` is a position in :attr:`tensors`)."""
        return [
            {
                "path": o.path,
                "tensor": o.tensor,
                "registration": o.registration,
                **({"holder": o.holder} if o.holder else {}),
            }
            for o in self.owners
        ]

    def add(self, t, path: str, registration: str, holder: Optional[str]) -> Optional[int]:
        """Adds an owner path of a plain strided tensor; returns its view's position."""
        try:
            meta, key, storage = _meta_and_key(t)
        except Exception as e:  # noqa: BLE001 - any tensor the walk cannot read is listed
            self.skipped.append((path, f"storage not readable: {type(e).__name__}: {e}"))
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
        other = Registry(self.root, list(self.tensors), list(self.owners), list(self.skipped))
        other._views, other._paths = dict(self._views), set(self._paths)
        return other

    def absorb(self, earlier: "Registry") -> None:
        """Adds the owners an earlier walk found that this one does not have: a recorder
        that walks again keeps, for the graphs captured before, the owners they were
        captured with (a tensor since dropped from the model stays owned by its old path,
        and verify's live checks say what became of it). Where both walks have a path,
        this walk's view wins. An earlier path joins a view of this walk only where both
        are views of one live storage object; otherwise (its tensor died, and a new one
        may sit at its address with its layout) its record comes along as a tensor of its
        own, its capture-time metadata kept without reading the tensor."""
        kept: dict = {}  # earlier position -> position here
        for o in earlier.owners:
            if o.path in self._paths:
                continue
            index = kept.get(o.tensor)
            if index is None:
                rec = earlier.tensors[o.tensor]
                key = _view_key(rec.meta)
                index = self._views.get(key)
                if index is None or not self.tensors[index].same_storage(rec):
                    index = len(self.tensors)
                    self._views.setdefault(key, index)
                    self.tensors.append(rec)
                kept[o.tensor] = index
            self._paths.add(o.path)
            self.owners.append(_owner_record(o.path, index, o.registration, o.holder))
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


_TENSOR, _LEAF, _MODULE, _OTHER = "tensor", "leaf", "module", "other"


class _Walker:
    def __init__(self, registry: Registry, max_depth: int):
        torch = _torch()
        self.torch = torch
        self.Tensor = torch.Tensor
        self.Module = torch.nn.Module
        self.reg = registry
        self.max_depth = max_depth
        # Objects entered, by id; the objects themselves are kept so that an id cannot be
        # reused by a temporary (a persistent_tensors() result) during the walk.
        self.entered: dict = {}
        self.strided = torch.strided
        self.plain = frozenset({torch.Tensor, torch.nn.Parameter})
        # Value type -> _TENSOR, _LEAF, _MODULE or _OTHER (isinstance against two dozen
        # leaf types per value is most of a walk's traversal time).
        self.kinds: dict = {}
        # Type -> how container_or_object enters it; type -> its slot descriptors.
        self.shapes: dict = {}
        self.slots: dict = {}
        # Tensor type -> whether it is a wrapper subclass to flatten (__tensor_flatten__).
        self.wrapper_types: dict = {}
        self.leaf_types = _ATOMS + (
            torch.dtype,
            torch.device,
            torch.Size,
            torch.layout,
            torch.memory_format,
            torch.Generator,
        )

    # Modules: the tree first, so that parameters and buffers get their canonical paths
    # even where a plain attribute also reaches the module.
    def module_tree(self, root, path: str) -> None:
        order = []
        stack = [(root, path)]
        while stack:
            mod, p = stack.pop()
            if id(mod) in self.entered:
                continue
            self.entered[id(mod)] = mod
            order.append((mod, p))
            self.module_tensors(mod, p)
            children = mod.__dict__.get("_modules") or {}
            for name, child in reversed(list(children.items())):
                if child is not None:
                    stack.append((child, _child(p, name)))
        for mod, p in order:
            self.module_attributes(mod, p)

    def module_tensors(self, mod, path: str) -> None:
        d = mod.__dict__
        holder = _type_name(mod)
        plain = self.plain
        strided = self.strided
        add = self.reg.add
        for name, p in (d.get("_parameters") or {}).items():
            if p is None:
                continue
            # The common case inline: a plain strided parameter on a real device.
            if type(p) in plain and p.layout is strided and not p.is_meta:
                add(p, _attr(path, name), "parameter", holder)
            else:
                self.tensor(p, _attr(path, name), "parameter", holder, 0)
        non_persistent = d.get("_non_persistent_buffers_set") or set()
        for name, b in (d.get("_buffers") or {}).items():
            if b is None:
                continue
            if name.startswith("_held_"):
                registration = "held"
            elif name in non_persistent:
                registration = "buffer_non_persistent"
            else:
                registration = "buffer"
            self.tensor(b, _attr(path, name), registration, holder, 0)

    def module_attributes(self, mod, path: str) -> None:
        kinds = self.kinds
        items = [
            (name, value)
            for name, value in mod.__dict__.items()
            if name not in _MODULE_INTERNALS and kinds.get(type(value)) is not _LEAF
        ]
        if not items:
            return
        holder = _type_name(mod)
        for name, value in items:
            self.value(value, _attr(path, name), "module_attribute", holder, 0)

    def kind(self, v) -> int:
        cls = type(v)
        k = self.kinds.get(cls)
        if k is None:
            if isinstance(v, self.Tensor):
                k = _TENSOR
            elif isinstance(v, self.leaf_types) or isinstance(v, _enum_type()):
                k = _LEAF
            elif isinstance(v, self.Module):
                k = _MODULE
            else:
                k = _OTHER
            self.kinds[cls] = k
        return k

    def value(self, v, path: str, registration: str, holder: Optional[str], depth: int) -> None:
        k = self.kind(v)
        if k is _TENSOR:
            self.tensor(v, path, registration, holder, depth)
            return
        if k is _LEAF:
            return
        if k is _MODULE:
            if id(v) not in self.entered:
                self.module_tree(v, path)
            return
        if id(v) in self.entered:
            return
        if depth >= self.max_depth:
            self.reg.skipped.append((path, f"deeper than max_depth={self.max_depth}"))
            return
        self.entered[id(v)] = v
        self.container_or_object(v, path, depth + 1)

    def shape(self, v) -> str:
        """How :meth:`container_or_object` enters ``v``, cached per type."""
        cls = type(v)
        shape = self.shapes.get(cls)
        if shape is None:
            if isinstance(v, dict):
                shape = "dict"
            elif isinstance(v, (list, tuple)) or _is_deque(v):
                shape = "sequence"
            elif isinstance(v, (set, frozenset)):
                shape = "set"
            elif isinstance(v, functools.partial):
                shape = "partial"
            elif isinstance(v, types.FunctionType):
                shape = "function"
            elif isinstance(v, types.MethodType):
                shape = "method"
            else:
                shape = "object"
            self.shapes[cls] = shape
        return shape

    def container_or_object(self, v, path: str, depth: int) -> None:
        name = _type_name(v)
        kinds = self.kinds
        shape = self.shape(v)
        if shape == "object":
            self.obj(v, path, depth)
        elif shape == "dict":
            for k, x in list(v.items()):
                if kinds.get(type(x)) is not _LEAF:
                    self.value(x, _key(path, k), "container", name, depth)
        elif shape == "sequence":
            for i, x in enumerate(list(v)):
                if kinds.get(type(x)) is not _LEAF:
                    self.value(x, _key(path, i), "container", name, depth)
        elif shape == "set":
            # Unordered: no stable path to give an element.
            if any(isinstance(x, self.Tensor) for x in v):
                self.reg.skipped.append((path, "tensors in a set have no owner path"))
        elif shape == "partial":
            self.value(v.func, _attr(path, "func"), "object_attribute", name, depth)
            for i, x in enumerate(v.args):
                self.value(x, _key(_attr(path, "args"), i), "partial", name, depth)
            for k, x in (v.keywords or {}).items():
                self.value(x, _key(_attr(path, "keywords"), k), "partial", name, depth)
        elif shape == "function":
            self.function(v, path, depth)
        else:  # a bound method
            self.value(v.__func__, _attr(path, "__func__"), "object_attribute", name, depth)
            self.value(v.__self__, _attr(path, "__self__"), "object_attribute", name, depth)

    def function(self, f, path: str, depth: int) -> None:
        name = _type_name(f)
        cells = f.__closure__ or ()
        for var, cell in zip(f.__code__.co_freevars, cells):
            try:
                x = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value(x, _key(_attr(path, "__closure__"), var), "closure", name, depth)
        # Default arguments are captured like closure cells (`lambda x, w=w: …`).
        for i, x in enumerate(f.__defaults__ or ()):
            self.value(x, _key(_attr(path, "__defaults__"), i), "closure", name, depth)
        for k, x in (f.__kwdefaults__ or {}).items():
            self.value(x, _key(_attr(path, "__kwdefaults__"), k), "closure", name, depth)

    def obj(self, v, path: str, depth: int) -> None:
        holder = _type_name(v)
        held = self.held_tensors(v, path)
        held_ids = {id(t) for _, t in held}
        attrs = _object_attributes(v, self.slots)
        attr_tensor_ids = set()
        kinds = self.kinds
        for name, x in attrs:
            k = kinds.get(type(x))
            if k is _LEAF:
                continue
            if k is _TENSOR or (k is None and self.kind(x) is _TENSOR):
                attr_tensor_ids.add(id(x))
                registration = "held" if id(x) in held_ids else "object_attribute"
                self.tensor(x, _attr(path, name), registration, holder, depth)
            else:
                self.value(x, _attr(path, name), "object_attribute", holder, depth)
        # Listed tensors no attribute holds directly get the protocol's own path.
        for hop, t in held:
            if id(t) not in attr_tensor_ids:
                self.tensor(t, hop, "held", holder, depth)

    def held_tensors(self, v, path: str) -> list:
        """``(path, tensor)`` for what ``v.persistent_tensors()`` lists, if ``v`` has it."""
        method = _class_attribute(type(v), "persistent_tensors")
        if not callable(method):
            return []
        base = _attr(path, "persistent_tensors()")
        try:
            listed = v.persistent_tensors()
        except Exception as e:  # noqa: BLE001 - a broken protocol method is reported
            self.reg.skipped.append((base, f"persistent_tensors() raised {type(e).__name__}: {e}"))
            return []
        self.entered[id(listed)] = listed
        if isinstance(listed, Mapping):
            items = [(_key(base, k), t) for k, t in listed.items()]
        else:
            items = [(_key(base, i), t) for i, t in enumerate(listed or ())]
        return [(p, t) for p, t in items if isinstance(t, self.Tensor)]

    def tensor(self, t, path: str, registration: str, holder: Optional[str], depth: int) -> None:
        cls = type(t)
        wrapper = self.wrapper_types.get(cls)
        if wrapper is None:
            wrapper = self.wrapper_types[cls] = _class_attribute(
                cls, "__tensor_flatten__"
            ) is not None and cls not in (self.Tensor, self.torch.nn.Parameter)
        if wrapper:
            if depth >= self.max_depth:
                self.reg.skipped.append((path, f"deeper than max_depth={self.max_depth}"))
                return
            try:
                names, _ = t.__tensor_flatten__()
            except Exception as e:  # noqa: BLE001
                self.reg.skipped.append((path, f"__tensor_flatten__ raised {type(e).__name__}: {e}"))
                return
            for name in names:
                inner = _instance_attribute(t, name)
                if isinstance(inner, self.Tensor):
                    self.tensor(inner, _attr(path, name), registration, holder, depth + 1)
            return
        if t.layout is not self.strided:
            self.reg.skipped.append((path, f"layout {t.layout} is not strided"))
            return
        if t.is_meta:
            self.reg.skipped.append((path, "meta tensor: no storage"))
            return
        self.reg.add(t, path, registration, holder)


def _enum_type():
    import enum

    return enum.Enum


def _is_deque(v) -> bool:
    import collections

    return isinstance(v, collections.deque)


def _class_attribute(cls: type, name: str):
    """``name`` from the class's MRO dicts, without running descriptors."""
    for c in cls.__mro__:
        if name in c.__dict__:
            return c.__dict__[name]
    return None


def _instance_attribute(obj, name: str):
    """An instance attribute read from ``__dict__`` or a slot, never through a property;
    ``None`` when it is neither."""
    d = _instance_dict(obj)
    if d is not None and name in d:
        return d[name]
    slot = _class_attribute(type(obj), name)
    if isinstance(slot, types.MemberDescriptorType):
        try:
            return slot.__get__(obj, type(obj))
        except AttributeError:
            return None
    return None


def _instance_dict(obj) -> Optional[dict]:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return d if isinstance(d, dict) else None


def _slot_members(cls: type) -> tuple:
    """``(name, member descriptor)`` of every slot along ``cls``'s MRO, first one per
    name."""
    out = []
    seen = set()
    for c in cls.__mro__:
        for name, member in list(c.__dict__.items()):
            if name in seen or not isinstance(member, types.MemberDescriptorType):
                continue
            seen.add(name)
            out.append((name, member))
    return tuple(out)


def _object_attributes(obj, slots_cache: Optional[dict] = None) -> list:
    """``(name, value)`` of an object's instance ``__dict__`` and filled ``__slots__``, in
    definition order. Dataclasses with ``slots=True`` are covered by the slots.
    ``slots_cache`` keeps each type's slot list across calls."""
    cls = type(obj)
    if slots_cache is None:
        slots = _slot_members(cls)
    else:
        slots = slots_cache.get(cls)
        if slots is None:
            slots = slots_cache[cls] = _slot_members(cls)
    d = _instance_dict(obj)
    out = list(d.items()) if d is not None else []
    for name, member in slots:
        if d is not None and name in d:
            continue
        try:
            out.append((name, member.__get__(obj, cls)))
        except AttributeError:  # an unfilled slot
            continue
    return out


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off for a walk: the walk allocates a few objects per
    tensor and frees none, so on a large model every collection it triggers scans the
    whole heap for nothing (about half the walk's time at 100,000 tensors)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def walk(
    model,
    *,
    root: str = "model",
    max_depth: int = DEFAULT_MAX_DEPTH,
    runtime_state: Iterable[str] = (),
) -> Registry:
    """The owner registry of ``model`` (an ``nn.Module``, or any object) under the root
    name ``root``. Owners whose path matches a ``runtime_state`` glob (``*`` within one
    hop, ``**`` across) get the registration ``runtime_state``."""
    return walk_roots([(root, model)], max_depth=max_depth, runtime_state=runtime_state)


def walk_roots(
    roots: Union[Mapping[str, Any], Iterable[tuple]],
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    runtime_state: Iterable[str] = (),
) -> Registry:
    """One owner registry over several roots (``{"model": model, "draft": draft}`` or
    ``(root, object)`` pairs), walked in order into one registry: an object two roots reach
    is listed under the first. :func:`walk` is the one-root case."""
    pairs = list(roots.items()) if isinstance(roots, Mapping) else list(roots)
    names = [r for r, _ in pairs]
    if len(set(names)) != len(names):
        raise GraphcheckError(f"root names must differ: {names}")
    for r in names:
        _native.check_path(r)
    registry = Registry(names[0] if names else "model")
    walker = _Walker(registry, max_depth)
    with _gc_paused():
        for root, model in pairs:
            if isinstance(model, walker.Module):
                walker.module_tree(model, root)
            else:
                walker.value(model, root, "object_attribute", None, 0)
    globs = list(runtime_state)
    if globs:
        paths = [o.path for o in registry.owners]
        hits = [False] * len(paths)
        for g in globs:
            hits = [a or b for a, b in zip(hits, _native.glob_match(g, paths))]
        registry.owners = [
            dataclasses.replace(o, registration="runtime_state") if hit else o
            for o, hit in zip(registry.owners, hits)
        ]
    return registry


# -- producer, pools, probes --------------------------------------------------------------


def _producer(overrides: Optional[Mapping[str, Any]] = None) -> dict:
    torch = _torch()
    p: dict = {
        "tool": "graphcheck.torch",
        "tool_version": __version__,
        "framework": f"torch {torch.__version__}",
        "rank": 0,
        "world_size": 1,
    }
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        p["rank"], p["world_size"] = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        p["gpu"] = torch.cuda.get_device_name()
    p.update(overrides or {})
    return p


def _pool_key(pool_id) -> tuple:
    """A torch pool id (``(a, b)``, a ``MemPool``, a graph pool handle) as a tuple."""
    pid = getattr(pool_id, "id", pool_id)
    return tuple(int(x) for x in pid)


@dataclass
class _Segment:
    base: int
    size: int
    pool: tuple
    blocks: list  # (address, size, state), by address


def _memory_segments() -> list:
    """``torch.cuda.memory_snapshot()``: the caching allocator's segments as torch gives
    them (blocks with their ``frames`` where memory history is on); [] where CUDA is not in
    use. Called once per :meth:`Recorder.build_spec` and per :func:`snapshot`: the segments
    serve pool attribution, probes and allocation sites alike."""
    torch = _torch()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    try:  # torch >= 2.13 can leave the trace ring out (cheaper); older takes no argument
        return torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:
        return torch.cuda.memory_snapshot()


#: Frames kept per allocation site, innermost first.
ALLOC_SITE_FRAMES = 16


def _torch_dir() -> str:
    torch = _torch()
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _python_frames(frames: list) -> list:
    """A block's frames as format ``Frame`` dicts, innermost first: the Python ones (those
    of ``_record_memory_history(stacks="all")`` from C++ are dropped where Python frames
    exist), without the innermost ones inside torch itself (``Module._apply`` of a
    ``.cuda()``, ``nn.Linear.__init__``: the caller's line is the site), at most
    :data:`ALLOC_SITE_FRAMES`."""
    out = []
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


class _AllocSites:
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


def _cuda_segments(raw: Optional[list] = None) -> list:
    """The caching allocator's segments, sorted by address; [] where CUDA is not in use.
    ``raw`` is :func:`_memory_segments`' result where the caller already has it."""
    out = []
    for s in _memory_segments() if raw is None else raw:
        blocks = sorted((b["address"], b["size"], b["state"]) for b in s.get("blocks", []))
        out.append(
            _Segment(s["address"], s["total_size"], tuple(s.get("segment_pool_id", (0, 0))), blocks)
        )
    out.sort(key=lambda s: s.base)
    return out


def _pool_segments(keys: Iterable[tuple]) -> list:
    """``(base, size)`` of the caching allocator's segments in the pools ``keys``, sorted.
    One snapshot per pool where torch takes a pool id (cheap: a graph pool has few
    segments); else one snapshot of every segment, filtered."""
    torch = _torch()
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
            for s in _memory_segments()
            if tuple(s.get("segment_pool_id", (0, 0))) in keys
        }
    return sorted(found)


def _pack_ranges(ranges: Iterable[tuple]) -> bytes:
    """``(base, size)`` pairs as native-endian ``u64`` words (``Walked.unexplained``)."""
    import array

    flat = array.array("Q")
    for base, size in ranges:
        if 0 <= base < 1 << 64 and 0 < size < 1 << 64:
            flat.append(base)
            flat.append(size)
    return flat.tobytes()


def _find(ranges: list, starts: list, addr: int):
    """The range (``.base``/``.size`` or a ``(base, size, …)`` tuple) holding ``addr``."""
    i = bisect.bisect_right(starts, addr) - 1
    if i < 0:
        return None
    r = ranges[i]
    base, size = (r.base, r.size) if isinstance(r, _Segment) else (r[0], r[1])
    return r if base <= addr < base + size else None


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

    raw_segments = _memory_segments()
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

    # CPU probes: the storages of the tensors the live walk found (module docstring).
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


# -- recording ----------------------------------------------------------------------------


def _walk_graph(handle: int):
    """The walked graph of a ``cudaGraph_t``, by the Rust walker, kept on the Rust side
    (``_native.Walked``): on the capture path no JSON is made or parsed."""
    walker = getattr(_native, "walk", None)
    if walker is None:
        raise GraphcheckError(
            "this build of graphcheck has no CUDA graph walker (the crate feature `cuda`)"
        )
    return walker(handle)


class _OwnersNotCurrent(GraphcheckError):
    """:meth:`Recorder.add_graph` added the graph, but could not walk the roots to keep its
    owners current (the cause is chained)."""


_POOL_KINDS = ("default", "graph", "weights", "kv_cache", "other")
_SLEEP = ("untouched", "restored", "discarded")


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
    tensor is alive. Words the kernel's signature sets aside (index slots, torch's RNG
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

    Graphs come as walked graphs (WalkedGraph JSON or dict, ``src/build.rs``): :meth:`record`
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
        self.model = model
        self.root = root
        # (root name, object or weak reference): model first, then add_root's.
        self._roots: list = [] if model is None else [(root, model)]
        self.max_depth = max_depth
        self.runtime_state = tuple(runtime_state)
        self.digests = ("sha256" if digests is True else digests) or None
        self.producer = dict(producer or {})
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
        self._walked: list = []  # _native.Walked objects, by graphs' walked_index
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
        self._known: Optional[bytes] = None

    def add_root(self, obj, root: str = "model", *, weak: bool = False) -> None:
        """Adds a root to walk beside the model (a draft model, a KV-cache manager), or the
        first root of a recorder made with ``model=None``. ``weak`` holds it by weak
        reference (a root that dies is left out). The next manifest walks again."""
        _native.check_path(root)
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

    def rewalk(self) -> Registry:
        """Walks the model (and every root) now, keeping the owners earlier walks found
        that this one no longer reaches (:meth:`Registry.absorb`). A recorder without a
        model or root records graphs whose every address is bare."""
        fresh = walk_roots(
            self.roots() or [(self.root, None)],
            max_depth=self.max_depth,
            runtime_state=self.runtime_state,
        )
        if self.registry is not None:
            fresh.absorb(self.registry)
        self.registry = fresh
        self.walks += 1
        self._stale = False
        self._registry_ranges = None
        self._known = None
        return fresh

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
            self._registry_known = _pack_ranges(reg)
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
        torch = _torch()
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return False
        segments = _pool_segments(keys)
        if segments == self._graph_segments:
            return False
        self._graph_segments = segments
        self._pool_known = _pack_ranges(self._graph_pool_ranges + segments)
        self._known = None
        return True

    def _keep_current(self, walked) -> None:
        """Walks the roots again if ``walked`` (a ``_native.Walked``, or ``None`` where the
        graph came as JSON that does not parse: the build reports it) reads an address
        nothing known explains; then remembers what the walk left ownerless."""
        if self.registry is not None and not self._stale:
            if walked is None or not self._roots or not self._unexplained(walked):
                return
        self.rewalk()
        if walked is not None and self._roots:
            self._ownerless.update(self._unexplained(walked))
            self._ownerless_known = _pack_ranges((a, 1) for a in sorted(self._ownerless))
            self._known = None

    def _add_extra(self, path: str, t, registration: str) -> None:
        self._extra.append((path, t, registration))
        try:
            storage = t.untyped_storage()
            r = (storage.data_ptr(), storage.nbytes())
        except Exception:  # noqa: BLE001 - not a tensor: the build says so
            return
        if r not in self._extra_ranges:
            self._extra_ranges.add(r)
            self._extra_known += _pack_ranges([r])
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
                self._pool_known = _pack_ranges(self._graph_pool_ranges + self._graph_segments)
                self._known = None
        if torch_pool is not None:
            self._pool_by_key[_pool_key(torch_pool)] = pid
        return pid

    def _declare_sleep_pools(self) -> None:
        """Declares a pool for each tag of the process's sleep allocator (where one is in
        use) that is not declared yet, with its kind and sleep policy, so that manifests
        attribute tensors to tags without the caller asking."""
        alloc = _sleep_module._ALLOCATOR
        if alloc is None:
            return
        names = {p["name"] for p in self._pools}
        for tag, pool in sorted(alloc._pools.items()):
            if _pool_key(pool) in self._pool_by_key or tag in names:
                continue
            kind, policy = alloc.pool_policy(tag)
            self.add_pool(tag, kind=kind, sleep=policy, torch_pool=pool)

    def _pool_id(self, pool) -> Optional[int]:
        if pool is None or isinstance(pool, int):
            return pool
        if isinstance(pool, str):
            for i, p in enumerate(self._pools):
                if p["name"] == pool:
                    return i
            raise GraphcheckError(f"no pool named {pool!r}")
        key = _pool_key(pool)
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
        entry = {"name": name, "pool": self._pool_id(pool)}
        if isinstance(walked, _native.Walked):
            entry["walked_index"] = len(self._walked)
            self._walked.append(walked)
            native = walked
        else:
            entry["walked"] = json.loads(walked) if isinstance(walked, (str, bytes)) else dict(walked)
            try:
                native = _native.Walked.from_json(json.dumps(entry["walked"]))
            except GraphcheckError:  # reported, with its JSON path, by the build
                native = None
        self._graphs.append(entry)
        base = _key("graphs", name)
        for hop, tensors in (("inputs", inputs), ("outputs", outputs)):
            for k, t in (tensors or {}).items():
                self._add_extra(_key(_attr(base, hop), k), t, "graph_input")
        try:
            self._keep_current(native)
        except BaseException as e:  # noqa: BLE001 - a panic too: the graph is in all the same
            if _fatal(e):
                raise
            self._stale = True  # the next graph or manifest walks again
            raise _OwnersNotCurrent(
                f"graph {name!r} was recorded, but the walk that keeps its owners current "
                f"failed ({type(e).__name__}: {e}): its owners may be stale until the next walk"
            ) from e

    def record(self, cuda_graph, name: str, *, pool=None, inputs=None, outputs=None) -> None:
        """Walks a captured ``torch.cuda.CUDAGraph`` (made with ``keep_graph=True``) and
        adds it."""
        walked = _walk_graph(cuda_graph.raw_cuda_graph())
        self.add_graph(name, walked, pool=pool, inputs=inputs, outputs=outputs)

    def build_spec(self) -> dict:
        """The build spec ``_native.build_manifest`` takes (with :attr:`walked_graphs`, which
        graphs' ``walked_index`` refers to)."""
        if self.registry is None or self._stale:
            self.rewalk()
        reg = self.registry.copy()
        for path, t, registration in self._extra:
            reg.add(t, path, registration, None)
        self._declare_sleep_pools()
        pool_ranges = list(self._pool_ranges)
        raw_segments = _memory_segments()
        tensors = reg.tensor_specs(self.digests)
        _AllocSites(raw_segments).annotate(tensors, reg.tensors)
        free_ranges = []
        for seg in _cuda_segments(raw_segments):
            if seg.pool in self._pool_by_key:
                pool_ranges.append(
                    {"base": hex(seg.base), "size": seg.size, "pool": self._pool_by_key[seg.pool]}
                )
            # Free blocks: a word in a by-value struct pointing here is stale bytes (the
            # core's IgnoredReason::FreeMemory); graph pools are left out by the core.
            free_ranges.extend(
                {"base": hex(b[0]), "size": b[1]} for b in seg.blocks if b[2] == "inactive"
            )
        return {
            "producer": _producer(self.producer),
            "pools": self._pools,
            "pool_ranges": pool_ranges,
            "free_ranges": free_ranges,
            "tensors": tensors,
            "owners": reg.owner_specs(),
            "graphs": self._graphs,
        }

    @property
    def walked_graphs(self) -> list:
        """The walked graphs kept on the Rust side, in ``walked_index`` order."""
        return list(self._walked)

    def manifest_json(self) -> str:
        """The manifest of every graph added so far, resolved and checked by the core, as
        JSON text."""
        return _native.build_manifest(json.dumps(self.build_spec()), self._walked)

    def manifest(self) -> dict:
        """The manifest of every graph added so far, resolved and checked by the core."""
        return json.loads(self.manifest_json())

    def write(self, path) -> None:
        """Writes the manifest to ``path`` atomically."""
        _native.write_atomic(path, self.manifest_json().encode())


@contextlib.contextmanager
def graph(
    cuda_graph,
    *,
    model=None,
    name: str,
    recorder: Optional[Recorder] = None,
    pool=None,
    stream=None,
    capture_error_mode: str = "global",
    inputs: Optional[Mapping[str, Any]] = None,
    outputs: Optional[Mapping[str, Any]] = None,
) -> Iterator[Recorder]:
    """``torch.cuda.graph`` that also records: captures into ``cuda_graph`` (made with
    ``torch.cuda.CUDAGraph(keep_graph=True)``), walks the captured graph, adds it to
    ``recorder`` (a new one over ``model`` when not given), then instantiates it. Yields the
    recorder.

    The graph is instantiated whether or not recording succeeds: a recording failure
    raises :class:`GraphcheckError` (its cause chained) after the graph is ready to
    replay. An empty capture (torch only warns) is recorded as a graph with no node."""
    torch = _torch()
    if recorder is None:
        if model is None:
            raise GraphcheckError("graph() needs a model or a recorder")
        recorder = Recorder(model)
    if not hasattr(_native, "walk"):
        _walk_graph(0)  # raises the message that says why
    with torch.cuda.graph(
        cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode
    ):
        yield recorder
    try:
        graph_pool = pool if pool is not None else cuda_graph.pool()
        recorder.record(cuda_graph, name, pool=graph_pool, inputs=inputs, outputs=outputs)
    except GraphcheckError:
        raise
    except BaseException as e:
        if _fatal(e):
            raise
        raise GraphcheckError(f"recording graph {name!r} failed: {type(e).__name__}: {e}") from e
    finally:
        instantiate: Optional[Callable] = getattr(cuda_graph, "instantiate", None)
        if instantiate is not None:
            instantiate()


def _fatal(e: BaseException) -> bool:
    """Whether an exception must reach the caller as it is: an interrupt or an exit. Any
    other failure of a recording (``pyo3_runtime.PanicException`` included, a
    ``BaseException``) is graphcheck's and never the engine's."""
    return isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit))


# -- instrument: record every capture of the process --------------------------------------

#: The environment variable that turns :func:`instrument` on for a whole process tree.
ENV_DIR = "GRAPHCHECK_DIR"

# Roots register_model() named while no instrumentation was on: the next instrument()
# takes them. (root, object or weak reference)
_PENDING_ROOTS: list = []
# The live instrumentations, in order; the patch stays while any is live.
_ACTIVE: list = []
# (module, attribute, original) of what the patch replaced.
_PATCHED: list = []
_LOCK = threading.RLock()


_NOT_WRITTEN = "the manifest was not written (the captures are kept; the next write retries)"


def _warn(message: str) -> None:
    """Warns with a ``RuntimeWarning`` that never raises: this runs inside the engine's
    ``capture_end``. Where the filters turn the warning into an error (``-W error``,
    pytest's ``filterwarnings = error``), it is shown instead, through
    ``warnings.showwarning`` (which pytest records); the filters' ``ignore`` still holds."""
    import sys
    import warnings

    try:
        warnings.warn(message, RuntimeWarning, stacklevel=4)
    except Exception:  # noqa: BLE001 - the warning as an error: never into the engine
        try:
            frame = sys._getframe(3)
            where = (frame.f_code.co_filename, frame.f_lineno)
        except ValueError:
            where = (__file__, 0)
        try:
            warnings.showwarning(RuntimeWarning(message), RuntimeWarning, *where)
        except Exception:  # noqa: BLE001 - nowhere to show it: it is in `errors`
            pass


def _rank_and_world() -> tuple:
    """This process's rank and world size: torch.distributed where initialized, else the
    launcher's environment (RANK, else LOCAL_RANK; WORLD_SIZE), else (0, 1)."""
    torch = _torch()
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a half-initialized process group: use the env
        pass
    for var in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(var, "")
        if value.strip().isdigit():
            rank = int(value)
            world = os.environ.get("WORLD_SIZE", "")
            world = int(world) if world.strip().isdigit() else rank + 1
            return rank, max(world, rank + 1)
    return 0, 1


def _force_keep_graph(args: tuple, kwargs: dict) -> tuple:
    """``CUDAGraph(...)``'s arguments with ``keep_graph=True``, and what the caller asked."""
    kwargs = dict(kwargs)
    if args:
        asked = bool(args[0])
        args = (True,) + tuple(args[1:])
    else:
        asked = bool(kwargs.pop("keep_graph", False))
        args = (True,)
    return args, kwargs, asked


def _instrumented_class(base: type) -> type:
    """A subclass of ``base`` (``torch.cuda.CUDAGraph``) that keeps the graph template,
    records every capture at ``capture_end`` and then instantiates as ``base`` would have.

    ``__new__`` and ``__init__`` both pass ``keep_graph=True``: torch's ``CUDAGraph.__new__``
    takes it for the Python side and the C++ ``_CUDAGraph.__init__`` for the graph itself
    (seen on the H200; passing it to one alone is not enough)."""

    class CUDAGraph(base):
        __doc__ = base.__doc__
        _graphcheck_base = base

        def __new__(cls, *args, **kwargs):
            args, kwargs, _ = _force_keep_graph(args, kwargs)
            parent = super().__new__
            if parent is object.__new__:
                return parent(cls)
            return parent(cls, *args, **kwargs)

        def __init__(self, *args, **kwargs):
            args, kwargs, asked = _force_keep_graph(args, kwargs)
            super().__init__(*args, **kwargs)
            # keep_graph=True asked by the caller: they instantiate (or replay does).
            self._graphcheck_keep = asked
            self._graphcheck_pool = None

        def capture_begin(self, *args, **kwargs):
            pool = args[0] if args else kwargs.get("pool")
            self._graphcheck_pool = pool
            return super().capture_begin(*args, **kwargs)

        def capture_end(self):
            super().capture_end()
            try:
                _on_capture(self)
            finally:
                if not getattr(self, "_graphcheck_keep", False):
                    self.instantiate()

    CUDAGraph.__qualname__ = f"graphcheck.{base.__qualname__}"
    return CUDAGraph


def _on_capture(cuda_graph) -> None:
    with _LOCK:
        sinks = list(_ACTIVE)
    if not sinks:
        return
    pool = getattr(cuda_graph, "_graphcheck_pool", None)
    if pool is None:
        try:
            pool = cuda_graph.pool()
        except Exception:  # noqa: BLE001 - a graph without a pool: none recorded
            pool = None
    try:
        walked = _walk_graph(cuda_graph.raw_cuda_graph())
    except BaseException as e:  # noqa: BLE001 - reported by each sink
        if _fatal(e):
            raise
        for sink in sinks:
            sink._failed(e)
        return
    for sink in sinks:
        sink._record(walked, pool)


class Instrumentation:
    """What :func:`instrument` returns: the recorder every capture of the process goes
    into, and the manifest file it writes (``path``, ``None`` until the first capture or
    without a directory). A context manager: leaving it uninstruments."""

    def __init__(
        self,
        directory,
        *,
        name: Union[str, Callable[[int], str]],
        strict: bool,
        recorder_args: dict,
        write_every: int = 1,
    ):
        if write_every < 1:
            raise GraphcheckError(f"write_every must be at least 1, not {write_every}")
        self.directory = None if directory is None else os.fspath(directory)
        #: Rewrite the manifest after every this many captures (and at exit): rebuilding it
        #: costs more as graphs accumulate, and an engine may capture dozens.
        self.write_every = write_every
        self._unwritten = 0
        self.name = name
        self.strict = strict
        self._recorder_args = recorder_args
        self.recorder = Recorder(None, **recorder_args)
        self.path: Optional[str] = None
        #: Captures recorded, and errors met (when not ``strict``), in this process.
        self.captures = 0
        self.errors: list = []
        self._pid = os.getpid()

    # Recording ----------------------------------------------------------------------

    def _fork_check(self) -> None:
        """A forked child starts its own manifest: the parent's graphs are not its own."""
        if os.getpid() != self._pid:
            roots = self.recorder._roots
            self.recorder = Recorder(None, **self._recorder_args)
            self.recorder._roots = list(roots)
            self.path, self.captures, self.errors, self._pid = None, 0, [], os.getpid()

    def _graph_name(self) -> str:
        if callable(self.name):
            return str(self.name(self.captures))
        return self.name.format(index=self.captures, pid=os.getpid())

    def _record(self, walked, pool) -> None:
        # A graph the recorder took counts as recorded even where what follows fails (its
        # owners' walk, the write): the warning says what was lost, and no more.
        later: list = []
        try:
            with _LOCK:
                self._fork_check()
                try:
                    self.recorder.add_graph(self._graph_name(), walked, pool=pool)
                except _OwnersNotCurrent as e:
                    later.append((e, str(e)))
                self.captures += 1
                self._unwritten += 1
                if self.directory is not None and self._unwritten >= self.write_every:
                    try:
                        self.write()
                    except BaseException as e:  # noqa: BLE001 - a panic too
                        if _fatal(e):
                            raise
                        later.append((e, f"{_NOT_WRITTEN}: {e}"))
        except BaseException as e:  # noqa: BLE001 - a panic too, never into the engine
            if _fatal(e):
                raise
            self._failed(e)
        for e, message in later:
            self._failed(e, message)

    def _failed(self, e: BaseException, message: Optional[str] = None) -> None:
        """Keeps a recording failure in :attr:`errors` and warns (``strict``: raises it).
        ``message`` says what was lost (default: the capture, for ``e``)."""
        if self.strict:
            raise e
        self.errors.append(e)
        _warn(f"graphcheck: {message or f'a capture was not recorded: {e}'}")

    # Output -------------------------------------------------------------------------

    def manifest_path(self) -> Optional[str]:
        """``<directory>/graphcheck-<rank>-<pid>.json`` (fixed at the first write)."""
        if self.path is None and self.directory is not None:
            rank, _ = _rank_and_world()
            self.path = os.path.join(self.directory, f"graphcheck-{rank}-{os.getpid()}.json")
        return self.path

    def manifest_json(self) -> str:
        """The manifest of every capture recorded so far in this process, as JSON text."""
        with _LOCK:
            self._fork_check()
            rank, world = _rank_and_world()
            self.recorder.producer.setdefault("rank", rank)
            self.recorder.producer.setdefault("world_size", world)
            return self.recorder.manifest_json()

    def manifest(self) -> dict:
        """The manifest of every capture recorded so far in this process."""
        return json.loads(self.manifest_json())

    def write(self, path=None) -> str:
        """Writes the manifest atomically (to ``path``, or :meth:`manifest_path`); returns
        the path."""
        target = os.fspath(path) if path is not None else self.manifest_path()
        if target is None:
            raise GraphcheckError("instrument() has no directory: pass write() a path")
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        # Compact JSON straight from the core: no Python parse and dump after every capture.
        _native.write_atomic(target, self.manifest_json().encode())
        if path is None:
            self._unwritten = 0
        return target

    def flush(self) -> Optional[str]:
        """Writes the manifest if captures were recorded since the last write (with a
        directory); returns the path written, if any. Runs at interpreter exit, and when
        the instrumentation stops."""
        if self.directory is None or self._unwritten == 0 or os.getpid() != self._pid:
            return None
        try:
            return self.write()
        except BaseException as e:  # noqa: BLE001 - reported like a failed recording
            if _fatal(e):
                raise
            self._failed(e, f"{_NOT_WRITTEN}: {e}")
            return None

    def register_model(self, model, root: str = "model") -> None:
        """Adds a root to this instrumentation's walks (held weakly); a root of the same
        name is replaced (a model loaded again)."""
        with _LOCK:
            rec = self.recorder
            rec._roots = [(r, x) for r, x in rec._roots if r != root]
            if rec.root == root:
                rec.model = None
            rec.add_root(model, root, weak=True)

    def close(self) -> None:
        """Stops this instrumentation; the patch goes when no other is live."""
        uninstrument(self)

    def __enter__(self) -> "Instrumentation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _patch_torch() -> None:
    torch = _torch()
    if _PATCHED:
        return
    graphs = getattr(torch.cuda, "graphs", None)
    base = torch.cuda.CUDAGraph
    cls = _instrumented_class(base)
    for module in (torch.cuda, graphs):
        if module is not None and getattr(module, "CUDAGraph", None) is base:
            _PATCHED.append((module, "CUDAGraph", base))
            setattr(module, "CUDAGraph", cls)


def _unpatch_torch() -> None:
    while _PATCHED:
        module, attr, original = _PATCHED.pop()
        setattr(module, attr, original)


def instrument(
    directory=None,
    *,
    model=None,
    root: str = "model",
    name: Union[str, Callable[[int], str]] = "capture{index}",
    digests: Union[bool, str] = False,
    runtime_state: Iterable[str] = (),
    max_depth: int = DEFAULT_MAX_DEPTH,
    strict: bool = False,
    write_every: int = 1,
) -> Instrumentation:
    """Records every CUDA graph capture of the process, with no change to the engine's
    code: ``torch.cuda.CUDAGraph`` (and ``torch.cuda.graphs.CUDAGraph``) become a subclass
    that keeps the graph template (``keep_graph=True``), walks it at ``capture_end`` and
    then instantiates it, so ``with torch.cuda.graph(g, pool=pool):`` and direct
    ``capture_begin``/``capture_end`` callers work unchanged. Code that bound the class
    before (``from torch.cuda import CUDAGraph``) is not reached: instrument first.

    ``directory`` (default: ``$GRAPHCHECK_DIR``; ``None`` keeps the manifest in memory)
    receives one manifest per process and rank, ``graphcheck-<rank>-<pid>.json``,
    rewritten atomically after every capture, so a crash loses nothing. ``name`` names the
    graphs: a format string with ``{index}`` (and ``{pid}``) or a callable of the index.

    Owners: a capture has no model argument. ``model`` (under ``root``) and every
    :func:`register_model` root are walked at the first capture, again after a root is
    added, and again at any capture that reads an address the recorder cannot explain
    without a walk (:class:`Recorder`); without any, graphs are recorded with no owners and
    every address they hold is bare (``unowned`` at verify). A recording failure warns (``RuntimeWarning``) and is
    kept in ``errors``; the capture itself always completes. ``strict=True`` raises
    instead. ``write_every=N`` rewrites the file after every N captures instead of every
    one (an engine capturing dozens of graphs pays the rebuild N times less); what is left
    is written when the instrumentation stops and at interpreter exit. Returns the
    :class:`Instrumentation`; :func:`uninstrument` restores torch."""
    if directory is None:
        directory = os.environ.get(ENV_DIR) or None
    ins = Instrumentation(
        directory,
        name=name,
        strict=strict,
        recorder_args=dict(digests=digests, runtime_state=runtime_state, max_depth=max_depth),
        write_every=write_every,
    )
    atexit.register(ins.flush)
    with _LOCK:
        for r, ref in _PENDING_ROOTS:
            obj = ref() if isinstance(ref, weakref.ref) else ref
            if obj is not None and (model is None or r != root):
                ins.register_model(obj, r)
        if model is not None:
            ins.register_model(model, root)
        _patch_torch()
        _ACTIVE.append(ins)
    return ins


def uninstrument(instrumentation: Optional[Instrumentation] = None) -> None:
    """Stops one instrumentation (or, without an argument, all of them) and, when none is
    left, restores ``torch.cuda.CUDAGraph``. Graphs made meanwhile keep working (they are
    instances of the subclass, which keeps instantiating them)."""
    with _LOCK:
        stopping = list(_ACTIVE) if instrumentation is None else [instrumentation]
    for ins in stopping:
        ins.flush()
    with _LOCK:
        if instrumentation is None:
            _ACTIVE.clear()
            _PENDING_ROOTS.clear()
        elif instrumentation in _ACTIVE:
            _ACTIVE.remove(instrumentation)
        if not _ACTIVE:
            _unpatch_torch()


def instrumented() -> list:
    """The live instrumentations."""
    with _LOCK:
        return list(_ACTIVE)


def register_model(model, root: str = "model") -> None:
    """Names an object whose tensors instrumented captures read (the engine's model, a
    draft model, a KV-cache manager) under ``root``, held weakly. Live instrumentations
    walk it from their next manifest on; one started later takes it too."""
    _native.check_path(root)
    with _LOCK:
        if _ACTIVE:
            for ins in _ACTIVE:
                ins.register_model(model, root)
            return
        try:
            ref = weakref.ref(model)
        except TypeError:
            ref = model
        _PENDING_ROOTS[:] = [(r, x) for r, x in _PENDING_ROOTS if r != root] + [(root, ref)]


if os.environ.get(ENV_DIR):
    from . import _autoinstrument

    _autoinstrument.install()
