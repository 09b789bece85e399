"""The GPU scenarios (``tests/python/scenarios/``) run only where a GPU is lent, in a
process of their own: a graphcheck name one of them imports that no longer exists would
surface there, after the device time is spent (``tms_resume.py`` imported a removed
``graphcheck._guard``). Here, on the CPU: every ``graphcheck`` module and name they import
exists."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.py"))


def graphcheck_imports(path: Path) -> list:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "graphcheck"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "graphcheck":
            out += [(node.module, a.name) for a in node.names]
    return out


def test_there_are_scenarios():
    assert len(SCENARIOS) >= 3, SCENARIOS


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_each_graphcheck_name_a_scenario_imports_exists(torch, path):
    imports = graphcheck_imports(path)
    for module, name in imports:
        m = importlib.import_module(module)
        if name is not None:
            assert hasattr(m, name) or importlib.util.find_spec(f"{module}.{name}") is not None, (
                f"{path.name}: from {module} import {name}: no such name"
            )


def test_the_check_sees_a_removed_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from graphcheck import _guard\n")
    [(module, name)] = graphcheck_imports(planted)
    m = importlib.import_module(module)
    assert not hasattr(m, name) and importlib.util.find_spec(f"{module}.{name}") is None
