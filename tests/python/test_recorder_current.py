"""A Recorder's owners stay current across captures, on CPU tensors with hand-written walked
graphs: a tensor made after the first graph and read by a later one is owned; a graph that
reads nothing new costs no walk; a walk keeps the capture-time owners of earlier graphs;
an empty capture records as an empty graph; and graph() instantiates the user's graph even
when recording fails."""

import array
import json

import pytest

import graphcheck
import graphcheck._recorder
import graphcheck.torch as gt
from graphcheck import _native
from conftest import kernel, walked

#: The demangled name of torch's dropout kernel (the core's tests have the mangled one): its
#: parameter 5 is an `at::PhiloxCudaState`, whose words 0 and 8 are torch's RNG state.
DROPOUT = (
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>"
    "(at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<float, unsigned int>, "
    "at::cuda::detail::TensorInfo<bool, unsigned int>, unsigned int, float, at::PhiloxCudaState)"
)


def make_model(torch):
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    return model


def node(index, name, *words):
    """A kernel node holding ``(param, offset, addr, allocation)`` words."""
    return {
        **kernel(index, name),
        "words": [
            {"param": p, "offset": o, "addr": hex(a), "allocation": None if al is None else [hex(al[0]), al[1]]}
            for p, o, a, al in words
        ],
    }


def native(*nodes):
    """A walked graph held on the Rust side, as the capture path has it."""
    return _native.Walked.from_json(walked(*nodes))


@pytest.fixture
def counted(monkeypatch):
    """Counts the recorder's registry walks (beside its own ``walks``)."""
    calls = []
    real = graphcheck._recorder.walk_roots

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(graphcheck._recorder, "walk_roots", spy)
    return calls


def unowned(manifest):
    return [f.subject for f in graphcheck.verify(manifest).findings if f.kind == "unowned"]


def test_a_tensor_made_after_the_first_graph_is_owned(torch, counted):
    # Regression: the registry was walked at the first graph only, so a workspace
    # allocated lazily after it and read by a later graph was unowned and never checked.
    model = make_model(torch)
    rec = gt.Recorder(model)
    rec.add_graph("bs1", native(kernel(0, "gemv", model.proj.weight, model.proj.bias)))
    model.workspace = torch.zeros(64, dtype=torch.int32)  # lazily allocated, a plain attribute
    rec.add_graph("bs2", native(kernel(0, "marlin", model.proj.weight, model.workspace)))
    m = graphcheck.load(rec.manifest())
    assert unowned(m) == []
    owners = {o["path"]: o for o in m["owners"]}
    ws = owners["model.workspace"]
    assert m["tensors"][ws["tensor"]]["storage_base"] == hex(model.workspace.data_ptr())
    touch = m["graphs"][1]["nodes"][0]["touches"][1]
    assert touch["tensor"] == ws["tensor"]
    # Owned, so verify names it for what it is instead of an ownerless address.
    assert [(f.kind, f.subject) for f in graphcheck.verify(m).findings] == [
        ("unregistered", "model.workspace")
    ]
    assert rec.walks == 2 and len(counted) == 2  # walked at bs2's capture, not at build


def test_no_walk_when_a_graph_reads_nothing_new(torch, counted):
    model = make_model(torch)
    rec = gt.Recorder(model)
    rec.add_pool("graph", kind="graph", ranges=[(0x7000_0000, 0x10_0000)])
    x1, x2 = torch.zeros(4), torch.zeros(8)
    rng = 0x7E00_0000_0000  # torch's generator state: no owner, set aside by the signature
    pool = (0x7000_0000, 0x10_0000)
    rec.add_graph("bs1", native(kernel(0, "gemv", model.proj.weight, x1)), pool="graph", inputs={"x": x1})
    assert rec.walks == 1
    for i, x in enumerate([x2, x1]):
        rec.add_graph(
            f"bs{i + 2}",
            native(
                kernel(0, "gemv", model.proj.weight, model.proj.bias, x),  # registry, inputs
                node(1, "silu", (0, 0, 0x7000_0040, pool), (1, 0, 0x7008_0000, pool)),  # intermediates
                node(2, DROPOUT, (0, 0, x.data_ptr(), None), (5, 0, rng, None), (5, 8, rng + 0x200, None)),
            ),
            pool="graph",
            inputs={"x": x},
        )
    rec.add_graph("empty", native())
    assert rec.walks == 1 and len(counted) == 1
    m = graphcheck.load(rec.manifest())
    assert len(counted) == 1  # the manifest does not walk either
    assert unowned(m) == []
    ignored = m["graphs"][1]["nodes"][2]["ignored"]
    assert [(w["param"], w["offset"], w["reason"]) for w in ignored] == [(5, 0, "rng_state"), (5, 8, "rng_state")]


