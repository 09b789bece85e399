"""Retarget against recapture at engine scale (GPU; issue 31's cost, on issue 32's engine):
the 32-layer decoder of ``engine_model.py`` captured the way vLLM's piecewise mode does (51
sizes × 33 pieces into one pool, plus 35 full graphs: 1,718 graphs), then every layer's
derived ``qkv_scale`` rebuilt at a new address (the graphs that read one: 1,667 of them).
Per run, in one process, alternating:

  recapture  every graph captured again with plain torch (no graphcheck): what an engine
             pays instead of a retarget, the capture alone (no warm-up, no compile)
  retarget   graphcheck.torch.retarget(ins.recorder, graphs=...) in one call, after the
             rebuild, on graphs captured under instrument(keep_templates=True): the
             recorder's manifest, a live snapshot, the plan (verify included), every graph
             patched through the driver all or nothing, each walked again

It checks that every graph that reads a rebuilt tensor was retargeted and none refused,
that the recorder's manifest verifies with no live finding against a fresh snapshot, and
that each full graph's replay equals eager bitwise after the retarget. Medians of
``--runs``; the instrumented capture time is printed too (it is issue 32's, not this one's).

    python3 benches/engine_retarget.py --runs 3 [--layers 32] [--json OUT]

Without CUDA (``--device cpu``, the dry run CI runs small) the graphs are engine_model.py's
CPU stand-ins, patched on the core's host patcher (``install_cpu_patcher``): the plan, the
patch of every graph in one call, the recorder's update and the verify after are real;
nothing replays, so the bitwise check says it was not made, and the times are no
figures.

    python3 benches/engine_retarget.py --device cpu --layers 3 --sizes 1,2,4,8 --full 2 --runs 2

Each retarget is split into its stages as well (stage_timer.py, inclusive wall time of each
wrapped call: the recorder's manifest, the live snapshot, the plan, the driver's patching,
the walks of the patched graphs, the recorder's update), medians over the runs.
"""
import argparse
import gc
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--sizes", help="capture sizes, comma-separated (default: vLLM's 51)")
    ap.add_argument("--full", type=int, default=None, help="full graphs (default 35)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--json")
    args = ap.parse_args()

    import engine_model  # benches/, first on sys.path when run as a script
    import stage_timer
    import torch

    import graphcheck
    import graphcheck.torch as gt
    from graphcheck import _native

    cuda = args.device == "cuda"
    eng = engine_model.engine_from_args(args)
    if not cuda:
        engine_model.install_cpu_patcher()

    from graphcheck import _retarget
    from graphcheck._recorder import Recorder

    stages = stage_timer.Stages()
    for owner, attr, label in (
        (Recorder, "manifest_json", "recorder manifest"),
        (_retarget, "_snapshot_text", "live snapshot"),
        (_native, "retarget_plan", "plan (verify + plan)"),
        (_retarget, "_handles", "graph handles (torch)"),
        (_native, "apply_plan_cuda", "patch (driver)"),
        (_retarget, "walk_graph", "walk patched graphs"),
        (Recorder, "_replace_walks", "recorder: replace walks"),
        (Recorder, "_take_walk", "recorder: take the walk"),
    ):
        stages.wrap(owner, attr, label)
    split_runs: list = []

    recapture_s, retarget_s, capture_s = [], [], []
    counts = {}
    for run in range(args.runs):
        # Recapture: plain torch, every graph.
        gc.collect()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        plain = eng.capture_all()
        recapture_s.append(time.perf_counter() - t0)
        del plain
        gc.collect()

        # Retarget: graphs captured keeping their templates, instantiated by a replay, then
        # the rebuild, then one call.
        ins = gt.instrument(model=eng.model, discover=False, directory=False, keep_templates=True)
        try:
            ins.register_model(eng.runner, "runner")
            t0 = time.perf_counter()
            graphs = eng.capture_all()
            capture_s.append(time.perf_counter() - t0)
            engine_model.replay_all(graphs)
            torch.cuda.synchronize()
            eng.rebuild_derived()
            torch.cuda.synchronize()
            # Each graph by the name the instrumentation recorded it under.
            by_name = {g._graphcheck_state.names[id(ins)]: g for _, g, _ in graphs}
            assert len(by_name) == len(graphs)
            gc.collect()
            stages.take()
            t0 = time.perf_counter()
            res = gt.retarget(ins.recorder, graphs=by_name)
            torch.cuda.synchronize()
            retarget_s.append(time.perf_counter() - t0)
            split_runs.append(stages.take())
            if res.refused:
                first = next(iter(res.refused.items()))
                print(f"run {run + 1}: {len(res.refused)} graphs refused, e.g. {first}", file=sys.stderr)
                return 1
            counts = {"graphs": len(graphs), "retargeted": len(res.retargeted),
                      "edits": res.plan["edits"]}
            # Every graph that reads a qkv_scale: each piece but the last of each size, and
            # each full graph.
            readers = len(eng.sizes) * args.layers + len(eng.full_sizes)
            if len(res.retargeted) != readers:
                print(f"run {run + 1}: {len(res.retargeted)} graphs retargeted, not the {readers} "
                      "that read a rebuilt qkv_scale", file=sys.stderr)
                return 1
            # Every full graph's replay against eager, bitwise (the CPU stand-ins replay
            # nothing: not checked there).
            same = True if cuda else None
            for name, g, _ in graphs:
                if not cuda or not name.startswith("full_bs"):
                    continue
                b = int(name[len("full_bs"):])
                g.replay()
                torch.cuda.synchronize()
                replayed = eng.runner.out[:b].clone()
                with torch.no_grad():
                    eager = eng.forward(b).clone()
                same &= bool(torch.equal(replayed, eager))
            counts["full_graphs_bitwise_equal_to_eager"] = same
            now = ins.recorder.manifest()
            live = gt.snapshot(None, now, roots=ins.recorder.roots(), recorder=ins.recorder)
            left = [f for f in graphcheck.verify(now, live).findings if f.kind in _native.LIVE_KINDS]
            counts["live_findings_after"] = len(left)
            print(f"[engine retarget] run {run + 1}/{args.runs}: recapture {recapture_s[-1] * 1e3:.0f} ms, "
                  f"retarget {retarget_s[-1] * 1e3:.1f} ms ({counts['retargeted']} graphs, "
                  f"{counts['edits']} edits), instrumented capture {capture_s[-1] * 1e3:.0f} ms; "
                  f"full graphs bitwise: {same}; live findings after: {len(left)}", file=sys.stderr)
            if same is False or left:
                return 1
        finally:
            gt.uninstrument(ins)
        del graphs, by_name, res
        gc.collect()

    r, c = statistics.median(retarget_s), statistics.median(recapture_s)
    split = {
        label: {"calls": split_runs[-1][label]["calls"],
                "ms": statistics.median(run[label]["ms"] for run in split_runs if label in run)}
        for label in split_runs[-1]
    }
    rows = {**counts, "layers": args.layers, "runs": args.runs,
            "device": torch.cuda.get_device_name() if cuda else "cpu (stand-in graphs)",
            "retarget_ms": r * 1e3, "recapture_ms": c * 1e3, "recapture_over_retarget": c / r,
            "retarget_runs_ms": [x * 1e3 for x in retarget_s],
            "recapture_runs_ms": [x * 1e3 for x in recapture_s],
            "instrumented_capture_runs_ms": [x * 1e3 for x in capture_s],
            "retarget_stages": split}
    print(f"engine: {counts['graphs']} graphs, {args.layers} layers; every layer's qkv_scale rebuilt: "
          f"{counts['retargeted']} graphs retargeted, {counts['edits']} word edits")
    print(f"retarget (one call) {r * 1e3:9.1f} ms (median of {args.runs})")
    print(f"recapture (plain)   {c * 1e3:9.1f} ms")
    print(f"recapture / retarget: {c / r:.1f}x")
    if not cuda:
        print("(CPU stand-in graphs, patched on the host: the times are no figures)")
    print("retarget by stage (inclusive, medians):")
    for label, v in split.items():
        print(f"  {label:28s} {v['ms']:9.1f} ms  ({v['calls']} calls)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
