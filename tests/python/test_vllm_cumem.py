"""vLLM's sleep allocator's tags become pools without the user declaring them (issue 33):
read from ``CuMemAllocator.instance.pointer_to_data`` (allocation base to
``AllocationData(handle=(device, size, base, handle), tag, ...)``), one range per
allocation, so a tensor's pool is the tag of the allocation holding it, whatever
``MemPool`` torch made it in. ``weights`` is restored (backed up at level 1, reloaded at
level 2), every other tag discarded.

On CPU: vLLM is not imported. The stand-in allocator is built from the layout a GPU run
read off the real vLLM 0.24.0 (``fixtures/gpu/vllm_cumem_layout.json``), and the documents
that run wrote with the real allocator are verified again here. The allocator's behaviour
(sleep, wake, what it keeps) is proven on the GPU only (test_vllm_cumem_gpu.py)."""

import dataclasses
import json
import sys
import types
import warnings
from pathlib import Path

import pytest

import graphcheck
import graphcheck._caching_allocator as ca
import graphcheck.torch as gt
from conftest import kernel, walked
from graphcheck._instrument import transitions

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"
LAYOUT = json.loads((FIXTURES / "vllm_cumem_layout.json").read_text())


def test_the_recorded_layout_is_what_the_reader_relies_on():
    """Read off the real allocator on the GPU: if vLLM lays its table out otherwise, this
    fails first (and the reader warns and gives no pools: test below)."""
    assert LAYOUT["vllm"] == "0.24.0"
    assert LAYOUT["allocator"] == ca.CUMEM_MODULE + ".CuMemAllocator"
    assert "pointer_to_data" in LAYOUT["instance_attributes"]
    assert (LAYOUT["pointer_to_data"], LAYOUT["key"]) == ("dict", "int")
    assert LAYOUT["fields"][:2] == ["handle", "tag"]
    assert LAYOUT["handle"] == ["int"] * 4 and LAYOUT["handle_ptr_is_key"]
    assert set(LAYOUT["tags"]) >= {"weights", "kv_cache"}


def stand_in(monkeypatch, table):
    """A stand-in ``vllm.device_allocator.cumem`` holding ``table`` (base -> (tag, size))
    as the recorded layout says vLLM holds it."""
    data = dataclasses.make_dataclass(
        "AllocationData",
        [(name, object, dataclasses.field(default=None)) for name in LAYOUT["fields"]],
    )
    allocator = types.SimpleNamespace(
        **{a: None for a in LAYOUT["instance_attributes"]},
    )
    allocator.pointer_to_data = {
        base: data(handle=(0, size, base, 1000 + i), tag=tag)
        for i, (base, (tag, size)) in enumerate(table.items())
    }

    class CuMemAllocator:
        instance = allocator

        def wake_up(self, tags=None):
            return tags

    module = types.ModuleType(ca.CUMEM_MODULE)
    module.CuMemAllocator = CuMemAllocator
    monkeypatch.setitem(sys.modules, ca.CUMEM_MODULE, module)
    return CuMemAllocator


def storage(t):
    return t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()


@pytest.fixture
def engine(torch, monkeypatch):
    """vLLM's layout: parameters and a plain-attribute constant made under ``weights``, a
    persistent buffer under ``kv_cache``. Every segment is in one allocator pool: the tags
    come from the allocator's table, not from torch's pool ids."""
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    model.scale = torch.full((4,), 0.5)  # a plain attribute (Gemma3n's embed_scale)
    model.register_buffer("state", torch.full((8,), 3.0))
    tags = {"weights": [model.proj.weight, model.proj.bias, model.scale], "kv_cache": [model.state]}
    table = {storage(t)[0]: (tag, storage(t)[1]) for tag, ts in tags.items() for t in ts}
    cls = stand_in(monkeypatch, table)
    segments = [
        {
            "address": base,
            "total_size": size,
            "segment_pool_id": (7, 7),
            "blocks": [{"address": base, "size": size, "state": "active_allocated"}],
        }
        for base, (_, size) in table.items()
    ]
    monkeypatch.setattr(ca, "memory_segments", lambda: segments)
    graph = walked(kernel(0, "step", model.proj.weight, model.proj.bias, model.scale, model.state))
    return model, cls, graph


