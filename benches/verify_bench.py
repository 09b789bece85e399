#!/usr/bin/env python3
"""Benchmark: `graphcheck verify` against a plain-Python json + dict baseline, side by side.

Builds the release binaries, generates a manifest and live snapshot with `graphcheck-gen
bench` (1,000,000 touches, 100,000 tensors, 64 graphs by default), then runs, alternating,
`graphcheck verify MANIFEST LIVE --format json` and `benches/baseline_verify.py MANIFEST
LIVE`, each as its own process. For every run it records the wall time (perf_counter
around the child) and the child's own peak RSS (`os.wait4`, so runs cannot contaminate
one another). It checks that both tools report the same set of (kind, subject) findings,
prints a table, and says whether the targets were met: graphcheck at most 0.6 s and
500 MiB, at least 15 times faster than the script on the same documents, and a manifest of
at most 80 MiB. The documents are format 2 (`--format-version 1` for format 1); with
`--v1-baseline` the same content is also written in format 1 and the script runs on it too,
alternating with the others, so the table shows what the format change gave each side.

Usage: python3 benches/verify_bench.py [--no-build] [--runs N] [--keep DIR] [--json OUT]
                                       [--against OLD_GRAPHCHECK]

Exit codes: 0 measured (and, with --strict, every target met), 1 the tools disagree, a
run failed, or (with --strict) a target was missed, 2 usage.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "benches" / "baseline_verify.py"

TARGET_WALL_S = 0.6
TARGET_RSS_MIB = 500.0
TARGET_SPEEDUP = 15.0
TARGET_MANIFEST_MIB = 80.0


def progress(message):
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A step failed; the message says which and why."""


def run_step(argv, what):
    """Runs a setup step (build, generate), streaming its output to stderr."""
    progress(f"{what}: {' '.join(str(a) for a in argv)}")
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, stdout=sys.stderr, stderr=sys.stderr)
    if done.returncode != 0:
        raise BenchError(f"{what} failed with exit code {done.returncode}")
    progress(f"{what}: done in {time.perf_counter() - start:.1f} s")


def measure(argv, stdout_path):
    """Runs one child with its output to files; returns (wall s, peak RSS KiB, exit code)."""
    stderr_path = stdout_path.with_suffix(".err")
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err)
        # Reap the child ourselves: wait4 gives its own rusage, not the sum of all children.
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    child.returncode = code  # already reaped; keep Popen from waiting again
    if code not in (0, 1):
        stderr = stderr_path.read_text(errors="replace").strip()
        raise BenchError(f"{argv[0]} exited with {code}:\n{stderr}")
    return wall, usage.ru_maxrss, code


def graphcheck_findings(path):
    """(kind, subject) pairs of a `graphcheck verify --format json` report."""
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    return [(x["kind"], x["subject"]) for x in report["findings"]]


def baseline_findings(path):
    with open(path, encoding="utf-8") as f:
        return [(x["kind"], x["subject"]) for x in json.load(f)]


def compare(graphcheck, baseline):
    """Raises unless both tools found the same set of (kind, subject)."""
    a, b = set(graphcheck), set(baseline)
    if len(a) != len(graphcheck) or len(b) != len(baseline):
        raise BenchError("a tool reported one (kind, subject) twice")
    if a == b:
        return
    lines = ["graphcheck and the baseline disagree:"]
    for label, extra in (("only graphcheck", a - b), ("only the baseline", b - a)):
        lines.append(f"  {label}: {len(extra)}")
        lines.extend(f"    {k}: {s}" for k, s in sorted(extra)[:10])
    raise BenchError("\n".join(lines))


