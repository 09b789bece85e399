"""How the document functions tell a path from JSON text (issue 25, item 5): a ``str``,
``bytes`` or ``os.PathLike`` is a path, whatever it starts with, unless it starts with
``{"`` (blanks aside: an object's first key, how every document's text begins); a dict and
:class:`graphcheck.Text` are always the document itself."""

import json
import os
import pathlib
import shutil

import pytest

import graphcheck
from conftest import REPO

MARLIN = REPO / "fixtures" / "synthetic" / "marlin_workspace_rebuilt"
M, L = MARLIN / "manifest.json", MARLIN / "live.json"
G = graphcheck


def every_document_function(m, live):
    """What each public function taking a document gives for manifest ``m`` and live
    snapshot ``live``, as comparable values."""
    return {
        "load": G.load(m),
        "load(live)": G.load(live, expect="live"),
        "verify": G.verify(m, live).json,
        "verify(manifest alone)": G.verify(m).json,
        "assert_clean": G.assert_clean(m, allow=[{"path": "**", "reason": "r"}]).json,
        "explain": G.explain(m, kernel="marlin"),
        # The text's first line names the two files.
        "diff": G.diff(m, live).text.split("\n", 1)[1],
        "normalized": G.normalized(m),
        "summary": G.summary(live),
    }


@pytest.fixture
def in_braced_folder(tmp_path, monkeypatch):
    """The fixture pair copied into ``{run}/`` under the current directory."""
    run = tmp_path / "{run}"
    run.mkdir()
    shutil.copy(M, run / "m.json")
    shutil.copy(L, run / "l.json")
    monkeypatch.chdir(tmp_path)
    return run


def test_a_path_that_starts_with_a_brace_is_read_as_a_file(in_braced_folder):
    # Regression: verify('{run}/m.json') failed with "<manifest>:1:2: ... not valid JSON"
    # where the command line read the file.
    expected = every_document_function(M, L)
    assert every_document_function("{run}/m.json", "{run}/l.json") == expected
    as_paths = pathlib.Path("{run}/m.json"), pathlib.Path("{run}/l.json")
    assert every_document_function(*as_paths) == expected
    # A folder whose name starts with a brace is one run's documents, as for the CLI.
    assert G.verify("{run}").ok == G.verify(str(in_braced_folder)).ok


def test_a_missing_path_that_starts_with_a_brace_says_the_file_is_missing(in_braced_folder):
    with pytest.raises(G.GraphcheckError, match=r"failed to read \{run\}/missing\.json") as e:
        G.load("{run}/missing.json")
    assert "JSON" not in str(e.value)
    with pytest.raises(G.GraphcheckError, match=r"failed to read \{\}"):
        G.load("{}")


def test_bytes_of_a_path_are_a_path(tmp_path):
    # Regression: bytes were always JSON text, so verify(path.encode()) failed to parse.
    expected = every_document_function(M, L)
    assert every_document_function(os.fsencode(M), os.fsencode(L)) == expected
    # A file name that is not UTF-8 is a path too, as os.fsencode gives it.
    odd = os.fsencode(tmp_path) + b"/m-\xff.json"
    with open(odd, "wb") as f:
        f.write(M.read_bytes())
    assert G.load(odd) == expected["load"]


def test_json_text_is_still_taken_as_text():
    # json.dumps, pretty-printed or not, as str or bytes: the document itself.
    doc = G.load(M)
    for text in (json.dumps(doc), json.dumps(doc, indent=2), "\n  " + json.dumps(doc)):
        assert G.load(text) == doc
        assert G.load(text.encode()) == doc
    assert G.verify(M.read_text(), L.read_bytes()).json == G.verify(M, L).json
    with pytest.raises(G.GraphcheckError, match=r"<string>:1:\d+: .*missing field `producer`"):
        G.load('{"format_version": 1, "kind": "manifest"}')


def test_text_and_dicts_are_documents_whatever_they_start_with():
    doc = G.load(M)
    assert G.load(G.Text(M.read_text())) == doc
    assert G.load(G.Text(M.read_bytes())) == doc
    assert G.verify(G.Text(M.read_text()), G.Text(L.read_text())).json == G.verify(M, L).json
    # Text the rule alone would take for a path: read as JSON, named as asked.
    for call in (lambda: G.load(G.Text("{}")), lambda: G.load({})):
        with pytest.raises(G.GraphcheckError, match=r"<string>.*format_version") as e:
            call()
        assert "failed to read" not in str(e.value)
    with pytest.raises(G.GraphcheckError, match=r"^given\.json:1:\d+"):
        G.load(G.Text("{not json", name="given.json"))
    with pytest.raises(G.GraphcheckError, match=r"text is a str or bytes"):
        G.Text(5)
    with pytest.raises(G.GraphcheckError, match=r"text is not valid Unicode"):
        G.Text('{"kind": "\ud800"}')
