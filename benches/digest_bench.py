"""Content digests on the GPU: graphcheck's gc128 kernel against a read at memory bandwidth
(an int64 sum) and torch.hash_tensor, side by side in one process.

    python benches/digest_bench.py [--gib 1] [--reps 7] [--small 100000] [--json out.json]

Rounds alternate the methods, so that each sees the same clocks and caches; every figure is
the median over ``--reps`` rounds (after one warm-up round that compiles and loads). Time
is wall time around the call with the device synchronized before and after (what a caller
waits for: gc128's host-side packing, copies and launch included), and the bandwidth is the
tensor's bytes over it. Temporary memory is ``torch.cuda.max_memory_allocated()`` during the
call minus what was allocated before it; gc128's own device scratch (accumulators and the
packed list of views, made through the driver, not torch) is reported apart.

Rows, over one bf16 tensor of ``--gib`` GiB:

- ``int64 sum``: ``x.view(torch.int64).sum()``, the anchor: one read at memory bandwidth;
- ``torch.hash_tensor``: where this torch has it;
- ``gc128``: ``graphcheck.torch.digest(x)``;
- ``sum64 (before)``: ``graphcheck.torch.digest(x, "sum64")``, what graphcheck did on the GPU
  before gc128 (several torch operations over an int64 copy).

And over ``--small`` tensors of ``--small-bytes`` each (separate allocations): gc128 of all of
them in one ``digest_all`` call, the native call alone (views built beforehand), gc128 of one
tensor of the same total bytes, and the Python side's cost of building the list of views.
Rows ending in ``kernel only`` are the kernel's own time, from events the native side
records on the stream right before and after its launch.

Targets (issue 14): gc128 at least 90 % of the int64 sum's bandwidth, at least 25 times
torch.hash_tensor's, no temporary memory; and (ours, for "100,000 small tensors as cheaply
as one large one") the kernel over the small tensors at least half as fast per byte as over
one tensor of their bytes. ``--check`` also compares the GPU digests with the
CPU twin's of host copies. Exit code 1 where a check fails; ``--strict`` also where a target
is missed.

``--sweep "unroll=4;unroll=8;unroll=8,min_blocks=3"`` runs the benchmark once per kernel
tuning (``GRAPHCHECK_DIGEST_TUNING``; a process each, as the kernel is compiled once per
process) and prints their gc128 rows side by side; the digests do not depend on the tuning.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import graphcheck._native as native
import graphcheck._registry as registry
import graphcheck.torch as gt


def measure(fn):
    """(seconds, bytes of torch memory allocated beyond what was there before) of one call."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    return elapsed, torch.cuda.max_memory_allocated() - before


def hash_tensor_fn(x):
    """torch.hash_tensor over the tensor's bytes, or the reason it cannot run."""
    if not hasattr(torch, "hash_tensor"):
        return None, f"torch {torch.__version__} has no torch.hash_tensor"
    for view in (x, x.view(torch.int64)):
        try:
            torch.hash_tensor(view).item()
            return (lambda v=view: torch.hash_tensor(v).item()), None
        except Exception as e:  # noqa: BLE001 - tried on the next view, reported if none works
            reason = f"{type(e).__name__}: {e}"
    return None, f"torch.hash_tensor failed: {reason}"


