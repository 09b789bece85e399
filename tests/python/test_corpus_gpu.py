"""The reload bug corpus on a real GPU (issue 6, first scenarios): each test does what an
upstream bug did, shows the failure in a replay where it is observable, and checks that
graphcheck names it. Opt-in (GRAPHCHECK_GPU_TESTS=1); with GRAPHCHECK_GPU_OUT=DIR the
manifests and live snapshots are written there for fixtures/gpu/.
"""

import functools

import graphcheck
import graphcheck.torch as gt
from conftest import CUBLAS_WORKSPACE, save_gpu_document as save, warm_up

D = 256
L0 = "model.layers[0]"
FE = "quant_method.moe_kernel.fused_experts"






def model_of(torch, layer):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([layer])
    return model


def capture(torch, model, x):
    layer = model.layers[0]
    warm_up(torch, lambda: layer(x))
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, model=model, name="decode_bs8", inputs={"x": x}) as rec:
        y = layer(x)
    return g, y, graphcheck.load(rec.manifest())


def replay_error(torch, g, y, model, x):
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        expected = model.layers[0](x)
    return (y.float() - expected.float()).abs().max().item()




def kinds(report):
    # An allow entry for the workspace is unused where no GEMM needed it.
    return sorted((f.kind, f.subject) for f in report.findings if f.kind != "unused_allow")


def wrong(err):
    return err != err or err > 1e-3  # NaN (freed memory read back as garbage) is wrong too


def run(torch, name, layer, reload, *, unregistered, contents="updated"):
    """``unregistered``: the tensors the layer reads through plain attributes (no module
    registration), each found ``unregistered`` at capture; cuBLAS's workspace is allowed."""
    model = model_of(torch, layer)
    x = torch.randn(8, D, device="cuda")
    g, y, manifest = capture(torch, model, x)
    at_capture = kinds(graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE))
    assert at_capture == sorted(("unregistered", f"{L0}.{p}") for p in unregistered), at_capture
    with torch.no_grad():
        reload(model.layers[0])
    torch.cuda.synchronize()
    err = replay_error(torch, g, y, model, x)
    live = gt.snapshot(model, manifest, event=f"{name}: reload", contents=contents)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(f"\n{name}: replay differs from eager by {err}\n{report}")
    save(f"corpus_{name}_manifest.json", manifest)
    save(f"corpus_{name}_live.json", live)
    return err, report


class MarlinKernel:
    """A kernel object holding its workspace as a plain attribute (vllm#48438)."""

    def __init__(self, torch, fill):
        self.workspace = torch.full((D,), fill, device="cuda")


class MarlinMethod:
    def __init__(self, torch):
        self.kernel = MarlinKernel(torch, 0.0)


def test_marlin_workspace_rebuilt_by_reload(cuda):
    torch = cuda

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D, bias=False, device="cuda")
            self.quant_method = MarlinMethod(torch)
            self.g_idx_sort_indices = torch.randperm(D, device="cuda")

        def forward(self, x):
            h = x.index_select(1, self.g_idx_sort_indices)
            return self.proj(h) + self.quant_method.kernel.workspace

    def reload(layer):
        layer.proj.weight.copy_(torch.randn_like(layer.proj.weight) * 0.05)
        layer.quant_method.kernel = MarlinKernel(torch, 1.0)  # rebuilt by post-load
        layer.g_idx_sort_indices = torch.randperm(D, device="cuda")

    err, report = run(torch, "marlin", Layer(), reload,
                      unregistered=["g_idx_sort_indices", "quant_method.kernel.workspace"])
    assert wrong(err)
    got = kinds(report)
    for path in (f"{L0}.quant_method.kernel.workspace", f"{L0}.g_idx_sort_indices"):
        assert ("drifted", path) in got and ("unregistered", path) in got
        assert ("freed", path) in got or ("reused", path) in got


class FusedExperts:
    """CUTLASS MoE strides on a nested experts object, c_strides2 aliasing ab_strides1
    (vllm#41670)."""

    def __init__(self, torch, k):
        self.ab_strides1 = torch.full((D,), float(k), device="cuda")
        self.ab_strides2 = torch.full((D,), float(k + 1), device="cuda")
        self.c_strides1 = torch.full((D,), float(k + 2), device="cuda")
        self.c_strides2 = self.ab_strides1


