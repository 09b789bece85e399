"""Engine capture flows on the GPU (issue 13): torch.compile's CUDA-graph trees, an opaque
custom op reading a module-global tensor, a vLLM-style piecewise capture, and the check
before a replay after a transition. Opt-in: GRAPHCHECK_GPU_TESTS=1."""

import inspect

import pytest

import graphcheck
import graphcheck.sleep as gs
import graphcheck.torch as gt
from conftest import save_gpu_document as save, warm_up

LIVE = {"vanished", "drifted", "freed", "reused", "reshaped", "stale"}


def live_kinds(report):
    return sorted({(f.kind, f.subject) for f in report.findings if f.kind in LIVE})


def compile_and_warm(torch, model, x, times=4):
    """``model`` under torch.compile's CUDA-graph trees (``mode="reduce-overhead"``), run
    ``times`` times on ``x`` without grad (the trees capture on a later call than the
    first), then synchronized. Returns the compiled module and its last output. The
    zero-code child script (:data:`ZERO_CODE`) runs this function's own source."""
    cm = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(times):
            y = cm(x)
    torch.cuda.synchronize()
    return cm, y


def mlp(torch):
    nn = torch.nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(256, 512, device="cuda")
            self.fc2 = nn.Linear(512, 256, device="cuda")

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    return MLP()


@pytest.fixture
def compiled(cuda):
    torch = cuda
    torch._dynamo.reset()
    yield torch
    gt.uninstrument()
    torch._dynamo.reset()


def test_compile_trees_are_recorded_named_and_a_rebind_torch_rerecords_is_superseded(compiled):
    torch = compiled
    m = mlp(torch)
    ins = gt.instrument(None, model=m, verify_on_replay="raise")
    x = torch.randn(8, 256, device="cuda")
    cm, y = compile_and_warm(torch, m, x)
    with torch.no_grad():
        assert (y - m(x)).abs().max().item() < 1e-3
    assert ins.errors == []
    man = graphcheck.load(ins.manifest())
    names = [g["name"] for g in man["graphs"]]
    print("graphs:", names)
    # The trees' first capture is empty (it creates their pool); the forward graph is named
    # by its tree and the batch it was recorded for.
    tree = [g for g in man["graphs"] if g["name"].startswith("inductor_fn")]
    assert len(tree) == 1 and tree[0]["name"].endswith("[8x256]"), names
    touched = {t["addr"] for n in tree[0]["nodes"] for t in n.get("touches", [])}
    owned = {o["path"] for o in man["owners"]}
    assert {"model.fc1.weight", "model.fc2.weight"} <= owned
    assert touched, "the tree graph's kernels read the parameters"
    report = gt.check()
    assert live_kinds(report) == [], report.table
    first = ins.manifest_json()  # as a run writes it at capture

    # A reload that rebinds a parameter: the tree re-records (torch guards the address of
    # its static inputs), so the old graph never replays again and is not reported.
    with torch.no_grad():
        m.fc1.weight = torch.nn.Parameter(m.fc1.weight.detach() * 2)
    gt.mark_transition("reload_weights() (rebinding)", "updated")
    # The documents alone (the CLI, CI): the manifest written at capture and a snapshot
    # after the reload, before the next call. The manifest says what the tree guards, so
    # the graph torch will re-record for is superseded, not drifted.
    live = gt.snapshot(m, first, event="reload_weights() (rebinding)", contents="updated")
    save("engine_tree_superseded_manifest.json", graphcheck.load(first))
    save("engine_tree_superseded_live.json", graphcheck.load(live))
    cli = graphcheck.verify(first, live)
    print(cli.table)
    assert cli.superseded == (tree[0]["name"],) and live_kinds(cli) == [], cli.table
    unguarded = graphcheck.load(first)
    for g in unguarded["graphs"]:
        g.pop("guards", None)
    plain = live_kinds(graphcheck.verify(unguarded, live))
    assert any(k == "drifted" for k, _ in plain), f"without guards: drifted, not {plain}"
    with torch.no_grad():
        for _ in range(3):
            y = cm(x)  # no ReplayCheckError: the new graph reads the new weight
        torch.cuda.synchronize()
        assert (y - m(x)).abs().max().item() < 1e-3
    names = [g["name"] for g in graphcheck.load(ins.manifest())["graphs"]]
    print("graphs after the rebind:", names)
    assert sum(n.startswith("inductor_fn") for n in names) == 2, names
    report = gt.check(contents="updated")
    print(report.table)
    print("superseded:", ins.superseded)
    assert len(ins.superseded) == 1 and ins.superseded[0] == tree[0]["name"]
    assert live_kinds(report) == [], report.table


