"""PyTorch's own CUDA-graph input-liveness cases (`test/test_cuda_graph_debug_inputs.py`,
behind `torch.cuda.graph(..., check_input_liveness=True)`, torch 2.13+), restated as
graphcheck reload scenarios on torch 2.11, which lacks the checker (issue 10, item 3;
docs/liveness.md has the table, case by case).

PyTorch's checker keeps a weak reference to the storage of every tensor a captured op
reads from outside the capture pool and, at replay, raises for those whose storage died
or moved ("dead tensor"). graphcheck answers the same question from the other side: the
walker reads the addresses the captured nodes hold, the owner registry says which owner
path held the tensor at each one, and a live snapshot after the change says whether that
address is still an active allocation. So each test here does what the PyTorch case does,
with the tensors held by a module (a holder whose buffers stand for the case's locals: a
tensor no owner reaches is `unowned` at capture, and checked live only by its address,
with no owner path to name), and asserts:

- where PyTorch reports a dead tensor, graphcheck reports `freed` (or `reused`) on the
  owner path that held it, for the graph that reads it, and no live finding on any other
  owner (`vanished`, and `drifted` where the path now holds another tensor, may come with
  it);
- where PyTorch passes, graphcheck reports nothing at all.

The rules decided for issue 10 apply: identity follows the storage (a view dropped while
its base lives, one of two tensors sharing a storage dropped, a list shifted by `del`: no
`vanished`, no `reused`); a view into a registered buffer's storage is registered;
torch's RNG state is a known owner; `unused_allow` is a warning.

Every test replays the graph right after capture and recording (the walk changed
nothing). Where the case breaks the graph, the freed memory is handed to a new tensor of
known contents before the graph is replayed again, so the replay reads defined, mapped
memory and comes out wrong in a way the test predicts exactly: each doomed tensor is made
alone in a private `torch.cuda.MemPool`, whose only free block the next allocation of its
size takes. No test calls `torch.cuda.empty_cache()` (PyTorch's cases do, to make the
storage die): it could unmap memory a later replay reads.

Opt-in: GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA; GRAPHCHECK_GPU_OUT=DIR keeps the
manifests and live snapshots of a few cases (`liveness_*`) for fixtures/gpu/.
"""

import gc
import threading
import warnings

import pytest

import graphcheck
import graphcheck.torch as gt
from conftest import CUBLAS_WORKSPACE, save_gpu_document as save, warm_up

#: Findings that need a live snapshot; the others are capture-time checks.
LIVE_KINDS = frozenset({"vanished", "drifted", "freed", "reused", "reshaped", "stale"})


# -- helpers ------------------------------------------------------------------------------


def holder(torch, **tensors):
    """A module holding each tensor as a registered buffer, under the root `model`: the
    owner paths PyTorch's cases leave implicit (their tensors are locals)."""
    h = torch.nn.Module()
    for name, t in tensors.items():
        h.register_buffer(name, t)
    return h


def alone(torch, pool, src):
    """A copy of `src` made in `pool` (a fresh `MemPool` per doomed tensor, or per group
    allocated in order), so that the block it leaves when freed is the next one handed out
    there."""
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty_like(src)
    return t.copy_(src)


def pooled_params(torch, pool, module):
    """Moves every parameter of `module` (and its submodules, in registration order) into
    `pool`, one after another."""
    for mod in module.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(alone(torch, pool, p.detach()), requires_grad=p.requires_grad))


#: Refilled tensors stay alive until the test ends: a replay after the refill must read
#: them, and a second refill must not be handed the first one's block again.
_REFILLED: list = []


@pytest.fixture(autouse=True)
def _release_refilled():
    yield
    _REFILLED.clear()


def refill(torch, pool, addr, shape, value):
    """A new tensor of `shape` filled with `value`, allocated in `pool` where a freed tensor
    was: it must land at `addr` (the pool's lowest free block), so that a replay reads
    these contents. The tensor is kept alive until the test ends."""
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(shape, device="cuda")
    _REFILLED.append(t)
    t.fill_(value)
    assert t.data_ptr() == addr, (
        f"the freed block at {addr:#x} was the lowest free block of its private pool, but the "
        f"next allocation of its size landed at {t.data_ptr():#x}"
    )
    return t


def collect():
    """What PyTorch's `_sync_and_gc_collect` does, without `empty_cache()`: a later replay
    must never read memory handed back to the driver."""
    import torch

    torch.cuda.synchronize()
    gc.collect()


def replay(torch, *graphs):
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()


def capture(torch, model, op, *, name="g", root="model", recorder=None, warm=True, **graph_kwargs):
    """Warms `op` up on a side stream, captures it into a keep-graph `CUDAGraph` with
    `graphcheck.torch.graph`, and builds the manifest at once, before anything is freed
    (docs/findings.md: the free-memory rule reads the allocator when the manifest is
    built). Returns (graph, what `op` returned, manifest)."""
    if warm:
        warm_up(torch, op)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    rec = recorder if recorder is not None else gt.Recorder(model, root=root)
    with torch.no_grad(), gt.graph(g, recorder=rec, name=name, **graph_kwargs):
        out = op()
    return g, out, graphcheck.load(rec.manifest())


