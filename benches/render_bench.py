#!/usr/bin/env python3
"""Benchmark: how `graphcheck verify` scales with the number of findings, table beside JSON.

For each findings count asked for (1,000, 5,000, 20,000 and 40,000 by default) it writes a
manifest and a live snapshot with `graphcheck-gen bench --changes S` (the same documents
each time, 100,000 tensors and 400,000 touches by default, with the share of tensors that
become findings scaled so the report holds about that many), then runs `graphcheck verify
MANIFEST LIVE --format F` for F in json, table and markdown, each as its own process with
stdout to a file, rotating the order every round, and takes the median wall time of the
rounds. Loading and verifying cost the same in every format, so the time a format takes
beyond JSON's is what rendering it costs: linear rendering keeps that cost per finding
about the same at every size, quadratic rendering multiplies it by the growth in findings.

With `--fit COLUMNS` it also runs the table with stdout on a pseudo-terminal of that width
(the terminal a user reads it on), which needs a CLI that fits the table to the terminal;
the column says `not fitted` when the CLI printed lines wider than the terminal.

Usage: python3 benches/render_bench.py [--no-build] [--runs N] [--findings 1000,5000]
           [--fit 80] [--graphcheck PATH] [--keep DIR] [--json OUT]

Exit codes: 0 measured, 1 a run failed, 2 usage.
"""

import argparse
import fcntl
import json
import os
import platform
import pty
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FORMATS = ("json", "table", "markdown")


