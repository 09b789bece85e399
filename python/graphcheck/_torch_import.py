"""The one lazy import of torch that every module shares: ``import graphcheck.torch`` and
``import graphcheck.sleep`` work without PyTorch, and a call that needs it says so."""

from __future__ import annotations

from typing import Any

from ._native import GraphcheckError

__all__ = ["import_torch"]


def import_torch(needed_by: str = "graphcheck.torch") -> Any:
    """torch, imported at first use; without it, an error naming what needs it."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised without torch only
        raise GraphcheckError(f"{needed_by} needs PyTorch: {e}") from e
    return torch
