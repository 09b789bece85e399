"""The engine-scale yardstick's model and captures (``engine_scale.py``): a bf16 decoder
captured the way vLLM's piecewise mode does.

The decoder has ``layers`` layers, each an RMSNorm, a fused QKV projection scaled by a
derived per-layer buffer (``qkv_scale``: what post-load processing rebuilds, as Marlin's
``workspace`` or MLA's ``W_UV``), an output projection, a second RMSNorm and a gated MLP.
The attention itself is a stand-in op (``q * sigmoid(k) + v``) that runs eagerly between
the pieces, as vLLM's attention runs outside its piecewise graphs.

vLLM's piecewise mode splits the forward at every attention: for a model of L layers that
is L + 1 pieces (piece 0 ends at layer 0's QKV projection, piece i runs layer i-1's output
projection and MLP and layer i's QKV projection, piece L ends at the final norm). For each
capture size it captures one graph per piece, all into one shared pool; the pieces hand
each other their activations through static buffers (``Runner``: vLLM's persistent input
buffers and attention outputs, sliced per size). Then it captures full graphs (the whole
forward, attention included) for the smallest sizes. The defaults are vLLM's: 51 capture
sizes, ``[1, 2, 4] + range(8, 256, 8) + range(256, 513, 16)``, captured largest first, and
35 full graphs: 51 × 33 + 35 = 1,718 graphs for 32 layers.

On a machine without CUDA (``device="cpu"``, the yardstick's dry run) the model runs on
CPU tensors and :class:`CpuGraph` stands in for ``torch.cuda.CUDAGraph``: a capture runs
the code eagerly under a dispatch mode that writes down, per op that launches a kernel,
the addresses of the tensors it reads that existed before the capture (a real graph's
intermediates live in its pool, which the CPU has not got), and graphcheck's walker is
handed that as the walked graph. Everything else graphcheck does is real.
"""

import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

#: vLLM's default capture sizes (``[1, 2, 4] + range(8, 256, 8) + range(256, 513, 16)``).
VLLM_SIZES = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
#: How many of the sizes (the smallest) get a full graph too.
FULL_GRAPHS = 35


class RMSNorm(nn.Module):
    def __init__(self, d, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, **kw))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * self.weight


