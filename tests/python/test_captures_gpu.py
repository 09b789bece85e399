"""Capture identity on a real GPU (issue 28): what happens between two captures, with
torch's own caching allocator. A buffer one graph read is freed after its capture and the
next allocation of its size, which a later graph reads, lands in its block; a parameter is
rebound between two captures. Each graph's words name the tensors alive at its own
capture, and the replay shows the hazard verify names. Opt-in (GRAPHCHECK_GPU_TESTS=1);
with GRAPHCHECK_GPU_OUT=DIR the manifests and live snapshots are written there for
fixtures/gpu/.
"""

import graphcheck
import graphcheck.torch as gt
from conftest import CUBLAS_WORKSPACE, save_gpu_document as save, warm_up

D = 256


def kinds(report):
    return sorted((f.kind, f.subject, f.graphs) for f in report.findings if f.kind != "unused_allow")


def capture_two(torch, model, forward, between):
    """Captures ``decode_bs8`` then ``decode_bs1`` into one pool with one recorder,
    running ``between()`` after the first capture; returns the graphs, their outputs and
    inputs, and the manifest."""
    xs = {b: torch.randn(b, D, device="cuda") for b in (8, 1)}
    rec = gt.Recorder(model)
    pool = torch.cuda.graph_pool_handle()
    graphs, outs = {}, {}
    for b in (8, 1):
        warm_up(torch, lambda: forward(b, xs[b]))
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), gt.graph(g, recorder=rec, name=f"decode_bs{b}", pool=pool, inputs={"x": xs[b]}):
            outs[b] = forward(b, xs[b])
        graphs[b] = g
        if b == 8:
            between()
    return graphs, outs, xs, graphcheck.load(rec.manifest())


def replay_errors(torch, graphs, outs, xs, forward):
    errs = {}
    for b, g in graphs.items():
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            errs[b] = (outs[b] - forward(b, xs[b])).abs().max().item()
    return errs


def test_a_buffer_freed_between_two_captures_is_reused_for_the_first_graph_alone(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(D, D, bias=False, device="cuda")
    # The decode plan of batch size 8, made at its first forward and kept as a buffer.
    model.register_buffer("plan_bs8", torch.full((D,), 2.0, device="cuda"), persistent=False)

    def forward(b, x):
        return model.proj(x) * getattr(model, f"plan_bs{b}")

    where = {}

    def between():
        # The runner releases bs8's capture-time state; bs1's plan is made next, of its
        # size: the caching allocator hands it the freed block.
        where["bs8"] = model.plan_bs8.data_ptr()
        del model.plan_bs8
        torch.cuda.synchronize()
        model.register_buffer("plan_bs1", torch.full((D,), 5.0, device="cuda"), persistent=False)
        where["bs1"] = model.plan_bs1.data_ptr()

    graphs, outs, xs, manifest = capture_two(torch, model, forward, between)
    assert where["bs1"] == where["bs8"], "the caching allocator reused the freed block"
    plans = [t for t in manifest["tensors"] if t["storage_base"] == hex(where["bs8"])]
    assert len(plans) == 2 and len({t["storage"] for t in plans}) == 2, plans
    # bs8's replay reads bs1's plan (5.0) where it captured its own (2.0): wrong by 3x.
    errs = {}
    for b in (8, 1):
        graphs[b].replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            eager = model.proj(xs[b]) * (2.0 if b == 8 else model.plan_bs1)
        errs[b] = (outs[b] - eager).abs().max().item()
    live = gt.snapshot(model, manifest, event="after the captures (nothing moved)", contents="preserved")
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(f"\nreuse between captures: replay errors {errs}\n{report}")
    save("captures_reuse_manifest.json", manifest)
    save("captures_reuse_live.json", live)
    assert errs[1] == 0.0 and errs[8] > 1e-3, errs
    got = kinds(report)
    assert got == [
        ("reused", "model.plan_bs8", ("decode_bs8",)),
        ("vanished", "model.plan_bs8", ("decode_bs8",)),
    ], got
    (reused,) = [f for f in report.findings if f.kind == "reused"]
    assert reused.new_owners == ("model.plan_bs1",)
    assert report.recapture() == ["decode_bs8"]


def test_a_parameter_rebound_between_two_captures_drifts_for_the_first_graph_alone(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(D, D, bias=False, device="cuda")
    model.scale = torch.nn.Parameter(torch.full((D,), 2.0, device="cuda"))

    def forward(b, x):
        return model.proj(x) * model.scale

    old = {}

    def between():
        # A weight sync lands between the captures and replaces the parameter; the old
        # one stays alive here, so its memory is not handed out again.
        old["scale"] = model.scale
        model.scale = torch.nn.Parameter(torch.full((D,), 3.0, device="cuda"))

    graphs, outs, xs, manifest = capture_two(torch, model, forward, between)
    held = [o for o in manifest["owners"] if o["path"] == "model.scale"]
    assert len(held) == 2, held
    # The next weight update copies into what the path holds now.
    with torch.no_grad():
        model.scale.copy_(torch.full((D,), 4.0, device="cuda"))
    errs = replay_errors(torch, graphs, outs, xs, forward)
    live = gt.snapshot(model, manifest, event="weight update in place", contents="updated")
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(f"\nrebind between captures: replay errors {errs}\n{report}")
    save("captures_rebind_manifest.json", manifest)
    save("captures_rebind_live.json", live)
    assert errs[1] < 1e-3 and errs[8] > 1e-3, errs
    assert kinds(report) == [("drifted", "model.scale", ("decode_bs8",))], kinds(report)
    assert report.recapture() == ["decode_bs8"]
    del old