def test_tags_are_pools_with_vllms_sleep_policy(torch, engine):
    model, _, graph = engine
    rec = gt.Recorder(model)
    rec.add_graph("decode_bs8", graph)
    doc = graphcheck.load(rec.manifest())
    pools = {p["name"]: (p["kind"], p["sleep"]) for p in doc["pools"]}
    assert pools["weights"] == ("weights", "restored")
    assert pools["kv_cache"] == ("kv_cache", "discarded")
    by_path = {o["path"]: doc["tensors"][o["tensor"]]["pool"] for o in doc["owners"]}
    names = {p["id"]: p["name"] for p in doc["pools"]}
    assert {path: names[pid] for path, pid in by_path.items()} == {
        "model.proj.weight": "weights",
        "model.proj.bias": "weights",
        "model.scale": "weights",
        "model.state": "kv_cache",
    }
    report = graphcheck.verify(rec.manifest())
    assert sorted((f.kind, [o.path for o in f.owners]) for f in report.findings) == [
        ("mispooled", ["model.state"]),
        ("unregistered", ["model.scale"]),
    ], report.table


def test_the_snapshot_takes_each_address_s_tag_by_its_range(torch, engine):
    model, _, graph = engine
    rec = gt.Recorder(model)
    rec.add_graph("decode_bs8", graph)
    manifest = rec.manifest()
    ids = {p["name"]: p["id"] for p in graphcheck.load(manifest)["pools"]}
    live = graphcheck.load(gt.snapshot(model, manifest, event="wake_up"))
    pool_of = {p["addr"]: p.get("pool") for p in live["probes"]}
    want = {hex(storage(t)[0]): ids["weights"] for t in (model.proj.weight, model.proj.bias, model.scale)}
    want[hex(storage(model.state)[0])] = ids["kv_cache"]
    assert {a: pool_of.get(a) for a in want} == want, live["probes"]


def test_a_range_wins_over_a_declared_binding_of_its_segment_on_both_sides(torch, monkeypatch):
    """The caller binds the segments' allocator pool (7, 7) to a pool of its own; vLLM's
    table still says which allocation is under which tag, at capture and after, alike,
    also where its allocation is larger than torch's segment (vLLM maps rounded-up sizes)."""
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    held = torch.zeros(8 + 2048)  # the allocation; the segment torch reports is its head
    model.register_buffer("state", held[:8])
    base, size = storage(held)
    stand_in(monkeypatch, {base: ("kv_cache", size)})

    def seg(b, n):
        return {"address": b, "total_size": n, "segment_pool_id": (7, 7),
                "blocks": [{"address": b, "size": n, "state": "active_allocated"}]}

    segments = [seg(*storage(model.proj.weight)), seg(*storage(model.proj.bias)), seg(base, 32)]
    monkeypatch.setattr(ca, "memory_segments", lambda: segments)
    graph = walked(kernel(0, "step", model.proj.weight, model.proj.bias, model.state))
    rec = gt.Recorder(model)
    rec.add_pool("model", kind="other", torch_pool=(7, 7))
    rec.add_graph("decode_bs8", graph)
    manifest = rec.manifest()
    doc = graphcheck.load(manifest)
    names = {p["id"]: p["name"] for p in doc["pools"]}
    at_capture = {o["path"]: names[doc["tensors"][o["tensor"]]["pool"]] for o in doc["owners"]}
    assert at_capture == {"model.proj.weight": "model", "model.proj.bias": "model", "model.state": "kv_cache"}
    assert ("mispooled", ["model.state"]) in [
        (f.kind, [o.path for o in f.owners]) for f in graphcheck.verify(manifest).findings
    ]
    live = graphcheck.load(gt.snapshot(model, manifest, event="wake_up", pools={(7, 7): "model"}))
    pool_of = {p["addr"]: names[p["pool"]] for p in live["probes"] if p.get("pool") is not None}
    assert pool_of[hex(base)] == "kv_cache"
    assert pool_of[hex(storage(model.proj.weight)[0])] == "model"


