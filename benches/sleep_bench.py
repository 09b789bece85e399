"""Sleep and wake time per GiB: graphcheck's sleep allocator against plain torch doing the
same backup (copy to pinned host memory and back), side by side in one process.

    python benches/sleep_bench.py [--gib 1,4,16] [--reps 5] [--out results.json]

For each size, weights are 256 MiB tensors: under ``sleep_pool("weights")`` for the
allocator, in torch's default pool for the baseline. Each repetition runs, in turn:

- baseline: every tensor copied into a pinned host buffer (``non_blocking``), synchronize;
  then copied back, synchronize. The device memory is never released, so this is a lower
  bound for any sleep that keeps a host copy;
- level 1: ``sleep(1)`` (host copy, unmap, release) then ``wake()`` (map, copy back);
- level 2: ``sleep(2)`` then ``wake(poison="nan")`` (map, fill) and, for comparison, a
  level 2 with ``wake(poison="none")`` (map only).

Both sides keep their pinned buffers from one repetition to the next (torch's caching host
allocator; the allocator's host cache); the first repetition, which pins them, is reported
apart as ``cold``. The figures are medians of the warm repetitions; the ratio is level 1's
round trip over the baseline's (target: at most 1.2).
"""

import argparse
import json
import statistics
import sys
import time

import torch

import graphcheck.sleep as gs

CHUNK = 256 << 20


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def bench(gib: int, reps: int) -> dict:
    alloc = gs.allocator()
    n = gib * (1 << 30) // CHUNK
    with gs.sleep_pool("weights"):
        ours = [torch.randn(CHUNK // 4, device="cuda") for _ in range(n)]
    base = [torch.randn(CHUNK // 4, device="cuda") for _ in range(n)]
    check = [t[:16].clone() for t in ours], [t[:16].clone() for t in base]
    hosts: list = []

    def base_out():
        if not hosts:
            hosts.extend(torch.empty(CHUNK // 4, pin_memory=True) for _ in range(n))
        for h, t in zip(hosts, base):
            h.copy_(t, non_blocking=True)

    def base_in():
        for h, t in zip(hosts, base):
            t.copy_(h, non_blocking=True)

    rows = {k: [] for k in ("base_out", "base_in", "l1_sleep", "l1_wake", "l2_sleep", "l2_wake_nan", "l2_wake_none")}
    for rep in range(reps + 1):
        rows["base_out"].append(timed(base_out))
        rows["base_in"].append(timed(base_in))
        rows["l1_sleep"].append(timed(lambda: alloc.sleep(1)))
        rows["l1_wake"].append(timed(lambda: alloc.wake()))
        if rep == 0:
            assert all(torch.equal(t[:16], c) for t, c in zip(ours, check[0])), "level 1 lost data"
            assert all(torch.equal(t[:16], c) for t, c in zip(base, check[1])), "baseline lost data"
        rows["l2_sleep"].append(timed(lambda: alloc.sleep(2)))
        rows["l2_wake_nan"].append(timed(lambda: alloc.wake(poison="nan")))
        alloc.sleep(2)
        rows["l2_wake_none"].append(timed(lambda: alloc.wake(poison="none")))
        print(f"  {gib} GiB rep {rep}: " + ", ".join(f"{k} {v[-1] * 1e3:.0f} ms" for k, v in rows.items()), file=sys.stderr)
    warm = {k: statistics.median(v[1:]) for k, v in rows.items()}
    cold = {k: v[0] for k, v in rows.items()}
    base_rt = warm["base_out"] + warm["base_in"]
    l1_rt = warm["l1_sleep"] + warm["l1_wake"]
    out = {
        "gib": gib,
        "reps": reps,
        "warm_s": warm,
        "cold_s": cold,
        "per_gib_ms": {k: v / gib * 1e3 for k, v in warm.items()},
        "baseline_round_trip_s": base_rt,
        "level1_round_trip_s": l1_rt,
        "level1_over_baseline": l1_rt / base_rt,
        "cold_level1_over_baseline": (cold["l1_sleep"] + cold["l1_wake"]) / (cold["base_out"] + cold["base_in"]),
    }
    for held in (ours, base, hosts, *check):
        held.clear()
    alloc.release_pool("weights")
    alloc.release_host_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", default="1,4,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "sizes": [bench(int(g), args.reps) for g in args.gib.split(",")],
    }
    print(f"{'GiB':>4} {'baseline RT':>12} {'level-1 RT':>11} {'ratio':>6} {'cold ratio':>10} "
          f"{'L1 sleep/GiB':>13} {'L1 wake/GiB':>12} {'L2 sleep/GiB':>13} {'L2 wake nan/GiB':>16} {'L2 wake none/GiB':>17}")
    for r in results["sizes"]:
        p = r["per_gib_ms"]
        print(f"{r['gib']:>4} {r['baseline_round_trip_s'] * 1e3:>10.1f}ms {r['level1_round_trip_s'] * 1e3:>9.1f}ms "
              f"{r['level1_over_baseline']:>6.2f} {r['cold_level1_over_baseline']:>10.2f} "
              f"{p['l1_sleep']:>11.1f}ms {p['l1_wake']:>10.1f}ms {p['l2_sleep']:>11.1f}ms "
              f"{p['l2_wake_nan']:>14.1f}ms {p['l2_wake_none']:>15.1f}ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