def test_an_address_no_walk_explains_asks_for_one_walk_only(torch, counted):
    # torch's cuBLAS workspace, a module-level global: no owner reaches it. The first graph
    # that holds it walks again (it might be new); later ones remember it.
    model = make_model(torch)
    rec = gt.Recorder(model)
    workspace = 0x7F00_0000_1000
    rec.add_graph("bs1", native(kernel(0, "gemv", model.proj.weight)))
    rec.add_graph("bs2", native(kernel(0, "nvjet_splitK", model.proj.weight, workspace)))
    assert rec.walks == 2
    for bs in (4, 8, 16):
        rec.add_graph(f"bs{bs}", native(kernel(0, "nvjet_splitK", model.proj.weight, workspace)))
    assert rec.walks == 2 and len(counted) == 2
    # The address known ownerless at the first graph is remembered there too.
    rec2 = gt.Recorder(model)
    for bs in (1, 2):
        rec2.add_graph(f"bs{bs}", native(kernel(0, "nvjet_splitK", model.proj.weight, workspace)))
    assert rec2.walks == 1
    assert unowned(graphcheck.load(rec.manifest())) == [hex(workspace)]


def test_a_later_walk_keeps_the_owners_earlier_graphs_were_captured_with(torch):
    model = make_model(torch)
    model.cache = torch.zeros(16)
    model.scale = torch.ones(2)
    rec = gt.Recorder(model)
    old_cache, old_scale = model.cache, model.scale
    rec.add_graph("bs1", native(kernel(0, "k", model.proj.weight, model.cache, model.scale)))
    del model.cache  # gone from the model (still alive here)
    model.scale = torch.full((2,), 3.0)  # rebound: the path now holds a new tensor
    model.extra = torch.zeros(8)  # new, read by the next graph
    rec.add_graph("bs2", native(kernel(0, "k", model.extra, model.scale)))
    assert rec.walks == 2
    m = graphcheck.load(rec.manifest())
    owners: dict = {}
    for o in m["owners"]:
        owners.setdefault(o["path"], []).append(m["tensors"][o["tensor"]]["storage_base"])
    assert owners["model.cache"] == [hex(old_cache.data_ptr())]  # bs1's owner, kept
    assert owners["model.extra"] == [hex(model.extra.data_ptr())]
    # Where both walks have a path for two storages, the path is given for each, what
    # it holds now first (issue 28): bs1's old scale stays owned by the path it was read
    # through (before, it became ownerless: `unowned`).
    assert owners["model.scale"] == [hex(model.scale.data_ptr()), hex(old_scale.data_ptr())]
    assert unowned(m) == []
    # The live snapshot tells what became of the kept owners.
    live = gt.snapshot(model, m)
    found = {(f.kind, f.subject, f.graphs) for f in graphcheck.verify(m, live).findings}
    assert ("vanished", "model.cache", ("bs1",)) in found
    assert ("drifted", "model.scale", ("bs1",)) in found
    # bs2 read what model.scale holds now: only the capture-time finding of a plain
    # attribute (unregistered), as for any graph reading one.
    assert {f[0] for f in found if f[1] == "model.scale" and "bs2" in f[2]} == {"unregistered"}, found


