"""Content digests: graphcheck's gc128 kernel against a read at memory bandwidth (an int64
sum) and torch.hash_tensor on the GPU, and what digesting many small tensors costs on the
host, side by side in one process.

    python benches/digest_bench.py [--gib 1] [--reps 7] [--small 100000] [--json out.json]
    python benches/digest_bench.py --device cpu [--small 100000] [--small-bytes 16]

Rounds alternate the methods, so that each sees the same clocks and caches; every figure is
the median over ``--reps`` rounds (after one warm-up round that compiles and loads). Time
is wall time around the call (on CUDA with the device synchronized before and after: what
a caller waits for, gc128's host-side packing, copies and launch included), and the
bandwidth is the tensors' bytes over it. Temporary memory is
``torch.cuda.max_memory_allocated()`` during the call minus what was allocated before it;
gc128's own device scratch (accumulators and the packed list of views, made through the
driver, not torch) is reported apart.

Rows over one bf16 tensor of ``--gib`` GiB (CUDA only):

- ``int64 sum``: ``x.view(torch.int64).sum()``, the anchor: one read at memory bandwidth;
- ``torch.hash_tensor``: where this torch has it;
- ``gc128``: ``graphcheck.torch.digest(x)``;
- ``sum64 (before)``: ``graphcheck.torch.digest(x, "sum64")``, what graphcheck did on the GPU
  before gc128 (several torch operations over an int64 copy).

Rows over ``--small`` tensors of ``--small-bytes`` each (separate allocations), on the
device: ``gc128, small tensors`` is ``digest_all`` of all of them; ``main's Python path``
is what ``digest_all`` did before the views were read natively (main at 0fa2fb0: a check,
a device key and an ``(address, sizes, strides, element size)`` tuple per tensor in Python,
grouped by device, then the native call on the tuples), rebuilt here from the same
functions; ``native call`` is the digest call alone on views read beforehand (on tuples:
the same call on main's tuples); ``views ... (native read)`` and ``(Python)`` are the two
ways of reading the views alone; ``registry metadata`` digests from a registry walk's
metadata tuples as ``Registry.tensor_specs`` does (native, and main's keys and tuples), and
``tensor_specs`` rows are the whole call with and without digests; ``one tensor of their
bytes`` is gc128 of one tensor as large as all of them (the cost of the bytes alone). Rows
ending in ``kernel only`` are the kernel's own time, from events the native side records
on the stream right before and after its launch.

Targets (issue 14, CUDA): gc128 at least 90 % of the int64 sum's bandwidth, at least 25 times
torch.hash_tensor's, no temporary memory; and (ours, for "100,000 small tensors as cheaply
as one large one") the kernel over the small tensors at least half as fast per byte as over
one tensor of their bytes. ``--check`` also compares the GPU digests with the CPU twin's of
host copies; the small-tensor paths are always compared with each other (they must give the
same digests). Exit code 1 where a check fails; ``--strict`` also where a target is missed.

Under a graphcheck built before the native read (no ``_native.tensor_views``), the rows
that need it are left out and the others measure that build: run it with such a build's
package first on ``PYTHONPATH`` for a before/after across builds.

``--sweep "unroll=4;unroll=8;unroll=8,min_blocks=3"`` runs the benchmark once per kernel
tuning (``GRAPHCHECK_DIGEST_TUNING``; a process each, as the kernel is compiled once per
process) and prints their gc128 rows side by side; the digests do not depend on the tuning.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import graphcheck._native as native
import graphcheck._digest as digests
import graphcheck._tensors as tensors_meta
import graphcheck.torch as gt

#: Whether this build reads views natively (``_native.tensor_views``, ``TensorViews``).
NATIVE_READ = hasattr(native, "tensor_views")


def measure(fn, cuda: bool):
    """(seconds, bytes of torch memory allocated beyond what was there before) of one call."""
    gc.collect()
    if not cuda:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t, 0
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


# -- main's path (0fa2fb0), rebuilt from the functions it called ------------------------


def device_key_as_main(t):
    """main's `_registry._device_key`."""
    d = t.get_device()
    if d < 0:
        return None if t.is_cpu else "copy"
    return d if t.is_cuda else "copy"


def meta_device_key_as_main(name: str):
    """main's `_registry._meta_device_key` (without its cache)."""
    if name == "cpu":
        return None
    return int(name[5:]) if name.startswith("cuda:") and name[5:].isdigit() else "copy"


def grouped(keys: list) -> dict:
    """main's grouping in `_registry._gc128`: key -> positions."""
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def by_group(groups: dict, views_of, digest, n: int) -> list:
    out: list = [None] * n
    for key, where in groups.items():
        for i, v in zip(where, digest(key, views_of(where))):
            out[i] = v
    return out