def summarize(runs):
    walls = [r["wall_s"] for r in runs]
    return {
        "median_wall_s": statistics.median(walls),
        "min_wall_s": min(walls),
        "peak_rss_mib": max(r["max_rss_kib"] for r in runs) / 1024,
    }


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_table(gc, py, speedup, met, manifest_mib, py_v1=None):
    rows = [
        ("tool", "median wall s", "min wall s", "peak RSS MiB", "script/graphcheck"),
        ("graphcheck", f"{gc['median_wall_s']:.3f}", f"{gc['min_wall_s']:.3f}",
         f"{gc['peak_rss_mib']:.0f}", f"{speedup:.1f}x"),
        ("python baseline", f"{py['median_wall_s']:.3f}", f"{py['min_wall_s']:.3f}",
         f"{py['peak_rss_mib']:.0f}", "1.0x"),
    ]
    if py_v1 is not None:
        rows.append(("baseline, format 1", f"{py_v1['median_wall_s']:.3f}",
                     f"{py_v1['min_wall_s']:.3f}", f"{py_v1['peak_rss_mib']:.0f}",
                     f"{py_v1['median_wall_s'] / gc['median_wall_s']:.1f}x"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print()
    mark = {True: "met", False: "MISSED"}
    checks = [
        (f"wall <= {TARGET_WALL_S:g} s", met["wall"], f"{gc['median_wall_s']:.3f} s median"),
        (f"peak RSS <= {TARGET_RSS_MIB:g} MiB", met["rss"], f"{gc['peak_rss_mib']:.0f} MiB"),
        (f"speed-up >= {TARGET_SPEEDUP:g}x", met["speedup"], f"{speedup:.1f}x, medians"),
        (f"manifest <= {TARGET_MANIFEST_MIB:g} MiB", met["manifest"], f"{manifest_mib:.1f} MiB"),
    ]
    width = max(len(c[0]) for c in checks)
    for label, ok, value in checks:
        print(f"target {label.ljust(width)}  {mark[ok]:6}  ({value})")


def bench(args, work):
    graphcheck = args.bin_dir / "graphcheck"
    gen = args.bin_dir / "graphcheck-gen"
    if not args.no_build:
        run_step(["cargo", "build", "--release", "-p", "graphcheck-cli", "-p", "graphcheck-gen"],
                 "build")
    manifest, live = work / "manifest.json", work / "live.json"
    v1_manifest, v1_live = work / "v1" / "manifest.json", work / "v1" / "live.json"
    if args.no_gen:
        if not (manifest.is_file() and live.is_file()):
            raise BenchError(f"--no-gen: {manifest} and {live} must exist")
        if args.v1_baseline and not (v1_manifest.is_file() and v1_live.is_file()):
            raise BenchError(f"--no-gen --v1-baseline: {v1_manifest} and {v1_live} must exist")
        progress(f"generate: reusing {work}")
    else:
        if not gen.is_file():
            raise BenchError(f"{gen} is missing: build it (or drop --no-build)")
        common = ["--touches", str(args.touches), "--tensors", str(args.tensors), "--graphs",
                  str(args.graphs), "--seed", str(args.seed)]
        run_step([gen, "bench", "--out", work, *common, "--format-version",
                  str(args.format_version)], "generate")
        if args.v1_baseline:
            run_step([gen, "bench", "--out", work / "v1", *common, "--format-version", "1"],
                     "generate format 1")
    if not graphcheck.is_file():
        raise BenchError(f"{graphcheck} is missing: build it (or drop --no-build)")
    sizes = {p.name: p.stat().st_size for p in (manifest, live)}
    progress("documents: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items()))

    tools = {
        "graphcheck": ([graphcheck, "verify", manifest, live, "--format", "json"],
                       graphcheck_findings),
        "baseline": ([sys.executable, BASELINE, manifest, live], baseline_findings),
    }
    if args.v1_baseline:
        tools["baseline_v1"] = ([sys.executable, BASELINE, v1_manifest, v1_live], baseline_findings)
    if args.against:
        tools["against"] = ([args.against, "verify", manifest, live, "--format", "json"],
                            graphcheck_findings)
    runs = {name: [] for name in tools}
    found = {}
    for i in range(1, args.runs + 1):
        for name, (argv, parse) in tools.items():
            out = work / f"{name}.out"
            wall, rss_kib, code = measure([str(a) for a in argv], out)
            findings = parse(out)
            progress(f"run {i}/{args.runs} {name}: {wall:.3f} s, {rss_kib / 1024:.0f} MiB, "
                     f"exit {code}, {len(findings)} findings")
            if name in found and sorted(found[name]) != sorted(findings):
                raise BenchError(f"{name} reported different findings in run {i}")
            found[name] = findings
            runs[name].append({"wall_s": wall, "max_rss_kib": rss_kib, "exit_code": code})

    if args.against:
        # The same report, byte for byte (the last run of each): a change that makes verify
        # faster or slower must not change what it says.
        same = (work / "graphcheck.out").read_bytes() == (work / "against.out").read_bytes()
        if not same:
            raise BenchError(f"{args.against} reports other bytes than {graphcheck}")
        progress("compare: the --against binary's report is byte-identical")
    progress("compare: graphcheck findings against the baseline's")
    compare(found["graphcheck"], found["baseline"])
    if args.v1_baseline:
        compare(found["graphcheck"], found["baseline_v1"])
    kinds = {}
    for kind, _ in found["graphcheck"]:
        kinds[kind] = kinds.get(kind, 0) + 1
    progress(f"compare: both report the same {len(found['graphcheck'])} findings {kinds}")

    gc, py = summarize(runs["graphcheck"]), summarize(runs["baseline"])
    py_v1 = summarize(runs["baseline_v1"]) if args.v1_baseline else None
    speedup = py["median_wall_s"] / gc["median_wall_s"]
    manifest_mib = sizes["manifest.json"] / 2**20
    met = {
        "wall": gc["median_wall_s"] <= TARGET_WALL_S,
        "rss": gc["peak_rss_mib"] <= TARGET_RSS_MIB,
        "speedup": speedup >= TARGET_SPEEDUP,
        "manifest": manifest_mib <= TARGET_MANIFEST_MIB,
    }
    if args.no_gen:
        made = f"documents reused from {work}"
    else:
        made = (f"{args.touches:,} touches, {args.tensors:,} tensors, {args.graphs} graphs "
                f"(seed {args.seed})")
    version = json.loads(manifest.read_bytes()[:40].split(b",")[0] + b"}")["format_version"]
    print(f"verify: {made}; format {version}: manifest {manifest_mib:.1f} MiB, "
          f"live {sizes['live.json'] / 2**20:.1f} MiB; {len(found['graphcheck'])} findings")
    if args.v1_baseline:
        print(f"baseline, format 1: the same content in format 1, manifest "
              f"{v1_manifest.stat().st_size / 2**20:.1f} MiB, live "
              f"{v1_live.stat().st_size / 2**20:.1f} MiB")
    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}; "
          f"{args.runs} runs each, alternating")
    print()
    print_table(gc, py, speedup, met, manifest_mib, py_v1)
    against = summarize(runs["against"]) if args.against else None
    if against is not None:
        print(f"\nagainst {args.against}: median {against['median_wall_s']:.3f} s, this build "
              f"{gc['median_wall_s']:.3f} s: ratio {gc['median_wall_s'] / against['median_wall_s']:.3f} "
              f"(this / against; same report bytes)")
    return {
        "config": {"touches": args.touches, "tensors": args.tensors, "graphs": args.graphs,
                   "seed": args.seed, "runs": args.runs, "generated": not args.no_gen},
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(),
                    "python": platform.python_version()},
        "documents_bytes": sizes,
        "findings": len(found["graphcheck"]),
        "findings_by_kind": kinds,
        "runs": runs,
        "graphcheck": gc,
        "baseline": py,
        "baseline_v1": py_v1,
        "against": against,
        "speedup": speedup,
        "targets": {"wall_s": TARGET_WALL_S, "rss_mib": TARGET_RSS_MIB,
                    "speedup": TARGET_SPEEDUP, "manifest_mib": TARGET_MANIFEST_MIB, "met": met},
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-build", action="store_true", help="use the binaries already built")
    p.add_argument("--bin-dir", metavar="DIR", type=Path, default=REPO / "target" / "release",
                   help="where graphcheck and graphcheck-gen are (default: target/release)")
    p.add_argument("--no-gen", action="store_true",
                   help="reuse the documents in --keep DIR instead of generating them")
    p.add_argument("--touches", type=int, default=1_000_000)
    p.add_argument("--tensors", type=int, default=100_000)
    p.add_argument("--graphs", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=3, help="runs of each tool (default 3)")
    p.add_argument("--format-version", type=int, choices=(1, 2), default=2,
                   help="the format the documents are written in (default 2)")
    p.add_argument("--v1-baseline", action="store_true",
                   help="also run the script on the same content in format 1")
    p.add_argument("--against", metavar="BINARY", type=Path,
                   help="also run another graphcheck binary (an older build), alternating, and "
                        "print the ratio of the medians; its report must be byte-identical")
    p.add_argument("--keep", metavar="DIR", type=Path,
                   help="generate into DIR and keep it (default: a temporary directory)")
    p.add_argument("--json", metavar="OUT", type=Path, help="also write the results as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.no_gen and not args.keep:
        p.error("--no-gen needs --keep DIR")

    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        work = args.keep.resolve()
    else:
        work = Path(tempfile.mkdtemp(prefix="graphcheck-bench-"))
    try:
        result = bench(args, work)
    except BenchError as e:
        print(f"[bench] error: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        progress(f"wrote {args.json}")
    if args.strict and not all(result["targets"]["met"].values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
