"""A tensor view's metadata, read once per view: its storage, byte offset and span, shape,
stride, dtype and device, as the tuple the registry keeps and as the core's
``TensorSpec``; and the check that a tensor is a strided view of memory holding data."""

from __future__ import annotations

from typing import Any

from . import _args
from ._native import GraphcheckError
from ._torch_import import import_torch

__all__ = ["device_name", "meta_and_key", "spec_dict", "tensor_spec", "view_arg", "view_key"]


def view_arg(name: str, t, torch: Any = None) -> Any:
    """``t`` where it is a strided view of memory that holds data (what a spec describes
    and a digest reads); a sparse, nested or meta tensor is an error naming ``name`` (the
    walk skips them, naming why, in :attr:`Registry.skipped`)."""
    torch = torch or import_torch()
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
    return spec_dict(meta_and_key(view_arg("t", t))[0])


def spec_dict(meta: tuple) -> dict:
    """The ``TensorSpec`` dict of a view's metadata tuple (:func:`meta_and_key`)."""
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


def device_name(t) -> str:
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


def meta_and_key(t) -> tuple:
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
    device = device_name(t)
    meta = (base, storage.nbytes(), offset, span, shape, stride, dtype_name, itemsize, device)
    return meta, (base + offset, shape, stride, dtype_name, device), storage


def view_key(meta: tuple) -> tuple:
    """A view's identity (:func:`meta_and_key`'s second value) from its metadata tuple."""
    return (meta[0] + meta[2], meta[4], meta[5], meta[6], meta[8])
