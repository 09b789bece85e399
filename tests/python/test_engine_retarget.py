"""The engine-scale retarget bench's dry run (benches/engine_retarget.py --device cpu): a
small decoder's piecewise and full graphs captured through instrument(keep_templates=True)
on CPU stand-in graphs, every layer's derived tensor rebuilt, then one retarget: every
graph that reads a rebuilt tensor patched (on the core's host patcher) in one native call,
none refused, and the recorder's manifest after it verifying with no live finding. The
figures are the GPU run's (benches/README.md); here the script is held to doing what it
says, so that a device run is not spent on a broken bench."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benches" / "engine_retarget.py"

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("retarget") / "r.json"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--layers", "3", "--sizes", "1,2,4,8",
         "--full", "2", "--runs", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text()), res.stdout


def test_every_graph_that_reads_a_rebuilt_tensor_is_retargeted_and_verifies_clean(dry_run):
    r, _ = dry_run
    # 4 sizes x (3 layers + 1) pieces, and 2 full graphs; all but each size's last piece
    # read a layer's qkv_scale.
    assert r["graphs"] == 4 * 4 + 2
    assert r["retargeted"] == 4 * 3 + 2
    assert r["edits"] >= r["retargeted"]
    assert r["live_findings_after"] == 0
    assert r["full_graphs_bitwise_equal_to_eager"] is None, "the CPU stand-ins replay nothing"
    assert len(r["retarget_runs_ms"]) == len(r["recapture_runs_ms"]) == 2


def test_the_graphs_are_patched_in_one_native_call_and_each_walked_once(dry_run):
    r, stdout = dry_run
    stages = r["retarget_stages"]
    assert stages["patch (driver)"]["calls"] == 1, stages
    assert stages["plan (verify + plan)"]["calls"] == 1, stages
    assert stages["walk patched graphs"]["calls"] == r["retargeted"], stages
    assert stages["recorder: replace walks"]["calls"] == 1, stages
    assert "the times are no figures" in stdout
