"""The owner registry walk of graphcheck.torch over real (CPU) PyTorch modules: every way a
model holds a tensor gets its path and registration, the walk is bounded and read-only."""

import dataclasses
import functools

import pytest

import graphcheck
import graphcheck.torch as gt


def registrations(registry):
    return {o.path: o.registration for o in registry.owners}


def make_model(torch):
    """A model holding tensors every way the registry knows."""

    class Kernel:
        def __init__(self):
            self.workspace = torch.zeros(16, dtype=torch.int32)

    class QuantMethod:
        def __init__(self):
            self.kernel = Kernel()
            self.w_scale = torch.ones(4)
            self.unlisted = torch.ones(3)
            self.packed = [torch.ones(7)]

        def persistent_tensors(self):
            # The protocol of ../shared/reading/000: what the holder keeps.
            return {"w_scale": self.w_scale, "packed": self.packed[0]}

    @dataclasses.dataclass
    class Config:
        alpha: object
        name: str = "cfg"

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.register_buffer("table", torch.randn(8))
            self.register_buffer("cos", torch.randn(8), persistent=False)
            self.register_buffer("_held_quant_method_scale", torch.randn(2), persistent=False)
            self.quant_method = QuantMethod()
            self.embed_scale = torch.tensor(8.0)
            self.cfg = Config(torch.ones(2))
            captured = torch.ones(5)
            self.fn = functools.partial(torch.add, torch.ones(6), alpha=torch.ones(1))
            self.closure = lambda x: x + captured
            self.cache = {"a": [torch.zeros(2), (torch.zeros(3),)], 3: torch.zeros(1)}
            self.row = self.proj.weight[1]

    class OwnerRef:
        def __init__(self, model):
            self.model = model

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])
            self.shared = self.layers[0].proj.weight.data  # same view, plain attribute
            self.owner_ref = OwnerRef(self)  # a cycle through a plain object

    return Model()


def test_every_holding_gets_its_path_and_registration(torch):
    r = gt.walk(make_model(torch))
    regs = registrations(r)
    expected = {
        "model.layers[0].proj.weight": "parameter",
        "model.layers[0].proj.bias": "parameter",
        "model.layers[0].table": "buffer",
        "model.layers[0].cos": "buffer_non_persistent",
        "model.layers[0]._held_quant_method_scale": "held",
        "model.layers[0].quant_method.kernel.workspace": "object_attribute",
        "model.layers[0].quant_method.w_scale": "held",
        "model.layers[0].quant_method.unlisted": "object_attribute",
        # Listed, but held by no direct attribute: the protocol's own path, beside the
        # container path that reaches the same view.
        'model.layers[0].quant_method.persistent_tensors()["packed"]': "held",
        "model.layers[0].quant_method.packed[0]": "container",
        "model.layers[0].embed_scale": "module_attribute",
        "model.layers[0].cfg.alpha": "object_attribute",
        "model.layers[0].fn.args[0]": "partial",
        'model.layers[0].fn.keywords["alpha"]': "partial",
        'model.layers[0].closure.__closure__["captured"]': "closure",
        'model.layers[0].cache["a"][0]': "container",
        'model.layers[0].cache["a"][1][0]': "container",
        "model.layers[0].cache[3]": "container",
        "model.layers[0].row": "module_attribute",
        "model.shared": "module_attribute",
    }
    for path, registration in expected.items():
        assert regs.get(path) == registration, path
    # The second layer is walked the same way.
    assert regs["model.layers[1].quant_method.kernel.workspace"] == "object_attribute"
    # Every path is valid in the core's grammar.
    for path in regs:
        assert graphcheck._native.check_path(path) == path
    assert r.skipped == []


def test_views_are_deduplicated_but_every_path_is_kept(torch):
    r = gt.walk(make_model(torch))
    by_path = r.by_path()
    weight = by_path["model.layers[0].proj.weight"].tensor
    # `.data` is the same storage view: one record, two owner paths.
    assert by_path["model.shared"].tensor == weight
    # A row of the weight is another view of the same storage.
    row = by_path["model.layers[0].row"].tensor
    assert row != weight
    assert r.tensors[row].spec["storage_base"] == r.tensors[weight].spec["storage_base"]
    assert r.tensors[row].spec["offset"] == 4 * 4  # one row of four float32
    assert len({(t.spec["storage_base"], t.spec["offset"], tuple(t.spec["shape"])) for t in r.tensors}) == len(r.tensors)


