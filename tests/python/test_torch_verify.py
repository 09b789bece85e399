"""Registry → manifest → snapshot → verify end to end, on CPU tensors: walked graphs are
written by hand with the data pointers of real tensors (what the CUDA walker reads from
kernel parameters), so everything but the walker itself is the real path."""

import json

import pytest

import graphcheck
import graphcheck.torch as gt
from conftest import kernel, walked


class Kernel:
    """A kernel object holding a workspace as a plain attribute (Marlin-style)."""

    def __init__(self, torch):
        self.workspace = torch.zeros(64, dtype=torch.int32)


class QuantMethod:
    def __init__(self, torch):
        self.kernel = Kernel(torch)
        self.w_scale = torch.ones(4)

    def persistent_tensors(self):
        return {"w_scale": self.w_scale}


def make_model(torch):
    torch.manual_seed(0)
    model = torch.nn.Module()
    layer = torch.nn.Module()
    layer.proj = torch.nn.Linear(8, 8)
    layer.register_buffer("cos", torch.randn(16), persistent=False)
    layer.quant_method = QuantMethod(torch)
    layer.embed_scale = torch.tensor(8.0)  # a plain attribute (Gemma3n-style)
    model.layers = torch.nn.ModuleList([layer])
    return model


def record(torch, model, *, digests=False, extra_nodes=()):
    """A manifest of one graph reading the registered tensors (and ``extra_nodes``)."""
    layer = model.layers[0]
    rec = gt.Recorder(model, digests=digests)
    rec.add_pool("graph", kind="graph")
    nodes = [
        kernel(0, "gemv", layer.proj.weight, layer.proj.bias, layer.quant_method.w_scale),
        kernel(1, "rope", layer.cos),
        *extra_nodes,
    ]
    rec.add_graph("decode_bs1", walked(*nodes), pool="graph")
    return graphcheck.load(rec.manifest())


def kinds(report):
    return [(f.kind, f.subject) for f in report.findings]


def test_clean_capture_and_snapshot(torch):
    model = make_model(torch)
    manifest = record(torch, model, digests=True)
    assert graphcheck.verify(manifest).ok
    live = gt.snapshot(model, manifest, event="sleep(level=1) + wake", digests=True)
    # As written (format 2): the probes are columns.
    assert set(live["probes"]["state"]) == {"active"}
    report = graphcheck.assert_clean(manifest, live)
    assert report.ok and report.findings == () and report.subjects == 4
    assert str(report) == (
        "graphcheck verify: ok — no findings in 1 graph, 4 touched tensors (capture and live checks)\n"
    )


def test_capture_time_findings(torch):
    model = make_model(torch)
    layer = model.layers[0]
    unknown = 0x7F00_0000_1000  # an address no tensor explains
    manifest = record(
        torch,
        model,
        extra_nodes=[
            kernel(2, "marlin::Marlin", layer.quant_method.kernel.workspace),
            kernel(3, "MulFunctor", layer.embed_scale, unknown),
        ],
    )
    report = graphcheck.verify(manifest)
    assert not report.ok
    assert kinds(report) == [
        ("unregistered", "model.layers[0].embed_scale"),
        ("unregistered", "model.layers[0].quant_method.kernel.workspace"),
        ("unowned", hex(unknown)),
    ]
    ws = report.findings[1]
    assert ws.graphs == ("decode_bs1",)
    assert [(k.name, k.param) for k in ws.kernels] == [("marlin::Marlin", 0)]
    assert ws.owners[0].registration == "object_attribute"
    assert ws.dtype == "int32" and ws.shape == (64,)
    with pytest.raises(graphcheck.VerificationFailed) as raised:
        graphcheck.assert_clean(manifest)
    assert isinstance(raised.value, AssertionError)
    assert isinstance(raised.value, graphcheck.GraphcheckError)
    assert "model.layers[0].quant_method.kernel.workspace" in str(raised.value)
    assert raised.value.report.findings == report.findings
    # An allowlist silences a known case; as dicts or as a file.
    allowed = graphcheck.verify(
        manifest,
        allow=[
            {
                "path": "model.layers[*].quant_method.kernel.workspace",
                "kinds": ["unregistered"],
                "reason": "per-step scratch",
            }
        ],
    )
    assert [f.kind for f in allowed.findings] == ["unregistered", "unowned"]
    assert [a.finding.subject for a in allowed.allowed] == [
        "model.layers[0].quant_method.kernel.workspace"
    ]


