"""The owner walk over values whose reading raises (user code the walk cannot avoid running:
isinstance asks a proxy's ``__class__``, a dict subclass's ``items()``, a ``__dict__``
property, a tensor subclass's properties): each is skipped, listed in ``Registry.skipped``
with its owner path and the exception in words, and the walk goes on. Before, one such
value failed every walk, so every later manifest build and replay check failed with it."""

import pytest

import graphcheck
import graphcheck.torch as gt
from test_torch_instrument import capture, fake, make_model, replays  # noqa: F401 - fixture


class LazyProxy:
    """A lazy proxy whose every attribute access raises until it is loaded (isinstance
    reads ``__class__`` through it)."""

    def __getattribute__(self, name):
        raise RuntimeError("lazy proxy: not loaded")


class ItemsRaise(dict):
    def items(self):
        raise RuntimeError("items() broke")


class DictRaises:
    @property
    def __dict__(self):
        raise RuntimeError("__dict__ broke")


class Holder:
    """A plain object holding the bad value between two tensors."""

    def __init__(self, torch, bad):
        self.before = torch.ones(1)
        self.bad = bad
        self.after = torch.ones(2)


class KeyStrRaises:
    def __hash__(self):
        return 1

    def __str__(self):
        raise RuntimeError("str() of a key broke")


def bad_values(torch):
    class LayoutRaises(torch.Tensor):
        @property
        def layout(self):
            raise RuntimeError("layout broke")

    return {
        "lazy proxy": (LazyProxy(), "reading it raised RuntimeError: lazy proxy: not loaded"),
        "items() raises": (
            ItemsRaise(x=torch.ones(3)), "reading it raised RuntimeError: items() broke"
        ),
        "__dict__ raises": (DictRaises(), "reading it raised RuntimeError: __dict__ broke"),
        "a property raises": (
            torch.ones(3).as_subclass(LayoutRaises), "reading it raised RuntimeError: layout broke"
        ),
    }


@pytest.mark.parametrize("case", ["lazy proxy", "items() raises", "__dict__ raises", "a property raises"])
def test_a_value_whose_reading_raises_is_skipped_saying_why(torch, case):
    # Three of them (an object is entered once, and listed under the first path only).
    (bad, why), (bad2, _), (bad3, _) = (bad_values(torch)[case] for _ in range(3))
    model = torch.nn.Linear(2, 2)
    model.holder = Holder(torch, bad)
    model.__dict__["direct"] = bad2  # a module attribute too (not through __setattr__)
    model.cache = {"a": torch.ones(1), "bad": bad3, "z": torch.ones(1)}
    model.tail = torch.ones(4)
    r = gt.walk(model)
    paths = {o.path for o in r.owners}
    # Everything around the bad value is still walked, before and after it.
    for p in ("model.weight", "model.bias", "model.holder.before", "model.holder.after",
              'model.cache["a"]', 'model.cache["z"]', "model.tail"):
        assert p in paths, (p, sorted(paths))
    assert set(r.skipped) == {
        ("model.holder.bad", why),
        ("model.direct", why),
        ('model.cache["bad"]', why),
    }, r.skipped


def test_a_root_whose_reading_raises_is_skipped_and_the_other_roots_walked(torch):
    r = gt.walk_roots({"draft": LazyProxy(), "model": torch.nn.Linear(2, 2)})
    assert {o.path for o in r.owners} == {"model.weight", "model.bias"}
    assert r.skipped == [("draft", "reading it raised RuntimeError: lazy proxy: not loaded")]


def test_a_module_whose_registries_raise_keeps_its_attributes_and_siblings(torch):
    model = torch.nn.Module()
    model.odd = torch.nn.Linear(2, 2)
    model.odd.scale = torch.ones(1)
    model.odd.__dict__["_parameters"] = ItemsRaise(model.odd._parameters)
    model.odd.__dict__["_modules"] = ItemsRaise(sub=torch.nn.Linear(1, 1))
    model.next = torch.nn.Linear(2, 2)
    r = gt.walk(model)
    assert {o.path for o in r.owners} == {"model.odd.scale", "model.next.weight", "model.next.bias"}
    assert r.skipped == [
        ("model.odd", "reading its parameters and buffers raised RuntimeError: items() broke"),
        ("model.odd", "reading its submodules raised RuntimeError: items() broke"),
    ]


def test_a_key_that_cannot_be_named_skips_its_entry_not_the_dict(torch):
    model = torch.nn.Module()
    model.cache = {"a": torch.ones(1), KeyStrRaises(): torch.ones(2), "z": torch.ones(3)}
    r = gt.walk(model)
    assert {o.path for o in r.owners} == {'model.cache["a"]', 'model.cache["z"]'}
    assert r.skipped == [
        ("model.cache", "naming its key of type KeyStrRaises raised RuntimeError: str() of a key broke")
    ]


def test_an_exception_whose_message_raises_is_still_listed(torch):
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no message")

    class Raises:
        def __getattribute__(self, name):
            raise Unprintable()

    model = torch.nn.Module()
    model.holder = Holder(torch, Raises())
    r = gt.walk(model)
    assert r.skipped == [
        ("model.holder.bad", "reading it raised Unprintable: (its message could not be read)")
    ]


def test_a_broken_persistent_tensors_listing_is_skipped_not_raised(torch):
    class Lists:
        def __init__(self):
            self.t = torch.ones(1)

        def persistent_tensors(self):
            return ItemsRaise(t=self.t)

    model = torch.nn.Module()
    model.lists = Lists()
    r = gt.walk(model)
    assert {o.path: o.registration for o in r.owners} == {"model.lists.t": "object_attribute"}
    assert r.skipped == [
        ("model.lists.persistent_tensors()", "persistent_tensors() raised RuntimeError: items() broke")
    ]


def test_manifests_and_replay_checks_go_on_while_the_value_is_there(torch, fake):
    # Regression: the walk raised, so the capture's owners, every manifest build and every
    # replay check failed until the value was gone.
    model = make_model(torch)
    model.lazy = Holder(torch, LazyProxy())
    ins = gt.instrument(None, model=model, digests=True, verify_on_replay="raise")
    g = capture(torch, model)
    assert ins.errors == [] and ins.captures == 1
    m = graphcheck.load(ins.manifest())
    assert {"model.proj.weight", "model.embed_scale", "model.lazy.before"} <= {
        o["path"] for o in m["owners"]
    }
    assert ("model.lazy.bad", "reading it raised RuntimeError: lazy proxy: not loaded") in (
        ins.recorder.registry.skipped
    )
    gt.mark_transition("wake", "preserved")
    g.replay()  # checked, clean
    assert replays(g) == 1 and ins.errors == []
    with torch.no_grad():
        model.embed_scale.zero_()  # the check still finds what it must
    gt.mark_transition("wake", "preserved")
    with pytest.raises(gt.ReplayCheckError, match="stale"):
        g.replay()
    assert gt.check().ok is False and ins.errors == []
