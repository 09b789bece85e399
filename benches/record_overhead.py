"""Record overhead (GPU): what graphcheck.torch adds to capturing the anchor model of
DESIGN.md (64 bf16 layers of RMSNorm, two Linears and SiLU; 8 batch sizes into one pool),
side by side in one process with a plain torch capture of the same graphs.

  plain     torch.cuda.graph(g, pool=pool) per batch size (instantiates at capture end)
  recorded  graphcheck.torch.graph(g, recorder=rec, ...) per batch size: capture with
            keep_graph=True, the Rust walker, then instantiate; the model's owner registry
            is walked at the first graph, and again only at a capture that reads an
            address nothing known explains (graph-pool segments are re-read first)
  manifest  rec.manifest_json(): resolving every word to owners and checking the result
            (what instrument() writes after a capture; rec.manifest() adds a json.loads)

Run on a GPU machine with graphcheck installed:
    python3 benches/record_overhead.py --runs 5 [--json OUT]
"""
import argparse
import json
import os
import tempfile
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()

    import anchor_model  # benches/, first on sys.path when run as a script

    import graphcheck
    # Loaded before the model is built, as it always was here, so that every timed capture
    # runs in the same process state (anchor_model.capture_recorded uses it).
    import graphcheck.torch  # noqa: F401

    model, xs = anchor_model.warmed()
    bss = anchor_model.BATCH_SIZES

    def recorded():
        t_rec, gs, rec = anchor_model.capture_recorded(model, xs)
        t0 = time.perf_counter()
        text = rec.manifest_json()
        t_man = time.perf_counter() - t0
        # Written, as instrument() does at each capture (write_every=1) or at exit.
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            rec.write(os.path.join(d, "manifest.json"))
            t_write = time.perf_counter() - t0
            sizes.append(os.path.getsize(os.path.join(d, "manifest.json")))
        return t_rec, t_man, t_write, graphcheck.load(text), gs, getattr(rec, "walks", None)

    sizes = []  # bytes of each written manifest

    plain_t, rec_t, man_t, write_t = [], [], [], []
    manifest = None
    for i in range(args.runs):  # alternate, so drift hits both alike
        t, gs = anchor_model.capture_plain(model, xs)
        plain_t.append(t)
        del gs
        r, mt, wt, manifest, gs, walks = recorded()
        rec_t.append(r)
        man_t.append(mt)
        write_t.append(wt)
        del gs
        print(f"[record] run {i + 1}/{args.runs}: plain {t * 1e3:.1f} ms, recorded {r * 1e3:.1f} ms, manifest {mt * 1e3:.1f} ms", file=sys.stderr)

    nodes = sum(sum(g["node_counts"].values()) for g in manifest["graphs"])
    touches = sum(len(n["touches"]) for g in manifest["graphs"] for n in g["nodes"])
    report = graphcheck.verify(manifest)
    p, r, m = statistics.median(plain_t), statistics.median(rec_t), statistics.median(man_t)
    w = statistics.median(write_t)
    rows = {
        "graphs": len(manifest["graphs"]), "nodes": nodes, "touches": touches,
        "tensors": len(manifest["tensors"]), "findings": len(report.findings),
        "plain_ms": p * 1e3, "recorded_ms": r * 1e3, "manifest_ms": m * 1e3,
        "write_ms": w * 1e3,
        "overhead_capture_pct": 100 * (r - p) / p, "overhead_total_pct": 100 * (r + m - p) / p,
        "overhead_written_pct": 100 * (r + w - p) / p,
        "added_capture_ms": (r - p) * 1e3, "registry_walks": walks,
        "manifest_bytes": statistics.median(sizes),
    }
    print(f"anchor model: {rows['graphs']} graphs, {nodes} nodes, {touches} address words, "
          f"{rows['tensors']} tensors; capture-time findings: {rows['findings']}")
    print(f"plain capture      {p * 1e3:8.1f} ms (median of {args.runs})")
    print(f"recorded capture   {r * 1e3:8.1f} ms  (+{rows['overhead_capture_pct']:.1f}%: walk + registry + keep_graph/instantiate)")
    print(f"manifest build     {m * 1e3:8.1f} ms")
    print(f"manifest written   {w * 1e3:8.1f} ms  (build + JSON to a file, atomically)")
    print(f"registry walks     {walks} (per recorder of {len(bss)} graphs)")
    print(f"manifest size      {rows['manifest_bytes']:.0f} bytes as written")
    print(f"total overhead     {rows['overhead_total_pct']:+.1f}% of the plain capture with the manifest built, "
          f"{rows['overhead_written_pct']:+.1f}% with it written (targets: capture path <= 5%, everything <= 15%)")
    if report.findings:
        print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
