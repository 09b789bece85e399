"""graphcheck: verify that captured CUDA graphs still read the tensors they were captured with.

This package is the thin Python layer over the Rust core (``graphcheck._native``): it turns
documents and reports into Python objects and back. PyTorch glue lives in
:mod:`graphcheck.torch`, which imports torch only when used, so ``import graphcheck``
works without it.

Documents (manifests and live snapshots) are accepted everywhere as a path (``str``,
``bytes`` or ``os.PathLike``, whatever it starts with: ``"{run}/m.json"`` is a file), as
the ``dict`` :func:`json.loads` gives, or as JSON text: :class:`Text`, or a ``str`` or
``bytes`` starting with ``{"`` (blanks aside), as ``json.dumps`` and ``f.read()`` give it
(:data:`Document`); in either format version: graphcheck writes
format 2 (compact columns); :func:`load` returns any document in format 1's expanded
layout, every record an object, for reading in Python. Every error the core reports is raised as
:class:`GraphcheckError` with the core's message (file and JSON path included). Ctrl-C
during a call raises ``KeyboardInterrupt`` at once (within about 50 ms); the native work
left behind writes nothing and its result is dropped.
"""

from ._api import (
    EXIT_BAD_INPUT,
    EXIT_FINDINGS,
    EXIT_OK,
    FORMAT_VERSION,
    FORMAT_VERSIONS,
    Allow,
    Allowed,
    DiffResult,
    Document,
    Finding,
    KernelRef,
    Owner,
    RankSummary,
    Report,
    Text,
    VerificationFailed,
    __version__,
    assert_clean,
    build_manifest,
    diff,
    explain,
    load,
    normalized,
    reads,
    schema,
    summary,
    verify,
)
from ._native import GraphcheckError, InternalError

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "Allow",
    "Allowed",
    "DiffResult",
    "Document",
    "Finding",
    "GraphcheckError",
    "InternalError",
    "KernelRef",
    "Owner",
    "RankSummary",
    "Report",
    "Text",
    "VerificationFailed",
    "assert_clean",
    "build_manifest",
    "diff",
    "explain",
    "load",
    "normalized",
    "reads",
    "schema",
    "summary",
    "verify",
]
