"""graphcheck.torch.instrument on CPU: a fake CUDAGraph class stands in for
torch.cuda.CUDAGraph (torch's shape: __new__ and __init__ both take keep_graph,
capture_begin/capture_end/raw_cuda_graph/instantiate/pool) and a fake _native.walk_graph
returns hand-written walked graphs over CPU tensors, so everything but the GPU is real:
the patch, the walk at capture_end, instantiate, the manifest per process and rank."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import graphcheck
import graphcheck._instrument.patch
import graphcheck._recorder
import graphcheck.torch as gt
from graphcheck import _native
from graphcheck._instrument import transitions
from conftest import kernel, walked


class FakeCUDAGraph:
    """torch.cuda.CUDAGraph's surface, recording what is called."""

    def __new__(cls, keep_graph=False):
        self = object.__new__(cls)
        self.new_keep_graph = keep_graph
        return self

    def __init__(self, keep_graph=False):
        self.init_keep_graph = keep_graph
        self.calls = []
        self.handle = 0x6000 + len(WALKS.captured)

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.calls.append(("capture_begin", pool))
        WALKS.open = self.handle

    def capture_end(self):
        self.calls.append(("capture_end",))
        WALKS.open = None
        if not self.init_keep_graph:  # torch instantiates here and drops the template
            self.calls.append(("instantiate (torch)",))

    def raw_cuda_graph(self):
        self.calls.append(("raw_cuda_graph",))
        if not self.init_keep_graph:  # as torch 2.11 refuses it (seen on the H200)
            raise RuntimeError("You cannot access the raw cudaGraph_t unless keep_graph=True")
        return self.handle

    def instantiate(self):
        self.calls.append(("instantiate",))

    def replay(self):
        self.calls.append(("replay",))

    def pool(self):
        return (0, 7)


class Walks:
    """The fake walker: the walked graph for the next capture, and what was walked."""

    def __init__(self):
        self.next = None
        self.captured = []
        self.fail = None
        self.open = None  # the handle of the graph whose capture is open

    def capturing_graph(self, stream):
        """The fake ``_native.capturing_graph``: the open capture's handle, on the one
        stream the fake ``current_stream`` names."""
        if stream != FAKE_STREAM or self.open is None:
            raise graphcheck.GraphcheckError(f"stream {stream:#x} has no capture open")
        return self.open

    def __call__(self, handle):
        if isinstance(self.fail, BaseException):
            raise self.fail
        if self.fail:
            raise graphcheck.GraphcheckError(self.fail)
        self.captured.append(handle)
        return self.next


WALKS = Walks()
#: The CUstream the fake current_stream gives.
FAKE_STREAM = 0x5000


def fake_torch_graph(torch, g, pool=None):
    """What ``with torch.cuda.graph(g, pool=pool):`` calls on ``g`` (it needs a GPU for its
    streams, so the calls are made directly, in torch's order and argument form)."""

    class Ctx:
        def __enter__(self):
            g.capture_begin(*(() if pool is None else (pool,)), capture_error_mode="global")

        def __exit__(self, *exc):
            g.capture_end()

    return Ctx()


@pytest.fixture
def fake(torch, monkeypatch):
    global WALKS
    WALKS = Walks()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda.graphs, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(_native, "walk_graph", WALKS, raising=False)
    monkeypatch.setattr(_native, "walk", lambda h: _native.Walked.from_json(WALKS(h)), raising=False)
    monkeypatch.setattr(_native, "capturing_graph", WALKS.capturing_graph)
    monkeypatch.setattr(graphcheck._instrument.patch, "current_stream", lambda: FAKE_STREAM)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", gt.ENV_DIR):
        monkeypatch.delenv(var, raising=False)
    yield WALKS
    gt.uninstrument()


def made_ready(g) -> bool:
    """The graph was instantiated once, last: by torch in capture_end (no template kept)
    or by graphcheck after its walk of the kept template."""
    ready = [c for c in g.calls if c[0] in ("instantiate", "instantiate (torch)")]
    return len(ready) == 1 and g.calls[-1] == ready[0]


def make_model(torch):
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    model.embed_scale = torch.tensor(8.0)  # a plain attribute
    return model


def capture(torch, model, pool=None, **kwargs):
    """One capture through the patched class: a graph reading the model's tensors."""
    WALKS.next = walked(kernel(0, "gemv", model.proj.weight, model.proj.bias, model.embed_scale))
    g = torch.cuda.CUDAGraph(**kwargs)
    with fake_torch_graph(torch, g, pool=pool):
        pass
    return g


def test_subclass_walks_the_open_capture_and_leaves_the_template_to_torch(torch, fake, tmp_path):
    model = make_model(torch)
    ins = gt.instrument(tmp_path, model=model)
    assert ins.keep_templates is False
    assert torch.cuda.CUDAGraph is not FakeCUDAGraph
    assert torch.cuda.graphs.CUDAGraph is torch.cuda.CUDAGraph
    g = capture(torch, model)
    assert isinstance(g, FakeCUDAGraph)
    # No template kept: torch instantiates in capture_end and destroys it, as unpatched.
    assert g.new_keep_graph is False and g.init_keep_graph is False
    # Walked before torch's capture_end, while the capture was open (the fake's open
    # handle is only there between capture_begin and capture_end).
    assert g.calls == [("capture_begin", None), ("capture_end",), ("instantiate (torch)",)]
    assert fake.captured == [g.handle]
    # The manifest is written by the writer thread, named by rank and pid; flush waits.
    ins.flush()
    path = tmp_path / f"graphcheck-0-{os.getpid()}.json"
    assert ins.path == str(path) and path.is_file()
    m = graphcheck.load(path, expect="manifest")
    assert [gr["name"] for gr in m["graphs"]] == ["capture0"]
    assert m["producer"]["rank"] == 0 and m["producer"]["world_size"] == 1
    report = graphcheck.verify(path)
    assert [(f.kind, f.subject) for f in report.findings] == [("unregistered", "model.embed_scale")]