def test_allocations_made_after_the_first_capture_are_read_at_the_next(torch, engine, monkeypatch):
    """The table is read at each manifest: an allocation made under a tag later (the KV
    cache, made after the weights) lands in the tag's pool."""
    model, _, graph = engine
    rec = gt.Recorder(model)
    rec.add_graph("decode_bs8", graph)
    rec.manifest()
    model.register_buffer("later", torch.zeros(16))
    base, size = storage(model.later)
    table = sys.modules[ca.CUMEM_MODULE].CuMemAllocator.instance.pointer_to_data
    table[base] = type(next(iter(table.values())))(handle=(0, size, base, 9), tag="kv_cache")
    segments = ca.memory_segments() + [
        {"address": base, "total_size": size, "segment_pool_id": (7, 7),
         "blocks": [{"address": base, "size": size, "state": "active_allocated"}]}
    ]
    monkeypatch.setattr(ca, "memory_segments", lambda: segments)
    rec.rewalk()
    rec.add_graph("decode_bs16", walked(kernel(0, "step", model.proj.weight, model.later)))
    report = graphcheck.verify(rec.manifest())
    assert ("mispooled", ["model.later"]) in [(f.kind, [o.path for o in f.owners]) for f in report.findings]


def test_a_table_laid_out_otherwise_warns_and_gives_no_pool(torch, monkeypatch):
    cls = stand_in(monkeypatch, {0x7000: ("weights", 4096)})
    assert ca.cumem_regions() == [("weights", "weights", "restored", [(0x7000, 4096)])]
    table = cls.instance.pointer_to_data
    bad = [
        {0x7000: types.SimpleNamespace(handle=(0, 4096, 0x8000, 1), tag="weights")},  # base != key
        {0x7000: types.SimpleNamespace(handle=(0, 4096, 0x7000), tag="weights")},  # 3 fields
        {0x7000: types.SimpleNamespace(handle=(0, 4096, 0x7000, 1), tag=None)},
        [(0x7000, "weights")],
    ]
    for odd in bad:
        cls.instance.pointer_to_data = odd
        with pytest.warns(RuntimeWarning, match="CuMemAllocator reads otherwise than vLLM 0.24.0"):
            assert ca.cumem_regions() == []
    cls.instance.pointer_to_data = table
    # No allocator made yet, or vLLM not imported: none, silently, and vLLM stays unimported.
    cls.instance = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ca.cumem_regions() == []
        monkeypatch.delitem(sys.modules, ca.CUMEM_MODULE)
        assert ca.cumem_regions() == []
    assert ca.CUMEM_MODULE not in sys.modules


def test_a_wake_up_is_a_transition_the_replay_check_sees(torch, monkeypatch):
    cls = stand_in(monkeypatch, {0x7000: ("weights", 4096)})
    patched: list = []
    before = transitions.epoch()
    try:
        transitions.patch(patched)
        assert getattr(cls.wake_up, "_graphcheck_transition", False)
        assert cls().wake_up(["weights"]) == ["weights"]
        assert transitions.epoch() == before + 1
        assert transitions.latest()[1:] == ("vllm CuMemAllocator.wake_up(['weights'])", "preserved")
        # vLLM's worker passes tags by keyword; a wake of every tag passes none.
        assert cls().wake_up(tags=["kv_cache"]) == ["kv_cache"]
        assert transitions.latest()[1] == "vllm CuMemAllocator.wake_up(['kv_cache'])"
        cls().wake_up()
        assert transitions.latest()[1] == "vllm CuMemAllocator.wake_up(None)"
        assert transitions.epoch() == before + 3
        transitions.patch(patched)  # patched once: a second patch wraps nothing
        cls().wake_up()
        assert transitions.epoch() == before + 4
    finally:
        for owner, attr, original, _ in reversed(patched):
            setattr(owner, attr, original)


@pytest.mark.parametrize("level", [1, 2])
def test_the_gpu_documents_verify_as_they_did_there(level):
    """The real allocator's documents (fixtures/gpu/README.md says how they were made)."""
    manifest = FIXTURES / f"vllm_cumem_l{level}_manifest.json"
    live = FIXTURES / f"vllm_cumem_l{level}_live.json"
    assert "vLLM 0.24.0" in json.loads(manifest.read_text())["producer"]["framework"]
    at_capture = graphcheck.verify(str(manifest))
    assert sorted({(f.kind, o.path) for f in at_capture.findings for o in f.owners}) == [
        ("mispooled", "model.state"),
        ("unregistered", "model.scale"),
    ], at_capture.table
    after = graphcheck.verify(str(manifest), str(live))
    stale = {o.path for f in after.findings if f.kind == "stale" for o in f.owners}
    assert "model.state" in stale, after.table
    assert ("model.scale" in stale) == (level == 2), after.table
    assert not [o.path for f in after.findings for o in f.owners if o.path.startswith("model.proj")]
    graphs = {g for f in after.findings if f.kind == "stale" for g in f.graphs}
    assert graphs == ({"state", "const"} if level == 2 else {"state"}), after.table