def capture_training(torch, model, step, *, name="g", root="model"):
    """A forward and backward step captured as in PyTorch's training cases: warmed up three
    times on a side stream, gradients set to None, then captured (autograd's device threads
    off, so that backward runs on the capture stream)."""
    was = torch.autograd.is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(False)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), warnings.catch_warnings():
            # The first cuBLAS backward warns "no current CUDA context" (as in PyTorch's case).
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph(keep_graph=True)
        rec = gt.Recorder(model, root=root)
        with gt.graph(g, recorder=rec, name=name):
            out = step()
        manifest = graphcheck.load(rec.manifest())
    finally:
        torch.autograd.set_multithreading_enabled(was)
    return g, out, manifest


def check(model, manifest, event, *, root="model", allow=None):
    """Snapshots `model` against `manifest` and verifies; prints the report."""
    live = gt.snapshot(model, manifest, event=event, root=root)
    report = graphcheck.verify(manifest, live, allow=allow)
    print(f"\n{event}:\n{report}")
    return live, report


def found(report):
    """(kind, subject) of every finding, sorted; `unused_allow` is left out (a warning: the
    cuBLAS workspace entry is unused where no GEMM held the workspace)."""
    return sorted((f.kind, f.subject) for f in report.findings if f.kind != "unused_allow")


def capture_time(report):
    return [k for k in found(report) if k[0] not in LIVE_KINDS]


def paths_of(f):
    return {o.path for o in f.owners} or {f.subject}


def assert_clean(report):
    """PyTorch passes: graphcheck reports nothing, capture-time checks included."""
    assert found(report) == [], str(report)
    assert report.ok, str(report)


def assert_dead(report, *paths, graph="g", required=("freed",), allowed=("vanished",)):
    """PyTorch reports these owners' tensors dead: each has `freed` (or `reused`) on its
    path, read by `graph`, plus the kinds in `required`; live findings name no other owner,
    and are of no kind outside required, allowed, freed and reused."""
    live = [f for f in report.findings if f.kind in LIVE_KINDS]
    for path in paths:
        dead = [f for f in live if f.kind in ("freed", "reused") and path in paths_of(f)]
        assert dead, f"{path}: no freed or reused finding\n{report}"
        assert all(graph in f.graphs for f in dead), f"{path}: not read by {graph}\n{report}"
        for kind in required:
            if kind in ("freed", "reused"):
                continue
            assert any(f.kind == kind and path in paths_of(f) for f in live), f"{path}: no {kind}\n{report}"
    stray = [(f.kind, f.subject) for f in live if not paths_of(f) & set(paths)]
    assert not stray, f"live findings on owners PyTorch did not report dead: {stray}\n{report}"
    kinds = set(required) | set(allowed) | {"freed", "reused"}
    odd = [(f.kind, f.subject) for f in live if f.kind not in kinds]
    assert not odd, f"unexpected kinds: {odd}\n{report}"


def touched_paths(manifest, kind=None):
    """The owner paths of the tensors some node (of `kind`, if given) touches."""
    ids = {
        t["tensor"]
        for g in manifest["graphs"]
        for n in g["nodes"]
        if kind is None or n["kind"] == kind
        for t in n.get("touches", [])
        if t.get("tensor") is not None
    }
    return {o["path"] for o in manifest["owners"] if o["tensor"] in ids}


def warn_capture_time(report, expected=()):
    """Capture-time findings a dead case does not depend on (stale bytes in by-value
    structs of kernels graphcheck has no layout for, workspaces of backward GEMMs): shown
    as a warning, not asserted."""
    extra = [k for k in capture_time(report) if k not in set(expected)]
    if extra:
        warnings.warn(f"capture-time findings beside the liveness case: {extra}", stacklevel=2)


def simple_mlp(torch, width=64, depth=5):
    """PyTorch's `SimpleMLP`: `depth` Linear layers with ReLU."""

    class SimpleMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(depth)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    return SimpleMLP().cuda()


def train_holder(torch, net, x, grad):
    """A training step's state: the network under `net`, the static input and the static
    output gradient as buffers."""
    h = torch.nn.Module()
    h.net = net
    h.register_buffer("x", x)
    h.register_buffer("grad", grad)
    return h


def train_step(h):
    out = h.net(h.x)
    out.backward(h.grad)
    return out


# -- TestCUDAGraphDebugInputs ---------------------------------------------------------------


def test_nothing_dead_ok(cuda):
    """test_nothing_dead_ok (test_nothing_dead in an older revision): nothing is deleted."""
    torch = cuda
    h = holder(torch, x=torch.randn(100, device="cuda"))
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    live, report = check(h, manifest, "nothing changed")
    save("liveness_nothing_dead_ok_manifest.json", manifest)
    save("liveness_nothing_dead_ok_live.json", live)
    assert touched_paths(manifest) == {"model.x"}
    assert_clean(report)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)


def dead_input(torch, *, save_as=None):
    pool = torch.cuda.MemPool()
    h = holder(torch, x=alone(torch, pool, torch.randn(100, device="cuda")))
    addr = h.x.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    del h.x
    collect()
    live, report = check(h, manifest, "del x")
    if save_as:
        save(f"liveness_{save_as}_manifest.json", manifest)
        save(f"liveness_{save_as}_live.json", live)
    assert capture_time(report) == []
    assert_dead(report, "model.x")
    # The freed block handed to a new tensor: the graph reads it.
    x_new = refill(torch, pool, addr, (100,), 3.0)
    replay(torch, g)
    assert torch.equal(y, x_new * 2)


def test_dead_input_tensor(cuda):
    """test_dead_input_tensor: the only input deleted after capture."""
    dead_input(cuda, save_as="dead_input_tensor")


