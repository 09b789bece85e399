"""instrument() when something else goes wrong around it (CPU, the fake CUDAGraph of
test_torch_instrument): two instrumentations writing into one directory, a
load_state_dict that raises after copying, a strict instrumentation whose recording
fails beside others, and an uninstrument after something else replaced what the patch
installed."""

import json
import os
import sys

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck._instrument import transitions
from conftest import kernel, walked
from test_torch_instrument import (  # noqa: F401 - fixture
    FakeCUDAGraph,
    capture,
    fake,
    fake_torch_graph,
    made_ready,
    make_model,
    replays,
)


def graph_names(path):
    with open(path) as f:
        return [g["name"] for g in json.load(f)["graphs"]]


# -- two instrumentations, one directory ----------------------------------------------------


def test_two_instrumentations_in_one_directory_write_two_manifests(torch, fake, tmp_path):
    # Regression: both wrote <dir>/graphcheck-0-<pid>.json, each over the other's.
    model = make_model(torch)
    a = gt.instrument(tmp_path, model=model, name="a{index}")
    b = gt.instrument(tmp_path, model=model, name="b{index}")
    with pytest.warns(RuntimeWarning, match="an earlier instrumentation of this process has its manifest in"):
        capture(torch, model)
        capture(torch, model)
    a.flush()
    b.flush()
    first = tmp_path / f"graphcheck-0-{os.getpid()}.json"  # the first keeps the name
    second = tmp_path / "instrumentation-2" / f"graphcheck-0-{os.getpid()}.json"
    assert (a.path, b.path) == (str(first), str(second))
    assert graph_names(first) == ["a0", "a1"]
    assert graph_names(second) == ["b0", "b1"]
    # `verify DIR` takes one manifest per rank: each folder is one run, its live snapshot
    # verified against its own manifest.
    model.proj.weight = torch.nn.Parameter(model.proj.weight.detach().clone())  # drifted
    for folder, ins in ((tmp_path, a), (tmp_path / "instrumentation-2", b)):
        live = gt.snapshot(model, ins.manifest())
        (folder / f"live-0-{os.getpid()}.json").write_text(json.dumps(live))
        report = graphcheck.verify(folder)
        assert report.world_size == 1 and [p.rank for p in report.ranks] == [0]
        (drifted,) = report.of_kind("drifted")
        assert [o.path for o in drifted.owners] == ["model.proj.weight"], report.table
        assert sorted(drifted.graphs) == graph_names(ins.path), report.table


def test_an_instrumentation_stopped_before_keeps_its_manifest(torch, fake, tmp_path):
    model = make_model(torch)
    with gt.instrument(tmp_path, model=model, name="early{index}") as early:
        capture(torch, model)
    later = gt.instrument(tmp_path, model=model, name="late{index}")
    with pytest.warns(RuntimeWarning, match="instrumentation-2"):
        capture(torch, model)
    later.flush()
    assert graph_names(early.path) == ["early0"]
    assert graph_names(later.path) == ["late0"]
    # Another directory is another folder's first.
    other = gt.instrument(tmp_path / "other", model=model)
    capture(torch, model)
    other.flush()
    assert other.path == str(tmp_path / "other" / f"graphcheck-0-{os.getpid()}.json")


# -- a transition that raises -------------------------------------------------------------


def new_weights(model):
    return {k: v.detach().clone() + 1 for k, v in model.state_dict().items()}


def test_a_load_state_dict_that_raises_after_copying_marks_what_it_wrote(torch, fake):
    # Regression: strict=True copies every key it has, then raises for the missing one;
    # the wrapper marked nothing, so the next replay was not checked at all.
    model = make_model(torch)
    gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    g = capture(torch, model)
    with torch.no_grad():
        model.embed_scale.zero_()  # a constant no reload restores, lost meanwhile
    weights = new_weights(model)
    del weights["proj.bias"]
    before = transitions.epoch()
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"proj.bias\"") as e:
        model.load_state_dict(weights)
    assert type(e.value) is RuntimeError  # torch's own, unchanged
    assert e.value.__cause__ is None and e.value.__context__ is None
    assert torch.equal(model.proj.weight, weights["proj.weight"])  # it was copied
    assert transitions.epoch() == before + 1
    assert transitions.latest()[1:] == ("Module.load_state_dict", "updated")
    # What it wrote is named: the new weight is no finding, the rest is still compared.
    assert transitions.rewritten_since(before) == transitions._storages("written", model.proj.weight)
    with pytest.raises(gt.ReplayCheckError) as refused:
        g.replay()
    stale = sorted(o.path for f in refused.value.report.of_kind("stale") for o in f.owners)
    assert stale == ["model.embed_scale"]
    assert replays(g) == 0


def test_a_size_mismatch_is_not_named_written(torch, fake):
    model = make_model(torch)
    gt.instrument(None, model=model, verify_on_replay="raise")
    capture(torch, model)
    weights = new_weights(model)
    weights["proj.weight"] = torch.zeros(5, 4)  # torch copies the bias only, then raises
    before = transitions.epoch()
    with pytest.raises(RuntimeError, match="size mismatch for proj.weight"):
        model.load_state_dict(weights)
    assert transitions.rewritten_since(before) == transitions._storages("written", model.proj.bias)


# -- strict, beside other instrumentations ------------------------------------------------


