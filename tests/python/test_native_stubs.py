"""The type stubs of the native module (python/graphcheck/_native.pyi) against the module
itself: mypy's stubtest imports graphcheck._native and fails on any function, class,
method, parameter, default or export that the stub names differently or not at all, so a
native function or parameter added, removed or renamed without the stub fails here. Also:
the package that is imported (the installed wheel, in CI) carries the stubs and py.typed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphcheck

PACKAGE = Path(graphcheck.__file__).resolve().parent


def test_the_package_carries_its_stubs_and_the_typed_marker():
    assert (PACKAGE / "_native.pyi").is_file(), f"no _native.pyi in {PACKAGE}"
    assert (PACKAGE / "py.typed").is_file(), f"no py.typed in {PACKAGE}"


def test_the_native_stubs_match_the_module(tmp_path):
    try:
        import mypy.stubtest  # noqa: F401
    except ImportError as e:
        pytest.skip(
            f"MYPY IS NOT INSTALLED ({e}): the native stubs were not checked; "
            "ci/requirements-test.txt installs it"
        )
    # The stub as the imported package has it, in a stub-only tree of its own: mypy then
    # reads it from there whether the package is a source tree or installed (mypy refuses
    # site-packages on MYPYPATH).
    stubs = tmp_path / "stubs" / "graphcheck"
    stubs.mkdir(parents=True)
    (stubs / "__init__.pyi").write_text("")
    (stubs / "_native.pyi").write_bytes((PACKAGE / "_native.pyi").read_bytes())
    env = dict(os.environ)
    # The module stubtest imports is the one this test imported.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE.parent), env.get("PYTHONPATH", "")) if p
    )
    env["MYPYPATH"] = str(tmp_path / "stubs")
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "graphcheck._native"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"the stubs drifted from the module:\n{r.stdout}{r.stderr}"
