"""Capture-path profile (GPU): where the time graphcheck adds to a capture goes, on the
anchor model of DESIGN.md (64 bf16 layers of RMSNorm, two Linears and SiLU; 8 batch sizes
into one pool), each variant side by side in one process, alternating, medians:

  plain      torch.cuda.graph(g, pool=pool) per batch size (instantiates at capture end)
  keep       the same with CUDAGraph(keep_graph=True) and g.instantiate() after: torch's
             own cost of keeping the graph for graphcheck to read
  walk       keep + graphcheck._native.walk(raw graph) before instantiate (the walker alone)
  inflight   plain, and the walk of the graph still being captured (cuStreamGetCaptureInfo
             on the capture stream, before capture_end): no keep_graph, no separate
             instantiate; checked against the keep walk (same nodes and words) and replayed
  recorded   graphcheck.torch.graph(...) into a fresh Recorder: the whole capture path
  manifest   rec.manifest_json() after the recorded captures

and, for the recorded path, a cProfile of one run (top functions by own time) and the
registry walk alone (Recorder.rewalk on a fresh recorder).

Run on a GPU machine with graphcheck installed:
    python3 benches/capture_profile.py --runs 5 [--json OUT] [--cprofile]
"""
import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--cprofile", action="store_true", help="print a cProfile of one recorded run")
    ap.add_argument("--dump", help="write the recorded run's build spec, walked graphs inline, to this file "
                                   "(for profiling the manifest build without a GPU)")
    args = ap.parse_args()

    import torch

    import anchor_model  # benches/, first on sys.path when run as a script

    import graphcheck.torch as gt
    from graphcheck import _native

    model, xs = anchor_model.warmed()
    bss = anchor_model.BATCH_SIZES

    def plain():
        t, gs = anchor_model.capture_plain(model, xs)
        return {"total": t}, gs

    def keep(walk=False):
        pool = torch.cuda.graph_pool_handle()
        gs = []
        tw = 0.0
        t0 = time.perf_counter()
        for b in bss:
            g = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.no_grad(), torch.cuda.graph(g, pool=pool):
                model(xs[b])
            if walk:
                t1 = time.perf_counter()
                _native.walk(g.raw_cuda_graph())
                tw += time.perf_counter() - t1
            g.instantiate()
            gs.append(g)
        torch.cuda.synchronize()
        return {"total": time.perf_counter() - t0, "walk": tw}, gs

    def recorded():
        t, gs, rec = anchor_model.capture_recorded(model, xs)
        t0 = time.perf_counter()
        rec.manifest_json()
        t_man = time.perf_counter() - t0
        # The manifest's two halves: the build spec (Python: owners, the allocator's
        # segments, JSON) and the core's build (resolving every word, checking, JSON).
        t0 = time.perf_counter()
        spec = json.dumps(rec.build_spec())
        t_spec = time.perf_counter() - t0
        t0 = time.perf_counter()
        _native.build_manifest(spec, rec.walked_graphs)
        t_native = time.perf_counter() - t0
        return {"total": t, "manifest": t_man, "spec": t_spec, "native": t_native, "walks": rec.walks}, gs

    def rewalk():
        rec = gt.Recorder(model)
        t0 = time.perf_counter()
        rec.rewalk()
        return {"total": time.perf_counter() - t0}, []

    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    # cuStreamGetCaptureInfo_v2(stream, *status, *id, *graph, *deps, *ndeps): the graph a
    # capture is building, which the driver allows querying while the capture is open.
    info = cuda.cuStreamGetCaptureInfo_v2
    info.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64),
                     ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                     ctypes.POINTER(ctypes.c_size_t)]

    def capturing_graph():
        status, cid, graph = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_void_p()
        deps, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = info(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(status),
                  ctypes.byref(cid), ctypes.byref(graph), ctypes.byref(deps), ctypes.byref(n))
        if rc != 0 or status.value != 1:
            raise RuntimeError(f"cuStreamGetCaptureInfo_v2: rc {rc}, status {status.value}")
        return graph.value

    def inflight():
        pool = torch.cuda.graph_pool_handle()
        gs, walks = [], []
        tw = 0.0
        t0 = time.perf_counter()
        for b in bss:
            g = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(g, pool=pool):
                model(xs[b])
                t1 = time.perf_counter()
                walks.append(_native.walk(capturing_graph()))
                tw += time.perf_counter() - t1
            gs.append(g)
        torch.cuda.synchronize()
        return {"total": time.perf_counter() - t0, "walk": tw, "walks": walks}, gs

    # Is the graph walked while open the graph torch instantiates? Same nodes and words as
    # the keep walk of the same capture, and the replay gives what the model gives.
    r_in, g_in = inflight()
    r_keep_walks = []
    pool = torch.cuda.graph_pool_handle()
    for b in bss:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), torch.cuda.graph(g, pool=pool):
            model(xs[b])
        r_keep_walks.append(json.loads(_native.walk_graph(g.raw_cuda_graph())))
        g.instantiate()
        del g
    same = []
    for w_in, w_keep in zip(r_in["walks"], r_keep_walks):
        a = json.loads(w_in.to_json()) if hasattr(w_in, "to_json") else None
        nodes_in = a["nodes"] if a else None
        same.append(None if a is None else (
            [(n.get("kind"), n.get("name"), len(n.get("words", []))) for n in nodes_in]
            == [(n.get("kind"), n.get("name"), len(n.get("words", []))) for n in w_keep["nodes"]]))
    g_in[-1].replay()
    torch.cuda.synchronize()
    print(f"[profile] inflight walk vs keep walk, same nodes and word counts per graph: {same}",
          file=sys.stderr)
    del g_in

    variants = {"plain": plain, "inflight": inflight, "keep": keep, "walk": lambda: keep(True), "recorded": recorded, "rewalk": rewalk}
    times = {k: [] for k in variants}
    for i in range(args.runs):
        for k, f in variants.items():
            r, gs = f()
            times[k].append(r)
            del gs
        torch.cuda.synchronize()
        print(f"[profile] run {i + 1}/{args.runs}: " + ", ".join(
            f"{k} {times[k][-1]['total'] * 1e3:.1f} ms" for k in variants), file=sys.stderr)

    def med(k, field="total"):
        return statistics.median(r[field] for r in times[k]) * 1e3

    p = med("plain")
    rows = {
        "plain_ms": p, "keep_ms": med("keep"), "walk_total_ms": med("walk"), "walk_only_ms": med("walk", "walk"),
        "inflight_ms": med("inflight"), "inflight_walk_ms": med("inflight", "walk"),
        "recorded_ms": med("recorded"), "manifest_ms": med("recorded", "manifest"), "rewalk_ms": med("rewalk"),
        "spec_ms": med("recorded", "spec"), "native_ms": med("recorded", "native"),
        "runs": args.runs,
    }
    print(f"anchor model, {len(bss)} graphs, medians of {args.runs}")
    print(f"{'variant':<28} {'ms':>8} {'vs plain':>9}")
    for label, key in [("plain capture", "plain_ms"), ("keep_graph + instantiate", "keep_ms"),
                       ("  + walk", "walk_total_ms"), ("plain + walk while open", "inflight_ms"),
                       ("recorded (whole path)", "recorded_ms")]:
        print(f"{label:<28} {rows[key]:8.2f} {100 * (rows[key] - p) / p:+8.1f}%")
    print(f"{'walk alone (8 graphs)':<28} {rows['walk_only_ms']:8.2f} {100 * rows['walk_only_ms'] / p:8.1f}% of plain")
    print(f"{'walk while open (8 graphs)':<28} {rows['inflight_walk_ms']:8.2f} {100 * rows['inflight_walk_ms'] / p:8.1f}% of plain")
    print(f"{'registry walk (rewalk)':<28} {rows['rewalk_ms']:8.2f} {100 * rows['rewalk_ms'] / p:8.1f}% of plain")
    print(f"{'manifest_json':<28} {rows['manifest_ms']:8.2f} {100 * rows['manifest_ms'] / p:8.1f}% of plain")
    print(f"{'  build spec (Python)':<28} {rows['spec_ms']:8.2f} {100 * rows['spec_ms'] / p:8.1f}% of plain")
    print(f"{'  core build + JSON':<28} {rows['native_ms']:8.2f} {100 * rows['native_ms'] / p:8.1f}% of plain")
    if args.cprofile:
        pr = cProfile.Profile()
        pr.enable()
        _, gs = recorded()
        pr.disable()
        del gs
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    if args.dump:
        _, gs, rec = anchor_model.capture_recorded(model, xs)
        spec = rec.build_spec()
        for entry, g in zip(spec["graphs"], gs):
            entry.pop("walked_index")
            entry["walked"] = json.loads(_native.walk_graph(g.raw_cuda_graph()))
        with open(args.dump, "w") as f:
            json.dump(spec, f)
        del gs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
