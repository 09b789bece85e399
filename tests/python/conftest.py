"""Shared helpers of the Python tests: the installed graphcheck package, torch (skipped
loudly where missing), and hand-written walked graphs over CPU tensors.

ci/test.sh builds and installs the package (maturin) and torch (ci/install-tools.sh)
before pytest runs; these tests exercise what is installed, not the source tree.
"""

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

try:
    import graphcheck  # noqa: F401
except ImportError as e:  # pragma: no cover - a broken setup, not a test result
    raise ImportError(
        f"the graphcheck package is not installed ({e}): run ci/test.sh, or "
        "`maturin build --release -o target/wheels-dev && pip install --force-reinstall "
        "target/wheels-dev/graphcheck-*.whl`"
    ) from e


#: GPU tests run only where this is set (on a machine with CUDA); elsewhere they skip.
GPU = os.environ.get("GRAPHCHECK_GPU_TESTS") == "1"


@pytest.fixture(scope="session")
def torch():
    """PyTorch; the test is skipped, with the reason shown, where it is not installed."""
    try:
        import torch as t
    except ImportError as e:
        pytest.skip(
            f"TORCH IS NOT INSTALLED ({e}): the graphcheck.torch tests did not run; "
            "ci/install-tools.sh installs it"
        )
    return t


@pytest.fixture
def cuda(torch):
    """torch on a GPU machine with GRAPHCHECK_GPU_TESTS=1, seeded; the test is skipped,
    saying why, elsewhere, and fails where the switch is on but torch sees no GPU."""
    if not GPU:
        pytest.skip("GPU tests are opt-in: set GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA")
    if not torch.cuda.is_available():
        pytest.fail("GRAPHCHECK_GPU_TESTS=1 but torch sees no CUDA device")
    torch.manual_seed(0)
    return torch


def warm_up(torch, fn, times=2):
    """Runs ``fn`` on a side stream ``times`` times, as torch asks before a capture (lazy
    initialisation, cuBLAS handles, autotuning happen here and not in the graph)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def rust_binary():
    """The Rust CLI the Python CLI is compared with (GRAPHCHECK_BIN, else target/)."""
    if os.environ.get("GRAPHCHECK_BIN"):
        return Path(os.environ["GRAPHCHECK_BIN"])
    for profile in ("debug", "release"):
        candidate = REPO / "target" / profile / "graphcheck"
        if candidate.is_file():
            return candidate
    pytest.fail("no graphcheck binary: run `cargo build -p graphcheck-cli` first")


def kernel(index, name, *tensors_or_addrs, param_offsets=None):
    """A WalkedNode of kind kernel whose parameter i holds the address of argument i: a
    tensor's data pointer, or an int address."""
    words = []
    for i, x in enumerate(tensors_or_addrs):
        addr = x if isinstance(x, int) else x.data_ptr()
        words.append({"param": i, "offset": 0, "addr": hex(addr), "allocation": None})
    return {
        "index": index,
        "kind": "kernel",
        "name": name,
        "grid": [1, 1, 1],
        "block": [128, 1, 1],
        "parent": None,
        "opaque": None,
        "words": words,
    }


def walked(*nodes):
    """A WalkedGraph (the core's walked-graph type) of the given nodes, as JSON text."""
    return json.dumps(
        {"node_counts": {"kernel": len(nodes)}, "unread": [], "nodes": list(nodes)}
    )


def fake_unowned_block(monkeypatch, tensor, pool=(1, 2)):
    """Puts ``tensor``'s storage in a faked allocator block of torch pool ``pool`` (the
    caching allocator's snapshot, ``graphcheck._caching_allocator.memory_segments``) and
    digests ranges from host memory where they are (``graphcheck._digest.range_digests``),
    recording each call's ranges. Returns ``((base, size), calls)``."""
    import ctypes

    import graphcheck._caching_allocator
    import graphcheck._digest
    from graphcheck import _native

    base, size = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
    segment = {
        "address": base,
        "total_size": size,
        "segment_pool_id": pool,
        "blocks": [{"address": base, "size": size, "state": "active_allocated"}],
    }
    monkeypatch.setattr(graphcheck._caching_allocator, "memory_segments", lambda: [segment])
    calls = []

    def digester(ranges):
        calls.append(list(ranges))
        return [_native.gc128_bytes(ctypes.string_at(a, n)) for a, n in ranges]

    monkeypatch.setattr(graphcheck._digest, "range_digests", digester)
    return (base, size), calls


def save_gpu_document(name, doc):
    """Writes a manifest or live snapshot a GPU test made into $GRAPHCHECK_GPU_OUT, if set
    (how fixtures/gpu/ was recorded)."""
    out = os.environ.get("GRAPHCHECK_GPU_OUT")
    if out:
        with open(os.path.join(out, name), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


#: torch's cuBLAS(Lt) workspace: graphs hold it (GEMMs, split-K reductions, the memset that
#: clears it), no model owner reaches it; a real finding, allowed in the GPU tests by its
#: kernels (the same entry as fixtures/gpu/cublas_workspace.allow.toml).
CUBLAS_WORKSPACE = [{
    "kernels": ["nvjet_*", "*gemm*", "*splitKreduce*", "*cutlass::Kernel2*", "memset"],
    "kinds": ["unowned"],
    "reason": "torch's cuBLAS workspace: scratch torch keeps for the whole process",
}]


#: The source of a stand-in for torch.cuda.CUDAGraph and the walker, for the conftest of a
#: pytester run (the pytest plugin's tests; it needs json, pytest, torch and
#: graphcheck._native imported): the fake captures nothing, and each walk reads the tensors
#: the inner test put in NEXT["tensors"], by one kernel (NEXT["name"], default gemv).
FAKE_CUDA_GRAPH = """
class FakeCUDAGraph:
    def __new__(cls, keep_graph=False):
        return object.__new__(cls)

    def __init__(self, keep_graph=False):
        self.keep_graph = keep_graph

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        if not self.keep_graph:  # torch instantiates here and drops the template
            self.instantiated = True

    def raw_cuda_graph(self):
        return 0x1000

    def instantiate(self):
        self.instantiated = True

    def pool(self):
        return (0, 1)


NEXT = {}


def fake_walk(handle):
    # One kernel node (named NEXT.get("name", "gemv")) reading NEXT["tensors"], in order.
    words = [{"param": i, "offset": 0, "addr": hex(t.data_ptr()), "allocation": None}
             for i, t in enumerate(NEXT["tensors"])]
    node = {"index": 0, "kind": "kernel", "name": NEXT.get("name", "gemv"), "grid": [1, 1, 1],
            "block": [1, 1, 1], "parent": None, "opaque": None, "words": words}
    return json.dumps({"node_counts": {"kernel": 1}, "unread": [], "nodes": [node]})


@pytest.fixture(autouse=True)
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda.graphs, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(_native, "walk_graph", fake_walk, raising=False)
    monkeypatch.setattr(_native, "walk", lambda h: _native.Walked.from_json(fake_walk(h)), raising=False)
    # The capture instrument() walks before it ends (no template kept): the same handle.
    import graphcheck._instrument.patch
    monkeypatch.setattr(_native, "capturing_graph", lambda stream: 0x1000)
    monkeypatch.setattr(graphcheck._instrument.patch, "current_stream", lambda: 0)
"""
