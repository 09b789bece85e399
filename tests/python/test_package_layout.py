"""The layout of the Python package: graphcheck.torch's private modules import one way (no
cycle), and importing the package, graphcheck.torch included, does not import torch."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import graphcheck

PACKAGE = Path(graphcheck.__file__).resolve().parent

#: graphcheck.torch's private modules, each importing only those before it (torch.py's
#: comment draws the same list).
ORDER = [
    "_registry",
    "_walk",
    "_caching_allocator",
    "_snapshot",
    "_recorder",
    "_discover",
    "_instrument/replay_check",
    "_instrument/instrumentation",
]


def relative_imports(module: str) -> set:
    """The package modules ``module`` imports at its top level (``from . import x``,
    ``from .x import y``)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module)
            else:
                out.update(a.name for a in node.names)
    return out


def test_the_torch_modules_import_one_way():
    for i, module in enumerate(ORDER):
        later = relative_imports(module) & set(ORDER[i:])
        assert not later, f"{module} imports {sorted(later)}, which come after it in {ORDER}"


def test_importing_the_package_does_not_import_torch():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE.parent), env.get("PYTHONPATH", "")) if p
    )
    env.pop("GRAPHCHECK_DIR", None)  # the instrument hook would wait for torch, not import it
    code = (
        "import sys, graphcheck, graphcheck.torch, graphcheck.sleep; "
        "assert graphcheck.__file__.startswith(sys.argv[1]), graphcheck.__file__; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(PACKAGE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_everything_the_package_exports_is_in_all():
    # Regression: Allow, Allowed, DiffResult and Document, which the signatures use, were
    # imported but left out of __all__ (``from graphcheck import *`` missed them).
    import graphcheck

    public = {n for n in vars(graphcheck) if not n.startswith("_") and n[0].isupper()}
    missing = sorted(n for n in public if n not in graphcheck.__all__)
    assert missing == [], missing
