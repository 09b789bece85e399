"""Retarget instead of recapture (issue 29) through the Python package, on the CPU: the
plan of the synthetic fixtures (a Marlin workspace rebuilt at a new address: retargetable;
a tensor reshaped in place: refused), each graph patched all or nothing on the host
stand-in (``_native.apply_plan_host``: the k-th write failing leaves every word as it was),
and the manifest after applying, which verifies clean against a snapshot probed for the new
addresses. The driver's patcher is exercised by test_retarget_gpu.py.
"""

import json

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck import GraphcheckError, _native
from conftest import REPO

SYNTH = REPO / "fixtures" / "synthetic"
MARLIN = SYNTH / "marlin_workspace_rebuilt"
RESHAPE = SYNTH / "inplace_reshape"


def docs(case):
    return str(case / "manifest.json"), str(case / "live.json")


def plan_of(case):
    m, l = docs(case)
    text = _native.retarget_plan(m, l)
    return text, json.loads(text)


def words_of(manifest, graph):
    """Every word a manifest's graph holds, by (node, param, offset): what the host
    stand-in patches."""
    m = graphcheck.load(manifest)
    out = {}
    for g in m["graphs"]:
        if g["name"] == graph:
            for n in g["nodes"]:
                for t in n.get("touches", []):
                    out[(n["index"], t["param"], t["offset"])] = int(t["addr"], 16)
    return out


def edits_of(p, graph):
    g = next(g for g in p["graphs"] if g["graph"] == graph)
    return [((e["node"], e["param"], e["offset"]), int(e["old"], 16), int(e["new"], 16)) for e in g["edits"]]


def test_the_rebuilt_workspace_is_retargeted_word_by_word():
    m, l = docs(MARLIN)
    assert not graphcheck.verify(m, l).ok, "the fixture must have findings to fix"
    _, p = plan_of(MARLIN)
    assert p["kind"] == "retarget_plan" and p["ok"], p
    assert p["retarget"] and not p["recapture"], p
    assert p["edits"] == sum(len(edits_of(p, g)) for g in p["retarget"]) > 0
    for g in p["retarget"]:
        words = words_of(m, g)
        for key, old, new in edits_of(p, g):
            assert words[key] == old, (g, key)  # the word the graph holds
            assert new != old
    # The module-level helper gives the same plan.
    assert gt.retarget.__module__ == "graphcheck._retarget"
    from graphcheck._retarget import plan

    assert plan(m, l) == p


def test_a_tensor_reshaped_in_place_is_refused_with_why():
    _, p = plan_of(RESHAPE)
    assert not p["ok"] and p["recapture"], p
    for name in p["recapture"]:
        g = next(g for g in p["graphs"] if g["graph"] == name)
        assert g["action"] == "recapture"
        assert g["refusals"] and all(r["why"] for r in g["refusals"]), g
    # Applying a refused graph changes nothing.
    text, _ = plan_of(RESHAPE)
    name = p["recapture"][0]
    words = words_of(docs(RESHAPE)[0], name)
    out, after = _native.apply_plan_host(text, name, words)
    assert not out["applied"] and out["restored"], out
    assert after == words


def test_each_graph_is_patched_all_or_nothing():
    text, p = plan_of(MARLIN)
    m, _ = docs(MARLIN)
    for g in p["retarget"]:
        words = words_of(m, g)
        edits = edits_of(p, g)
        # The k-th write fails: the k made before it are undone, every word as it was.
        for k in range(len(edits)):
            out, after = _native.apply_plan_host(text, g, words, fail_write=k)
            assert not out["applied"], (g, k, out)
            assert out["restored"], (g, k, out)
            assert f"edit {k + 1} of {len(edits)}" in out["why"], out["why"]
            assert after == words, (g, k)
        # An undo that fails too says the graph must not be replayed.
        out, after = _native.apply_plan_host(text, g, words, fail_write=len(edits) - 1, fail_undo=True)
        assert not out["applied"] and (out["restored"] == (len(edits) == 1)), out
        if len(edits) > 1:
            assert "must not be replayed" in out["why"], out["why"]
        # Every write succeeds: every edited word is new, every other as it was.
        out, after = _native.apply_plan_host(text, g, words)
        assert out == {"applied": True, "edits": len(edits), "why": None, "restored": False}
        new = {key: w for key, _, w in edits}
        for key, w in words.items():
            assert after[key] == new.get(key, w), (g, key)


