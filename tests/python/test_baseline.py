"""The benchmark's Python baseline does the same diff as graphcheck.

benches/baseline_verify.py is only a fair yardstick if it computes what `graphcheck verify`
computes. These tests hold it to the fixture index (every scenario's expected findings,
exactly, in report order) and to the graphcheck binary itself (the same findings on every
scenario). The hand-made scenarios in tests/python/data add one of every finding kind, and
the tests at the end build small documents of their own for the capture identity (issue
28): storages numbered apart at one address, and a path rebound between two captures.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "benches" / "baseline_verify.py"
INDEXES = [REPO / "fixtures" / "index.json", Path(__file__).resolve().parent / "data" / "index.json"]


def load_baseline():
    spec = importlib.util.spec_from_file_location("baseline_verify", BASELINE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


baseline = load_baseline()


def scenarios():
    """(index path, scenario) for every scenario of every index; a missing index is a
    parameter of its own, so that its test fails instead of vanishing."""
    out = []
    for index in INDEXES:
        if not index.is_file():
            out.append(pytest.param(index, None, id=f"missing:{index.relative_to(REPO)}"))
            continue
        for s in json.loads(index.read_text())["scenarios"]:
            out.append(pytest.param(index, s, id=s["name"]))
    return out


def files(index, scenario):
    """The scenario's manifest, live snapshot and allowlist paths (paths in the index are
    relative to its folder)."""
    root = index.parent
    return tuple(root / scenario[k] if scenario.get(k) else None for k in ("manifest", "live", "allow"))


def pairs(findings):
    return [(f["kind"], f["subject"]) for f in findings]


def run_baseline(index, scenario):
    manifest, live, allow = files(index, scenario)
    return baseline.verify(
        json.loads(manifest.read_text()),
        json.loads(live.read_text()) if live else None,
        baseline.load_allowlist(allow) if allow else None,
    )


def graphcheck_binary():
    if os.environ.get("GRAPHCHECK_BIN"):
        return Path(os.environ["GRAPHCHECK_BIN"])
    for profile in ("debug", "release"):
        candidate = REPO / "target" / profile / "graphcheck"
        if candidate.is_file():
            return candidate
    return None


@pytest.mark.parametrize("index, scenario", scenarios())
def test_baseline_matches_the_index(index, scenario):
    assert scenario is not None, f"{index} is missing: the fixture corpus must be generated"
    findings, allowed = run_baseline(index, scenario)
    expect = scenario["expect"]
    assert findings == pairs(expect["findings"])
    assert allowed == pairs(expect["allowed"])


@pytest.mark.parametrize("index, scenario", scenarios())
def test_graphcheck_agrees_with_the_baseline(index, scenario):
    assert scenario is not None, f"{index} is missing: the fixture corpus must be generated"
    binary = graphcheck_binary()
    if binary is None or not binary.is_file():
        pytest.fail(
            "no graphcheck binary: build it first (`cargo build -p graphcheck-cli`), "
            "or point GRAPHCHECK_BIN at one"
        )
    manifest, live, allow = files(index, scenario)
    argv = [binary, "verify", manifest] + ([live] if live else [])
    argv += (["--allow", allow] if allow else []) + ["--format", "json"]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    findings, allowed = run_baseline(index, scenario)
    assert pairs(report["findings"]) == findings
    # An allowed entry wraps its finding: {"finding": {...}, "allowed_by", "reason"}.
    assert pairs(a["finding"] for a in report["allowed"]) == allowed
    # An unused allowlist entry alone is a warning: exit 0.
    assert done.returncode == (1 if any(k != "unused_allow" for k, _ in findings) else 0)


def test_baseline_command_line_prints_findings_and_exits_1():
    data = REPO / "tests" / "python" / "data" / "handmade"
    done = subprocess.run(
        [sys.executable, BASELINE, data / "manifest.json", data / "live.json",
         "--allow", data / "allow.toml"],
        capture_output=True, text=True,
    )
    assert done.returncode == 1, done.stderr
    printed = json.loads(done.stdout)
    assert all(set(f) == {"kind", "subject"} for f in printed)
    assert ("unused_allow", "model.nothing.**") in pairs(printed)


def test_baseline_exits_0_when_clean(tmp_path):
    data = REPO / "tests" / "python" / "data" / "handmade"
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["graphs"] = []  # nothing touched: nothing to report
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    done = subprocess.run([sys.executable, BASELINE, path], capture_output=True, text=True)
    assert (done.returncode, json.loads(done.stdout)) == (0, [])


def test_baseline_exits_2_on_bad_input(tmp_path):
    live = REPO / "tests" / "python" / "data" / "handmade" / "live.json"
    wrong_kind = subprocess.run([sys.executable, BASELINE, live], capture_output=True, text=True)
    assert wrong_kind.returncode == 2
    (tmp_path / "allow.toml").write_text('[[allow]]\npath = "a"\n')  # no reason
    manifest = REPO / "tests" / "python" / "data" / "handmade" / "manifest.json"
    no_reason = subprocess.run(
        [sys.executable, BASELINE, manifest, "--allow", tmp_path / "allow.toml"],
        capture_output=True, text=True,
    )
    assert no_reason.returncode == 2
    assert "reason" in no_reason.stderr


def test_glob_star_stays_in_one_hop_and_brackets_are_literal():
    g = baseline.glob_regex("model.layers[*].attn.*")
    assert g.fullmatch("model.layers[12].attn.W_UV")
    assert not g.fullmatch("model.layers[12].attn.impl.W_UV")
    assert not g.fullmatch("model.layers1.attn.W_UV")
    assert baseline.glob_regex("**.workspace").fullmatch("model.layers[0].kernel.workspace")
    assert not baseline.glob_regex("**.workspace").fullmatch("model.workspace2")


# --- capture identity (issue 28): hand-made documents ----------------------------------
#
# Each test below writes a small format 1 manifest and live snapshot, runs the baseline on
# them and on their format 2 conversion (`graphcheck convert`, so a `storage` column must
# come through the baseline's column reading), and holds graphcheck's own report to the
# same findings and the same number of subjects.

PRODUCER = {"tool": "hand", "tool_version": "0", "rank": 0, "world_size": 1}
POOLS = [
    {"id": 0, "name": "weights", "kind": "weights", "sleep": "restored"},
    {"id": 1, "name": "graph", "kind": "graph", "sleep": "untouched"},
]
HEAP = 0x10000
ALLOCATIONS = [{"id": 0, "base": hex(HEAP), "size": 0x10000, "pool": 0}]


def vector(tid, base, storage=None):
    """A 256-byte float32 tensor of its own storage at `base`, numbered where `storage` is
    given (live snapshots carry no numbers)."""
    t = {
        "id": tid, "storage_base": hex(base), "storage_nbytes": 256, "offset": 0,
        "nbytes": 256, "shape": [64], "stride": [1], "dtype": "float32", "itemsize": 4,
        "device": "cuda:0", "allocation": 0, "pool": 0,
    }
    if storage is not None:
        t["storage"] = storage
    return t


def manifest_of(tensors, owners, reads):
    """A manifest whose `owners` are (path, tensor id) parameters and whose graphs, by
    name, each read their tensor ids in one kernel."""
    by_id = {t["id"]: t for t in tensors}
    graphs = [
        {
            "id": i, "name": name, "pool": 1, "node_counts": {"kernel": 1},
            "nodes": [{
                "index": 0, "kind": "kernel", "name": f"k_{name}",
                "touches": [
                    {"param": p, "offset": 0, "addr": by_id[tid]["storage_base"],
                     "tensor": tid, "allocation": 0}
                    for p, tid in enumerate(tids)
                ],
            }],
        }
        for i, (name, tids) in enumerate(reads.items())
    ]
    return {
        "format_version": 1, "kind": "manifest", "producer": PRODUCER, "pools": POOLS,
        "allocations": ALLOCATIONS, "tensors": tensors,
        "owners": [{"path": p, "tensor": t, "registration": "parameter"} for p, t in owners],
        "graphs": graphs,
    }


def live_of(tensors, owners, probes):
    """A live snapshot after an event that preserves contents; `probes` maps each address
    the graphs hold to its state."""
    return {
        "format_version": 1, "kind": "live", "producer": PRODUCER,
        "event": {"name": "step", "contents": "preserved"}, "pools": POOLS,
        "allocations": ALLOCATIONS, "tensors": tensors,
        "owners": [{"path": p, "tensor": t, "registration": "parameter"} for p, t in owners],
        "probes": [
            {"addr": hex(a), "state": state, "allocation": 0, "pool": 0}
            for a, state in probes.items()
        ],
    }


def graphcheck(*argv):
    binary = graphcheck_binary()
    if binary is None or not binary.is_file():
        pytest.fail("no graphcheck binary: build it first (`cargo build -p graphcheck-cli`)")
    return subprocess.run([binary, *map(str, argv)], capture_output=True, text=True)


def verified(tmp_path, manifest, live):
    """The baseline's findings on the pair, after checking that its format 2 conversion
    gives the same and that graphcheck agrees; with graphcheck's findings, (kind, subject)
    -> the graphs it names."""
    paths = []
    for name, doc in (("manifest", manifest), ("live", live)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    findings, _ = baseline.verify(manifest, live)
    converted = []
    for path in paths:
        done = graphcheck("convert", path, "--format-version", "2")
        assert done.returncode == 0, done.stderr
        converted.append(json.loads(done.stdout))
    assert converted[0]["format_version"] == 2
    assert baseline.verify(*converted) == (findings, [])
    done = graphcheck("verify", *paths, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert pairs(report["findings"]) == findings
    subjects, _, _ = baseline.build_subjects(manifest)
    assert len(subjects) == report["subjects"]
    return findings, {(f["kind"], f["subject"]): f["graphs"] for f in report["findings"]}


def one_memory_two_storages(numbered):
    """`model.a`, read by bs1, died after its capture, and the allocator gave its block to
    `model.b`, of the same layout, read by bs8; the live model holds only `model.b`. Where
    `numbered`, the manifest numbers the two storages, as the recorder does."""
    w = HEAP
    manifest = manifest_of(
        [vector(0, w, 0 if numbered else None), vector(1, w, 1 if numbered else None)],
        [("model.a", 0), ("model.b", 1)],
        {"bs1": [0], "bs8": [1]},
    )
    live = live_of([vector(1, w)], [("model.b", 1)], {w: "active"})
    return manifest, live


def test_a_storage_that_died_between_captures_is_reused_for_its_graph_alone(tmp_path):
    # model.a's bytes are model.b's now: bs1 reads another owner's data. model.b shares an
    # address with model.a, not its storage, so it neither carries model.a nor answers for it.
    findings, graphs = verified(tmp_path, *one_memory_two_storages(numbered=True))
    assert findings == [("vanished", "model.a"), ("reused", "model.a")]
    assert graphs == {("vanished", "model.a"): ["bs1"], ("reused", "model.a"): ["bs1"]}


def test_without_storage_numbers_the_two_records_are_one_subject_again(tmp_path):
    # Documents written before `storage`: one view is one subject, its owners model.a and
    # model.b, and model.b keeping it hides bs1's read (the old answer). The numbers alone
    # make the difference, as the subject counts show.
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    unnumbered = one_memory_two_storages(numbered=False)
    numbered = one_memory_two_storages(numbered=True)
    assert verified(old, *unnumbered) == ([], {})
    assert len(baseline.build_subjects(unnumbered[0])[0]) == 1
    assert len(baseline.build_subjects(numbered[0])[0]) == 2
    assert verified(new, *numbered)[0] != []


def test_a_path_rebound_between_captures_is_drifted_for_the_first_graph_only(tmp_path):
    # bs8 captured layer.w at x; layer.w was then rebound to a new tensor at y, which bs1
    # captured, and x was freed. The manifest gives layer.w once per storage, the last
    # walk's first. bs8 still reads x: drifted and freed, for bs8 alone; bs1 is fine.
    x, y = HEAP, HEAP + 0x100
    manifest = manifest_of(
        [vector(0, y, 1), vector(1, x, 0)],
        [("layer.w", 0), ("layer.w", 1)],
        {"bs8": [1], "bs1": [0]},
    )
    live = live_of([vector(0, y)], [("layer.w", 0)], {x: "free", y: "active"})
    (tmp_path / "alone").mkdir()
    findings, graphs = verified(tmp_path / "alone", manifest, live)
    assert findings == [("drifted", "layer.w"), ("freed", "layer.w")]
    assert graphs == {("drifted", "layer.w"): ["bs8"], ("freed", "layer.w"): ["bs8"]}

    # The same rebind in a list that then shifted: ws[1] was rebound from b0 (at z0, read
    # by bs8, freed) to b1 (at z1, read by bs1); afterwards ws[0] took a new tensor, ws[1]
    # took ws[0]'s a (at xa) and ws[2] took b1. ws[1] now holding a at xa is the list's
    # shift, not a new tensor in a's freed block, because a tensor ws[1] held at capture,
    # b1, is still held: any of a rebound path's records counts. The lone path above needs
    # no more than view keys (x and y differ); here the records of ws[1] decide, in either
    # order (the last walk's first, as the recorder writes them, and the other way round).
    xa, z0, z1, new = HEAP + 0x200, HEAP + 0x300, HEAP + 0x400, HEAP + 0x500
    for order in ((1, 2), (2, 1)):
        manifest = manifest_of(
            [vector(0, xa, 0), vector(1, z1, 1), vector(2, z0, 2)],
            [("ws[0]", 0)] + [("ws[1]", tid) for tid in order],
            {"bs8": [0, 2], "bs1": [0, 1]},
        )
        live = live_of(
            [vector(9, new), vector(0, xa), vector(1, z1)],
            [("ws[0]", 9), ("ws[1]", 0), ("ws[2]", 1)],
            {xa: "active", z0: "free", z1: "active"},
        )
        folder = tmp_path / f"list{order[0]}{order[1]}"
        folder.mkdir()
        findings, graphs = verified(folder, manifest, live)
        # a is reached through ws[1] (no `reused`); ws[0] holds a tensor no graph read.
        assert findings == [("drifted", "ws[0]"), ("drifted", "ws[1]"), ("freed", "ws[1]")]
        assert graphs[("drifted", "ws[1]")] == ["bs8"]
        assert graphs[("freed", "ws[1]")] == ["bs8"]