def digest_all_as_main(tensors: list, digest) -> list:
    """main's `digest_all(tensors)` for gc128: `digest(key, tuples)` per device."""
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        tensors_meta.view_arg(f"tensors[{i}]", t, torch)
    groups = grouped([device_key_as_main(t) for t in tensors])
    return by_group(groups, lambda w: [digests._view(tensors[i]) for i in w], digest, len(tensors))


def metas_as_main(metas: list, digest) -> list:
    """main's digests from a registry's metadata (`_gc128(keys, views, ...)`)."""
    groups = grouped([meta_device_key_as_main(m[8]) for m in metas])
    views = [(m[0] + m[2], m[4], m[5], m[7]) for m in metas]
    return by_group(groups, lambda w: [views[i] for i in w], digest, len(metas))


# -- the rows -----------------------------------------------------------------------------


def big_methods(args, methods: dict):
    """The rows over one large tensor (CUDA); returns it and why torch.hash_tensor cannot
    run (``None`` where it can)."""
    nbytes = int(args.gib * (1 << 30))
    x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    methods["int64 sum"] = (lambda: x.view(torch.int64).sum().item(), nbytes)
    methods["gc128"] = (lambda: gt.digest(x), nbytes)
    hash_fn, note = hash_tensor_fn(x)
    if hash_fn is not None:
        methods["torch.hash_tensor"] = (hash_fn, nbytes)
    if not args.no_sum64:
        methods["sum64 (before)"] = (lambda: gt.digest(x, "sum64"), nbytes)
    return x, note