def run(args) -> dict:
    nbytes = int(args.gib * (1 << 30))
    x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    methods = {
        "int64 sum": lambda: x.view(torch.int64).sum().item(),
        "gc128": lambda: gt.digest(x),
    }
    hash_fn, hash_note = hash_tensor_fn(x)
    if hash_fn is not None:
        methods["torch.hash_tensor"] = hash_fn
    if not args.no_sum64:
        methods["sum64 (before)"] = lambda: gt.digest(x, "sum64")
    small = [
        torch.empty(args.small_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        for _ in range(args.small)
    ]
    same = torch.randn(args.small * args.small_bytes // 2, dtype=torch.bfloat16, device="cuda")
    dev = torch.cuda.current_device()
    views = [registry._view(t) for t in small]
    stream = torch.cuda.current_stream().cuda_stream
    methods["gc128, small tensors"] = lambda: gt.digest_all(small)
    methods["gc128, small tensors, native call"] = lambda: native.digest_cuda(
        dev, stream, views, registry.nvrtc_path()
    )
    methods["gc128, one tensor of their bytes"] = lambda: gt.digest(same)
    methods["views of the small tensors (Python)"] = lambda: [registry._view(t) for t in small]
    # The kernel's own time (events around the launch), for the gc128 rows.
    kernel_rows = ("gc128", "gc128, small tensors", "gc128, one tensor of their bytes")

    rows = {name: [] for name in methods}
    kernel = {name: [] for name in kernel_rows}
    temp = {name: 0 for name in methods}
    for rnd in range(args.reps + 1):
        for name, fn in methods.items():
            t, extra = measure(fn)
            if rnd:
                rows[name].append(t)
                temp[name] = max(temp[name], extra)
                if name in kernel:
                    kernel[name].append(native.gpu_digest_info(dev)["last_kernel_ms"] / 1e3)
        if rnd:
            print(
                f"round {rnd}: " + ", ".join(f"{k} {v[-1] * 1e3:.2f} ms" for k, v in rows.items()),
                file=sys.stderr,
            )
    med = {k: statistics.median(v) for k, v in rows.items()}
    size = {
        "int64 sum": nbytes, "gc128": nbytes, "torch.hash_tensor": nbytes,
        "sum64 (before)": nbytes, "gc128, small tensors": args.small * args.small_bytes,
        "gc128, small tensors, native call": args.small * args.small_bytes,
        "gc128, one tensor of their bytes": args.small * args.small_bytes,
        "views of the small tensors (Python)": args.small * args.small_bytes,
    }
    table = [
        {
            "method": k,
            "median_ms": med[k] * 1e3,
            "min_ms": min(rows[k]) * 1e3,
            "gb_per_s": size[k] / med[k] / 1e9,
            "temp_bytes": temp[k],
        }
        for k in methods
    ]
    for k, times in kernel.items():
        m = statistics.median(times)
        table.append({
            "method": f"{k}: kernel only",
            "median_ms": m * 1e3,
            "min_ms": min(times) * 1e3,
            "gb_per_s": size[k] / m / 1e9,
            "temp_bytes": 0,
        })
    bw = {r["method"]: r["gb_per_s"] for r in table}
    info = native.gpu_digest_info(dev)
    tuning = os.environ.get("GRAPHCHECK_DIGEST_TUNING", "default")
    checks = {}
    if args.check:
        checks["gc128 1 GiB == CPU twin of a host copy"] = gt.digest(x) == gt.digest(x.cpu())
        checks["gc128 small == CPU twin of host copies"] = gt.digest_all(small) == gt.digest_all(
            [t.cpu() for t in small]
        )
    targets = {
        "gc128 >= 90% of int64 sum bandwidth": (bw["gc128"] / bw["int64 sum"], 0.90),
        "gc128 temporary torch memory == 0": (temp["gc128"], 0),
    }
    if "torch.hash_tensor" in bw:
        targets["gc128 >= 25x torch.hash_tensor"] = (bw["gc128"] / bw["torch.hash_tensor"], 25.0)
    targets["small-tensor kernel >= 50% of one tensor's"] = (
        bw["gc128, small tensors: kernel only"] / bw["gc128, one tensor of their bytes: kernel only"],
        0.5,
    )
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "gib": args.gib,
        "reps": args.reps,
        "small": {"count": args.small, "bytes": args.small_bytes},
        "nvrtc": {"path": info["nvrtc_path"], "version": info["nvrtc_version"]},
        "gc128_scratch_bytes": info["scratch_bytes"],
        "gc128_tuning": tuning,
        "hash_tensor_note": hash_note,
        "rows": table,
        "targets": {k: {"value": v, "target": t} for k, (v, t) in targets.items()},
        "checks": checks,
    }


def met(name: str, value, target) -> bool:
    return value == target if name.endswith("== 0") else value >= target


def render(result: dict) -> str:
    lines = [
        f"{result['device']}, torch {result['torch']}, {result['gib']} GiB bf16, "
        f"{result['small']['count']} x {result['small']['bytes']} B small tensors, "
        f"median of {result['reps']} alternating rounds",
        f"NVRTC {result['nvrtc']['version']} ({result['nvrtc']['path']}); gc128 device scratch "
        f"{result['gc128_scratch_bytes']} B; tuning {result['gc128_tuning']}",
        "",
        f"{'method':<48} {'median ms':>10} {'min ms':>9} {'GB/s':>8} {'temp MiB':>9}",
        f"{'-' * 48} {'-' * 10} {'-' * 9} {'-' * 8} {'-' * 9}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['method']:<48} {r['median_ms']:>10.3f} {r['min_ms']:>9.3f} "
            f"{r['gb_per_s']:>8.0f} {r['temp_bytes'] / (1 << 20):>9.1f}"
        )
    if result["hash_tensor_note"]:
        lines.append(f"torch.hash_tensor: {result['hash_tensor_note']}")
    lines.append("")
    for name, t in result["targets"].items():
        ok = met(name, t["value"], t["target"])
        lines.append(f"target {name:<44} {'met' if ok else 'MISSED':<7} ({t['value']:.3g})")
    for name, ok in result["checks"].items():
        lines.append(f"check  {name:<44} {'ok' if ok else 'FAILED'}")
    return "\n".join(lines)


def sweep(args) -> int:
    """One run per tuning, each in its own process; their gc128 rows side by side."""
    results = []
    for spec in [t.strip() for t in args.sweep.split(";") if t.strip()]:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            cmd = [
                sys.executable, __file__, "--gib", str(args.gib), "--reps", str(args.reps),
                "--small", str(args.small), "--small-bytes", str(args.small_bytes),
                "--no-sum64", "--json", out,
            ]
            env = {**os.environ, "GRAPHCHECK_DIGEST_TUNING": spec}
            print(f"== tuning {spec}", file=sys.stderr)
            r = subprocess.run(cmd, env=env, stdout=sys.stderr)
            if r.returncode != 0:
                print(f"tuning {spec}: the run failed ({r.returncode})", file=sys.stderr)
                return 1
            with open(out) as f:
                results.append((spec, json.load(f)))
    names = [r["method"] for r in results[0][1]["rows"] if r["method"].startswith(("gc128", "int64"))]
    print(f"{'method':<48} " + " ".join(f"{spec:>22}" for spec, _ in results))
    for name in names:
        cells = []
        for _, res in results:
            row = next(r for r in res["rows"] if r["method"] == name)
            cells.append(f"{row['median_ms']:>9.3f} ms {row['gb_per_s']:>6.0f} GB/s")
        print(f"{name:<48} " + " ".join(f"{c:>22}" for c in cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({spec: res for spec, res in results}, f, indent=1)
            f.write("\n")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--small", type=int, default=100_000)
    p.add_argument("--small-bytes", type=int, default=4096)
    p.add_argument("--no-sum64", action="store_true", help="leave out the old sum64 row")
    p.add_argument("--check", action="store_true", help="compare with the CPU twin")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--strict", action="store_true", help="exit 1 where a target is missed")
    p.add_argument("--sweep", help="tunings to compare, ';'-separated (see above)")
    args = p.parse_args()
    if args.reps < 5:
        p.error("--reps: at least 5 (medians of at least 5 rounds)")
    if args.sweep:
        return sweep(args)
    result = run(args)
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    failed = not all(result["checks"].values())
    missed = not all(met(k, t["value"], t["target"]) for k, t in result["targets"].items())
    return 1 if failed or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
