"""Ctrl-C stops graphcheck at once (issue 25, item 10). The console script and ``python -m
graphcheck`` end as the Rust binary does, killed by SIGINT (a shell's exit status 130) with
no traceback; a call of the Python API raises ``KeyboardInterrupt`` within a fraction of a
second, not when the native work is done, and leaves its process working.

Each test runs the call in a child process on a manifest big enough that an uninterrupted
``verify`` takes at least ``LONG_S`` here (the fixture grows it until it does), and sends
SIGINT once the call has started. The bounds are generous for a loaded 2-core machine and
still far below the call's own time."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import graphcheck
from conftest import REPO

MARLIN = REPO / "fixtures" / "synthetic" / "marlin_workspace_rebuilt"
#: An uninterrupted verify of the big manifest takes at least this long.
LONG_S = 6.0
#: How long after SIGINT an API call has raised KeyboardInterrupt, at most.
API_STOP_S = 1.0
#: How long after SIGINT the command line has ended, at most.
COMMAND_STOP_S = 2.0
#: How long after the call started SIGINT is sent.
SIGNAL_AFTER_S = 0.5


def write_big_manifest(path: Path, copies: int) -> None:
    """The fixture's manifest with its graph repeated ``copies`` times (ids and names
    changed): every copy touches the same tensors, so the manifest stays valid."""
    m = json.loads((MARLIN / "manifest.json").read_text())
    graph = json.dumps(dict(m["graphs"][0], id=-1, name="@NAME@"))
    head, tail = graph.split('"@NAME@"')
    before_id, after_id = head.split("-1", 1)
    m["graphs"] = []
    pre, post = json.dumps(m).rsplit('"graphs": []', 1)
    with open(path, "w") as f:
        f.write(pre + '"graphs": [')
        f.write(", ".join(f'{before_id}{i}{after_id}"g{i}"{tail}' for i in range(copies)))
        f.write("]" + post)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A manifest whose uninterrupted verify takes at least LONG_S on this machine, and
    how long it took."""
    path = tmp_path_factory.mktemp("interrupt") / "big.json"
    copies = 20_000
    for _ in range(4):
        write_big_manifest(path, copies)
        start = time.monotonic()
        graphcheck.verify(path)
        took = time.monotonic() - start
        if took >= LONG_S:
            return path, took
        copies = int(copies * 1.3 * LONG_S / max(took, 0.05))
    pytest.fail(f"verify of a {path.stat().st_size >> 20} MiB manifest took only {took:.1f} s")


#: The child of an API test: makes the call named by argv[1] on argv[2], prints "calling"
#: just before, then what happened: the time KeyboardInterrupt was raised (monotonic, the
#: same clock as the parent's) and whether the call's thread was still at work, or that
#: the call returned; then checks that graphcheck still works in this process.
API_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import graphcheck

    path, marlin = sys.argv[2], sys.argv[3]
    calls = {
        "verify": lambda: graphcheck.verify(path),
        "load": lambda: graphcheck.load(path),
        "normalized": lambda: graphcheck.normalized(path),
        "summary": lambda: graphcheck.summary(path),
        "explain": lambda: graphcheck.explain(path, kernel="marlin"),
        "diff": lambda: graphcheck.diff(path, path),
    }
    call = calls[sys.argv[1]]
    print("calling", flush=True)
    start = time.monotonic()
    try:
        call()
    except KeyboardInterrupt:
        at = time.monotonic()
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass
        print(f"interrupted {at!r} {'graphcheck-call' in names}", flush=True)
    else:
        print(f"returned {time.monotonic() - start!r}", flush=True)
    ok = graphcheck.verify(marlin + "/manifest.json", marlin + "/live.json").summary
    print(f"still works {bool(ok)}", flush=True)
    """
)


@pytest.mark.parametrize("call", ["verify", "load", "normalized", "summary", "explain", "diff"])
def test_an_api_call_raises_keyboard_interrupt_at_once(big, call):
    # Regression: the API saw Ctrl-C only when the native call returned (seconds later).
    path, took = big
    child = subprocess.Popen(
        [sys.executable, "-c", API_CHILD, call, str(path), str(MARLIN)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "calling\n", child.stderr.read()
        time.sleep(SIGNAL_AFTER_S)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    lines = out.splitlines()
    assert lines and lines[0].startswith("interrupted "), f"{out}\n{err}"
    _, at, still_at_work = lines[0].split()
    stop = float(at) - sent
    assert stop < API_STOP_S, f"KeyboardInterrupt {stop:.2f} s after SIGINT (verify takes {took:.1f} s)"
    # The call was cut short, not finished: its work was still going on.
    assert still_at_work == "True", out
    # And the process goes on working.
    assert lines[1:] == ["still works True"], f"{out}\n{err}"
    assert child.returncode == 0, err


def wait_until_read(pid: int, nbytes: int, timeout: float = 60.0) -> None:
    """Waits until process ``pid`` has read ``nbytes`` bytes (its document, read whole)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/io") as f:
            io = dict(line.split(": ") for line in f.read().splitlines())
        if int(io["rchar"]) >= nbytes:
            return
        time.sleep(0.01)
    pytest.fail(f"the command had not read its document after {timeout} s")


def console_script() -> str:
    script = Path(sys.executable).parent / "graphcheck"
    assert script.is_file(), f"no console script {script}: is the wheel installed here?"
    return str(script)


@pytest.mark.parametrize("how", ["console script", "python -m graphcheck"])
def test_the_command_line_ends_at_once_on_sigint(big, how):
    # Regression: the console script and `python -m graphcheck` stopped 6-7 s after
    # SIGINT on a big document, printing a traceback.
    path, took = big
    program = [console_script()] if how == "console script" else [sys.executable, "-m", "graphcheck"]
    child = subprocess.Popen(
        [*program, "verify", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_read(child.pid, path.stat().st_size)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
        stop = time.monotonic() - sent
    finally:
        child.kill()
    # Killed by SIGINT, as the binary is: a shell shows exit status 130.
    assert child.returncode == -signal.SIGINT, (child.returncode, err)
    assert "Traceback" not in err, err
    assert stop < COMMAND_STOP_S, f"ended {stop:.2f} s after SIGINT (verify takes {took:.1f} s)"


def test_in_process_the_command_line_leaves_sigint_to_its_caller():
    # Only the program replaces Python's handler, and only for the command's time.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    from graphcheck import cli

    assert cli.main(["schema"]) == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
