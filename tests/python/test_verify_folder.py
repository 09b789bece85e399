"""graphcheck.verify(folder): a directory of one run's per-rank documents gives the report
`graphcheck verify DIR` gives (the same core code): over the runs of fixtures/ranks/, the
expected findings each naming its rank, the missing ranks and the per-rank counts; the
table, Markdown and JSON byte for byte what the Rust binary prints; and every way a folder is
refused is a GraphcheckError naming the folder. graphcheck.verify([(m0, l0), (m1, l1)]):
explicit pairs give what `graphcheck verify M0 L0 M1 L1` and the folder give, and are refused
with the command line's messages."""

import json
import os
import shutil
import subprocess

import pytest

import graphcheck
from conftest import REPO, rust_binary

FIXTURES = REPO / "fixtures"
TP2 = FIXTURES / "ranks" / "tp2_rebind_rank1"


def runs():
    index = json.loads((FIXTURES / "index.json").read_text())
    return [pytest.param(r, id=r["name"]) for r in index["ranks"]]


def findings(report):
    return [{"rank": f.rank, "kind": f.kind, "subject": f.subject} for f in report.findings]


@pytest.mark.parametrize("run", runs())
def test_a_folder_gives_the_expected_findings_each_naming_its_rank(run):
    folder = FIXTURES / run["dir"]
    want = run["expect"]
    for arg in (folder, str(folder)):
        r = graphcheck.verify(arg)
        assert findings(r) == want["findings"], r.table
        assert list(r.missing_ranks) == want["missing_ranks"]
        assert r.ok == (want["exit_code"] == 0)
        assert r.world_size == json.loads(r.json)["world_size"]
        # Each rank's counts are its own findings'.
        for part in r.ranks:
            mine = [f for f in r.findings if f.rank == part.rank]
            assert sum(part.summary.values()) == len(mine), part
            assert part.ok == (not mine)


@pytest.mark.parametrize("run", runs())
def test_the_report_of_a_folder_is_what_the_command_line_prints(run):
    folder = FIXTURES / run["dir"]
    binary = rust_binary()
    for normalized in (False, True):
        report = graphcheck.verify(folder, normalized=normalized)
        for fmt, text in (("table", lambda: report.table), ("markdown", lambda: report.markdown),
                          ("json", lambda: report.json)):
            argv = [str(binary), "verify", str(folder), "--format", fmt]
            if normalized:
                argv.append("--normalized")
            cli = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            code = graphcheck.EXIT_OK if report.ok else graphcheck.EXIT_FINDINGS
            assert cli.returncode == code, cli.stderr
            assert text() == cli.stdout, f"{run['name']} {fmt} normalized={normalized}"


def test_an_allowlist_applies_to_every_rank_of_a_folder():
    # Guards: allow reaches verify_dir (rank_mismatch is allowed by path, like any kind).
    entry = {
        "path": "model.layers[*].mlp.down_proj.weight",
        "kinds": ["rank_mismatch"],
        "reason": "rank 2 holds the uneven shard",
    }
    r = graphcheck.verify(FIXTURES / "ranks" / "tp4_shard_shape_mismatch", allow=[entry])
    assert r.ok and r.findings == ()
    assert [a.finding.kind for a in r.allowed] == ["rank_mismatch"]


def test_one_manifest_still_has_no_rank_fields():
    (manifest,) = TP2.glob("graphcheck-1-*.json")
    r = graphcheck.verify(manifest, TP2 / "live-1-4101.json")
    assert (r.world_size, r.ranks, r.missing_ranks) == (None, (), ())
    assert all(f.rank is None for f in r.findings)


def refused(*args, **kwargs):
    with pytest.raises(graphcheck.GraphcheckError) as e:
        graphcheck.verify(*args, **kwargs)
    return str(e.value)


def test_an_empty_folder_is_refused_naming_it(tmp_path):
    (tmp_path / "README.txt").write_text("not a document")
    msg = refused(tmp_path)
    assert str(tmp_path) in msg and "no manifest or live snapshot" in msg, msg


def test_a_folder_of_live_snapshots_only_is_refused_naming_the_file(tmp_path):
    shutil.copy(TP2 / "live-1-4101.json", tmp_path / "live-1.json")
    msg = refused(tmp_path)
    assert str(tmp_path) in msg, msg
    assert "live-1.json is a live snapshot of rank 1, which has no manifest" in msg, msg


