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


@pytest.mark.parametrize("flow", ["resume", "refit", "preload"])
def test_a_persistent_state_under_the_kv_tag_is_refused_after_resume(cuda, flow):
    """``refit``: resume the weights, load new ones, resume the KV cache (verl over
    SGLang): the new weights are no finding, the lost state still is. ``preload``: the
    package's LD_PRELOAD mode (its hook intercepts cudaMalloc)."""
    pytest.importorskip("torch_memory_saver", reason="torch_memory_saver is not installed")
    env = dict(os.environ)
    if flow == "preload":
        from torch_memory_saver.utils import get_binary_path_from_package

        env["LD_PRELOAD"] = str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))
    done = subprocess.run(
        [sys.executable, str(SCENARIO), flow],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    print(done.stdout, done.stderr[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["patched"], "torch_memory_saver's resume marks a transition"
    # Its regions are pools by themselves; the state under the discarded tag is mispooled.
    assert ["kv_cache", "kv_cache", "discarded"] in out["pools"], out
    assert ["weights", "weights", "restored"] in out["pools"], out
    assert ["mispooled", "model.state"] in out["capture"], out
    assert not [f for f in out["capture"] if f[1].startswith("model.proj")], out
    assert out["refused"], out
    assert out["graph"] == "decode_bs8"
    # The state lost its contents; the weights, paused with a CPU backup, did not.
    assert ["stale", "model.state"] in out["findings"], out
    assert not [f for f in out["findings"] if f[1].startswith("model.proj")], out
    assert out["errors"] == []
    # graphcheck.sleep beside it: same address, contents exact after a level-1 round trip.
    assert out["sleep_beside"] == [True, True], out
    if flow == "refit":
        assert out["weights_changed"] and out["epoch"] == 3, out
