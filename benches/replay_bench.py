#!/usr/bin/env python3
"""Benchmark (GPU): what the check before a replay costs a replay with nothing pending.

One small graph (a few elementwise kernels on 4,096 floats) is captured twice, once with
torch's own ``torch.cuda.CUDAGraph`` and once with the class ``graphcheck.torch.instrument``
patches in (``verify_on_replay="raise"``, no transition pending). Each round times
``--replays`` calls of ``replay()`` for each, alternating which goes first, with a
synchronize before and after; the figure is the CPU time per call (replay is asynchronous:
what a caller pays is the launch). Medians of ``--runs`` rounds, and the difference per
replay, which is what the check's flag costs.

Usage: python3 benches/replay_bench.py [--replays 20000] [--runs 7] [--json OUT]
Exit codes: 0 measured, 1 no GPU or a failure, 2 usage.
"""

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("replay_bench: no CUDA device", file=sys.stderr)
        return 1
    import graphcheck.torch as gt

    x = torch.randn(4096, device="cuda")

    def body():
        return (x * 2 + 1).relu()

    plain_cls = torch.cuda.CUDAGraph
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    plain = plain_cls()
    with torch.cuda.graph(plain):
        body()
    ins = gt.instrument(None, verify_on_replay="raise")
    try:
        checked = torch.cuda.CUDAGraph()
        assert type(checked) is not plain_cls
        with torch.cuda.graph(checked):
            body()
        results = {"plain": [], "instrumented": []}
        for r in range(args.runs):
            order = [("plain", plain), ("instrumented", checked)]
            if r % 2:
                order.reverse()
            for label, g in order:
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(args.replays):
                    g.replay()
                elapsed = time.perf_counter() - t
                torch.cuda.synchronize()
                results[label].append(elapsed / args.replays * 1e6)
    finally:
        gt.uninstrument(ins)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.replays} replays x {args.runs} runs")
    print(f"replay(), torch's class:          {med['plain']:.3f} us/call (runs: {', '.join(f'{v:.3f}' for v in results['plain'])})")
    print(f"replay(), instrumented, no check: {med['instrumented']:.3f} us/call (runs: {', '.join(f'{v:.3f}' for v in results['instrumented'])})")
    print(f"difference: {med['instrumented'] - med['plain']:+.3f} us per replay")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": results, "median_us": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
