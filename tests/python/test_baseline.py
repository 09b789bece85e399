"""The benchmark's Python baseline does the same diff as graphcheck.

benches/baseline_verify.py is only a fair yardstick if it computes what `graphcheck verify`
computes. These tests hold it to the fixture index (every scenario's expected findings,
exactly, in report order) and to the graphcheck binary itself (the same findings on every
scenario). The hand-made scenarios in tests/python/data add one of every finding kind.
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
