"""Storage numbers of a recorder's session (``docs/format.md``, "Storage numbers of a
session"), on CPU tensors: the recorder's manifest names its session and numbers every
storage; a snapshot taken with ``recorder=`` numbers the storages the recorder saw alike and
leaves new ones unnumbered; and a rebind chain, each new tensor a new storage object over
the memory the previous sibling's old one had (``torch.frombuffer`` over one host buffer
per slot, so the chain forms whatever the host allocator does), is ``drifted`` at every
link with the numbers, where addresses alone read it as a list shift.
"""

import json

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck import GraphcheckError, _native
from conftest import kernel, walked

N = 256  # floats per slot


def native(*nodes):
    return _native.Walked.from_json(walked(*nodes))


def chain_model(torch, n):
    """``n`` layers, each with a buffer ``w`` over slot ``i`` of ``n + 1`` host buffers."""
    slots = [bytearray(4 * N) for _ in range(n + 1)]
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(n))
    for i, layer in enumerate(model.layers):
        layer.register_buffer("w", torch.frombuffer(slots[i], dtype=torch.float32))
        layer.w.fill_(float(i))
    return model, slots


def rebind_chain(torch, model, slots):
    """Replaces every layer's ``w`` in order by a new storage: layer 0's over the slot no
    layer uses, each later one's over the slot its predecessor's old tensor had. Returns
    the old data pointers."""
    by_addr = {torch.frombuffer(s, dtype=torch.float32).data_ptr(): s for s in slots}
    old = [layer.w.data_ptr() for layer in model.layers]
    (free,) = [s for a, s in by_addr.items() if a not in old]
    for layer, slot in zip(model.layers, [free] + [by_addr[a] for a in old[:-1]]):
        new = torch.frombuffer(slot, dtype=torch.float32)
        assert new.untyped_storage() is not layer.w.untyped_storage()
        layer.w = new
    assert [layer.w.data_ptr() for layer in model.layers][1:] == old[:-1]
    return old


def drifted(report):
    return sorted(f.subject for f in report.findings if f.kind == "drifted")


def test_a_recorder_numbers_every_storage_in_its_session(torch):
    model, slots = chain_model(torch, 3)
    rec = gt.Recorder(model)
    rec.add_graph("g", native(kernel(0, "k", *(layer.w for layer in model.layers))))
    m = graphcheck.load(rec.manifest())
    assert m["producer"]["session"] == rec.session
    numbers = [t.get("storage") for t in m["tensors"]]
    assert None not in numbers and len(set(numbers)) == len(numbers), numbers
    # Two recorders are two sessions.
    assert gt.Recorder(model).session != rec.session
    # A snapshot with the recorder gives the kept storages their numbers...
    live = gt.snapshot(None, rec.manifest(), roots=rec.roots(), recorder=rec)
    assert live["producer"]["session"] == rec.session
    by_ptr = {(t["storage_base"]): t.get("storage") for t in graphcheck.load(live)["tensors"]}
    for t in m["tensors"]:
        assert by_ptr[t["storage_base"]] == t["storage"]
    # ...and a new storage none, even where it has a captured one's memory.
    model.layers[0].w = torch.frombuffer(slots[0], dtype=torch.float32)
    live = graphcheck.load(gt.snapshot(None, rec.manifest(), roots=rec.roots(), recorder=rec))
    first = next(t for t in live["tensors"] if t["storage_base"] == m["tensors"][0]["storage_base"])
    assert "storage" not in first, first
    # Without the recorder a snapshot names no session and numbers nothing.
    plain = graphcheck.load(gt.snapshot(None, rec.manifest(), roots=rec.roots()))
    assert "session" not in plain["producer"]
    assert all("storage" not in t for t in plain["tensors"])


