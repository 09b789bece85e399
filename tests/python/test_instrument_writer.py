"""instrument()'s writer thread (issue 14): a capture reads the manifest's facts and leaves
the build and the write to a thread of their own; captures that come while it is busy are
written once, as the latest; flush() waits. CPU, with test_torch_instrument's fake class."""

import json
import threading
import warnings

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck import _native
from test_torch_instrument import capture, fake, make_model  # noqa: F401 - fixture


def test_captures_do_not_wait_for_the_build_and_the_latest_is_written(torch, fake, tmp_path, monkeypatch):
    """The first capture's build is held until the test lets it go: the three captures
    after it return while it is still held (had a capture waited for a build, the build
    would be over by then), and once it goes, the latest of them is the one built next."""
    model = make_model(torch)
    real = _native.build_manifest
    builds = []
    started = threading.Event()
    release = threading.Event()
    held = {"now": False}

    def held_build(spec, walked, **kwargs):
        builds.append(threading.current_thread().name)
        if len(builds) == 1:
            held["now"] = True
            started.set()
            # A guard against a deadlock if captures did wait: the state check below fails.
            release.wait(timeout=20)
            held["now"] = False
        return real(spec, walked, **kwargs)

    monkeypatch.setattr(_native, "build_manifest", held_build)
    writes = []
    real_write = _native.write_atomic
    monkeypatch.setattr(
        _native, "write_atomic",
        lambda path, data: writes.append(len(json.loads(data)["graphs"])) or real_write(path, data),
    )
    ins = gt.instrument(tmp_path, model=model)
    capture(torch, model)
    assert started.wait(timeout=60), "the first capture's build never began"
    for _ in range(3):
        capture(torch, model)
    assert held["now"] and builds == ["graphcheck-writer"], "a capture waited for the build"
    release.set()
    ins.flush()
    # The first capture's manifest, then the latest (the two between were never built).
    assert writes == [1, 4], writes
    assert builds == ["graphcheck-writer"] * 2, builds
    assert len(graphcheck.load(ins.path)["graphs"]) == 4
    assert ins.errors == []


def test_a_check_builds_from_the_facts_of_the_capture(torch, fake, monkeypatch):
    """The replay check's manifest is built at the first check, from what the latest
    capture read: a weight rebound after the capture is drifted, not taken as the owner."""
    model = make_model(torch)
    builds = []
    real = _native.build_manifest
    monkeypatch.setattr(_native, "build_manifest", lambda *a, **k: builds.append(1) or real(*a, **k))
    ins = gt.instrument(None, model=model, verify_on_replay="raise")
    g = capture(torch, model)
    assert builds == [], "nothing built at capture"
    with torch.no_grad():
        model.proj.weight = torch.nn.Parameter(model.proj.weight.detach().clone())
    gt.mark_transition("reload", "updated")
    try:
        g.replay()
        raise AssertionError("the replay went through")
    except gt.ReplayCheckError as e:
        assert [(f.kind, f.subject) for f in e.findings] == [
            ("drifted", "model.proj.weight"), ("freed", "model.proj.weight")
        ], e
    assert len(builds) == 1
    ins.manifest_json()
    assert len(builds) == 1, "built once, kept"


def test_walks_that_explain_nothing_wait_longer_and_flush_catches_up(torch, fake, tmp_path):
    """Each graph reads an input of its own that no root holds: the recorder walks at the
    first graph, then at the 2nd, 4th and 8th (each walk explained nothing, so the wait
    doubles), not at every graph. A tensor the model gains while walks wait is owned once
    the last write catches up."""
    from conftest import kernel, walked

    model = make_model(torch)
    ins = gt.instrument(tmp_path, model=model)
    inputs = []

    def capture_with_fresh_input(extra=None):
        x = torch.randn(4)
        inputs.append(x)
        tensors = [model.proj.weight, x] + ([extra] if extra is not None else [])
        fake.next = walked(kernel(0, "gemv", *tensors))
        g = torch.cuda.CUDAGraph()
        g.capture_begin()
        g.capture_end()

    walks = []
    for _ in range(8):
        capture_with_fresh_input()
        walks.append(ins.recorder.walks)
    assert walks == [1, 2, 2, 3, 3, 3, 3, 4], walks
    # The model gains a tensor that the next graph reads; the recorder waits to walk.
    model.late = torch.nn.Parameter(torch.randn(4))
    capture_with_fresh_input(model.late)
    assert ins.recorder.walks == 4
    ins.flush()
    assert ins.recorder.walks == 5
    owners = {o["path"] for o in graphcheck.load(ins.path)["owners"]}
    assert "model.late" in owners, owners