def fail_recording(monkeypatch, ins, message):
    def broken(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(ins.recorder, "add_graph", broken)


def test_a_strict_failure_does_not_keep_the_capture_from_the_others(torch, fake):
    # Regression: the first strict instrumentation to raise stopped the loop; the ones
    # after it never saw the capture.
    model = make_model(torch)
    a = gt.instrument(model=model, strict=True)
    b = gt.instrument(model=model, strict=True)
    c = gt.instrument(model=model)
    with pytest.MonkeyPatch.context() as mp:
        fail_recording(mp, a, "a broke")
        fake.next = walked(kernel(0, "gemv", model.proj.weight))
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="^a broke$"):
            with fake_torch_graph(torch, g):
                pass
    assert made_ready(g)
    assert (a.captures, b.captures, c.captures) == (0, 1, 1)
    assert a.errors == b.errors == c.errors == []


def test_every_strict_failure_is_raised_or_kept(torch, fake):
    model = make_model(torch)
    a = gt.instrument(model=model, strict=True)
    b = gt.instrument(model=model, strict=True)
    c = gt.instrument(model=model)
    with pytest.MonkeyPatch.context() as mp:
        fail_recording(mp, a, "a broke")
        fail_recording(mp, b, "b broke")
        with pytest.warns(RuntimeWarning, match=r"b broke \(not raised: another instrumentation's error was, RuntimeError: a broke\)"):
            with pytest.raises(RuntimeError, match="^a broke") as e:
                capture(torch, model)
    assert a.errors == [] and [str(x) for x in b.errors] == ["b broke"]
    assert c.captures == 1 and c.errors == []
    if sys.version_info >= (3, 11):
        assert e.value.__notes__ == [
            "graphcheck: another instrumentation failed at this capture too (kept in its "
            "errors): RuntimeError: b broke"
        ]


def test_a_failed_walk_reaches_every_instrumentation_and_is_raised_once(torch, fake):
    model = make_model(torch)
    a = gt.instrument(model=model, strict=True)
    b = gt.instrument(model=model, strict=True)
    c = gt.instrument(model=model)
    fake.fail = "no CUDA driver"
    with pytest.warns(RuntimeWarning, match="no CUDA driver") as shown:
        with pytest.raises(graphcheck.GraphcheckError, match="no CUDA driver") as e:
            capture(torch, model)
    assert a.errors == b.errors == []  # raised: one error, once
    assert c.errors == [e.value]  # the one that is not strict kept it, as always
    assert len(shown) == 1
    assert getattr(e.value, "__notes__", []) == []


# -- uninstrument after something else replaced the patch ----------------------------------


def test_uninstrument_leaves_what_something_else_put_there_and_says_so(torch, fake):
    # Regression: uninstrument put the original back over whatever had replaced the patch.
    original_load = torch.nn.Module.load_state_dict
    ins = gt.instrument(verify_on_replay="raise")
    patched = torch.cuda.CUDAGraph

    class TheirGraph(FakeCUDAGraph):
        pass

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "CUDAGraph", TheirGraph)
        with pytest.warns(RuntimeWarning) as shown:
            gt.uninstrument(ins)
        assert torch.cuda.CUDAGraph is TheirGraph  # left as it is
    assert torch.cuda.graphs.CUDAGraph is FakeCUDAGraph  # still ours there: restored
    assert torch.nn.Module.load_state_dict is original_load
    assert [str(w.message) for w in shown] == [
        "graphcheck: uninstrument() left torch.cuda.CUDAGraph as it is: it holds "
        f"{__name__}.test_uninstrument_leaves_what_something_else_put_there_and_says_so."
        "<locals>.TheirGraph, not what graphcheck installed there; something replaced it "
        "since, and putting back the original (test_torch_instrument.FakeCUDAGraph) would "
        "undo that"
    ]
    assert patched is not TheirGraph


def test_uninstrument_leaves_a_method_wrapped_since(torch, fake):
    ins = gt.instrument(verify_on_replay="raise")
    ours = torch.nn.Module.__dict__["load_state_dict"]

    def theirs(self, *args, **kwargs):
        return ours(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.Module, "load_state_dict", theirs)
        with pytest.warns(RuntimeWarning, match=r"left torch\.nn\.modules\.module\.Module\.load_state_dict as it is: it holds .*theirs"):
            gt.uninstrument(ins)
        assert torch.nn.Module.__dict__["load_state_dict"] is theirs
    assert torch.cuda.CUDAGraph is FakeCUDAGraph


def test_the_patch_put_back_by_someone_else_goes_at_the_next_uninstrument(torch, fake):
    # Regression: a test's monkeypatch over the patch, undone after an uninstrument left it,
    # put graphcheck's class back; the next instrument() took it as its own without
    # recording it, so no uninstrument could restore torch's class again.
    model = make_model(torch)
    ins = gt.instrument(model=model)
    ours = torch.cuda.CUDAGraph

    class TheirGraph(FakeCUDAGraph):
        pass

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "CUDAGraph", TheirGraph)
        with pytest.warns(RuntimeWarning, match="left torch.cuda.CUDAGraph as it is"):
            gt.uninstrument(ins)
    assert torch.cuda.CUDAGraph is ours  # the monkeypatch's undo put ours back
    again = gt.instrument(model=model)
    capture(torch, model)
    assert again.captures == 1
    gt.uninstrument(again)
    assert torch.cuda.CUDAGraph is FakeCUDAGraph


def test_a_class_derived_from_the_patch_left_in_place_is_not_patched_again(torch, fake):
    model = make_model(torch)
    ins = gt.instrument(model=model)

    class Derived(torch.cuda.CUDAGraph):  # another tool's subclass of the patched class
        pass

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "CUDAGraph", Derived)
        with pytest.warns(RuntimeWarning, match="left torch.cuda.CUDAGraph as it is"):
            gt.uninstrument(ins)
        again = gt.instrument(model=model)
        assert torch.cuda.CUDAGraph is Derived  # it records already: not wrapped twice
        capture(torch, model)
        assert again.captures == 1
        gt.uninstrument(again)