def test_a_rebind_chain_is_drifted_at_every_link_with_the_sessions_numbers(torch):
    n = 4
    model, slots = chain_model(torch, n)
    rec = gt.Recorder(model)
    rec.add_graph("g", native(kernel(0, "k", *(layer.w for layer in model.layers))))
    manifest = rec.manifest()
    rebind_chain(torch, model, slots)
    paths = [f"model.layers[{i}].w" for i in range(n)]

    live = gt.snapshot(None, manifest, roots=rec.roots(), recorder=rec, contents="updated")
    report = graphcheck.verify(manifest, live)
    assert drifted(report) == paths, report.table
    # Every old address but the last now holds the next layer's new tensor.
    reused = sorted(f.subject for f in report.findings if f.kind == "reused")
    assert reused == paths[:-1], report.table
    # The plan follows every link: each word to where its own layer's tensor is now.
    plan = json.loads(_native.retarget_plan(json.dumps(graphcheck.load(manifest)), json.dumps(graphcheck.load(live))))
    (g,) = plan["graphs"]
    assert g["action"] == "retarget", g
    now = {f"model.layers[{i}].w": layer.w.data_ptr() for i, layer in enumerate(model.layers)}
    assert {e["subject"]: int(e["new"], 16) for e in g["edits"]} == now

    # Addresses alone cannot tell the chain from `del layers[0]` and an append: without
    # the recorder's numbers verify misses links (what the H200 run showed).
    plain = gt.snapshot(None, manifest, roots=rec.roots(), contents="updated")
    assert len(drifted(graphcheck.verify(manifest, plain))) < n


def test_recorder_must_be_a_recorder(torch):
    model, _ = chain_model(torch, 1)
    rec = gt.Recorder(model)
    rec.add_graph("g", native(kernel(0, "k", model.layers[0].w)))
    with pytest.raises(GraphcheckError, match="recorder is a graphcheck.torch.Recorder"):
        gt.snapshot(None, rec.manifest(), roots=rec.roots(), recorder="rec")


def test_a_graph_walked_again_after_a_retarget_reads_what_is_alive_then(torch):
    # After a retarget the recorder walks the patched graph again (replace_walked): its
    # words name storages born after its capture, and not the dead ones it was captured
    # with. A second reload must then be judged against those: regression, the anchor
    # bench's second run refused every graph (each word resolved to the dead storage
    # alive at the graph's first capture: two findings of one subject, two new places).
    n = 3
    model, slots = chain_model(torch, n)
    rec = gt.Recorder(model)
    rec.add_graph("other", native(kernel(0, "k0", model.layers[0].w)))
    rec.add_graph("g", native(kernel(0, "k", *(layer.w for layer in model.layers))))
    for round_ in range(2):
        rebind_chain(torch, model, slots)
        manifest = rec.manifest()
        live = gt.snapshot(None, manifest, roots=rec.roots(), recorder=rec, contents="updated")
        paths = [f"model.layers[{i}].w" for i in range(n)]
        assert drifted(graphcheck.verify(manifest, live)) == paths, round_
        plan = json.loads(_native.retarget_plan(json.dumps(graphcheck.load(manifest)), json.dumps(graphcheck.load(live))))
        g = next(x for x in plan["graphs"] if x["graph"] == "g")
        assert g["action"] == "retarget", (round_, g)
        # What the patch does to the template, and the walk of it the recorder takes.
        for name, reads in (("g", [layer.w for layer in model.layers]), ("other", [model.layers[0].w])):
            rec.replace_walked(name, native(kernel(0, "k", *reads)))
        rec.rewalk()
        now = rec.manifest()
        fresh = gt.snapshot(None, now, roots=rec.roots(), recorder=rec)
        left = [(f.kind, f.subject) for f in graphcheck.verify(now, fresh).findings if f.kind in _native.LIVE_KINDS]
        assert left == [], (round_, left)
    # The graphs walked again are in the order of their walks.
    assert [x["name"] for x in graphcheck.load(rec.manifest())["graphs"]] == ["g", "other"]