def test_multiple_replays_tensor_dies_between(cuda):
    """test_multiple_replays_tensor_dies_between (older revision): replayed twice with the
    input alive, each replay followed by a check that finds nothing live, then the input
    deleted between two replays: the next check names it dead, and the replay after it
    reads what the block holds now. (Not run where this was written: no GPU there.)"""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, x=alone(torch, pool, torch.randn(100, device="cuda")))
    addr = h.x.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    for i in (1, 2):
        replay(torch, g)
        assert torch.equal(y, h.x * 2)
        _, report = check(h, manifest, f"replay {i}, x alive")
        # Replays alone change nothing the graph reads.
        assert [k for k in found(report) if k[0] in LIVE_KINDS] == [], str(report)
        assert capture_time(report) == [], str(report)
    before = y.clone()
    del h.x
    collect()
    _, report = check(h, manifest, "del x, between replays")
    assert capture_time(report) == []
    assert_dead(report, "model.x")
    # Nothing has reused the block yet: the replay between reads the old values there.
    replay(torch, g)
    assert torch.equal(y, before)
    x_new = refill(torch, pool, addr, (100,), 3.0)
    replay(torch, g)
    assert torch.equal(y, x_new * 2)


def test_dead_intermediate_tensors_ok(cuda):
    """test_dead_intermediate_tensors_ok (test_dead_intermediate_tensor_ok in an older
    revision, which stops after `del tmp`): the intermediate and then the output, both in
    the graph's pool and held by no owner, deleted."""
    torch = cuda
    h = holder(torch, x=torch.randn(100, device="cuda"))

    def op():
        tmp = h.x * 2
        return tmp, tmp + 1

    g, (tmp, y), manifest = capture(torch, h, op)
    replay(torch, g)
    assert torch.equal(y, h.x * 2 + 1)
    del tmp
    collect()
    _, report = check(h, manifest, "del tmp")
    assert_clean(report)
    replay(torch, g)
    assert torch.equal(y, h.x * 2 + 1)
    del y
    collect()
    _, report = check(h, manifest, "del y")
    assert_clean(report)
    replay(torch, g)


