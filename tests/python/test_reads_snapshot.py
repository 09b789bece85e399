"""The reads view (``graphcheck.reads``) and graphcheck's syrupy extension, on CPU: two
recordings of one model at other addresses give the same text; a graph that reads one more
tensor no parameter or buffer holds adds its owner path; the fixture ``graphcheck_snapshot``
writes a snapshot with ``--snapshot-update``, passes on the next run (another process,
other addresses) and fails with the new path as a diff line when the graph reads more; and
without syrupy the fixture says to install it."""

import json
import os
import subprocess
import sys

import pytest

import graphcheck
from conftest import FAKE_CUDA_GRAPH, kernel, walked

pytest_plugins = ["pytester"]


def record(torch, extra=False):
    """A model and its two graphs, recorded as an engine's capture records them (walked
    graphs over CPU tensors, handed to a Recorder); with ``extra``, the decode graph also
    reads ``model.rope_cache``, a plain attribute: no parameter or buffer holds it. Returns
    the manifest and the model, which must outlive the comparison (its addresses are what
    a second recording may not reuse)."""
    import graphcheck.torch as gt
    from graphcheck import _native

    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    model.register_buffer("scale", torch.ones(4))
    model.rope_cache = torch.zeros(8)
    x = torch.zeros(4)
    rec = gt.Recorder(model)
    decode = [kernel(0, "gemv", model.proj.weight, model.proj.bias, x), kernel(1, "rms_norm", model.scale, x)]
    if extra:
        decode.append(kernel(2, "rotary", model.rope_cache, x))
    rec.add_graph("decode_bs1", _native.Walked.from_json(walked(*decode)), inputs={"x": x})
    prefill = [kernel(0, "gemm", model.proj.weight, model.proj.bias), kernel(1, "gemm", model.proj.weight)]
    rec.add_graph("prefill", _native.Walked.from_json(walked(*prefill)))
    return rec.manifest(), (model, x)


#: The reads view of ``record(torch)``, as a snapshot file holds it.
EXPECTED = """\
graphcheck reads v1 (kernels shown)
pools: none
owners:
  graphs["decode_bs1"].inputs["x"]: graph_input, float32[4], no pool
  model.proj.bias: parameter on Linear, float32[4], no pool
  model.proj.weight: parameter on Linear, float32[4, 4], no pool
  model.rope_cache: module_attribute on Module, float32[8], no pool
  model.scale: buffer on Module, float32[4], no pool
graphs:
  decode_bs1:
    reads:
      graphs["decode_bs1"].inputs["x"] (graph_input)
      model.proj.bias (parameter)
      model.proj.weight (parameter)
      model.scale (buffer)
    nodes:
      1 x kernel gemv
      1 x kernel rms_norm
  prefill:
    reads:
      model.proj.bias (parameter)
      model.proj.weight (parameter)
    nodes:
      2 x kernel gemm
"""


def test_the_view_names_each_graphs_owner_paths_and_kernels(torch):
    manifest, alive = record(torch)
    assert graphcheck.reads(manifest) == EXPECTED
    without = graphcheck.reads(manifest, kernels=False)
    assert without.splitlines()[0] == "graphcheck reads v1 (kernels left out)"
    assert "gemv" not in without and "nodes:" not in without
    assert [l for l in EXPECTED.splitlines()[1:] if "kernel" not in l and "nodes:" not in l] == without.splitlines()[1:]


def test_two_recordings_of_one_model_at_other_addresses_read_the_same(torch):
    first, alive_1 = record(torch)
    second, alive_2 = record(torch)
    bases = [{t["storage_base"] for t in graphcheck.load(m)["tensors"]} for m in (first, second)]
    assert bases[0].isdisjoint(bases[1]), bases  # both alive: nothing shared an address
    assert first != second
    for kernels in (True, False):
        assert graphcheck.reads(first, kernels=kernels) == graphcheck.reads(second, kernels=kernels)


