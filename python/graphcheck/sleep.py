"""Sleep mode without vLLM: a tag-aware virtual-memory allocator for PyTorch.

Memory allocated under ``with sleep_pool("weights"):`` (or any tag) comes from
graphcheck's allocator, loaded into a ``torch.cuda.MemPool`` per tag through
``torch.cuda.memory.CUDAPluggableAllocator``. The allocator is Rust code in this package's
own native library (``graphcheck._native``, symbols ``graphcheck_sleep_malloc`` /
``graphcheck_sleep_free``) over the driver's virtual-memory calls, so an allocation keeps
its virtual address while its physical memory comes and goes:

- ``sleep(level=1)`` copies the offloaded tags (``weights`` by default) to pinned host
  memory and releases every allocation's physical memory;
- ``sleep(level=2)`` releases everything and keeps nothing;
- ``wake(tags=None, poison="nan")`` maps new memory at the same addresses, restores host
  copies, and fills discarded memory with the poison (``nan``: ``0xFF`` bytes, NaN in every
  floating dtype; ``zeros``; ``none``: whatever the driver hands out, as vLLM; or a byte).

A graph captured before ``sleep`` reads the same addresses after ``wake``; whatever was
discarded now holds the poison, deterministically. :meth:`SleepAllocator.declare_pools`
puts a pool per tag in a :class:`graphcheck.torch.Recorder`'s manifest (weights
``restored``, the rest ``discarded``), so that ``verify`` reports persistent tensors
allocated under a discarded tag as ``mispooled``. ``docs/sleep.md`` sets the semantics
side by side with vLLM's ``CuMemAllocator``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Iterable, Iterator, NamedTuple, Optional, Sequence, Union

# Modules, not names: this module's namespace is public.
from . import _args, _caching_allocator, _native, _sleep_state, _torch_import
from ._native import GraphcheckError

__all__ = [
    "Allocation",
    "SleepAllocator",
    "SleepError",
    "SleepOutOfMemoryError",
    "allocator",
    "sleep",
    "sleep_pool",
    "wake",
]

SleepError = _native.SleepError
SleepOutOfMemoryError = _native.SleepOutOfMemoryError

#: Tags sleep level 1 copies to host memory unless told otherwise (vLLM's default).
DEFAULT_OFFLOAD_TAGS = ("weights",)

_POOL_KINDS = _caching_allocator.TAG_KINDS


class Allocation(NamedTuple):
    """One live allocation of the sleep allocator."""

    base: int
    size: int  # mapped: the request rounded up to the allocation granularity
    requested: int
    device: int
    tag: str
    state: str  # mapped, offloaded or discarded


def _tags(name: str, value) -> list:
    """Tags: a list of strings, or one tag as a string (a list of that tag)."""
    if isinstance(value, str):
        return [_args.text(name, value)]
    return _args.strings(name, value, "tags")


# Expandable segments do not work with a pluggable allocator's pool
# (pytorch/pytorch#147851): off while any sleep_pool block is open on any thread, as vLLM
# turns them off inside its pools. The setting is process-wide, hence the count.
_EXPANDABLE_LOCK = threading.Lock()
_EXPANDABLE_OPEN = 0


def _expandable_configured() -> bool:
    return any(
        "expandable_segments:True" in os.environ.get(var, "")
        for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    )


def _set_expandable(on: bool) -> None:
    torch = _torch_import.import_torch(__name__)
    setting = f"expandable_segments:{on}"
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # torch >= 2.9
    if setter is not None:
        setter(setting)
    else:
        torch.cuda.memory._set_allocator_settings(setting)


def _expandable_off() -> None:
    global _EXPANDABLE_OPEN
    with _EXPANDABLE_LOCK:
        if _EXPANDABLE_OPEN == 0 and _expandable_configured():
            _set_expandable(False)
        _EXPANDABLE_OPEN += 1


def _expandable_restore() -> None:
    global _EXPANDABLE_OPEN
    with _EXPANDABLE_LOCK:
        _EXPANDABLE_OPEN -= 1
        if _EXPANDABLE_OPEN == 0 and _expandable_configured():
            _set_expandable(True)


class SleepAllocator:
    """The process's sleep allocator (one per process: get it with :func:`allocator`).

    ``offload_tags`` are the tags level 1 keeps a host copy of (and that manifests declare
    ``restored``); every other tag is discarded at sleep (``discarded`` in manifests)."""

    def __init__(self, offload_tags: Iterable[str] = DEFAULT_OFFLOAD_TAGS):
        torch = _torch_import.import_torch(__name__)
        if not torch.cuda.is_available():
            raise SleepError("the sleep allocator needs CUDA, and torch sees no GPU")
        if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
            raise SleepError(
                f"the sleep allocator needs torch.cuda.MemPool and use_mem_pool; torch "
                f"{torch.__version__} has not got them (tested with torch 2.11)"
            )
        self.offload_tags = tuple(_tags("offload_tags", offload_tags))
        self._pluggable = torch.cuda.memory.CUDAPluggableAllocator(
            _native.__file__, _native.SLEEP_MALLOC_SYMBOL, _native.SLEEP_FREE_SYMBOL
        )
        self._pools: dict = {}
        self._lock = threading.Lock()
        self._freed_at_sleep = 0

    # -- pools ----------------------------------------------------------------------------

    def mempool(self, tag: str):
        """The ``torch.cuda.MemPool`` of ``tag`` (made on first use). One pool per tag, so
        that torch's caching never hands a block freed under one tag to another."""
        if not isinstance(tag, str) or not tag:
            raise SleepError(f"a tag is a non-empty string, not {tag!r}")
        _args.text("tag", tag)
        with self._lock:
            pool = self._pools.get(tag)
            if pool is None:
                torch = _torch_import.import_torch(__name__)
                pool = torch.cuda.MemPool(self._pluggable.allocator())
                self._pools[tag] = pool
            return pool

    @contextlib.contextmanager
    def pool(self, tag: str) -> Iterator:
        """Allocates under ``tag`` on this thread inside the block; yields the MemPool."""
        torch = _torch_import.import_torch(__name__)
        if self.level is not None:
            # torch would hand out cached blocks of the pool's unmapped segments.
            raise SleepError(f"asleep (level {self.level}): wake before allocating under {tag!r}")
        mempool = self.mempool(tag)
        _expandable_off()
        previous = _native.sleep_set_tag(tag)
        try:
            with torch.cuda.use_mem_pool(mempool):
                yield mempool
        finally:
            _native.sleep_set_tag(previous)
            _expandable_restore()
            self._warn_allocation_error()

    def release_pool(self, tag: str) -> None:
        """Drops ``tag``'s MemPool so that torch gives its memory back once no tensor uses
        it. Not while asleep: the pool's memory is unmapped then."""
        _args.text("tag", tag)
        if self.level is not None:
            raise SleepError(f"asleep (level {self.level}): wake before releasing pool {tag!r}")
        with self._lock:
            if tag not in self._pools:
                raise SleepError(f"no pool has tag {tag!r}; the pools are {sorted(self._pools)}")
            del self._pools[tag]
        _torch_import.import_torch(__name__).cuda.empty_cache()

    def pool_names(self) -> dict:
        """MemPool id → tag, for :func:`graphcheck.torch.snapshot`'s ``pools``."""
        return {pool.id: tag for tag, pool in self._pools.items()}

    def pool_policy(self, tag: str) -> tuple:
        """``(kind, sleep)`` of ``tag``'s pool in a manifest."""
        kind = _POOL_KINDS.get(tag, "other")
        return kind, ("restored" if tag in self.offload_tags else "discarded")

    def declare_pools(self, recorder) -> dict:
        """Declares a pool per tag in ``recorder`` (a :class:`graphcheck.torch.Recorder`),
        with the tag's name, kind and sleep policy; the allocator's segments give the
        ranges when the manifest is built. Returns tag → pool id. (A recorder declares
        the tags it has not seen when it builds a manifest; this declares them now.)"""
        out = {}
        for tag, pool in sorted(self._pools.items()):
            kind, policy = self.pool_policy(tag)
            out[tag] = recorder.add_pool(tag, kind=kind, sleep=policy, torch_pool=pool)
        return out

    # -- sleep and wake -------------------------------------------------------------------

    @property
    def level(self) -> Optional[int]:
        """The sleep level, or ``None`` when awake."""
        return _native.sleep_level()

    def sleep(self, level: int = 1, offload_tags: Optional[Sequence[str]] = None) -> dict:
        """Releases the physical memory of every allocation, keeping a host copy of
        ``offload_tags`` at level 1 (default: :attr:`offload_tags` among the tags in use);
        level 2 keeps nothing. Synchronizes the device first. Returns the bytes offloaded
        and discarded. Raises :class:`SleepError` (and changes nothing) when already
        asleep, for an unknown tag or level, or offload tags at level 2. ``offload_tags`` is
        a list of tags, or one tag as a string."""
        level = _args.integer("level", level)
        if offload_tags is None:
            known = set(self.tags())
            offload_tags = [t for t in self.offload_tags if t in known] if level == 1 else []
        offload_tags = _tags("offload_tags", offload_tags)
        _torch_import.import_torch(__name__).cuda.synchronize()
        report = _native.sleep_sleep(level, offload_tags)
        self._freed_at_sleep = self.stats()["freed_while_asleep"]
        return report

    def wake(self, tags: Optional[Sequence[str]] = None, poison: Union[str, int] = "nan") -> dict:
        """Maps new memory at the same addresses for ``tags`` (all where ``None``),
        restores host copies and fills the rest with ``poison``. Raises
        :class:`SleepOutOfMemoryError` (still asleep, nothing mapped) when the device has
        no room, :class:`SleepError` when not asleep or for an unknown tag. ``tags`` is a
        list of tags, or one tag as a string; ``poison`` a name or a byte (an ``int``)."""
        tags = None if tags is None else _tags("tags", tags)
        if isinstance(poison, bool) or not isinstance(poison, (str, int)):
            raise GraphcheckError(
                f"poison is 'nan', 'zeros', 'none' or a byte (0 to 255), not {_args.show(poison)}"
            )
        r = _native.sleep_wake(tags, _args.text("poison", str(poison)))
        now = self.stats()["freed_while_asleep"]
        freed, self._freed_at_sleep = now - self._freed_at_sleep, now
        if freed:
            warnings.warn(
                f"{freed} allocation(s) were freed while asleep: their addresses and host "
                "copies are gone, and a graph that reads them reads unmapped memory",
                RuntimeWarning,
                stacklevel=2,
            )
        r["awake"] = bool(r["awake"])
        _sleep_state.after_wake(r)
        return r

    # -- introspection --------------------------------------------------------------------

    def tags(self) -> list:
        """Every tag an allocation was made under."""
        return _native.sleep_tags()

    def allocations(self) -> list:
        """Every live allocation, by address."""
        return [Allocation(*a) for a in _native.sleep_allocations()]

    def stats(self) -> dict:
        """Counters: mallocs, frees, allocations, bytes reserved and mapped, pinned host
        bytes held and cached, sleeps and wakes."""
        return _native.sleep_stats()

    def mem_info(self, device: Optional[int] = None) -> tuple:
        """``(free, total)`` device bytes, from the driver (``cuMemGetInfo``)."""
        if device is None:
            device = _torch_import.import_torch(__name__).cuda.current_device()
        return _native.sleep_mem_info(_args.integer("device", device, minimum=0))

    def release_host_cache(self) -> int:
        """Frees the pinned host buffers kept for the next sleep; returns the bytes."""
        return _native.sleep_release_host_cache()

    def _warn_allocation_error(self) -> None:
        e = _native.sleep_take_error()
        if e:
            warnings.warn(f"graphcheck sleep allocator: {e}", RuntimeWarning, stacklevel=3)