def test_multiple_inputs_one_dead(cuda):
    """test_multiple_inputs_one_dead (older revision): `a + b`, `a` deleted."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, a=alone(torch, pool, torch.randn(100, device="cuda")), b=torch.randn(100, device="cuda"))
    addr = h.a.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.a + h.b)
    replay(torch, g)
    assert torch.equal(y, h.a + h.b)
    del h.a
    collect()
    _, report = check(h, manifest, "del a")
    assert capture_time(report) == []
    assert_dead(report, "model.a")
    a_new = refill(torch, pool, addr, (100,), 5.0)
    replay(torch, g)
    assert torch.equal(y, a_new + h.b)


def test_model(cuda):
    """test_model (older revision): a five-layer MLP captured, nothing deleted."""
    torch = cuda
    model = simple_mlp(torch)
    x = torch.randn(8, 64, device="cuda")
    g, y, manifest = capture(torch, model, lambda: model(x), inputs={"x": x})
    replay(torch, g)
    with torch.no_grad():
        assert torch.allclose(y, model(x), rtol=1e-4, atol=1e-5)
    _, report = check(model, manifest, "nothing changed", allow=CUBLAS_WORKSPACE)
    assert_clean(report)
    assert {f"model.layers[{i}].weight" for i in range(5)} <= touched_paths(manifest)


def test_model_weight_dead(cuda):
    """test_model_weight_dead: `del model.layers[2].weight` after capture."""
    torch = cuda
    model = simple_mlp(torch)
    pool = torch.cuda.MemPool()
    layer = model.layers[2]
    layer.weight = torch.nn.Parameter(alone(torch, pool, layer.weight.detach()))
    addr = layer.weight.data_ptr()
    x = torch.randn(8, 64, device="cuda")
    g, y, manifest = capture(torch, model, lambda: model(x), inputs={"x": x})
    replay(torch, g)
    with torch.no_grad():
        assert torch.allclose(y, model(x), rtol=1e-4, atol=1e-5)
    before = y.clone()
    del model.layers[2].weight
    del layer
    collect()
    _, report = check(model, manifest, "del model.layers[2].weight", allow=CUBLAS_WORKSPACE)
    assert capture_time(report) == []
    assert_dead(report, "model.layers[2].weight")
    refill(torch, pool, addr, (64, 64), 0.0)
    replay(torch, g)
    assert not torch.allclose(y, before), "a zero weight in layer 2 changes the output"


def test_model_weights_dead(cuda):
    """test_model_weights_dead (older revision): the whole model deleted (`del model`);
    here the engine object that holds it drops it."""
    torch = cuda
    engine = torch.nn.Module()
    engine.model = simple_mlp(torch)
    pool = torch.cuda.MemPool()
    pooled_params(torch, pool, engine.model)
    # Owner path, shape and address of every parameter, in the order they were allocated.
    params = [
        (f"engine.model.layers[{i}].{n}", tuple(p.shape), p.data_ptr())
        for i, layer in enumerate(engine.model.layers)
        for n, p in layer.named_parameters()
    ]
    x = torch.randn(8, 64, device="cuda")
    g, y, manifest = capture(torch, engine, lambda: engine.model(x), root="engine", inputs={"x": x})
    replay(torch, g)
    with torch.no_grad():
        assert torch.allclose(y, engine.model(x), rtol=1e-4, atol=1e-5)
    del engine.model
    collect()
    _, report = check(engine, manifest, "del engine.model", root="engine", allow=CUBLAS_WORKSPACE)
    assert capture_time(report) == []
    assert_dead(report, *(path for path, _, _ in params))
    # Every parameter's block handed out again, in allocation order: zero weights and
    # biases make every layer's output zero.
    refilled = [refill(torch, pool, addr, shape, 0.0) for _, shape, addr in params]
    replay(torch, g)
    assert torch.count_nonzero(y).item() == 0
    del refilled


def test_model_training_weight_dead(cuda):
    """test_model_training_weight_dead: forward and backward captured; the output (whose
    graph saved the weight) and then the weight deleted."""
    torch = cuda
    pool = torch.cuda.MemPool()
    net = torch.nn.Linear(32, 16).cuda()
    net.weight = torch.nn.Parameter(alone(torch, pool, net.weight.detach()))
    addr = net.weight.data_ptr()
    h = train_holder(torch, net, torch.randn(8, 32, device="cuda"), torch.randn(8, 16, device="cuda"))
    g, out, manifest = capture_training(torch, h, lambda: train_step(h))
    replay(torch, g)
    with torch.no_grad():
        assert torch.allclose(out, h.net(h.x), rtol=1e-4, atol=1e-5)
    assert h.net.weight.grad is not None
    out_static = out.detach()
    del out
    del h.net.weight
    del net
    collect()
    _, report = check(h, manifest, "del out; del model.weight", allow=CUBLAS_WORKSPACE)
    warn_capture_time(report)
    assert_dead(report, "model.net.weight")
    refill(torch, pool, addr, (16, 32), 0.0)
    replay(torch, g)
    # A zero weight: the output is the bias.
    assert torch.allclose(out_static, h.net.bias.detach().expand_as(out_static))


def view_case(torch):
    pool = torch.cuda.MemPool()
    h = holder(torch, base=alone(torch, pool, torch.randn(100, device="cuda")))
    h.view = h.base[10:50]  # a plain attribute: a view into a buffer's storage
    addr = h.base.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.view * 2)
    replay(torch, g)
    assert torch.equal(y, h.view * 2)
    return pool, h, addr, g, y, manifest


def test_view_tensor(cuda):
    """test_view_tensor: the view the graph reads deleted (fine: its base keeps the
    storage), then the base (dead)."""
    torch = cuda
    pool, h, addr, g, y, manifest = view_case(torch)
    expected = h.view * 2
    # A view into a registered buffer's storage is registered through it.
    assert capture_time(graphcheck.verify(manifest)) == []
    del h.view
    collect()
    live, report = check(h, manifest, "del view (base alive)")
    save("liveness_view_tensor_manifest.json", manifest)
    save("liveness_view_tensor_view_dropped_live.json", live)
    assert_clean(report)
    replay(torch, g)
    assert torch.equal(y, expected)
    del h.base
    collect()
    live, report = check(h, manifest, "del base")
    save("liveness_view_tensor_base_dropped_live.json", live)
    assert_dead(report, "model.view")
    base_new = refill(torch, pool, addr, (100,), 7.0)
    replay(torch, g)
    assert torch.equal(y, base_new[10:50] * 2)


def test_view_tensor_base_dead(cuda):
    """test_view_tensor_base_dead (older revision): the base and the view deleted together."""
    torch = cuda
    pool, h, addr, g, y, manifest = view_case(torch)
    del h.base, h.view
    collect()
    _, report = check(h, manifest, "del base, view")
    assert capture_time(report) == []
    assert_dead(report, "model.view")
    base_new = refill(torch, pool, addr, (100,), 7.0)
    replay(torch, g)
    assert torch.equal(y, base_new[10:50] * 2)


def test_nested_structure_inputs(cuda):
    """test_nested_structure_inputs: `_foreach_add` over two plain lists, `del ys[1]`: the
    tensor at ys[1] is dead; ys[2] shifts to ys[1] and is no hazard (identity follows the
    storage)."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = torch.nn.Module()
    h.xs = [torch.randn(10, device="cuda") for _ in range(3)]
    h.ys = [torch.randn(10, device="cuda"), None, torch.randn(10, device="cuda")]
    h.ys[1] = alone(torch, pool, torch.randn(10, device="cuda"))
    addr = h.ys[1].data_ptr()
    g, result, manifest = capture(torch, h, lambda: torch._foreach_add(h.xs, h.ys))
    replay(torch, g)
    for r, x, y in zip(result, h.xs, h.ys):
        assert torch.equal(r, x + y)
    xs, y0, y2 = list(h.xs), h.ys[0], h.ys[2]
    del h.ys[1]
    collect()
    live, report = check(h, manifest, "del ys[1]")
    save("liveness_nested_structure_inputs_manifest.json", manifest)
    save("liveness_nested_structure_inputs_live.json", live)
    # Elements of a plain list are unregistered at capture (they would not survive sleep
    # level 2): graphcheck's own check, beside PyTorch's.
    plain = [("unregistered", f"model.{n}[{i}]") for n in ("xs", "ys") for i in range(3)]
    assert set(plain) <= set(capture_time(report)), str(report)
    warn_capture_time(report, plain)
    # ys[1] now holds the tensor that was ys[2]: the path drifted from the dead one.
    assert_dead(report, "model.ys[1]", allowed=("vanished", "drifted"))
    ys1_new = refill(torch, pool, addr, (10,), 2.0)
    replay(torch, g)
    assert torch.equal(result[0], xs[0] + y0)
    assert torch.equal(result[1], xs[1] + ys1_new)
    assert torch.equal(result[2], xs[2] + y2)


