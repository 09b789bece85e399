"""Retarget of a torch.compile CUDA-graph tree graph (issue 31), on the GPU.

Torch's trees guard the addresses of their static inputs (parameters and buffers) and
record a new graph when one moves, and they copy every other input into the graph's own
buffers at each replay. What they do not see is a tensor an opaque custom op reads for
itself (the way vLLM's attention op fetches its layer's KV cache from the forward context):
its address is baked into the tree graph, and nothing guards it. Here a tree graph reads
such a tensor, owned by a registered root; the tensor is rebuilt at a new address; the
replay is wrong; under ``instrument(verify_on_replay="retarget")`` the next call patches
the tree graph before torch replays it, and the output equals eager. Then once more by
hand (``graphcheck.torch.retarget`` given the tree's graph object), writing the documents
for ``fixtures/gpu/`` (``retarget_tree_*``). A parameter rebound in a tree graph is the
tree's to answer: it records again, the old graph is superseded, and nothing is patched.
Opt-in (GRAPHCHECK_GPU_TESTS=1).
"""

import gc
import json

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck import _native
from conftest import save_gpu_document


def live_findings(report):
    return sorted((f.kind, f.subject) for f in report.findings if f.kind in _native.LIVE_KINDS)


def words_of(g):
    """(node, param, offset) → address of every word a walk of the template reads."""
    w = json.loads(_native.walk_graph(g.raw_cuda_graph()))
    return {
        (n["index"], word["param"], word["offset"]): int(str(word["addr"]), 0)
        if isinstance(word["addr"], str) else word["addr"]
        for n in w["nodes"] for word in n["words"]
    }


@pytest.fixture
def compiled(cuda):
    torch = cuda
    torch._dynamo.reset()
    yield torch
    gt.uninstrument()
    torch._dynamo.reset()


class Cache:
    """A KV-cache manager's stand-in: the tensor the opaque op reads, held by the engine."""

    def __init__(self, t):
        self.t = t


def opaque_model(torch, cache):
    @torch.library.custom_op("graphcheck_test::add_kv", mutates_args=())
    def add_kv(x: torch.Tensor) -> torch.Tensor:
        return x + cache.t  # read by the op itself: Dynamo never sees it

    @add_kv.register_fake
    def _(x):
        return torch.empty_like(x)

    class WithOp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(256, 256, device="cuda")

        def forward(self, x):
            return add_kv(torch.relu(self.fc(x)))

    return WithOp()


def tree_graph(torch, ins):
    """The instrumentation's one tree graph: (name, torch.cuda.CUDAGraph object)."""
    found = []
    for o in gc.get_objects():
        if issubclass(type(o), torch.cuda.CUDAGraph):  # never a weak proxy
            state = getattr(o, "_graphcheck_state", None)
            name = state.names.get(id(ins)) if state is not None else None
            if name is not None and name.startswith("inductor_fn"):
                found.append((name, o))
    assert len(found) == 1, [n for n, _ in found]
    return found[0]


