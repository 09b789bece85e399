"""The finding kinds a replay check stops for (`graphcheck._instrument.replay_check.LIVE_KINDS`) are the
core's list (`_native.LIVE_KINDS`, `FindingKind::LIVE`): exactly the kinds verify checks
only when it is given a live snapshot."""

from graphcheck import _native, verify
from graphcheck._instrument import replay_check
from conftest import REPO

MARLIN = REPO / "fixtures" / "synthetic" / "marlin_workspace_rebuilt"
# A pair with digests on both sides (contents preserved): every live kind is checked.
GEMMA = REPO / "fixtures" / "synthetic" / "gemma3n_sleep2_stale"


def test_the_live_kinds_are_what_only_a_live_snapshot_checks():
    with_live = verify(GEMMA / "manifest.json", GEMMA / "live.json").checked
    alone = verify(GEMMA / "manifest.json").checked
    assert set(_native.LIVE_KINDS) == set(with_live) - set(alone)
    assert replay_check.LIVE_KINDS == frozenset(_native.LIVE_KINDS)
    # In report order, as the core lists them.
    assert list(_native.LIVE_KINDS) == [k for k in with_live if k not in alone]


def test_stale_is_checked_only_where_both_sides_have_digests():
    """A pair without digests cannot show `stale`: not listed as checked, and the headline
    says the contents were not compared (a manifest with digests against a snapshot taken
    without them used to read as a clean, fully checked run)."""
    bare = verify(MARLIN / "manifest.json", MARLIN / "live.json")
    assert "stale" not in bare.checked and "drifted" in bare.checked
    assert "contents not compared: an update without reference digests, or digests missing on a side" in bare.table
    digested = verify(GEMMA / "manifest.json", GEMMA / "live.json")
    assert "stale" in digested.checked
    assert "contents not compared" not in digested.table