def test_output_tensor_dead_ok(cuda):
    """test_output_tensor_dead_ok (older revision): the output deleted."""
    torch = cuda
    h = holder(torch, x=torch.randn(100, device="cuda"))
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    del y
    collect()
    _, report = check(h, manifest, "del y")
    assert_clean(report)
    replay(torch, g)


def test_empty_tensor_not_tracked(cuda):
    """test_empty_tensor_not_tracked: a zero-element tensor (data pointer 0) viewed during
    capture, then deleted: no node holds it."""
    torch = cuda
    h = holder(torch, x=torch.randn(100, device="cuda"), empty=torch.empty(0, device="cuda"))

    def op():
        y = h.x * 2
        h.empty.view(0)
        return y

    g, y, manifest = capture(torch, h, op)
    assert h.empty.data_ptr() == 0
    assert "model.empty" not in touched_paths(manifest)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    del h.empty
    collect()
    _, report = check(h, manifest, "del empty")
    assert_clean(report)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)


def test_ops_without_cuda_output_not_tracked(cuda):
    """test_ops_without_cuda_output_not_tracked (older revision): `torch.equal(x, x)`
    answers on the host (same tensor) and launches nothing: an empty graph; deleting x is
    no hazard."""
    torch = cuda
    h = holder(torch, x=torch.randn(100, device="cuda"))
    # Capturable only if it does not synchronize (torch's fast path for one tensor).
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.equal(h.x, h.x)
    except RuntimeError as e:
        pytest.skip(f"torch.equal(x, x) synchronizes on this torch, so it cannot be captured: {e}")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    g, eq, manifest = capture(torch, h, lambda: torch.equal(h.x, h.x))
    assert eq is True
    assert [len(gr.get("nodes", [])) for gr in manifest["graphs"]] == [0], "an empty capture records an empty graph"
    assert touched_paths(manifest) == set()
    replay(torch, g)
    del h.x
    collect()
    _, report = check(h, manifest, "del x")
    assert_clean(report)
    replay(torch, g)


def test_non_capturing_stream_inputs_not_tracked(cuda):
    """test_non_capturing_stream_inputs_not_tracked: during a relaxed capture, `y * 3` runs
    eagerly on another stream; `y` is not in the graph, and deleting it is no hazard."""
    torch = cuda
    capture_stream = torch.cuda.Stream()
    other_stream = torch.cuda.Stream()
    h = holder(torch, x=torch.randn(100, device="cuda"), y=torch.randn(100, device="cuda"))
    with torch.cuda.stream(capture_stream):
        warm_up(torch, lambda: h.x * 2)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    rec = gt.Recorder(h)
    with torch.cuda.stream(capture_stream):
        with torch.no_grad(), gt.graph(g, recorder=rec, name="g", capture_error_mode="relaxed"):
            result = h.x * 2
            with torch.cuda.stream(other_stream):
                other_result = h.y * 3
    manifest = graphcheck.load(rec.manifest())
    torch.cuda.synchronize()
    assert torch.equal(other_result, h.y * 3)
    touched = touched_paths(manifest)
    assert "model.x" in touched and "model.y" not in touched
    replay(torch, g)
    assert torch.equal(result, h.x * 2)
    del h.y, other_result
    collect()
    _, report = check(h, manifest, "del y")
    assert_clean(report)
    replay(torch, g)
    assert torch.equal(result, h.x * 2)


def test_shared_pool_tensor_not_tracked(cuda):
    """test_shared_pool_tensor_not_tracked: two graphs in one pool; the second reads `y`
    and `w`, made by the first in the shared pool (`w` by `randn`: the graph holds torch's
    RNG state); both deleted: no hazard."""
    torch = cuda
    pool = torch.cuda.graph_pool_handle()
    h = holder(torch, x=torch.randn(100, device="cuda"))
    rec = gt.Recorder(h)

    def first():
        return h.x + 1, torch.randn(100, device="cuda")

    g1, (y, w), _ = capture(torch, h, first, name="g1", recorder=rec, pool=pool)
    h.register_buffer("external_input", torch.randn(100, device="cuda"))
    # external_input is made after the first capture: the recorder finds it on its own at
    # the second capture (it keeps its owners current), no rewalk() needed.

    def second():
        return y * 2 + h.external_input, w + 1

    g2, (z, p), manifest = capture(torch, h, second, name="g2", recorder=rec, pool=pool)
    live, report = check(h, manifest, "nothing changed")
    save("liveness_shared_pool_tensor_not_tracked_manifest.json", manifest)
    save("liveness_shared_pool_tensor_not_tracked_live.json", live)
    assert [gr["name"] for gr in manifest["graphs"]] == ["g1", "g2"]
    assert_clean(report)
    replay(torch, g1, g2)
    assert torch.equal(z, (h.x + 1) * 2 + h.external_input)
    assert torch.equal(p, w + 1)
    del y
    collect()
    _, report = check(h, manifest, "del y")
    assert_clean(report)
    replay(torch, g1, g2)
    assert torch.equal(z, (h.x + 1) * 2 + h.external_input)
    del w
    collect()
    _, report = check(h, manifest, "del w")
    assert_clean(report)
    replay(torch, g1, g2)
    assert torch.equal(z, (h.x + 1) * 2 + h.external_input)


