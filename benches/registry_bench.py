"""Owner-registry benchmark (CPU): `graphcheck.torch.walk` over a synthetic model of
about 100,000 tensors, shaped like an inference engine's model after loading.

The model is a ModuleList of decoder layers. Per layer: attention and MLP Linears
(parameters), a RMSNorm, non-persistent rotary buffers, a `_held_*` buffer, a plain
tensor attribute (Gemma3n's `embed_scale`), a quant-method object holding a kernel object
(workspace, strides), a `persistent_tensors()` protocol, a dict of scales and a list of
per-expert tensors, a `functools.partial` and a closure holding tensors. Tensors are tiny
CPU tensors: the walk reads metadata only, so sizes do not matter.

    python3 benches/registry_bench.py                   # 100,000 tensors, median of 3
    python3 benches/registry_bench.py --tensors 20000 --runs 5
    python3 benches/registry_bench.py --profile         # cProfile of one walk, top 25

Prints the tensor and owner counts, each run's time, the median and tensors/s. Exit code 1
with `--strict` when the median misses the target (1 s).
"""

import argparse
import functools
import statistics
import sys
import time

TARGET_S = 1.0


def build(torch, n_tensors):
    nn = torch.nn

    class Kernel:
        def __init__(self):
            self.workspace = torch.zeros(4, dtype=torch.int32)
            self.ab_strides = torch.zeros(2, dtype=torch.int64)
            self.c_strides = torch.zeros(2, dtype=torch.int64)
            self.name = "marlin"
            self.config = {"tile": 16, "stages": 4}

    class QuantMethod:
        def __init__(self):
            self.kernel = Kernel()
            self.w_scale = torch.ones(2)
            self.input_scale = torch.ones(1)

        def persistent_tensors(self):
            return {"w_scale": self.w_scale, "input_scale": self.input_scale}

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(2, 2)
            self.k_proj = nn.Linear(2, 2)
            self.v_proj = nn.Linear(2, 2)
            self.o_proj = nn.Linear(2, 2, bias=False)
            self.up = nn.Linear(2, 2, bias=False)
            self.down = nn.Linear(2, 2, bias=False)
            self.norm = nn.RMSNorm(2)
            self.register_buffer("cos", torch.zeros(2), persistent=False)
            self.register_buffer("sin", torch.zeros(2), persistent=False)
            self.register_buffer("_held_w_uv", torch.zeros(2))
            self.embed_scale = torch.tensor(8.0)  # a plain attribute
            self.quant_method = QuantMethod()
            self.scales = {"q": torch.ones(1), "k": torch.ones(1), "v": torch.ones(1)}
            self.experts = [torch.zeros(2) for _ in range(4)]
            self.act = functools.partial(torch.nn.functional.silu, inplace=False)
            bias = torch.zeros(2)
            self.epilogue = lambda x: x + bias
            self.meta = (2, "bf16", torch.zeros(1))

    per_layer = len(_walk_count(torch, Layer()))
    layers = max(1, round(n_tensors / per_layer))
    model = nn.Module()
    model.embed = nn.Embedding(4, 2)
    model.layers = nn.ModuleList(Layer() for _ in range(layers))
    model.norm = nn.RMSNorm(2)
    return model


def _walk_count(torch, layer):
    import graphcheck.torch as gt

    return gt.walk(layer)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile one walk")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = ap.parse_args(argv)

    import torch

    import graphcheck.torch as gt

    t0 = time.perf_counter()
    model = build(torch, args.tensors)
    print(f"built the model in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        gt.walk(model)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0

    times = []
    counts = None
    for i in range(args.runs):
        t0 = time.perf_counter()
        reg = gt.walk(model)
        times.append(time.perf_counter() - t0)
        counts = (len(reg.tensors), len(reg.owners), len(reg.skipped))
        del reg  # freeing a registry is not part of the next walk
        print(f"run {i + 1}: {times[-1]:.3f} s", file=sys.stderr)
    med = statistics.median(times)
    print(
        f"tensors {counts[0]}  owners {counts[1]}  skipped {counts[2]}\n"
        f"walk median {med:.3f} s (min {min(times):.3f}, runs {args.runs})  "
        f"{counts[0] / med:,.0f} tensors/s\n"
        f"target <= {TARGET_S:g} s  {'met' if med <= TARGET_S else 'MISSED'}"
    )
    return 1 if args.strict and med > TARGET_S else 0


if __name__ == "__main__":
    sys.exit(main())