def test_a_graph_reading_one_more_unregistered_tensor_adds_its_owner_path(torch):
    before, alive_1 = record(torch)
    after, alive_2 = record(torch, extra=True)
    old, new = graphcheck.reads(before).splitlines(), graphcheck.reads(after).splitlines()
    assert [l for l in new if l not in old] == [
        "      model.rope_cache (module_attribute)",
        "      1 x kernel rotary",
    ]
    assert [l for l in old if l not in new] == []
    # verify calls it what the new line says: read by a graph, registered nowhere.
    assert [(f.kind, f.subject) for f in graphcheck.verify(after).findings] == [
        ("unregistered", "model.rope_cache")
    ]


def test_every_form_of_a_manifest_gives_the_same_view(torch, tmp_path):
    manifest, alive = record(torch)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifest))
    forms = [manifest, graphcheck.load(manifest), graphcheck.Text(json.dumps(manifest)), path, str(path)]
    assert {graphcheck.reads(f) for f in forms} == {EXPECTED}


def test_a_live_snapshot_and_wrong_arguments_are_errors_naming_them(torch):
    live = "fixtures/gpu/corpus_marlin_live.json"
    with pytest.raises(graphcheck.GraphcheckError, match=f"^{live}: the reads view is of a manifest"):
        graphcheck.reads(live)
    with pytest.raises(graphcheck.GraphcheckError, match="kernels is True or False, not 'no'"):
        graphcheck.reads("fixtures/gpu/corpus_marlin_manifest.json", kernels="no")
    with pytest.raises(graphcheck.GraphcheckError, match="^document: expected a document"):
        graphcheck.reads(3)
    with pytest.raises(graphcheck.GraphcheckError, match="no-such.json"):
        graphcheck.reads("no-such.json")


def test_the_extension_serializes_documents_as_the_view_and_the_rest_as_its_base(torch):
    pytest.importorskip("syrupy", reason="SYRUPY IS NOT INSTALLED: ci/requirements-test.txt installs it")
    from graphcheck.syrupy import ReadsExtension, ReadsExtensionWithoutKernels

    manifest, alive = record(torch)
    assert ReadsExtension().serialize(manifest) == EXPECTED
    assert ReadsExtension().serialize(graphcheck.Text(json.dumps(manifest))) == EXPECTED
    no_kernels = ReadsExtensionWithoutKernels().serialize(manifest)
    assert no_kernels == graphcheck.reads(manifest, kernels=False)
    # A string is a string, and a dict that is no document is a dict: as syrupy's text
    # single-file extension writes them.
    assert ReadsExtension().serialize("plain text") == "plain text"
    assert ReadsExtension().serialize({"a": 1}) == str({"a": 1})
    with pytest.raises(graphcheck.GraphcheckError, match="not of a live snapshot"):
        ReadsExtension().serialize(graphcheck.load("fixtures/gpu/corpus_marlin_live.json"))


# The inner test run: an engine that captures through torch.cuda.CUDAGraph (a fake one, on
# CPU, whose walk reads the tensors the engine names), recorded by the plugin's fixture.
CONFTEST = '''
import json
import os
import pytest
import torch
from graphcheck import _native


''' + FAKE_CUDA_GRAPH + '''

@pytest.fixture
def engine():
    class Engine:
        def __init__(self):
            self.model = torch.nn.Module()
            self.model.proj = torch.nn.Linear(4, 4)
            self.model.rope_cache = torch.zeros(8)  # a plain attribute: no buffer

        def capture(self):
            tensors = [self.model.proj.weight, self.model.proj.bias]
            if os.environ.get("ENGINE_READS_ROPE_CACHE"):
                tensors.append(self.model.rope_cache)
            NEXT["tensors"], NEXT["name"] = tensors, "fused_decode"
            g = torch.cuda.CUDAGraph()
            g.capture_begin()
            g.capture_end()

    return Engine()
'''

