"""graphcheck's pytest plugin (entry point ``pytest11``, loaded wherever graphcheck is
installed): record the CUDA graph captures a test makes, and verify them at the points the
test names.

.. code-block:: python

    def test_reload_keeps_graphs(graphcheck_recorder, engine):
        graphcheck_recorder.register_model(engine.model)   # owners of what graphs read
        engine.capture_cuda_graphs()                        # unchanged engine code
        graphcheck_recorder.checkpoint(name="after capture")   # capture-time checks
        engine.reload_weights()
        graphcheck_recorder.checkpoint(name="after reload")    # snapshot + verify

The fixture turns :func:`graphcheck.torch.instrument` on for the test's duration (every
``torch.cuda.graph`` / ``CUDAGraph`` capture is recorded, none of the test's code changes)
and off afterwards. :meth:`GraphcheckRecorder.checkpoint` snapshots the registered roots (or
the model it is given), verifies against the captures so far, and fails the test with the
report's table on any finding. ``--graphcheck-dir DIR`` also writes each test's manifest to
``DIR/<test id>.json``.

The fixture ``graphcheck_snapshot`` is syrupy's ``snapshot`` with graphcheck's extension
(:class:`graphcheck.syrupy.ReadsExtension`): ``assert graphcheck_recorder.manifest() ==
graphcheck_snapshot`` keeps what each graph reads as a text file beside the test, and
``pytest --snapshot-update`` accepts a change (``docs/recipes/pytest.md``). It needs syrupy
installed; without it, a test that asks for the fixture fails saying so.

Importing this module imports neither torch, ``graphcheck.torch`` nor syrupy: each is
imported by the fixture that uses it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Optional

import pytest

import graphcheck

__all__ = ["GraphcheckRecorder", "graphcheck_recorder", "graphcheck_snapshot", "pytest_addoption"]


def pytest_addoption(parser) -> None:
    group = parser.getgroup("graphcheck")
    group.addoption(
        "--graphcheck-dir",
        default=None,
        metavar="DIR",
        help="write the manifest each graphcheck_recorder test recorded to DIR/<test id>.json",
    )


class GraphcheckRecorder:
    """The ``graphcheck_recorder`` fixture: captures of the test, and checkpoints."""

    def __init__(self, instrumentation, nodeid: str):
        self.instrumentation = instrumentation
        self.nodeid = nodeid
        #: (name, report) of every checkpoint passed so far.
        self.checkpoints: list = []

    @property
    def recorder(self):
        """The :class:`graphcheck.torch.Recorder` the captures go into (add pools here)."""
        return self.instrumentation.recorder

    @property
    def captures(self) -> int:
        """Captures recorded so far."""
        return self.instrumentation.captures

    def register_model(self, model, root: str = "model") -> None:
        """Names an object whose tensors the captures read (held weakly)."""
        self.instrumentation.register_model(model, root)

    def manifest(self) -> dict:
        """The manifest of the test's captures so far."""
        if self.instrumentation.errors:
            raise self.instrumentation.errors[0]
        return self.instrumentation.manifest()

    def checkpoint(
        self,
        model: Any = None,
        *,
        name: str = "checkpoint",
        root: str = "model",
        allow: Optional[graphcheck.Allow] = None,
        contents: str = "preserved",
        digests: Any = None,
        reference: Any = None,
        runtime_state: Iterable[str] = (),
        live: bool = True,
    ) -> graphcheck.Report:
        """Verifies the captures so far and fails the test with the table on any finding.

        ``model`` not registered yet is registered under ``root`` first (the captures'
        owners come from that walk, so give it at the first checkpoint after capturing).
        With ``live`` (the default) the registered roots, ``model`` in place of ``root``, are
        snapshotted now (``event`` is ``name``; ``contents``, ``digests`` and ``reference``
        as for :func:`graphcheck.torch.snapshot`) and every kind is checked; with
        ``live=False``, or with nothing to snapshot, only the capture-time checks run.
        Returns the report when clean."""
        from graphcheck import torch as gt

        if self.captures == 0 and not self.instrumentation.errors:
            pytest.fail(f"graphcheck checkpoint {name!r}: no CUDA graph capture was recorded", pytrace=False)
        if model is not None and root not in self.instrumentation.recorder.roots():
            # The captures' owners come from this walk: give the model at the first
            # checkpoint after capturing (or register_model it), not only after a reload.
            self.register_model(model, root)
        manifest = self.manifest()
        snap = None
        roots = self.instrumentation.recorder.roots()
        if model is not None:
            roots[root] = model  # the model as it is now, under the name it was recorded
        if live and roots:
            snap = gt.snapshot(
                None,
                manifest,
                roots=roots,
                event=name,
                contents=contents,
                digests=digests,
                reference=reference,
                runtime_state=runtime_state,
                recorder=self.instrumentation.recorder,
            )
        report = graphcheck.verify(manifest, snap, allow)
        if not report.ok:
            pytest.fail(f"graphcheck checkpoint {name!r}:\n{report.table}", pytrace=False)
        self.checkpoints.append((name, report))
        return report


def _file_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:200] + ".json"


@pytest.fixture
def graphcheck_recorder(request):
    """Records every CUDA graph capture the test makes (``graphcheck.torch.instrument``
    for its duration); ``checkpoint()`` verifies."""
    from graphcheck import torch as gt

    # In memory: the manifest goes to --graphcheck-dir below, not to $GRAPHCHECK_DIR.
    ins = gt.instrument(False, strict=True)
    rec = GraphcheckRecorder(ins, request.node.nodeid)
    try:
        yield rec
    finally:
        gt.uninstrument(ins)
        directory = request.config.getoption("--graphcheck-dir")
        if directory and ins.captures:
            ins.write(os.path.join(directory, _file_name(request.node.nodeid)))


@pytest.fixture
def graphcheck_snapshot(request):
    """syrupy's ``snapshot`` fixture with :class:`graphcheck.syrupy.ReadsExtension`: a
    manifest compared with it is compared as its reads view (:func:`graphcheck.reads`)."""
    try:
        from graphcheck.syrupy import ReadsExtension
    except ModuleNotFoundError as e:
        if e.name != "syrupy" and not (e.name or "").startswith("syrupy."):
            raise
        pytest.fail(
            "the graphcheck_snapshot fixture needs syrupy, pytest's snapshot plugin, which is "
            "not installed: pip install syrupy",
            pytrace=False,
        )
    try:
        snapshot = request.getfixturevalue("snapshot")
    except LookupError:  # pytest's FixtureLookupError, public only in newer pytest
        pytest.fail(
            "the graphcheck_snapshot fixture needs syrupy's snapshot fixture, which this run "
            "does not have: syrupy is installed but its pytest plugin is not loaded "
            "(-p no:syrupy, or PYTEST_DISABLE_PLUGIN_AUTOLOAD without -p syrupy)",
            pytrace=False,
        )
    return snapshot.use_extension(ReadsExtension)
