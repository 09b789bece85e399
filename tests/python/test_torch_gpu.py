"""graphcheck.torch on a real GPU: capture with ``graphcheck.torch.graph``, walk the captured
graph with the Rust walker, verify; then break it the way upstream reloads do, show the
failure in a replay, and check that verify names it.

Opt-in: runs only with GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA (CI has none). With
GRAPHCHECK_GPU_OUT=DIR the manifests and live snapshots are written there (the fixtures
under fixtures/gpu/ were recorded so).
"""

import json

import graphcheck
import graphcheck.torch as gt
from conftest import save_gpu_document as save, warm_up







def make_model(torch, d=256):
    """A decode layer with the upstream failure classes: a derived MLA-style weight kept as
    a plain attribute (W_UV), a Gemma3n-style constant as a plain attribute (embed_scale),
    and registered parameters and buffers."""
    nn = torch.nn
    torch.manual_seed(0)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.RMSNorm(d, device="cuda", dtype=torch.bfloat16)
            self.proj = nn.Linear(d, d, bias=False, device="cuda", dtype=torch.bfloat16)
            self.register_buffer("bias", torch.randn(d, device="cuda", dtype=torch.bfloat16) * 0.01, persistent=False)
            self.W_UV = (self.proj.weight.detach().t() * 0.5).contiguous()
            self.embed_scale = torch.tensor(8.0, device="cuda", dtype=torch.bfloat16)

        def forward(self, x):
            h = self.norm(x) * self.embed_scale
            return self.proj(h) + h @ self.W_UV + self.bias

    model = nn.Module()
    model.layers = nn.ModuleList([Layer()])
    return model


def forward(model, x):
    return model.layers[0](x)


def capture(torch, model, x, name="decode_bs8"):
    warm_up(torch, lambda: forward(model, x))
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, model=model, name=name, inputs={"x": x}) as rec:
        y = forward(model, x)
    return g, y, rec


def kinds(report):
    return sorted((f.kind, f.subject) for f in report.findings)


L0 = "model.layers[0]"


def test_capture_finds_every_tensor_and_only_the_plain_attributes(cuda):
    torch = cuda
    model = make_model(torch)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    g, y, rec = capture(torch, model, x)
    manifest = graphcheck.load(rec.manifest())
    save("torch_decode_manifest.json", manifest)
    report = graphcheck.verify(manifest)
    print(report)
    # Exactly the two plain attributes; every other address is a parameter, a buffer, the
    # graph input or a graph-pool intermediate.
    assert kinds(report) == [("unregistered", f"{L0}.W_UV"), ("unregistered", f"{L0}.embed_scale")]
    touched = {o["path"] for o in manifest["owners"]} & {
        f"{L0}.proj.weight", f"{L0}.norm.weight", f"{L0}.bias", f"{L0}.W_UV", f"{L0}.embed_scale"
    }
    assert len(touched) == 5
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        assert torch.allclose(y, forward(model, x), atol=1e-2)


def test_rebinding_a_derived_tensor_is_drifted_and_the_replay_is_wrong(cuda):
    torch = cuda
    model = make_model(torch)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    g, y, rec = capture(torch, model, x)
    manifest = graphcheck.load(rec.manifest())
    layer = model.layers[0]
    # A reload with new weights: copied in place into the parameter (as vLLM's layerwise
    # reload does), then the derived W_UV rebuilt as a new tensor, as post-load processing
    # does; the old one is released.
    with torch.no_grad():
        layer.proj.weight.copy_(torch.randn_like(layer.proj.weight) * 0.05)
        layer.W_UV = (layer.proj.weight.detach().t() * 0.5).contiguous()
    torch.cuda.synchronize()
    # Snapshot before anything else allocates: the old W_UV's block is free now, where the
    # replay's and eager's temporaries could take it (then it is active, under no owner,
    # and only `drifted` says what happened: which depends on the allocator's history,
    # i.e. on the tests run before this one).
    live = gt.snapshot(model, manifest, event="reload_weights() (new weights)", contents="updated")
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        expected = forward(model, x)
    err = (y.float() - expected.float()).abs().max().item()
    print(f"replay after reload differs from eager by {err}")
    assert err > 1e-2, "the replay should read the stale W_UV"
    save("torch_decode_drift_manifest.json", manifest)
    save("torch_decode_drift_live.json", live)
    report = graphcheck.verify(manifest, live)
    print(report)
    got = kinds(report)
    assert ("drifted", f"{L0}.W_UV") in got
    assert ("unregistered", f"{L0}.W_UV") in got
    # The old W_UV went back to the caching allocator (nothing of graphcheck's holds it):
    # freed, or reused if the allocator handed it out again.
    assert ("freed", f"{L0}.W_UV") in got or ("reused", f"{L0}.W_UV") in got, got
    # The parameter was copied in place: no live finding names it.
    assert not [k for k in got if "proj.weight" in k[1]]
    assert report.recapture() == ["decode_bs8"]


def test_inplace_reload_of_the_same_weights_is_clean_live(cuda):
    torch = cuda
    model = make_model(torch)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    g, y, rec = capture(torch, model, x)
    rec.digests = "sum64"  # digested when the manifest is built, right after capture
    manifest = graphcheck.load(rec.manifest())
    layer = model.layers[0]
    with torch.no_grad():
        w = layer.proj.weight.detach().clone()
        layer.proj.weight.copy_(w)  # the same weights, in place
    live = gt.snapshot(model, manifest, event="reload_weights() (same weights)", contents="preserved", digests=True)
    report = graphcheck.verify(manifest, live)
    print(report)
    # Only the capture-time findings remain.
    assert {k for k, _ in kinds(report)} == {"unregistered"}


def test_instrument_records_an_unmodified_vllm_style_capture(cuda, tmp_path):
    # The engine's code is untouched: a plain CUDAGraph and `torch.cuda.graph(g, pool=...)`.
    torch = cuda
    model = make_model(torch)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)

    class Runner:  # the engine's holder of static inputs: runtime state, not weights
        pass

    runner = Runner()
    runner.x = x
    ins = gt.instrument(tmp_path, model=model, name="decode_bs8", runtime_state=["runner.*"])
    try:
        gt.register_model(runner, root="runner")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            forward(model, x)
        torch.cuda.current_stream().wait_stream(s)
        pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g, pool=pool):
            y = forward(model, x)
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            assert torch.allclose(y, forward(model, x), atol=1e-2), "the instrumented graph replays right"
    finally:
        gt.uninstrument(ins)
    files = sorted(tmp_path.glob("graphcheck-*.json"))
    assert len(files) == 1, files
    manifest = json.loads(files[0].read_text())
    save("torch_instrumented_manifest.json", manifest)
    report = graphcheck.verify(manifest)
    print(report)
    assert kinds(report) == [("unregistered", f"{L0}.W_UV"), ("unregistered", f"{L0}.embed_scale")]
    assert [g["name"] for g in manifest["graphs"]] == ["decode_bs8"]