def test_a_writer_thread_that_cannot_start_leaves_the_capture_to_flush(torch, fake, tmp_path):
    """Regression: where the writer thread could not start (no thread left to the process),
    flush() waited 120 s for it and then wrote nothing, the capture counted as written."""
    model = make_model(torch)
    ins = gt.instrument(tmp_path, model=model)

    def cannot_start(self):
        raise RuntimeError("can't start new thread")

    # Its own patch, undone alone: `monkeypatch.undo()` would also undo the `fake`
    # fixture's, and the uninstrument at teardown would then put the fake CUDAGraph back
    # into torch for every later test (a later real capture's walk read a fake handle).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(threading.Thread, "start", cannot_start)
        with pytest.warns(RuntimeWarning, match="the manifest was not written .*can't start new thread"):
            capture(torch, model)
    # Nothing is left to wait for: the wait is over at once (no clock: a zero timeout
    # answers only what already holds), and flush writes without a stuck-writer warning.
    assert ins._writer.wait(timeout=0), "flush would wait for a writer thread that never ran"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = ins.flush()
    assert written == ins.path
    assert len(graphcheck.load(ins.path)["graphs"]) == 1


def test_a_stuck_writer_is_reported_not_waited_for_silently(torch, fake, tmp_path, monkeypatch):
    """Regression: flush() (at exit too) gave up on a writer stuck in its write (a stalled
    file system) after 120 s without a word: the manifest was missing and nothing said so."""
    from graphcheck._instrument import writer

    model = make_model(torch)
    release = threading.Event()
    real = _native.write_atomic
    monkeypatch.setattr(_native, "write_atomic", lambda path, data: release.wait() and real(path, data))
    monkeypatch.setattr(writer, "FLUSH_WAIT_S", 0.5)
    ins = gt.instrument(tmp_path, model=model)
    capture(torch, model)
    with pytest.warns(RuntimeWarning, match="not be written: the writer thread was still busy after 0.5 s"):
        assert ins.flush() is None
    assert [str(e) for e in ins.errors] == ["the writer thread did not finish in 0.5 s"]
    release.set()
    ins._writer.wait()


def test_a_stopped_instrumentation_is_freed_with_all_it_recorded(torch, fake):
    """Regression: each instrument() registered its bound ``flush`` with atexit, which held
    the instrumentation (its recorder, walked graphs and manifests) until the process
    exited, stopped or not: at 1,718 graphs the release measured nothing given back."""
    import gc
    import weakref

    model = make_model(torch)
    ins = gt.instrument(False, model=model, verify_on_replay="warn")
    graphs = [capture(torch, model) for _ in range(3)]
    assert ins.captures == 3
    refs = [weakref.ref(ins), weakref.ref(ins.recorder)]
    gt.uninstrument(ins)
    del ins
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert len(graphs) == 3  # the graphs outlive it


def test_a_live_instrumentation_is_flushed_at_interpreter_exit(tmp_path):
    """The one exit hook writes what a live instrumentation has not written yet."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    script = f"""
import sys
sys.path.insert(0, {str(here)!r})
import torch
import graphcheck.torch as gt
from graphcheck import _native
import test_torch_instrument as t
t.WALKS = t.Walks()
torch.cuda.CUDAGraph = torch.cuda.graphs.CUDAGraph = t.FakeCUDAGraph
_native.walk = lambda h: _native.Walked.from_json(t.WALKS(h))
_native.capturing_graph = t.WALKS.capturing_graph
import graphcheck._instrument.patch as patch
patch.current_stream = lambda: t.FAKE_STREAM
model = t.make_model(torch)
ins = gt.instrument({str(tmp_path)!r}, model=model, write_every=100)
t.capture(torch, model)
t.capture(torch, model)
assert not list(__import__("pathlib").Path({str(tmp_path)!r}).iterdir()), "written before exit"
"""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", gt.ENV_DIR)}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    files = list(tmp_path.iterdir())
    assert len(files) == 1, files
    assert len(graphcheck.load(files[0], expect="manifest")["graphs"]) == 2


def test_a_stopped_instrumentation_with_a_directory_is_freed_without_waiting_for_its_writer(
    torch, fake, tmp_path
):
    """The writer thread holds its instrumentation while it waits for the next ask (5 s
    idle); a stop ends it, so the instrumentation is freed at once."""
    import gc
    import time
    import weakref

    model = make_model(torch)
    ins = gt.instrument(tmp_path, model=model)
    for _ in range(2):
        capture(torch, model)
    thread = ins._writer._thread
    assert thread is not None and thread.is_alive()
    ref = weakref.ref(ins)
    t0 = time.perf_counter()
    gt.uninstrument(ins)
    del ins
    thread.join(timeout=4.0)
    gc.collect()
    assert not thread.is_alive() and time.perf_counter() - t0 < 4.0
    assert ref() is None
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and len(graphcheck.load(files[0], expect="manifest")["graphs"]) == 2