def test_pinned_memory_tensor_tracked(cuda):
    """test_pinned_memory_tensor_tracked: a host-to-device copy from pinned memory in the
    graph; the pinned tensor deleted: dead. The memcpy node's host end is a touch of the
    pinned tensor, an owner like any other."""
    torch = cuda
    h = holder(torch, pinned=torch.randn(100).pin_memory(), cuda_dest=torch.empty(100, device="cuda"))
    addr = h.pinned.data_ptr()

    def op():
        h.cuda_dest.copy_(h.pinned, non_blocking=True)
        return h.cuda_dest * 2

    g, y, manifest = capture(torch, h, op)
    copied = touched_paths(manifest, kind="memcpy")
    assert {"model.pinned", "model.cuda_dest"} <= copied, copied
    replay(torch, g)
    assert torch.equal(y, h.pinned.to("cuda") * 2)
    del h.pinned
    collect()
    live, report = check(h, manifest, "del pinned")
    save("liveness_pinned_memory_tensor_tracked_manifest.json", manifest)
    save("liveness_pinned_memory_tensor_tracked_live.json", live)
    assert capture_time(report) == []
    assert_dead(report, "model.pinned")
    # torch's pinned-memory cache keeps the block mapped; where it hands it out again, the
    # graph copies the new contents. Which block a new pinned tensor gets is the host
    # allocator's choice, so the replay is compared only where it got this one.
    fresh = torch.full((100,), 9.0).pin_memory()
    if fresh.data_ptr() == addr:
        replay(torch, g)
        assert torch.equal(y, torch.full((100,), 18.0, device="cuda"))
    else:
        print(f"the host allocator gave the new pinned tensor {fresh.data_ptr():#x}, not {addr:#x}: no replay")


def test_pinned_memory_not_tracked_for_non_copy_ops(cuda):
    """test_pinned_memory_not_tracked_for_non_copy_ops (older revision): `pinned * 2` runs
    on the host during capture; only `cuda_tensor * 2` is in the graph; deleting the pinned
    tensor is no hazard."""
    torch = cuda
    h = holder(torch, pinned=torch.randn(100).pin_memory(), cuda_tensor=torch.randn(100, device="cuda"))

    def op():
        eq_result = h.pinned * 2
        return eq_result, h.cuda_tensor * 2

    g, (eq_result, y), manifest = capture(torch, h, op)
    assert not eq_result.is_cuda
    touched = touched_paths(manifest)
    assert "model.cuda_tensor" in touched and "model.pinned" not in touched
    del h.pinned
    collect()
    _, report = check(h, manifest, "del pinned")
    assert_clean(report)
    replay(torch, g)
    assert torch.equal(y, h.cuda_tensor * 2)


def test_alive_storage_dead_tensor_ok(cuda):
    """test_alive_storage_dead_tensor_ok: `b.set_(a.untyped_storage())`; deleting `a` is
    fine (b keeps the storage), deleting `b` too is dead."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, a=alone(torch, pool, torch.randn(100, device="cuda")), b=torch.empty(100, device="cuda"))
    h.b.set_(h.a.untyped_storage())
    addr = h.a.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.a * 2)
    replay(torch, g)
    assert torch.equal(y, h.a * 2)
    del h.a
    collect()
    live, report = check(h, manifest, "del a (b shares its storage)")
    save("liveness_alive_storage_dead_tensor_ok_manifest.json", manifest)
    save("liveness_alive_storage_dead_tensor_ok_live.json", live)
    assert_clean(report)
    replay(torch, g)
    assert torch.equal(y, h.b * 2)
    del h.b
    collect()
    _, report = check(h, manifest, "del b")
    # One view, two owner paths: one subject, `model.a = model.b`.
    assert_dead(report, "model.a", "model.b")
    ab_new = refill(torch, pool, addr, (100,), 4.0)
    replay(torch, g)
    assert torch.equal(y, ab_new * 2)


def test_dead_storage_raises(cuda):
    """test_dead_storage_raises: `x.set_(new storage)`: the owner holds a new address, the
    captured storage died."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, x=alone(torch, pool, torch.randn(100, device="cuda")))
    addr = h.x.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    h.x.set_(torch.randn(100, device="cuda").untyped_storage())
    collect()
    _, report = check(h, manifest, "x.set_(new storage)")
    assert capture_time(report) == []
    assert_dead(report, "model.x", required=("freed", "drifted"), allowed=())
    old_new = refill(torch, pool, addr, (100,), 6.0)
    replay(torch, g)
    assert torch.equal(y, old_new * 2)


