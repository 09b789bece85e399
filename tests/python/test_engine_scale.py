"""The engine-scale yardstick's dry run (benches/engine_scale.py --device cpu): the
piecewise captures of a small decoder through instrument() on CPU stand-in graphs, in
every mode, the checks after a transition with nothing moved (no graph refused) and after
every layer's derived tensor was rebuilt (exactly the graphs that read one refused), the
written run verifiable by `graphcheck verify DIR`, and graphcheck's memory measured in two
child processes. The figures are the GPU run's (benches/README.md); here the script is
held to doing what it says."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benches" / "engine_scale.py"

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale")
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--layers", "3", "--sizes", "1,2,4,8",
         "--full", "2", "--runs", "2", "--checks", "2", "--json", str(out / "r.json"),
         "--keep", str(out / "run"), "--split"],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr
    return json.loads((out / "r.json").read_text()), out / "run"


def test_every_graph_of_the_piecewise_layout_is_captured_in_every_mode(dry_run):
    r, _ = dry_run
    # 4 sizes x (3 layers + 1) pieces, and 2 full graphs.
    assert r["graphs"] == 4 * 4 + 2
    assert set(r["capture_s"]) == {"plain", "dir", "check", "all"}
    assert all(len(v) == 2 for v in r["capture_all_s"].values())
    assert r["manifest_bytes"] > 0


def test_nothing_moved_clears_every_graph_and_a_rebuild_refuses_the_readers(dry_run):
    r, _ = dry_run
    assert r["refused"]["cleared"] == 0
    # Every graph but the last piece of each size reads a layer's qkv_scale.
    assert r["refused"]["rebuilt"] == 4 * 3 + 2
    assert len(r["cleared_all_ms"]) == 4 and len(r["rebuilt_all_ms"]) == 4


def test_the_kept_run_verifies_clean_from_the_command_line(dry_run):
    import graphcheck

    _, run = dry_run
    files = sorted(p.name for p in run.iterdir())
    assert len(files) == 2 and "live.json" in files
    report = graphcheck.verify(str(run))
    assert report.ok, report.table
    assert not report.findings


def test_memory_is_measured_in_two_child_processes(dry_run):
    r, _ = dry_run
    mem = r["memory"]
    assert mem["plain"]["graphs"] == mem["all"]["graphs"] == r["graphs"]
    assert isinstance(r["graphcheck_mib"], float)


def test_the_split_times_each_stage_of_every_instrumented_capture(dry_run):
    r, _ = dry_run
    split = r["split_ms"]
    # On CPU torch's capture_end is the stand-in's (not timed): only the collector's passes.
    assert all(k.startswith("gc: generation ") for k in split["plain"]), split["plain"]
    for mode in ("dir", "check", "all"):
        stages = split[mode]
        for stage in ("graphcheck: on_capture (all of it)", "walk (driver, Rust)", "record: add_graph"):
            assert stages[stage]["calls"] == r["graphs"], (mode, stage)
        # The walk is of the open capture (no template kept), before on_capture; inclusive
        # stages nest: the walk in it, the record in on_capture.
        assert stages["walk of the open capture (before capture_end)"]["calls"] == r["graphs"]
        assert stages["walk (driver, Rust)"]["ms"] <= stages["walk of the open capture (before capture_end)"]["ms"]
        assert stages["record"]["ms"] <= stages["graphcheck: on_capture (all of it)"]["ms"]
    assert "record: freeze: range digests" in split["all"]
    assert "record: freeze: range digests" not in split["check"]


def test_memory_is_split_into_anonymous_file_backed_and_heap(dry_run):
    r, _ = dry_run
    for child in ("plain", "all"):
        for phase in ("before", "captured", "checked"):
            sample = r["memory"][child]["split"][phase]
            assert {"RssAnon", "RssFile", "heap_in_use", "py_blocks"} <= set(sample)
            assert sample["RssAnon"] + sample["RssFile"] <= sample["VmRSS"] + 1
    assert r["memory"]["mappings_delta"]
