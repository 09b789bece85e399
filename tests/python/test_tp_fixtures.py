"""The TP=2 documents recorded on two H200s (fixtures/gpu/tp2_rebind_rank1, how they were
made: fixtures/gpu/README.md), verified rank by rank: the reload on rank 1 is reported on
rank 1 only, and NCCL's communicator is not an unowned address."""

import json
from pathlib import Path

import graphcheck

DIR = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "tp2_rebind_rank1"
LIVE = {"vanished", "drifted", "freed", "reused", "reshaped", "stale"}


def pair(rank):
    (manifest,) = DIR.glob(f"graphcheck-{rank}-*.json")
    return manifest, DIR / f"live-{rank}.json"


def test_each_rank_is_verified_against_its_own_snapshot():
    reports = {}
    for rank in (0, 1):
        manifest, live = pair(rank)
        m = json.loads(manifest.read_text())
        assert (m["producer"]["rank"], m["producer"]["world_size"]) == (rank, 2)
        reports[rank] = graphcheck.verify(manifest, live)
    live_kinds = {r: sorted((f.kind, f.subject) for f in rep.findings if f.kind in LIVE) for r, rep in reports.items()}
    assert live_kinds[0] == []
    assert live_kinds[1] == [("drifted", "model.down.weight"), ("freed", "model.down.weight")]
    # The only capture-time finding on each rank: the scenario's unregistered input x, read
    # by the first GEMM; nothing on NCCL's kernel.
    for rank, rep in reports.items():
        unowned = rep.of_kind("unowned")
        assert len(unowned) == 1, rep.table
        assert all("nccl" not in k.name.lower() for f in unowned for k in f.kernels), rep.table


def test_the_nccl_communicator_word_is_set_aside():
    manifest, _ = pair(0)
    m = json.loads(manifest.read_text())
    (nccl,) = [n for g in m["graphs"] for n in g["nodes"] if n["name"].startswith("ncclDevKernel_")]
    assert [(w["param"], w["offset"], w["reason"]) for w in nccl["ignored"]] == [(0, 0, "nccl_comm")]
    assert {t["offset"] for t in nccl["touches"]} == {72, 80}  # sendbuff, recvbuff


def test_a_manifest_and_a_snapshot_of_different_ranks_are_refused():
    import pytest

    manifest, _ = pair(0)
    _, live = pair(1)
    with pytest.raises(graphcheck.GraphcheckError) as e:
        graphcheck.verify(manifest, live)
    assert str(e.value) == (
        f"{live} cannot be verified against {manifest}: the manifest was recorded on rank 0 of 2, "
        "the live snapshot on rank 1 of 2 (verify each rank's live snapshot against that rank's manifest)"
    )