class MoeKernel:
    def __init__(self, torch, k):
        self.fused_experts = FusedExperts(torch, k)


class MoeMethod:
    def __init__(self, torch, k):
        self.moe_kernel = MoeKernel(torch, k)


def test_cutlass_moe_strides_alias_rebuilt(cuda):
    torch = cuda

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(D, D, device="cuda") * 0.05)
            self.quant_method = MoeMethod(torch, 1)

        def forward(self, x):
            fe = self.quant_method.moe_kernel.fused_experts
            h = x @ self.w
            return h * fe.ab_strides1 + fe.ab_strides2 - fe.c_strides1 + fe.c_strides2

    def reload(layer):
        layer.quant_method = MoeMethod(torch, 5)  # the experts are rebuilt on reload

    err, report = run(torch, "cutlass_moe", Experts(), reload, unregistered=[
        # c_strides2 is ab_strides1: one tensor, its two paths in one subject.
        f"{FE}.ab_strides1 = {L0}.{FE}.c_strides2", f"{FE}.ab_strides2", f"{FE}.c_strides1",
    ])
    assert wrong(err)
    fe = f"{L0}.quant_method.moe_kernel.fused_experts"
    got = kinds(report)
    assert ("drifted", f"{fe}.ab_strides1 = {fe}.c_strides2") in got  # one finding, both owners
    assert ("drifted", f"{fe}.ab_strides2") in got and ("drifted", f"{fe}.c_strides1") in got


def test_machete_permutation_in_a_partial(cuda):
    torch = cuda

    def permute(h, perm):
        return h.index_select(1, perm)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D, bias=False, device="cuda")
            self.act_perm = functools.partial(permute, perm=torch.randperm(D, device="cuda"))

        def forward(self, x):
            return self.proj(self.act_perm(x))

    def reload(layer):
        layer.act_perm = functools.partial(permute, perm=torch.randperm(D, device="cuda"))

    err, report = run(torch, "machete_partial", Layer(), reload,
                      unregistered=['act_perm.keywords["perm"]'])
    assert wrong(err)
    got = kinds(report)
    path = f'{L0}.act_perm.keywords["perm"]'
    assert ("drifted", path) in got and ("unregistered", path) in got, got



def test_mla_absorbed_weights_rebound_by_reload(cuda):
    """MLA (DeepSeek-style): `W_UK_T` and `W_UV` derived from `kv_b_proj.weight` after
    loading and kept as plain attributes; a reload with new weights copies the weight in
    place but rebuilds the derived pair at new addresses (vllm#48438's MLA case)."""
    torch = cuda
    R, H = 64, 4  # latent rank, heads

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kv_b_proj = torch.nn.Linear(R, 2 * H * (D // H), bias=False, device="cuda")
            self.q_proj = torch.nn.Linear(D, R, bias=False, device="cuda")
            self.process_weights_after_loading()

        def process_weights_after_loading(self):
            # Copies, as vLLM's are where the weight is dequantized first.
            w = self.kv_b_proj.weight.detach().view(2, D, R)
            self.W_UK_T = w[0].t().contiguous()  # (R, D)
            self.W_UV = w[1].t().contiguous()  # (R, D)

        def forward(self, x):
            latent = self.q_proj(x)  # (B, R)
            k = latent @ self.W_UK_T  # (B, D)
            return (k * x) @ self.W_UV.t() @ self.W_UK_T

    def reload(layer):
        layer.kv_b_proj.weight.copy_(torch.randn_like(layer.kv_b_proj.weight) * 0.05)
        layer.process_weights_after_loading()

    err, report = run(torch, "mla", Attention(), reload, unregistered=["W_UK_T", "W_UV"])
    assert wrong(err)
    got = kinds(report)
    for path in (f"{L0}.W_UK_T", f"{L0}.W_UV"):
        assert ("drifted", path) in got and ("unregistered", path) in got, got
        assert ("freed", path) in got or ("reused", path) in got, got
    assert not [k for k in got if k[0] in ("drifted", "freed") and "kv_b_proj" in k[1]], got


_COS_SIN_CACHE = {}


def test_module_global_cache_is_unowned(cuda):
    torch = cuda
    _COS_SIN_CACHE["cos"] = torch.randn(D, device="cuda")

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D, bias=False, device="cuda")

        def forward(self, x):
            return self.proj(x) * _COS_SIN_CACHE["cos"]

    model = model_of(torch, Layer())
    x = torch.randn(8, D, device="cuda")
    g, y, manifest = capture(torch, model, x)
    report = graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE)
    print(report)
    save("corpus_module_global_manifest.json", manifest)
    unowned = [f for f in report.findings if f.kind == "unowned"]
    assert len(unowned) == 1 and all("mul" in k.name or "Mul" in k.name for k in unowned[0].kernels), report


