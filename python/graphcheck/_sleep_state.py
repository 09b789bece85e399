"""What :mod:`graphcheck.sleep` shares with the rest of the package: the process's sleep
allocator once made (recorders and snapshots declare its tags without being asked) and
the hooks called after each wake (an instrumentation with a replay check marks a
transition there). Kept here so that neither is a name of the public module."""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["add_wake_hook", "after_wake", "allocator", "keep_allocator", "remove_wake_hook"]

# The process's graphcheck.sleep.SleepAllocator, once allocator() made it.
_ALLOCATOR: Optional[Any] = None

_WAKE_HOOKS: list = []


def allocator() -> Optional[Any]:
    """The process's sleep allocator, or ``None`` where none was made (none is made here)."""
    return _ALLOCATOR


def keep_allocator(made: Any) -> None:
    """Keeps ``made`` as the process's sleep allocator (``graphcheck.sleep.allocator``)."""
    global _ALLOCATOR
    _ALLOCATOR = made


def add_wake_hook(hook: Callable[[dict], None]) -> None:
    """Has every wake call ``hook(result)`` until it is removed; added once however often."""
    if hook not in _WAKE_HOOKS:
        _WAKE_HOOKS.append(hook)


def remove_wake_hook(hook: Callable[[dict], None]) -> None:
    if hook in _WAKE_HOOKS:
        _WAKE_HOOKS.remove(hook)


def after_wake(result: dict) -> None:
    """Calls every wake hook with ``wake()``'s result; a hook that fails is passed over: it
    never fails a wake that happened."""
    for hook in list(_WAKE_HOOKS):
        try:
            hook(result)
        except Exception:  # noqa: BLE001 - a wake happened whatever a hook says
            pass
