"""The walk of a capture still open (issue 32: instrument() keeps no template by default).
On a real GPU, torch captures graphs of the parameter shapes the walker reads (cuBLAS
GEMMs, elementwise and reduction kernels, a Triton kernel, a driver memset, memcpy between
device and pinned host memory); each is walked twice, through ``_native.capturing_graph`` on the
capture stream just before ``capture_end`` and through the kept template after it, and
the two walks must be the same, then the graph replays right. Then ``instrument()``
records with no template kept (torch refuses ``raw_cuda_graph()``), replays right, and its
replay check still refuses a rebound tensor; ``keep_templates=True`` keeps them.

Opt-in: GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA (CI has none).
"""

import ctypes

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck import _native
from conftest import CUBLAS_WORKSPACE, warm_up

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)

except ImportError:  # pragma: no cover - the GPU machine has Triton
    triton = None


def decode_model(torch, d=256):
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.RMSNorm(d, device="cuda", dtype=torch.bfloat16)
            self.proj = nn.Linear(d, d, bias=False, device="cuda", dtype=torch.bfloat16)
            self.register_buffer("W_UV", (self.proj.weight.detach().t() * 0.5).contiguous(), persistent=False)

        def forward(self, x):
            h = self.norm(x)
            return self.proj(h) + h @ self.W_UV

    m = nn.Module()
    m.layer = Layer()
    return m


def workloads(torch):
    """(name, fn) pairs whose captures hold every node shape the walker reads."""
    m = decode_model(torch)
    # The static input, a buffer of the model as an engine's input buffers are.
    m.register_buffer("x", torch.randn(8, 256, device="cuda", dtype=torch.bfloat16), persistent=False)
    x = m.x
    src = torch.randn(4096, device="cuda")
    dst = torch.zeros(4096, device="cuda")
    pinned = torch.ones(4096).pin_memory()
    back = torch.zeros(4096).pin_memory()
    out = {}

    def decode():
        out["decode"] = m.layer(x)

    libcuda = ctypes.CDLL("libcuda.so.1")
    libcuda.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]

    def copies():
        # A memset node (torch 2.11 lowers zero_ to a fill kernel): the driver's own call.
        stream = torch.cuda.current_stream().cuda_stream
        assert libcuda.cuMemsetD32Async(dst.data_ptr(), 0, dst.numel(), stream) == 0
        dst.copy_(src)  # device to device
        dst.add_(pinned.to("cuda", non_blocking=True))  # pinned host to device
        back.copy_(dst, non_blocking=True)  # device to pinned host
        out["copies"] = dst

    def triton_scale():
        y = torch.empty_like(src)
        _scale_kernel[(4096 // 256,)](src, y, 4096, BLOCK=256)
        out["triton"] = y

    loads = [("decode", decode), ("copies", copies)]
    if triton is not None:
        loads.append(("triton", triton_scale))
    return m, x, loads, out, (src, dst, pinned, back)


def test_the_open_capture_walks_as_its_kept_template_and_replays_right(cuda):
    torch = cuda
    _, _, loads, out, (src, dst, pinned, back) = workloads(torch)
    if triton is None:
        pytest.fail("Triton is not installed on this GPU machine")
    for name, fn in loads:
        with torch.no_grad():
            warm_up(torch, fn)
            eager = out[name].clone()
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), torch.cuda.graph(g):
            fn()
            stream = torch.cuda.current_stream().cuda_stream
            open_walk = _native.walk(_native.capturing_graph(stream))
        kept = _native.walk(g.raw_cuda_graph())
        assert open_walk.to_json() == kept.to_json(), name
        assert len(kept) > 0 and kept.words > 0, name
        counts = kept.node_counts
        if name == "copies":
            assert counts.get("memset") and counts.get("memcpy", 0) >= 3, counts
        g.instantiate()
        out[name].zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[name], eager), name
    # Not capturing any more: said, not read.
    with pytest.raises(graphcheck.GraphcheckError, match="has no capture open"):
        _native.capturing_graph(torch.cuda.current_stream().cuda_stream)


def test_instrument_keeps_no_template_replays_right_and_still_refuses_a_rebind(cuda):
    torch = cuda
    m, x, loads, out, _ = workloads(torch)
    decode = dict(loads)["decode"]
    with torch.no_grad():
        warm_up(torch, decode)
        eager = out["decode"].clone()
    ins = gt.instrument(False, model=m, name="decode_bs8", verify_on_replay="raise")
    try:
        assert ins.keep_templates is False
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            decode()
        assert ins.errors == [] and ins.captures == 1
        with pytest.raises(RuntimeError):
            g.raw_cuda_graph()  # torch destroyed the template at instantiate
        manifest = graphcheck.load(ins.manifest())
        paths = {o["path"] for o in manifest["owners"]}
        assert {"model.layer.proj.weight", "model.layer.W_UV", "model.layer.norm.weight"} <= paths
        report = graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE)
        assert report.ok, report.table
        out["decode"].zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out["decode"], eager)
        # A derived tensor rebuilt at a new address: the check before the replay refuses it.
        m.layer.W_UV = m.layer.W_UV.clone()
        gt.mark_transition("reload", "preserved")
        with pytest.raises(gt.ReplayCheckError, match="W_UV"):
            g.replay()
    finally:
        gt.uninstrument(ins)
    kept = gt.instrument(False, model=m, name="kept", keep_templates=True)
    try:
        g2 = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g2):
            decode()
        assert kept.errors == [] and kept.captures == 1
        assert g2.raw_cuda_graph() != 0  # the template, kept for retarget
        g2.replay()
        torch.cuda.synchronize()
    finally:
        gt.uninstrument(kept)