def test_drifted_when_an_attribute_is_rebound(torch):
    model = make_model(torch)
    layer = model.layers[0]
    manifest = record(
        torch, model, extra_nodes=[kernel(2, "marlin::Marlin", layer.quant_method.kernel.workspace)]
    )
    # Kept alive so that the allocator cannot hand their addresses to the new tensors
    # (that would be `reused`, not `freed`).
    old_tensors = (layer.quant_method.kernel.workspace, layer.cos)
    old = layer.quant_method.kernel.workspace.data_ptr()
    # process_weights_after_loading builds a new workspace; the graph holds the old one.
    layer.quant_method.kernel.workspace = torch.zeros(64, dtype=torch.int32)
    layer.cos = torch.randn(16)  # a buffer rebound too (Module.__setattr__ keeps it a buffer)
    live = gt.snapshot(model, manifest, event="reload_weights()")
    report = graphcheck.verify(manifest, live)
    assert kinds(report) == [
        ("drifted", "model.layers[0].cos"),
        ("drifted", "model.layers[0].quant_method.kernel.workspace"),
        ("freed", "model.layers[0].cos"),
        ("freed", "model.layers[0].quant_method.kernel.workspace"),
        ("unregistered", "model.layers[0].quant_method.kernel.workspace"),
    ]
    drifted = report.findings[1]
    assert int(drifted.captured_addr, 16) == old
    assert int(drifted.live_addr, 16) == layer.quant_method.kernel.workspace.data_ptr()
    assert report.recapture() == ["decode_bs1"]
    del old_tensors


def test_reused_when_a_freed_address_is_handed_to_another_owner(torch):
    model = make_model(torch)
    layer = model.layers[0]
    manifest = record(torch, model)
    # The buffer is released and its storage handed to a new plain attribute.
    storage = layer.cos
    del layer.cos
    layer.other = storage.view(16)
    live = gt.snapshot(model, manifest)
    assert kinds(graphcheck.verify(manifest, live)) == [
        ("vanished", "model.layers[0].cos"),
        ("reused", "model.layers[0].cos"),
    ]


def test_vanished_reshaped_and_stale(torch):
    model = make_model(torch)
    layer = model.layers[0]
    manifest = record(torch, model, digests=True)
    del layer.quant_method.w_scale  # the holder no longer has it
    layer._buffers["cos"] = layer.cos.view(4, 4)  # same storage, new layout
    with torch.no_grad():
        layer.proj.weight.add_(1.0)  # contents changed in place
    live = gt.snapshot(model, manifest, digests=True)
    report = graphcheck.verify(manifest, live)
    assert kinds(report) == [
        ("vanished", "model.layers[0].quant_method.w_scale"),
        ("freed", "model.layers[0].quant_method.w_scale"),
        ("reshaped", "model.layers[0].cos"),
        ("stale", "model.layers[0].proj.weight"),
    ]


def test_updated_weights_against_a_reference(torch):
    model = make_model(torch)
    manifest = record(torch, model, digests=True)
    fresh = make_model(torch)
    with torch.no_grad():
        fresh.layers[0].proj.weight.mul_(2.0)
        model.layers[0].proj.weight.mul_(2.0)  # the reload wrote what a fresh load has
    live = gt.snapshot(model, manifest, contents="updated", reference=fresh)
    assert graphcheck.verify(manifest, live).ok
    # A reload that left the bias untouched while the fresh load differs: stale.
    with torch.no_grad():
        fresh.layers[0].proj.bias.add_(1.0)
    live = gt.snapshot(model, manifest, contents="updated", reference=fresh)
    assert kinds(graphcheck.verify(manifest, live)) == [("stale", "model.layers[0].proj.bias")]


