"""The sleep allocator on a real GPU (issue 5): level-1 and level-2 round trips through
torch's CUDAPluggableAllocator, Gemma3n-style constants found stale, persistent metadata
under the KV-cache tag found mispooled, bad use raising SleepError, and no leak.
Opt-in (GRAPHCHECK_GPU_TESTS=1); with GRAPHCHECK_GPU_OUT=DIR the manifests and live
snapshots are written there for fixtures/gpu/.

The allocator is one per process, so every test leaves it awake with no pool of its own
(the ``sleeper`` fixture checks).
"""

import gc
import warnings

import pytest

import graphcheck
import graphcheck.sleep as gs
import graphcheck.torch as gt
from conftest import CUBLAS_WORKSPACE, save_gpu_document as save, warm_up

D = 1024
GRANULE = 2 << 20


@pytest.fixture
def sleeper(cuda):
    alloc = gs.allocator()
    assert alloc.level is None
    yield alloc
    if alloc.level is not None:  # a failed test: leave the allocator usable for the next
        alloc.wake()
    gc.collect()
    for tag in list(alloc._pools):
        alloc.release_pool(tag)


def make_model(torch, *, constants_as_buffers, layers=4):
    """A Gemma3n-like model: linear layers, an ``embed_scale`` constant and a per-layer
    scalar, kept as plain attributes (the upstream bug) or registered buffers (the fix)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.proj = nn.Linear(D, D, device="cuda")
            scalar = torch.tensor(0.5 + 0.25 * i, device="cuda")
            if constants_as_buffers:
                self.register_buffer("layer_scalar", scalar)
            else:
                self.layer_scalar = scalar

        def forward(self, h):
            return torch.relu(self.proj(h)) * self.layer_scalar

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(i) for i in range(layers)])
            scale = torch.tensor(D**0.5, device="cuda")
            if constants_as_buffers:
                self.register_buffer("embed_scale", scale)
            else:
                self.embed_scale = scale

        def forward(self, x):
            h = x * self.embed_scale
            for layer in self.layers:
                h = layer(h)
            return h

    return Model()


def capture(torch, model, x, alloc, *, digests=True, declare=True):
    """Warms up, captures ``model(x)`` into a graph recorded with the allocator's pools
    (declared here, or, ``declare=False``, by the recorder when it builds)."""
    warm_up(torch, lambda: model(x))
    rec = gt.Recorder(model, digests=digests)
    if declare:
        alloc.declare_pools(rec)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, recorder=rec, name="decode_bs8", inputs={"x": x}):
        y = model(x)
    torch.cuda.synchronize()
    return g, y, graphcheck.load(rec.manifest())


def kinds(report):
    return sorted((f.kind, f.subject) for f in report.findings if f.kind != "unused_allow")


def replay(torch, g, y):
    g.replay()
    torch.cuda.synchronize()
    return y.clone()


def cpu_state(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def test_level1_round_trip_is_bit_exact_and_returns_memory(sleeper, torch):
    alloc = sleeper
    with gs.sleep_pool("weights"):
        model = make_model(torch, constants_as_buffers=False)
    with gs.sleep_pool("kv_cache"):
        kv = torch.randn(8 << 20, device="cuda")  # 32 MiB
    x = torch.randn(8, D, device="cuda")
    g, y, _ = capture(torch, model, x, alloc, digests=False)
    before = replay(torch, g, y)
    weights = cpu_state(model)
    consts = [model.embed_scale.cpu()] + [l.layer_scalar.cpu() for l in model.layers]
    tags = {a.tag for a in alloc.allocations()}
    assert {"weights", "kv_cache"} <= tags

    mapped = alloc.stats()["bytes_mapped"]
    free0, _ = alloc.mem_info()
    r = alloc.sleep(1)
    free1, _ = alloc.mem_info()
    print(f"level 1: {r}; cuMemGetInfo free {free0} -> {free1} (+{free1 - free0}), mapped was {mapped}")
    assert r["offloaded_bytes"] > 0 and r["discarded_bytes"] >= 32 << 20
    assert r["offloaded_bytes"] + r["discarded_bytes"] == mapped
    assert abs((free1 - free0) - mapped) <= GRANULE, "sleep gives the physical memory back"
    assert alloc.level == 1
    assert all(a.state in ("offloaded", "discarded") for a in alloc.allocations())

    w = alloc.wake()
    free2, _ = alloc.mem_info()
    print(f"wake: {w}; free {free1} -> {free2}")
    assert w["awake"] and alloc.level is None
    assert abs(free2 - free0) <= GRANULE
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), weights[k]), k
    for got, want in zip([model.embed_scale] + [l.layer_scalar for l in model.layers], consts):
        assert torch.equal(got.cpu(), want)
    after = replay(torch, g, y)
    assert torch.equal(after, before), "the replayed graph is bit-exact after a level-1 round trip"
    assert bool((kv.view(torch.int32) == -1).all()), "the discarded kv cache reads the NaN poison"
    assert torch.isnan(kv).all()
    del g, y, model, kv


def gemma_level2(torch, alloc, *, constants_as_buffers):
    """Level 2 plus an in-place reload of the parameters (and buffers)."""
    with gs.sleep_pool("weights"):
        model = make_model(torch, constants_as_buffers=constants_as_buffers)
    x = torch.randn(8, D, device="cuda")
    g, y, manifest = capture(torch, model, x, alloc)
    before = replay(torch, g, y)
    state = cpu_state(model)
    scale_ptr = model.embed_scale.data_ptr()

    alloc.sleep(2)
    alloc.wake(poison="nan")
    with torch.no_grad():
        model.load_state_dict(state)  # in place: copy_ into the same storages
    torch.cuda.synchronize()
    after = replay(torch, g, y)
    err = (after - before).abs().max().item()
    live = gt.snapshot(
        model, manifest, event="sleep_level2_reload", contents="preserved", digests=True,
        pools=alloc.pool_names(),
    )
    assert model.embed_scale.data_ptr() == scale_ptr, "same virtual address after wake"
    return model, manifest, live, err, (g, y)


def test_gemma3n_constants_come_back_poisoned_and_are_stale(sleeper, torch):
    model, manifest, live, err, keep = gemma_level2(torch, sleeper, constants_as_buffers=False)
    save("sleep_gemma3n_manifest.json", manifest)
    save("sleep_gemma3n_live.json", live)
    print(f"gemma3n level 2: replay max error {err}; embed_scale = {model.embed_scale.item()}")
    assert err != err or err > 1e-3, "the replay is wrong: the constants read the poison"
    assert torch.isnan(model.embed_scale).item()
    consts = ["model.embed_scale"] + [f"model.layers[{i}].layer_scalar" for i in range(4)]
    capture_report = graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE)
    print(capture_report)
    assert kinds(capture_report) == sorted(("unregistered", c) for c in consts)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(report.table)
    assert kinds(report) == sorted([("stale", c) for c in consts] + [("unregistered", c) for c in consts])
    pools = {p["name"]: p for p in manifest["pools"]}
    assert pools["weights"]["sleep"] == "restored"
    weights = pools["weights"]["id"]
    ptr = model.embed_scale.data_ptr()
    scale = next(t for t in manifest["tensors"] if int(t["storage_base"], 16) + t["offset"] == ptr)
    assert scale.get("pool") == weights, "the manifest records the tag of each tensor"
    del keep, model


def test_constants_registered_as_buffers_verify_clean(sleeper, torch):
    model, manifest, live, err, keep = gemma_level2(torch, sleeper, constants_as_buffers=True)
    save("sleep_clean_manifest.json", manifest)
    save("sleep_clean_live.json", live)
    print(f"clean model level 2: replay max error {err}")
    assert err == 0.0
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(report)
    assert kinds(report) == []
    del keep, model


#: A module-global cos/sin cache (issue 14): no owner reaches it, a kernel reads it.
_ROPE: dict = {}


def test_a_module_global_cache_lost_by_level2_sleep_is_stale(sleeper, torch):
    """The issue's case: a cos/sin cache no owner reaches, in a pool level-2 sleep discards,
    reads NaN after wake and so does the replay; with digests on, graphcheck digests the
    allocator block the graph reads there (the manifest's `ranges`) and reports it `stale`,
    beside its capture-time `unowned`. A snapshot before the sleep is clean."""
    alloc = sleeper
    with gs.sleep_pool("weights"):
        model = make_model(torch, constants_as_buffers=True, layers=2)
        _ROPE["cos"] = torch.linspace(0.5, 1.5, D, device="cuda")
    forward = model.forward

    def with_rope(x):
        return forward(x) * _ROPE["cos"]

    model.forward = with_rope
    x = torch.randn(8, D, device="cuda")
    g, y, manifest = capture(torch, model, x, alloc)
    cos = _ROPE["cos"].data_ptr()
    held = [r for r in manifest.get("ranges", []) if int(r["addr"], 16) <= cos < int(r["addr"], 16) + r["size"]]
    print("ranges:", manifest.get("ranges"))
    assert len(held) == 1 and held[0]["digest"].startswith("gc128:"), manifest.get("ranges")
    subject = next(f.subject for f in graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE).findings if f.kind == "unowned")
    before = replay(torch, g, y)
    state = cpu_state(model)

    # Replays change nothing the cache holds: a snapshot now is clean.
    live = gt.snapshot(model, manifest, event="replays", digests=True, pools=alloc.pool_names())
    assert graphcheck.load(live)["ranges"] == held
    assert kinds(graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)) == [("unowned", subject)]

    alloc.sleep(2)
    # Asleep, the block is unmapped: the digester asks the driver first and reads nothing.
    asleep = gt.snapshot(model, manifest, event="asleep", digests=False)
    assert "ranges" not in graphcheck.load(asleep)
    from graphcheck import _digest, _native
    assert _digest.range_digests([(int(held[0]["addr"], 16), held[0]["size"])]) == [None]
    alloc.wake(poison="nan")
    with torch.no_grad():
        model.load_state_dict(state)  # the reload restores what the model owns, not the cache
    torch.cuda.synchronize()
    after = replay(torch, g, y)
    print(f"module-global cache after level 2: cos NaN {torch.isnan(_ROPE['cos']).all().item()}, replay NaN {torch.isnan(after).all().item()}")
    assert torch.isnan(after).all(), "the replay reads the lost cache"
    live = gt.snapshot(
        model, manifest, event="sleep(level=2) + wake + reload", digests=True,
        pools=alloc.pool_names(),
    )
    save("sleep_global_cache_manifest.json", manifest)
    save("sleep_global_cache_live.json", live)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(report.table)
    assert kinds(report) == [("stale", subject), ("unowned", subject)]
    stale = next(f for f in report.findings if f.kind == "stale")
    assert held[0]["digest"] in stale.detail and stale.graphs == ("decode_bs8",)
    del g, y
    del model.forward
    _ROPE.clear()


def test_a_compiled_models_constant_lost_by_level2_sleep_stops_the_replay(sleeper, torch):
    """Issue 13, torch.compile beside sleep: a constant kept as a non-persistent buffer
    (not in the state dict, so a reload does not restore it) of a model under the CUDA-graph
    trees, in memory level-2 sleep discards. After wake and the reload its address is the
    same, so the tree replays its graph; graphcheck's replay check (digests on) finds it
    stale and refuses the replay, with no engine call: the reload's load_state_dict marks
    the transition and what it wrote (the new weights are no finding); let through, the
    replay is NaN."""
    alloc = sleeper
    torch._dynamo.reset()
    nn = torch.nn

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(D, D, device="cuda")
            self.register_buffer("scale", torch.tensor(D**0.5, device="cuda"), persistent=False)

        def forward(self, x):
            return self.proj(x) * self.scale

    with gs.sleep_pool("weights"):
        model = Scaled()
    x = torch.randn(8, D, device="cuda")
    ins = gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    try:
        cm = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(4):
                y = cm(x)
        torch.cuda.synchronize()
        before = y.clone()
        assert ins.errors == [], ins.errors
        names = [g["name"] for g in graphcheck.load(ins.manifest())["graphs"]]
        print("graphs:", names)
        assert any(n.startswith("inductor_fn") for n in names), names
        state = cpu_state(model)
        assert "scale" not in state

        alloc.sleep(2)
        alloc.wake(poison="nan")
        # New weights (a refit): load_state_dict marks the transition itself, `updated`,
        # and says which tensors it wrote; the rest must still hold their contents.
        refit = {k: v + 0.5 for k, v in state.items()}
        with torch.no_grad():
            model.load_state_dict(refit)
        torch.cuda.synchronize()
        assert torch.isnan(model.scale).item()
        report = gt.check(ins)
        print(report.table)
        stale = sorted(o.path for f in report.of_kind("stale") for o in f.owners)
        assert stale == ["model.scale"], report.table  # the refit weights are no finding
        with pytest.raises(gt.ReplayCheckError) as refused, torch.no_grad():
            cm(x)
        print(refused.value)
        assert "stale" in str(refused.value) and "model.scale" in str(refused.value)
    finally:
        gt.uninstrument()
    with torch.no_grad():
        after = cm(x)
    torch.cuda.synchronize()
    print(f"compiled, level 2: before finite {torch.isfinite(before).all().item()}, after NaN {torch.isnan(after).all().item()}")
    assert torch.isnan(after).all(), "let through, the replay reads the lost constant"
    del cm, model
    torch._dynamo.reset()


def test_persistent_metadata_under_the_kv_cache_tag_is_mispooled(sleeper, torch):
    alloc = sleeper
    with gs.sleep_pool("weights"):
        model = make_model(torch, constants_as_buffers=True, layers=1)
    with gs.sleep_pool("kv_cache"):
        # Built while the KV-cache pool was active, as vLLM's bug had it.
        model.register_buffer("rope_cache", torch.linspace(0.5, 1.5, D, device="cuda"))
    forward = model.forward

    def with_rope(x):
        return forward(x) * model.rope_cache

    model.forward = with_rope
    x = torch.randn(8, D, device="cuda")
    g, y, manifest = capture(torch, model, x, alloc, declare=False)  # the recorder declares
    save("sleep_mispooled_manifest.json", manifest)
    before = replay(torch, g, y)
    report = graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE)
    print(report.table)
    assert kinds(report) == [("mispooled", "model.rope_cache")]
    assert "kv_cache" in report.table

    alloc.sleep(1)
    alloc.wake()
    after = replay(torch, g, y)
    err = (after - before).abs().max().item()
    print(f"mispooled: replay max error after level 1 {err}")
    assert err != err or err > 1e-3, "the KV-cache tag was discarded and the buffer with it"
    live = gt.snapshot(model, manifest, event="sleep_level1", digests=True)  # pools: automatic
    save("sleep_mispooled_live.json", live)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    assert kinds(report) == [("mispooled", "model.rope_cache"), ("stale", "model.rope_cache")]
    del g, y
    del model.forward  # the closure holds the model: break the cycle


def test_bad_use_raises_and_leaves_the_state_consistent(sleeper, torch):
    alloc = sleeper
    with gs.sleep_pool("weights"):
        w = torch.full((16 << 20,), 3.0, device="cuda")  # 64 MiB
    with pytest.raises(gs.SleepError, match="not asleep"):
        alloc.wake()
    with pytest.raises(gs.SleepError, match="unknown tag"):
        alloc.sleep(1, offload_tags=["wieghts"])
    with pytest.raises(gs.SleepError, match="level is 1 or 2"):
        alloc.sleep(3)
    assert alloc.level is None
    alloc.sleep(1)
    with pytest.raises(gs.SleepError, match="already asleep"):
        alloc.sleep(1)
    with pytest.raises(gs.SleepError, match="unknown tag"):
        alloc.wake(tags=["kv"])
    with pytest.raises(gs.SleepError, match="wake before releasing"):
        alloc.release_pool("weights")
    # Allocating under a tag while asleep is refused: torch would hand out cached blocks
    # of the pool's unmapped segments.
    with pytest.raises(gs.SleepError, match="wake before allocating"):
        with gs.sleep_pool("weights"):
            pass
    # Freeing a tensor while asleep is fine: torch keeps the block in the tag's pool.
    spare = torch.empty(1 << 20, device="cuda")
    del spare
    torch.cuda.empty_cache()
    assert alloc.level == 1

    # Out of device memory on wake: someone took the memory while the allocator slept.
    free, _ = alloc.mem_info()
    filler = torch.empty(free - (32 << 20), dtype=torch.uint8, device="cuda")
    with pytest.raises(gs.SleepOutOfMemoryError, match="still asleep"):
        alloc.wake()
    assert alloc.level == 1
    held = [a for a in alloc.allocations() if a.base <= w.data_ptr() < a.base + a.size]
    assert [a.state for a in held] == ["offloaded"], "nothing was mapped by the failed wake"
    del filler
    torch.cuda.empty_cache()
    assert alloc.wake()["awake"]
    assert bool((w == 3.0).all()), "the host copy survived the failed wake"
    del w



def test_tags_are_per_thread_under_concurrent_allocation(sleeper, torch):
    import threading

    alloc = sleeper
    out = {}
    barrier = threading.Barrier(2)

    def work(tag):
        with gs.sleep_pool(tag):
            barrier.wait()  # both threads allocate at once, each under its own tag
            out[tag] = [torch.empty(3 << 20, device="cuda") for _ in range(8)]  # 12 MiB each

    threads = [threading.Thread(target=work, args=(t,)) for t in ("thread_a", "thread_b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    allocs = alloc.allocations()
    for tag, tensors in out.items():
        for t in tensors:
            holders = [a.tag for a in allocs if a.base <= t.data_ptr() < a.base + a.size]
            assert holders == [tag]
    out.clear()


def test_teardown_returns_every_byte(sleeper, torch):
    alloc = sleeper
    gc.collect()
    torch.cuda.empty_cache()
    alloc.release_host_cache()
    start = alloc.stats()
    free0, _ = alloc.mem_info()
    with gs.sleep_pool("weights"):
        ws = [torch.randn(16 << 20, device="cuda") for _ in range(4)]
    with gs.sleep_pool("kv_cache"):
        kv = torch.zeros(32 << 20, device="cuda")
    for level in (1, 2, 1):
        alloc.sleep(level)
        alloc.wake()
    del ws, kv
    gc.collect()
    for tag in ("weights", "kv_cache"):
        alloc.release_pool(tag)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert alloc.release_host_cache() > 0
    end = alloc.stats()
    free1, _ = alloc.mem_info()
    print(f"teardown: start {start}\nend {end}\nfree {free0} -> {free1}")
    assert end["allocations"] == start["allocations"] == 0
    assert end["bytes_reserved"] == 0 and end["bytes_mapped"] == 0
    assert end["host_bytes_held"] == 0 and end["host_bytes_cached"] == 0
    assert end["mallocs"] - start["mallocs"] == end["frees"] - start["frees"] > 0
    assert abs(free1 - free0) <= GRANULE
