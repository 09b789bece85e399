#!/usr/bin/env python3
"""Benchmark: `graphcheck.verify()` from Python at several finding counts, the time to get
the `Report` with and without reading its `.table`.

For each count N it writes a manifest whose verify has N capture-time findings (half
`unregistered`: a tensor held through a plain module attribute, half `unowned`: a touched
allocation no owner explains; one kernel node per finding), then, in this process and
alternating, times `graphcheck.verify(path)` alone and `graphcheck.verify(path).table`
(the report and then its table), `--runs` times each, and prints the medians. Both cover
everything a Python caller waits for: reading and checking the manifest, verifying, the
JSON the Report's fields come from, and building the Python objects.

It measures whichever `graphcheck` Python imports, so the same script times a build that
renders every format up front (run it with `PYTHONPATH` at that build's package).

Usage: python3 benches/report_bench.py [--counts 1000,10000,40000] [--runs 3] [--json OUT]
                                      [--keep DIR]

Exit codes: 0 measured, 1 a run failed or a report did not hold the expected findings,
2 usage.
"""

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

BASE = 0x7F0000000000
STEP = 0x10000
SIZE = 0x1000
KERNEL = (
    "void vllm::rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16 const*, long, "
    "c10::BFloat16 const*, float, int, int)"
)


def progress(message):
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def manifest(findings):
    """A manifest whose capture-time verify has `findings` findings: even i an
    `unregistered` tensor (`model.layers[i].scratch`, a module attribute), odd i an
    `unowned` allocation; node i of the one graph touches finding i's address."""
    allocations, tensors, owners, nodes = [], [], [], []
    for i in range(findings):
        base = BASE + i * STEP
        allocations.append({"id": i, "base": hex(base), "size": SIZE, "pool": 0})
        touch = {"param": 0, "offset": 0, "addr": hex(base), "allocation": i}
        if i % 2 == 0:
            t = len(tensors)
            tensors.append({
                "id": t, "storage_base": hex(base), "storage_nbytes": SIZE, "offset": 0,
                "nbytes": SIZE, "shape": [SIZE // 2], "stride": [1], "dtype": "bfloat16",
                "itemsize": 2, "device": "cuda:0", "allocation": i, "pool": 0,
            })
            owners.append({
                "path": f"model.layers[{i}].scratch", "tensor": t,
                "registration": "module_attribute", "holder": "DecoderLayer",
            })
            touch["tensor"] = t
        nodes.append({
            "index": i, "kind": "kernel", "name": KERNEL, "grid": [8, 1, 1],
            "block": [256, 1, 1], "touches": [touch],
        })
    return {
        "format_version": 1,
        "kind": "manifest",
        "producer": {"tool": "report_bench", "tool_version": "0", "rank": 0, "world_size": 1},
        "pools": [{"id": 0, "name": "default", "kind": "default", "sleep": "untouched"}],
        "allocations": allocations,
        "tensors": tensors,
        "owners": owners,
        "graphs": [{
            "id": 0, "name": "decode_bs8", "pool": None,
            "node_counts": {"kernel": findings}, "nodes": nodes,
        }],
    }


def timed(f):
    gc.collect()
    start = time.perf_counter()
    value = f()
    return time.perf_counter() - start, value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1000,5000,10000,20000,40000",
                    help="finding counts, comma-separated")
    ap.add_argument("--runs", type=int, default=3, help="runs of each variant per count")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--keep", type=Path, help="write the manifests here and keep them")
    args = ap.parse_args()
    try:
        counts = [int(c) for c in args.counts.split(",")]
    except ValueError:
        ap.error(f"--counts: comma-separated integers, not {args.counts!r}")
    if args.runs < 1 or any(c < 1 for c in counts):
        ap.error("--runs and every count must be at least 1")

    import graphcheck

    progress(f"graphcheck {graphcheck.__version__} from {Path(graphcheck.__file__).parent}")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="graphcheck-report-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in counts:
        path = folder / f"manifest-{n}.json"
        path.write_text(json.dumps(manifest(n)))
        size = path.stat().st_size / 2**20
        report_s, table_s = [], []
        for run in range(args.runs):
            # Alternating, so drift in the machine's load falls on both alike.
            t, r = timed(lambda: graphcheck.verify(path))
            if len(r.findings) != n or set(r.summary) != {"unregistered", "unowned"}:
                progress(f"{n}: the report holds {len(r.findings)} findings {r.summary}, not {n}")
                return 1
            report_s.append(t)
            del r
            t, table = timed(lambda: graphcheck.verify(path).table)
            if table.count("unregistered") < n // 2:
                progress(f"{n}: the table does not list every finding")
                return 1
            table_s.append(t)
            del table
            progress(f"{n} findings, run {run + 1}/{args.runs}: Report {report_s[-1]:.3f} s, "
                     f"Report + table {table_s[-1]:.3f} s")
        rows.append({
            "findings": n,
            "manifest_mib": round(size, 1),
            "report_s": report_s,
            "report_and_table_s": table_s,
            "report_median_s": statistics.median(report_s),
            "report_and_table_median_s": statistics.median(table_s),
        })
        if args.keep is None:
            path.unlink()
    if args.keep is None:
        folder.rmdir()

    print(f"{'findings':>8}  {'manifest MiB':>12}  {'Report s':>9}  {'Report + .table s':>17}")
    print(f"{'-' * 8}  {'-' * 12}  {'-' * 9}  {'-' * 17}")
    for row in rows:
        print(f"{row['findings']:>8}  {row['manifest_mib']:>12.1f}  {row['report_median_s']:>9.3f}  "
              f"{row['report_and_table_median_s']:>17.3f}")
    if args.json:
        args.json.write_text(json.dumps({
            "graphcheck": graphcheck.__version__,
            "package": str(Path(graphcheck.__file__).parent),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "runs": args.runs,
            "rows": rows,
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