def test_graph_inputs_and_runtime_state_are_not_persistent(torch):
    model = make_model(torch)
    model.kv_cache = torch.zeros(32)
    static_input = torch.zeros(8)
    rec = gt.Recorder(model, runtime_state=["model.kv_cache"])
    rec.add_graph(
        "decode_bs1",
        walked(kernel(0, "attn", static_input, model.kv_cache)),
        inputs={"x": static_input},
    )
    manifest = graphcheck.load(rec.manifest())
    regs = {o["path"]: o["registration"] for o in manifest["owners"]}
    assert regs['graphs["decode_bs1"].inputs["x"]'] == "graph_input"
    assert regs["model.kv_cache"] == "runtime_state"
    assert graphcheck.verify(manifest).ok


def test_documents_round_trip_through_the_core(torch, tmp_path):
    model = make_model(torch)
    manifest = record(torch, model)
    path = tmp_path / "manifest.json"
    gt.Recorder(model)  # a recorder with no graph builds nothing until asked
    path.write_text(json.dumps(manifest))
    assert graphcheck.load(path) == manifest
    live = gt.snapshot(model, path)
    assert graphcheck.load(json.dumps(live), expect="live", format_version=2) == live
    assert "tensors:" in graphcheck.normalized(live)
    same = graphcheck.diff(manifest, live)
    assert (same.same, same.text) == (True, "same: 6 owner paths compared, no difference\n")
    # A tensor rebound with another dtype and shape: one layout difference, named by path.
    model.layers[0].embed_scale = torch.zeros(3, dtype=torch.float16)
    changed = graphcheck.diff(manifest, gt.snapshot(model, path), format="json")
    assert changed.same is False
    body = json.loads(changed.text)
    assert (body["same"], body["compared"]) == (False, 6)
    assert body["differences"] == [
        {
            "path": "model.layers[0].embed_scale",
            "change": "layout",
            # Every field of the view is compared: what else differs is said too.
            "a": "float32[] stride [] offset 0 itemsize 4 nbytes 4 in a storage of 4 bytes",
            "b": "float16[3] stride [1] offset 0 itemsize 2 nbytes 6 in a storage of 6 bytes",
        }
    ]
    text = graphcheck.explain(manifest, "model.layers[0].proj.weight")
    assert "gemv" in text
    with pytest.raises(
        graphcheck.GraphcheckError,
        match=r"^owner model\.nothing: no such owner path in the manifest$",
    ):
        graphcheck.explain(manifest, "model.nothing")


def _has_cuda_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def test_graph_without_a_driver_says_why(torch):
    # CI machines have no CUDA driver: the walker must say so, as GraphcheckError, never
    # panic or crash. (On a GPU machine the GPU tests cover the walker itself.)
    if _has_cuda_driver():
        pytest.skip("a CUDA driver is present: the GPU tests exercise the walker")
    with pytest.raises(graphcheck.GraphcheckError, match="no CUDA driver"):
        graphcheck._native.walk_graph(0x1234)
    with pytest.raises(graphcheck.GraphcheckError, match="null"):
        graphcheck._native.walk_graph(0)

def test_recorder_does_not_keep_the_model_tensors_alive(torch):
    # Regression: the registry held strong references, so a rebuilt tensor's old storage
    # was never freed and `freed`/`reused` could not be seen after a reload.
    import gc
    import weakref

    model = make_model(torch)
    rec = gt.Recorder(model)
    rec.rewalk()
    old = weakref.ref(model.layers[0].embed_scale)
    model.layers[0].embed_scale = torch.tensor(2.0)
    gc.collect()
    assert old() is None, "the recorder keeps a replaced tensor alive"


# -- identity follows the storage; views registered through their base; unused_allow warns --


def test_a_view_dropped_while_its_base_lives_is_clean(torch):
    # A plain attribute holding a view into a buffer's storage: registered through the
    # buffer at capture; when the view is dropped, the buffer still holds the bytes.
    model = make_model(torch)
    layer = model.layers[0]
    layer.cos_head = layer.cos[4:8]
    rec = gt.Recorder(model)
    rec.add_graph("decode_bs1", walked(kernel(0, "rope", layer.cos_head)))
    manifest = graphcheck.load(rec.manifest())
    assert graphcheck.verify(manifest).ok, str(graphcheck.verify(manifest))
    del layer.cos_head
    report = graphcheck.verify(manifest, gt.snapshot(model, manifest))
    assert report.ok, str(report)
    # The buffer rebound too, its old storage released: nothing holds the bytes now.
    layer.cos = torch.randn(16)
    report = graphcheck.verify(manifest, gt.snapshot(model, manifest))
    # The view's path is gone, its base rebound, its bytes released: each said once.
    assert kinds(report) == [
        ("vanished", "model.layers[0].cos_head"),
        ("drifted", "model.layers[0].cos_head"),
        ("freed", "model.layers[0].cos_head"),
    ], str(report)