def test_storage_ranges_are_those_of_live_storages_where_the_walk_saw_them(torch):
    # Regression: a dead tensor's range stayed "known", so a tensor the allocator put in
    # its memory later was taken for it (Recorder's keep-current check).
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.ones(4))
    model.dead = torch.zeros(8)
    model.moved = torch.zeros(16)
    model.view = model.w.data[1:]  # another view of w's storage: one range for both
    r = gt.walk(model)
    ranges = {path: (r.tensors[o.tensor].meta[0], r.tensors[o.tensor].meta[1]) for path, o in r.by_path().items()}
    assert r.storage_ranges() == [ranges["model.w"], ranges["model.dead"], ranges["model.moved"]]
    del model.dead  # the tensor and its storage die
    model.moved.untyped_storage().resize_(64 * 4)  # the storage moves and grows in place
    assert r.storage_ranges() == [ranges["model.w"]]
    by_path = r.by_path()
    assert [r.tensors[by_path[p].tensor].current() for p in ("model.w", "model.dead", "model.moved")] == [
        True,
        False,
        False,
    ]


def test_storage_ranges_are_kept_until_a_storage_dies(torch):
    # Asked at every captured graph: polling every storage each time cost about 1 ms a
    # graph on the anchor model, so the answer is kept until a weak-reference callback
    # says a polled storage died.
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.ones(4))
    model.dead = torch.zeros(8)
    r = gt.walk(model)
    first = r.storage_ranges()
    assert r.storage_ranges() is first
    del model.dead
    second = r.storage_ranges()
    assert second is not first and len(second) == 1
    assert r.storage_ranges() is second


def test_tensor_spec_fields(torch):
    base = torch.zeros(4, 6, dtype=torch.bfloat16)
    view = base[1:, ::2]
    spec = gt.tensor_spec(view)
    assert spec["storage_base"] == hex(base.untyped_storage().data_ptr())
    assert spec["storage_nbytes"] == 4 * 6 * 2
    assert spec["offset"] == 6 * 2
    assert spec["shape"] == [3, 3] and spec["stride"] == [6, 2]
    # From the first element to one past the last: (2*6 + 2*2 + 1) elements.
    assert spec["nbytes"] == (2 * 6 + 2 * 2 + 1) * 2
    assert (spec["dtype"], spec["itemsize"], spec["device"]) == ("bfloat16", 2, "cpu")
    assert gt.tensor_spec(torch.zeros(0))["nbytes"] == 0


def test_tensor_subclasses_are_walked_through_tensor_flatten(torch):
    class Pair(torch.Tensor):
        """A minimal traceable wrapper subclass (like TorchAO's quantized tensors)."""

        @staticmethod
        def __new__(cls, qdata, scale):
            return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=torch.float32)

        def __init__(self, qdata, scale):
            self.qdata = qdata
            self.scale = scale

        def __tensor_flatten__(self):
            return ["qdata", "scale"], None

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError(func)

    layer = torch.nn.Module()
    layer.register_buffer("weight", Pair(torch.zeros(4, dtype=torch.int8), torch.ones(1)))
    r = gt.walk(layer, root="layer")
    # The inner tensors keep the wrapper's registration; the wrapper has no storage.
    assert registrations(r) == {"layer.weight.qdata": "buffer", "layer.weight.scale": "buffer"}


def test_the_walk_is_read_only(torch):
    calls = []

    class Tricky:
        def __init__(self):
            self.t = torch.ones(2)

        @property
        def computed(self):
            calls.append("property")
            return torch.ones(3)

        def __getattr__(self, name):
            calls.append(f"getattr {name}")
            raise AttributeError(name)

    model = make_model(torch)
    model.tricky = Tricky()
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    before_dicts = {id(m): dict(m.__dict__) for m in model.modules()}
    r = gt.walk(model)
    assert calls == []
    assert "model.tricky.t" in registrations(r)
    assert "model.tricky.computed" not in registrations(r)
    after_state = model.state_dict()
    assert before_state.keys() == after_state.keys()
    assert all(torch.equal(before_state[k], after_state[k]) for k in before_state)
    assert {id(m): dict(m.__dict__) for m in model.modules()} == before_dicts


def test_depth_is_bounded_and_cycles_end(torch):
    class Node:
        def __init__(self, child=None):
            self.child = child
            self.t = torch.ones(1)

    chain = None
    for _ in range(12):
        chain = Node(chain)
    ring = Node()
    ring.child = ring  # a cycle of one
    model = torch.nn.Module()
    model.chain = chain
    model.ring = ring
    r = gt.walk(model, max_depth=4)
    paths = registrations(r)
    assert "model.chain.child.child.child.t" in paths
    assert "model.chain.child.child.child.child.t" not in paths
    assert any("max_depth=4" in why for _, why in r.skipped)
    assert "model.ring.t" in paths and "model.ring.child.t" not in paths
    deeper = gt.walk(model, max_depth=20)
    assert "model.chain" + ".child" * 11 + ".t" in registrations(deeper)