def test_a_tree_graph_reading_a_tensor_no_guard_sees_is_retargeted_before_its_replay(compiled):
    torch = compiled
    cache = Cache(torch.ones(256, device="cuda"))
    m = opaque_model(torch, cache)
    ins = gt.instrument(None, model=m, verify_on_replay="retarget")
    gt.register_model(cache, root="kv")
    x = torch.randn(8, 256, device="cuda")
    cm = torch.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            y = cm(x)
    torch.cuda.synchronize()
    assert ins.errors == []
    name, g = tree_graph(torch, ins)
    assert getattr(g, "_graphcheck_template", None) is True, "retarget keeps the template"
    with torch.no_grad():
        assert (y - (torch.relu(m.fc(x)) + cache.t)).abs().max().item() < 1e-3
    assert live_findings(gt.check()) == []

    # The cache is rebuilt at a new address; the old tensor is kept alive, so the graph
    # still reads its values (1.0) where eager reads the new ones (5.0).
    old = cache.t
    cache.t = torch.full((256,), 5.0, device="cuda")
    assert cache.t.data_ptr() != old.data_ptr()
    with torch.no_grad():
        y = cm(x).clone()  # no transition marked: the tree replays, unchecked
        want = torch.relu(m.fc(x)) + cache.t
    torch.cuda.synchronize()
    wrong = (y - want).abs().max().item()
    print("tree graph", name, "replay before the retarget differs from eager by", wrong)
    assert wrong > 3.0, "the replay reads the old cache"
    before_words = words_of(g)
    assert old.data_ptr() in before_words.values()

    # The transition: the next call's replay check finds the owner moved and patches the
    # tree graph (template and executable graph) before torch replays it.
    gt.mark_transition("kv cache rebuilt", "updated")
    with torch.no_grad():
        y = cm(x).clone()
    torch.cuda.synchronize()
    diff = (y - want).abs().max().item()
    print("after the retarget before replay: largest difference from eager", diff)
    assert diff < 1e-3
    assert [r["graphs"] for r in ins.recorder.retargets] == [[name]], ins.recorder.retargets
    after_words = words_of(g)
    assert old.data_ptr() not in after_words.values()
    assert cache.t.data_ptr() in after_words.values()
    moved = {k for k in before_words if before_words[k] != after_words[k]}
    print("words patched:", len(moved))
    assert len(moved) >= 1 and all(before_words[k] == old.data_ptr() for k in moved)
    # The tree did not record again: the patched graph is the one it replays.
    assert ins.superseded == []
    names = [gr["name"] for gr in graphcheck.load(ins.manifest())["graphs"]]
    assert sum(n.startswith("inductor_fn") for n in names) == 1, names
    assert live_findings(gt.check(contents="updated")) == []

    # Once more by hand, with the documents for fixtures/gpu/: the explicit retarget given
    # the tree's graph object, then the tree's own call replays it right.
    del old
    old_ptr = cache.t.data_ptr()
    keep = cache.t
    cache.t = torch.full((256,), -2.0, device="cuda")
    rec = ins.recorder
    manifest = rec.manifest()
    live = gt.snapshot(None, manifest, roots=rec.roots(), recorder=rec, contents="updated")
    found = live_findings(graphcheck.verify(manifest, live))
    assert ("drifted", "kv.t") in found, found
    res = gt.retarget(rec, live, graphs={name: g})
    assert res.retargeted == (name,), (res.refused, res.plan)
    (gp,) = [p for p in res.plan["graphs"] if p["graph"] == name]
    assert all(int(str(e["old"]), 0) == old_ptr for e in gp["edits"]), gp["edits"]
    for part, doc in (("manifest", manifest), ("live", live), ("plan", res.plan), ("after", res.manifest)):
        save_gpu_document(f"retarget_tree_{part}.json", doc)
    with torch.no_grad():
        y = cm(x).clone()
        want = torch.relu(m.fc(x)) + cache.t
    torch.cuda.synchronize()
    assert (y - want).abs().max().item() < 1e-3
    now = rec.manifest()
    fresh = gt.snapshot(None, now, roots=rec.roots(), recorder=rec)
    assert live_findings(graphcheck.verify(now, fresh)) == []
    print("edits by hand:", len(gp["edits"]), [e["node_kind"] for e in gp["edits"]])
    del keep


def test_a_parameter_rebound_in_a_tree_graph_is_left_to_the_tree(compiled):
    torch = compiled
    nn = torch.nn
    m = nn.Sequential(nn.Linear(256, 512, device="cuda"), nn.ReLU(), nn.Linear(512, 256, device="cuda"))
    ins = gt.instrument(None, model=m, verify_on_replay="retarget")
    x = torch.randn(8, 256, device="cuda")
    cm = torch.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            cm(x)
    torch.cuda.synchronize()
    name, g = tree_graph(torch, ins)
    words = words_of(g)
    with torch.no_grad():
        m[0].weight = nn.Parameter(m[0].weight.detach() * 2)
    gt.mark_transition("reload_weights() (rebinding)", "updated")
    with torch.no_grad():
        for _ in range(3):
            y = cm(x)
        want = m(x)
    torch.cuda.synchronize()
    assert (y - want).abs().max().item() < 1e-3
    # The tree recorded a new graph; the old one is superseded (the check says so), and
    # was not patched.
    report = gt.check(contents="updated")
    assert live_findings(report) == [], report.table
    assert ins.superseded == [name], ins.superseded
    assert ins.recorder.retargets == []
    assert words_of(g) == words
    assert ins.errors == []