def test_resize_larger_detected(cuda):
    """test_resize_larger_detected: `x.resize_(100000)` moves the storage to a new block."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, x=alone(torch, pool, torch.randn(100, device="cuda")))
    addr = h.x.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    h.x.resize_(100000)
    collect()
    assert h.x.data_ptr() != addr
    _, report = check(h, manifest, "x.resize_(100000)")
    assert capture_time(report) == []
    assert_dead(report, "model.x", required=("freed", "drifted"), allowed=())
    old_new = refill(torch, pool, addr, (100,), 6.0)
    replay(torch, g)
    assert torch.equal(y, old_new * 2)


def test_recapture_without_clears_stale_state(cuda):
    """test_recapture_without_clears_stale_state: dead after `del x`; the graph reset and
    captured again over a new tensor: the new capture's manifest knows nothing of `x`."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, x=alone(torch, pool, torch.randn(32, device="cuda")))
    addr = h.x.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    del h.x
    collect()
    _, report = check(h, manifest, "del x")
    assert_dead(report, "model.x")
    x_new = refill(torch, pool, addr, (32,), 3.0)
    replay(torch, g)
    assert torch.equal(y, x_new * 2)
    g.reset()
    h.register_buffer("x2", torch.randn(32, device="cuda"))
    warm_up(torch, lambda: h.x2 * 3)
    with torch.no_grad(), gt.graph(g, model=h, name="g") as rec:
        y2 = h.x2 * 3
    manifest2 = graphcheck.load(rec.manifest())
    assert "model.x" not in {o["path"] for o in manifest2["owners"]}
    assert touched_paths(manifest2) == {"model.x2"}
    replay(torch, g)
    assert torch.equal(y2, h.x2 * 3)
    _, report = check(h, manifest2, "recaptured")
    assert_clean(report)


def test_higher_order_op_during_capture(cuda):
    """test_higher_order_op_during_capture: the op runs through the `wrap` higher-order
    operator."""
    torch = cuda
    from torch._higher_order_ops.wrap import wrap

    def inner_fn(x):
        return x * 2

    h = holder(torch, x=torch.randn(32, device="cuda"))
    g, y, manifest = capture(torch, h, lambda: wrap(inner_fn, h.x))
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    assert touched_paths(manifest) == {"model.x"}
    _, report = check(h, manifest, "nothing changed")
    assert_clean(report)


# -- TestCUDAGraphDebugBacktraces -----------------------------------------------------------


def test_error_message_contains_all_tracebacks(cuda):
    """test_error_message_contains_all_tracebacks: two inputs deleted inside a function;
    PyTorch names 2 dead tensors with their creation, deletion and replay tracebacks.
    graphcheck names both with their owner paths and, with PyTorch's memory history on,
    where each was allocated (it compares states, so it never sees the deletion)."""
    torch = cuda
    pool = torch.cuda.MemPool()

    def create_inputs():
        return alone(torch, pool, torch.randn(100, device="cuda")), alone(torch, pool, torch.randn(100, device="cuda"))

    torch.cuda.memory._record_memory_history(stacks="python")
    try:
        a, b = create_inputs()
        h = holder(torch, a=a, b=b)
        del a, b
        addrs = (h.a.data_ptr(), h.b.data_ptr())
        g, y, manifest = capture(torch, h, lambda: h.a + h.b)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    replay(torch, g)
    assert torch.equal(y, h.a + h.b)

    def delete_tensors(h):
        del h.a, h.b

    delete_tensors(h)
    collect()
    _, report = check(h, manifest, "delete_tensors()")
    assert capture_time(report) == []
    assert_dead(report, "model.a", "model.b")
    freed = report.of_kind("freed")
    assert len(freed) == 2
    for f in freed:
        names = [frame["name"] for frame in f.alloc_site]
        assert "create_inputs" in names, (f.subject, f.alloc_site)
    assert "allocated at" in str(report) and "test_liveness_gpu.py" in str(report)
    # Both blocks handed out again, in allocation order.
    a_new = refill(torch, pool, addrs[0], (100,), 1.0)
    b_new = refill(torch, pool, addrs[1], (100,), 2.0)
    replay(torch, g)
    assert torch.equal(y, a_new + b_new)


# -- TestCUDAGraphDebugMultithreaded (older revision) ----------------------------------------


def in_thread(fn):
    """Runs `fn` in a new thread; returns what it returned, or raises what it raised."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_capture_main_replay_thread(cuda):
    """test_capture_main_replay_thread: captured in the main thread, x deleted, checked
    (and replayed) in another thread."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, x=alone(torch, pool, torch.randn(100, device="cuda")))
    addr = h.x.data_ptr()
    g, y, manifest = capture(torch, h, lambda: h.x * 2)
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    del h.x
    collect()

    def worker():
        _, report = check(h, manifest, "del x (checked in a worker thread)")
        x_new = refill(torch, pool, addr, (100,), 3.0)
        replay(torch, g)
        return report, x_new

    report, x_new = in_thread(worker)
    assert capture_time(report) == []
    assert_dead(report, "model.x")
    assert torch.equal(y, x_new * 2)


def test_capture_thread_replay_main(cuda):
    """test_capture_thread_replay_main: captured (and recorded) in another thread, x
    deleted and checked in the main thread."""
    torch = cuda
    pool = torch.cuda.MemPool()
    h = holder(torch, x=alone(torch, pool, torch.randn(100, device="cuda")))
    addr = h.x.data_ptr()
    g, y, manifest = in_thread(lambda: capture(torch, h, lambda: h.x * 2))
    replay(torch, g)
    assert torch.equal(y, h.x * 2)
    del h.x
    collect()
    _, report = check(h, manifest, "del x (captured in a worker thread)")
    assert capture_time(report) == []
    assert_dead(report, "model.x")
    x_new = refill(torch, pool, addr, (100,), 3.0)
    replay(torch, g)
    assert torch.equal(y, x_new * 2)


# -- TestCUDAGraphDebugExternalOps -----------------------------------------------------------


