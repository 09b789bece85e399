"""Allocation sites on CPU: where PyTorch's memory history is on, the allocator's blocks
carry the frames that allocated them (torch.cuda.memory_snapshot()); graphcheck.torch reads
them once per manifest or snapshot and gives every tensor whose storage lies in a block
its `alloc_site`, so findings, the table and explain name the Python line. The allocator
snapshot is faked here (graphcheck._caching_allocator.memory_segments) with blocks at the addresses of
CPU tensors."""

import pytest

import graphcheck
import graphcheck._caching_allocator
import graphcheck.torch as gt
from conftest import kernel, walked

HOOK = {"filename": "/srv/engine/model_loader.py", "line": 42, "name": "process_weights_after_loading"}
CALLER = {"filename": "/srv/engine/worker.py", "line": 7, "name": "load_model"}
CPP = {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}


def make_model(torch):
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    model.embed_scale = torch.tensor(8.0)  # a plain attribute: unregistered
    return model


def segments_for(blocks):
    """A memory_snapshot() of one segment per (tensor, frames, state)."""
    out = []
    for t, frames, state in blocks:
        s = t.untyped_storage()
        block = {"address": s.data_ptr(), "size": s.nbytes(), "state": state, "frames": frames}
        out.append(
            {
                "address": s.data_ptr(),
                "total_size": s.nbytes(),
                "segment_pool_id": (0, 0),
                "blocks": [block],
            }
        )
    return out


@pytest.fixture
def history(monkeypatch):
    """Sets what the faked allocator snapshot holds; counts the reads."""

    class History:
        segments = []
        reads = 0

    def fake():
        History.reads += 1
        return History.segments

    monkeypatch.setattr(graphcheck._caching_allocator, "memory_segments", fake)
    return History


def record(torch, model):
    rec = gt.Recorder(model)
    rec.add_graph("decode", walked(kernel(0, "scale", model.proj.weight, model.embed_scale)))
    return graphcheck.load(rec.manifest())


def test_findings_table_and_explain_carry_the_allocation_site(torch, history):
    model = make_model(torch)
    history.segments = segments_for(
        [(model.embed_scale, [CPP, HOOK, CALLER], "active_allocated"), (model.proj.weight, [], "active_allocated")]
    )
    manifest = record(torch, model)
    assert history.reads == 1  # one allocator read per manifest
    tensors = {t["id"]: t for t in manifest["tensors"]}
    owner = {o["path"]: tensors[o["tensor"]] for o in manifest["owners"]}
    # Python frames only (the C++ one is dropped), innermost first.
    assert owner["model.embed_scale"]["alloc_site"] == [HOOK, CALLER]
    assert "alloc_site" not in owner["model.proj.weight"]  # a block without frames
    assert "alloc_site" not in owner["model.proj.bias"]  # in no block

    report = graphcheck.verify(manifest)
    (f,) = report.findings
    assert (f.kind, f.subject) == ("unregistered", "model.embed_scale")
    assert f.alloc_site == (HOOK, CALLER)
    assert "allocated at /srv/engine/model_loader.py:42 in process_weights_after_loading" in " ".join(
        str(report).split()
    )
    text = graphcheck.explain(manifest, "model.embed_scale")
    assert "allocated at:" in text and "/srv/engine/model_loader.py:42 in process_weights_after_loading" in text


def test_a_drifted_tensor_points_at_the_hook_that_rebuilt_it(torch, history):
    model = make_model(torch)
    model.register_buffer("w_uv", torch.zeros(4))
    history.segments = segments_for([(model.w_uv, [HOOK], "active_allocated")])
    rec = gt.Recorder(model)
    rec.add_graph("decode", walked(kernel(0, "mla", model.w_uv)))
    manifest = graphcheck.load(rec.manifest())
    old = model.w_uv
    model.w_uv = torch.ones(4)  # rebuilt by the post-load hook, at a new address
    rebuilt = dict(HOOK, line=43)
    history.segments = segments_for([(old, [HOOK], "inactive"), (model.w_uv, [rebuilt], "active_allocated")])
    live = gt.snapshot(model, manifest, format_version=1)
    assert history.reads == 2
    live_site = {o["path"]: live["tensors"][o["tensor"]].get("alloc_site") for o in live["owners"]}
    assert live_site["model.w_uv"] == [rebuilt]
    report = graphcheck.verify(manifest, live)
    drifted = report.of_kind("drifted")
    assert [f.subject for f in drifted] == ["model.w_uv"] and drifted[0].alloc_site == (HOOK,)


def test_without_memory_history_nothing_is_added(torch, history):
    model = make_model(torch)
    history.segments = segments_for([(model.embed_scale, [], "active_allocated")])
    manifest = record(torch, model)
    assert all("alloc_site" not in t for t in manifest["tensors"])


def test_frames_inside_torch_are_skipped_to_the_callers_line(torch, history):
    import os

    model = make_model(torch)
    inside = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "module.py")
    frames = [{"filename": inside, "line": 1097, "name": "<lambda>"}, {"filename": inside, "line": 965, "name": "_apply"}]
    history.segments = segments_for(
        [(model.embed_scale, frames + [CALLER], "active_allocated"), (model.proj.weight, frames, "active_allocated")]
    )
    manifest = record(torch, model)
    owner = {o["path"]: manifest["tensors"][o["tensor"]] for o in manifest["owners"]}
    assert owner["model.embed_scale"]["alloc_site"] == [CALLER]
    # Nothing but torch: its outermost frame stays.
    assert owner["model.proj.weight"]["alloc_site"] == frames[1:]


def test_frames_are_capped(torch, history):
    model = make_model(torch)
    deep = [dict(HOOK, line=i) for i in range(100)]
    history.segments = segments_for([(model.embed_scale, deep, "active_allocated")])
    manifest = record(torch, model)
    sites = [t["alloc_site"] for t in manifest["tensors"] if "alloc_site" in t]
    assert sites == [deep[: gt.ALLOC_SITE_FRAMES]]
