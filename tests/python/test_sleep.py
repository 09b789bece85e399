"""The sleep allocator's Python surface without a GPU: the exported C symbols torch's
CUDAPluggableAllocator loads, the per-thread tag, and the errors where there is no CUDA
driver. The allocator itself is tested by the graphcheck-sleep crate (`sleep/src/allocator/
tests.rs`: the state machine, over host memory; `sleep/tests/gpu.rs`: over the driver) and
on the GPU by test_sleep_gpu.py."""

import ctypes
import threading

import pytest

import graphcheck
import graphcheck.sleep as gs
from graphcheck import _native, _sleep_state


def test_the_native_library_exports_the_allocator_symbols():
    lib = ctypes.CDLL(_native.__file__)
    assert _native.SLEEP_MALLOC_SYMBOL == "graphcheck_sleep_malloc"
    assert _native.SLEEP_FREE_SYMBOL == "graphcheck_sleep_free"
    assert getattr(lib, _native.SLEEP_MALLOC_SYMBOL)
    assert getattr(lib, _native.SLEEP_FREE_SYMBOL)


def test_sleep_errors_are_graphcheck_errors():
    assert issubclass(gs.SleepError, graphcheck.GraphcheckError)
    assert issubclass(gs.SleepOutOfMemoryError, gs.SleepError)


def test_the_tag_is_per_thread_and_restored():
    assert _native.sleep_tag() is None
    assert _native.sleep_set_tag("weights") is None
    seen = []
    t = threading.Thread(target=lambda: seen.append(_native.sleep_tag()))
    t.start()
    t.join()
    assert seen == [None], "another thread does not see this thread's tag"
    assert _native.sleep_set_tag("kv_cache") == "weights"
    assert _native.sleep_set_tag(None) == "kv_cache"
    with pytest.raises(gs.SleepError, match="non-empty"):
        _native.sleep_set_tag("")


def test_bad_poison_is_refused_before_touching_the_allocator():
    with pytest.raises(gs.SleepError, match="poison is `nan`, `zeros`, `none` or a byte"):
        _native.sleep_wake(None, "purple")


def _has_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_has_driver(), reason="this machine has a CUDA driver: test_sleep_gpu.py covers it")
def test_without_a_driver_malloc_returns_null_and_says_why():
    lib = ctypes.CDLL(_native.__file__)
    malloc = getattr(lib, _native.SLEEP_MALLOC_SYMBOL)
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert malloc(1 << 20, 0, None) is None
    assert "no CUDA driver" in _native.sleep_take_error()
    assert _native.sleep_take_error() is None, "the error is taken once"
    with pytest.raises(gs.SleepError, match="no CUDA driver"):
        _native.sleep_level()


def test_the_allocator_needs_cuda(torch):
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: test_sleep_gpu.py covers the allocator")
    with pytest.raises(gs.SleepError, match="needs CUDA"):
        gs.SleepAllocator()


def test_graphcheck_torch_exports_the_sleep_api():
    import graphcheck.torch as gt

    for name in ("sleep_pool", "sleep", "wake", "sleep_allocator", "SleepError"):
        assert name in gt.__all__ and hasattr(gt, name)


class _FakePool:
    def __init__(self, pid):
        self.id = pid


def test_recorders_declare_the_sleep_allocators_tags_without_being_asked(torch, monkeypatch):
    """The pools come from the process's allocator (a stand-in here: the real one needs a
    GPU, and test_sleep_gpu.py runs it) with each tag's kind and sleep policy."""
    import graphcheck.torch as gt
    from conftest import kernel, walked

    class FakeAllocator:
        offload_tags = ("weights",)
        _pools = {"weights": _FakePool((1, 7)), "kv_cache": _FakePool((1, 8)), "scratch": _FakePool((1, 9))}
        pool_policy = gs.SleepAllocator.pool_policy
        pool_names = gs.SleepAllocator.pool_names

    monkeypatch.setattr(_sleep_state, "_ALLOCATOR", FakeAllocator())
    model = torch.nn.Linear(4, 4)
    rec = gt.Recorder(model)
    rec.add_pool("kv_cache", kind="kv_cache", sleep="discarded")  # declared by hand: kept once
    rec.add_graph("g", walked(kernel(0, "k", model.weight)))
    m = rec.manifest()
    pools = {p["name"]: (p["kind"], p["sleep"]) for p in m["pools"]}
    assert pools == {
        "kv_cache": ("kv_cache", "discarded"),
        "scratch": ("other", "discarded"),
        "weights": ("weights", "restored"),
    }
    assert [p["name"] for p in rec.manifest()["pools"]] == [p["name"] for p in m["pools"]], "declared once"
    live = gt.snapshot(model, m)
    assert {p["name"] for p in live["pools"]} == set(pools)
