"""Retarget against recapture (GPU; issue 31's cost): the anchor model of DESIGN.md (64
bf16 layers, 8 batch sizes into one pool, benches/anchor_model.py) recorded once; then, per
run, one tensor per layer rebound the way process_weights_after_loading's
``replace_parameter`` does (each RMSNorm weight replaced by a new Parameter with the same
values, at a new address), and, side by side in one process:

  retarget   all-in: the recorder's manifest, a live snapshot numbered in the recorder's
             session (snapshot(..., recorder=)), then graphcheck.torch.retarget(rec, live,
             graphs=...): the plan (verify included), every graph patched through the
             driver all or nothing, each walked again into the recorder and the roots
             walked; each phase is timed too (--profile: cProfile of one more one-call retarget)
  plan only  retarget(..., apply=False) given the same snapshot: nothing patched
  recapture  the same 8 graphs captured again with plain torch (anchor_model.capture_plain):
             what an engine pays instead

It also checks each retargeted graph's replay against eager (bitwise, and the largest
difference), that the recorder's manifest after the last run verifies with no live
finding, and times a replay of the smallest and largest graph before and after (CUDA
events, median of 50 replays).

Run on a GPU machine with graphcheck installed:
    python3 benches/retarget_bench.py --runs 5 [--json OUT]
"""
import argparse
import json
import statistics
import sys
import time