def test_pool_passed_positionally_as_torch_cuda_graph_does(torch, fake, tmp_path):
    model = make_model(torch)
    gt.instrument(tmp_path, model=model)
    shared = (0, 42)
    capture(torch, model, pool=shared)
    capture(torch, model)  # no pool: the graph's own, from g.pool()
    m = graphcheck.load(gt.instrumented()[0].manifest())
    pools = {p["name"] for p in m["pools"]}
    assert pools == {"graph(0, 42)", "graph(0, 7)"}
    assert [g["name"] for g in m["graphs"]] == ["capture0", "capture1"]


def test_keep_graph_asked_by_the_caller_is_left_to_the_caller(torch, fake):
    model = make_model(torch)
    gt.instrument(model=model)
    g = capture(torch, model, keep_graph=True)
    assert g.calls == [("capture_begin", None), ("capture_end",), ("raw_cuda_graph",)]
    g2 = capture(torch, model, keep_graph=False)
    # Not asked: torch's capture_end instantiates it, and drops the template.
    assert g2.calls[-1] == ("instantiate (torch)",) and g2.init_keep_graph is False


def test_manifest_rewritten_atomically_after_every_capture(torch, fake, tmp_path, monkeypatch):
    model = make_model(torch)
    writes = []
    real = _native.write_atomic

    def spy(path, data):
        writes.append((os.fspath(path), len(json.loads(data)["graphs"])))
        real(path, data)

    monkeypatch.setattr(_native, "write_atomic", spy)
    ins = gt.instrument(tmp_path, model=model)
    for _ in range(3):
        capture(torch, model)
        ins.flush()  # the writer thread's write of this capture, waited for
    assert writes == [(ins.path, 1), (ins.path, 2), (ins.path, 3)]
    assert os.listdir(tmp_path) == [os.path.basename(ins.path)]  # no temporary left
    assert len(graphcheck.load(ins.path)["graphs"]) == 3


def test_write_every_batches_rewrites_and_stopping_flushes_the_rest(torch, fake, tmp_path, monkeypatch):
    model = make_model(torch)
    writes = []
    real = _native.write_atomic

    def spy(path, data):
        writes.append(len(json.loads(data)["graphs"]))
        real(path, data)

    monkeypatch.setattr(_native, "write_atomic", spy)
    ins = gt.instrument(tmp_path, model=model, write_every=2)
    for i in range(5):
        capture(torch, model)
        if i % 2:
            ins._writer.wait()
    assert writes == [2, 4]
    gt.uninstrument(ins)  # the fifth capture is written when the instrumentation stops
    assert writes == [2, 4, 5]
    assert ins.flush() is None  # nothing left to write
    assert len(graphcheck.load(ins.path)["graphs"]) == 5
    with pytest.raises(graphcheck.GraphcheckError, match="write_every"):
        gt.instrument(tmp_path, write_every=0)


@pytest.mark.parametrize(
    "env, rank, world",
    [({"RANK": "3", "WORLD_SIZE": "4"}, 3, 4), ({"LOCAL_RANK": "1"}, 1, 2), ({}, 0, 1)],
)
def test_one_manifest_per_rank(torch, fake, tmp_path, monkeypatch, env, rank, world):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    model = make_model(torch)
    ins = gt.instrument(tmp_path, model=model)
    capture(torch, model)
    ins.flush()
    assert os.path.basename(ins.path) == f"graphcheck-{rank}-{os.getpid()}.json"
    producer = graphcheck.load(ins.path)["producer"]
    assert (producer["rank"], producer["world_size"]) == (rank, world)
    # Regression: the snapshot read its rank from torch.distributed only, so a rank the
    # launcher named by RANK with no process group was "rank 0 of 1": the pair was refused
    # and the check before every replay failed.
    live = gt.snapshot(model, ins.manifest(), recorder=ins.recorder)
    assert (live["producer"]["rank"], live["producer"]["world_size"]) == (rank, world)
    graphcheck.verify(ins.manifest(), live)  # a pair of another rank raises here
    # The check ran against this rank's snapshot (a refused pair raises): only the
    # capture-time finding of the plain attribute.
    assert [f.kind for f in gt.check(event="resume").findings] == ["unregistered"]


def test_directory_from_the_environment(torch, fake, tmp_path, monkeypatch):
    monkeypatch.setenv(gt.ENV_DIR, str(tmp_path / "gc"))
    model = make_model(torch)
    ins = gt.instrument(model=model)
    capture(torch, model)
    ins.flush()
    assert Path(ins.path).parent == tmp_path / "gc" and Path(ins.path).is_file()