def small_methods(args, methods: dict, device: str):
    """The rows over many small tensors on `device`; returns the tensors and the
    small-tensor paths' digests to compare."""
    cuda = device == "cuda"
    small = [
        torch.empty(args.small_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
        for _ in range(args.small)
    ]
    total = args.small * args.small_bytes
    same = torch.randn(total // 2, dtype=torch.bfloat16, device=device)
    model = torch.nn.Module()
    for i, t in enumerate(small):
        model.register_buffer(f"t{i}", t)
    reg = gt.walk(model)
    metas = [r.meta for r in reg.tensors]
    tuples = [digests._view(t) for t in small]
    if cuda:
        dev = torch.cuda.current_device()
        stream = torch.cuda.current_stream().cuda_stream
        nvrtc = digests.nvrtc_path()

        def digest(key, views):
            return native.digest_cuda(key, torch.cuda.current_stream(key).cuda_stream, views, nvrtc)

        def call(views):
            return native.digest_cuda(dev, stream, views, nvrtc)
    else:

        def digest(key, views):
            assert key is None, key
            return native.digest_host(views)

        call = native.digest_host

    # The paths that digest every small tensor (their digests are compared), in the order
    # of the table.
    paths = {
        "gc128, small tensors": lambda: gt.digest_all(small),
        "gc128, small tensors, main's Python path": lambda: digest_all_as_main(small, digest),
    }
    if NATIVE_READ:
        views = native.tensor_views(small, torch)
        paths["gc128, small tensors, native call"] = lambda: call(views)
    paths["gc128, small tensors, native call on tuples"] = lambda: call(tuples)
    for name, fn in paths.items():
        methods[name] = (fn, total)
    if NATIVE_READ:
        methods["views of the small tensors (native read)"] = (
            lambda: native.tensor_views(small, torch),
            total,
        )
    methods["views of the small tensors (Python)"] = (
        lambda: [digests._view(t) for t in small],
        total,
    )
    if NATIVE_READ:
        paths["gc128, registry metadata"] = lambda: digests.gc128(
            native.TensorViews.from_metas(metas), small
        )
        methods["gc128, registry metadata"] = (paths["gc128, registry metadata"], total)
    paths["gc128, registry metadata, main's path"] = lambda: metas_as_main(metas, digest)
    methods["gc128, registry metadata, main's path"] = (
        paths["gc128, registry metadata, main's path"],
        total,
    )
    methods["registry tensor_specs, gc128"] = (lambda: reg.tensor_specs("gc128"), total)
    methods["registry tensor_specs, no digests"] = (lambda: reg.tensor_specs(None), total)
    methods["gc128, one tensor of their bytes"] = (lambda: gt.digest(same), total)
    results = {name: fn() for name, fn in paths.items()}
    return small, results


def run(args) -> dict:
    cuda = args.device == "cuda"
    methods: dict = {}  # name -> (fn, bytes it reads)
    x, hash_note = big_methods(args, methods) if cuda else (None, None)
    small, paths = small_methods(args, methods, args.device)
    # The kernel's own time (events around the launch), for the gc128 rows.
    kernel_rows = (
        ("gc128", "gc128, small tensors", "gc128, one tensor of their bytes") if cuda else ()
    )
    dev = torch.cuda.current_device() if cuda else None
    rows = {name: [] for name in methods}
    kernel = {name: [] for name in kernel_rows}
    temp = {name: 0 for name in methods}
    for rnd in range(args.reps + 1):
        for name, (fn, _) in methods.items():
            t, extra = measure(fn, cuda)
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
    table = []
    small_bytes = args.small * args.small_bytes
    for k, (_, size) in methods.items():
        m = statistics.median(rows[k])
        table.append({
            "method": k,
            "median_ms": m * 1e3,
            "min_ms": min(rows[k]) * 1e3,
            "gb_per_s": size / m / 1e9,
            "per_tensor_us": m / args.small * 1e6 if size == small_bytes else None,
            "temp_bytes": temp[k],
        })
    for k, times in kernel.items():
        m = statistics.median(times)
        table.append({
            "method": f"{k}: kernel only",
            "median_ms": m * 1e3,
            "min_ms": min(times) * 1e3,
            "gb_per_s": methods[k][1] / m / 1e9,
            "per_tensor_us": None,
            "temp_bytes": 0,
        })
    want = paths["gc128, small tensors"]
    checks = {
        f"{name} == digest_all": got == want
        for name, got in paths.items()
        if name != "gc128, small tensors"
    }
    result = {
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "native_read": NATIVE_READ,
        "gib": args.gib if cuda else 0,
        "reps": args.reps,
        "small": {"count": args.small, "bytes": args.small_bytes},
        "hash_tensor_note": hash_note,
        "rows": table,
        "targets": {},
        "checks": checks,
    }
    if cuda:
        add_cuda_results(args, result, table, temp, x, small)
    return result


def add_cuda_results(args, result, table, temp, x, small) -> None:
    """Targets, CUDA checks and what the GPU digest loaded."""
    dev = torch.cuda.current_device()
    bw = {r["method"]: r["gb_per_s"] for r in table}
    info = native.gpu_digest_info(dev)
    if args.check:
        result["checks"]["gc128 1 GiB == CPU twin of a host copy"] = gt.digest(x) == gt.digest(
            x.cpu()
        )
        result["checks"]["gc128 small == CPU twin of host copies"] = gt.digest_all(
            small
        ) == gt.digest_all([t.cpu() for t in small])
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
    result["targets"] = {k: {"value": v, "target": t} for k, (v, t) in targets.items()}
    result["nvrtc"] = {"path": info["nvrtc_path"], "version": info["nvrtc_version"]}
    result["gc128_scratch_bytes"] = info["scratch_bytes"]
    result["gc128_tuning"] = os.environ.get("GRAPHCHECK_DIGEST_TUNING", "default")


def met(name: str, value, target) -> bool:
    return value == target if name.endswith("== 0") else value >= target


def render(result: dict) -> str:
    big = f"{result['gib']} GiB bf16, " if result["gib"] else ""
    lines = [
        f"{result['device']}, torch {result['torch']}, Python {result['python']}, {big}"
        f"{result['small']['count']} x {result['small']['bytes']} B small tensors, "
        f"median of {result['reps']} alternating rounds"
        + ("" if result["native_read"] else "; a build without the native read"),
    ]
    if "nvrtc" in result:
        lines.append(
            f"NVRTC {result['nvrtc']['version']} ({result['nvrtc']['path']}); gc128 device "
            f"scratch {result['gc128_scratch_bytes']} B; tuning {result['gc128_tuning']}"
        )
    lines += [
        "",
        f"{'method':<48} {'median ms':>10} {'min ms':>9} {'us/tensor':>9} {'GB/s':>8} "
        f"{'temp MiB':>9}",
        f"{'-' * 48} {'-' * 10} {'-' * 9} {'-' * 9} {'-' * 8} {'-' * 9}",
    ]
    for r in result["rows"]:
        per = "" if r["per_tensor_us"] is None else f"{r['per_tensor_us']:.3f}"
        lines.append(
            f"{r['method']:<48} {r['median_ms']:>10.3f} {r['min_ms']:>9.3f} {per:>9} "
            f"{r['gb_per_s']:>8.2f} {r['temp_bytes'] / (1 << 20):>9.1f}"
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
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: only the small-tensor rows, on CPU tensors (the host side)")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--small", type=int, default=100_000)
    p.add_argument("--small-bytes", type=int, default=None,
                   help="bytes per small tensor (default 4096 on cuda, 16 on cpu)")
    p.add_argument("--no-sum64", action="store_true", help="leave out the old sum64 row")
    p.add_argument("--check", action="store_true", help="compare with the CPU twin")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--strict", action="store_true", help="exit 1 where a target is missed")
    p.add_argument("--sweep", help="tunings to compare, ';'-separated (see above)")
    args = p.parse_args()
    if args.small_bytes is None:
        args.small_bytes = 4096 if args.device == "cuda" else 16
    if args.reps < 5:
        p.error("--reps: at least 5 (medians of at least 5 rounds)")
    if args.small_bytes < 2 or args.small_bytes % 2:
        p.error("--small-bytes: an even number of bytes (the tensors are bf16)")
    if args.sweep:
        if args.device != "cuda":
            p.error("--sweep: kernel tunings are for --device cuda")
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