class Layer(nn.Module):
    def __init__(self, hidden, ff, **kw):
        super().__init__()
        self.input_norm = RMSNorm(hidden, **kw)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False, **kw)
        # Derived by post-load processing; rebuilt at a new address by a reload.
        self.register_buffer("qkv_scale", torch.ones(3 * hidden, **kw))
        self.o_proj = nn.Linear(hidden, hidden, bias=False, **kw)
        self.post_norm = RMSNorm(hidden, **kw)
        self.gate_up = nn.Linear(hidden, 2 * ff, bias=False, **kw)
        self.down = nn.Linear(ff, hidden, bias=False, **kw)

    def attention_in(self, x):
        return self.qkv(self.input_norm(x)) * self.qkv_scale

    def rest(self, residual, attn):
        x = residual + self.o_proj(attn)
        gate, up = self.gate_up(self.post_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Decoder(nn.Module):
    def __init__(self, layers, hidden, ff, **kw):
        super().__init__()
        self.layers = nn.ModuleList(Layer(hidden, ff, **kw) for _ in range(layers))
        self.norm = RMSNorm(hidden, **kw)


class Runner(nn.Module):
    """The engine's persistent buffers (a model runner's input and attention buffers),
    each as large as the largest size; a graph of size b reads and writes their first b
    rows."""

    def __init__(self, max_size, hidden, **kw):
        super().__init__()
        for name, width in (("x_in", hidden), ("residual", hidden), ("qkv", 3 * hidden),
                            ("attn_out", hidden), ("out", hidden)):
            self.register_buffer(name, torch.zeros(max_size, width, **kw))
        self.x_in.normal_()


class Engine:
    """The decoder, its runner buffers, and the pieces of its forward at size b."""

    def __init__(self, layers=32, hidden=256, ff=512, sizes=VLLM_SIZES, full=FULL_GRAPHS,
                 device="cuda", seed=0):
        torch.manual_seed(seed)
        kw = dict(device=device, dtype=torch.bfloat16)
        self.device = device
        self.sizes = list(sizes)
        self.full_sizes = sorted(self.sizes)[:full]
        self.model = Decoder(layers, hidden, ff, **kw)
        for p in self.model.parameters():
            p.requires_grad_(False)
            if p.dim() > 1:
                p.normal_(std=0.02)
        self.runner = Runner(max(self.sizes), hidden, **kw)
        #: Every derived tensor a rebuild replaced, kept alive (rebuild_derived).
        self.retired: list = []

    @property
    def pieces(self):
        return len(self.model.layers) + 1

    def piece(self, i, b):
        """Piece ``i`` of the forward at size ``b``: what a piecewise graph holds."""
        r, layers = self.runner, self.model.layers
        if i == 0:
            r.residual[:b].copy_(r.x_in[:b])
        else:
            x = layers[i - 1].rest(r.residual[:b], r.attn_out[:b])
            if i == len(layers):
                r.out[:b].copy_(self.model.norm(x))
                return
            r.residual[:b].copy_(x)
        r.qkv[:b].copy_(layers[i].attention_in(r.residual[:b]))

    def attention(self, b):
        """The stand-in attention between two pieces (eager in piecewise mode)."""
        q, k, v = self.runner.qkv[:b].chunk(3, dim=-1)
        torch.addcmul(v, q, torch.sigmoid(k), out=self.runner.attn_out[:b])

    def forward(self, b):
        """The whole forward at size ``b`` (what a full graph holds)."""
        for i in range(self.pieces):
            self.piece(i, b)
            if i < self.pieces - 1:
                self.attention(b)
        return self.runner.out[:b]

    def warm_up(self):
        """Runs the forward at every size twice (on a side stream on CUDA), as torch asks
        before a capture."""
        if self.device == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(s):
                for b in self.sizes:
                    for _ in range(2):
                        self.forward(b)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
        else:
            with torch.no_grad():
                for b in self.sizes:
                    self.forward(b)

    def capture_all(self, times=None):
        """Every graph, the way vLLM captures them: per size (largest first) one graph per
        piece into one shared pool, the attention eager between them; then the full graphs
        (largest first). Returns ``[(name, graph, replay)]``, where ``replay`` runs what the
        graph stands for at replay (the graph, and the eager attention after a piece).
        ``times``: a list each graph's capture seconds are appended to."""
        pool = pool_handle(self.device)
        graphs = []

        def one(name, fn, after=None):
            # Looked up at each capture: instrument() replaces torch.cuda.CUDAGraph.
            g = torch.cuda.CUDAGraph()
            t0 = time.perf_counter()
            with torch.no_grad(), capturing(g, pool, self.device):
                fn()
            if times is not None:
                times.append(time.perf_counter() - t0)
            graphs.append((name, g, after))
            if after is not None:
                with torch.no_grad():
                    after()

        for b in sorted(self.sizes, reverse=True):
            for i in range(self.pieces):
                after = (lambda b=b: self.attention(b)) if i < self.pieces - 1 else None
                one(f"piecewise_bs{b}_piece{i}", lambda i=i, b=b: self.piece(i, b), after)
        for b in sorted(self.full_sizes, reverse=True):
            one(f"full_bs{b}", lambda b=b: self.forward(b))
        sync(self.device)
        return graphs

    def rebuild_derived(self):
        """A reload's post-load processing: every layer's ``qkv_scale`` rebuilt at a new
        address, the same values (the graphs still read the old ones)."""
        for layer in self.model.layers:
            # The replaced tensor is kept alive: freed, its block could be taken by the next
            # rebuild's tensor, of the captured layout and values, which the graphs would then
            # read rightly (no finding), and the count of refused graphs would vary with the
            # allocator (seen once in five CPU dry runs: 10 refused, not 14).
            self.retired.append(layer.qkv_scale)
            layer.qkv_scale = layer.qkv_scale.clone()


def engine_from_args(args):
    """The warmed-up :class:`Engine` a bench's arguments ask for (``--layers``,
    ``--hidden``, ``--sizes``, ``--full``, ``--device``), with the CPU stand-in installed
    for ``--device cpu``."""
    if args.device == "cpu":
        install_cpu_stand_in()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else VLLM_SIZES
    full = FULL_GRAPHS if args.full is None else args.full
    eng = Engine(layers=args.layers, hidden=args.hidden, sizes=sizes,
                 full=min(full, len(sizes)), device=args.device)
    eng.warm_up()
    return eng


def replay_all(graphs):
    """Replays every graph in capture order, the eager attention after each piece."""
    with torch.no_grad():
        for _, g, after in graphs:
            g.replay()
            if after is not None:
                after()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def pool_handle(device):
    return torch.cuda.graph_pool_handle() if device == "cuda" else (0, 1)


def capturing(g, pool, device):
    if device == "cuda":
        return torch.cuda.graph(g, pool=pool)
    return _CpuCapture(g, pool)


class _CpuCapture:
    """What ``with torch.cuda.graph(g, pool=pool):`` calls on ``g``, in torch's order and
    argument form (the context manager itself needs CUDA streams)."""

    def __init__(self, g, pool):
        self.g, self.pool = g, pool

    def __enter__(self):
        self.g.capture_begin(self.pool, capture_error_mode="global")

    def __exit__(self, *exc):
        self.g.capture_end()


# -- the CPU stand-in for a CUDA graph -------------------------------------------------

#: Walked graphs of the CPU captures, by handle (CpuGraph.raw_cuda_graph).
WALKED: dict = {}
#: The CpuGraph whose capture is open, if any (what instrument() walks before capture_end).
OPEN: list = [None]


class _Record(TorchDispatchMode):
    """Per op that launches a kernel (not a view), a kernel node whose parameter words are
    the addresses of the tensors it reads that existed before the capture began."""

    def __init__(self):
        super().__init__()
        self.nodes = []
        self.new_storages = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if getattr(func, "is_view", False):
            return out
        seen = []
        inputs = []

        def visit(x):
            if isinstance(x, torch.Tensor):
                inputs.append(x)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    visit(y)

        for a in list(args) + list(kwargs.values()):
            visit(a)
        in_storages = {t.untyped_storage().data_ptr() for t in inputs}
        for t in inputs:
            if t.untyped_storage().data_ptr() not in self.new_storages:
                seen.append(t.data_ptr())
        outs = []
        visit_out = out if isinstance(out, (list, tuple)) else [out]
        for o in visit_out:
            if isinstance(o, torch.Tensor):
                s = o.untyped_storage().data_ptr()
                if s not in in_storages:
                    self.new_storages.add(s)
                outs.append(o)
        words = [{"param": i, "offset": 0, "addr": hex(a), "allocation": None} for i, a in enumerate(seen)]
        self.nodes.append({
            "index": len(self.nodes), "kind": "kernel", "name": str(func.overloadpacket.__name__),
            "grid": [1, 1, 1], "block": [128, 1, 1], "parent": None, "opaque": None, "words": words,
        })
        return out


class CpuGraph:
    """``torch.cuda.CUDAGraph``'s surface on CPU tensors (the dry run): a capture runs the
    code eagerly and writes down what it read (:class:`_Record`); ``replay`` does nothing
    (the dry run measures graphcheck, not the model)."""

    def __new__(cls, keep_graph=False):
        return object.__new__(cls)

    def __init__(self, keep_graph=False):
        self._mode = None
        self._pool = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self._pool = pool
        self._mode = _Record()
        self._mode.__enter__()
        OPEN[0] = self

    def capture_end(self):
        self._mode.__exit__(None, None, None)
        OPEN[0] = None
        if not getattr(self, "_walked_open", False):  # else walked already, while open
            WALKED[id(self)] = self.walked_json()

    def walked_json(self):
        nodes = self._mode.nodes
        return json.dumps({"node_counts": {"kernel": len(nodes)}, "unread": [], "nodes": nodes})

    def raw_cuda_graph(self):
        return id(self)

    def instantiate(self):
        pass

    def replay(self):
        pass

    def pool(self):
        return self._pool


def install_cpu_stand_in():
    """Puts :class:`CpuGraph` in the place of ``torch.cuda.CUDAGraph`` and graphcheck's
    walker in the place that reads :data:`WALKED` (before ``instrument()``, which
    subclasses the class it finds)."""
    from graphcheck import _native

    import graphcheck._instrument.patch as patch

    torch.cuda.CUDAGraph = CpuGraph
    torch.cuda.graphs.CUDAGraph = CpuGraph

    def walk(handle):
        g = OPEN[0]
        if g is not None and id(g) == handle:  # the capture still open
            g._walked_open = True
            return _native.Walked.from_json(g.walked_json())
        return _native.Walked.from_json(WALKED.pop(handle))

    def capturing_graph(stream):
        if OPEN[0] is None:
            raise RuntimeError(f"stream {stream:#x} has no capture open")
        return id(OPEN[0])

    _native.walk = walk
    _native.capturing_graph = capturing_graph
    patch.current_stream = lambda: 0


#: Every CpuGraph captured once :func:`install_cpu_patcher` is in place (the retarget dry
#: run), by handle: its template, kept as long as the run.
TEMPLATES: dict = {}


def install_cpu_patcher():
    """For the retarget dry run (``engine_retarget.py --device cpu``), after
    :func:`install_cpu_stand_in`: each CpuGraph keeps what its capture read as its
    template; walking a closed graph reads that template, and ``_native.apply_plan_cuda``
    patches its words through the core's host patcher (``_native.apply_plan_host``: the
    same all-or-nothing patch of one graph's words the driver's patcher makes). torch's
    ``cuda.synchronize``, which a retarget calls first, does nothing (no CUDA)."""
    from graphcheck import _native

    walk_stand_in, capture_end = _native.walk, CpuGraph.capture_end

    def kept_capture_end(self):
        capture_end(self)
        TEMPLATES[id(self)] = self

    def walk(handle):
        g = TEMPLATES.get(handle)
        if g is None or OPEN[0] is g:
            return walk_stand_in(handle)
        WALKED.pop(handle, None)
        return _native.Walked.from_json(g.walked_json())

    def apply_plan_cuda(plan, graphs):
        outcomes = []
        for name, template, _exec in graphs:
            nodes = TEMPLATES[template]._mode.nodes
            key = lambda n, w: (n["index"], w["param"], w["offset"])  # noqa: E731
            words = {key(n, w): int(w["addr"], 16) for n in nodes for w in n["words"]}
            outcome, after = _native.apply_plan_host(plan, name, words)
            for n in nodes:
                for w in n["words"]:
                    w["addr"] = hex(after[key(n, w)])
            outcomes.append(outcome)
        return outcomes

    CpuGraph.capture_end = kept_capture_end
    _native.walk = walk
    _native.apply_plan_cuda = apply_plan_cuda
    torch.cuda.synchronize = lambda device=None: None