def test_a_global_read_by_an_opaque_custom_op_rebound_after_capture_is_caught(compiled):
    torch = compiled
    cache = {"t": torch.ones(256, device="cuda")}

    @torch.library.custom_op("graphcheck_test::add_cache", mutates_args=())
    def add_cache(x: torch.Tensor) -> torch.Tensor:
        return x + cache["t"]

    @add_cache.register_fake
    def _(x):
        return torch.empty_like(x)

    class WithOp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(256, 256, device="cuda")

        def forward(self, x):
            return add_cache(self.fc(x))

    m = WithOp()
    ins = gt.instrument(None, model=m, verify_on_replay="raise")
    x = torch.randn(8, 256, device="cuda")
    cm, _ = compile_and_warm(torch, m, x)
    captured = cache["t"].data_ptr()
    assert gt.check().of_kind("unowned"), "Dynamo never saw the global: no owner explains it"
    # The global is rebound: the old tensor is freed, the graph keeps its address.
    cache["t"] = torch.full((256,), 5.0, device="cuda")
    assert cache["t"].data_ptr() != captured
    with torch.no_grad():
        y = cm(x).clone()
        wrong = (y - (m.fc(x) + cache["t"])).abs().max().item()
    print("replay after the rebind differs from eager by", wrong)
    assert wrong > 1.0, "the replay reads the freed global"
    report = gt.check(event="global rebound")
    print(report.table)
    # Named by its allocation's base (the manifest's allocation is the driver's range),
    # saying which address is free now, and which graph reads it.
    freed = report.of_kind("freed")
    assert len(freed) == 1 and hex(captured) in freed[0].detail, report.table
    assert all(g.startswith("inductor_fn") for g in freed[0].graphs), report.table
    gt.mark_transition("global rebound")
    with pytest.raises(gt.ReplayCheckError, match="freed"):
        with torch.no_grad():
            cm(x)


def test_verify_on_replay_refuses_a_rebound_weight_and_passes_an_in_place_reload(cuda):
    torch = cuda
    m = mlp(torch)
    x = torch.randn(8, 256, device="cuda")
    ins = gt.instrument(None, model=m, name="decode_bs8", verify_on_replay="raise")
    try:
        warm_up(torch, lambda: m(x))
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            y = m(x)
        g.replay()
        # An in-place reload (copy_ into the same storage) through load_state_dict: the
        # transition is seen, the check passes, the replay runs and is right.
        new = {k: v * 0.5 for k, v in m.state_dict().items()}
        m.load_state_dict(new)
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            assert (y - m(x)).abs().max().item() < 1e-3
        # A reload that rebinds: the replay is refused before the kernels run.
        with torch.no_grad():
            m.fc2.weight = torch.nn.Parameter(m.fc2.weight.detach().clone())
        gt.mark_transition("reload_weights() (rebinding)", "updated")
        with pytest.raises(gt.ReplayCheckError) as e:
            g.replay()
        print(e.value)
        assert e.value.graph == "decode_bs8"
        assert "model.fc2.weight" in str(e.value)
        assert ins.errors == []
    finally:
        gt.uninstrument(ins)


@pytest.fixture
def sleeper(cuda):
    alloc = gs.allocator()
    assert alloc.level is None
    yield alloc
    if alloc.level is not None:
        alloc.wake()
    import gc

    gc.collect()
    for tag in list(alloc._pools):
        alloc.release_pool(tag)


def test_a_wake_that_lost_a_constant_is_refused_at_the_next_replay(sleeper):
    import torch

    with gs.sleep_pool("weights"):
        m = mlp(torch)
    with gs.sleep_pool("kv_cache"):
        m.scale = torch.tensor(16.0, device="cuda")  # Gemma3n's embed_scale, in a discarded pool
    x = torch.randn(8, 256, device="cuda")

    def f():
        return m(x) * m.scale

    ins = gt.instrument(None, model=m, name="decode_bs8", digests=True, verify_on_replay="raise")
    try:
        warm_up(torch, f)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            f()
        g.replay()
        sleeper.sleep(1)  # weights offloaded; kv_cache discarded
        sleeper.wake()  # a transition graphcheck sees by itself
        with pytest.raises(gt.ReplayCheckError) as e:
            g.replay()
        print(e.value)
        assert any(f.kind == "stale" and f.owners[0].path == "model.scale" for f in e.value.findings)
        assert not any(o.path.startswith("model.fc") for f in e.value.findings for o in f.owners)
    finally:
        gt.uninstrument(ins)