def same_memory_twice(torch, model):
    """``model.a``, read by graph ``bs1``, dies; ``model.b``, a new tensor with its layout,
    is put in the same memory (as the caching allocator hands a freed block to the next
    request of its size) and read by graph ``bs2``. ``torch.frombuffer`` over one buffer
    makes that deterministic: two storage objects, one address."""
    memory = bytearray(4000)
    model.a = torch.frombuffer(memory, dtype=torch.float32)
    rec = gt.Recorder(model)
    rec.add_graph("bs1", native(kernel(0, "k1", model.proj.weight, model.a)))
    addr = model.a.data_ptr()
    del model.a  # its storage dies: the memory is free
    model.b = torch.frombuffer(memory, dtype=torch.float32)
    assert model.b.data_ptr() == addr
    rec.add_graph("bs2", native(kernel(0, "k2", model.proj.weight, model.b)))
    return rec, memory


def test_a_new_tensor_where_a_dead_one_was_is_walked_and_owned_apart(torch, counted):
    # Regression: the registry kept a dead tensor's storage range as known, so bs2 read
    # model.b without a walk (model.b never owned, its read taken for model.a's); and a
    # walk merged the two by address and layout into one alias (absorb).
    model = make_model(torch)
    rec, _ = same_memory_twice(torch, model)
    assert rec.walks == 2 and len(counted) == 2
    paths = rec.registry.by_path()
    a, b = paths["model.a"].tensor, paths["model.b"].tensor
    assert a != b  # two tensors: bs1 read the dead one
    assert rec.registry.tensors[a].tensor is None and not rec.registry.tensors[a].current()
    assert rec.registry.tensors[b].tensor is model.b
    assert rec.registry.tensors[a].meta == rec.registry.tensors[b].meta  # same address, layout
    m = graphcheck.load(rec.manifest())
    assert {"model.a", "model.b"} <= {o["path"] for o in m["owners"]}
    assert len(counted) == 2  # the manifest does not walk again


def test_a_dead_capture_time_owner_stays_its_own_tensor_in_the_manifest(torch):
    # Issue 28: model.a and model.b were one tensor with two owners (the core merged views
    # by address and layout), every graph resolved the address to it, and bs1's read of
    # model.b's bytes was no finding. Now each storage is its own record, numbered, and
    # each graph names the one alive at its capture.
    model = make_model(torch)
    rec, _ = same_memory_twice(torch, model)
    m = graphcheck.load(rec.manifest())
    owners = {}
    for o in m["owners"]:
        owners.setdefault(o["tensor"], set()).add(o["path"])
    bs1, bs2 = (g["nodes"][0]["touches"][1]["tensor"] for g in m["graphs"])
    assert (owners[bs1], owners[bs2]) == ({"model.a"}, {"model.b"})
    assert len({m["tensors"][t]["storage"] for t in (bs1, bs2)}) == 2
    live = gt.snapshot(model, m)
    report = graphcheck.verify(m, live)
    (reused,) = [f for f in report.findings if f.kind == "reused"]
    assert (reused.subject, reused.graphs, reused.new_owners) == ("model.a", ("bs1",), ("model.b",))


def test_an_earlier_path_joins_a_later_view_only_through_one_live_storage(torch):
    memory = bytearray(64)
    model = make_model(torch)
    model.x = torch.frombuffer(memory, dtype=torch.float32)
    model.alias = model.x  # one tensor, two paths
    rec = gt.Recorder(model)
    rec.add_graph("bs1", native(kernel(0, "k", model.x)))
    old_x = model.x  # alive, but no longer the model's
    del model.x, model.alias
    model.y = torch.frombuffer(memory, dtype=torch.float32)  # another storage, same address
    model.z = old_x[:4]  # a view of the old storage: it stays reached
    reg = rec.rewalk()
    paths = reg.by_path()
    x, alias, y = (paths[p].tensor for p in ("model.x", "model.alias", "model.y"))
    assert x == alias  # one earlier record, kept once
    assert x != y  # same view key, another storage object: not an alias
    assert reg.tensors[x].tensor is old_x and reg.tensors[y].tensor is model.y
    # The same storage object: the earlier path joins this walk's view.
    model.alias = model.y
    rec.rewalk()
    del model.alias
    reg = rec.rewalk()
    paths = reg.by_path()
    assert paths["model.alias"].tensor == paths["model.y"].tensor


