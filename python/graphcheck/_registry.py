"""Tensor views and the owner registry they go into: a view's metadata, ``TensorSpec`` and
content digest; the records a registry walk makes (:class:`TensorRecord`,
:class:`OwnerRecord`, :class:`Registry`); owner-path hops in the core's path grammar; and
the lazy import of torch that every module of :mod:`graphcheck.torch` shares.

The walk that fills a registry is :mod:`graphcheck._walk`; what the records mean, and the
digest algorithms, are told in :mod:`graphcheck.torch`'s docstring.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import glob
import hashlib
import os
import re
import sys
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from . import _args, _native
from ._native import GraphcheckError


def _torch():
    """torch, imported at first use: ``import graphcheck.torch`` works without it."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised without torch only
        raise GraphcheckError(f"graphcheck.torch needs PyTorch: {e}") from e
    return torch


# -- owner-path hops ----------------------------------------------------------------------

# An attribute name the path grammar can spell as `.name`.
_ATTR = re.compile(r'^[^.\[\]"]+$')

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


def _exception_text(e: BaseException) -> str:
    """``Type: message`` of an exception that user code raised while the walk read it,
    for :attr:`Registry.skipped` (a message that itself raises is said so)."""
    try:
        message = str(e)
    except Exception:  # noqa: BLE001 - the type still says what happened
        message = "(its message could not be read)"
    return f"{type(e).__name__}: {message}" if message else type(e).__name__


# -- tensors ------------------------------------------------------------------------------


def _tensor_arg(name: str, t) -> Any:
    """``t`` where it is a ``torch.Tensor``; else an error naming ``name``."""
    if not isinstance(t, _torch().Tensor):
        raise GraphcheckError(f"{name} is a torch.Tensor, not {_args.show(t)}")
    return t


def _view_arg(name: str, t, torch: Any = None) -> Any:
    """``t`` where it is a strided view of memory that holds data (what a spec describes
    and a digest reads); a sparse, nested or meta tensor is an error naming ``name`` (the
    walk skips them, naming why, in :attr:`Registry.skipped`)."""
    torch = torch or _torch()
    if not isinstance(t, torch.Tensor):
        raise GraphcheckError(f"{name} is a torch.Tensor, not {_args.show(t)}")
    if t.layout is not torch.strided:
        raise GraphcheckError(
            f"{name} is a tensor of layout {t.layout}: only strided tensors are views of "
            "one storage"
        )
    if t.is_nested:
        raise GraphcheckError(f"{name} is a nested tensor: only strided views of one storage")
    if t.is_meta:
        raise GraphcheckError(f"{name} is a meta tensor: it has no storage and no data")
    return t


def tensor_spec(t) -> dict:
    """The core's ``TensorSpec`` of a strided tensor view (what ``_native.build_manifest``
    reads for each tensor): storage base and size, byte offset, byte span, shape, stride,
    dtype (without ``torch.``), itemsize, device."""
    return _spec_dict(_meta_and_key(_view_arg("t", t))[0])


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


# CUDA device index -> "cuda:<index>".
_CUDA_NAMES: dict = {}


def _device_name(t) -> str:
    # str(t.device) builds a device object and formats it (about 1 µs); the flags are cheap.
    if t.is_cuda:
        i = t.get_device()
        name = _CUDA_NAMES.get(i)
        if name is None:
            name = _CUDA_NAMES[i] = f"cuda:{i}"
        return name
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
    # torch.Size is a tuple (same hash and equality): kept as it is.
    shape = t.shape
    stride = tuple(t.stride())
    if t.is_contiguous():  # the common case: the elements end to end
        span = t.numel() * itemsize
    elif 0 in shape:
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


#: The content digest algorithms (:func:`digest`; :mod:`graphcheck.torch` says what each is).
DIGEST_ALGORITHMS = ("gc128", "sha256", "sum64")

#: What ``digests=True`` records, and :func:`digest`'s default: read where the tensor is (a
#: kernel at memory bandwidth on CUDA), many tensors per call.
DEFAULT_DIGEST = "gc128"


def _digests_choice(name: str, value: Union[bool, str, None]) -> Union[bool, str, None]:
    """A ``digests=`` argument: ``True``/``False``/``None`` or an algorithm's name."""
    if value is None or isinstance(value, bool):
        return value
    return _args.choice(name, value, DIGEST_ALGORITHMS)