def test_a_live_snapshot_given_with_a_folder_is_refused_naming_both():
    live = TP2 / "live-0-4100.json"
    for given in (live, os.fspath(live)):
        msg = refused(TP2, given)
        assert str(TP2) in msg and str(live) in msg, msg
        assert "takes no live snapshot" in msg, msg
    # Given as a dict, the live snapshot is named as the native module names text.
    msg = refused(TP2, json.loads(live.read_text()))
    assert str(TP2) in msg and "<live>" in msg, msg


def test_the_command_line_refuses_a_live_snapshot_after_a_folder_alike():
    live = TP2 / "live-0-4100.json"
    cli = subprocess.run([str(rust_binary()), "verify", str(TP2), str(live)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == graphcheck.EXIT_BAD_INPUT, cli.stderr
    assert refused(TP2, live) in cli.stderr


def test_a_report_of_a_folder_pickles_with_its_ranks():
    import pickle

    r = graphcheck.verify(TP2)
    other = pickle.loads(pickle.dumps(r))
    assert other == r and other.ranks == r.ranks and other.table == r.table


def pairs_of(folder):
    """The folder's documents as (manifest, live) pairs in rank order."""
    docs = {}
    for p in sorted(folder.glob("*.json")):
        doc = json.loads(p.read_text())
        docs[(doc["producer"]["rank"], doc["kind"])] = p
    ranks = sorted({rank for rank, _ in docs})
    return [(docs[(r, "manifest")], docs[(r, "live")]) for r in ranks]


PAIRED = [TP2, FIXTURES / "gpu" / "tp2_rebind_rank1"]


@pytest.mark.parametrize("folder", PAIRED, ids=lambda p: p.parent.name)
def test_pairs_give_what_the_command_line_prints_for_them_and_for_the_folder(folder):
    binary = rust_binary()
    pairs = pairs_of(folder)
    files = [str(p) for pair in pairs for p in pair]
    for normalized in (False, True):
        report = graphcheck.verify(pairs, normalized=normalized)
        for fmt, text in (("table", lambda: report.table), ("markdown", lambda: report.markdown),
                          ("json", lambda: report.json)):
            for argv in ([str(binary), "verify", *files], [str(binary), "verify", str(folder)]):
                argv += ["--format", fmt] + (["--normalized"] if normalized else [])
                cli = subprocess.run(argv, capture_output=True, text=True, timeout=120)
                assert cli.returncode == graphcheck.EXIT_FINDINGS, cli.stderr
                assert text() == cli.stdout, f"{argv} normalized={normalized}"


def test_pairs_that_are_not_one_rank_each_are_refused_as_the_command_line_refuses_them():
    (m0, l0), (m1, l1) = pairs_of(TP2)
    binary = rust_binary()
    for pairs, want in (
        ([(m0, l1), (m1, l0)], f"{l1} is a live snapshot of rank 1, but it is paired with {m0}"),
        ([(m0, l0), (l1, m1)], f"{l1} is a live snapshot, but it comes first in pair 2"),
        ([(m1, l1), (m1, l1)], "rank 1 has two manifests"),
        ([(m0, l0), (TP2, l1)], f"{TP2} is a folder"),
    ):
        msg = refused(pairs)
        assert want in msg, msg
        files = [str(p) for pair in pairs for p in pair]
        cli = subprocess.run([str(binary), "verify", *files], capture_output=True, text=True,
                             timeout=120)
        assert cli.returncode == graphcheck.EXIT_BAD_INPUT, cli.stderr
        assert msg in cli.stderr


def test_a_list_of_pairs_is_checked_item_by_item():
    (m0, l0), (m1, l1) = pairs_of(TP2)
    assert "live is omitted" in refused([(m0, l0)], l1)
    assert "empty list" in refused([])
    assert "manifest[1] is a (manifest, live) pair of paths, not 'x'" in refused([(m0, l0), "x"])
    assert "manifest[0] is a (manifest, live) pair of paths, not 3 items" in refused(
        [(m0, l0, l1)])
    assert "manifest[0][1] is a path" in refused([(m0, 7)])
    # One pair is one rank's report of the run (world size and missing ranks), not a single
    # pair's.
    r = graphcheck.verify([(m1, l1)])
    assert (r.world_size, list(r.missing_ranks)) == (2, [0])
    assert all(f.rank == 1 for f in r.findings)


def test_a_report_in_the_folder_is_skipped_with_a_warning(tmp_path):
    # Regression: a report written into the run's folder made verify(folder) refuse it as
    # a document; JSON without the header is skipped, with a UserWarning naming it.
    for p in TP2.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    want = graphcheck.verify(tmp_path)
    (tmp_path / "report.json").write_text(want.json)
    with pytest.warns(UserWarning, match=r"report\.json is not a graphcheck document"):
        r = graphcheck.verify(tmp_path)
    assert r.json == want.json
