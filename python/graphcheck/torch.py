"""graphcheck.torch: PyTorch glue — the owner registry walk, snapshots, digests, and the
recorder that turns captured graphs into a manifest; :func:`instrument` records every
capture of a process with no change to the engine's code.

torch is imported inside the functions, so ``import graphcheck.torch`` works without it.

Where the rules are told: what the walk enters and how each owner path holds its tensor
(the ``registration``), :mod:`graphcheck._walk`; the digest algorithms
(``digests=True`` records ``gc128``), :mod:`graphcheck._digest`; how a live snapshot
probes CPU addresses, :mod:`graphcheck._snapshot`; the check before a replay,
:mod:`graphcheck._instrument.replay_check`.
"""

# The public face: the code lives in private modules, whose imports run one way (the
# order is tests/python/test_package_layout.py's ORDER).
import os

from ._caching_allocator import ALLOC_SITE_FRAMES
from ._digest import DEFAULT_DIGEST, DIGEST_ALGORITHMS, digest, digest_all
from ._instrument import (
    ENV_DIGESTS,
    ENV_DIR,
    Instrumentation,
    check,
    instrument,
    instrumented,
    register_model,
    uninstrument,
)
from ._instrument.replay_check import ENV_VERIFY_ON_REPLAY, ReplayCheckError
from ._instrument.transitions import mark_transition
from ._capture import graph
from ._recorder import OwnersNotCurrent, Recorder
from ._registry import OwnerRecord, Registry, TensorRecord
from ._retarget import RetargetResult, retarget
from ._snapshot import snapshot
from ._tensors import tensor_spec
from ._walk import DEFAULT_MAX_DEPTH, walk, walk_roots
from .sleep import SleepAllocator, SleepError, SleepOutOfMemoryError, sleep, sleep_pool, wake
from .sleep import allocator as sleep_allocator

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "OwnersNotCurrent",
    "OwnerRecord",
    "Recorder",
    "Registry",
    "RetargetResult",
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
    "ENV_DIGESTS",
    "ENV_DIR",
    "ENV_VERIFY_ON_REPLAY",
    "Instrumentation",
    "ReplayCheckError",
    "check",
    "instrument",
    "mark_transition",
    "instrumented",
    "register_model",
    "retarget",
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
# (for installs without it: editable or vendored ones): importing the module installs.
if os.environ.get(ENV_DIR):
    from . import _autoinstrument  # noqa: F401