def test_without_a_model_addresses_are_bare_until_a_root_is_registered(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(discover=False)
    capture(torch, model)
    m = graphcheck.load(ins.manifest())
    assert m["owners"] == []
    report = graphcheck.verify(m)
    assert {f.kind for f in report.findings} == {"unowned"} and len(report.findings) == 3
    gt.register_model(model, root="engine")
    m = graphcheck.load(ins.manifest())
    assert {o["path"] for o in m["owners"]} >= {"engine.proj.weight", "engine.embed_scale"}
    assert [f.subject for f in graphcheck.verify(m).findings] == ["engine.embed_scale"]


def test_register_model_before_instrument_is_taken_and_held_weakly(torch, fake):
    import gc

    model = make_model(torch)
    gt.register_model(model, root="model")
    ins = gt.instrument()
    assert list(ins.recorder.roots()) == ["model"]
    capture(torch, model)
    assert any(o["path"] == "model.proj.weight" for o in graphcheck.load(ins.manifest())["owners"])
    del model
    gc.collect()
    assert ins.recorder.roots() == {}


def test_uninstrument_restores_torch(torch, fake):
    a = gt.instrument()
    b = gt.instrument()
    patched = torch.cuda.CUDAGraph
    gt.uninstrument(a)
    assert torch.cuda.CUDAGraph is patched  # b is still live
    gt.uninstrument(b)
    assert torch.cuda.CUDAGraph is FakeCUDAGraph
    assert torch.cuda.graphs.CUDAGraph is FakeCUDAGraph
    assert gt.instrumented() == []
    # A context manager too.
    with gt.instrument() as ins:
        assert gt.instrumented() == [ins]
    assert torch.cuda.CUDAGraph is FakeCUDAGraph


def test_every_live_instrumentation_gets_the_capture(torch, fake):
    model = make_model(torch)
    a = gt.instrument(model=model)
    b = gt.instrument(model=model)
    capture(torch, model)
    assert a.captures == b.captures == 1
    assert len(fake.captured) == 1  # walked once


def test_a_failed_walk_warns_and_the_capture_still_completes(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(model=model)
    fake.fail = "no CUDA driver"
    with pytest.warns(RuntimeWarning, match="no CUDA driver"):
        g = capture(torch, model)
    assert made_ready(g)
    assert ins.captures == 0 and len(ins.errors) == 1
    strict = gt.instrument(model=model, strict=True)
    gt.uninstrument(ins)
    with pytest.raises(graphcheck.GraphcheckError, match="no CUDA driver"):
        g = capture(torch, model)
    assert made_ready(g)
    assert strict.errors == []


@pytest.mark.parametrize("action", ["error", "ignore"])
def test_the_failure_warning_never_raises_into_the_engine(torch, fake, action):
    # Regression: under -W error (pytest's filterwarnings = error) the RuntimeWarning of a
    # failed recording escaped capture_end into the engine. Shown instead; "ignore" holds.
    import warnings

    model = make_model(torch)
    ins = gt.instrument(model=model)
    fake.fail = "no CUDA driver"
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter(action)
        g = capture(torch, model)
    assert made_ready(g)
    assert ins.captures == 0 and [str(e) for e in ins.errors] == ["no CUDA driver"]
    expected = ["graphcheck: a capture was not recorded: no CUDA driver"] if action == "error" else []
    assert [(w.category, str(w.message)) for w in shown] == [(RuntimeWarning, m) for m in expected]


def test_a_failed_owner_walk_keeps_the_graph_and_says_so(torch, fake, monkeypatch):
    # Regression: the graph was added before the walk that keeps owners current failed; the
    # warning said "not recorded" while the graph was in the manifest, uncounted.
    model = make_model(torch)
    ins = gt.instrument(model=model)
    capture(torch, model)
    model.workspace = torch.zeros(16)  # new: the next capture walks
    real = graphcheck._recorder.walk_roots

    def broken(*args, **kwargs):
        raise RuntimeError("the walk broke")

    monkeypatch.setattr(graphcheck._recorder, "walk_roots", broken)
    WALKS.next = walked(kernel(0, "marlin", model.proj.weight, model.workspace))
    g = torch.cuda.CUDAGraph()
    stale = r"^graphcheck: graph 'capture1' was recorded, but .*the walk broke.*may be stale"
    with pytest.warns(RuntimeWarning, match=stale):
        with fake_torch_graph(torch, g):
            pass
    assert made_ready(g)
    assert ins.captures == 2 and len(ins.errors) == 1
    assert isinstance(ins.errors[0], graphcheck.GraphcheckError)
    assert isinstance(ins.errors[0].__cause__, RuntimeError)
    monkeypatch.setattr(graphcheck._recorder, "walk_roots", real)
    m = graphcheck.load(ins.manifest())  # walks again: the owners are current once more
    assert [gr["name"] for gr in m["graphs"]] == ["capture0", "capture1"]
    assert ins.recorder.walks == 2
    assert any(o["path"] == "model.workspace" for o in m["owners"])


def test_a_failed_write_keeps_the_capture_and_says_so(torch, fake, tmp_path):
    model = make_model(torch)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    ins = gt.instrument(blocked / "out", model=model)
    with pytest.warns(RuntimeWarning, match=r"^graphcheck: the manifest was not written .*Not a directory"):
        capture(torch, model)
        ins._writer.wait()  # the writer thread's write fails
    assert ins.captures == 1 and len(ins.errors) == 1
    assert [gr["name"] for gr in graphcheck.load(ins.manifest())["graphs"]] == ["capture0"]
    blocked.unlink()
    blocked.mkdir()
    written = ins.flush()  # the write retries
    assert json.loads(Path(written).read_text())["graphs"][0]["name"] == "capture0"


class PanicException(BaseException):
    """What pyo3 raises for a Rust panic: a BaseException, which `except Exception` misses."""


@pytest.mark.parametrize("where", ["walk", "record"])
def test_a_panic_warns_and_never_reaches_the_engine(torch, fake, monkeypatch, where):
    model = make_model(torch)
    ins = gt.instrument(model=model)
    if where == "walk":
        fake.fail = PanicException("attempted to zero-initialize type")
    else:
        def panic(*args, **kwargs):
            raise PanicException("attempted to zero-initialize type")

        monkeypatch.setattr(ins.recorder, "add_graph", panic)
    with pytest.warns(RuntimeWarning, match="zero-initialize"):
        g = capture(torch, model)
    assert made_ready(g)
    assert ins.captures == 0 and [type(e) for e in ins.errors] == [PanicException]


def test_an_interrupt_during_recording_is_not_swallowed(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(model=model)
    fake.fail = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        g = torch.cuda.CUDAGraph()
        with fake_torch_graph(torch, g):
            pass
    assert made_ready(g)  # the graph is still made ready
    assert ins.errors == []


def test_a_tensor_made_after_the_first_capture_is_owned(torch, fake):
    # The instrumentation's recorder keeps its owners current as Recorder does: a
    # workspace a later capture reads is owned without anyone calling rewalk().
    model = make_model(torch)
    ins = gt.instrument(model=model)
    capture(torch, model)
    model.workspace = torch.zeros(16)
    WALKS.next = walked(kernel(0, "marlin", model.proj.weight, model.workspace))
    g = torch.cuda.CUDAGraph()
    with fake_torch_graph(torch, g):
        pass
    assert ins.recorder.walks == 2
    m = graphcheck.load(ins.manifest())
    assert any(o["path"] == "model.workspace" for o in m["owners"])
    assert [(f.kind, f.subject) for f in graphcheck.verify(m).findings] == [
        ("unregistered", "model.embed_scale"),
        ("unregistered", "model.workspace"),
    ]
    capture(torch, model)  # nothing new: no walk
    assert ins.recorder.walks == 2


def test_an_empty_capture_is_recorded_as_an_empty_graph(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(model=model)
    WALKS.next = walked()
    g = torch.cuda.CUDAGraph()
    with fake_torch_graph(torch, g):
        pass
    assert ins.errors == [] and ins.captures == 1
    m = graphcheck.load(ins.manifest())
    assert m["graphs"][0]["nodes"] == [] and graphcheck.verify(m).ok


def test_graph_names(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(model=model, name=lambda i: f"decode_bs{2 ** i}")
    capture(torch, model)
    capture(torch, model)
    assert [g["name"] for g in graphcheck.load(ins.manifest())["graphs"]] == ["decode_bs1", "decode_bs2"]


def _site_pth():
    purelib = Path(sysconfig.get_paths()["purelib"])
    return purelib / "graphcheck-instrument.pth"


@pytest.mark.parametrize("how", ["pth", "import graphcheck.torch first"])
def test_graphcheck_dir_instruments_a_fresh_process(torch, tmp_path, how):
    """GRAPHCHECK_DIR alone (the installed .pth), or with `import graphcheck.torch` before
    torch: torch.cuda.CUDAGraph is the recording subclass once torch is imported."""
    if how == "pth" and not _site_pth().is_file():
        pytest.skip(f"{_site_pth()} is not installed (an editable install?)")
    first = "import graphcheck.torch; " if how != "pth" else ""
    code = (
        first + "import torch, graphcheck.torch as gt; "
        "print(torch.cuda.CUDAGraph.__qualname__, torch.cuda.graphs.CUDAGraph.__qualname__, "
        "len(gt.instrumented()), gt.instrumented()[0].directory)"
    )
    env = dict(os.environ, GRAPHCHECK_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["graphcheck.CUDAGraph", "graphcheck.CUDAGraph", "1", str(tmp_path)]
    # Without the variable, nothing is patched.
    env.pop("GRAPHCHECK_DIR")
    out = subprocess.run(
        [sys.executable, "-c", "import torch, graphcheck.torch; print(torch.cuda.CUDAGraph.__qualname__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["CUDAGraph"]


# -- the check before a replay ------------------------------------------------------------


def replays(g):
    return sum(1 for c in g.calls if c == ("replay",))


def rebind_weight(torch, model):
    """A reload that builds a new weight tensor instead of copying into the old one (the
    old storage is freed; the graph keeps its address)."""
    with torch.no_grad():
        model.proj.weight = torch.nn.Parameter(model.proj.weight.detach().clone() + 1)


def test_replay_after_a_rebinding_reload_is_refused_before_the_kernels_run(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(None, model=model, verify_on_replay="raise")
    g = capture(torch, model)
    g.replay()  # nothing pending: no check
    assert replays(g) == 1
    rebind_weight(torch, model)
    gt.mark_transition("reload_weights()", "updated")
    with pytest.raises(gt.ReplayCheckError) as e:
        g.replay()
    assert replays(g) == 1, "the refused replay never reached torch"
    err = e.value
    assert isinstance(err, graphcheck.GraphcheckError)
    assert err.graph == "capture0"
    # The old storage went with the old parameter: rebound and released.
    assert [(f.kind, f.subject) for f in err.findings] == [
        ("drifted", "model.proj.weight"), ("freed", "model.proj.weight")
    ], err
    assert all("capture0" in f.graphs for f in err.findings)
    assert "model.proj.weight" in str(err) and "replay refused" in str(err)
    assert err.report.of_kind("drifted")
    # Refused again until a transition is marked and the check passes.
    with pytest.raises(gt.ReplayCheckError):
        g.replay()
    assert replays(g) == 1
    gt.uninstrument(ins)


def test_verify_on_replay_retarget_refuses_what_it_cannot_patch_saying_why(torch, fake):
    # on_findings="retarget": a graph the plan fixes is patched before its replay through
    # the driver (shown on the H200 by test_retarget_gpu.py); here there is no driver, so
    # the patch fails and the replay is refused as "raise" refuses it, with the reason.
    model = make_model(torch)
    ins = gt.instrument(None, model=model, verify_on_replay="retarget")
    g = capture(torch, model)
    rebind_weight(torch, model)
    gt.mark_transition("reload_weights()", "updated")
    with pytest.raises(gt.ReplayCheckError) as e:
        g.replay()
    assert replays(g) == 0, "the refused replay never reached torch"
    assert "replay refused (not retargeted: " in str(e.value), e.value
    assert e.value.report.retarget == ("capture0",), "the plan would retarget it"
    assert ins.recorder.retargets == []
    gt.uninstrument(ins)
    # A graph the plan refuses is refused at once, saying the plan refuses it.
    model = make_model(torch)
    ins = gt.instrument(None, model=model, verify_on_replay="retarget")
    g = capture(torch, model)
    with torch.no_grad():
        model.proj.weight.data = model.proj.weight.data.t()  # same storage, another layout
    gt.mark_transition("reload_weights()", "updated")
    with pytest.raises(gt.ReplayCheckError) as e:
        g.replay()
    assert "the retarget plan refuses it" in str(e.value), e.value
    assert [f.kind for f in e.value.findings] == ["reshaped"], e.value
    # check() only reports: retargeting needs the graph objects a replay has.
    with pytest.raises(graphcheck.GraphcheckError, match="on_findings is one of 'raise', 'warn'"):
        gt.check(ins, on_findings="retarget")
    gt.uninstrument(ins)


def test_a_clean_transition_is_checked_once_per_epoch_for_all_graphs(torch, fake, monkeypatch):
    from graphcheck._instrument import replay_check

    model = make_model(torch)
    gt.instrument(None, model=model, verify_on_replay=True)
    g1, g2 = capture(torch, model), capture(torch, model)
    runs = []
    real = replay_check.run_check
    monkeypatch.setattr(replay_check, "run_check", lambda *a, **k: runs.append(1) or real(*a, **k))
    before = transitions.epoch()
    assert gt.mark_transition("wake", "preserved") == before + 1
    for g in (g1, g2, g1, g2):
        g.replay()
    assert (replays(g1), replays(g2)) == (2, 2)
    assert len(runs) == 1, "one snapshot and verify serve every graph of the epoch"
    gt.mark_transition("wake again")
    g2.replay()
    assert len(runs) == 2


def test_warn_mode_warns_and_replays(torch, fake):
    model = make_model(torch)
    gt.instrument(None, model=model, verify_on_replay="warn")
    g = capture(torch, model)
    rebind_weight(torch, model)
    gt.mark_transition("reload_weights()", "updated")
    with pytest.warns(RuntimeWarning, match=r"graph 'capture0' reads memory that changed .*replaying anyway"):
        g.replay()
    assert replays(g) == 1


def test_warn_mode_under_an_error_filter_shows_the_finding_as_a_finding(torch, fake):
    # Regression: under -W error the finding's warning was raised, caught as a failure of
    # the check ("the check before replay failed, replaying unchecked") and kept in errors.
    import warnings

    model = make_model(torch)
    ins = gt.instrument(None, model=model, verify_on_replay="warn")
    g = capture(torch, model)
    rebind_weight(torch, model)
    gt.mark_transition("reload_weights()", "updated")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        g.replay()
    assert replays(g) == 1 and ins.errors == []
    assert len(shown) == 1, [str(w.message) for w in shown]
    assert str(shown[0].message).startswith("graphcheck: graph 'capture0' reads memory that changed")


def test_off_by_default_and_from_the_environment(torch, fake, monkeypatch):
    model = make_model(torch)
    ins = gt.instrument(None, model=model)
    g = capture(torch, model)
    rebind_weight(torch, model)
    gt.mark_transition("reload_weights()", "updated")
    g.replay()  # no check asked for
    assert replays(g) == 1
    gt.uninstrument(ins)

    monkeypatch.setenv(gt.ENV_VERIFY_ON_REPLAY, "raise")
    model = make_model(torch)
    gt.instrument(None, model=model)
    g = capture(torch, model)
    rebind_weight(torch, model)
    gt.mark_transition("reload_weights()", "updated")
    with pytest.raises(gt.ReplayCheckError):
        g.replay()
    gt.uninstrument()

    monkeypatch.setenv(gt.ENV_VERIFY_ON_REPLAY, "sometimes")
    with pytest.raises(graphcheck.GraphcheckError, match="GRAPHCHECK_VERIFY_ON_REPLAY is 'raise', 'warn', 'retarget' or 'off'"):
        gt.instrument(None)
    with pytest.raises(graphcheck.GraphcheckError, match="verify_on_replay is one of"):
        gt.instrument(None, verify_on_replay="loudly")
    with pytest.raises(graphcheck.GraphcheckError, match="contents is one of"):
        gt.mark_transition("x", "gone")


def test_written_that_holds_itself_is_read_once(torch, fake):
    # Regression: mark_transition(written=) looped forever on a list that holds itself.
    model = make_model(torch)
    gt.instrument(None, model=model, verify_on_replay="raise")
    written = [model.proj]
    written.append(written)
    before = transitions.epoch()
    assert gt.mark_transition("reload_weights()", "updated", written=written) == before + 1
    assert transitions.rewritten_since(before) == transitions._storages("written", model.proj)


def test_load_state_dict_marks_a_transition_and_the_patch_goes_with_the_instrumentation(torch, fake):
    original = torch.nn.Module.load_state_dict
    model = make_model(torch)
    ins = gt.instrument(None, model=model, verify_on_replay="raise")
    g = capture(torch, model)
    before = transitions.epoch()
    model.load_state_dict(model.state_dict())  # copies in place: addresses kept
    assert transitions.epoch() == before + 1
    assert transitions.latest()[1:] == ("Module.load_state_dict", "updated")
    g.replay()  # checked, clean
    assert replays(g) == 1
    gt.uninstrument(ins)
    assert torch.nn.Module.load_state_dict is original


def test_a_sleep_wake_is_a_transition_while_an_instrumentation_is_live(torch, fake):
    """Regression (issue 27): importing the replay check put its wake hook into
    graphcheck.sleep as a side effect, for the life of the process. instrument() puts it
    in place; the last uninstrument() takes it away."""
    from graphcheck import _sleep_state

    assert gt.instrumented() == []
    before = transitions.epoch()
    _sleep_state.after_wake({"awake": True})  # what SleepAllocator.wake() calls
    assert transitions.epoch() == before, "no instrumentation: no hook"
    first, second = gt.instrument(None, model=make_model(torch)), gt.instrument(None)
    _sleep_state.after_wake({"awake": True})
    assert transitions.latest()[:2] == (before + 1, "graphcheck.sleep wake")
    gt.uninstrument(first)
    _sleep_state.after_wake({"awake": True})
    assert transitions.epoch() == before + 2, "one instrumentation still live"
    gt.uninstrument(second)
    _sleep_state.after_wake({"awake": True})
    assert transitions.epoch() == before + 2


def test_a_check_that_breaks_warns_and_the_replay_goes_ahead(torch, fake, monkeypatch):
    from graphcheck._instrument import replay_check

    model = make_model(torch)
    ins = gt.instrument(None, model=model, verify_on_replay="raise")
    g = capture(torch, model)

    def broken(*a, **k):
        raise RuntimeError("snapshot failed")

    monkeypatch.setattr(replay_check, "run_check", broken)
    gt.mark_transition("wake")
    with pytest.warns(RuntimeWarning, match="the check before replay failed, replaying unchecked: snapshot failed"):
        g.replay()
    assert replays(g) == 1 and any("snapshot failed" in str(e) for e in ins.errors)


def test_check_on_demand(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(None, model=model)
    capture(torch, model)
    report = gt.check()
    assert not report.of_kind("drifted")
    rebind_weight(torch, model)
    report = gt.check(event="after reload", contents="updated")
    assert report.of_kind("drifted") and ins.superseded == []
    with pytest.raises(gt.ReplayCheckError, match=r"1 graph \(capture0\) read memory that changed"):
        gt.check(ins, contents="updated", on_findings="raise")
    with pytest.raises(graphcheck.GraphcheckError, match="check takes what instrument"):
        gt.check(object())
    gt.uninstrument()
    with pytest.raises(graphcheck.GraphcheckError, match="exactly one live, not 0"):
        gt.check()


def test_a_tree_graph_whose_guarded_parameter_moved_is_superseded(torch):
    # torch.compile's trees re-record when a static input's address changes: the old
    # graph never replays again, so what it read is no hazard. The manifest records what
    # each graph guards; the core leaves a superseded graph out of every finding.
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(8))
    model.v = torch.nn.Parameter(torch.randn(8))
    w = model.w.data_ptr()
    rec = gt.Recorder(model)
    for name in ("old", "other", "plain"):
        rec.add_graph(name, walked(kernel(0, "k", model.w, model.v)))
    rec.guard_graph("old", [(w, ["model.w"])])
    rec.guard_graph("other", [(model.v.data_ptr(), [])])  # paths: the manifest's owners
    manifest = rec.manifest()
    graphs = {g["name"]: g.get("guards") for g in graphcheck.load(manifest)["graphs"]}
    assert graphs == {
        "old": [{"addr": hex(w), "paths": ["model.w"]}],
        "other": [{"addr": hex(model.v.data_ptr()), "paths": []}],
        "plain": None,
    }
    kept = graphcheck.verify(manifest, gt.snapshot(model, manifest))
    assert kept.superseded == () and kept.ok
    model.w = torch.nn.Parameter(torch.randn(8))  # rebound: the tree records anew
    moved = graphcheck.verify(manifest, gt.snapshot(model, manifest))
    assert moved.superseded == ("old",)
    assert [(f.kind, f.graphs) for f in moved.findings if f.kind == "drifted"] == [
        ("drifted", ("other", "plain"))
    ]
    assert "superseded, left out: old" in moved.table
    model.v = torch.nn.Parameter(torch.randn(8))
    both = graphcheck.verify(manifest, gt.snapshot(model, manifest))
    assert both.superseded == ("old", "other")
    assert {f.graphs for f in both.findings if f.kind == "drifted"} == {("plain",)}
    with pytest.raises(graphcheck.GraphcheckError, match="no graph named 'nope'"):
        rec.guard_graph("nope", [])


# -- zero-code attach: discovery ----------------------------------------------------------


def test_discovery_makes_the_top_level_modules_roots_named_by_class(torch, fake):
    import gc

    class LlamaForCausalLM(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.proj = torch.nn.Linear(width, width)
            self.embed_scale = torch.tensor(8.0)

    gc.collect()
    big, small = LlamaForCausalLM(8), LlamaForCausalLM(4)
    draft = torch.nn.Sequential(torch.nn.Linear(4, 4))
    ins = gt.instrument()
    WALKS.next = walked(kernel(0, "gemv", big.proj.weight, small.proj.weight, draft[0].weight))
    g = torch.cuda.CUDAGraph()
    with fake_torch_graph(torch, g):
        pass
    # Children (big.proj, draft[0]) are not roots; two of one class are numbered by size.
    assert {"llama_for_causal_lm_1", "llama_for_causal_lm_2", "sequential"} <= set(ins.discovered)
    paths = {o["path"] for o in graphcheck.load(ins.manifest())["owners"]}
    assert {"llama_for_causal_lm_1.proj.weight", "llama_for_causal_lm_2.proj.weight", "sequential[0].weight"} <= paths
    assert not any(p.startswith("linear") for p in ins.discovered), ins.discovered
    kinds = {f.kind for f in graphcheck.verify(graphcheck.load(ins.manifest())).findings}
    assert "unowned" not in kinds
    # Naming a root replaces the discovered ones.
    gt.register_model(big, root="model")
    assert ins.discovered == [] and list(ins.recorder.roots()) == ["model"]


def test_discovery_sees_through_torch_compile_and_can_be_turned_off(torch, fake):
    from graphcheck import _discover

    model = make_model(torch)

    class OptimizedModule(torch.nn.Module):  # torch.compile's wrapper, by name
        def __init__(self, mod):
            super().__init__()
            self._orig_mod = mod

    wrapper = OptimizedModule(model)
    roots = [m for _, m in _discover.top_level_modules(torch)]
    assert any(m is model for m in roots)  # the wrapped model, not the wrapper
    assert not any(m is wrapper for m in roots)
    assert _discover.snake("LlamaForCausalLM") == "llama_for_causal_lm"
    assert _discover.snake("MLP") == "mlp" and _discover.snake("T5Block") == "t5_block"
    ins = gt.instrument(discover=False)
    capture(torch, model)
    assert ins.discovered == [] and graphcheck.load(ins.manifest())["owners"] == []
    with pytest.raises(graphcheck.GraphcheckError, match="discover"):
        gt.instrument(discover="yes")



def test_a_directory_that_is_a_file_fails_at_instrument_not_at_the_first_write(torch, tmp_path):
    f = tmp_path / "not_a_folder"
    f.write_text("the user's")
    with pytest.raises(graphcheck.GraphcheckError, match="exists and is not a folder"):
        gt.instrument(f)
    assert gt.instrumented() == []
    assert f.read_text() == "the user's"


def test_written_takes_a_model_with_tensors_of_no_storage_of_their_own(torch, fake):
    # Regression: mark_transition(written=model) raised into the engine (NotImplementedError,
    # RuntimeError) where the model held a sparse buffer or a wrapper tensor subclass (a
    # DTensor); the wrapper's inner tensors are what the walk digests and the update wrote.
    from torch.testing._internal.two_tensor import TwoTensor

    model = make_model(torch)
    model.register_buffer("mask", torch.eye(3).to_sparse())
    model.pair = torch.nn.Parameter(TwoTensor(torch.randn(4), torch.randn(4)))
    ins = gt.instrument(None, model=model, verify_on_replay="raise", digests=True)
    WALKS.next = walked(kernel(0, "k", model.proj.weight, model.pair.a, model.pair.b))
    g = torch.cuda.CUDAGraph()
    with fake_torch_graph(torch, g):
        pass
    with torch.no_grad():
        model.pair.copy_(TwoTensor(torch.randn(4), torch.randn(4)))  # new weights, in place
    gt.mark_transition("reload_weights()", "updated", written=model)
    g.replay()  # what the update wrote is not stale
    assert replays(g) == 1 and ins.errors == []


def test_graphcheck_digests_turns_digests_on_for_an_instrumentation_that_does_not_say(torch, fake, monkeypatch):
    """GRAPHCHECK_DIR's zero-code attach passes no arguments: the environment says."""
    from graphcheck._instrument import ENV_DIGESTS

    for value, want in (("", False), ("0", False), ("OFF", False), ("1", True), ("On", True), ("sum64", "sum64"), ("SHA256", "sha256")):
        monkeypatch.setenv(ENV_DIGESTS, value)
        ins = gt.instrument(None)
        got = ins.recorder.digests  # the algorithm, None where off
        assert (got is not None) == bool(want) and (want in (True, False) or got == want), value
        gt.uninstrument()
    monkeypatch.setenv(ENV_DIGESTS, "1")
    ins = gt.instrument(None, digests=False)  # an argument wins
    assert ins.recorder.digests is None
    gt.uninstrument()
    monkeypatch.setenv(ENV_DIGESTS, "md5-of-nothing")
    with pytest.raises(graphcheck.GraphcheckError, match="GRAPHCHECK_DIGESTS is 1, on, true.*not 'md5-of-nothing'"):
        gt.instrument(None)


def test_keep_templates_keeps_the_template_walks_it_after_capture_end_then_instantiates(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(False, model=model, keep_templates=True)
    assert ins.keep_templates is True
    g = capture(torch, model)
    assert g.new_keep_graph is True and g.init_keep_graph is True  # both, as on the H200
    # Walked after torch's capture_end (the template exists), instantiated after the walk.
    assert g.calls == [("capture_begin", None), ("capture_end",), ("raw_cuda_graph",), ("instantiate",)]
    assert fake.captured == [g.handle]
    assert [x["name"] for x in ins.manifest()["graphs"]] == ["capture0"]


def test_the_retarget_replay_check_keeps_templates_and_refuses_keep_templates_false(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(False, model=model, verify_on_replay="retarget")
    assert ins.keep_templates is True
    g = capture(torch, model)
    assert g.init_keep_graph is True and ("raw_cuda_graph",) in g.calls
    gt.uninstrument(ins)
    with pytest.raises(graphcheck.GraphcheckError, match=r"^keep_templates=False with verify_on_replay='retarget'"):
        gt.instrument(False, model=model, verify_on_replay="retarget", keep_templates=False)
    with pytest.raises(graphcheck.GraphcheckError, match=r"^keep_templates is True or False, not 1"):
        gt.instrument(False, model=model, keep_templates=1)
    assert torch.cuda.CUDAGraph is FakeCUDAGraph  # refused before torch was patched


def test_templates_are_kept_while_any_live_instrumentation_keeps_them(torch, fake):
    model = make_model(torch)
    a = gt.instrument(False, model=model)
    g1 = capture(torch, model)
    b = gt.instrument(False, model=model, keep_templates=True)
    g2 = capture(torch, model)
    gt.uninstrument(b)
    g3 = capture(torch, model)
    assert [g.init_keep_graph for g in (g1, g2, g3)] == [False, True, False]
    assert a.captures == 3 and b.captures == 1 and not a.errors and not b.errors


def test_a_walk_of_the_open_capture_that_fails_is_reported_and_the_capture_completes(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(False, model=model)
    fake.fail = "the driver said no"
    with pytest.warns(RuntimeWarning, match="a capture was not recorded: the driver said no"):
        g = capture(torch, model)
    assert g.calls == [("capture_begin", None), ("capture_end",), ("instantiate (torch)",)]
    assert ins.captures == 0 and len(ins.errors) == 1
    fake.fail = None
    capture(torch, model)
    assert ins.captures == 1


def test_a_graph_whose_capture_began_before_instrument_is_reported_not_walked(torch, fake):
    model = make_model(torch)
    gt.instrument(False, model=model)
    g = torch.cuda.CUDAGraph()  # made while instrumented, keeps no template
    gt.uninstrument()
    gt.instrument(False, model=model)
    WALKS.next = walked(kernel(0, "gemv", model.proj.weight))
    # Began while the class was patched but no instrumentation was live: no stream noted.
    import graphcheck._instrument.patch as patch

    live = list(patch.ACTIVE)
    patch.ACTIVE.clear()
    g.capture_begin()
    patch.ACTIVE.extend(live)
    with pytest.warns(RuntimeWarning, match="the capture began before instrument"):
        g.capture_end()
    assert live[0].captures == 0 and "instantiate (torch)" in [c[0] for c in g.calls]


def test_retarget_refuses_a_graph_that_kept_no_template(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(False, model=model)
    g = capture(torch, model)
    model.proj.weight = torch.nn.Parameter(model.proj.weight.detach().clone())
    res = gt.retarget(ins.recorder, graphs={"capture0": g})
    assert res.retargeted == ()
    assert "kept no template to patch through" in res.refused["capture0"], res.refused
    assert ("raw_cuda_graph",) not in g.calls


def test_a_graph_made_keeping_its_template_is_instantiated_once_when_captured_after_the_stop(torch, fake):
    """Made while an instrumentation kept templates (keep_graph=True told torch, not asked
    by the caller), captured after it stopped: nobody records it, and graphcheck still
    instantiates it once, as torch would have in capture_end."""
    model = make_model(torch)
    ins = gt.instrument(False, model=model, keep_templates=True)
    g = torch.cuda.CUDAGraph()
    gt.uninstrument(ins)
    WALKS.next = walked(kernel(0, "gemv", model.proj.weight))
    with fake_torch_graph(torch, g):
        pass
    assert g.init_keep_graph is True and made_ready(g)
    assert g.calls == [("capture_begin", None), ("capture_end",), ("instantiate",)]
    assert ins.captures == 0
