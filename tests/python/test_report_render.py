"""graphcheck.verify() renders only what is asked for: the Report's fields come from the
JSON, the table and the Markdown are rendered at their first read (and kept), and what
they say is byte for byte what the command line prints, over the whole fixture corpus. A
Report still pickles and copies (carrying its rendered text)."""

import copy
import json
import pickle
import subprocess
import threading

import pytest

import graphcheck
from conftest import REPO, rust_binary

FIXTURES = REPO / "fixtures"
MARLIN = FIXTURES / "synthetic" / "marlin_workspace_rebuilt"


def scenarios():
    index = json.loads((FIXTURES / "index.json").read_text())
    return [pytest.param(s, id=s["name"]) for s in index["scenarios"] if "manifest" in s]


def test_verify_renders_neither_table_nor_markdown_until_read():
    # Regression: verify() rendered table, Markdown and JSON every time (24.6 s at 40,000
    # findings for a caller who read only the findings).
    r = graphcheck.verify(MARLIN / "manifest.json", MARLIN / "live.json")
    assert r._texts.rendered == []
    assert r.findings and r.summary and json.loads(r.json)["findings"]
    assert r._texts.rendered == []
    table = str(r)
    assert r._texts.rendered == ["table"]
    assert r.markdown and r._texts.rendered == ["table", "markdown"]
    # Kept, not rendered again: the same object at every read.
    assert r.table is table and r.table is r.table and r.markdown is r.markdown


@pytest.mark.parametrize("scenario", scenarios())
def test_the_rendered_report_is_what_the_command_line_prints(scenario):
    root = FIXTURES
    manifest = root / scenario["manifest"]
    live = [root / scenario["live"]] if scenario.get("live") else []
    allow = root / scenario["allow"] if scenario.get("allow") else None
    binary = rust_binary()
    for normalized in (False, True):
        report = graphcheck.verify(
            manifest, live[0] if live else None, allow, normalized=normalized
        )
        for fmt, text in (("markdown", lambda: report.markdown), ("table", lambda: report.table),
                          ("json", lambda: report.json)):
            argv = [str(binary), "verify", str(manifest), *map(str, live), "--format", fmt]
            if allow is not None:
                argv += ["--allow", str(allow)]
            if normalized:
                argv.append("--normalized")
            cli = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert cli.returncode in (0, 1), cli.stderr
            assert text() == cli.stdout, f"{scenario['name']} {fmt} normalized={normalized}"


def test_first_reads_from_many_threads_render_once_and_agree():
    r = graphcheck.verify(MARLIN / "manifest.json", MARLIN / "live.json")
    seen = []
    start = threading.Barrier(8)

    def read():
        start.wait()
        seen.append(r.table)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(s is seen[0] for s in seen)


def test_a_report_pickles_and_copies_with_its_text():
    # The native handle cannot be pickled: a Report carries its rendered text instead, as
    # it did when every format was rendered up front.
    r = graphcheck.verify(MARLIN / "manifest.json", MARLIN / "live.json")
    for other in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert other == r
        assert other.table == r.table and other.markdown == r.markdown and other.json == r.json
        assert other.recapture() == r.recapture() and other.ok == r.ok


def test_a_report_keeps_its_public_attributes():
    r = graphcheck.verify(MARLIN / "manifest.json", MARLIN / "live.json")
    for name in ("ok", "findings", "allowed", "checked", "summary", "subjects", "graphs",
                 "json", "table", "markdown", "unread_nodes", "errors", "warnings",
                 "world_size", "ranks", "missing_ranks"):
        assert hasattr(r, name), name
    assert "table=" not in repr(r) and "json=" not in repr(r)
    with pytest.raises(AttributeError):
        r.ok = True  # frozen, as before
