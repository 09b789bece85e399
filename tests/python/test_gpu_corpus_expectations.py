"""The six `gpu_corpus_*` reload scenarios of `fixtures/gpu/index.json` were recorded on an
H200 and their expectations were first written down from what verify printed. Here each
one is derived again, without graphcheck's code, from the two recorded documents as JSON
and the rules of `docs/findings.md` in the plain form these scenarios need (no carriers,
no shifts, no digests: none of the six has one), and compared with the index. A bug in
verify at recording time would show here as a disagreement instead of being locked in;
`tests/cli.rs` then checks that verify agrees with the index.

Each index finding also carries `because`: what the scenario (tests/python/
test_corpus_gpu.py) did that makes the finding right.
"""

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SIX = [
    "gpu_corpus_marlin_workspace",
    "gpu_corpus_cutlass_moe_strides",
    "gpu_corpus_machete_partial",
    "gpu_corpus_freed_then_reused",
    "gpu_corpus_clean_inplace",
    "gpu_corpus_module_global_cache",
]
NOT_PERSISTENT = {"graph_input", "graph_pool", "runtime_state"}
REGISTERED = {"parameter", "buffer", "buffer_non_persistent", "held"}


def scenario(name):
    index = json.loads((FIXTURES / "gpu" / "index.json").read_text())
    (s,) = [s for s in index["scenarios"] if s["name"] == name]
    return s


def doc(rel):
    return json.loads((FIXTURES / rel).read_text()) if rel else None


def addr(t):
    return int(t["storage_base"], 16) + t["offset"]


def view_key(t):
    return (addr(t), tuple(t["shape"]), tuple(t["stride"]), t["dtype"])


def allow_patterns(allow_rel):
    """The allowlist's kernel patterns for `unowned` (the six use entries by kernel)."""
    if allow_rel is None:
        return []
    allow = tomllib.loads((FIXTURES / allow_rel).read_text())
    return [k for e in allow["allow"] if "unowned" in e["kinds"] for k in e["kernels"]]


def allowed(kernels, patterns):
    return all(any(fnmatch.fnmatchcase(k, p) for p in patterns) for k in kernels)


def derive(manifest, live):
    """(kind, subject, graphs, kernels) from the raw documents (kernels for `unowned`)."""
    tensors = {t["id"]: t for t in manifest["tensors"]}
    owners = {}
    for o in manifest["owners"]:
        owners.setdefault(o["tensor"], []).append(o)
    graph_pools = {p["id"] for p in manifest["pools"] if p["kind"] == "graph"}
    allocations = {a["id"]: a for a in manifest["allocations"]}

    # view key -> (owner paths, graphs); base -> (graphs, kernel names)
    subjects, unowned = {}, {}
    for g in manifest["graphs"]:
        for node in g["nodes"]:
            for touch in node.get("touches", []):
                tid = touch.get("tensor")
                if tid is not None and owners.get(tid):
                    paths, graphs = subjects.setdefault(view_key(tensors[tid]), (set(), set()))
                    paths.update(o["path"] for o in owners[tid])
                    graphs.add(g["name"])
                    continue
                a = allocations.get(touch.get("allocation"))
                if a is not None and a.get("pool") in graph_pools:
                    continue
                base = addr(tensors[tid]) if tid is not None else int(a["base"], 16)
                graphs, kernels = unowned.setdefault(base, (set(), set()))
                graphs.add(g["name"])
                kernels.add(node.get("name") or node["kind"])

    found = []
    registration = {o["path"]: o["registration"] for o in manifest["owners"]}
    for key, (paths, graphs) in subjects.items():
        persistent = sorted(p for p in paths if registration[p] not in NOT_PERSISTENT)
        if not persistent:
            continue
        subject = " = ".join(persistent)
        if not any(registration[p] in REGISTERED for p in persistent):
            found.append(("unregistered", subject, graphs, ()))
        if live is None:
            continue
        live_tensors = {t["id"]: t for t in live["tensors"]}
        live_at = {o["path"]: live_tensors[o["tensor"]] for o in live["owners"]}
        if any(p in live_at and addr(live_at[p]) != key[0] for p in persistent):
            found.append(("drifted", subject, graphs, ()))
        probe = {int(p["addr"], 16): p for p in live["probes"]}[key[0]]
        if probe["state"] in ("free", "unmapped"):
            found.append(("freed", subject, graphs, ()))
        elif probe["state"] == "active":
            holders = {
                o["path"]
                for o in live["owners"]
                if addr(live_tensors[o["tensor"]]) <= key[0]
                < addr(live_tensors[o["tensor"]]) + live_tensors[o["tensor"]]["nbytes"]
            }
            if holders and not holders & set(persistent):
                found.append(("reused", subject, graphs, ()))
    for base, (graphs, kernels) in unowned.items():
        found.append(("unowned", f"{base:#x}", graphs, kernels))
    return found


@pytest.mark.parametrize("name", SIX)
def test_the_index_says_what_the_recorded_documents_imply(name):
    s = scenario(name)
    derived = derive(doc(s["manifest"]), doc(s["live"]))
    patterns = allow_patterns(s["allow"])
    expect = sorted(
        (f["kind"], f["subject"], tuple(sorted(f["graphs"]))) for f in s["expect"]["findings"]
    )
    got = sorted(
        (k, subj, tuple(sorted(g)))
        for k, subj, g, kernels in derived
        if not (k == "unowned" and allowed(kernels, patterns))
    )
    assert got == expect
    assert sorted((a["kind"], a["subject"]) for a in s["expect"]["allowed"]) == sorted(
        ("unowned", subj)
        for k, subj, _, kernels in derived
        if k == "unowned" and allowed(kernels, patterns)
    )
    assert s["expect"]["exit_code"] == (1 if expect else 0)


@pytest.mark.parametrize("name", SIX)
def test_every_expected_finding_says_what_the_scenario_did(name):
    s = scenario(name)
    for f in s["expect"]["findings"]:
        assert f.get("because", "").strip(), (name, f["kind"], f["subject"])
    assert "stated from what the scenario did" in s["made_by"], name
