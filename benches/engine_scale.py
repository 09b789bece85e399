"""Engine scale: graphcheck at the graph counts engines capture (issue 32). A 32-layer bf16
decoder captured the way vLLM's piecewise mode does (``engine_model.py``: 51 sizes × 33
pieces into one pool, eager attention between them, plus 35 full graphs: 1,718 graphs),
plain and under ``graphcheck.torch.instrument()`` in each mode, alternating in one
process, medians:

  plain    torch.cuda.graph(g, pool=pool) for every graph
  dir      instrument(directory): what GRAPHCHECK_DIR does, flushed (the last manifest on
           disk) before the clock stops
  check    instrument(verify_on_replay="raise"), no directory: the replay check's facts
  all      instrument(directory, verify_on_replay="raise", digests=True), flushed

and, for ``all`` (``check`` where ``all`` is not run):

  cleared      after mark_transition() with nothing moved (a level-1 round trip keeps
               every address), the time until every graph is cleared to replay: the one
               check (live snapshot, verify of all graphs, digests of every tensor they
               read) and each graph's look at its findings, as its replay makes them
  replay       one replay of every graph with nothing pending, and the same right after a
               transition (the difference is what the check adds to the first forward)
  rebuilt      the same after every layer's derived ``qkv_scale`` was rebuilt at a new
               address (each graph that reads one refused, the others cleared)

Per-graph capture cost (graphs 1-100 against the last 100), graphcheck's memory (RSS of
a child process that captures under ``all``, or ``--memory-mode``, against one that
captures plain), and the
manifest's size on disk. ``--keep DIR`` keeps the written run (the manifest and a live
snapshot after the nothing-moved transition) for ``graphcheck verify DIR``.

Without CUDA (``--device cpu``, the dry run CI runs small) the model runs on CPU tensors
and a stand-in for ``torch.cuda.CUDAGraph`` hands graphcheck what each capture read
(``engine_model.CpuGraph``): capture times then say nothing about a GPU, the check's do.

    python3 benches/engine_scale.py --runs 3 [--layers 64] [--json OUT] [--keep DIR]
    python3 benches/engine_scale.py --device cpu --layers 2 --sizes 1,2,4 --full 2 --runs 1
"""
import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("plain", "dir", "check", "all")
#: Memory children that isolate what instrument() does to the driver: ``keep`` captures
#: plainly with keep_graph=True (the templates kept), ``walk`` also walks every template
#: and keeps the walked graphs (no recorder).
BARE = ("keep", "walk")


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--sizes", help="capture sizes, comma-separated (default: vLLM's 51)")
    ap.add_argument("--full", type=int, default=None, help="full graphs (default 35)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--checks", type=int, default=3, help="checks timed per transition kind")
    ap.add_argument("--no-memory", action="store_true", help="skip the two child processes")
    ap.add_argument("--json")
    ap.add_argument("--keep", metavar="DIR")
    ap.add_argument("--cprofile", choices=["cleared", "rebuilt", "capture"],
                    help="print a cProfile (by own time) of the first check of that kind, or of "
                         "the first instrumented capture of everything")
    ap.add_argument("--memory-mode", default="all",
                    help="the instrumented child measured against the plain one (default all; "
                         "comma-separated for several, of dir, check, all, and keep and walk: "
                         "keep_graph=True alone, and with every template walked)")
    ap.add_argument("--split", action="store_true",
                    help="time the stages of each capture (stage_timer.py): per mode, the "
                         "median over runs of each stage's total and calls")
    ap.add_argument("--child", choices=MODES + BARE, help=argparse.SUPPRESS)
    return ap.parse_args()


def engine_of(args):
    import engine_model  # benches/, first on sys.path when run as a script

    return engine_model, engine_model.engine_from_args(args)


def instrumented(gt, eng, mode, directory):
    kwargs = dict(model=eng.model, discover=False)
    if mode == "dir":
        kwargs.update(directory=directory)
    elif mode == "check":
        kwargs.update(directory=False, verify_on_replay="raise")
    elif mode == "all":
        kwargs.update(directory=directory, verify_on_replay="raise", digests=True)
    ins = gt.instrument(**kwargs)
    ins.register_model(eng.runner, "runner")
    return ins


#: The stage timers of ``--split`` (stage_timer.Stages), or None.
STAGES = None


def capture(gt, eng, mode, directory):
    """One capture of every graph in ``mode``: (seconds, per-graph seconds, graphs, ins)."""
    times = []
    gc.collect()
    if STAGES is not None:
        STAGES.take()  # what came before the clock starts (the collection above) is not its
    t0 = time.perf_counter()
    ins = None if mode in ("plain",) + BARE else instrumented(gt, eng, mode, directory)
    graphs = eng.capture_all(times)
    if ins is not None and ins.directory is not None:
        ins.flush()
    return time.perf_counter() - t0, times, graphs, ins


def clear_all(graphs, check_before_replay, ReplayCheckError):
    """What every graph's first replay after a transition runs before its kernels:
    returns (seconds, graphs refused)."""
    refused = 0
    t0 = time.perf_counter()
    for _, g, _ in graphs:
        try:
            check_before_replay(g)
        except ReplayCheckError:
            refused += 1
    return time.perf_counter() - t0, refused


def child(args):
    """A process that captures in one mode and prints its RSS (graphcheck's memory is the
    ``all`` child's minus the ``plain`` child's)."""
    import graphcheck.torch as gt

    import proc_memory

    _, eng = engine_of(args)
    walked: list = []
    if args.child in BARE:
        bare_class(args.child == "walk", walked)
    before = rss_mib()
    split = {"before": proc_memory.sample()}
    d = tempfile.mkdtemp(prefix="gc-scale-mem-")
    _, _, graphs, ins = capture(gt, eng, args.child, d)
    after = rss_mib()
    split["captured"] = proc_memory.sample()
    if ins is not None:
        from graphcheck._instrument.patch import check_before_replay
        from graphcheck.torch import ReplayCheckError

        gt.mark_transition("wake", "preserved")
        clear_all(graphs, check_before_replay, ReplayCheckError)
    checked = rss_mib()
    split["checked"] = proc_memory.sample()
    out = {"graphs": len(graphs), "rss_before": before, "rss_captured": after,
           "rss_checked": checked, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "split": split, "mappings_checked": proc_memory.all_mappings()}
    if walked:
        out["walked_words"] = sum(w.words for w in walked)
        out["walked_nodes"] = sum(len(w) for w in walked)
        walked.clear()
        out["split_walked_released"] = proc_memory.sample()
    if args.child in BARE and args.device == "cuda":
        import ctypes

        cuda = ctypes.CDLL("libcuda.so.1")
        for _, g, _ in graphs:
            cuda.cuGraphDestroy(ctypes.c_void_p(g.raw_cuda_graph()))
        out["split_templates_destroyed"] = proc_memory.sample()
        print(json.dumps(out), flush=True)
        os._exit(0)
    if ins is not None and args.device == "cuda":
        held = [ins]
        del ins
        try:
            out.update(attribute(gt, held, graphs))
        except Exception as e:  # noqa: BLE001 - the figures above still stand
            out["attribution_failed"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)
    if "rss_templates_destroyed" in out:
        os._exit(0)  # torch would destroy the templates again at exit


def bare_class(walk: bool, walked: list) -> None:
    """``torch.cuda.CUDAGraph`` replaced by a subclass that keeps the template
    (keep_graph=True) and instantiates after capture_end, as instrument() does, and with
    ``walk`` walks it there (``graphcheck._native.walk``) into ``walked``."""
    import torch
    from graphcheck import _native

    base = torch.cuda.CUDAGraph

    class Kept(base):
        def __new__(cls, *a, **k):
            return super().__new__(cls, True)

        def __init__(self, *a, **k):
            super().__init__(True)

        def capture_end(self):
            super().capture_end()
            if walk:
                walked.append(_native.walk(self.raw_cuda_graph()))
            self.instantiate()

    torch.cuda.CUDAGraph = torch.cuda.graphs.CUDAGraph = Kept


def attribute(gt, held, graphs):
    """Where an instrumented child's memory is: RSS after graphcheck lets go of everything it
    holds (the instrumentation, its recorder, walked graphs and manifests), then after the
    graph templates that instrument() keeps for the walk and for retarget (torch's
    keep_graph=True; a plain capture drops each at instantiate) are destroyed through the
    driver. Only before the process exits: torch destroys them again at exit."""
    import ctypes

    libc = ctypes.CDLL(None)

    def settled():
        gc.collect()
        libc.malloc_trim(0)
        return rss_mib()

    import proc_memory

    import weakref

    out = {"rss_trimmed": settled(), "split_trimmed": proc_memory.sample()}
    refs = [weakref.ref(held[0]), weakref.ref(held[0].recorder)]
    gt.uninstrument()
    held.clear()
    for _, g, _ in graphs:  # what the replay check kept on each graph
        g._graphcheck_state = None
    out["rss_graphcheck_released"] = settled()
    out["graphcheck_freed"] = all(r() is None for r in refs)
    out["split_released"] = proc_memory.sample()
    cuda = ctypes.CDLL("libcuda.so.1")
    failed = 0
    for _, g, _ in graphs:
        failed += cuda.cuGraphDestroy(ctypes.c_void_p(g.raw_cuda_graph())) != 0
    out["rss_templates_destroyed"] = settled()
    out["split_templates_destroyed"] = proc_memory.sample()
    out["templates_not_destroyed"] = failed
    return out


def memory(args):
    out = {}
    others = [m for m in args.memory_mode.split(",") if m]
    for m in others:
        if m not in MODES[1:] + BARE:
            raise SystemExit(f"--memory-mode: {m!r} is not one of {', '.join(MODES[1:] + BARE)}")
    for mode in ["plain"] + others:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--device", args.device,
               "--layers", str(args.layers), "--hidden", str(args.hidden)]
        if args.sizes:
            cmd += ["--sizes", args.sizes]
        if args.full is not None:
            cmd += ["--full", str(args.full)]
        print(f"memory: child {mode}", file=sys.stderr, flush=True)
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"the {mode} child failed:\n{res.stderr}")
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    import proc_memory

    plain = out["plain"].pop("mappings_checked")
    # Resident MiB by mapping, the (last) instrumented child minus the plain child, after
    # the check.
    for m in others:
        other = out[m].pop("mappings_checked")
    out["mappings_delta"] = proc_memory.by_mapping_delta(plain, other)
    return out