def test_a_graph_changed_since_its_manifest_is_refused_untouched():
    text, p = plan_of(MARLIN)
    g = p["retarget"][0]
    words = words_of(docs(MARLIN)[0], g)
    key, old, _ = edits_of(p, g)[-1]
    words[key] = old + 8
    out, after = _native.apply_plan_host(text, g, words)
    assert not out["applied"] and out["restored"], out
    assert "changed since its manifest" in out["why"], out["why"]
    assert after == words


def live_findings(report):
    """The findings only a live snapshot gives (capture-time ones, such as a tensor held
    only as an attribute, are no retarget's to fix)."""
    return [(f.kind, f.subject) for f in report.findings if f.kind in _native.LIVE_KINDS]


def test_the_manifest_after_applying_verifies_clean():
    text, p = plan_of(MARLIN)
    m, l = docs(MARLIN)
    assert live_findings(graphcheck.verify(m, l)), "the fixture must have live findings"
    after = _native.retargeted_manifest(m, l, text, p["retarget"])
    probed = _native.probed_for(l, after)
    report = graphcheck.verify(json.loads(after), json.loads(probed))
    assert live_findings(report) == [], report.table
    # Nothing is left to retarget.
    again = json.loads(_native.retarget_plan(after, probed))
    assert again["ok"] and again["edits"] == 0 and not again["retarget"], again
    # Its words are the plan's new ones.
    for g in p["retarget"]:
        words = words_of(json.loads(after), g)
        for key, _, new in edits_of(p, g):
            assert words[key] == new
    # Nothing applied: the same findings as before, against the same probes.
    unchanged = _native.retargeted_manifest(m, l, text, [])
    report = graphcheck.verify(json.loads(unchanged), json.loads(_native.probed_for(l, unchanged)))
    assert live_findings(report)


def test_bad_arguments_are_graphcheck_errors_not_internal_ones():
    text, _ = plan_of(MARLIN)
    m, l = docs(MARLIN)
    for call in (
        lambda: _native.apply_plan_host(text, "no such graph", {}),
        lambda: _native.apply_plan_host("{}", "bs1", {}),
        lambda: _native.retargeted_manifest(m, l, "not json", []),
        lambda: _native.retarget_plan(l, m),  # the documents swapped
        lambda: _native.apply_plan_cuda(text, [("no such graph", 1, None)]),
    ):
        with pytest.raises(GraphcheckError) as e:
            call()
        assert not isinstance(e.value, _native.InternalError), e.value
    with pytest.raises(GraphcheckError, match="Recorder"):
        gt.retarget(object())


def test_verify_says_per_finding_whether_a_retarget_fixes_it():
    # With a live snapshot, verify plans the retarget too: each live-check finding says
    # whether every graph holding it would be patched, and the report names those graphs.
    m, l = docs(MARLIN)
    r = graphcheck.verify(m, l)
    assert r.retarget == ("decode_bs1", "decode_bs8")
    flags = {(f.kind, f.retarget) for f in r.findings}
    assert ("drifted", True) in flags and ("freed", True) in flags
    assert {f.retarget for f in r.findings if f.kind == "unregistered"} == {None}
    assert "retarget instead: decode_bs1, decode_bs8" in str(r)
    m, l = docs(RESHAPE)
    r = graphcheck.verify(m, l)
    assert r.retarget == ()
    assert [(f.kind, f.retarget) for f in r.findings] == [("reshaped", False)]
    # Without a live snapshot there is nothing to plan.
    r = graphcheck.verify(m)
    assert r.retarget == () and all(f.retarget is None for f in r.findings)


