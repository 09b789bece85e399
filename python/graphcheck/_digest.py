"""Content digests of tensor views (:func:`digest`, :func:`digest_all`) and of memory ranges
no owner explains (:func:`range_digests`).

A digest names its algorithm in its prefix, and verify compares only digests of one
algorithm. ``digests=True`` records ``gc128``; a snapshot uses the manifest's algorithm.

- ``gc128:<32 hex>`` (the default): the view's elements in row-major order as bytes,
  little-endian 64-bit words (the last zero-padded), each word's two terms (an NH product
  and MurmurHash3's fmix64 of the word, both keyed by its position) summed mod 2^64 in two
  lanes, the length mixed into the finalization (``graphcheck::document::digest`` defines
  it).
  Read where the tensor is, without a copy: CPU tensors in place, CUDA tensors by one
  kernel launch per device for all of them, on the device's current stream, at memory
  bandwidth (compiled at first use through NVRTC: ``$GRAPHCHECK_NVRTC``, the libnvrtc the
  process has loaded, or the one in the ``nvidia`` pip packages; without one, CUDA tensors
  are digested through host copies, with the same digests, and a warning). Not
  cryptographic. Guaranteed to change when one aligned 8-byte word of the bytes changes
  (one element up to 8 bytes: a zeroed scalar, flipped bits, two elements swapped inside
  one word) and when zero bytes are appended inside the last word; any other change is
  missed only by a coincidence of both 64-bit lanes, not bounded against data chosen to
  collide;
- ``sha256:<hex>``: SHA-256 of the view's elements in row-major order (copied to host);
  for data an adversary may choose;
- ``sum64:<16 hex>``: the view's elements in row-major order as bytes, zero-padded to a
  multiple of 8, read as little-endian 64-bit words and summed modulo 2^64 (on the tensor's
  device; blind to reordering).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import sys
import warnings
from typing import Literal, Optional, Union

from . import _args, _native
from ._native import GraphcheckError
from ._tensors import view_arg
from ._torch_import import import_torch

__all__ = [
    "DEFAULT_DIGEST",
    "DIGEST_ALGORITHMS",
    "ENV_NVRTC",
    "digest",
    "digest_all",
    "digests_arg",
    "digests_choice",
    "gc128",
    "nvrtc_path",
    "range_digests",
]


def _flat_bytes(t):
    """The view's elements in row-major order, as a flat uint8 tensor on its device."""
    torch = import_torch()
    x = t.detach()
    if x.dim() == 0:
        x = x.reshape(1)
    return x.contiguous().reshape(-1).view(torch.uint8)


#: The content digest algorithms (:func:`digest`; the module docstring says what each is).
DIGEST_ALGORITHMS = ("gc128", "sha256", "sum64")

#: What ``digests=True`` records, and :func:`digest`'s default: read where the tensor is (a
#: kernel at memory bandwidth on CUDA), many tensors per call.
DEFAULT_DIGEST = "gc128"


def digests_choice(name: str, value: Union[bool, str, None]) -> Union[bool, str, None]:
    """A ``digests=`` argument: ``True``/``False``/``None`` or an algorithm's name."""
    if value is None or isinstance(value, bool):
        return value
    return _args.choice(name, value, DIGEST_ALGORITHMS)


def digests_arg(name: str, value: Union[bool, str, None]) -> Union[str, Literal[False], None]:
    """A recording's ``digests=`` argument: ``True`` is :data:`DEFAULT_DIGEST`."""
    value = digests_choice(name, value)
    return DEFAULT_DIGEST if value is True else value


def digest(t, algorithm: str = DEFAULT_DIGEST) -> str:
    """The content digest of a view, ``<algorithm>:<hex>`` (the module docstring says each)."""
    return digest_all([view_arg("t", t)], algorithm)[0]


def digest_all(tensors, algorithm: str = DEFAULT_DIGEST) -> list:
    """The content digests of many views, in order: for ``gc128``, one native call for the
    CPU tensors (read in place) and one kernel launch per CUDA device, on its current
    stream."""
    algorithm = _args.choice("algorithm", algorithm, DIGEST_ALGORITHMS)
    torch = import_torch()
    if isinstance(tensors, torch.Tensor) or not _args.iterable(tensors):
        raise GraphcheckError(f"tensors is a list of torch.Tensor, not {_args.show(tensors)}")
    tensors = list(tensors)
    if algorithm == "gc128":
        return _gc128_all(tensors)
    for i, t in enumerate(tensors):
        view_arg(f"tensors[{i}]", t, torch)
    return [_digest_one(t, algorithm) for t in tensors]


def _digest_one(t, algorithm: str) -> str:
    torch = import_torch()
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
    naming it, as :func:`view_arg` says it."""
    torch = import_torch()
    views = _native.tensor_views(tensors, torch)
    if isinstance(views, int):
        view_arg(f"tensors[{views}]", tensors[views], torch)
        raise GraphcheckError(  # pragma: no cover - the native checks are view_arg's
            f"tensors[{views}] could not be read as a strided view"
        )
    return views


def _gc128_all(tensors: list) -> list:
    return gc128(_tensor_views(tensors), tensors)


def gc128(views, tensors: list) -> list:
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
    return import_torch().cuda.current_stream(device).cuda_stream


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
    torch = import_torch()
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
        major = (import_torch().version.cuda or "").split(".")[0]
    except Exception:  # noqa: BLE001 - no torch or no CUDA build: any will do
        major = ""
    # The CUDA major version of torch's build first, then by name.
    found.sort(key=lambda p: (not (major and (f".so.{major}" in p or f"cu{major}" in p)), p))
    return found[0]