def test_a_graph_input_in_a_dead_tensors_memory_is_its_own_tensor(torch):
    # The build adds declared inputs to the registry: a view key alone must not make an
    # input an alias of a dead tensor whose memory it has.
    memory = bytearray(64)
    model = make_model(torch)
    model.a = torch.frombuffer(memory, dtype=torch.float32)
    rec = gt.Recorder(model)
    rec.add_graph("bs1", native(kernel(0, "k", model.a)))
    del model.a
    x = torch.frombuffer(memory, dtype=torch.float32)
    rec.add_graph("bs2", native(kernel(0, "k", x)), inputs={"x": x})
    reg = rec.registry.copy()
    reg.add(x, 'graphs["bs2"].inputs["x"]', "graph_input", None)
    paths = reg.by_path()
    assert paths["model.a"].tensor != paths['graphs["bs2"].inputs["x"]'].tensor


def test_adding_a_root_walks_at_the_next_graph(torch, counted):
    model = make_model(torch)
    draft = make_model(torch)
    rec = gt.Recorder(model)
    rec.add_graph("bs1", native(kernel(0, "gemv", model.proj.weight)))
    rec.add_root(draft, "draft")
    rec.add_graph("bs2", native(kernel(0, "gemv", model.proj.weight)))
    assert rec.walks == 2
    paths = {o["path"] for o in graphcheck.load(rec.manifest())["owners"]}
    assert {"model.proj.weight", "draft.proj.weight"} <= paths
    assert len(counted) == 2


def test_graphs_as_json_are_checked_too(torch):
    model = make_model(torch)
    rec = gt.Recorder(model)
    rec.add_graph("bs1", walked(kernel(0, "gemv", model.proj.weight)))
    model.later = torch.zeros(3)
    rec.add_graph("bs2", json.loads(walked(kernel(0, "k", model.later))))
    assert rec.walks == 2
    assert unowned(graphcheck.load(rec.manifest())) == []


def test_known_ranges_are_checked_natively():
    w = native(kernel(0, "k", 0x1000, 0x2000, 0x2008, 0x1000))
    pack = lambda *pairs: array.array("Q", [x for p in pairs for x in p]).tobytes()  # noqa: E731
    assert w.unexplained(b"") == [0x1000, 0x2000, 0x2008]
    assert w.unexplained(pack((0x2000, 0x10))) == [0x1000]
    assert w.unexplained(pack((0x2000, 0x8), (0x0, 0x1001))) == [0x2008]
    with pytest.raises(graphcheck.GraphcheckError, match="pairs"):
        w.unexplained(b"\0" * 12)


def test_an_empty_graph_records_and_verifies_clean(torch):
    model = make_model(torch)
    rec = gt.Recorder(model)
    empty = _native.Walked.from_json('{"node_counts": {}, "unread": [], "nodes": []}')
    assert len(empty) == 0 and empty.words == 0
    rec.add_graph("warmup", empty)
    m = graphcheck.load(rec.manifest())
    assert [(g["name"], g["nodes"]) for g in m["graphs"]] == [("warmup", [])]
    assert graphcheck.verify(m).ok


# -- graph(): the user's graph is instantiated whatever recording does --------------------


class FakeGraph:
    """A captured torch.cuda.CUDAGraph's surface (keep_graph=True)."""

    def __init__(self):
        self.calls = []

    def raw_cuda_graph(self):
        return 0x6000

    def pool(self):
        return (0, 7)

    def instantiate(self):
        self.calls.append("instantiate")


class PanicException(BaseException):
    """What pyo3 raises for a Rust panic: a BaseException, not an Exception."""