def test_runtime_state_globs(torch):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
    for layer in model.layers:
        layer.kv_cache = torch.zeros(4)
        layer.scale = torch.ones(1)
    r = gt.walk(model, runtime_state=["model.layers[*].kv_cache"])
    regs = registrations(r)
    assert regs["model.layers[0].kv_cache"] == regs["model.layers[1].kv_cache"] == "runtime_state"
    assert regs["model.layers[0].scale"] == "module_attribute"


def test_keys_that_are_not_attribute_names_are_quoted(torch):
    model = torch.nn.Module()
    model.d = {'we"ird.key': torch.ones(1), -1: torch.ones(1), (1, 2): torch.ones(1)}
    model.blocks = torch.nn.ModuleDict({"attn": torch.nn.Linear(1, 1)})
    paths = set(registrations(gt.walk(model)))
    assert 'model.d["we\\"ird.key"]' in paths
    assert "model.d[-1]" in paths
    assert 'model.d["(1, 2)"]' in paths
    assert "model.blocks.attn.weight" in paths
    for p in paths:
        graphcheck._native.check_path(p)


def test_a_broken_persistent_tensors_is_reported_not_raised(torch):
    class Broken:
        def __init__(self):
            self.t = torch.ones(1)

        def persistent_tensors(self):
            raise RuntimeError("boom")

    model = torch.nn.Module()
    model.b = Broken()
    r = gt.walk(model)
    assert registrations(r)["model.b.t"] == "object_attribute"
    assert any("boom" in why for _, why in r.skipped)


def test_digests(torch):
    t = torch.arange(10, dtype=torch.int16)
    assert gt.digest(t) == gt.digest(t.clone())
    assert gt.digest(t).startswith("gc128:")  # the default (test_digest.py tests it)
    assert gt.digest(t, "sha256") == gt.digest(t.clone(), "sha256")
    assert gt.digest(t, "sha256").startswith("sha256:")
    # sum64: bytes as little-endian 64-bit words, zero-padded, summed mod 2^64.
    raw = t.numpy().tobytes() if hasattr(t, "numpy") and _has_numpy() else bytes(
        b for v in range(10) for b in int(v).to_bytes(2, "little")
    )
    raw += b"\0" * (-len(raw) % 8)
    words = sum(int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8))
    assert gt.digest(t, "sum64") == f"sum64:{words % 2**64:016x}"
    # A strided view digests its elements, not the span.
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert gt.digest(m[:, 1]) == gt.digest(m[:, 1].contiguous())
    assert gt.digest(m[:, 1], "sha256") == gt.digest(m[:, 1].contiguous(), "sha256")
    assert gt.digest(m[:, 1], "sum64") == gt.digest(m[:, 1].contiguous(), "sum64")
    # Overflowing words wrap.
    big = torch.full((4,), -1, dtype=torch.int64)
    assert gt.digest(big, "sum64") == f"sum64:{(4 * (2**64 - 1)) % 2**64:016x}"
    with pytest.raises(graphcheck.GraphcheckError, match=r"^algorithm is one of 'gc128', 'sha256', 'sum64', not 'md5'$"):
        gt.digest(t, "md5")


def _has_numpy():
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_root_that_holds_nothing_is_an_error_naming_it(torch):
    # Regression: Recorder(5), register_model(None) and add_root("x") were taken, and
    # every address the graphs read would have been ownerless without a word.
    for make in (
        lambda: gt.Recorder(5),
        lambda: gt.Recorder(None).add_root("x"),
        lambda: gt.register_model(None),
        lambda: gt.instrument(None, model=3.5),
    ):
        with pytest.raises(graphcheck.GraphcheckError, match="holding tensors, not"):
            make()
    assert gt.instrumented() == []
    gt.Recorder(None).add_root({"kv": torch.zeros(2)}, "cache")  # any object is a root


def test_fake_tensors_are_skipped_saying_why_not_recorded_at_address_0(torch, recwarn):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        m = torch.nn.Linear(4, 4)
    reg = gt.walk(m)
    assert reg.tensors == [] and reg.owners == []
    assert dict(reg.skipped) == {
        "model.weight": "fake tensor (FakeTensorMode): no memory",
        "model.bias": "fake tensor (FakeTensorMode): no memory",
    }
    # Torch warns when a FakeTensor's data pointer is read: the walk reads none.
    assert not [w for w in recwarn if "FakeTensor" in str(w.message)]

