"""torch_memory_saver's regions become pools without the user declaring them (issue 13):
read from the package's state (one MemPool per tag, backup and device), named by tag, and
discarded where a pause keeps no backup. On CPU: the package is a stand-in module with the
state 0.0.10 keeps, and the allocator snapshot is faked with a segment per region (the
real package is run on the GPU in test_tms_gpu.py)."""

import sys
import types
from collections import defaultdict

import pytest

import graphcheck
import graphcheck._caching_allocator
import graphcheck.torch as gt
from conftest import kernel, walked


class Pool:
    def __init__(self, pid):
        self.id = pid


def fake_tms(monkeypatch, regions):
    """A stand-in ``torch_memory_saver`` whose saver holds ``regions`` (key -> MemPool) as
    0.0.10 does: ``torch_memory_saver.torch_memory_saver._impl._mem_pools``, a defaultdict."""
    impl = types.SimpleNamespace(_mem_pools=defaultdict(lambda: Pool((9, 9)), regions))
    saver = types.SimpleNamespace(_impl=impl)
    module = types.ModuleType("torch_memory_saver")
    module.torch_memory_saver = saver
    monkeypatch.setitem(sys.modules, "torch_memory_saver", module)
    return impl


def segment(t, pool_id):
    base, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
    return {
        "address": base,
        "total_size": size,
        "segment_pool_id": pool_id,
        "blocks": [{"address": base, "size": size, "state": "active_allocated"}],
    }


@pytest.fixture
def engine(torch, monkeypatch):
    """SGLang's layout: weights in a region paused with a CPU backup, a persistent state
    (sglang #27140's recurrent state) in the KV-cache region, paused without one."""
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    model.register_buffer("state", torch.full((8,), 3.0))
    impl = fake_tms(
        monkeypatch,
        {
            ("weights", True, False, "pinned", 0): Pool((1, 1)),
            ("kv_cache", False, False, "", 0): Pool((1, 2)),
        },
    )
    segments = [segment(model.proj.weight, (1, 1)), segment(model.proj.bias, (1, 1)),
                segment(model.state, (1, 2))]
    monkeypatch.setattr(graphcheck._caching_allocator, "memory_segments", lambda: segments)
    graph = walked(kernel(0, "step", model.proj.weight, model.proj.bias, model.state))
    return model, impl, graph


def test_regions_are_pools_with_their_sleep_policy(torch, engine):
    model, _, graph = engine
    rec = gt.Recorder(model)
    rec.add_graph("decode_bs8", graph)
    doc = graphcheck.load(rec.manifest())
    pools = {p["name"]: (p["kind"], p["sleep"]) for p in doc["pools"]}
    assert pools["weights"] == ("weights", "restored")
    assert pools["kv_cache"] == ("kv_cache", "discarded")
    report = graphcheck.verify(rec.manifest())
    assert [(f.kind, [o.path for o in f.owners]) for f in report.findings] == [
        ("mispooled", ["model.state"])
    ], report.table
    assert "kv_cache" in report.table


def test_the_snapshot_binds_the_regions_by_itself(torch, engine):
    model, _, graph = engine
    rec = gt.Recorder(model)
    rec.add_graph("decode_bs8", graph)
    manifest = rec.manifest()
    live = graphcheck.load(gt.snapshot(model, manifest, event="resume"))
    ids = {p["name"]: p["id"] for p in graphcheck.load(manifest)["pools"]}
    pooled = {p.get("pool") for p in live["probes"]}
    assert ids["kv_cache"] in pooled and ids["weights"] in pooled, live["probes"]


def test_regions_sharing_a_tag_are_told_apart_and_odd_state_gives_none(torch, monkeypatch):
    fake_tms(
        monkeypatch,
        {
            ("kv_cache", False, False, "", 0): Pool((1, 1)),
            ("kv_cache", True, False, "mmap", 0): Pool((1, 2)),
            ("kv_cache", False, False, "", 1): Pool((1, 3)),
            "not a region key": Pool((1, 4)),
        },
    )
    names = [(n, s) for n, _, s, _ in graphcheck._caching_allocator.tms_pools()]
    assert names == [
        ("kv_cache (no backup)", "discarded"),
        ("kv_cache (cpu backup)", "restored"),
        ("kv_cache (no backup, device 1)", "discarded"),
    ]
    # A package whose state is otherwise (not made yet, renamed) gives no pool.
    for impl in (None, types.SimpleNamespace(), types.SimpleNamespace(_mem_pools=[1])):
        sys.modules["torch_memory_saver"].torch_memory_saver = types.SimpleNamespace(_impl=impl)
        assert graphcheck._caching_allocator.tms_pools() == []
    monkeypatch.delitem(sys.modules, "torch_memory_saver")
    assert graphcheck._caching_allocator.tms_pools() == []