@pytest.fixture
def fake_capture(torch, monkeypatch):
    """torch.cuda.graph replaced by a context that captures nothing (it needs a GPU), and
    the walker by ``walks[0]``: a Walked, or an exception to raise."""
    import contextlib

    walks = [_native.Walked.from_json(walked())]

    @contextlib.contextmanager
    def fake_graph(g, pool=None, stream=None, capture_error_mode="global"):
        g.calls.append("capture")
        yield

    def walk(handle):
        if isinstance(walks[0], BaseException):
            raise walks[0]
        return walks[0]

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(_native, "walk", walk, raising=False)
    return walks


def test_graph_records_an_empty_capture(torch, fake_capture):
    model = make_model(torch)
    g = FakeGraph()
    with gt.graph(g, model=model, name="empty") as rec:
        pass
    assert g.calls == ["capture", "instantiate"]
    m = graphcheck.load(rec.manifest())
    assert m["graphs"][0]["nodes"] == [] and graphcheck.verify(m).ok


@pytest.mark.parametrize(
    "failure",
    [graphcheck.GraphcheckError("cuGraphGetNodes failed"), PanicException("index out of bounds"), ValueError("bug")],
    ids=["GraphcheckError", "panic", "other"],
)
def test_graph_instantiates_then_raises_when_recording_fails(torch, fake_capture, failure):
    model = make_model(torch)
    fake_capture[0] = failure
    g = FakeGraph()
    with pytest.raises(graphcheck.GraphcheckError) as raised:
        with gt.graph(g, model=model, name="bs1"):
            pass
    assert g.calls == ["capture", "instantiate"]
    assert str(failure) in str(raised.value)
    if not isinstance(failure, graphcheck.GraphcheckError):
        assert raised.value.__cause__ is failure and "'bs1'" in str(raised.value)


def test_graph_lets_an_interrupt_through_after_instantiating(torch, fake_capture):
    model = make_model(torch)
    fake_capture[0] = KeyboardInterrupt()
    g = FakeGraph()
    with pytest.raises(KeyboardInterrupt):
        with gt.graph(g, model=model, name="bs1"):
            pass
    assert g.calls == ["capture", "instantiate"]


# -- on the GPU (opt-in: GRAPHCHECK_GPU_TESTS=1) -------------------------------------------


def test_gpu_a_lazily_allocated_workspace_is_owned_and_nothing_new_costs_no_walk(cuda):
    # Three captures into one pool: the first walks; the second reads a workspace made
    # after the first (a walk: it must be owned); the third reads nothing new (no walk:
    # its intermediates lie in the graph pool, found from the allocator's segments).
    # Elementwise kernels only: no cuBLAS workspace in the way.
    from conftest import warm_up

    torch = cuda
    model = torch.nn.Module()
    model.scale = torch.nn.Parameter(torch.rand(256, device="cuda"))
    xs = {b: torch.randn(b, 256, device="cuda") for b in (8, 16, 32)}

    def forward(x):
        h = (x * model.scale).relu()
        ws = getattr(model, "workspace", None)
        return h if ws is None else h + ws

    rec = gt.Recorder(model)
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for i, (b, x) in enumerate(xs.items()):
        if i == 1:
            model.workspace = torch.zeros(256, device="cuda")  # lazily, after the first graph
        warm_up(torch, lambda: forward(x))
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), gt.graph(g, recorder=rec, name=f"bs{b}", pool=pool, inputs={"x": x}):
            forward(x)
        graphs.append(g)
        assert rec.walks == (1 if i == 0 else 2), (b, rec.walks)
    manifest = graphcheck.load(rec.manifest())
    report = graphcheck.verify(manifest)
    print(report)
    assert [(f.kind, f.subject) for f in report.findings] == [("unregistered", "model.workspace")]
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()


def test_gpu_an_empty_capture_records_as_an_empty_graph(cuda):
    import warnings

    torch = cuda
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.ones(4, device="cuda"))
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the graph is empty
        with gt.graph(g, model=model, name="empty") as rec:
            pass
    manifest = graphcheck.load(rec.manifest())
    assert [(gr["name"], gr["nodes"]) for gr in manifest["graphs"]] == [("empty", [])]
    assert graphcheck.verify(manifest).ok
    g.replay()
    torch.cuda.synchronize()


