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
first. What the walk could not read is listed in :attr:`Registry.skipped`, as ``(owner path,
why)``: among them any value whose reading raised (``isinstance`` asks a lazy proxy's
``__class__``; a dict subclass's ``items()``, a ``__dict__`` property, a tensor subclass's
properties run their code), with the exception's type and message; the walk goes on past it.

**Probes on CPU.** A live snapshot says, for every address the manifest's graphs hold,
whether it is still an active allocation. On CUDA that comes from
``torch.cuda.memory_snapshot()`` (segments and blocks). CPU memory has no such record, so
for CPU addresses (the CI tests) an address inside the storage of a tensor the live walk
found is ``active`` and any other address ``unmapped``: a tensor the model no longer
reaches counts as freed, whether or not the C allocator has released it.

**Digests** (``digests=True`` or an algorithm name) name their algorithm in their prefix,
and verify compares only digests of one algorithm. ``digests=True`` records ``gc128``; a
snapshot uses the manifest's algorithm.

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

:func:`digest_all` digests many views at once (``gc128``: one call per device).
"""

# This module is the public face; the code lives in private modules, whose imports run one
# way (each imports only those listed before it):
#   _registry    tensor views, digests, TensorRecord/OwnerRecord/Registry, the lazy torch import
#   _walk        the registry walk: walk, walk_roots
#   _caching_allocator  torch's caching allocator (segments, pools, allocation sites), the producer
#   _snapshot    the live snapshot
#   _recorder    Recorder, graph()
#   _discover    zero-code attach: the top-level modules alive at the first capture
#   _instrument  instrument(), check() and the process-wide state of instrumentation
#     .host          what instrument needs of the host process
#     .replay_check  the check before a replay: transitions, mark_transition
#     .transitions   the transitions seen without the engine: load_state_dict, tms resume
#     .instrumentation  Instrumentation and the patch
import os

from ._caching_allocator import ALLOC_SITE_FRAMES
from ._instrument.replay_check import ENV_VERIFY_ON_REPLAY, ReplayCheckError, mark_transition
from ._instrument import (
    ENV_DIR,
    Instrumentation,
    check,
    instrument,
    instrumented,
    register_model,
    uninstrument,
)
from ._recorder import Recorder, graph
from ._registry import (
    DEFAULT_DIGEST,
    DIGEST_ALGORITHMS,
    OwnerRecord,
    Registry,
    TensorRecord,
    digest,
    digest_all,
    tensor_spec,
)
from ._snapshot import snapshot
from ._walk import DEFAULT_MAX_DEPTH, walk, walk_roots
from .sleep import SleepAllocator, SleepError, SleepOutOfMemoryError, sleep, sleep_pool, wake
from .sleep import allocator as sleep_allocator

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "OwnerRecord",
    "Recorder",
    "Registry",
    "TensorRecord",
    "DEFAULT_DIGEST",
    "DIGEST_ALGORITHMS",
    "digest",
    "digest_all",
    "graph",
    "snapshot",
    "tensor_spec",
    "walk",
    "walk_roots",
    "ENV_DIR",
    "ENV_VERIFY_ON_REPLAY",
    "Instrumentation",
    "ReplayCheckError",
    "check",
    "instrument",
    "mark_transition",
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

# `import graphcheck.torch` with GRAPHCHECK_DIR set instruments, as the installed .pth does
# (for installs without it: editable or vendored ones).
if os.environ.get(ENV_DIR):
    from . import _autoinstrument

    _autoinstrument.install()
