"""The anchor model of DESIGN.md, which the capture benchmarks share so that their figures
describe the same graphs: 64 bf16 layers of RMSNorm, two Linears and SiLU with a residual
(width 1024), captured at 8 batch sizes into one pool (3,008 nodes).

Used by capture_profile.py, record_overhead.py, walk_bench.py and instrument_overhead.py; the first two also
share the timed captures of all batch sizes, plain and recorded. They run as scripts from
the repository root (``python3 benches/x.py``), which puts ``benches/`` first on
``sys.path``, so ``import anchor_model`` finds this file. It imports torch: the scripts
import it inside ``main()``, after their arguments are parsed (``--help`` needs no torch).
"""

import time

import torch
import torch.nn as nn

#: The layers' width.
WIDTH = 1024
#: How many layers the anchor model has.
LAYERS = 64
#: The batch sizes it is captured at, into one pool.
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.RMSNorm(d, device="cuda", dtype=torch.bfloat16)
        self.up = nn.Linear(d, 4 * d, device="cuda", dtype=torch.bfloat16)
        self.down = nn.Linear(4 * d, d, device="cuda", dtype=torch.bfloat16)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


def model(layers=LAYERS):
    """The anchor model (``layers`` blocks: fewer for a smaller graph of the same kind)."""
    return nn.Sequential(*[Block(WIDTH) for _ in range(layers)])


def inputs():
    """An input per batch size, by batch size."""
    return {b: torch.randn(b, WIDTH, device="cuda", dtype=torch.bfloat16) for b in BATCH_SIZES}


def warm_up(model, xs):
    """Runs ``model`` twice on each input on a side stream without grad, as torch asks
    before a capture (lazy initialisation, cuBLAS handles and autotuning happen here and
    not in the graphs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for b in BATCH_SIZES:
            for _ in range(2):
                model(xs[b])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def warmed():
    """The anchor model and its inputs (:func:`inputs`), warmed up (:func:`warm_up`) and
    ready to capture."""
    m = model()
    xs = inputs()
    warm_up(m, xs)
    return m, xs


def capture_plain(model, xs):
    """Captures ``model`` at every batch size into one new pool with plain torch
    (``torch.cuda.graph``, instantiated at capture end): the yardstick. Returns the
    seconds it took and the graphs."""
    pool = torch.cuda.graph_pool_handle()
    gs = []
    t0 = time.perf_counter()
    for b in BATCH_SIZES:
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g, pool=pool):
            model(xs[b])
        gs.append(g)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, gs


def capture_recorded(model, xs):
    """Captures ``model`` at every batch size into one new pool through
    ``graphcheck.torch.graph`` into a fresh ``Recorder`` (``bs<b>``, input ``x``): the
    whole capture path. Returns the seconds it took, the graphs and the recorder."""
    import graphcheck.torch as gt

    pool = torch.cuda.graph_pool_handle()
    rec = gt.Recorder(model)
    gs = []
    t0 = time.perf_counter()
    for b in BATCH_SIZES:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), gt.graph(g, recorder=rec, name=f"bs{b}", pool=pool, inputs={"x": xs[b]}):
            model(xs[b])
        gs.append(g)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, gs, rec
