"""Two builds of the walker side by side (GPU): examples/walk_ffi.rs built before and after
a change, both loaded in one process, alternating on the same torch-captured graphs as
`walk_bench.py` builds them (mlp256, chain10k, anchor64x8), with the ctypes reference
beside them; medians of the whole walk of each family, the speedup against the reference
and the share of the capture. The counts each walk reports (nodes, words, addresses,
kernels) must agree between the builds, or it exits 1. Each build walks first every other
run (the second walk of a graph runs on caches the first one warmed).

    python3 benches/walk_ab.py --before OLD.so --after NEW.so --ref walk_ctypes.py --runs 9
"""
import argparse
import ctypes
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--ref", required=True, help="walk_ctypes.py (the reference walker)")
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()

    import torch
    import walk_bench  # benches/, first on sys.path when run as a script

    libs = {}
    for name, path in (("before", args.before), ("after", args.after)):
        lib = ctypes.CDLL(path)
        lib.graphcheck_walk.argtypes = [ctypes.c_uint64] + [ctypes.POINTER(ctypes.c_uint64)] * 4 + [ctypes.c_char_p]
        libs[name] = lib
    graphs, keep = walk_bench.build_graphs(torch)
    ref_walk = walk_bench.load_reference(args.ref)
    rc = 0
    for fam, gs in graphs.items():
        times = {"ctypes": [], "before": [], "after": []}
        counts = {}
        for i in range(args.runs):  # alternate, so drift hits all alike
            t0 = time.perf_counter()
            [ref_walk(g.raw_cuda_graph()) for g, _, _ in gs]
            times["ctypes"].append(time.perf_counter() - t0)
            # Each build goes first every other run: the second walk of a graph finds the
            # driver's data for it in the caches the first one warmed.
            order = list(libs.items()) if i % 2 == 0 else list(libs.items())[::-1]
            for k, lib in order:
                n = [ctypes.c_uint64() for _ in range(4)]
                got = []
                t0 = time.perf_counter()
                for g, _, _ in gs:
                    if lib.graphcheck_walk(g.raw_cuda_graph(), *[ctypes.byref(x) for x in n], None) != 0:
                        sys.exit(f"{k}: graphcheck_walk failed")
                    got.append(tuple(x.value for x in n))
                times[k].append(time.perf_counter() - t0)
                counts[k] = got
        if counts["before"] != counts["after"]:
            print(f"{fam}: the builds disagree: {counts}")
            rc = 1
        cap = sum(c for _, c, _ in gs) * 1e3
        m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(
            f"{fam:<11} capture {cap:6.1f} ms  ctypes {m['ctypes']:7.2f} ms  "
            f"before {m['before']:.3f} ms ({m['ctypes'] / m['before']:.0f}x, {100 * m['before'] / cap:.2f}%)  "
            f"after {m['after']:.3f} ms ({m['ctypes'] / m['after']:.0f}x, {100 * m['after'] / cap:.2f}%)  "
            f"after/before {m['after'] / m['before']:.3f}"
        )
    del keep
    sys.exit(rc)


if __name__ == "__main__":
    main()
