"""The retarget documents recorded on the H200 (``fixtures/gpu/retarget_*``, written by
``tests/python/test_retarget_proof_gpu.py`` with GRAPHCHECK_GPU_OUT), replayed on the CPU:
for each case the plan made here from its manifest and live snapshot is the plan the GPU
run applied (same actions, same word edits, same refusals); applying it on the host
stand-in changes exactly the planned words; and, for a retargeted case, the manifest after
applying is the one the GPU run wrote, and verifies with no live finding against the
snapshot probed for its new addresses. A refused case changes nothing.
"""

import json

import pytest

import graphcheck
from graphcheck import _native
from conftest import REPO

GPU = REPO / "fixtures" / "gpu"
CASES = sorted(p.name[len("retarget_"):-len("_plan.json")] for p in GPU.glob("retarget_*_plan.json"))


def doc(case, part):
    return json.loads((GPU / f"retarget_{case}_{part}.json").read_text())


def words_of(manifest, graph):
    out = {}
    for g in graphcheck.load(manifest)["graphs"]:
        if g["name"] == graph:
            for n in g["nodes"]:
                for t in n.get("touches", []):
                    out[(n["index"], t["param"], t["offset"])] = int(t["addr"], 16)
    return out


def test_the_recorded_cases_are_here():
    # Every seed class, parameter shape and refusal the GPU test proves (a case the GPU
    # run skipped has no documents, and is named in the fixture README).
    assert {"marlin_workspace", "cutlass_strides", "rebound_parameter", "rebind_chain", "triton",
            "memcpy_device", "memcpy_host", "reshape", "mla_w_uv", "nccl", "tree"} <= set(CASES), CASES


@pytest.mark.parametrize("case", CASES)
def test_the_plan_made_here_is_the_plan_the_gpu_applied(case):
    m, live, applied = doc(case, "manifest"), doc(case, "live"), doc(case, "plan")
    here = json.loads(_native.retarget_plan(json.dumps(m), json.dumps(live)))
    assert here == applied


@pytest.mark.parametrize("case", CASES)
def test_applying_on_the_host_changes_exactly_the_planned_words(case):
    m, live, p = doc(case, "manifest"), doc(case, "live"), doc(case, "plan")
    text = json.dumps(p)
    for g in p["graphs"]:
        before = words_of(m, g["graph"])
        outcome, after = _native.apply_plan_host(text, g["graph"], dict(before))
        if g["action"] == "retarget":
            assert outcome["applied"] and outcome["edits"] == len(g["edits"]), outcome
            want = dict(before)
            for e in g["edits"]:
                want[(e["node"], e["param"], e["offset"])] = int(e["new"], 16)
            assert after == want
        else:
            assert after == before


@pytest.mark.parametrize("case", CASES)
def test_the_manifest_after_is_the_gpus_and_verifies_clean(case):
    m, live, p, after = (doc(case, part) for part in ("manifest", "live", "plan", "after"))
    if not p["retarget"]:
        assert p["recapture"], p  # a refusal: nothing was patched
        return
    here = json.loads(_native.retargeted_manifest(json.dumps(m), json.dumps(live), json.dumps(p), p["retarget"]))
    for g in p["retarget"]:
        assert words_of(here, g) == words_of(after, g)
    probed = _native.probed_for(json.dumps(live), json.dumps(here))
    report = graphcheck.verify(here, probed)
    left = [(f.kind, f.subject) for f in report.findings if f.kind in _native.LIVE_KINDS]
    assert left == [], report.table
    # And before applying, the same pair has the findings the plan fixed.
    before = graphcheck.verify(m, live)
    assert any(f.kind == "drifted" for f in before.findings), before.table