TESTS = '''
def test_decode_graphs(graphcheck_recorder, graphcheck_snapshot, engine):
    graphcheck_recorder.register_model(engine.model)
    engine.capture()
    assert graphcheck_recorder.manifest() == graphcheck_snapshot
'''

#: The snapshot the inner test writes.
SNAPSHOT = """\
graphcheck reads v1 (kernels shown)
pools:
  graph pool of capture0: graph, sleep untouched, 1 graph
owners:
  model.proj.bias: parameter on Linear, float32[4], no pool
  model.proj.weight: parameter on Linear, float32[4, 4], no pool
  model.rope_cache: module_attribute on Module, float32[8], no pool
graphs:
  capture0 (pool graph pool of capture0):
    reads:
      model.proj.bias (parameter)
      model.proj.weight (parameter)
    nodes:
      1 x kernel fused_decode
"""


@pytest.fixture
def inner(pytester, torch):
    pytest.importorskip("syrupy", reason="SYRUPY IS NOT INSTALLED: ci/requirements-test.txt installs it")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_engine=TESTS)
    return pytester


def run(pytester, *args, syrupy=True):
    """The inner tests in a process of their own, as a user runs them (plugins by entry
    point; torch's tensors at other addresses than the last run's)."""
    options = ("--snapshot-no-colors",) if syrupy else ("-p", "no:syrupy")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", *options, *args)


def test_snapshot_update_writes_it_and_the_next_run_passes(inner):
    snapshot = inner.path / "__snapshots__" / "test_engine" / "test_decode_graphs.reads.txt"
    result = run(inner)
    result.assert_outcomes(failed=1)  # no snapshot yet
    result.stdout.fnmatch_lines(["*Snapshot 'test_decode_graphs' does not exist!*"])
    assert not snapshot.exists()
    run(inner, "--snapshot-update").assert_outcomes(passed=1)
    assert snapshot.read_text() == SNAPSHOT
    run(inner).assert_outcomes(passed=1)  # another process: other addresses, same text
    run(inner).assert_outcomes(passed=1)


def test_a_graph_reading_a_new_unregistered_tensor_fails_with_its_path_as_a_diff_line(inner, monkeypatch):
    snapshot = inner.path / "__snapshots__" / "test_engine" / "test_decode_graphs.reads.txt"
    run(inner, "--snapshot-update").assert_outcomes(passed=1)
    monkeypatch.setenv("ENGINE_READS_ROPE_CACHE", "1")
    result = run(inner)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # The diff as the failure shows it. The short summary after it repeats the message
    # in full where pytest sees a CI (the CI variable set), so it is left out.
    failure = out.split("short test summary info")[0]
    added = [l for l in failure.splitlines() if l.lstrip("E ").startswith("+")]
    assert [l.lstrip("E ") for l in added] == ["+       model.rope_cache (module_attribute)"], out
    assert snapshot.read_text() == SNAPSHOT  # a failure writes nothing
    # Accepted: the snapshot now holds the new read, and the run passes.
    run(inner, "--snapshot-update").assert_outcomes(passed=1)
    assert "      model.rope_cache (module_attribute)\n" in snapshot.read_text()
    run(inner).assert_outcomes(passed=1)


def test_without_syrupy_the_fixture_says_to_install_it(inner):
    # syrupy's plugin left out and its import refused, as where it is not installed.
    inner.makeconftest(CONFTEST + '\nimport sys\nsys.modules["syrupy"] = None\n')
    result = run(inner, syrupy=False)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*the graphcheck_snapshot fixture needs syrupy*pip install syrupy*"])


def test_with_syrupys_plugin_off_the_fixture_says_so(inner):
    result = run(inner, syrupy=False)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*syrupy is installed but its pytest plugin is not loaded*"])


def test_importing_the_plugin_imports_neither_torch_nor_syrupy():
    code = (
        "import sys, graphcheck.pytest_plugin; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'syrupy'}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRAPHCHECK_DIR"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
