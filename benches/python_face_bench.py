#!/usr/bin/env python3
"""Benchmark: the Python face of graphcheck against the same commands through the Rust
command line, on the same documents, in the same run.

Generates a manifest and live snapshot with `graphcheck-gen bench` (as verify_bench.py
does), then for each operation runs, alternating and each as its own process:

- `face`: the Python API call (`graphcheck.verify(m, l)` and reading `ok`, `load(m)`,
  `explain(m, target)`, `normalized(m)`, ...), timed inside the child around the call;
- `main`: the same command through `graphcheck._native.main` (the console script's code)
  in a Python child, timed the same way;
- `binary`: the release binary (`target/release/graphcheck`), wall time around the child.

Output goes to a file (`--output`) or to /dev/null, never a terminal. Peak RSS is each
child's own (`os.wait4`). The table gives medians over `--runs`, and each face's ratio to
`main` and to the binary; the target (issue 25, item 12) is `verify` within 1.5x the
binary.

Usage: python3 benches/python_face_bench.py [--no-build] [--runs N] [--keep DIR] [--no-gen]
       [--touches N --tensors N --graphs N --changes X] [--only verify,load,...] [--json OUT]

Run it with the interpreter whose `graphcheck` is to be measured (the project's venv with
the wheel installed). Exit codes: 0 measured, 1 a run failed, 2 usage.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_VERIFY_RATIO = 1.5

#: The child that times one call: argv[1] is the Python statement (the documents are `m`
#: and `l`, the output file `out`), argv[2] where to write the seconds it took.
CHILD = r"""
import os, sys, time
import graphcheck
from graphcheck import _native

m, l, out = sys.argv[3], sys.argv[4], sys.argv[5]

def main(*args):
    # The command's stdout (file descriptor 1) is /dev/null already.
    return _native.main(["graphcheck", *args])

code = compile(sys.argv[1], "<op>", "exec")
start = time.perf_counter()
exec(code)
took = time.perf_counter() - start
with open(sys.argv[2], "w") as f:
    f.write(repr(took))
