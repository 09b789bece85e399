"""The pytest plugin (entry point pytest11 `graphcheck`), run by pytester on CPU: the inner
tests capture through a fake torch.cuda.CUDAGraph and a fake walker returning hand-written
walked graphs over CPU tensors, then name checkpoints."""

import json
import os

import pytest

# Imported here, before any test sets GRAPHCHECK_DIR: imported first under the variable (as
# when this file ran alone), graphcheck.torch instruments this process at import, before the
# inner conftest's fake CUDAGraph is in place, and the inner captures were not recorded.
import graphcheck.torch  # noqa: F401
from conftest import FAKE_CUDA_GRAPH

pytest_plugins = ["pytester"]

CONFTEST = '''
import json
import pytest

import torch
import graphcheck.torch as gt
from graphcheck import _native


''' + FAKE_CUDA_GRAPH + '''

@pytest.fixture
def engine():
    """An engine that captures with plain torch calls, knowing nothing of graphcheck."""
    class Engine:
        def __init__(self):
            self.model = torch.nn.Module()
            self.model.proj = torch.nn.Linear(4, 4)
            self.model.register_buffer("w_uv", torch.zeros(4))

        def capture(self):
            NEXT["tensors"] = [self.model.proj.weight, self.model.w_uv]
            g = torch.cuda.CUDAGraph()
            g.capture_begin()
            g.capture_end()
            assert g.instantiated
            return g

        def reload_in_place(self):
            with torch.no_grad():
                self.model.proj.weight.copy_(torch.ones(4, 4))

        def rebuild_derived(self):
            self.model.w_uv = torch.ones(4)  # a new tensor: the graph reads the old one

    return Engine()
'''

TESTS = '''
import graphcheck


def test_plugin_is_loaded_by_entry_point(request):
    plugin = request.config.pluginmanager.get_plugin("graphcheck")
    assert plugin is not None and plugin.__name__ == "graphcheck.pytest_plugin"


def test_clean_reload(graphcheck_recorder, engine):
    graphcheck_recorder.register_model(engine.model)
    engine.capture()
    assert graphcheck_recorder.captures == 1
    report = graphcheck_recorder.checkpoint(name="after capture")
    assert report.ok and report.graphs == 1
    engine.reload_in_place()
    graphcheck_recorder.checkpoint(name="after reload")
    assert [n for n, _ in graphcheck_recorder.checkpoints] == ["after capture", "after reload"]


def test_rebuilt_tensor_fails_the_checkpoint(graphcheck_recorder, engine):
    graphcheck_recorder.register_model(engine.model)
    engine.capture()
    graphcheck_recorder.checkpoint(name="after capture")
    engine.rebuild_derived()
    graphcheck_recorder.checkpoint(name="after reload")


def test_model_given_at_the_checkpoint(graphcheck_recorder, engine):
    engine.capture()
    graphcheck_recorder.checkpoint(engine.model, name="after capture")


def test_no_capture_fails(graphcheck_recorder):
    graphcheck_recorder.checkpoint(name="nothing")


def test_torch_is_restored_after_the_test():
    import torch
    assert torch.cuda.CUDAGraph.__name__ == "FakeCUDAGraph"
'''


@pytest.fixture
def inner(pytester, torch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_engine=TESTS)
    return pytester


def test_plugin_records_and_verifies_at_named_checkpoints(inner):
    result = inner.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4, failed=2)
    out = result.stdout.str()
    # The failure is the report's table, under the checkpoint's name.
    assert "graphcheck checkpoint 'after reload':" in out
    assert "drifted" in out and "model.w_uv" in out
    assert "graphcheck checkpoint 'nothing': no CUDA graph capture was recorded" in out
    failed = {line.split("::")[-1].split()[0] for line in out.splitlines() if line.startswith("FAILED")}
    assert failed == {"test_rebuilt_tensor_fails_the_checkpoint", "test_no_capture_fails"}


def test_graphcheck_dir_writes_each_tests_manifest(inner, tmp_path):
    out_dir = tmp_path / "manifests"
    result = inner.runpytest("-p", "no:cacheprovider", "-q", f"--graphcheck-dir={out_dir}")
    result.assert_outcomes(passed=4, failed=2)
    names = sorted(os.listdir(out_dir))
    assert names == [
        "test_engine.py_test_clean_reload.json",
        "test_engine.py_test_model_given_at_the_checkpoint.json",
        "test_engine.py_test_rebuilt_tensor_fails_the_checkpoint.json",
    ]
    m = json.loads((out_dir / names[0]).read_text())
    assert m["kind"] == "manifest" and [g["name"] for g in m["graphs"]] == ["capture0"]


def test_the_plugin_keeps_its_manifests_out_of_graphcheck_dir(inner, tmp_path, monkeypatch):
    # Regression: the fixture's instrument(None) took $GRAPHCHECK_DIR too, so with the
    # variable set every test wrote a manifest there (a folder instrumentation-<n>/ and a
    # warning each); the plugin's manifests go to --graphcheck-dir only.
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    monkeypatch.setenv("GRAPHCHECK_DIR", str(env_dir))
    out_dir = tmp_path / "manifests"
    result = inner.runpytest("-p", "no:cacheprovider", "-q", f"--graphcheck-dir={out_dir}")
    result.assert_outcomes(passed=4, failed=2)
    assert os.listdir(env_dir) == []
    assert len(os.listdir(out_dir)) == 3


def test_instrument_false_keeps_the_manifest_in_memory_whatever_graphcheck_dir_says(
    tmp_path, monkeypatch, torch
):
    import graphcheck.torch as gt

    monkeypatch.setenv("GRAPHCHECK_DIR", str(tmp_path))
    ins = gt.instrument(False)
    try:
        assert ins.directory is None and ins.manifest_path() is None
    finally:
        gt.uninstrument(ins)
    ins = gt.instrument(None)
    try:
        assert ins.directory == str(tmp_path)
    finally:
        gt.uninstrument(ins)
