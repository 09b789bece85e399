"""The transitions the replay check reacts to: the transition *epoch*, which
:func:`mark_transition` moves on (and what the latest said, and what updates wrote), and
the transitions seen without the engine saying so, patched to mark one after they return:
``Module.load_state_dict`` (which also says which tensors it wrote), torch_memory_saver's
``resume``, vLLM's ``CuMemAllocator.wake_up``, and this package's sleep allocator waking
(a wake hook). :func:`patch` and the
hook are put in place by ``instrument()`` and taken away with the rest of its patch."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from .. import _args
from .._caching_allocator import CUMEM_MODULE
from .._native import GraphcheckError
from .._tensors import device_name
from .._torch_import import import_torch

__all__ = ["ENGINE_WAKES", "after_wake", "epoch", "latest", "mark_transition", "patch", "rewritten_since"]


_LOCK = threading.RLock()

# [epoch, event, contents]: the latest transition, replaced whole (one list assignment).
_STATE: list = [0, None, "preserved"]


def epoch() -> int:
    """The current transition epoch (0 before any transition): read at every replay."""
    return _STATE[0]


def latest() -> tuple:
    """``(epoch, event, contents)`` of the latest transition (``event`` ``None`` before any)."""
    at, event, contents = _STATE
    return at, event, contents


def mark_transition(
    event: str = "reload", contents: str = "preserved", written: Any = None
) -> int:
    """Says that the memory graphs read may have changed: after ``reload_weights()``, a
    wake, a resume. ``contents`` is ``preserved`` (every persistent tensor must still hold
    what it held at capture; digests are compared where the manifest has them) or
    ``updated`` (new weights: addresses must hold, contents may change). Each recorded
    graph is checked at its next replay, where an instrumentation has
    ``verify_on_replay``. Returns the new epoch.

    ``written`` (``updated`` only) says what the update wrote: a tensor, a module (its
    parameters and buffers) or an iterable of them. Digests of everything else are still
    compared, at this check and at every later one, so that a constant the reload did not
    restore is ``stale``. Without it, anything may have been rewritten: contents are not
    compared again until the next capture (``Module.load_state_dict`` says what it wrote
    by itself)."""
    event = _args.text("event", event)
    contents = _args.choice("contents", contents, ("preserved", "updated"))
    if written is not None and contents != "updated":
        raise GraphcheckError(
            f"written says what an update wrote: it takes contents='updated', not {contents!r}"
        )
    storages = None if written is None else _storages("written", written)
    with _LOCK:
        now = _STATE[0] + 1
        _STATE[:] = [now, event, contents]
        if contents == "updated":
            _WRITES.append((now, storages))
            if len(_WRITES) > _WRITES_KEPT:
                _FORGOTTEN[0] = _WRITES.pop(0)[0]
        return now


# The updated transitions, oldest first: (epoch, frozenset of (device, storage address) the
# update wrote, or None: unknown). The oldest are forgotten past _WRITES_KEPT; a check of a
# manifest older than the last one forgotten (_FORGOTTEN) knows nothing of what was written.
_WRITES: list = []
_WRITES_KEPT = 1024
_FORGOTTEN = [0]


def _storages(name: str, value: Any) -> frozenset:
    """(device, storage address) of every tensor ``value`` names: a tensor, a module's
    parameters and buffers, or an iterable of them."""
    torch = import_torch()
    out = set()
    todo = [value]
    # Modules and iterables entered, by id (kept, so that no id is reused meanwhile): a
    # list that holds itself, or modules sharing a child, are read once.
    entered: dict = {}
    while todo:
        v = todo.pop()
        if not isinstance(v, torch.Tensor):
            if id(v) in entered:
                continue
            entered[id(v)] = v
        if isinstance(v, torch.Tensor):
            # A wrapper subclass (a DTensor) has no storage of its own: its inner tensors
            # are what the walk digests, and what the update wrote.
            if type(v) not in (torch.Tensor, torch.nn.Parameter) and hasattr(
                type(v), "__tensor_flatten__"
            ):
                try:
                    names, _ = v.__tensor_flatten__()
                    todo.extend(getattr(v, n) for n in names)
                    continue
                except Exception:  # noqa: BLE001 - read as a tensor below
                    pass
            try:
                out.add((device_name(v), v.untyped_storage().data_ptr()))
            except (RuntimeError, NotImplementedError):
                pass  # no storage (sparse, meta): nothing the walk digests either
        elif isinstance(v, torch.nn.Module):
            todo.extend(v.parameters())
            todo.extend(v.buffers())
        elif isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise GraphcheckError(
                f"{name} takes tensors, modules or an iterable of them, not {_args.show(v)}"
            )
        else:
            todo.extend(v)
    return frozenset(out)


def rewritten_since(epoch: int) -> Optional[frozenset]:
    """What updates after ``epoch`` wrote: (device, storage address) pairs, or ``None`` where
    one of them did not say (anything may have been rewritten)."""
    with _LOCK:
        if epoch < _FORGOTTEN[0]:
            return None
        out: set = set()
        for at, storages in _WRITES:
            if at <= epoch:
                continue
            if storages is None:
                return None
            out |= storages
        return frozenset(out)


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
            mark_transition(event(self, args, kwargs), contents, written=wrote)
        except Exception:  # noqa: BLE001 - never into the engine
            try:  # what was written is unknown: the transition is still marked
                mark_transition(event(self, args, kwargs), contents)
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

    # setattr: attributes of a function object, which its type does not declare.
    setattr(wrapper, "_graphcheck_transition", True)
    setattr(wrapper, "__wrapped__", original)
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
    torch = import_torch()
    if not torch.overrides.is_tensor_like(value):
        return False  # torch reports it and copies nothing
    if torch.nn.parameter.is_lazy(param):
        return True
    shape, want = tuple(value.shape), tuple(param.shape)
    return shape == want or (want == () and shape == (1,))


#: The engines' wakes a replay check sees by itself, where their module is imported:
#: (module, class, method, event, the keyword of its first argument).
ENGINE_WAKES = (
    ("torch_memory_saver", "TorchMemorySaver", "resume", "torch_memory_saver.resume", "tag"),
    (CUMEM_MODULE, "CuMemAllocator", "wake_up", "vllm CuMemAllocator.wake_up", "tags"),
)


def patch(patched: list) -> None:
    """Patches the transitions a replay check sees without the engine saying so (what it
    replaced goes into ``patched``, for the instrumentation to restore):
    ``Module.load_state_dict`` (new weights: ``updated``, the tensors it wrote known, so
    that the rest are still compared), torch_memory_saver's ``resume`` and vLLM's
    ``CuMemAllocator.wake_up`` (``preserved``), where those modules are imported. (This
    package's sleep allocator marks its wakes through :func:`after_wake`.)"""
    import sys

    torch = import_torch()
    _wrap(
        patched,
        torch.nn.Module,
        "load_state_dict",
        lambda self, a, k: f"{type(self).__name__}.load_state_dict",
        "updated",
        _loaded_tensors,
    )
    for module, name, method, event, keyword in ENGINE_WAKES:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            _wrap(
                patched,
                cls,
                method,
                # The first argument, or the keyword naming it, in the event's words.
                lambda self, a, k, event=event, keyword=keyword: f"{event}({(a or (k.get(keyword),))[0]!r})",
                "preserved",
            )


def after_wake(result: dict) -> None:
    """The wake hook (``graphcheck.sleep``): a wake that happened is a transition whose
    contents must be preserved."""
    if result.get("awake"):
        mark_transition("graphcheck.sleep wake", "preserved")