def _digests_arg(name: str, value: Union[bool, str, None]) -> Union[bool, str, None]:
    """A recording's ``digests=`` argument: ``True`` is :data:`DEFAULT_DIGEST`."""
    value = _digests_choice(name, value)
    return DEFAULT_DIGEST if value is True else value


def digest(t, algorithm: str = DEFAULT_DIGEST) -> str:
    """The content digest of a view, ``<algorithm>:<hex>`` (see :mod:`graphcheck.torch`)."""
    return digest_all([_view_arg("t", t)], algorithm)[0]


def digest_all(tensors, algorithm: str = DEFAULT_DIGEST) -> list:
    """The content digests of many views, in order: for ``gc128``, one native call for the
    CPU tensors (read in place) and one kernel launch per CUDA device, on its current
    stream."""
    algorithm = _args.choice("algorithm", algorithm, DIGEST_ALGORITHMS)
    torch = _torch()
    if isinstance(tensors, torch.Tensor) or not _args.iterable(tensors):
        raise GraphcheckError(f"tensors is a list of torch.Tensor, not {_args.show(tensors)}")
    tensors = list(tensors)
    if algorithm == "gc128":
        return _gc128_all(tensors)
    for i, t in enumerate(tensors):
        _view_arg(f"tensors[{i}]", t, torch)
    return [_digest_one(t, algorithm) for t in tensors]


def _digest_one(t, algorithm: str) -> str:
    torch = _torch()
    x = _flat_bytes(t)
    if algorithm == "sha256":
        host = x.cpu()
        data = ctypes.string_at(host.data_ptr(), host.numel()) if host.numel() else b""
        return "sha256:" + hashlib.sha256(data).hexdigest()
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


def _view(t) -> tuple:
    """``(address of the first element, sizes, strides, element size)``: a view as the
    native digest functions read it."""
    return (t.data_ptr(), t.shape, t.stride(), t.element_size())


def _tensor_views(tensors: list):
    """The native side's views of ``tensors`` (a list), their attributes read there in one
    call, with no Python object made per tensor (a tuple each, built here, cost more than
    the native digest call). A tensor that is not a strided view with data is an error
    naming it, as :func:`_view_arg` says it."""
    torch = _torch()
    views = _native.tensor_views(tensors, torch)
    if isinstance(views, int):
        _view_arg(f"tensors[{views}]", tensors[views], torch)
        raise GraphcheckError(  # pragma: no cover - the native checks are _view_arg's
            f"tensors[{views}] could not be read as a strided view"
        )
    return views


def _gc128_all(tensors: list) -> list:
    return _gc128(_tensor_views(tensors), tensors)


def _gc128(views, tensors: list) -> list:
    """gc128 of ``tensors``, whose native views (``_native.TensorViews``, of the tensors
    or of a registry's metadata) are ``views``: one native call per device."""
    devices = views.devices()
    if len(devices) == 1:  # the common case: nothing to sort out
        return _gc128_of(devices[0], views, tensors)
    out: list = [None] * len(tensors)
    for key in devices:
        part, where = views.select(key)
        for i, v in zip(where, _gc128_of(key, part, [tensors[i] for i in where])):
            out[i] = v
    return out


def _gc128_of(key, views, tensors: list) -> list:
    """gc128 of views of one place (``TensorViews.devices``): host memory (``None``), a
    CUDA ordinal, or ``"copy"`` (any other device: through host copies)."""
    if key is None:
        return _native.digest_host(views)
    if key == "copy":
        return _host_copies(tensors)
    return _cuda_gc128(key, views, tensors)


def _host_copies(tensors: list) -> list:
    """gc128 of host copies: the same digests as where the tensors are, slower."""
    return _native.digest_host(_tensor_views([t.detach().cpu() for t in tensors]))


#: Why the GPU digest is unavailable in this process (``None`` until it fails): CUDA tensors
#: are then digested through host copies, with a warning the first time.
_GPU_UNAVAILABLE: list = [None]


def _current_stream(device: int) -> int:
    """The ``CUstream`` of torch's current stream on ``device``: the digest runs there,
    after what the caller enqueued before it."""
    return _torch().cuda.current_stream(device).cuda_stream


