"""graphcheck: verify that captured CUDA graphs still read the tensors they were captured with.

This package is the thin Python layer over the Rust core (``graphcheck._native``): it turns
documents and reports into Python objects and back. PyTorch glue lives in
:mod:`graphcheck.torch`, which imports torch only when used, so ``import graphcheck``
works without it.

Documents (manifests and live snapshots) are accepted everywhere as a path
(``str`` or ``os.PathLike``), as JSON text (a ``str`` starting with ``{``, or ``bytes``),
or as the ``dict`` :func:`json.loads` gives, in either format version: graphcheck writes
format 2 (compact columns); :func:`load` returns any document in format 1's expanded
layout, every record an object, for reading in Python. Every error the core reports is raised as
:class:`GraphcheckError` with the core's message (file and JSON path included).
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
    VerificationFailed,
    __version__,
    assert_clean,
    build_manifest,
    diff,
    explain,
    load,
    normalized,
    schema,
    summary,
    verify,
)
from ._native import GraphcheckError

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
    "KernelRef",
    "Owner",
    "RankSummary",
    "Report",
    "VerificationFailed",
    "assert_clean",
    "build_manifest",
    "diff",
    "explain",
    "load",
    "normalized",
    "schema",
    "summary",
    "verify",
]