def test_a_recorded_graph_notes_its_retargets_in_the_manifest(torch):
    # What graphcheck.torch.retarget does after patching a graph, without a GPU: the
    # recorder notes the retarget on the graph, and the manifest carries it (both formats:
    # src/plan/tests.rs); a name the recorder does not have is an error.
    from conftest import kernel, walked

    model = torch.nn.Module()
    model.w = torch.zeros(4)
    rec = gt.Recorder(model)
    rec.add_graph("bs1", _native.Walked.from_json(walked(kernel(0, "k", model.w))))
    rec.note_retarget("bs1", {"event": "reload", "edits": 2, "time": 1.5})
    (g,) = graphcheck.load(rec.manifest())["graphs"]
    assert g["retargets"] == [{"event": "reload", "edits": 2, "time": 1.5}]
    with pytest.raises(GraphcheckError, match="no graph named 'bs9'"):
        rec.note_retarget("bs9", {"event": "x", "edits": 1})


def test_a_plan_that_contradicts_itself_is_refused_before_any_word_is_written():
    text, p = plan_of(MARLIN)
    name = p["retarget"][0]
    words = words_of(docs(MARLIN)[0], name)
    g = next(g for g in p["graphs"] if g["graph"] == name)
    g["edits"].append(dict(g["edits"][0]))  # one word edited twice
    with pytest.raises(GraphcheckError, match=r"contradicts itself at graphs\[\d+\]\.edits\[\d+\]: .* edited twice"):
        _native.apply_plan_host(json.dumps(p), name, dict(words))
    p = json.loads(text)
    p["edits"] += 1
    with pytest.raises(GraphcheckError, match=r"contradicts itself at edits: "):
        _native.retargeted_manifest(docs(MARLIN)[0], docs(MARLIN)[1], json.dumps(p), p["retarget"])


def test_the_retarget_snapshot_walks_the_model_as_its_recorder_does(torch):
    # A recorder that walks deeper than the default (max_depth) and sets some owners aside
    # as runtime state: the snapshot retarget takes by itself must walk the same way, or a
    # weight nested past the default depth reads as gone and its graph is planned for a
    # recapture though nothing moved.
    from conftest import kernel, walked

    from graphcheck._walk import DEFAULT_MAX_DEPTH

    class Box:  # a plain object: the depth limit is on attribute hops, not modules
        pass

    model = torch.nn.Module()
    node = model.cfg = Box()
    for _ in range(DEFAULT_MAX_DEPTH + 2):
        node.inner = Box()
        node = node.inner
    node.w = torch.ones(8)
    model.kv = torch.zeros(16)
    rec = gt.Recorder(model, max_depth=DEFAULT_MAX_DEPTH + 4, runtime_state=["model.kv"])
    rec.add_graph("bs1", _native.Walked.from_json(walked(kernel(0, "k", node.w, model.kv))))
    assert "model.cfg" + ".inner" * (DEFAULT_MAX_DEPTH + 2) + ".w" in {
        o["path"] for o in graphcheck.load(rec.manifest())["owners"]
    }
    res = gt.retarget(rec, apply=False)
    (g,) = res.plan["graphs"]
    assert g["action"] == "keep", g
    assert res.ok and res.plan["edits"] == 0