"""


def operations(target):
    """Each operation: (name, face statement, the command's arguments). `{m}`, `{l}`,
    `{out}` are the documents and the output file."""
    return [
        ("verify", "graphcheck.verify(m, l).ok", ["verify", "{m}", "{l}", "--output", "{out}"]),
        ("verify+findings", "r = graphcheck.verify(m, l); r.ok; len(r.findings)",
         ["verify", "{m}", "{l}", "--output", "{out}"]),
        ("verify+table", "open(out, 'w').write(str(graphcheck.verify(m, l)))",
         ["verify", "{m}", "{l}", "--output", "{out}"]),
        ("verify json", "open(out, 'w').write(graphcheck.verify(m, l).json)",
         ["verify", "{m}", "{l}", "--format", "json", "--output", "{out}"]),
        ("load", "graphcheck.load(m)",
         ["convert", "{m}", "--format-version", "1", "--output", "{out}"]),
        ("show", "graphcheck.summary(m)", ["show", "{m}"]),
        ("show --normalized", "graphcheck.normalized(m)", ["show", "--normalized", "{m}"]),
        ("explain", f"graphcheck.explain(m, {target!r})", ["explain", "{m}", target]),
        ("diff", "graphcheck.diff(m, l)", ["diff", "{m}", "{l}"]),
    ]


def progress(message):
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A step failed; the message says which and why."""


def run_step(argv, what):
    progress(f"{what}: {' '.join(str(a) for a in argv)}")
    done = subprocess.run([str(a) for a in argv], cwd=REPO, stdout=sys.stderr, stderr=sys.stderr)
    if done.returncode != 0:
        raise BenchError(f"{what} failed with exit code {done.returncode}")


def measure(argv, timing_file=None):
    """Runs one child, stdout to /dev/null; returns (seconds, peak RSS MiB). The seconds
    are what the child wrote to `timing_file`, or the wall time around it."""
    with open(os.devnull, "wb") as null, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen([str(a) for a in argv], cwd=REPO, stdout=null, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            err.seek(0)
            raise BenchError(f"{argv[:3]} exited with {code}:\n{err.read().decode(errors='replace')}")
    took = float(Path(timing_file).read_text()) if timing_file else wall
    return took, usage.ru_maxrss / 1024


#: Prints the first owner path of the manifest argv[1] (explain traces one tensor).
FIRST_OWNER = r"""
import json, sys
owners = json.load(open(sys.argv[1]))["owners"]
print(owners["path"][0] if isinstance(owners, dict) else owners[0]["path"])
"""


def explain_target(manifest):
    """The first owner path of the manifest, read by a child: a child's peak RSS starts at
    its parent's (fork), so the parent never holds a document."""
    done = subprocess.run([sys.executable, "-c", FIRST_OWNER, str(manifest)],
                          capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise BenchError(f"no owner path in {manifest} ({done.stderr.strip()}): give --explain")
    return done.stdout.strip()


def bench(args, work):
    binary, gen = args.bin_dir / "graphcheck", args.bin_dir / "graphcheck-gen"
    if not args.no_build:
        run_step(["cargo", "build", "--release", "-p", "graphcheck-cli", "-p", "graphcheck-gen"],
                 "build")
    m, l = work / "manifest.json", work / "live.json"
    if args.no_gen:
        if not (m.is_file() and l.is_file()):
            raise BenchError(f"--no-gen: {m} and {l} must exist")
    else:
        run_step([gen, "bench", "--out", work, "--touches", args.touches, "--tensors",
                  args.tensors, "--graphs", args.graphs, "--changes", args.changes], "generate")
    sizes = {p.name: p.stat().st_size / 2**20 for p in (m, l)}
    progress("documents: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in sizes.items()))
    target = args.explain or explain_target(m)
    out, timing = work / "out.txt", work / "took.txt"
    subst = {"{m}": str(m), "{l}": str(l), "{out}": str(out)}
    ops = [o for o in operations(target) if not args.only or o[0] in args.only]
    tools = ("face", "main", "binary")
    results = {name: {t: [] for t in tools} for name, _, _ in ops}
    for i in range(1, args.runs + 1):
        for name, face, command in ops:
            command = [subst.get(a, a) for a in command]
            # The order rotates every run, so that no tool always runs on a warm cache.
            order = tools[i % 3:] + tools[:i % 3]
            for tool in order:
                if tool == "binary":
                    took, rss = measure([binary, *command])
                else:
                    stmt = face if tool == "face" else f"main(*{command!r})"
                    took, rss = measure([sys.executable, "-c", CHILD, stmt, timing, m, l, out],
                                        timing)
                results[name][tool].append((took, rss))
                progress(f"run {i}/{args.runs} {name:18} {tool:6} {took:7.3f} s {rss:7.0f} MiB")
    return results, sizes, target


def table(results):
    rows = [("operation", "face s", "main s", "binary s", "face/main", "face/binary",
             "face MiB", "main MiB", "binary MiB")]
    summary = {}
    for name, by_tool in results.items():
        med = {t: statistics.median(s for s, _ in runs) for t, runs in by_tool.items()}
        rss = {t: max(r for _, r in runs) for t, runs in by_tool.items()}
        summary[name] = {"median_s": med, "peak_rss_mib": rss,
                         "face_over_main": med["face"] / med["main"],
                         "face_over_binary": med["face"] / med["binary"]}
        rows.append((name, f"{med['face']:.3f}", f"{med['main']:.3f}", f"{med['binary']:.3f}",
                     f"{med['face'] / med['main']:.2f}x", f"{med['face'] / med['binary']:.2f}x",
                     f"{rss['face']:.0f}", f"{rss['main']:.0f}", f"{rss['binary']:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-build", action="store_true", help="use the binaries already built")
    p.add_argument("--no-gen", action="store_true", help="reuse the documents in --keep")
    p.add_argument("--keep", type=Path, help="generate into (or, with --no-gen, read) DIR")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--touches", type=int, default=1_000_000)
    p.add_argument("--tensors", type=int, default=100_000)
    p.add_argument("--graphs", type=int, default=64)
    p.add_argument("--changes", type=float, default=1.0)
    p.add_argument("--explain", help="explain's target (default: the first owner path)")
    p.add_argument("--only", type=lambda s: set(s.split(",")), help="operations, comma-separated")
    p.add_argument("--bin-dir", type=Path, default=REPO / "target" / "release")
    p.add_argument("--json", type=Path, help="also write the results as JSON")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs is at least 1")
    if args.no_gen and not args.keep:
        p.error("--no-gen needs --keep DIR")
    try:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            results, sizes, target = bench(args, args.keep)
        else:
            with tempfile.TemporaryDirectory(prefix="gc-face-") as work:
                results, sizes, target = bench(args, Path(work))
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; manifest {sizes['manifest.json']:.1f} MiB, live "
          f"{sizes['live.json']:.1f} MiB; explain {target}; medians of {args.runs}")
    summary = table(results)
    ratio = summary.get("verify", {}).get("face_over_binary")
    if ratio is not None:
        met = "met" if ratio <= TARGET_VERIFY_RATIO else "MISSED"
        print(f"\ntarget verify within {TARGET_VERIFY_RATIO}x the binary: {met} ({ratio:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({"sizes_mib": sizes, "explain": target,
                                         "runs": args.runs, "results": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