def test_a_list_shifted_by_a_delete_reports_only_the_deleted_tensor(torch):
    # PyTorch's liveness case `del ys[1]`: ys[2] moves to ys[1], unchanged; ys[1]'s tensor
    # is released.
    model = make_model(torch)
    model.ys = [torch.randn(10), torch.randn(10), torch.randn(10)]
    rec = gt.Recorder(model, digests=True)
    rec.add_graph("decode_bs1", walked(kernel(0, "foreach_add", *model.ys)))
    manifest = graphcheck.load(rec.manifest())
    del model.ys[1]
    live = gt.snapshot(model, manifest, digests=True)
    found = [(k, s) for k, s in kinds(graphcheck.verify(manifest, live)) if k != "unregistered"]
    assert found == [("drifted", "model.ys[1]"), ("freed", "model.ys[1]")]


def test_rebinding_the_parameter_under_a_view_is_drifted(torch):
    model = make_model(torch)
    layer = model.layers[0]
    layer.row = layer.proj.weight[1]  # a plain attribute: a view into the parameter
    rec = gt.Recorder(model)
    rec.add_graph("decode_bs1", walked(kernel(0, "gemv", layer.row)))
    manifest = graphcheck.load(rec.manifest())
    assert graphcheck.verify(manifest).ok
    # The reload replaces the parameter; the view keeps the old storage alive, so nothing
    # is freed, but reloads now write where the graph does not read.
    layer.proj.weight = torch.nn.Parameter(torch.randn(8, 8))
    report = graphcheck.verify(manifest, gt.snapshot(model, manifest))
    assert [f.kind for f in report.findings] == ["drifted"], str(report)
    assert "model.layers[0].proj.weight" in report.findings[0].detail


def test_an_unused_allow_entry_warns_unless_denied(torch):
    model = make_model(torch)
    manifest = record(torch, model)
    allow = [{"path": "model.gone", "reason": "a backend no longer used"}]
    report = graphcheck.verify(manifest, allow=allow)
    assert report.ok and bool(report)
    assert [(f.kind, f.severity) for f in report.findings] == [("unused_allow", "warning")]
    assert report.warnings == list(report.findings) and report.errors == []
    assert "(warning)" in str(report) and "(warning)" in report.markdown
    assert json.loads(report.json)["findings"][0]["severity"] == "warning"
    graphcheck.assert_clean(manifest, allow=allow)

    denied = graphcheck.verify(manifest, allow=allow, deny_unused_allow=True)
    assert not denied.ok
    assert [(f.kind, f.severity) for f in denied.errors] == [("unused_allow", "error")]
    with pytest.raises(graphcheck.VerificationFailed):
        graphcheck.assert_clean(manifest, allow=allow, deny_unused_allow=True)


def test_a_snapshot_digests_by_default_where_the_manifest_has_digests(torch):
    """Regression: a manifest recorded with digests, snapshotted with the defaults
    (``contents="preserved"``, no ``digests``), verified clean although a preserved tensor
    had changed, and the report listed ``stale`` among the kinds checked. The default now
    digests where the manifest has digests; ``digests=False`` still takes none."""
    model = make_model(torch)
    manifest = record(torch, model, digests=True)
    with torch.no_grad():
        model.layers[0].proj.weight.add_(1.0)
    report = graphcheck.verify(manifest, gt.snapshot(model, manifest))
    assert kinds(report) == [("stale", "model.layers[0].proj.weight")]
    assert graphcheck.verify(manifest, gt.snapshot(model, manifest, digests=False)).ok
    # Updated contents are not compared with the capture's: no digests needed.
    updated = gt.snapshot(model, manifest, contents="updated")
    assert "digest" not in updated["tensors"]
    # A manifest without digests gets a snapshot without them, as before.
    plain = record(torch, model)
    assert "digest" not in gt.snapshot(model, plain)["tensors"]
