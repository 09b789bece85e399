"""The transitions the replay check sees without the engine saying so (:mod:`.replay_check`):
``Module.load_state_dict``, which also says which tensors it wrote, and
torch_memory_saver's ``resume``. Each is patched to mark a transition after it returns;
:func:`graphcheck.torch.uninstrument` restores them with the rest of the patch."""

from __future__ import annotations

from typing import Callable, Optional

from . import replay_check as _guard
from .._registry import _torch


def _wrap(
    patched: list,
    owner, attr: str, event: Callable, contents: str, written: Optional[Callable] = None
) -> None:
    """Replaces ``owner.attr`` (a method) with one that marks a transition after it
    returns or raises (``written(self, args, kwargs)``: the tensors it wrote, where
    known); restored with the rest of the patch. A method that raises may have written
    part of its contents first (``load_state_dict(strict=True)`` copies every key it has,
    then raises for the missing ones): the transition is marked all the same, and the
    exception goes on to the caller unchanged."""
    original = getattr(owner, attr, None)
    if original is None or getattr(original, "_graphcheck_transition", False):
        return

    def mark(self, args, kwargs) -> None:
        try:
            wrote = None if written is None else written(self, args, kwargs)
            _guard.mark_transition(event(self, args, kwargs), contents, written=wrote)
        except Exception:  # noqa: BLE001 - never into the engine
            try:  # what was written is unknown: the transition is still marked
                _guard.mark_transition(event(self, args, kwargs), contents)
            except Exception:  # noqa: BLE001
                pass

    def wrapper(self, *args, **kwargs):
        try:
            out = original(self, *args, **kwargs)
        except BaseException:
            mark(self, args, kwargs)
            raise
        mark(self, args, kwargs)
        return out

    wrapper._graphcheck_transition = True
    wrapper.__wrapped__ = original
    wrapper.__name__ = getattr(original, "__name__", attr)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    patched.append((owner, attr, original, wrapper))
    setattr(owner, attr, wrapper)


def _loaded_tensors(module, args, kwargs) -> list:
    """The tensors ``module.load_state_dict(state_dict, ...)`` wrote: its parameters and
    persistent buffers under the keys the state dict holds (a non-persistent buffer, a
    plain attribute or a module-global cache is not written, so its contents must hold),
    except where the given value's shape differs (torch copies none of those: it reports
    the size mismatch and raises once the other keys are copied)."""
    given = args[0] if args else kwargs.get("state_dict")
    own = module.state_dict(keep_vars=True)
    return [own[k] for k, v in given.items() if k in own and _fits(v, own[k])]


def _fits(value, param) -> bool:
    """Whether ``load_state_dict`` copies ``value`` into ``param``, as torch decides it: a
    tensor of the same shape, or a one-element vector into a scalar (old checkpoints); a
    lazy parameter takes any shape."""
    torch = _torch()
    if not torch.overrides.is_tensor_like(value):
        return False  # torch reports it and copies nothing
    if torch.nn.parameter.is_lazy(param):
        return True
    shape, want = tuple(value.shape), tuple(param.shape)
    return shape == want or (want == () and shape == (1,))


def patch(patched: list) -> None:
    """Patches the transitions a replay check sees without the engine saying so (what it
    replaced goes into ``patched``, for the instrumentation to restore):
    ``Module.load_state_dict`` (new weights: ``updated``, the tensors it wrote known, so
    that the rest are still compared) and torch_memory_saver's ``resume``
    (``preserved``), where that package is imported. (This package's sleep allocator
    marks its wakes itself.)"""
    import sys

    torch = _torch()
    _wrap(
        patched,
        torch.nn.Module,
        "load_state_dict",
        lambda self, a, k: f"{type(self).__name__}.load_state_dict",
        "updated",
        _loaded_tensors,
    )
    tms = sys.modules.get("torch_memory_saver")
    cls = getattr(tms, "TorchMemorySaver", None) if tms is not None else None
    if isinstance(cls, type):
        _wrap(
            patched,
            cls,
            "resume",
            lambda self, a, k: f"torch_memory_saver.resume({(a or (k.get('tag'),))[0]!r})",
            "preserved",
        )
