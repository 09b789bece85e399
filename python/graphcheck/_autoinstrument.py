"""Turns :func:`graphcheck.torch.instrument` on where ``GRAPHCHECK_DIR`` is set, in every
Python process of the tree, with no change to the engine's code.

The wheel installs ``graphcheck-instrument.pth`` into site-packages. Python runs its one
line at start-up; it imports this module only where ``GRAPHCHECK_DIR`` is set (elsewhere it
costs one environment lookup). This module never imports torch itself: where torch is not
imported yet, a one-shot import hook instruments right after ``import torch`` completes,
so processes that never use torch pay nothing, and spawned workers (vLLM's, torchrun's)
are instrumented the same way as the parent. ``import graphcheck.torch`` with the variable
set imports this module too, for installs without the ``.pth`` (editable or vendored ones);
this module imports the instrumentation itself, not ``graphcheck.torch``.

A failure here never stops the process: it is reported on stderr.
"""

import importlib.abc
import importlib.util
import os
import sys

__all__ = ["install"]

_installed = False


def _instrument_now() -> None:
    try:
        # Here, not at the top: a process that never imports torch never loads it.
        from graphcheck import _instrument

        if not _instrument.instrumented():
            _instrument.instrument()
    except Exception as e:  # noqa: BLE001 - never break the host process
        print(f"graphcheck: GRAPHCHECK_DIR is set but instrument() failed: {e}", file=sys.stderr)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds ``torch`` through the other finders and instruments once its module ran."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            return spec

        def exec_and_instrument(module):
            exec_module(module)
            _instrument_now()

        loader.exec_module = exec_and_instrument
        return spec


def install() -> None:
    """Instruments now where torch is imported, else right after it is. Idempotent."""
    global _installed
    if _installed or not os.environ.get("GRAPHCHECK_DIR"):
        return
    _installed = True
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        _instrument_now()
    elif torch is None:
        sys.meta_path.insert(0, _AfterTorchImport())
    # else torch is being imported right now (graphcheck.torch imported from inside it):
    # nothing to hook; instrument() at first use.


install()