def progress(message):
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A step failed; the message says which and why."""


def run_step(argv, what):
    """Runs a setup step (build, generate), its output to stderr."""
    progress(f"{what}: {' '.join(str(a) for a in argv)}")
    done = subprocess.run(argv, cwd=REPO, stdout=sys.stderr, stderr=sys.stderr)
    if done.returncode != 0:
        raise BenchError(f"{what} failed with exit code {done.returncode}")


def check_exit(argv, code, stderr_path):
    if code not in (0, 1):
        stderr = Path(stderr_path).read_text(errors="replace").strip()
        raise BenchError(f"{' '.join(map(str, argv))} exited with {code}:\n{stderr}")


def reap(child, start):
    """Waits for `child`; returns (exit code, wall s, CPU s). The child's own rusage
    (`os.wait4`), so one run's CPU time never includes another's."""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
    return child.returncode, wall, usage.ru_utime + usage.ru_stime


def measure(argv, out_path):
    """Runs one child, stdout to a file; returns (wall s, CPU s)."""
    err_path = out_path.with_suffix(".err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err)
        code, wall, cpu = reap(child, start)
    check_exit(argv, code, err_path)
    return wall, cpu


def measure_on_terminal(argv, out_path, columns):
    """Runs one child with stdout on a pseudo-terminal `columns` wide, copying what it
    prints to a file; returns (wall s, CPU s, widest line)."""
    err_path = out_path.with_suffix(".err")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = dict(os.environ, COLUMNS=str(columns))
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, cwd=REPO, stdout=slave, stderr=err, env=env)
        os.close(slave)
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out.write(chunk)
        code, wall, cpu = reap(child, start)
    os.close(master)
    check_exit(argv, code, err_path)
    text = out_path.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")
    return wall, cpu, max((len(line) for line in text.split("\n")), default=0)


def findings_in(json_path):
    with open(json_path, encoding="utf-8") as f:
        return len(json.load(f)["findings"])


def parse_counts(text):
    try:
        counts = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"expected counts above 0 like 1000,5000, not {text!r}")
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--findings", type=parse_counts, default=[1000, 5000, 20000, 40000],
                    help="findings counts to aim for (default 1000,5000,20000,40000)")
    ap.add_argument("--runs", type=int, default=5, help="rounds per size (default 5)")
    ap.add_argument("--tensors", type=int, default=50_000)
    ap.add_argument("--touches", type=int, default=200_000)
    ap.add_argument("--fit", type=int, metavar="COLUMNS",
                    help="also run the table on a pseudo-terminal this wide")
    ap.add_argument("--no-build", action="store_true", help="use the binaries as built")
    ap.add_argument("--graphcheck", type=Path,
                    help="the graphcheck binary (default target/release/graphcheck)")
    ap.add_argument("--keep", type=Path, help="keep the documents and outputs here")
    ap.add_argument("--json", type=Path, help="write every timing to this file")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    gen = REPO / "target" / "release" / "graphcheck-gen"
    graphcheck = args.graphcheck or REPO / "target" / "release" / "graphcheck"
    if not args.no_build:
        run_step(["cargo", "build", "--release", "-p", "graphcheck-cli", "-p", "graphcheck-gen"],
                 "build")
    work = args.keep or Path(tempfile.mkdtemp(prefix="graphcheck-report-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return bench(args, gen, graphcheck, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def generate(gen, out, args, changes):
    run_step([gen, "bench", "--out", out, "--tensors", str(args.tensors), "--touches",
              str(args.touches), "--changes", f"{changes:.4f}"],
             f"generate (changes {changes:.3f})")


def bench(args, gen, graphcheck, work):
    # The findings grow in proportion to --changes (until most tensors are findings):
    # one calibration run at 1.0 tells the factor for each count asked for.
    calib = work / "calibrate"
    generate(gen, calib, args, 1.0)
    base = calib / "out.json"
    measure([graphcheck, "verify", calib / "manifest.json", calib / "live.json", "--format",
             "json"], base)
    per_unit = findings_in(base)
    progress(f"{per_unit} findings at --changes 1")

    formats = list(FORMATS) + (["fit"] if args.fit else [])
    results = []
    for target in args.findings:
        changes = target / per_unit
        docs = work / f"f{target}"
        generate(gen, docs, args, changes)
        argv = [graphcheck, "verify", docs / "manifest.json", docs / "live.json", "--format"]
        times = {f: [] for f in formats}
        cpus = {f: [] for f in formats}
        widest = 0
        for r in range(args.runs):
            # Rotate the order so that no format always runs first (cold cache) or last.
            order = formats[r % len(formats):] + formats[:r % len(formats)]
            for f in order:
                out = docs / f"out.{f}"
                if f == "fit":
                    wall, cpu, w = measure_on_terminal(argv + ["table"], out, args.fit)
                    widest = max(widest, w)
                else:
                    wall, cpu = measure(argv + [f], out)
                times[f].append(wall)
                cpus[f].append(cpu)
        count = findings_in(docs / "out.json")
        medians = {f: statistics.median(t) for f, t in times.items()}
        cpu_medians = {f: statistics.median(t) for f, t in cpus.items()}
        row = {"target": target, "changes": changes, "findings": count, "wall": times,
               "cpu": cpus, "median": medians, "cpu_median": cpu_medians}
        if args.fit:
            row["fit_widest"] = widest
            row["fitted"] = widest <= args.fit
        results.append(row)
        progress(f"{count} findings: " + ", ".join(
            f"{f} {m:.3f} s wall, {cpu_medians[f]:.3f} s CPU" for f, m in medians.items()))

    print_table(args, results)
    if args.json:
        meta = {"machine": platform.machine(), "python": platform.python_version(),
                "tensors": args.tensors, "touches": args.touches, "runs": args.runs,
                "graphcheck": str(graphcheck)}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2,
                                        default=str) + "\n")
    return 0


def print_table(args, results):
    """Two tables, wall time and CPU time; in each, what the table (and Markdown, and the
    fitted table) add to JSON's time is the cost of rendering them."""
    for title, key in (("wall time", "median"), ("CPU time (user + system)", "cpu_median")):
        head = ["findings", "json s", "table s", "markdown s", "table/json",
                "table-json ms", "us/finding", "markdown-json ms"]
        if args.fit:
            head += [f"fit{args.fit} s", f"fit{args.fit}-json ms"]
        rows = []
        for r in results:
            m = r[key]
            extra = (m["table"] - m["json"]) * 1000
            row = [f"{r['findings']}", f"{m['json']:.3f}", f"{m['table']:.3f}",
                   f"{m['markdown']:.3f}", f"{m['table'] / m['json']:.2f}x", f"{extra:.0f}",
                   f"{extra * 1000 / max(r['findings'], 1):.1f}",
                   f"{(m['markdown'] - m['json']) * 1000:.0f}"]
            if args.fit:
                if r["fitted"]:
                    row += [f"{m['fit']:.3f}", f"{(m['fit'] - m['json']) * 1000:.0f}"]
                else:
                    row += ["not fitted", f"(widest {r['fit_widest']})"]
            rows.append(row)
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
        print(f"{title}, medians of {args.runs} runs:")
        print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
        print("  ".join("-" * w for w in widths))
        for row in rows:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        print()
    print(f"{args.tensors} tensors, {args.touches} touches; X-json: what rendering X adds to "
          "the same load and verify; us/finding: that for the table, per finding")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