_ALLOCATOR_LOCK = threading.Lock()


def allocator(offload_tags: Optional[Iterable[str]] = None) -> SleepAllocator:
    """The process's sleep allocator, made on first call. ``offload_tags`` sets the tags
    level 1 keeps (on any call): a list of tags, or one tag as a string."""
    if offload_tags is not None:
        offload_tags = _tags("offload_tags", offload_tags)
    with _ALLOCATOR_LOCK:
        made = _sleep_state.allocator()
        if made is None:
            made = SleepAllocator(DEFAULT_OFFLOAD_TAGS if offload_tags is None else offload_tags)
            _sleep_state.keep_allocator(made)
        elif offload_tags is not None:
            made.offload_tags = tuple(offload_tags)
        return made


def sleep_pool(tag: str):
    """``with sleep_pool("weights"):`` allocates under ``tag`` in the process's allocator."""
    return allocator().pool(tag)


def sleep(level: int = 1, offload_tags: Optional[Sequence[str]] = None) -> dict:
    """:meth:`SleepAllocator.sleep` of the process's allocator."""
    return allocator().sleep(level, offload_tags)


def wake(tags: Optional[Sequence[str]] = None, poison: Union[str, int] = "nan") -> dict:
    """:meth:`SleepAllocator.wake` of the process's allocator."""
    return allocator().wake(tags, poison)

