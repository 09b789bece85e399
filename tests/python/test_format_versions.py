"""Both format versions, read from Python: graphcheck's reader (the Rust core) and the
benchmark baseline's plain-Python reader agree on every fixture document, format 1 and 2;
``load`` gives format 1's expanded layout by default and format 2's on request, and the
writers (``build_manifest``, ``schema``) write format 2 unless asked for 1."""

import importlib.util
import json
from pathlib import Path

import pytest

import graphcheck

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"


def _baseline():
    spec = importlib.util.spec_from_file_location(
        "baseline_verify", REPO / "benches" / "baseline_verify.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


baseline = _baseline()


def documents():
    """Every manifest and live snapshot the two fixture indexes name."""
    out = []
    for index in (FIXTURES / "index.json", FIXTURES / "gpu" / "index.json"):
        for s in json.loads(index.read_text())["scenarios"]:
            for key in ("manifest", "live"):
                if s.get(key):
                    out.append(pytest.param(FIXTURES / s[key], id=s[key]))
    return out


def test_the_corpus_holds_both_versions():
    versions = {json.loads(p.values[0].read_text())["format_version"] for p in documents()}
    assert versions == {1, 2}


@pytest.mark.parametrize("path", documents())
def test_python_and_rust_readers_agree(path):
    raw = json.loads(path.read_text())
    rust = graphcheck.load(path)
    assert rust["format_version"] == 1
    python = baseline.expand(raw)
    # Format 1's layout, whatever the file's version: the same records, field for field.
    assert python == rust
    if raw["format_version"] == 2:
        # What graphcheck writes is what it reads back, in the same layout.
        assert graphcheck.load(path, format_version=2) == raw


def test_load_takes_and_refuses_versions():
    path = FIXTURES / "synthetic" / "clean_reload_inplace" / "manifest.json"
    compact = graphcheck.load(path, format_version=2)
    expanded = graphcheck.load(compact)
    assert compact["format_version"] == 2 and expanded["format_version"] == 1
    assert isinstance(compact["tensors"], dict) and isinstance(expanded["tensors"], list)
    assert graphcheck.load(expanded, format_version=2) == compact
    touch = compact["graphs"][0]["nodes"]["touches"][0][0]
    assert len(touch) == 5
    for bad in (3, 0, "2", True, None):
        with pytest.raises(graphcheck.GraphcheckError, match="format_version is one of 1, 2"):
            graphcheck.load(path, format_version=bad)


def test_writers_write_format_2_unless_asked():
    assert graphcheck.FORMAT_VERSION == 2
    assert graphcheck.FORMAT_VERSIONS == (1, 2)
    assert graphcheck.schema()["title"] == "graphcheck format v2"
    assert graphcheck.schema(1)["title"] == "graphcheck format v1"
    with pytest.raises(graphcheck.GraphcheckError, match="format_version"):
        graphcheck.schema(format_version=7)
