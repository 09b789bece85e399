"""The ``producer`` block of a document graphcheck.torch writes: the tool and its version,
torch's (and the engine's, where vLLM, SGLang or torch_memory_saver is imported), the rank and world size (torch.distributed where initialized, else the launcher's
environment) and the GPU. Manifests and live snapshots read the rank the same way, so a
process's snapshot is of its manifest's rank (one read torch.distributed only, and a rank
launched with RANK but no process group was refused as another rank's)."""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ._api import __version__
from ._torch_import import import_torch

__all__ = ["ENGINES", "producer", "rank_and_world"]


def producer(overrides: Optional[Mapping[str, Any]] = None) -> dict:
    """The producer block, with ``overrides`` (the caller's) over what is read here."""
    torch = import_torch()
    p: dict = {
        "tool": "graphcheck.torch",
        "tool_version": __version__,
        "framework": ", ".join([f"torch {torch.__version__}", *_engines()]),
    }
    p["rank"], p["world_size"] = rank_and_world()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        p["gpu"] = torch.cuda.get_device_name()
    p.update(overrides or {})
    return p


#: Engines named in ``framework`` where the process has imported them: (module, name).
ENGINES = (("vllm", "vLLM"), ("sglang", "SGLang"), ("torch_memory_saver", "torch_memory_saver"))


def _engines() -> list:
    """``"vLLM 0.24.0"`` for each of :data:`ENGINES` imported (never importing one); the
    version as the module says it, else as its installed distribution does."""
    import sys

    out = []
    for module, name in ENGINES:
        m = sys.modules.get(module)
        if m is None:
            continue
        version = getattr(m, "__version__", None)
        if not isinstance(version, str):
            try:
                from importlib.metadata import version as dist_version

                version = dist_version(module.replace("_", "-"))
            except Exception:  # noqa: BLE001 - a name without a version still says it
                version = None
        out.append(f"{name} {version}" if version else name)
    return out


def rank_and_world() -> tuple:
    """This process's rank and world size: torch.distributed where initialized, else the
    launcher's environment (RANK, else LOCAL_RANK; WORLD_SIZE), else (0, 1)."""
    torch = import_torch()
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
            size = os.environ.get("WORLD_SIZE", "")
            world = int(size) if size.strip().isdigit() else rank + 1
            return rank, max(world, rank + 1)
    return 0, 1
