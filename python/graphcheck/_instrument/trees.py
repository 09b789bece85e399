"""Readers of torch.compile's CUDA-graph tree nodes (``torch/_inductor/cudagraph_trees.py``):
the node recording a capture, found on the calling frames at ``capture_begin``, and what
instrumentation takes from it: the graph's name with its batch shapes, and the static
inputs torch guards. An attribute this torch lacks is warned once and its use left out."""

from __future__ import annotations

import sys
import types
from typing import Optional

from .host import warn

__all__ = ["tree_graph_name", "tree_input_shapes", "tree_node_of", "tree_static_ptrs"]


def tree_node_of(cuda_graph, depth: int = 12):
    """The torch.compile CUDA-graph tree node whose graph ``cuda_graph`` is, found on the
    calling frames at ``capture_begin`` (the node's ``_record`` runs the capture), with
    the inputs it records; ``(None, None)`` for any other capture. Reads frames only."""
    try:
        frame: Optional[types.FrameType] = sys._getframe(1)
    except ValueError:
        return None, None
    for _ in range(depth):
        if frame is None:
            break
        # Only the tree's own frame is looked into: reading any frame's f_locals keeps a
        # snapshot of its locals alive (Python 3.11), which would hold the caller's objects.
        code = frame.f_code
        if code.co_name == "_record" and code.co_filename.endswith("cudagraph_trees.py"):
            node = frame.f_locals.get("self")
            if getattr(node, "graph", None) is cuda_graph:
                return node, frame.f_locals.get("inputs")
        frame = frame.f_back
    return None, None


#: Torch attribute names (torch/_inductor/cudagraph_trees.py) already warned missing: each
#: is said once per process, not at every capture.
_TREE_WARNED: set = set()

#: Returned by :func:`_tree_attr` for an attribute torch does not have.
_MISSING = object()

_NO_SHAPES = "tree graphs are named without their batch shapes"
_NO_NAME = "tree graphs get the default names (capture0, ...) instead of inductor_fn<f>_graph<g>"
_NO_STATIC = (
    "the static inputs torch guards are unknown, so a graph torch re-records after a "
    "rebinding is reported as findings instead of superseded"
)


def _tree_attr(obj, chain: str, lost: str):
    """``obj``'s attribute ``chain`` (dotted, as torch's CUDA-graph tree names it), or
    :data:`_MISSING` after warning, once per name, that this torch lacks it and what is
    lost: a torch that renamed it must not turn graphcheck's guards off in silence."""
    value = obj
    for name in chain.split("."):
        try:
            value = getattr(value, name)
        except AttributeError:
            if chain not in _TREE_WARNED:
                _TREE_WARNED.add(chain)
                warn(
                    f"graphcheck: this torch's CUDA-graph tree node has no `{chain}` "
                    f"(torch/_inductor/cudagraph_trees.py): {lost}"
                )
            return _MISSING
    return value


def tree_input_shapes(node, inputs) -> Optional[list]:
    """At ``capture_begin`` of a tree graph: the shapes of the inputs that are not static
    (the batch the graph is recorded for). By ``capture_end`` the tree's boxed call has
    cleared its input list."""
    static = _tree_attr(node, "wrapped_function.static_input_idxs", _NO_SHAPES)
    if static is _MISSING:
        return None
    static = set(static or ())
    return [
        "x".join(str(int(d)) for d in t.shape) or "scalar"
        for i, t in enumerate(inputs or ())
        if i not in static and hasattr(t, "shape")
    ]


def tree_graph_name(node, shapes) -> Optional[str]:
    """``inductor_fn<function>_graph<id>`` and the shapes of the inputs that are not
    static (the batch the graph was recorded for), e.g. ``inductor_fn0_graph1[8x256]``."""
    fn = _tree_attr(node, "wrapped_function.id.id", _NO_NAME)
    gid = _tree_attr(node, "id.id", _NO_NAME)
    if fn is _MISSING or gid is _MISSING:
        return None
    shapes = shapes or []
    suffix = f"[{','.join(shapes[:3])}]" if shapes else ""
    return f"inductor_fn{fn}_graph{gid}{suffix}"


def tree_static_ptrs(node) -> tuple:
    """The addresses of the static inputs (parameters, buffers) a tree node recorded."""
    ptrs = _tree_attr(node, "static_input_data_ptrs", _NO_STATIC)
    if ptrs is _MISSING:
        return ()
    return tuple(p for p in (ptrs or ()) if p)
