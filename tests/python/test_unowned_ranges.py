"""Digests of the memory graphs read that no owner explains (issue 14): with digests on, the
allocator block holding an `unowned` address is digested into the manifest's `ranges`, again
into the snapshot's, and contents lost there across an event that preserves them are
`stale`. On CPU: the allocator snapshot is faked (graphcheck._caching_allocator.memory_segments)
with a block at a CPU tensor no owner reaches, and the range digester reads the bytes where
they are (the GPU path, `_native.digest_ranges`, is tested in test_digest_gpu.py)."""

import ctypes
import re

import pytest

import graphcheck
import graphcheck._caching_allocator
import graphcheck._digest
import graphcheck.torch as gt
from graphcheck import _native
from conftest import fake_unowned_block, kernel, walked


@pytest.fixture
def cache_setup(torch, monkeypatch):
    """A model, a module-global cache no owner reaches in a faked allocator block (and a
    driver allocation the walk saw), and a digester of host memory that counts its calls."""
    model = torch.nn.Linear(4, 4)
    cache = torch.randn(64)  # a module-global cos/sin cache
    (base, size), calls = fake_unowned_block(monkeypatch, cache)
    node = kernel(0, "rope", model.weight, cache)
    node["words"][1]["allocation"] = [hex(base), size]
    return model, cache, walked(node), (base, size), calls


def record(model, graph, digests, *, pool=(1, 2)):
    """The manifest of one graph; ``pool``: the allocator pool the faked segment is declared
    as (a pool sleep discards), or ``None`` for torch's default pool."""
    rec = gt.Recorder(model, digests=digests)
    if pool is not None:
        rec.add_pool("rope", kind="weights", sleep="discarded", torch_pool=pool)
    rec.add_graph("decode_bs1", graph)
    return rec.manifest()


def test_a_cache_no_owner_explains_is_digested_and_stale_when_its_contents_are_lost(torch, cache_setup):
    model, cache, graph, (base, size), calls = cache_setup
    manifest = record(model, graph, True)
    doc = graphcheck.load(manifest)
    assert doc["ranges"] == [
        {"addr": hex(base), "size": size, "digest": _native.gc128_bytes(ctypes.string_at(base, size))}
    ]
    assert calls == [[(base, size)]]
    # At capture: unowned, as before.
    assert [f.kind for f in graphcheck.verify(manifest).findings] == ["unowned"]
    # Unchanged: no live finding beside it.
    live = gt.snapshot(model, manifest, event="sleep(level=2) + wake", digests=True)
    assert graphcheck.load(live)["ranges"] == doc["ranges"]
    assert [f.kind for f in graphcheck.verify(manifest, live).findings] == ["unowned"]
    # Sleep discarded it; wake mapped fresh memory at the same address (the NaN).
    with torch.no_grad():
        cache.fill_(float("nan"))
    live = gt.snapshot(model, manifest, event="sleep(level=2) + wake", digests=True)
    report = graphcheck.verify(manifest, live)
    stale = [f for f in report.findings if f.kind == "stale"]
    assert len(stale) == 1, str(report)
    assert stale[0].subject == hex(base) and stale[0].owners == ()
    assert stale[0].graphs == ("decode_bs1",)
    assert "changed across `sleep(level=2) + wake`" in stale[0].detail
    # New weights may change anything: not stale.
    live = gt.snapshot(model, manifest, event="reload", contents="updated", digests=True)
    assert "stale" not in [f.kind for f in graphcheck.verify(manifest, live).findings]


def test_memory_of_no_declared_pool_is_not_digested(torch, cache_setup):
    # torch's default pool holds scratch graphs write at every replay (cuBLAS's workspace),
    # and no sleep releases it: digested, it would be `stale` on every clean run.
    model, cache, graph, _, calls = cache_setup
    manifest = record(model, graph, True, pool=None)
    assert "ranges" not in graphcheck.load(manifest)
    assert calls == []
    assert [f.kind for f in graphcheck.verify(manifest).findings] == ["unowned"]


def test_without_digests_nothing_is_read(torch, cache_setup):
    model, cache, graph, _, calls = cache_setup
    manifest = record(model, graph, False)
    assert "ranges" not in graphcheck.load(manifest)
    gt.snapshot(model, manifest, digests=True)
    assert calls == []


def test_a_range_the_digester_cannot_read_is_left_out(torch, cache_setup, monkeypatch):
    model, cache, graph, _, _ = cache_setup
    monkeypatch.setattr(graphcheck._digest, "range_digests", lambda ranges: [None] * len(ranges))
    manifest = record(model, graph, True)
    assert "ranges" not in graphcheck.load(manifest)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda ranges: [], "returned 0 digests for 1 ranges"),
        (lambda ranges: ["deadbeef"], "is not `<algorithm>:<hex>`"),
        (lambda ranges: [7], "returns a list of digests"),
    ],
)
def test_a_digester_that_breaks_its_contract_is_a_clear_error(torch, cache_setup, monkeypatch, bad, message):
    model, cache, graph, _, _ = cache_setup
    monkeypatch.setattr(graphcheck._digest, "range_digests", bad)
    with pytest.raises(graphcheck.GraphcheckError, match="ranges: .*" + re.escape(message)):
        record(model, graph, True)
def test_a_verify_after_a_kept_snapshot_reports_what_one_parsing_again_does(torch, cache_setup):
    """The replay check's snapshot keeps the manifest it parsed with the Text (issue 32: the
    manifest is parsed once for all the checks until the next capture, not twice a check):
    every later snapshot and verify of that Text takes it, and reports what a parse again
    does, whatever the live model holds at each."""
    from graphcheck._snapshot import live_text

    import json

    model, cache, graph, _, _ = cache_setup
    text = json.dumps(record(model, graph, True))
    manifest = _native.Text(text)
    assert not manifest.parsed
    saved = cache.clone()
    for lost in (True, True, False):  # later checks take the parse the first one kept
        with torch.no_grad():
            cache.copy_(torch.full_like(cache, float("nan")) if lost else saved)
        live = live_text(model, manifest, event="wake", digests=True, _keep_parsed=True)
        assert manifest.parsed
        kept = graphcheck.verify(manifest, _native.Text(live))
        again = graphcheck.verify(text, live)
        assert sorted(f.kind for f in kept.findings) == (["stale", "unowned"] if lost else ["unowned"])
        assert kept.json == again.json and kept.table == again.table
    # Another Text of the same bytes holds no parse: its verify parses its own.
    other = _native.Text(text)
    assert not other.parsed
    assert graphcheck.verify(other, _native.Text(live)).json == again.json
    assert not other.parsed, "a verify keeps nothing: only a snapshot asked to does"
