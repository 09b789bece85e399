"""A plumbing check, not a test of behaviour: the Python CLI (`python -m graphcheck`, the
wheel's `graphcheck` script) is the Rust binary's own command line
(`graphcheck_cli::main_impl`), so comparing the two compares `main_impl` with itself
through two doors. What can differ is the door: arguments handed over, stdout and stderr
written byte for byte, the exit code returned. So the parity cases are a representative
handful, one per command, format and exit code (verify in each format, normalized, with an
allowlist and --deny-unused-allow, clean and with findings; show, show --normalized, a live
show; diff in each format; explain and --dot; schema; one bad input of each kind, exit 2;
help, version and usage errors). What each command says is tested by the Rust snapshots
over the whole fixture corpus (tests/cli.rs), not here."""

import json
import subprocess
import sys

import pytest

import graphcheck
from conftest import REPO, rust_binary
from graphcheck.cli import main

FIXTURES = REPO / "fixtures"


def commands():
    """One case per command, format and exit code."""
    syn = FIXTURES / "synthetic"
    marlin = syn / "marlin_workspace_rebuilt"  # findings (exit 1), a live snapshot
    m, live = str(marlin / "manifest.json"), str(marlin / "live.json")
    clean = syn / "clean_reload_inplace"  # exit 0
    allowed = syn / "allowlisted_workspace"  # an allowlist whose entry goes unused
    target = json.loads((FIXTURES / "index.json").read_text())
    (explain,) = [s["explain"][0] for s in target["scenarios"] if s["name"] == "marlin_workspace_rebuilt"]
    bad = {b["as"]: str(FIXTURES / b["file"]) for b in reversed(target["bad"])}
    return [
        ("verify:table", ["verify", m, live]),
        ("verify:json", ["verify", m, live, "--format", "json"]),
        ("verify:markdown", ["verify", m, live, "--format", "markdown"]),
        ("verify:normalized", ["verify", m, live, "--normalized"]),
        ("verify:clean", ["verify", str(clean / "manifest.json"), str(clean / "live.json")]),
        ("verify:allow", ["verify", str(allowed / "manifest.json"), "--allow", str(allowed / "allow.toml")]),
        ("verify:deny_unused_allow", ["verify", str(allowed / "manifest.json"), "--allow",
                                      str(allowed / "allow.toml"), "--deny-unused-allow", "--format", "json"]),
        ("show", ["show", m]),
        ("show:normalized", ["show", m, "--normalized"]),
        ("show:live", ["show", live]),
        ("diff", ["diff", m, live]),
        ("diff:markdown", ["diff", m, live, "--format", "markdown"]),
        ("diff:json", ["diff", m, live, "--format", "json"]),
        ("diff:same", ["diff", m, m]),
        ("explain", ["explain", m, explain]),
        ("explain:dot", ["explain", m, explain, "--dot", "--normalized"]),
        ("explain:nothing", ["explain", m, "model.nothing"]),
        ("schema", ["schema"]),
        ("bad:manifest", ["verify", bad["manifest"]]),
        ("bad:live", ["verify", m, bad["live"]]),
        ("bad:allow", ["verify", m, "--allow", bad["allow"]]),
        ("show:missing", ["show", str(REPO / "no-such-file.json")]),
        # Help, version and usage errors, which clap prints.
        ("help", ["--help"]),
        ("verify:help", ["verify", "--help"]),
        ("version", ["--version"]),
        ("usage:none", []),
        ("usage:verify", ["verify"]),
        # An abbreviated flag is a usage error in both (argparse used to accept `--form`).
        ("usage:abbreviated", ["verify", m, "--form", "json"]),
    ]


@pytest.fixture
def run_python(capfd):
    """Runs the console script's `main` in this process; the command writes to file
    descriptors 1 and 2, which `capfd` captures byte for byte."""

    def run(argv):
        capfd.readouterr()
        code = main(argv)
        out, err = capfd.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize("argv", [c[1] for c in commands()], ids=[c[0] for c in commands()])
def test_same_bytes_and_exit_code_as_the_rust_binary(argv, run_python):
    rust = subprocess.run([str(rust_binary()), *argv], capture_output=True, text=True)
    code, out, err = run_python(argv)
    assert code == rust.returncode, (err, rust.stderr)
    assert out == rust.stdout
    assert err == rust.stderr


def test_output_file_is_written_atomically(tmp_path, run_python):
    m = str(FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json")
    target = tmp_path / "report.json"
    code, out, _ = run_python(["verify", m, "--format", "json", "--output", str(target)])
    assert (code, out) == (1, "")
    rust = subprocess.run([str(rust_binary()), "verify", m, "--format", "json"], capture_output=True, text=True)
    assert target.read_text() == rust.stdout


def test_deny_unused_allow_turns_the_warning_into_a_failure(run_python):
    s = FIXTURES / "synthetic/allowlisted_workspace"
    argv = ["verify", str(s / "manifest.json"), "--allow", str(s / "allow.toml"), "--format", "json"]
    code, out, _ = run_python(argv)
    assert code == 0 and json.loads(out)["findings"][0]["severity"] == "warning"
    code, out, _ = run_python([*argv, "--deny-unused-allow"])
    assert code == 1 and json.loads(out)["findings"][0]["severity"] == "error"


def test_usage_errors_exit_2(run_python):
    assert run_python(["verify"])[0] == 2
    assert run_python(["explain", "m.json"])[0] == 2
    assert run_python(["nonsense"])[0] == 2
    code, _, err = run_python(["verify", "m.json", "--form", "json"])
    assert code == 2 and "unexpected argument '--form'" in err


def test_python_dash_m_and_exit_codes():
    m = str(FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json")
    done = subprocess.run([sys.executable, "-m", "graphcheck", "verify", m], capture_output=True, text=True)
    assert done.returncode == 1 and "unregistered" in done.stdout
    clean = FIXTURES / "synthetic/clean_reload_inplace"
    done = subprocess.run(
        [sys.executable, "-m", "graphcheck", "verify", str(clean / "manifest.json"), str(clean / "live.json")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "graphcheck", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("graphcheck ")


def test_standard_input_and_an_output_that_is_an_input(tmp_path):
    """Regression: `-` reads a document from standard input, and an `--output` that is an
    input is refused (exit 2, nothing written), in the console script as in the binary."""
    m = FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json"
    data = m.read_bytes()
    copy = tmp_path / "m.json"
    copy.write_bytes(data)
    by_file = subprocess.run([str(rust_binary()), "show", str(m)], capture_output=True)
    for face in ([str(rust_binary())], [sys.executable, "-m", "graphcheck"]):
        done = subprocess.run([*face, "show", "-"], input=data, capture_output=True)
        assert (done.returncode, done.stdout) == (0, by_file.stdout), done.stderr
        done = subprocess.run([*face, "verify", str(copy), "--output", str(copy)], capture_output=True)
        assert done.returncode == 2 and b"refusing to overwrite an input" in done.stderr, done.stderr
        assert copy.read_bytes() == data


def test_explain_refuses_malformed_targets():
    """Regression: `graphcheck.explain` searched a malformed address as an owner path, and an
    empty kernel pattern matched every node; both are errors that say what is wrong."""
    m = FIXTURES / "synthetic/marlin_workspace_rebuilt/manifest.json"
    for target, says in [("0xZZ", "not a hexadecimal digit"), ("0x", "no hexadecimal digits"), ("", "target is empty")]:
        with pytest.raises(graphcheck.GraphcheckError, match=says):
            graphcheck.explain(m, target)
    with pytest.raises(graphcheck.GraphcheckError, match="every node"):
        graphcheck.explain(m, kernel="")
