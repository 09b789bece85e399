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

import bisect
import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import json
import re
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

from . import GraphcheckError, __version__, _native, load

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


def _attr(path: str, name: str) -> str:
    """``path.name``, or ``path["name"]`` where ``name`` cannot be an attribute hop."""
    return f"{path}.{name}" if _ATTR.match(name) and not name.isdigit() else _key(path, name)


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
    storage = t.untyped_storage()
    itemsize = t.element_size()
    if t.numel() == 0:
        span = 0
    else:
        span = (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * itemsize
    return {
        "storage_base": hex(storage.data_ptr()),
        "storage_nbytes": storage.nbytes(),
        "offset": t.storage_offset() * itemsize,
        "nbytes": span,
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "dtype": str(t.dtype).replace("torch.", "", 1),
        "itemsize": itemsize,
        "device": str(t.device),
    }


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


@dataclass
class TensorRecord:
    """One storage view: the first tensor object seen for it (held weakly), and its
    ``TensorSpec``.

    The registry must not keep tensors alive: a recorder that held the tensors of its
    capture would stop the very frees and reuses that break graphs after a reload (a
    rebuilt derived tensor's old storage would never be released), and verify would miss
    them."""

    ref: Any = field(repr=False)
    spec: dict

    @property
    def tensor(self):
        """The tensor, or ``None`` once it has been freed."""
        return self.ref() if isinstance(self.ref, weakref.ref) else self.ref

    @property
    def data_ptr(self) -> int:
        return int(self.spec["storage_base"], 16) + self.spec["offset"]


@dataclass(frozen=True)
class OwnerRecord:
    """One owner path of a view: ``tensor`` is its position in :attr:`Registry.tensors`."""

    path: str
    tensor: int
    registration: str
    holder: Optional[str] = None


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
            spec = dict(rec.spec)
            t = rec.tensor
            if digests and t is not None:
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
            spec = tensor_spec(t)
        except Exception as e:  # noqa: BLE001 - any tensor the walk cannot read is listed
            self.skipped.append((path, f"storage not readable: {type(e).__name__}: {e}"))
            return None
        if spec["offset"] + spec["nbytes"] > spec["storage_nbytes"]:
            self.skipped.append((path, "view extends past its storage"))
            return None
        key = (
            int(spec["storage_base"], 16) + spec["offset"],
            tuple(spec["shape"]),
            tuple(spec["stride"]),
            spec["dtype"],
            spec["device"],
        )
        index = self._views.get(key)
        if index is None:
            index = len(self.tensors)
            self._views[key] = index
            try:
                ref = weakref.ref(t)
            except TypeError:  # an object without weak references: held, as before
                ref = t
            self.tensors.append(TensorRecord(ref, spec))
        if path not in self._paths:
            self._paths.add(path)
            self.owners.append(OwnerRecord(path, index, registration, holder))
        return index

    def __post_init__(self):
        self._views: dict = {}
        self._paths: set = set()

    def copy(self) -> "Registry":
        """A registry with the same records, to add owners to without changing this one."""
        other = Registry(self.root, list(self.tensors), list(self.owners), list(self.skipped))
        other._views, other._paths = dict(self._views), set(self._paths)
        return other


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
        for name, p in (d.get("_parameters") or {}).items():
            if p is not None:
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
        holder = _type_name(mod)
        for name, value in list(mod.__dict__.items()):
            if name in _MODULE_INTERNALS:
                continue
            self.value(value, _attr(path, name), "module_attribute", holder, 0)

    def value(self, v, path: str, registration: str, holder: Optional[str], depth: int) -> None:
        if isinstance(v, self.Tensor):
            self.tensor(v, path, registration, holder, depth)
            return
        if isinstance(v, self.leaf_types) or isinstance(v, _enum_type()):
            return
        if isinstance(v, self.Module):
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

    def container_or_object(self, v, path: str, depth: int) -> None:
        name = _type_name(v)
        if isinstance(v, dict):
            for k, x in list(v.items()):
                self.value(x, _key(path, k), "container", name, depth)
        elif isinstance(v, (list, tuple)) or _is_deque(v):
            for i, x in enumerate(list(v)):
                self.value(x, _key(path, i), "container", name, depth)
        elif isinstance(v, (set, frozenset)):
            # Unordered: no stable path to give an element.
            if any(isinstance(x, self.Tensor) for x in v):
                self.reg.skipped.append((path, "tensors in a set have no owner path"))
        elif isinstance(v, functools.partial):
            self.value(v.func, _attr(path, "func"), "object_attribute", name, depth)
            for i, x in enumerate(v.args):
                self.value(x, _key(_attr(path, "args"), i), "partial", name, depth)
            for k, x in (v.keywords or {}).items():
                self.value(x, _key(_attr(path, "keywords"), k), "partial", name, depth)
        elif isinstance(v, types.FunctionType):
            self.function(v, path, depth)
        elif isinstance(v, types.MethodType):
            self.value(v.__func__, _attr(path, "__func__"), "object_attribute", name, depth)
            self.value(v.__self__, _attr(path, "__self__"), "object_attribute", name, depth)
        else:
            self.obj(v, path, depth)

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
        attrs = _object_attributes(v)
        attr_tensor_ids = set()
        for name, x in attrs:
            if isinstance(x, self.Tensor):
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
        flatten = _class_attribute(type(t), "__tensor_flatten__")
        if flatten is not None and type(t) not in (self.Tensor, self.torch.nn.Parameter):
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
        if t.layout != self.torch.strided:
            self.reg.skipped.append((path, f"layout {t.layout} is not strided"))
            return
        if t.device.type == "meta":
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


def _object_attributes(obj) -> list:
    """``(name, value)`` of an object's instance ``__dict__`` and filled ``__slots__``, in
    definition order. Dataclasses with ``slots=True`` are covered by the slots."""
    out = []
    d = _instance_dict(obj)
    if d is not None:
        out.extend(d.items())
    seen = {name for name, _ in out}
    for cls in type(obj).__mro__:
        for name, member in list(cls.__dict__.items()):
            if name in seen or not isinstance(member, types.MemberDescriptorType):
                continue
            seen.add(name)
            try:
                out.append((name, member.__get__(obj, type(obj))))
            except AttributeError:  # an unfilled slot
                continue
    return out


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
    _native.check_path(root)
    registry = Registry(root)
    walker = _Walker(registry, max_depth)
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


def _cuda_segments() -> list:
    """The caching allocator's segments, sorted by address; [] where CUDA is not in use."""
    torch = _torch()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    out = []
    for s in torch.cuda.memory_snapshot():
        blocks = sorted((b["address"], b["size"], b["state"]) for b in s.get("blocks", []))
        out.append(
            _Segment(s["address"], s["total_size"], tuple(s.get("segment_pool_id", (0, 0))), blocks)
        )
    out.sort(key=lambda s: s.base)
    return out


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
) -> dict:
    """The live snapshot of ``model`` against ``manifest`` after sleep/wake or a reload.

    ``contents`` is ``preserved`` (every persistent tensor must hold what it held at
    capture) or ``updated`` (new weights; ``reference`` says what they must be: a model
    loaded fresh, walked the same way, or a mapping of owner path → digest). ``digests``
    (``True`` or an algorithm) digests every live tensor, with the manifest's algorithm
    when it has digests. ``pools`` maps torch pool ids to the manifest's pool names, for
    CUDA probes. Returns the snapshot as a dict, checked by the core."""
    m = load(manifest, expect="manifest")
    registry = walk(model, root=root, max_depth=max_depth, runtime_state=runtime_state)
    algorithm = _algorithm(digests, m)
    if reference is not None and algorithm is None:
        algorithm = _algorithm(True, m)
    references = _reference_digests(reference, algorithm, root, max_depth) if reference is not None else {}

    pool_ids = {p["name"]: p["id"] for p in m.get("pools", [])}
    pool_of = {}
    for key, name in (pools or {}).items():
        if name not in pool_ids:
            raise GraphcheckError(f"pools: the manifest has no pool named {name!r}")
        pool_of[_pool_key(key)] = pool_ids[name]

    segments = _cuda_segments()
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
    for i, (rec, spec) in enumerate(zip(registry.tensors, registry.tensor_specs(algorithm))):
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
        {(int(r.spec["storage_base"], 16), max(r.spec["storage_nbytes"], 1)) for r in registry.tensors}
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