def test_a_parameter_rebound_between_two_captures_drifts_for_the_earlier_graph_alone(torch):
    # Issue 28: a path rebound between two captures held one storage for bs1 and another
    # for bs2. The manifest gives the path once per storage, each numbered, and each
    # graph names the one it read: bs1 holds the old address (drifted), bs2 is clean.
    model = make_model(torch)
    rec = gt.Recorder(model)
    x = torch.zeros(4)
    rec.add_graph("bs1", native(kernel(0, "k1", model.proj.weight, x)), inputs={"x": x})
    old = model.proj.weight
    model.proj.weight = torch.nn.Parameter(torch.ones(4, 4))
    rec.add_graph("bs2", native(kernel(0, "k2", model.proj.weight, x)), inputs={"x": x})
    m = graphcheck.load(rec.manifest())
    held = [o["tensor"] for o in m["owners"] if o["path"] == "model.proj.weight"]
    read = [g["nodes"][0]["touches"][0]["tensor"] for g in m["graphs"]]
    assert sorted(held) == sorted(read) and read[0] != read[1]
    assert len({m["tensors"][t]["storage"] for t in read}) == 2
    live = gt.snapshot(model, m)
    report = graphcheck.verify(m, live)
    on_weight = {(f.kind, f.graphs) for f in report.findings if f.subject == "model.proj.weight"}
    # On CPU tensors no allocator knows the old weight's memory: it probes as freed.
    assert on_weight == {("drifted", ("bs1",)), ("freed", ("bs1",))}, report.findings
    del old


def test_a_path_rebound_to_a_storage_no_graph_read_keeps_what_a_graph_read(torch):
    # The storage the path held between two walks, which no graph read, is not given.
    model = make_model(torch)
    rec = gt.Recorder(model)
    x = torch.zeros(4)
    rec.add_graph("bs1", native(kernel(0, "k1", x)), inputs={"x": x})
    model.proj.weight = torch.nn.Parameter(torch.ones(4, 4))
    rec.rewalk()
    model.proj.weight = torch.nn.Parameter(torch.full((4, 4), 2.0))
    rec.add_graph("bs2", native(kernel(0, "k2", model.proj.weight, x)), inputs={"x": x})
    m = graphcheck.load(rec.manifest())
    held = [o["tensor"] for o in m["owners"] if o["path"] == "model.proj.weight"]
    assert held == [m["graphs"][1]["nodes"][0]["touches"][0]["tensor"]]


def test_a_freeze_holds_what_was_recorded_then_whatever_the_recorder_does_after(torch):
    """A freeze holds the recorder's lists by length instead of copying them (a copy per
    capture made N captures cost N²): every later change (a graph added, guarded, retargeted
    or walked again) must leave the frozen manifest as it was built at the freeze."""
    model = make_model(torch)
    rec = gt.Recorder(model)
    w, b = model.proj.weight, model.proj.bias
    rec.add_graph("g0", walked(kernel(0, "gemv", w)))
    rec.add_graph("g1", walked(kernel(0, "bias", b)))
    frozen = rec.freeze()
    then = gt.Recorder.build_frozen(frozen)
    rec.guard_graph("g1", [(b.data_ptr(), ["model.proj.bias"])])
    rec.note_retarget("g0", {"event": "test", "edits": 1, "time": 0.0})
    rec.replace_walked("g0", _native.Walked.from_json(walked(kernel(0, "gemv2", w, b))))
    rec.add_graph("g2", walked(kernel(0, "again", w)))
    assert gt.Recorder.build_frozen(frozen) == then
    names = [g["name"] for g in json.loads(then)["graphs"]]
    assert names == ["g0", "g1"]
    now = json.loads(rec.manifest_json())
    assert [g["name"] for g in now["graphs"]] == ["g1", "g0", "g2"]
    assert now["graphs"][0]["guards"] and now["graphs"][1]["retargets"]