def _cuda_gc128(device: int, views: list, tensors: list) -> list:
    if _GPU_UNAVAILABLE[0] is None:
        stream = _current_stream(device)
        try:
            return _native.digest_cuda(device, stream, views, nvrtc_path())
        except _native.GpuDigestUnavailable as e:
            _GPU_UNAVAILABLE[0] = str(e)
            warnings.warn(
                f"graphcheck: {e}. CUDA tensors are digested through host copies instead "
                "(the same gc128 digests, much slower); set GRAPHCHECK_NVRTC to libnvrtc's "
                "path to use the GPU",
                RuntimeWarning,
                stacklevel=4,
            )
    return _host_copies(tensors)


def range_digests(ranges: list) -> list:
    """gc128 digests of device memory ranges ``[(address, bytes)]`` of the current CUDA
    device, read on its current stream: the memory graphs read that no owner explains
    (``_native.build_manifest``'s ``ranges``). ``None`` for a range any byte of which is not
    mapped device memory of that device now (the driver is asked first), and for every
    range before this process has used CUDA."""
    torch = _torch()
    if not ranges or not torch.cuda.is_initialized():
        return [None] * len(ranges)
    device = torch.cuda.current_device()
    digests, fallback = _native.digest_ranges(ranges, _current_stream(device), nvrtc_path())
    if fallback is not None and _GPU_UNAVAILABLE[0] is None:
        _GPU_UNAVAILABLE[0] = fallback
        warnings.warn(
            f"graphcheck: {fallback}. Memory is digested through host copies instead "
            "(the same gc128 digests, much slower); set GRAPHCHECK_NVRTC to libnvrtc's "
            "path to use the GPU",
            RuntimeWarning,
            stacklevel=3,
        )
    return digests


#: The environment variable naming libnvrtc for the GPU digest.
ENV_NVRTC = "GRAPHCHECK_NVRTC"

_NVRTC_PATH: list = []


def nvrtc_path() -> Optional[str]:
    """libnvrtc for the GPU digest: ``$GRAPHCHECK_NVRTC``; else the one this process has
    loaded already (PyTorch loads it for some operations); else one in the ``nvidia`` pip
    packages (PyTorch's CUDA wheels depend on them; CUDA 13 puts it in
    ``nvidia/cu13/lib``), preferring the CUDA major version PyTorch was built with; else
    ``None``, and the native side tries the usual library names."""
    env = os.environ.get(ENV_NVRTC)
    if env:
        return env
    if not _NVRTC_PATH:
        _NVRTC_PATH.append(_loaded_nvrtc() or _packaged_nvrtc())
    return _NVRTC_PATH[0]


def _is_nvrtc(name: str) -> bool:
    return name.startswith("libnvrtc.so") or (
        name.startswith("nvrtc64_") and name.endswith(".dll")
    )


def _loaded_nvrtc() -> Optional[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                if path.startswith("/") and _is_nvrtc(os.path.basename(path)):
                    return path
    except OSError:
        pass
    return None


def _packaged_nvrtc() -> Optional[str]:
    found = []
    for root in dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)):
        for lib in glob.glob(os.path.join(root, "nvidia", "*", "lib", "*nvrtc*")) + glob.glob(
            os.path.join(root, "nvidia", "*", "bin", "*nvrtc*")
        ):
            if _is_nvrtc(os.path.basename(lib)) and "builtins" not in lib:
                found.append(lib)
    if not found:
        return None
    try:
        major = (_torch().version.cuda or "").split(".")[0]
    except Exception:  # noqa: BLE001 - no torch or no CUDA build: any will do
        major = ""
    # The CUDA major version of torch's build first, then by name.
    found.sort(key=lambda p: (not (major and (f".so.{major}" in p or f"cu{major}" in p)), p))
    return found[0]


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


@contextlib.contextmanager
def _gc_paused():
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
        with _gc_paused():
            return self._tensor_specs(digests, skip)

    def _tensor_specs(self, digests: Optional[str], skip: frozenset) -> list:
        out = []
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
            values = _gc128(_native.TensorViews.from_metas(metas), [t for _, t in todo])
        elif todo:
            values = digest_all([t for _, t in todo], digests)
        if todo:
            for (i, _), value in zip(todo, values):
                out[i]["digest"] = value
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
            self.skipped.append((path, f"storage not readable: {_exception_text(e)}"))
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
