"""graphcheck's extension of `syrupy <https://github.com/syrupy-project/syrupy>`_, pytest's
snapshot tool: a manifest compared with a snapshot is compared as its reads view
(:func:`graphcheck.reads`), one text file per snapshot, so a change in what an engine's
graphs read (a new tensor no parameter or buffer holds, a path gone) fails the test with
that line as the diff, and ``pytest --snapshot-update`` accepts it.

.. code-block:: python

    def test_decode_graphs_read_only_registered_tensors(graphcheck_recorder, graphcheck_snapshot, engine):
        graphcheck_recorder.register_model(engine.model)
        engine.capture_cuda_graphs()
        assert graphcheck_recorder.manifest() == graphcheck_snapshot

The fixture ``graphcheck_snapshot`` (:mod:`graphcheck.pytest_plugin`) is syrupy's
``snapshot.use_extension(ReadsExtension)``. A manifest is a dict whose ``kind`` is
``"manifest"`` (as :meth:`graphcheck.torch.Recorder.manifest` and :func:`graphcheck.load`
give it), :class:`graphcheck.Text`, or an ``os.PathLike`` path to one (a ``str`` stays a
string: it is snapshot as the text it is). A live snapshot is an error; anything else is
snapshot as syrupy's text single-file extension does. :class:`ReadsExtensionWithoutKernels`
leaves kernel names out, for snapshots shared by machines of other GPU architectures or
library versions. ``docs/recipes/pytest.md`` is the guide.

This module imports syrupy (named after it as :mod:`graphcheck.torch` is after torch): the
plugin imports it only when the fixture is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from ._api import reads
from ._native import Text

__all__ = ["ReadsExtension", "ReadsExtensionWithoutKernels", "is_document"]


def is_document(data: Any) -> bool:
    """Whether ``data`` is a graphcheck document for the reads view: ``graphcheck.Text``, an
    ``os.PathLike`` path, or a mapping with a document's header (``format_version``, and
    ``kind`` ``"manifest"`` or ``"live"``: a live snapshot is then an error, not a dict
    written out as text)."""
    if isinstance(data, (Text, os.PathLike)):
        return True
    return (
        isinstance(data, Mapping)
        and "format_version" in data
        and data.get("kind") in ("manifest", "live")
    )


class ReadsExtension(SingleFileSnapshotExtension):
    """A snapshot per assertion, ``__snapshots__/<test file>/<test name>.reads.txt``: a
    manifest as its reads view, kernels shown; anything else as syrupy's text single-file
    extension writes it."""

    file_extension = "reads.txt"
    _write_mode = WriteMode.TEXT
    #: Whether the view names kernels (``graphcheck.reads(..., kernels=...)``).
    kernels = True

    def serialize(self, data: Any, **kwargs: Any) -> Any:
        if is_document(data):
            return reads(data, kernels=self.kernels)
        return super().serialize(data, **kwargs)


class ReadsExtensionWithoutKernels(ReadsExtension):
    """:class:`ReadsExtension` with kernel names (and the word counts that depend on the
    kernels) left out: they differ between GPU architectures and library versions."""

    kernels = False
