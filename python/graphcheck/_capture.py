"""Capturing and recording in one: :func:`graph` is ``torch.cuda.graph`` that records the
captured graph into a :class:`graphcheck._recorder.Recorder`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Optional

from . import _args, _native
from ._native import GraphcheckError
from ._recorder import Recorder, fatal, tensors_arg, walk_graph
from ._torch_import import import_torch

__all__ = ["graph"]


@contextlib.contextmanager
def graph(
    cuda_graph,
    *,
    model=None,
    name: str,
    recorder: Optional[Recorder] = None,
    pool=None,
    stream=None,
    capture_error_mode: str = "global",
    inputs: Optional[Mapping[str, Any]] = None,
    outputs: Optional[Mapping[str, Any]] = None,
) -> Iterator[Recorder]:
    """``torch.cuda.graph`` that also records: captures into ``cuda_graph`` (made with
    ``torch.cuda.CUDAGraph(keep_graph=True)``), walks the captured graph, adds it to
    ``recorder`` (a new one over ``model`` when not given), then instantiates it. Yields the
    recorder.

    The graph is instantiated whether or not recording succeeds: a recording failure
    raises :class:`GraphcheckError` (its cause chained) after the graph is ready to
    replay. An empty capture (torch only warns) is recorded as a graph with no node. A
    wrong argument is a :class:`GraphcheckError` before anything is captured."""
    torch = import_torch()
    name = _args.text("name", name)
    tensors_arg("inputs", inputs)
    tensors_arg("outputs", outputs)
    if recorder is not None and not isinstance(recorder, Recorder):
        raise GraphcheckError(
            f"recorder is a graphcheck.torch.Recorder, not {_args.show(recorder)}"
        )
    # Duck-typed: under instrument() torch.cuda.CUDAGraph is a subclass, and a graph made
    # before is an instance of the class it replaced.
    if not hasattr(cuda_graph, "raw_cuda_graph"):
        raise GraphcheckError(
            "cuda_graph is a torch.cuda.CUDAGraph (made with keep_graph=True), "
            f"not {_args.show(cuda_graph)}"
        )
    if recorder is None:
        if model is None:
            raise GraphcheckError("graph() needs a model or a recorder")
        recorder = Recorder(model)
    if not hasattr(_native, "walk"):
        walk_graph(0)  # raises the message that says why
    with torch.cuda.graph(
        cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode
    ):
        yield recorder
    try:
        graph_pool = pool if pool is not None else cuda_graph.pool()
        recorder.record(cuda_graph, name, pool=graph_pool, inputs=inputs, outputs=outputs)
    except GraphcheckError:
        raise
    except BaseException as e:
        if fatal(e):
            raise
        raise GraphcheckError(f"recording graph {name!r} failed: {type(e).__name__}: {e}") from e
    finally:
        instantiate: Optional[Callable] = getattr(cuda_graph, "instantiate", None)
        if instantiate is not None:
            instantiate()
