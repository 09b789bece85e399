"""The finding kinds a replay check stops for (`graphcheck._guard.LIVE_KINDS`) are the
core's list (`_native.LIVE_KINDS`, `FindingKind::LIVE`): exactly the kinds verify checks
only when it is given a live snapshot."""

from graphcheck import _guard, _native, verify
from conftest import REPO

MARLIN = REPO / "fixtures" / "synthetic" / "marlin_workspace_rebuilt"


def test_the_live_kinds_are_what_only_a_live_snapshot_checks():
    with_live = verify(MARLIN / "manifest.json", MARLIN / "live.json").checked
    alone = verify(MARLIN / "manifest.json").checked
    assert set(_native.LIVE_KINDS) == set(with_live) - set(alone)
    assert _guard.LIVE_KINDS == frozenset(_native.LIVE_KINDS)
    # In report order, as the core lists them.
    assert list(_native.LIVE_KINDS) == [k for k in with_live if k not in alone]
