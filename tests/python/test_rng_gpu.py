"""torch's RNG kernels in a captured graph (GPU): ``torch.randn``, ``torch.rand``,
``bernoulli_`` and dropout take an ``at::PhiloxCudaState`` by value, whose ``seed_`` and
``offset_`` words point, under capture, at the CUDA generator's graph-safe state (tensors
torch allocates and no Python object reaches). graphcheck sets those words aside as
``rng_state`` from the kernel's demangled signature: the capture verifies clean, with the
words still shown in the manifest, and the graph replays afterwards with fresh random
numbers each time.

Opt-in: runs only with GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA (CI has none). With
GRAPHCHECK_GPU_OUT=DIR the manifest is written there as ``rng_capture_manifest.json`` (for
fixtures/gpu/).
"""

import graphcheck
import graphcheck.torch as gt
from conftest import save_gpu_document as save, warm_up


def make_model(torch, d=256):
    """A parameter and a buffer read by elementwise kernels only (no GEMM: torch's cuBLAS
    workspace would be a finding of its own)."""
    model = torch.nn.Module()
    model.scale = torch.nn.Parameter(torch.rand(d, device="cuda") + 0.5)
    model.register_buffer("shift", torch.randn(d, device="cuda"))
    return model


def step(torch, model, x):
    """Dropout, randn, rand and bernoulli_ in one step: four RNG kernels."""
    h = torch.nn.functional.dropout(x * model.scale, p=0.25, training=True)
    noise = torch.randn(x.shape, device="cuda")
    u = torch.rand(x.shape, device="cuda")
    mask = torch.empty(x.shape, device="cuda").bernoulli_(0.5)
    return h + noise * u * mask + model.shift


def rng_words(manifest):
    """(graph, node index, node name, param, offset, addr) of every word set aside as RNG
    state."""
    return [
        (g["name"], n["index"], n["name"], w["param"], w["offset"], w["addr"])
        for g in manifest["graphs"]
        for n in g["nodes"]
        for w in n.get("ignored", [])
        if w["reason"] == "rng_state"
    ]


def test_rng_kernels_hold_the_generator_state_and_verify_clean(cuda):
    torch = cuda
    model = make_model(torch)
    x = torch.randn(64, 256, device="cuda")
    warm_up(torch, lambda: step(torch, model, x))
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, model=model, name="rng", inputs={"x": x}) as rec:
        y = step(torch, model, x)
    manifest = graphcheck.load(rec.manifest())
    save("rng_capture_manifest.json", manifest)
    report = graphcheck.verify(manifest)
    print(report)
    words = rng_words(manifest)
    for w in words:
        print(w)
    assert report.ok and report.findings == (), report
    # Every RNG kernel's seed_ and offset_ words, and nothing else, are RNG state.
    rng_nodes = {(index, name, param) for _, index, name, param, _, _ in words}
    assert len(rng_nodes) >= 4, rng_nodes
    assert {off for *_, off, _ in words} == {0, 8}
    assert len(words) == 2 * len(rng_nodes)
    assert all("PhiloxCudaState" in name for _, name, _ in rng_nodes)
    # All of them point at the one generator state: one seed_ address, one offset_ address.
    assert len({addr for *_, off, addr in words if off == 0}) == 1
    assert len({addr for *_, off, addr in words if off == 8}) == 1
    # The walk changed nothing: the graph replays, with new random numbers each time.
    g.replay()
    first = y.clone()
    g.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(first).all() and torch.isfinite(y).all()
    assert not torch.equal(first, y)
    # The words are recorded: show lists them.
    assert "ignored (torch's RNG state)" in graphcheck.normalized(manifest)


def test_a_second_rng_graph_costs_no_walk(cuda):
    # The RNG words are set aside by the signature before the recorder asks whether a
    # capture read anything new: they never make it walk the model again.
    torch = cuda
    model = make_model(torch)
    xs = {b: torch.randn(b, 256, device="cuda") for b in (8, 16)}
    for x in xs.values():
        warm_up(torch, lambda: step(torch, model, x))
    rec = gt.Recorder(model)
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for b, x in xs.items():
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), gt.graph(g, recorder=rec, name=f"bs{b}", pool=pool, inputs={"x": x}):
            step(torch, model, x)
        graphs.append(g)
    assert rec.walks == 1
    manifest = graphcheck.load(rec.manifest())
    assert graphcheck.verify(manifest).ok
    assert {gname for gname, *_ in rng_words(manifest)} == {"bs8", "bs16"}
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()