def profiled(fn):
    """``fn()``, with a cProfile of it on stderr (top 30 by own time)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    r = fn()
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    return r


def med(xs):
    return statistics.median(xs) if xs else None


def main():
    global STAGES
    args = parse()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.child:
        return child(args)
    import torch

    import graphcheck.torch as gt
    from graphcheck._instrument.patch import check_before_replay
    from graphcheck.torch import ReplayCheckError

    engine_model, eng = engine_of(args)
    stages = None
    if args.split:
        import stage_timer

        stages = STAGES = stage_timer.Stages()
        stage_timer.install(stages, torch, cpu=args.device == "cpu")
    split = {}
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    tmp = tempfile.mkdtemp(prefix="gc-scale-")
    res = {m: [] for m in modes}
    per_graph = {m: [] for m in modes}
    checks = {"cleared": [], "rebuilt": [], "replay_idle": [], "replay_after": []}
    refused = {}
    manifest_bytes = None
    n_graphs = None
    kept = False
    # One capture of everything first, untimed: the first capture of a process sets up
    # what later ones reuse (cuBLAS, the dispatch machinery on CPU).
    eng.capture_all()
    gc.collect()
    if stages is not None:
        stages.take()
    for run in range(args.runs):
        for m in modes:
            d = tempfile.mkdtemp(dir=tmp)
            if args.cprofile == "capture" and m != "plain" and run == 0:
                secs, times, graphs, ins = profiled(lambda: capture(gt, eng, m, d))
            else:
                secs, times, graphs, ins = capture(gt, eng, m, d)
            n_graphs = len(graphs)
            if stages is not None:
                split.setdefault(m, []).append(stages.take())
            res[m].append(secs)
            per_graph[m].append(times)
            print(f"run {run + 1}/{args.runs} {m}: {n_graphs} graphs in {secs:.3f} s", file=sys.stderr, flush=True)
            if ins is not None and ins.path is not None:
                manifest_bytes = os.path.getsize(ins.path)
            if ins is not None and m == ("all" if "all" in modes else "check"):
                measure_checks(args, gt, eng, engine_model, graphs, ins, checks, refused,
                               check_before_replay, ReplayCheckError,
                               keep=args.keep if args.keep and not kept else None)
                kept = True
            if ins is not None:
                gt.uninstrument(ins)
            if stages is not None:
                stages.take()  # the checks' builds are not the capture's
            del graphs, ins
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()

    out = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (stand-in graphs)",
        "torch": torch.__version__,
        "layers": args.layers,
        "graphs": n_graphs,
        "runs": args.runs,
        "capture_s": {m: med(v) for m, v in res.items()},
        "capture_all_s": res,
        "manifest_bytes": manifest_bytes,
    }
    if "plain" in res:
        out["capture_ratio"] = {m: med(res[m]) / med(res["plain"]) for m in modes}
    head, tail = slice(0, 100), slice(-100, None)
    out["per_graph_ms"] = {
        m: {"first_100": med([med(t[head]) for t in v]) * 1e3, "last_100": med([med(t[tail]) for t in v]) * 1e3}
        for m, v in per_graph.items() if v and v[0]
    }
    if split and args.device == "cuda":
        # What reading the allocator costs here, with the last run's graphs freed and its
        # pool's segments in the cache: the snapshot each freeze takes, against the
        # counters that could say whether anything changed.
        from graphcheck import _caching_allocator

        def cost_us(fn, n=21):
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return med(ts) * 1e6

        _, _, held, _ = capture(gt, eng, "plain", None)
        out["allocator_read_us"] = {
            "segments": len(_caching_allocator.memory_segments()),
            "memory_snapshot": cost_us(_caching_allocator.memory_segments),
            "memory_stats": cost_us(torch.cuda.memory_stats),
            "memory_reserved": cost_us(torch.cuda.memory_reserved),
        }
        del held
    if split:
        # Per mode and stage: median over runs of the stage's total ms, and its calls.
        out["split_ms"] = {
            m: {k: {"ms": med([r[k]["ms"] for r in runs if k in r]),
                    "calls": med([r[k]["calls"] for r in runs if k in r])}
                for k in sorted({k for r in runs for k in r})}
            for m, runs in split.items()
        }
    if checks["cleared"]:
        out["cleared_ms"] = med(checks["cleared"]) * 1e3
        out["cleared_all_ms"] = [x * 1e3 for x in checks["cleared"]]
        out["rebuilt_ms"] = med(checks["rebuilt"]) * 1e3
        out["rebuilt_all_ms"] = [x * 1e3 for x in checks["rebuilt"]]
        out["replay_idle_ms"] = med(checks["replay_idle"]) * 1e3
        out["replay_after_transition_ms"] = med(checks["replay_after"]) * 1e3
        out["refused"] = refused
    if not args.no_memory:
        mem = memory(args)
        out["memory"] = mem
        out["memory_mode"] = args.memory_mode
        first = args.memory_mode.split(",")[0]
        out["memory_mode"] = first
        out["graphcheck_mib"] = mem[first]["rss_checked"] - mem["plain"]["rss_checked"]
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def measure_checks(args, gt, eng, engine_model, graphs, ins, checks, refused,
                   check_before_replay, ReplayCheckError, keep=None):
    """The checks after transitions, on the graphs ``ins`` recorded (mode ``all``)."""
    profile = [args.cprofile]

    def timed(kind, fn):
        if profile[0] == kind:
            profile[0] = None
            return profiled(fn)
        return fn()

    # Replays with nothing pending, then the first after a transition (the check in it).
    for _ in range(args.checks):
        t0 = time.perf_counter()
        engine_model.replay_all(graphs)
        engine_model.sync(eng.device)
        checks["replay_idle"].append(time.perf_counter() - t0)
        gt.mark_transition("wake", "preserved")
        t0 = time.perf_counter()
        engine_model.replay_all(graphs)
        engine_model.sync(eng.device)
        checks["replay_after"].append(time.perf_counter() - t0)
    for _ in range(args.checks):
        gt.mark_transition("wake", "preserved")
        secs, n = timed("cleared", lambda: clear_all(graphs, check_before_replay, ReplayCheckError))
        checks["cleared"].append(secs)
        refused["cleared"] = n
        if n:
            report = gt.check(ins)
            raise SystemExit(f"nothing moved, yet {n} graphs were refused:\n{report.table}")
    if keep:
        os.makedirs(keep, exist_ok=True)
        import shutil

        shutil.copy(ins.path, keep)
        live = gt.snapshot(None, ins.manifest_json(), roots=ins.recorder.roots(),
                           recorder=ins.recorder, event="wake")
        with open(os.path.join(keep, "live.json"), "w") as f:
            json.dump(live, f)
    for _ in range(args.checks):
        eng.rebuild_derived()
        gt.mark_transition("reload", "preserved")
        secs, n = timed("rebuilt", lambda: clear_all(graphs, check_before_replay, ReplayCheckError))
        checks["rebuilt"].append(secs)
        refused["rebuilt"] = n
    expect = sum(1 for name, _, _ in graphs if not name.endswith(f"_piece{eng.pieces - 1}"))
    if refused["rebuilt"] != expect:
        raise SystemExit(f"after the rebuild {refused['rebuilt']} graphs were refused, not {expect}")
    # The next round's captures start from the model as built.


if __name__ == "__main__":
    main()
