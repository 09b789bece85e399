"""The memory no owner explains, digested at each capture's freeze and looked up by a build
made later (issue 32): with digests, a capture under instrument() no longer builds the
manifest of every graph so far (that made 1,718 captures cost N²), and the digests are
still those of the latest capture. On CPU: the fake CUDAGraph of test_torch_instrument,
and the faked allocator block and host digester of test_unowned_ranges."""

import ctypes

import pytest

import graphcheck
import graphcheck.torch as gt
import test_torch_instrument as ti
from graphcheck import _native
from conftest import fake_unowned_block, kernel, walked
from test_torch_instrument import fake, fake_torch_graph, make_model, replays  # noqa: F401 - fixture


@pytest.fixture
def cache(torch, monkeypatch):
    """A module-global cache no owner reaches, in a faked allocator block of pool (1, 2),
    and a digester of host memory that records what it is asked."""
    cache = torch.randn(64)
    (base, size), calls = fake_unowned_block(monkeypatch, cache)
    return cache, (base, size), calls


def capture(torch, model, *tensors):
    """One capture of a kernel reading the model's weight and ``tensors``, each word with
    the driver allocation the walker reads (the storage)."""
    node = kernel(0, "rope", model.proj.weight, *tensors)
    for word, t in zip(node["words"][1:], tensors):
        s = t.untyped_storage()
        word["allocation"] = [hex(s.data_ptr()), s.nbytes()]
    ti.WALKS.next = walked(node)
    g = torch.cuda.CUDAGraph()
    with fake_torch_graph(torch, g):
        pass
    return g


def instrumented(model):
    ins = gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    ins.recorder.add_pool("rope", kind="weights", sleep="discarded", torch_pool=(1, 2))
    return ins


def stale_subjects(err):
    return sorted(f.subject for f in err.report.of_kind("stale"))


def test_a_capture_with_digests_builds_no_manifest_and_digests_the_unexplained_block(
    torch, fake, cache, monkeypatch
):
    t, block, calls = cache
    model = make_model(torch)
    ins = instrumented(model)
    builds = []
    real = _native.build_manifest
    monkeypatch.setattr(_native, "build_manifest", lambda *a, **k: builds.append(1) or real(*a, **k))
    for _ in range(5):
        capture(torch, model, t)
    assert builds == [], "a capture built the manifest of every graph so far"
    # Each freeze read the block (the contents of then), once.
    assert calls == [[block]] * 5
    m = graphcheck.load(ins.manifest_json())
    assert builds == [1] and len(calls) == 5, "the build looked the digests up"
    assert m["ranges"] == [
        {"addr": hex(block[0]), "size": block[1], "digest": _native.gc128_bytes(ctypes.string_at(*block))}
    ]


def test_an_update_between_two_captures_is_not_stale_and_a_later_loss_is(torch, fake, cache):
    # The review's case against building each graph alone: the digests must be the latest
    # capture's, since the check compares them as of its epoch.
    t, block, _ = cache
    model = make_model(torch)
    instrumented(model)
    g1 = capture(torch, model, t)
    with torch.no_grad():
        t.add_(1)  # the engine writes its cache, saying nothing: no transition
    capture(torch, model)  # a later graph that does not read the cache
    gt.mark_transition("wake", "preserved")
    g1.replay()
    assert replays(g1) == 1
    with torch.no_grad():
        t.fill_(float("nan"))  # lost across the next sleep
    gt.mark_transition("wake", "preserved")
    with pytest.raises(gt.ReplayCheckError) as e:
        g1.replay()
    assert stale_subjects(e.value) == [hex(block[0])]
    assert replays(g1) == 1


def test_a_block_the_freeze_did_not_digest_is_said_and_recorded_without_a_digest(torch, fake, cache, recwarn):
    t, block, calls = cache
    model = make_model(torch)
    ins = instrumented(model)
    capture(torch, model, t)
    ins.recorder._unexplained_seen.clear()  # as if the recorder had not seen it unexplained
    capture(torch, model)
    m = graphcheck.load(ins.manifest_json())
    assert "ranges" not in m
    said = [str(w.message) for w in recwarn if "not digested at the capture" in str(w.message)]
    assert said and f"{hex(block[0])}+{block[1]}" in said[0], said
    assert [f.kind for f in graphcheck.verify(m).findings] == ["unowned"]


def test_memory_in_no_declared_pool_is_not_read_at_the_freeze(torch, fake, cache):
    t, _, calls = cache
    model = make_model(torch)
    gt.instrument(None, model=model, digests=True, verify_on_replay="raise")  # (1, 2) undeclared
    capture(torch, model, t)
    capture(torch, model, t)
    assert calls == []


def test_blocks_holding_finds_the_block_of_each_address_once_in_a_declared_pool():
    from graphcheck._ranges import blocks_holding

    segs = [
        {"address": 0x2000, "total_size": 0x1000, "segment_pool_id": (0, 0), "blocks": [
            {"address": 0x2000, "size": 0x800, "state": "active_allocated"},
            {"address": 0x2800, "size": 0x800, "state": "inactive"},
        ]},
        {"address": 0x1000, "total_size": 0x1000, "segment_pool_id": (1, 2), "blocks": [
            {"address": 0x1000, "size": 0x400, "state": "active_allocated"},
            {"address": 0x1400, "size": 0xC00, "state": "active_pending_free"},
        ]},
    ]
    addrs = [0x1010, 0x1020, 0x1500, 0x2100, 0x2900, 0x3000, 0x10]
    # Bound (1, 2): its two blocks; the default pool's left out, free and outside memory too.
    assert blocks_holding(segs, addrs, [(1, 2)], []) == [(0x1000, 0x400), (0x1400, 0xC00)]
    # A declared range holds 0x2100: its block too; 0x2900 is in a free block.
    assert blocks_holding(segs, addrs, [(1, 2)], [(0x2000, 0x1000)]) == [
        (0x1000, 0x400), (0x1400, 0xC00), (0x2000, 0x800)
    ]
    assert blocks_holding(segs, [], [(1, 2)], []) == []
    assert blocks_holding([], addrs, [(1, 2)], []) == []
