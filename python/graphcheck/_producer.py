"""The ``producer`` block of a document graphcheck.torch writes: the tool and its version,
torch's, the rank and world size (torch.distributed where initialized) and the GPU."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ._api import __version__
from ._torch_import import import_torch

__all__ = ["producer"]


def producer(overrides: Optional[Mapping[str, Any]] = None) -> dict:
    """The producer block, with ``overrides`` (the caller's) over what is read here."""
    torch = import_torch()
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
