"""vLLM's own sleep allocator (``CuMemAllocator``, vLLM 0.24.0) under graphcheck's replay
check, on the GPU: its tags read into pools with no declaration, its ``wake_up`` a
transition graphcheck sees by itself. Opt-in: GRAPHCHECK_GPU_TESTS=1, and vLLM importable
(``tests/python/scenarios/vllm_gpu.sh`` packs and installs the parts it needs on a machine
without a network)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = Path(__file__).parent / "scenarios" / "vllm_cumem.py"


@pytest.mark.parametrize("level", [1, 2])
def test_vllms_tags_are_pools_and_a_lost_tensor_is_refused_before_replay(cuda, level):
    pytest.importorskip("vllm.device_allocator.cumem", reason="vLLM is not installed")
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(level)], capture_output=True, text=True, timeout=300
    )
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Pools by tag, with vLLM's policy, and every tensor in its tag's pool.
    assert ["weights", "weights", "restored"] in out["pools"], out
    assert ["kv_cache", "kv_cache", "discarded"] in out["pools"], out
    assert ["model.state", "kv_cache"] in out["tensor_pools"], out
    assert ["model.scale", "weights"] in out["tensor_pools"], out
    assert out["capture"] == [["mispooled", "model.state"], ["unregistered", "model.scale"]], out
    assert out["patched"] and out["errors"] == [], out
    # Level 1 backs up `weights` (the constant too) and discards the KV cache; level 2
    # discards both, and the reload restores parameters only.
    lost = {"state"} if level == 1 else {"state", "const"}
    assert {g for g, refused in out["refused"].items() if refused} == lost, out
    assert out["findings"]["state"] == [["stale", "model.state"]], out
    if level == 2:
        assert out["findings"]["const"] == [["stale", "model.scale"]], out
    # Unchecked, the refused graphs replay wrong and the others right.
    assert {g for g, right in out["replay_right"].items() if not right} == lost, out
