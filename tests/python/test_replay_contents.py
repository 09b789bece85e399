"""What the check before a replay compares after updates (CPU, the fake CUDAGraph of
test_torch_instrument): contents an update wrote are not compared; everything else must
still hold what it held at capture, through later transitions too."""

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck._instrument import transitions
from test_torch_instrument import capture, fake, make_model, replays  # noqa: F401 - fixture


def new_weights(torch, model):
    """A state dict with other values for every parameter (what a refit loads)."""
    return {k: v.detach().clone() + 1 for k, v in model.state_dict().items()}


def lose_constant(torch, model):
    """What a discarding sleep does to a constant no reload restores: same address,
    contents gone."""
    with torch.no_grad():
        model.embed_scale.zero_()


def staled(err_or_report):
    report = getattr(err_or_report, "report", err_or_report)
    return sorted(o.path for f in report.of_kind("stale") for o in f.owners)


def test_load_state_dict_compares_what_it_did_not_write(torch, fake):
    model = make_model(torch)
    gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    g = capture(torch, model)
    lose_constant(torch, model)
    model.load_state_dict(new_weights(torch, model))  # marks `updated`, says what it wrote
    with pytest.raises(gt.ReplayCheckError) as e:
        g.replay()
    assert staled(e.value) == ["model.embed_scale"], e.value
    assert replays(g) == 0


def test_new_weights_are_not_stale_at_a_later_preserving_transition(torch, fake):
    model = make_model(torch)
    gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    g = capture(torch, model)
    model.load_state_dict(new_weights(torch, model))
    gt.mark_transition("resume kv_cache", "preserved")  # the latest transition preserves
    g.replay()
    assert replays(g) == 1
    # Still compared: the constant, lost at the next preserving transition.
    lose_constant(torch, model)
    gt.mark_transition("wake", "preserved")
    with pytest.raises(gt.ReplayCheckError) as e:
        g.replay()
    assert staled(e.value) == ["model.embed_scale"]


def test_an_update_that_does_not_say_what_it_wrote_stops_content_checks(torch, fake):
    model = make_model(torch)
    gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    g = capture(torch, model)
    with torch.no_grad():
        model.proj.weight.add_(1)  # an engine's own loader, in place
    gt.mark_transition("reload_weights()", "updated")
    gt.mark_transition("wake", "preserved")
    g.replay()  # the new weights are no finding; contents are not compared
    assert replays(g) == 1
    report = gt.check()  # on demand too, though it asks for `preserved`
    assert staled(report) == []


def test_an_update_that_says_what_it_wrote(torch, fake):
    model = make_model(torch)
    gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    g = capture(torch, model)
    with torch.no_grad():
        model.proj.weight.add_(1)
        model.proj.bias.add_(1)
    lose_constant(torch, model)
    gt.mark_transition("reload_weights()", "updated", written=model.proj)
    with pytest.raises(gt.ReplayCheckError) as e:
        g.replay()
    assert staled(e.value) == ["model.embed_scale"]
    # A tensor named alone counts the same.
    assert transitions._storages("written", model.proj.weight) <= transitions._storages("written", [model])


def test_check_on_demand_with_updated_compares_nothing(torch, fake):
    model = make_model(torch)
    gt.instrument(None, model=model, digests=True)
    capture(torch, model)
    lose_constant(torch, model)
    assert staled(gt.check()) == ["model.embed_scale"]
    assert staled(gt.check(contents="updated")) == []


def test_written_is_checked(torch, fake):
    model = make_model(torch)
    with pytest.raises(graphcheck.GraphcheckError, match="written says what an update wrote: it takes contents='updated'"):
        gt.mark_transition("wake", "preserved", written=model)
    with pytest.raises(graphcheck.GraphcheckError, match="written takes tensors, modules or an iterable of them, not"):
        gt.mark_transition("reload", "updated", written=["model.proj.weight"])
    with pytest.raises(graphcheck.GraphcheckError, match="written takes tensors"):
        gt.mark_transition("reload", "updated", written=3)
