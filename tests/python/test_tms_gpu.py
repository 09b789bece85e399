"""graphcheck's replay check with torch_memory_saver (SGLang's allocator), on the GPU:
its ``resume`` is a transition graphcheck sees without the engine saying so. Opt-in:
GRAPHCHECK_GPU_TESTS=1, and torch_memory_saver installed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = Path(__file__).parent / "scenarios" / "tms_resume.py"


@pytest.mark.parametrize("flow", ["resume", "refit"])
def test_a_persistent_state_under_the_kv_tag_is_refused_after_resume(cuda, flow):
    """``refit``: resume the weights, load new ones, resume the KV cache (verl over
    SGLang): the new weights are no finding, the lost state still is."""
    pytest.importorskip("torch_memory_saver", reason="torch_memory_saver is not installed")
    done = subprocess.run(
        [sys.executable, str(SCENARIO), flow],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    print(done.stdout, done.stderr[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["patched"], "torch_memory_saver's resume marks a transition"
    assert out["refused"], out
    assert out["graph"] == "decode_bs8"
    # The state lost its contents; the weights, paused with a CPU backup, did not.
    assert ["stale", "model.state"] in out["findings"], out
    assert not [f for f in out["findings"] if f[1].startswith("model.proj")], out
    assert out["errors"] == []
    if flow == "refit":
        assert out["weights_changed"] and out["epoch"] == 3, out
