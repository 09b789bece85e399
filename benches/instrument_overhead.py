"""What ``graphcheck.torch.instrument()`` adds to an engine's captures (GPU): the anchor
model of DESIGN.md (64 bf16 layers, 8 batch sizes into one pool; ``anchor_model.py``)
captured with plain ``torch.cuda.graph``, and the same captures under ``instrument()`` in
its engine settings, alternating, medians:

  plain        torch.cuda.graph(g, pool=pool) per batch size
  dir          instrument(directory): the manifest rewritten after every capture (the
               default write_every=1; what GRAPHCHECK_DIR does), until the last is on disk
               (flush: the writer thread done)
  check        instrument(verify_on_replay="raise"), no directory: the capture-time facts
               the replay check needs, read at every capture
  check_built  the same and the manifest built once after (what the first check builds)
  dir_every8   instrument(directory, write_every=8): one write for the 8 graphs

``--graphs N`` captures the batch sizes over and over into one pool until N graphs (an
engine captures dozens), to show how the cost grows with the number of graphs.

Run on a GPU machine with graphcheck installed:
    python3 benches/instrument_overhead.py --runs 5 [--graphs 32] [--json OUT]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--graphs", type=int, default=8)
    ap.add_argument("--inputs", choices=["own", "static"], default="own",
                    help="own: each batch size's input a tensor of its own (a walk-triggering "
                         "address per graph); static: slices of one static buffer, as engines "
                         "capture (vLLM's and SGLang's input buffers)")
    ap.add_argument("--json")
    ap.add_argument("--cprofile", metavar="VARIANT", help="print a cProfile of one run of VARIANT (top by cumulative time)")
    args = ap.parse_args()

    import torch

    import anchor_model  # benches/, first on sys.path when run as a script

    import graphcheck.torch as gt

    model, xs = anchor_model.warmed()
    if args.inputs == "static":
        buf = torch.randn(max(anchor_model.BATCH_SIZES), anchor_model.WIDTH, device="cuda", dtype=torch.bfloat16)
        xs = {b: buf[:b] for b in anchor_model.BATCH_SIZES}
    sizes = [anchor_model.BATCH_SIZES[i % len(anchor_model.BATCH_SIZES)] for i in range(args.graphs)]
    tmp = tempfile.mkdtemp(prefix="gc-instrument-")

    def capture_all():
        pool = torch.cuda.graph_pool_handle()
        gs = []
        for b in sizes:
            g = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(g, pool=pool):
                model(xs[b])
            gs.append(g)
        return gs

    def plain():
        t0 = time.perf_counter()
        gs = capture_all()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, gs

    def instrumented(**kwargs):
        built = kwargs.pop("_built", False)
        want_dir = kwargs.pop("_dir", False)

        def run():
            d = tempfile.mkdtemp(dir=tmp) if want_dir else None
            t0 = time.perf_counter()
            ins = gt.instrument(d, model=model, **kwargs)
            try:
                gs = capture_all()
                torch.cuda.synchronize()
                if d is not None:
                    ins.flush()  # the writer thread done, and what is left written
                if built:
                    ins.manifest_json()  # what the first replay check builds
                t = time.perf_counter() - t0
                assert not ins.errors, ins.errors
                assert ins.captures == len(sizes), ins.captures
            finally:
                gt.uninstrument(ins)
            return t, gs
        return run

    variants = {
        "plain": plain,
        "dir": lambda: instrumented(_dir=True)(),
        "check": lambda: instrumented(verify_on_replay="raise")(),
        "check_built": lambda: instrumented(verify_on_replay="raise", _built=True)(),
        "dir_every8": lambda: instrumented(_dir=True, write_every=8)(),
    }
    if args.cprofile:
        import cProfile
        import io
        import pstats

        variants[args.cprofile]()  # warm
        pr = cProfile.Profile()
        pr.enable()
        variants[args.cprofile]()
        pr.disable()
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(45)
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
        return
    times = {k: [] for k in variants}
    for i in range(args.runs):
        for k, f in variants.items():
            t, gs = f()
            times[k].append(t)
            del gs
        print(f"[instrument] run {i + 1}/{args.runs}: " + ", ".join(
            f"{k} {times[k][-1] * 1e3:.1f} ms" for k in variants), file=sys.stderr)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    p = med["plain"]
    print(f"anchor model, {len(sizes)} graphs, inputs {args.inputs}, medians of {args.runs}")
    print(f"{'variant':<14} {'ms':>9} {'vs plain':>9} {'per graph':>10}")
    for k, v in med.items():
        print(f"{k:<14} {v:9.2f} {100 * (v - p) / p:+8.1f}% {(v - p) / len(sizes):9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graphs": len(sizes), "inputs": args.inputs, "runs": args.runs, "median_ms": med}, f, indent=2)


if __name__ == "__main__":
    main()
