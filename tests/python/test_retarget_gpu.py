"""Retarget instead of recapture on a real GPU (issue 29): a graph captured with torch
(``keep_graph=True``) reads a plain-attribute tensor that is then rebuilt at a new address
(the old one kept alive, so the graph still reads it); the replay is wrong; after
``graphcheck.torch.retarget`` patched the graph in place (template and executable graph),
the replay equals eager, a new walk of the template reads the new address, and the
manifest after applying verifies clean against a new snapshot. Also a memset node (torch
2.11 lowers ``zero_``/``fill_`` to kernels, so the memset is captured through the driver's
``cuMemsetD32Async`` on torch's stream). Opt-in (GRAPHCHECK_GPU_TESTS=1).
"""

import ctypes
import struct

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck import _native
from conftest import warm_up

N = 1 << 14


def walked_addrs(g):
    """Every address word a new walk of the graph's template reads."""
    import json

    w = json.loads(_native.walk_graph(g.raw_cuda_graph()))
    return {int(str(word["addr"]), 0) if isinstance(word["addr"], str) else word["addr"]
            for n in w["nodes"] for word in n["words"]}


def live_findings(report):
    """The findings only a live snapshot gives (a plain attribute's ``unregistered`` is a
    capture-time one, no retarget's to fix)."""
    return [(f.kind, f.subject) for f in report.findings if f.kind in _native.LIVE_KINDS]


def capture(torch, model, name, step, x):
    warm_up(torch, step)
    rec = gt.Recorder(model)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, recorder=rec, name=name, inputs={"x": x}):
        out = step()
    return rec, g, out


def test_a_plain_attribute_rebuilt_at_a_new_address_is_retargeted(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.scale = torch.full((N,), 2.0, device="cuda")  # a plain attribute, not a buffer
    x = torch.randn(N, device="cuda")

    def step():
        return x * model.scale

    rec, g, out = capture(torch, model, "decode", step, x)
    old = model.scale
    model.scale = torch.full((N,), 3.0, device="cuda")  # rebuilt; the old one kept alive
    assert model.scale.data_ptr() != old.data_ptr()
    g.replay()
    torch.cuda.synchronize()
    before = (out - step()).abs().max().item()
    assert before > 0.5, before  # the graph still reads the old tensor

    res = gt.retarget(rec, graphs={"decode": g})
    print(res.plan, res.outcomes)
    assert res.retargeted == ("decode",), (res.refused, res.plan)
    assert res.ok and res.outcomes["decode"]["edits"] >= 1
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, step()), (out - step()).abs().max().item()
    # The template was patched too: a new walk reads the new address, not the old.
    addrs = walked_addrs(g)
    assert model.scale.data_ptr() in addrs and old.data_ptr() not in addrs
    # The manifest after applying describes the patched graph.
    live = gt.snapshot(None, res.manifest, roots=rec.roots())
    report = graphcheck.verify(res.manifest, live)
    assert live_findings(report) == [], report.table
    # The recorder describes the patched graph from now on: walked again, its manifest
    # verifies clean against a snapshot of its own addresses; the retarget is noted.
    now = rec.manifest()
    assert live_findings(graphcheck.verify(now, gt.snapshot(None, now, roots=rec.roots()))) == []
    assert [r["graphs"] for r in rec.retargets] == [["decode"]] and rec.retargets[0]["edits"] >= 1
    (g_doc,) = graphcheck.load(now)["graphs"]
    assert [r["edits"] for r in g_doc["retargets"]] == [rec.retargets[0]["edits"]], g_doc.get("retargets")


def test_a_memset_node_follows_its_rebuilt_buffer(cuda):
    torch = cuda
    libcuda = ctypes.CDLL("libcuda.so.1")
    libcuda.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    three = struct.unpack("<I", struct.pack("<f", 3.0))[0]
    model = torch.nn.Module()
    model.acc = torch.zeros(N, device="cuda")  # a plain attribute
    x = torch.randn(N, device="cuda")

    def step():
        stream = torch.cuda.current_stream().cuda_stream
        assert libcuda.cuMemsetD32Async(model.acc.data_ptr(), three, N, stream) == 0
        return x * model.acc

    rec, g, out = capture(torch, model, "fill", step, x)
    kinds = {n["kind"] for gr in graphcheck.load(rec.manifest())["graphs"] for n in gr["nodes"]}
    assert "memset" in kinds, kinds
    old = model.acc
    model.acc = torch.zeros(N, device="cuda")
    g.replay()
    torch.cuda.synchronize()
    assert int(model.acc.count_nonzero()) == 0  # the graph filled the old buffer
    assert torch.equal(old, torch.full_like(old, 3.0))

    res = gt.retarget(rec, graphs={"fill": g})
    print(res.plan, res.outcomes)
    assert res.retargeted == ("fill",), (res.refused, res.plan)
    edited = {e["node_kind"] for gp in res.plan["graphs"] for e in gp.get("edits", [])}
    assert {"memset", "kernel"} <= edited, edited
    old.zero_()
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(model.acc, torch.full_like(model.acc, 3.0))
    assert int(old.count_nonzero()) == 0  # the old buffer is no longer written
    assert torch.equal(out, x * 3.0)


def test_verify_on_replay_retarget_patches_the_graph_before_its_replay(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(N, N, bias=False, device="cuda")
    model.scale = torch.full((N,), 2.0, device="cuda")  # a plain attribute
    x = torch.randn(4, N, device="cuda")

    def step():
        return model.proj(x) * model.scale

    ins = gt.instrument(None, model=model, name="decode", verify_on_replay="retarget")
    try:
        warm_up(torch, step)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            y = step()
        g.replay()
        old = model.scale
        model.scale = torch.full((N,), 3.0, device="cuda")  # rebuilt at a new address
        gt.mark_transition("reload_weights() (scale rebuilt)", "updated")
        g.replay()  # checked first: retargeted, then replayed
        torch.cuda.synchronize()
        with torch.no_grad():
            assert torch.equal(y, step()), (y - step()).abs().max().item()
        assert [r["graphs"] for r in ins.recorder.retargets] == [["decode"]]
        # The next check reads the patched graph: nothing moved, nothing refused.
        gt.mark_transition("wake (nothing moved)", "preserved")
        g.replay()
        torch.cuda.synchronize()
        assert ins.errors == []
        # A reshape cannot be retargeted: refused before the kernels run, saying why.
        with torch.no_grad():
            model.proj.weight.data = model.proj.weight.data.t()
        gt.mark_transition("reload_weights() (weight respecified)", "updated")
        with pytest.raises(gt.ReplayCheckError, match="retarget plan refuses it"):
            g.replay()
        del old
    finally:
        gt.uninstrument(ins)
