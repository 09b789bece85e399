"""Kernel coverage on a real GPU (issue 6, scenario 10): graphs holding cuDNN and flash
SDPA, a Triton kernel, and an fp8 `torch._scaled_mm` with its scales (a cuBLASLt Hopper
GEMM, parameters packed in `extra`). Every tensor each graph's kernels use must be found as
a touch and resolved to its owner. Opt-in (GRAPHCHECK_GPU_TESTS=1); GRAPHCHECK_GPU_OUT=DIR
keeps the manifest for fixtures/gpu/.
"""


import graphcheck
import graphcheck.torch as gt
from conftest import CUBLAS_WORKSPACE, save_gpu_document as save, warm_up


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

except ImportError:  # pragma: no cover - the GPU machine has Triton
    triton = None


def touched_paths(manifest, graph):
    """Owner paths of every tensor the graph's kernels touch."""
    owners = {}
    for o in manifest["owners"]:
        owners.setdefault(o["tensor"], []).append(o["path"])
    out = set()
    for g in manifest["graphs"]:
        if g["name"] != graph:
            continue
        for n in g["nodes"]:
            for t in n.get("touches", []):
                out.update(owners.get(t.get("tensor"), []))
    return out


def kernel_names(manifest, graph):
    return sorted({n["name"][:80] for g in manifest["graphs"] if g["name"] == graph for n in g["nodes"]})


def test_every_tensor_of_sdpa_triton_and_fp8_gemm_is_found(cuda):
    torch = cuda
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    m = torch.nn.Module()
    bf = dict(device="cuda", dtype=torch.bfloat16)
    m.register_buffer("q", torch.randn(1, 8, 128, 64, **bf))
    m.register_buffer("k", torch.randn(1, 8, 128, 64, **bf))
    m.register_buffer("v", torch.randn(1, 8, 128, 64, **bf))
    m.register_buffer("tx", torch.randn(4096, device="cuda"))
    m.register_buffer("ty", torch.randn(4096, device="cuda"))
    m.register_buffer("w_fp8", torch.randn(256, 512, device="cuda").to(torch.float8_e4m3fn))
    m.register_buffer("scale_a", torch.tensor(0.5, device="cuda"))
    m.register_buffer("scale_b", torch.tensor(2.0, device="cuda"))
    x_fp8 = torch.randn(64, 512, device="cuda").to(torch.float8_e4m3fn)
    t_out = torch.empty(4096, device="cuda")

    def cudnn_sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(m.q, m.k, m.v, is_causal=True)

    def flash_sdpa():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(m.q, m.k, m.v, is_causal=True)

    def triton_add():
        _add_kernel[(4096 // 1024,)](m.tx, m.ty, t_out, 4096, BLOCK=1024)
        return t_out

    def fp8_gemm():
        return torch._scaled_mm(x_fp8, m.w_fp8.t(), scale_a=m.scale_a, scale_b=m.scale_b, out_dtype=torch.bfloat16)

    cases = {
        "cudnn_sdpa": (cudnn_sdpa, {"model.q", "model.k", "model.v"}, {}),
        "flash_sdpa": (flash_sdpa, {"model.q", "model.k", "model.v"}, {}),
        "triton_add": (triton_add, {"model.tx", "model.ty", 'graphs["triton_add"].outputs["out"]'}, {"out": t_out}),
        "fp8_scaled_mm": (
            fp8_gemm,
            {"model.w_fp8", "model.scale_a", "model.scale_b", 'graphs["fp8_scaled_mm"].inputs["x"]'},
            {"x": x_fp8},
        ),
    }
    assert triton is not None, "Triton is on the GPU machine"
    rec = gt.Recorder(m)
    graphs, results, failures = {}, {}, {}
    for name, (fn, _, io) in cases.items():
        try:
            warm_up(torch, fn)
            g = torch.cuda.CUDAGraph(keep_graph=True)
            inputs = {k: v for k, v in io.items() if k == "x"}
            outputs = {k: v for k, v in io.items() if k == "out"}
            with torch.no_grad(), gt.graph(g, recorder=rec, name=name, inputs=inputs, outputs=outputs):
                y = fn()
            g.replay()
            torch.cuda.synchronize()
            with torch.no_grad():
                err = (y.float() - fn().float()).abs().max().item()
            graphs[name], results[name] = g, err
        except Exception as e:  # noqa: BLE001 - reported below with the others
            failures[name] = f"{type(e).__name__}: {e}"
    manifest = graphcheck.load(rec.manifest())
    save("corpus_kernels_manifest.json", manifest)
    report = graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE)
    print(report)
    for name, (_, expected, _) in cases.items():
        if name in failures:
            print(f"{name}: NOT CAPTURED: {failures[name]}")
            continue
        got = touched_paths(manifest, name)
        print(f"{name}: replay vs eager {results[name]}; kernels {kernel_names(manifest, name)}; touched {sorted(got)}")
        assert expected <= got, f"{name}: missing {sorted(expected - got)}"
        assert results[name] < 1e-2
    assert not [f for f in report.findings if f.kind not in ("unused_allow",)], str(report)
    assert not failures, failures