def _walk_graph(handle: int) -> str:
    """The walked graph (WalkedGraph JSON) of a ``cudaGraph_t``, by the Rust walker."""
    walker = getattr(_native, "walk_graph", None)
    if walker is None:
        raise GraphcheckError(
            "this build of graphcheck has no CUDA graph walker (the crate feature `cuda`)"
        )
    return walker(handle)


_POOL_KINDS = ("default", "graph", "weights", "kv_cache", "other")
_SLEEP = ("untouched", "restored", "discarded")


class Recorder:
    """Collects the graphs of one model (one per batch size, say) into one manifest.

    The model is walked when the first graph is added (its owner registry at capture);
    :meth:`rewalk` walks it again. Graphs come as walked graphs (WalkedGraph JSON or dict,
    ``src/build.rs``): :meth:`record` reads a captured ``torch.cuda.CUDAGraph`` with the
    Rust walker; :meth:`add_graph` takes one read any other way (the CPU tests write them
    by hand)."""

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
        self.max_depth = max_depth
        self.runtime_state = tuple(runtime_state)
        self.digests = ("sha256" if digests is True else digests) or None
        self.producer = dict(producer or {})
        self.registry: Optional[Registry] = None
        self._pools: list = []
        self._pool_by_key: dict = {}
        self._pool_ranges: list = []
        self._graphs: list = []
        self._extra: list = []  # (path, tensor, registration)

    def rewalk(self) -> Registry:
        """Walks the model now; the manifest uses the latest walk."""
        self.registry = walk(
            self.model, root=self.root, max_depth=self.max_depth, runtime_state=self.runtime_state
        )
        return self.registry

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
        if torch_pool is not None:
            self._pool_by_key[_pool_key(torch_pool)] = pid
        return pid

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
        walked: Union[str, Mapping[str, Any]],
        *,
        pool=None,
        inputs: Optional[Mapping[str, Any]] = None,
        outputs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        """Adds a walked graph. ``pool`` is a pool id, name or torch pool; ``inputs`` and
        ``outputs`` name the static tensors the caller fills or reads around each replay
        (registration ``graph_input``, paths ``graphs["name"].inputs["x"]``)."""
        if self.registry is None:
            self.rewalk()
        walked = json.loads(walked) if isinstance(walked, (str, bytes)) else dict(walked)
        self._graphs.append({"name": name, "pool": self._pool_id(pool), "walked": walked})
        base = _key("graphs", name)
        for hop, tensors in (("inputs", inputs), ("outputs", outputs)):
            for k, t in (tensors or {}).items():
                self._extra.append((_key(_attr(base, hop), k), t, "graph_input"))

    def record(self, cuda_graph, name: str, *, pool=None, inputs=None, outputs=None) -> None:
        """Walks a captured ``torch.cuda.CUDAGraph`` (made with ``keep_graph=True``) and
        adds it."""
        walked = _walk_graph(cuda_graph.raw_cuda_graph())
        self.add_graph(name, walked, pool=pool, inputs=inputs, outputs=outputs)

    def build_spec(self) -> dict:
        """The build spec ``_native.build_manifest`` takes."""
        if self.registry is None:
            self.rewalk()
        reg = self.registry.copy()
        for path, t, registration in self._extra:
            reg.add(t, path, registration, None)
        pool_ranges = list(self._pool_ranges)
        for seg in _cuda_segments():
            if seg.pool in self._pool_by_key:
                pool_ranges.append(
                    {"base": hex(seg.base), "size": seg.size, "pool": self._pool_by_key[seg.pool]}
                )
        return {
            "producer": _producer(self.producer),
            "pools": self._pools,
            "pool_ranges": pool_ranges,
            "tensors": reg.tensor_specs(self.digests),
            "owners": reg.owner_specs(),
            "graphs": self._graphs,
        }

    def manifest(self) -> dict:
        """The manifest of every graph added so far, resolved and checked by the core."""
        return json.loads(_native.build_manifest(json.dumps(self.build_spec())))

    def write(self, path) -> None:
        """Writes the manifest to ``path`` atomically."""
        _native.write_atomic(path, json.dumps(self.manifest(), indent=1).encode())


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
    recorder."""
    torch = _torch()
    if recorder is None:
        if model is None:
            raise GraphcheckError("graph() needs a model or a recorder")
        recorder = Recorder(model)
    if not hasattr(_native, "walk_graph"):
        _walk_graph(0)  # raises the message that says why
    with torch.cuda.graph(
        cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode
    ):
        yield recorder
    graph_pool = pool if pool is not None else cuda_graph.pool()
    recorder.record(cuda_graph, name, pool=graph_pool, inputs=inputs, outputs=outputs)
    instantiate: Optional[Callable] = getattr(cuda_graph, "instantiate", None)
    if instantiate is not None:
        instantiate()