def test_freed_address_reused_by_another_owner(cuda):
    torch = cuda

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D, bias=False, device="cuda")
            self.register_buffer("scale", torch.full((D,), 2.0, device="cuda"))

        def forward(self, x):
            return self.proj(x) * self.scale

    def reload(layer):
        new = torch.full((D,), 3.0, device="cuda")  # allocated before the old one is freed
        layer.scale = new  # the buffer is rebound; its old storage is released
        torch.cuda.synchronize()
        layer.register_buffer("bias", torch.full((D,), 100.0, device="cuda"))  # takes the freed block

    err, report = run(torch, "reused", Layer(), reload, unregistered=[])
    assert wrong(err)
    got = kinds(report)
    assert ("drifted", f"{L0}.scale") in got
    assert ("reused", f"{L0}.scale") in got or ("freed", f"{L0}.scale") in got, got


def test_clean_reload_in_place_is_clean(cuda):
    torch = cuda

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D, bias=False, device="cuda")
            self.register_buffer("w_t", self.proj.weight.detach().t().contiguous(), persistent=False)

        def forward(self, x):
            return self.proj(x) + x @ self.w_t

    def reload(layer):
        layer.proj.weight.copy_(torch.randn_like(layer.proj.weight) * 0.05)
        layer.w_t.copy_(layer.proj.weight.t())  # the derived buffer refreshed in place

    err, report = run(torch, "clean_inplace", Layer(), reload, unregistered=[])
    assert err < 1e-3, "an in-place reload replays right"
    assert kinds(report) == [], str(report)


def test_two_graphs_only_one_reads_the_drifted_tensor(cuda):
    # Batch sizes 1 and 8 captured into one pool; only the bs=8 path reads `big_scale`
    # (a plain attribute rebuilt on reload): the recapture set is decode_bs8 alone.
    torch = cuda

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D, bias=False, device="cuda")
            self.big_scale = torch.full((D,), 2.0, device="cuda")

        def forward(self, x):
            h = self.proj(x)
            return h * self.big_scale if x.shape[0] > 4 else h

    model = model_of(torch, Layer())
    layer = model.layers[0]
    xs = {b: torch.randn(b, D, device="cuda") for b in (1, 8)}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for b in (1, 8):
            layer(xs[b])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    rec = gt.Recorder(model)
    pool = torch.cuda.graph_pool_handle()
    graphs, outs = {}, {}
    for b in (1, 8):
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), gt.graph(g, recorder=rec, name=f"decode_bs{b}", pool=pool, inputs={"x": xs[b]}):
            outs[b] = layer(xs[b])
        graphs[b] = g
    manifest = graphcheck.load(rec.manifest())
    with torch.no_grad():
        layer.big_scale = torch.full((D,), 5.0, device="cuda")
    errs = {}
    for b in (1, 8):
        graphs[b].replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            errs[b] = (outs[b] - layer(xs[b])).abs().max().item()
    live = gt.snapshot(model, manifest, event="reload: big_scale rebuilt", contents="updated")
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(f"\ntwo graphs: replay errors {errs}\n{report}")
    save("corpus_two_graphs_manifest.json", manifest)
    save("corpus_two_graphs_live.json", live)
    assert errs[1] < 1e-3 and wrong(errs[8])
    drifted = [f for f in report.findings if f.kind == "drifted"]
    assert [f.subject for f in drifted] == [f"{L0}.big_scale"]
    assert report.recapture() == ["decode_bs8"]