def test_piecewise_eager_intermediate_that_moves_is_freed_naming_the_piece(cuda):
    # vLLM's piecewise graphs: pieces share one pool, eager code runs between them, and
    # each piece reads static buffers. Here piece 1 reads an eager intermediate that the
    # next step computes into a new tensor elsewhere (vllm #53915's silent-garbage class).
    torch = cuda
    m = mlp(torch)
    x = torch.randn(8, 256, device="cuda")
    ins = gt.instrument(None, model=m, name=lambda i: f"piece{i}")
    try:
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad():
            warm_up(torch, lambda: m.fc2(torch.relu(m.fc1(x))))
            g0 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g0, pool=pool):
                h = m.fc1(x)
            mid = torch.relu(h) * 1.0  # eager, between the pieces
            g1 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g1, pool=pool):
                y = m.fc2(mid)
            torch.cuda.synchronize()
            report = gt.check(event="capture")
            # The batch input and the intermediate share an allocation: piece 0 reads the
            # one, piece 1 the other.
            assert ["piece1" in f.graphs for f in report.of_kind("unowned")] == [True], report.table
            assert live_kinds(report) == [], report.table
            # The next step: a new intermediate, the old one freed.
            x.copy_(torch.randn(8, 256, device="cuda"))
            g0.replay()
            mid2 = torch.relu(h) * 1.0
            captured = mid.data_ptr()
            del mid
            g1.replay()
            torch.cuda.synchronize()
            report = gt.check(event="next step")
            wrong = (y - m.fc2(mid2)).abs().max().item()
        print("piece1 after the intermediate moved differs from eager by", wrong)
        print(report.table)
        assert wrong > 1e-2
        freed = report.of_kind("freed")
        assert [f.graphs for f in freed] == [("piece1",)], report.table
        assert hex(captured) in freed[0].detail, report.table
    finally:
        gt.uninstrument(ins)


ZERO_CODE = r"""
import json, site, sys
site.addsitedir(sys.argv[1])  # processes graphcheck-instrument.pth, as an installed wheel's site dir does
import torch

COMPILE_AND_WARM

class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(256, 512)
        self.fc2 = torch.nn.Linear(512, 256)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

m = TinyLM().cuda()
x = torch.randn(8, 256, device="cuda")
cm, _ = compile_and_warm(torch, m, x)
import graphcheck.torch as gt
ins = gt.instrumented()
print(json.dumps({"instrumented": len(ins), "discovered": ins[0].discovered if ins else None,
                  "errors": [str(e) for e in ins[0].errors] if ins else None}))
""".replace("COMPILE_AND_WARM", inspect.getsource(compile_and_warm))


def test_zero_code_attach_finds_the_model_under_torch_compile(cuda, tmp_path):
    # Only GRAPHCHECK_DIR: no register_model, no import of graphcheck before torch.
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    site_dir = str(Path(graphcheck.__file__).resolve().parent.parent)
    assert (Path(site_dir) / "graphcheck-instrument.pth").exists(), site_dir
    env = dict(os.environ, GRAPHCHECK_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", ZERO_CODE, site_dir], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    print(facts)
    assert facts["instrumented"] == 1 and facts["discovered"] == ["tiny_lm"], facts
    assert facts["errors"] == []
    (path,) = tmp_path.glob("graphcheck-0-*.json")
    manifest = graphcheck.load(path)  # written in format 2; read expanded
    names = [g["name"] for g in manifest["graphs"]]
    print(names)
    assert any(n.startswith("inductor_fn") and n.endswith("[8x256]") for n in names), names
    paths = {o["path"] for o in manifest["owners"]}
    assert {"tiny_lm.fc1.weight", "tiny_lm.fc2.weight"} <= paths, paths
    report = graphcheck.verify(manifest)
    print(report.table)
    assert not report.of_kind("unowned") and not report.of_kind("unregistered"), report.table
