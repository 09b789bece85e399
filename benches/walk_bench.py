"""Walker benchmark (GPU): graphcheck's Rust walker against the plain-Python ctypes
reference walker (shared/reference/walk_ctypes.py), on the very same graphs captured by
torch, side by side in one process, and both against the capture's own time.

Graphs:
  - mlp256: a bf16 MLP (RMSNorm, two Linears, SiLU, residual) sized to about 256 nodes;
  - chain10k: 5,000 steps of two elementwise kernels over a few buffers: 10,000 nodes;
  - anchor64x8: the anchor model of DESIGN.md (64 layers, 8 batch sizes, one pool).

The Rust walker is reached through the C entry point of examples/walk_ffi.rs:
    cargo build --release --features cuda --example walk_ffi
Run on a GPU machine:
    python3 benches/walk_bench.py --lib target/release/examples/libwalk_ffi.so --ref walk_ctypes.py
Prints a table; `--json OUT` writes the figures, `--dump DIR` writes each walked graph.
"""
import argparse
import ctypes
import importlib.util
import json
import os
import statistics
import sys
import time


def load_reference(path):
    spec = importlib.util.spec_from_file_location("walk_ctypes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.walk


def build_graphs(torch):
    import anchor_model  # benches/, first on sys.path when run as a script

    def warm_then_capture(fn, arg, pool=None):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(2):
                fn(arg)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph(keep_graph=True)
        t0 = time.perf_counter()
        with torch.no_grad(), torch.cuda.graph(g, pool=pool):
            fn(arg)
        torch.cuda.synchronize()
        t_capture = time.perf_counter() - t0
        t0 = time.perf_counter()
        g.instantiate()
        torch.cuda.synchronize()
        t_inst = time.perf_counter() - t0
        return g, t_capture, t_inst

    graphs = {}
    # ~256 nodes: each block is about 8 kernels (norm, two GEMMs with bias, SiLU, add).
    mlp = anchor_model.model(layers=32)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    graphs["mlp256"] = [warm_then_capture(mlp, x)]

    bufs = [torch.randn(4096, device="cuda") for _ in range(8)]

    def chain(_):
        for i in range(5000):
            a, b = bufs[i % 8], bufs[(i + 3) % 8]
            a.mul_(0.999)
            a.add_(b)

    graphs["chain10k"] = [warm_then_capture(chain, None)]

    anchor = anchor_model.model()
    pool = torch.cuda.graph_pool_handle()
    xs = list(anchor_model.inputs().values())
    graphs["anchor64x8"] = [warm_then_capture(anchor, xb, pool) for xb in xs]
    return graphs, (mlp, anchor, bufs, xs, x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libwalk_ffi.so")
    ap.add_argument("--ref", required=True, help="walk_ctypes.py (the reference walker)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--dump", help="write each walked graph (JSON) into this directory")
    args = ap.parse_args()

    import torch

    ref_walk = load_reference(args.ref)
    lib = ctypes.CDLL(args.lib)
    lib.graphcheck_walk.argtypes = [ctypes.c_uint64] + [ctypes.POINTER(ctypes.c_uint64)] * 4 + [ctypes.c_char_p]
    lib.graphcheck_walk.restype = ctypes.c_int

    print(f"[walk] torch {torch.__version__} on {torch.cuda.get_device_name()}", file=sys.stderr)
    graphs, keep = build_graphs(torch)

    def ours(g, dump=None):
        n, w, a, f = (ctypes.c_uint64() for _ in range(4))
        rc = lib.graphcheck_walk(g.raw_cuda_graph(), ctypes.byref(n), ctypes.byref(w), ctypes.byref(a),
                                 ctypes.byref(f), dump.encode() if dump else None)
        if rc != 0:
            raise SystemExit("graphcheck_walk failed")
        return n.value, w.value, a.value, f.value

    prof = getattr(lib, "graphcheck_profile", None)
    if prof is not None:
        prof.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_double)]
        prof.restype = ctypes.c_int

    rows = []
    for name, gs in graphs.items():
        t_capture = sum(c for _, c, _ in gs)
        t_inst = sum(i for _, _, i in gs)
        ref_t, our_t = [], []
        for _ in range(args.runs):  # alternate, so drift hits both alike
            t0 = time.perf_counter()
            ref_nodes = [ref_walk(g.raw_cuda_graph()) for g, _, _ in gs]
            ref_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            our = [ours(g) for g, _, _ in gs]
            our_t.append(time.perf_counter() - t0)
        n_ref = sum(len(n) for n in ref_nodes)
        n_words_ref = sum(len(k.get("words", [])) for n in ref_nodes for k in n)
        n_ours = sum(o[0] for o in our)
        words_ours = sum(o[1] for o in our)
        addrs = sum(o[2] for o in our)
        kernels = max(o[3] for o in our)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            for i, (g, _, _) in enumerate(gs):
                ours(g, os.path.join(args.dump, f"{name}_{i}.walk.json"))
        r, o = statistics.median(ref_t), statistics.median(our_t)
        per_call = None
        if prof is not None:
            v = (ctypes.c_double * 4)()
            if prof(gs[0][0].raw_cuda_graph(), v) == 0:
                per_call = {"get_nodes_ns": v[0], "get_type_ns": v[1], "kernel_params_ns": v[2]}
        phases = None
        ph = getattr(lib, "graphcheck_phases", None)
        if ph is not None:
            ph.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(ctypes.c_double)]
            ph.restype = ctypes.c_int
            v = (ctypes.c_double * 9)()
            if ph(gs[-1][0].raw_cuda_graph(), args.runs, v) == 0:
                phases = {"types_ns": v[0], "kernel_params_ns": v[1], "function_cache_ns": v[2],
                          "copy_params_ns": v[3], "walk_ns": v[4], "function_handles": v[5], "nodes": v[6],
                          "driver_lookups": v[7], "words": v[8]}
        rows.append({
            "graph": name, "phases_ns_per_node": phases, "graphs": len(gs), "nodes": n_ours, "nodes_ref": n_ref,
            "words": words_ours, "words_ref": n_words_ref, "addresses": addrs, "kernels": kernels,
            "capture_ms": t_capture * 1e3, "instantiate_ms": t_inst * 1e3,
            "ref_ms": r * 1e3, "ours_ms": o * 1e3, "speedup": r / o,
            "ours_pct_of_capture": 100 * o / t_capture,
            "driver_ns_per_node": per_call,
        })
        print(f"[walk] {name}: done", file=sys.stderr)

    hdr = f"{'graph':<11} {'nodes':>6} {'kernels':>7} {'words':>7} {'addrs':>6} {'capture ms':>10} {'ctypes ms':>10} {'ours ms':>8} {'speedup':>8} {'ours/capture':>12}"
    print(hdr)
    print("-" * len(hdr))
    for x in rows:
        print(f"{x['graph']:<11} {x['nodes']:>6} {x['kernels']:>7} {x['words']:>7} {x['addresses']:>6} {x['capture_ms']:>10.1f} "
              f"{x['ref_ms']:>10.2f} {x['ours_ms']:>8.3f} {x['speedup']:>7.0f}x {x['ours_pct_of_capture']:>11.2f}%")
        if x["nodes"] != x["nodes_ref"] or x["words"] != x["words_ref"]:
            print(f"  note: node/word counts differ from the reference ({x['nodes_ref']} nodes, {x['words_ref']} words)")
    for x in rows:
        if x["driver_ns_per_node"]:
            d = x["driver_ns_per_node"]
            print(f"{x['graph']}: driver per node: cuGraphGetNodes {d['get_nodes_ns']:.0f} ns, "
                  f"cuGraphNodeGetType {d['get_type_ns']:.0f} ns, cuGraphKernelNodeGetParams {d['kernel_params_ns']:.0f} ns; "
                  f"our walk {1e6 * x['ours_ms'] / x['nodes']:.0f} ns per node")
    for x in rows:
        if x["phases_ns_per_node"]:
            d = x["phases_ns_per_node"]
            print(f"{x['graph']}: cumulative ns per node (best of {args.runs}, last graph, {d['nodes']:.0f} nodes, "
                  f"{d['function_handles']:.0f} function handles): types {d['types_ns']:.0f}, + kernel params "
                  f"{d['kernel_params_ns']:.0f}, + function cache {d['function_cache_ns']:.0f}, + copy param bytes "
                  f"{d['copy_params_ns']:.0f}; whole walk {d['walk_ns']:.0f} ({d['words']:.0f} words, "
                  f"{d['driver_lookups']:.0f} driver range lookups)")
    print("targets: >= 50x the reference, < 5% of the capture's own time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    del keep


if __name__ == "__main__":
    main()