def test_custom_autograd_function(cuda):
    """test_custom_autograd_function: `ScaleOp.apply(x, scale)` (saves `scale` for
    backward) under no_grad; `scale` deleted."""
    torch = cuda

    class ScaleOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(scale)
            return x * scale

        @staticmethod
        def backward(ctx, grad):
            (scale,) = ctx.saved_tensors
            return grad * scale, None

    external_op(torch, lambda x, scale: ScaleOp.apply(x, scale), 2.0)


_CUSTOM_OPS = {}


def scale_op(torch):
    """`graphcheck_liveness::scale`, PyTorch's case's custom op under this test's own
    namespace, defined once per process."""
    if "scale" not in _CUSTOM_OPS:

        @torch.library.custom_op("graphcheck_liveness::scale", mutates_args=())
        def op(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return x * scale

        @op.register_fake
        def _(x, scale):
            return torch.empty_like(x)

        _CUSTOM_OPS["scale"] = op
    return _CUSTOM_OPS["scale"]


def test_torch_library_custom_op(cuda):
    """test_torch_library_custom_op: a `torch.library.custom_op` multiplying by `scale`;
    `scale` deleted."""
    torch = cuda
    external_op(torch, scale_op(torch), 3.0)


def external_op(torch, op, value):
    pool = torch.cuda.MemPool()
    h = holder(
        torch,
        x=torch.randn(100, device="cuda"),
        scale=alone(torch, pool, torch.tensor(value, device="cuda")),
    )
    addr = h.scale.data_ptr()
    g, y, manifest = capture(torch, h, lambda: op(h.x, h.scale))
    replay(torch, g)
    assert torch.equal(y, h.x * value)
    assert touched_paths(manifest) == {"model.x", "model.scale"}
    del h.scale
    collect()
    _, report = check(h, manifest, "del scale")
    assert capture_time(report) == []
    assert_dead(report, "model.scale")
    scale_new = refill(torch, pool, addr, (), 5.0)
    replay(torch, g)
    assert torch.equal(y, h.x * scale_new)


# -- TestCUDAGraphDebugTraining (older revision) ---------------------------------------------


def test_training_forward_backward(cuda):
    """test_training_forward_backward: a Linear's forward and backward captured; the static
    input deleted."""
    torch = cuda
    pool = torch.cuda.MemPool()
    net = torch.nn.Linear(32, 16).cuda()
    h = train_holder(
        torch, net, alone(torch, pool, torch.randn(8, 32, device="cuda")), torch.randn(8, 16, device="cuda")
    )
    addr = h.x.data_ptr()
    g, out, manifest = capture_training(torch, h, lambda: train_step(h))
    replay(torch, g)
    with torch.no_grad():
        assert torch.allclose(out, h.net(h.x), rtol=1e-4, atol=1e-5)
    del h.x
    collect()
    _, report = check(h, manifest, "del x", allow=CUBLAS_WORKSPACE)
    warn_capture_time(report)
    assert_dead(report, "model.x")
    refill(torch, pool, addr, (8, 32), 0.0)
    replay(torch, g)
    # A zero input: the output is the bias.
    assert torch.allclose(out.detach(), h.net.bias.detach().expand(8, 16))


def test_training_weight_deleted(cuda):
    """test_training_weight_deleted: the model and the output deleted (`del model, out`)."""
    torch = cuda
    pool = torch.cuda.MemPool()
    net = torch.nn.Linear(32, 16).cuda()
    pooled_params(torch, pool, net)
    waddr, baddr = net.weight.data_ptr(), net.bias.data_ptr()
    h = train_holder(torch, net, torch.randn(8, 32, device="cuda"), torch.randn(8, 16, device="cuda"))
    del net
    g, out, manifest = capture_training(torch, h, lambda: train_step(h))
    replay(torch, g)
    with torch.no_grad():
        assert torch.allclose(out, h.net(h.x), rtol=1e-4, atol=1e-5)
    assert {"model.net.weight", "model.net.bias"} <= touched_paths(manifest)
    out_static = out.detach()
    del h.net, out
    collect()
    _, report = check(h, manifest, "del model, out", allow=CUBLAS_WORKSPACE)
    warn_capture_time(report)
    assert_dead(report, "model.net.weight", "model.net.bias")
    refill(torch, pool, waddr, (16, 32), 0.0)
    refill(torch, pool, baddr, (16,), 0.5)
    replay(torch, g)
    assert torch.equal(out_static, torch.full((8, 16), 0.5, device="cuda"))


def test_training_multilayer(cuda):
    """test_training_multilayer: Linear, ReLU, Linear trained in the graph; the static
    output gradient deleted."""
    torch = cuda
    pool = torch.cuda.MemPool()
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).cuda()
    h = train_holder(
        torch, net, torch.randn(4, 64, device="cuda"), alone(torch, pool, torch.randn(4, 16, device="cuda"))
    )
    addr = h.grad.data_ptr()
    g, _, manifest = capture_training(torch, h, lambda: train_step(h))
    replay(torch, g)
    grads = [p.grad for p in h.net.parameters()]
    assert all(gr is not None and torch.count_nonzero(gr).item() > 0 for gr in grads)
    del h.grad
    collect()
    _, report = check(h, manifest, "del static_grad", allow=CUBLAS_WORKSPACE)
    warn_capture_time(report)
    assert_dead(report, "model.grad")
    refill(torch, pool, addr, (4, 16), 0.0)
    replay(torch, g)
    # A zero output gradient: every parameter's gradient, recomputed in place, is zero.
    assert all(torch.count_nonzero(p.grad).item() == 0 for p in h.net.parameters())