def replay_ms(torch, g, n=50):
    """Median milliseconds of one replay of ``g`` over ``n`` (CUDA events)."""
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true", help="cProfile one extra one-call retarget (stderr)")
    args = ap.parse_args()

    import anchor_model  # benches/, first on sys.path when run as a script
    import torch

    import graphcheck
    import graphcheck.torch as gt

    model, xs = anchor_model.warmed()
    bss = anchor_model.BATCH_SIZES
    pool = torch.cuda.graph_pool_handle()
    rec = gt.Recorder(model)
    gs, outs = {}, {}
    for b in bss:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), gt.graph(g, recorder=rec, name=f"bs{b}", pool=pool, inputs={"x": xs[b]}):
            outs[b] = model(xs[b])
        gs[f"bs{b}"] = g
    for g in gs.values():  # instantiated, as an engine's are after its warm-up
        g.replay()
    torch.cuda.synchronize()
    small, large = gs[f"bs{bss[0]}"], gs[f"bs{bss[-1]}"]
    before = {"small": replay_ms(torch, small), "large": replay_ms(torch, large)}

    def rebind():
        with torch.no_grad():
            for block in model:
                block.norm.weight = torch.nn.Parameter(block.norm.weight.detach().clone())
        torch.cuda.synchronize()

    def replays_against_eager():
        """Whether every graph's replay equals eager bitwise, and the largest difference."""
        same, diff = True, 0.0
        for b in bss:
            gs[f"bs{b}"].replay()
            torch.cuda.synchronize()
            with torch.no_grad():
                eager = model(xs[b])
            same &= bool(torch.equal(outs[b], eager))
            diff = max(diff, (outs[b].float() - eager.float()).abs().max().item())
        return same, diff

    retarget_s, plan_s, recapture_s, edits = [], [], [], []
    manifest_s, snapshot_s, apply_s, onecall_s = [], [], [], []
    worst, bitwise = 0.0, True
    for i in range(args.runs):
        rebind()
        # Phases: the recorder's manifest, the live snapshot (numbered in its session),
        # the plan alone, then the retarget given that snapshot (plan again, patch, walk
        # the patched graphs again). All-in = manifest + snapshot + retarget.
        t0 = time.perf_counter()
        m = rec.manifest()
        t1 = time.perf_counter()
        live = gt.snapshot(None, m, roots=rec.roots(), recorder=rec, contents="updated")
        t2 = time.perf_counter()
        planned = gt.retarget(rec, live, graphs=gs, apply=False)
        t3 = time.perf_counter()
        res = gt.retarget(rec, live, graphs=gs)
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        manifest_s.append(t1 - t0)
        snapshot_s.append(t2 - t1)
        plan_s.append(t3 - t2)
        apply_s.append(t4 - t3)
        retarget_s.append((t1 - t0) + (t2 - t1) + (t4 - t3))
        if not res.ok or len(res.retargeted) != len(bss):
            print(f"run {i + 1}: not every graph was retargeted: {res.refused}", file=sys.stderr)
            return 1
        edits.append(res.plan["edits"])
        assert planned.plan["edits"] == res.plan["edits"]
        same, diff = replays_against_eager()
        bitwise, worst = bitwise and same, max(worst, diff)
        # The call a user makes: retarget(rec, graphs=...), which takes the manifest and
        # the snapshot itself (as the core's text, never a dict), after a rebind of its own.
        rebind()
        t0 = time.perf_counter()
        one = gt.retarget(rec, graphs=gs)
        torch.cuda.synchronize()
        onecall_s.append(time.perf_counter() - t0)
        if not one.ok or len(one.retargeted) != len(bss) or one.plan["edits"] != edits[-1]:
            print(f"run {i + 1}: the one-call retarget did not patch every graph: {one.refused}", file=sys.stderr)
            return 1
        same, diff = replays_against_eager()
        bitwise, worst = bitwise and same, max(worst, diff)
        if args.profile and i == 0:
            # The one call, profiled after the replays above instantiated every graph.
            import cProfile
            import pstats

            rebind()
            prof = cProfile.Profile()
            prof.enable()
            again = gt.retarget(rec, graphs=gs)
            torch.cuda.synchronize()
            prof.disable()
            for order in ("cumulative", "tottime"):
                pstats.Stats(prof, stream=sys.stderr).sort_stats(order).print_stats(30)
            assert again.ok, again.refused
            same, diff = replays_against_eager()
            bitwise, worst = bitwise and same, max(worst, diff)
        t, fresh = anchor_model.capture_plain(model, xs)
        recapture_s.append(t)
        del fresh
        print(f"[retarget] run {i + 1}/{args.runs}: retarget {retarget_s[-1] * 1e3:.1f} ms "
              f"(manifest {manifest_s[-1] * 1e3:.1f}, snapshot {snapshot_s[-1] * 1e3:.1f}, "
              f"apply {apply_s[-1] * 1e3:.1f}; plan only {plan_s[-1] * 1e3:.1f} ms), "
              f"one call {onecall_s[-1] * 1e3:.1f} ms, recapture {t * 1e3:.1f} ms, {edits[-1]} edits",
              file=sys.stderr)
    after = {"small": replay_ms(torch, small), "large": replay_ms(torch, large)}
    now = rec.manifest()
    live = gt.snapshot(None, now, roots=rec.roots(), recorder=rec)
    left = [f for f in graphcheck.verify(now, live).findings if f.kind in ("drifted", "freed", "reused", "vanished", "reshaped", "stale")]

    r, p, c = (statistics.median(v) for v in (retarget_s, plan_s, recapture_s))
    o = statistics.median(onecall_s)
    phases = {k: statistics.median(v) * 1e3 for k, v in
              (("manifest", manifest_s), ("snapshot", snapshot_s), ("retarget_given_snapshot", apply_s))}
    rows = {
        "graphs": len(bss), "layers": len(model), "edits_per_run": statistics.median(edits),
        "retarget_ms": r * 1e3, "plan_only_ms": p * 1e3, "recapture_ms": c * 1e3,
        "recapture_over_retarget": c / r, "retarget_one_call_ms": o * 1e3,
        "recapture_over_one_call": c / o, "one_call_runs_ms": [x * 1e3 for x in onecall_s], "replay_bitwise_equal_to_eager": bitwise,
        "replay_max_abs_diff": worst, "replay_ms_before": before, "replay_ms_after": after,
        "live_findings_after": len(left), "runs": args.runs, "phases_ms": phases,
        "retarget_runs_ms": [x * 1e3 for x in retarget_s], "recapture_runs_ms": [x * 1e3 for x in recapture_s],
    }
    print(f"anchor model: {len(model)} layers, {len(bss)} graphs; one tensor per layer rebound per run; "
          f"{rows['edits_per_run']:.0f} word edits per retarget")
    print(f"retarget (all-in)  {r * 1e3:8.1f} ms (median of {args.runs})")
    print(f"  plan only        {p * 1e3:8.1f} ms (given the snapshot)")
    for k, v in phases.items():
        print(f"  {k:<17}{v:8.1f} ms")
    print(f"retarget (one call){o * 1e3:8.1f} ms  retarget(rec, graphs=...), manifest and snapshot kept as text")
    print(f"recapture (plain)  {c * 1e3:8.1f} ms")
    print(f"recapture / retarget: {c / r:.2f}x all-in by phases, {c / o:.2f}x one call (target: at least 100x)")
    print(f"replays after retarget: bitwise equal to eager: {bitwise}; largest difference {worst}")
    print(f"replay ms, bs{bss[0]}: {before['small']:.3f} before, {after['small']:.3f} after; "
          f"bs{bss[-1]}: {before['large']:.3f} before, {after['large']:.3f} after")
    print(f"live findings of the recorder's manifest after the last retarget: {len(left)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