def test_the_recorder_takes_a_retargets_walks_in_one_pass_as_one_call_a_graph_would(torch):
    # retarget hands the recorder every patched graph's new walk at once (one call per
    # graph copied every list each time: quadratic at engine scale): the manifest is the
    # one a call per graph gives, and an unknown name changes nothing.
    from conftest import kernel, walked

    model = torch.nn.Module()
    model.a, model.b, model.c = torch.zeros(4), torch.ones(4), torch.full((4,), 2.0)
    recs = []
    for _ in range(2):
        rec = gt.Recorder(model)
        for name, t in (("g0", model.a), ("g1", model.b), ("g2", model.c)):
            rec.add_graph(name, _native.Walked.from_json(walked(kernel(0, name, t))))
        recs.append(rec)
    new = {n: walked(kernel(0, n, model.b, model.c)) for n in ("g2", "g0")}
    for n, w in new.items():
        recs[0].replace_walked(n, _native.Walked.from_json(w))
        recs[0].note_retarget(n, {"event": "e", "edits": 1, "time": 1.0})
    recs[1]._replace_walks({n: _native.Walked.from_json(w) for n, w in new.items()})
    recs[1]._note_retargets({n: {"event": "e", "edits": 1, "time": 1.0} for n in new})
    one, batch = (graphcheck.load(r.manifest()) for r in recs)
    assert [g["name"] for g in batch["graphs"]] == ["g1", "g2", "g0"]
    for key in ("graphs", "tensors", "owners"):
        assert one[key] == batch[key], key
    before = recs[1].manifest()
    with pytest.raises(GraphcheckError, match="no graph named 'g9'"):
        recs[1]._replace_walks({"g1": _native.Walked.from_json(new["g0"]), "g9": _native.Walked.from_json(new["g0"])})
    with pytest.raises(GraphcheckError, match="no graph named 'g9'"):
        recs[1]._note_retargets({"g1": {"event": "e"}, "g9": {"event": "e"}})
    assert recs[1].manifest() == before


def test_retarget_patches_every_graph_in_one_native_call_and_sorts_the_outcomes(torch, monkeypatch):
    # gt.retarget hands every graph to patch to one _native.apply_plan_cuda call (the plan
    # parsed once: at engine scale a call per graph was most of the retarget), here a
    # host-backed stand-in: each graph's outcome lands under its own name, a graph the
    # patcher refuses is refused with its reason, and only a patched graph that has no
    # executable graph to patch is instantiated again.
    text, p = plan_of(MARLIN)
    m, l = docs(MARLIN)
    names = p["retarget"]
    assert len(names) == 2, names
    words = {i + 1: words_of(m, n) for i, n in enumerate(names)}
    calls = []

    def apply_plan_cuda(plan, handles):
        calls.append([h[0] for h in handles])
        out = []
        for name, template, exec_handle in handles:
            fail = 0 if name == names[1] else None
            outcome, words[template] = _native.apply_plan_host(plan, name, words[template], fail_write=fail)
            out.append(outcome)
        return out

    class Graph:
        def __init__(self, template, has_exec):
            self.template, self.instantiated = template, 0
            if has_exec:
                self.raw_cuda_graph_exec = lambda: 1000 + template

        def raw_cuda_graph(self):
            return self.template

        def instantiate(self):
            self.instantiated += 1

    monkeypatch.setattr(_native, "apply_plan_cuda", apply_plan_cuda)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    graphs = {names[0]: Graph(1, has_exec=False), names[1]: Graph(2, has_exec=True)}
    before = {k: dict(v) for k, v in words.items()}
    res = gt.retarget(gt.Recorder(torch.nn.Module()), l, graphs=graphs, manifest=m)
    assert calls == [[g["graph"] for g in p["graphs"] if g["action"] == "retarget"]], calls
    assert res.retargeted == (names[0],), res
    assert set(res.refused) == {names[1]} and "edit 1 of" in res.refused[names[1]], res.refused
    assert res.outcomes[names[0]]["applied"] and not res.outcomes[names[1]]["applied"]
    assert graphs[names[0]].instantiated == 1 and graphs[names[1]].instantiated == 0
    assert words[2] == before[2], "the refused graph's words changed"
    assert words[1] != before[1]
    for key, _, new in edits_of(p, names[0]):
        assert words[1][key] == new
