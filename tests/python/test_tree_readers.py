"""The readers of torch.compile's CUDA-graph tree nodes (trees.tree_input_shapes,
tree_graph_name, tree_static_ptrs), on the CPU: against a stand-in node shaped like
torch's CUDAGraphNode (torch/_inductor/cudagraph_trees.py, torch 2.15) holding torch's
own WrappedFunction, FunctionID and GraphID, a present attribute is read; a missing one
(a torch that renamed it) is a warning naming it and what is lost, once per name."""

import warnings

import pytest

from graphcheck._instrument import trees


@pytest.fixture
def tree(torch):
    """torch's tree records: (WrappedFunction, FunctionID, GraphID)."""
    from torch._inductor.cudagraph_trees import GraphID
    from torch._inductor.cudagraph_utils import FunctionID, WrappedFunction

    return WrappedFunction, FunctionID, GraphID


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(trees, "_TREE_WARNED", set(), raising=False)


class Node:
    """The attributes of CUDAGraphNode.__init__ that graphcheck reads, under torch's names."""

    def __init__(self, wrapped_function, id, static_input_data_ptrs):
        self.wrapped_function = wrapped_function
        self.id = id
        self.static_input_data_ptrs = static_input_data_ptrs


def wrapped(tree, static_input_idxs, fn_id=3):
    WrappedFunction, FunctionID, _ = tree
    return WrappedFunction(
        model=lambda inputs: inputs,
        static_input_idxs=static_input_idxs,
        id=FunctionID(fn_id),
        constants=(),
        placeholders=(),
        mutated_input_idxs=(),
        cudagraph_managed_input_rerecord_limit=8,
        cudagraph_managed_input_rerecord_action="copy",
    )


def node(tree, torch):
    _, _, GraphID = tree
    return Node(wrapped(tree, [0]), GraphID(7), [0x7F00_0000_1000, None, 0x7F00_0000_2000])


def inputs(torch):
    # Input 0 is static (a parameter); 1 and 2 are the batch.
    return [torch.zeros(4, 4), torch.zeros(8, 256), torch.tensor(1.0)]


def test_present_attributes_are_read(torch, tree):
    n = node(tree, torch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shapes = trees.tree_input_shapes(n, inputs(torch))
        assert shapes == ["8x256", "scalar"]
        assert trees.tree_graph_name(n, shapes) == "inductor_fn3_graph7[8x256,scalar]"
        assert trees.tree_static_ptrs(n) == (0x7F00_0000_1000, 0x7F00_0000_2000)


def missing(torch, tree, attribute):
    """A node whose dotted ``attribute`` is gone, as a torch that renamed it would have."""
    n = node(tree, torch)
    if attribute == "wrapped_function.static_input_idxs" or attribute == "wrapped_function.id.id":
        # WrappedFunction is a frozen slotted dataclass: a stand-in without the field.
        class Wrapped:
            pass

        w = Wrapped()
        if attribute != "wrapped_function.id.id":
            w.id = n.wrapped_function.id
        if attribute != "wrapped_function.static_input_idxs":
            w.static_input_idxs = n.wrapped_function.static_input_idxs
        n.wrapped_function = w
    else:
        delattr(n, attribute.split(".")[0])
    return n


@pytest.mark.parametrize(
    "attribute, read, fallback, lost",
    [
        ("wrapped_function.static_input_idxs", lambda n, x: trees.tree_input_shapes(n, x), None,
         "named without their batch shapes"),
        ("wrapped_function.id.id", lambda n, x: trees.tree_graph_name(n, ["8x256"]), None,
         "the default names"),
        ("id", lambda n, x: trees.tree_graph_name(n, ["8x256"]), None, "the default names"),
        ("static_input_data_ptrs", lambda n, x: trees.tree_static_ptrs(n), (),
         "reported as findings instead of superseded"),
    ],
)
def test_a_missing_attribute_is_a_warning_naming_it_once(torch, tree, attribute, read, fallback, lost):
    n = missing(torch, tree, attribute)
    chain = "id.id" if attribute == "id" else attribute
    with pytest.warns(RuntimeWarning) as caught:
        assert read(n, inputs(torch)) == fallback
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert messages[0].startswith(
        f"graphcheck: this torch's CUDA-graph tree node has no `{chain}` (torch/_inductor/cudagraph_trees.py): "
    ), messages[0]
    assert lost in messages[0]
    # Once per name: the next capture's read is quiet, with the same fallback.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read(n, inputs(torch)) == fallback


def test_the_names_read_are_torchs(torch, tree):
    # What the stand-in mirrors: the attribute names CUDAGraphNode sets and the records'
    # fields, as torch 2.15 declares them.
    import dataclasses
    import inspect

    from torch._inductor import cudagraph_trees

    WrappedFunction, FunctionID, GraphID = tree
    assert {"static_input_idxs", "id"} <= {f.name for f in dataclasses.fields(WrappedFunction)}
    assert [f.name for f in dataclasses.fields(FunctionID)] == ["id"]
    assert [f.name for f in dataclasses.fields(GraphID)] == ["id"]
    source = inspect.getsource(cudagraph_trees.CUDAGraphNode.__init__)
    for assigned in ("self.wrapped_function =", "self.id =", "self.static_input_data_ptrs"):
        assert assigned in source, assigned
